"""Pending entries over a real grpc.aio channel: ask, listen, pick, reply, cancel."""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict
from pathlib import Path

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from libs.db import Database
from services.pending_registry.domain import EntryKind, NewAsk, PickFilter
from services.pending_registry.entries import PendingEntries
from services.pending_registry.store import MIGRATIONS, PendingStore
from taskgate.pending.v1 import pending_pb2 as pb

from .harness import Harness, eventually, reason

ASK = pb.ENTRY_KIND_ASK
AGENT = "agent-1"


def ask(
    h: Harness,
    session_id: str,
    payload: str = "continue?",
    kind: int = ASK,
    tools: list[pb.ToolResult] | None = None,
    timeout: float | None = 30,
    agent: str = AGENT,
) -> grpc.aio.UnaryUnaryCall:
    return h.stub.Ask(
        pb.AskRequest(session_id=session_id, kind=kind, payload=payload, tool_results=tools or [], agent_id=agent),
        timeout=timeout,
    )


async def snapshot_or_none(h: Harness, session_id: str, agent: str = AGENT) -> pb.PendingSnapshot | None:
    try:
        reply = await h.stub.GetSessionTask(pb.GetSessionTaskRequest(agent_id=agent, session_id=session_id), timeout=5)
    except grpc.aio.AioRpcError as exc:
        assert exc.code() == grpc.StatusCode.NOT_FOUND and reason(exc) == "PENDING_TASK_NOT_FOUND"
        return None
    return reply.snapshot


# --- the round trip -------------------------------------------------------------


async def test_ask_pick_reply_round_trip(harness: Harness) -> None:
    listener = harness.listen("cli-")
    assert await listener.synced() == []
    producer = ask(harness, "cli-7", "run rm -rf build?", kind=pb.ENTRY_KIND_CONFIRM)
    available = await listener.until(lambda m: m.type == pb.LISTEN_EVENT_TYPE_AVAILABLE)
    assert available.entry.session_id == "cli-7" and available.entry.origin == "cli-"
    assert available.entry.kind == pb.ENTRY_KIND_CONFIRM and available.entry.payload == "run rm -rf build?"

    picked = await harness.stub.PickNext(pb.PickNextRequest(prefix="cli-", picker="tui"), timeout=5)
    assert picked.entry.entry_id == available.entry.entry_id and picked.entry.claimed_by == "tui"
    claimed = await listener.until(lambda m: m.type == pb.LISTEN_EVENT_TYPE_CLAIMED)
    assert claimed.entry.claimed_by == "tui"
    # Nothing else to claim.
    assert not (await harness.stub.PickNext(pb.PickNextRequest(prefix="", picker="web"))).HasField("entry")

    await harness.stub.Reply(pb.ReplyRequest(entry_id=picked.entry.entry_id, answer="yes", picker="tui"))
    answered = await producer
    assert (answered.entry_id, answered.answer) == (picked.entry.entry_id, "yes")
    removed = await listener.until(lambda m: m.type == pb.LISTEN_EVENT_TYPE_REMOVED)
    assert removed.removal_reason == pb.REMOVAL_REASON_ANSWERED
    # cli- answers go inline: no snapshot, and nothing left behind.
    assert await snapshot_or_none(harness, "cli-7") is None
    assert await harness.registry.store.count_entries() == 0
    listener.cancel()


async def test_reply_to_unknown_or_answered_entry_is_not_found(harness: Harness) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await harness.stub.Reply(pb.ReplyRequest(entry_id="0" * 32, answer="x"))
    assert exc.value.code() == grpc.StatusCode.NOT_FOUND and reason(exc.value) == "ENTRY_NOT_FOUND"
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await harness.stub.Reply(pb.ReplyRequest(entry_id="not-an-id", answer="x"))
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    producer = ask(harness, "dc-1")
    picked = await _pick_eventually(harness, "dc-", "bot")
    await harness.stub.Reply(pb.ReplyRequest(entry_id=picked.entry_id, answer="first"))
    assert (await producer).answer == "first"
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await harness.stub.Reply(pb.ReplyRequest(entry_id=picked.entry_id, answer="second"))
    assert exc.value.code() == grpc.StatusCode.NOT_FOUND


async def test_reply_by_another_picker_is_denied(harness: Harness) -> None:
    producer = ask(harness, "chat-1")
    picked = await _pick_eventually(harness, "chat-", "web-a")
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await harness.stub.Reply(pb.ReplyRequest(entry_id=picked.entry_id, answer="x", picker="web-b"))
    assert exc.value.code() == grpc.StatusCode.PERMISSION_DENIED and reason(exc.value) == "ENTRY_CLAIMED_BY_OTHER"
    await harness.stub.Reply(pb.ReplyRequest(entry_id=picked.entry_id, answer="ok", picker="web-a"))
    assert (await producer).answer == "ok"


async def _pick_eventually(h: Harness, prefix: str, picker: str) -> pb.PendingEntry:
    found: list[pb.PendingEntry] = []

    async def try_pick() -> bool:
        reply = await h.stub.PickNext(pb.PickNextRequest(prefix=prefix, picker=picker), timeout=5)
        if reply.HasField("entry"):
            found.append(reply.entry)
        return bool(found)

    await eventually(try_pick, what=f"an entry for {prefix!r}")
    return found[0]


# --- exactly one claimer --------------------------------------------------------


async def test_concurrent_pickers_never_both_get_an_entry(harness: Harness) -> None:
    """Many producers and many pickers at once, over several prefixes and both pick RPCs."""
    n_entries = 160
    origins = ["cli-", "chat-", "tg-", "dc-"]
    rng = random.Random(7)
    producers = [
        ask(
            harness,
            f"{origins[i % 4]}s{i % 9}",
            payload=f"p{i}",
            kind=rng.choice([pb.ENTRY_KIND_ASK, pb.ENTRY_KIND_CONFIRM, pb.ENTRY_KIND_SECRET]),
        )
        for i in range(n_entries)
    ]
    claims: dict[str, list[str]] = defaultdict(list)
    stop = asyncio.Event()

    async def picker(name: str, prefix: str, match: bool) -> None:
        while not stop.is_set():
            if match:
                reply = await harness.stub.PickNextMatch(
                    pb.PickNextMatchRequest(
                        prefix=prefix,
                        picker=name,
                        kinds=[pb.ENTRY_KIND_ASK, pb.ENTRY_KIND_CONFIRM, pb.ENTRY_KIND_SECRET],
                    ),
                    timeout=10,
                )
            else:
                reply = await harness.stub.PickNext(pb.PickNextRequest(prefix=prefix, picker=name), timeout=10)
            if not reply.HasField("entry"):
                await asyncio.sleep(0.001)
                continue
            claims[reply.entry.entry_id].append(name)
            assert reply.entry.claimed_by == name
            await harness.stub.Reply(
                pb.ReplyRequest(entry_id=reply.entry.entry_id, answer=name, picker=name), timeout=10
            )

    pickers = [asyncio.ensure_future(picker(f"picker-{i}", ["", *origins][i % 5], match=i % 2 == 1)) for i in range(20)]
    try:
        answers = await asyncio.wait_for(asyncio.gather(*producers), 45)
    finally:
        stop.set()
        await asyncio.gather(*pickers)
    assert len(claims) == n_entries
    doubles = {entry_id: names for entry_id, names in claims.items() if len(names) != 1}
    assert doubles == {}
    for answer in answers:
        # Each producer heard from the one picker that claimed its entry.
        assert claims[answer.entry_id] == [answer.answer]
    assert await harness.registry.store.count_entries() == 0


async def test_pick_next_match_filters_by_kind_and_session(harness: Harness) -> None:
    listener = harness.listen("")
    await listener.synced()
    secret = ask(harness, "tg-1", kind=pb.ENTRY_KIND_SECRET)
    other_session = ask(harness, "tg-2", kind=pb.ENTRY_KIND_ASK)
    mine = ask(harness, "tg-1", kind=pb.ENTRY_KIND_ASK)
    for _ in range(3):
        await listener.until(lambda m: m.type == pb.LISTEN_EVENT_TYPE_AVAILABLE)

    reply = await harness.stub.PickNextMatch(
        pb.PickNextMatchRequest(prefix="tg-", picker="bot", kinds=[pb.ENTRY_KIND_ASK], session_id="tg-1")
    )
    assert reply.entry.session_id == "tg-1" and reply.entry.kind == pb.ENTRY_KIND_ASK
    none = await harness.stub.PickNextMatch(
        pb.PickNextMatchRequest(prefix="dc-", picker="bot", kinds=[pb.ENTRY_KIND_SECRET])
    )
    assert not none.HasField("entry")
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await harness.stub.PickNextMatch(
            pb.PickNextMatchRequest(prefix="tg-", picker="bot", kinds=[pb.ENTRY_KIND_UNSPECIFIED])
        )
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await harness.stub.PickNext(pb.PickNextRequest(prefix="tg-", picker=""))
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    await harness.stub.Reply(pb.ReplyRequest(entry_id=reply.entry.entry_id, answer="a"))
    assert (await mine).answer == "a"
    for call in (secret, other_session):
        call.cancel()
    listener.cancel()


# --- producers going away -------------------------------------------------------


async def test_cancelled_ask_is_removed_before_any_picker_sees_it(harness: Harness) -> None:
    listener = harness.listen("tg-")
    await listener.synced()
    tools = [pb.ToolResult(tool_call_id="c1", name="read", arguments="{}", output="file body")]
    producer = ask(harness, "tg-9", "deploy now?", tools=tools)
    available = await listener.until(lambda m: m.type == pb.LISTEN_EVENT_TYPE_AVAILABLE)
    entry_id = available.entry.entry_id

    producer.cancel()
    removed = await listener.until(lambda m: m.type == pb.LISTEN_EVENT_TYPE_REMOVED)
    assert removed.entry.entry_id == entry_id and removed.removal_reason == pb.REMOVAL_REASON_WITHDRAWN
    # No picker, of any prefix, gets it; a reply to it fails ...
    for prefix in ("", "tg-"):
        reply = await harness.stub.PickNext(pb.PickNextRequest(prefix=prefix, picker="late"))
        assert not reply.HasField("entry")
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await harness.stub.Reply(pb.ReplyRequest(entry_id=entry_id, answer="yes"))
    assert exc.value.code() == grpc.StatusCode.NOT_FOUND
    # ... and the failed reply keeps the pending snapshot for a later resume.
    snap = await snapshot_or_none(harness, "tg-9")
    assert snap is not None and snap.entry_id == entry_id and snap.payload == "deploy now?"
    await eventually(lambda: _entries_are(harness, 0), what="the entry row to go")
    listener.cancel()


async def test_ask_deadline_removes_the_entry(harness: Harness) -> None:
    listener = harness.listen("")
    await listener.synced()
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await ask(harness, "dc-3", timeout=0.3)
    assert exc.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    removed = await listener.until(lambda m: m.type == pb.LISTEN_EVENT_TYPE_REMOVED)
    assert removed.removal_reason == pb.REMOVAL_REASON_WITHDRAWN
    assert not (await harness.stub.PickNext(pb.PickNextRequest(prefix="", picker="p"))).HasField("entry")
    listener.cancel()


async def _entries_are(h: Harness, n: int) -> bool:
    return await h.registry.store.count_entries() == n


async def test_withdrawal_does_not_wait_for_the_database(tmp_path: Path) -> None:
    """The entry leaves the pickable set in the cancelling step itself, before its row is deleted."""
    gate = asyncio.Event()

    class SlowDeletes(PendingStore):
        async def delete_entry(self, entry_id: str, drop_snapshot: bool) -> None:
            await gate.wait()
            await super().delete_entry(entry_id, drop_snapshot)

    db = Database(f"sqlite:///{tmp_path}/p.db", MIGRATIONS)
    db.migrate()
    store = SlowDeletes(db)
    entries = PendingEntries(store, clock=lambda: 1)
    try:
        producer = asyncio.ensure_future(entries.ask(NewAsk("tg-1", EntryKind.ASK, "q", agent_id=AGENT)))

        async def registered() -> bool:
            return entries.live_count == 1

        await eventually(registered, what="the entry to register")
        producer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await producer
        assert await store.count_entries() == 1  # the row is still there ...
        assert await entries.pick("p", PickFilter("")) is None  # ... but nobody can claim it
        gate.set()
        await eventually(lambda: _count_is(store, 0), what="the row to go")
    finally:
        gate.set()
        await entries.close()
        db.close()


async def _count_is(store: PendingStore, n: int) -> bool:
    return await store.count_entries() == n


# --- listeners --------------------------------------------------------------------


async def test_listen_sends_backlog_then_new_entries_per_prefix(harness: Harness) -> None:
    first = ask(harness, "tg-a", "one")
    second = ask(harness, "dc-a", "two")
    third = ask(harness, "tg-b", "three")
    await eventually(lambda: _live_is(harness, 3), what="three entries")
    # A claimed entry is not offered to a new listener.
    claimed = await harness.stub.PickNextMatch(pb.PickNextMatchRequest(prefix="tg-", picker="x", session_id="tg-b"))
    assert claimed.entry.payload == "three"

    tg = harness.listen("tg-")
    dc = harness.listen("dc-")
    assert [m.entry.payload for m in await tg.synced()] == ["one"]
    assert [m.entry.payload for m in await dc.synced()] == ["two"]

    fourth = ask(harness, "dc-b", "four")
    new = await dc.until(lambda m: m.type == pb.LISTEN_EVENT_TYPE_AVAILABLE)
    assert new.entry.payload == "four"
    # tg- never hears about dc- entries: the next thing it sees is its own.
    fifth = ask(harness, "tg-c", "five")
    nxt = await tg.next()
    assert nxt.type == pb.LISTEN_EVENT_TYPE_AVAILABLE and nxt.entry.payload == "five"
    for call in (first, second, third, fourth, fifth):
        call.cancel()
    tg.cancel()
    dc.cancel()


async def _live_is(h: Harness, n: int) -> bool:
    return h.registry.entries.live_count == n


async def test_has_listener_follows_connections_per_prefix(harness: Harness) -> None:
    assert not await harness.has_listener(origin="tg-")
    tg = harness.listen("tg-", "telegram")
    await tg.synced()
    assert await harness.has_listener(origin="tg-")
    assert await harness.has_listener(session_id="tg-42")
    assert not await harness.has_listener(origin="dc-")
    assert not await harness.has_listener(origin="cli-")

    everything = harness.listen("", "dashboard")
    await everything.synced()
    assert await harness.has_listener(origin="dc-") and await harness.has_listener(origin="cli-")
    everything.cancel()

    async def dc_gone() -> bool:
        return not await harness.has_listener(origin="dc-")

    await eventually(dc_gone, what="the catch-all listener to disconnect")
    assert await harness.has_listener(origin="tg-")  # the other prefix is unaffected

    narrow = harness.listen("dc-chat42-")
    await narrow.synced()
    assert await harness.has_listener(session_id="dc-chat42-s1")
    assert not await harness.has_listener(session_id="dc-chat43-s1")
    assert not await harness.has_listener(origin="dc-")  # it does not cover the whole origin
    narrow.cancel()

    tg.cancel()

    async def tg_gone() -> bool:
        return not await harness.has_listener(origin="tg-")

    await eventually(tg_gone, what="the tg- listener to disconnect")

    for bad in (
        pb.HasListenerRequest(),
        pb.HasListenerRequest(origin="web-"),
        pb.HasListenerRequest(origin="tg-", session_id="tg-1"),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await harness.stub.HasListener(bad)
        assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_listen_rejects_bad_prefix(harness: Harness) -> None:
    listener = harness.listen("telegram")
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await listener.next()
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT and reason(exc.value) == "INVALID_PREFIX"


# --- cancellation by cause ----------------------------------------------------------


async def test_pause_keeps_user_cancel_deletes(harness: Harness) -> None:
    tools = [pb.ToolResult(tool_call_id="c1", name="ls", arguments="{}", output="a b c")]
    producer = ask(harness, "chat-s1", "which file?", tools=tools)
    await eventually(lambda: _live_is(harness, 1), what="the entry")

    paused = await harness.stub.CancelSession(pb.CancelSessionRequest(session_id="chat-s1", cause="paused"))
    assert not paused.deleted and paused.canceled_entries == 0
    other = await harness.stub.CancelSession(pb.CancelSessionRequest(session_id="chat-s1", cause="shutdown"))
    assert not other.deleted
    snap = await snapshot_or_none(harness, "chat-s1")
    assert snap is not None and snap.tool_results[0].output == "a b c"
    assert not producer.done() and harness.registry.entries.live_count == 1

    canceled = await harness.stub.CancelSession(pb.CancelSessionRequest(session_id="chat-s1", cause="user_canceled"))
    assert canceled.deleted and canceled.canceled_entries == 1
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await producer
    assert exc.value.code() == grpc.StatusCode.CANCELLED and reason(exc.value) == "ASK_CANCELED"
    assert await snapshot_or_none(harness, "chat-s1") is None
    assert harness.registry.entries.live_count == 0 and await harness.registry.store.count_entries() == 0

    again = await harness.stub.CancelSession(pb.CancelSessionRequest(session_id="chat-s1", cause="user_canceled"))
    assert not again.deleted
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await harness.stub.CancelSession(pb.CancelSessionRequest(session_id="chat-s1", cause=""))
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_user_cancel_deletes_a_snapshot_left_by_a_gone_producer(harness: Harness) -> None:
    producer = ask(harness, "tg-s2", "q", tools=[pb.ToolResult(name="t", output="o")])
    await eventually(lambda: _live_is(harness, 1), what="the entry")
    producer.cancel()  # e.g. the run was paused and torn down
    await eventually(lambda: _live_is(harness, 0), what="withdrawal")
    assert await snapshot_or_none(harness, "tg-s2") is not None
    reply = await harness.stub.CancelSession(pb.CancelSessionRequest(session_id="tg-s2", cause="user_canceled"))
    assert reply.deleted and reply.canceled_entries == 0
    assert await snapshot_or_none(harness, "tg-s2") is None


# --- pending snapshots --------------------------------------------------------------


async def test_snapshot_is_clamped_and_replaced_and_dropped_when_answered(harness: Harness) -> None:
    tools = [
        pb.ToolResult(tool_call_id="c1", name="read", arguments="é" * 600, output="😀" * 2000),
        pb.ToolResult(tool_call_id="c2", name="ls", arguments="{}", output="small"),
    ]
    first = ask(harness, "dc-s", "first?", tools=tools)
    await eventually(lambda: _live_is(harness, 1), what="first entry")
    snap = await snapshot_or_none(harness, "dc-s")
    assert snap is not None and snap.origin == "dc-" and snap.kind == pb.ENTRY_KIND_ASK
    big, small = snap.tool_results
    assert big.output == "😀" * 1024 and big.output_truncated  # 4096 bytes exactly
    assert big.arguments == "é" * 512 and big.arguments_truncated  # 1024 bytes exactly
    assert (small.output, small.output_truncated, small.arguments_truncated) == ("small", False, False)

    # A later ask of the same session replaces the snapshot.
    second = ask(harness, "dc-s", "second?")
    await eventually(lambda: _live_is(harness, 2), what="second entry")
    snap = await snapshot_or_none(harness, "dc-s")
    assert snap is not None and snap.payload == "second?" and list(snap.tool_results) == []

    picked = await harness.stub.PickNextMatch(pb.PickNextMatchRequest(prefix="dc-", picker="bot", session_id="dc-s"))
    assert picked.entry.payload == "first?"
    await harness.stub.Reply(pb.ReplyRequest(entry_id=picked.entry.entry_id, answer="1"))
    await first
    assert await snapshot_or_none(harness, "dc-s") is not None  # still the second's
    picked = await harness.stub.PickNext(pb.PickNextRequest(prefix="dc-", picker="bot"))
    await harness.stub.Reply(pb.ReplyRequest(entry_id=picked.entry.entry_id, answer="2"))
    assert (await second).answer == "2"
    assert await snapshot_or_none(harness, "dc-s") is None


async def test_ask_validation(harness: Harness) -> None:
    cases = [
        (pb.AskRequest(session_id="web-1", kind=ASK), "SESSION_ORIGIN_UNKNOWN"),
        (pb.AskRequest(session_id="tg-1", kind=pb.ENTRY_KIND_UNSPECIFIED, agent_id=AGENT), "INVALID_KIND"),
        (
            pb.AskRequest(session_id="tg-1", kind=ASK, payload="x" * (64 * 1024 + 1), agent_id=AGENT),
            "PAYLOAD_TOO_LARGE",
        ),
        (pb.AskRequest(session_id="tg-1", kind=ASK), "MISSING_AGENT_ID"),
        (pb.AskRequest(session_id="tg-1", kind=ASK, agent_id="bad agent"), "INVALID_ID"),
        (pb.AskRequest(session_id="", kind=ASK), "INVALID_ID"),
    ]
    for request, expected in cases:
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await harness.stub.Ask(request, timeout=5)
        assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT, expected
        assert reason(exc.value) == expected
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await harness.stub.GetSessionTask(pb.GetSessionTaskRequest(agent_id=AGENT, session_id="bad id"))
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_stop_wakes_producers_and_listeners_with_unavailable(harness: Harness) -> None:
    listener = harness.listen("")
    await listener.synced()
    producer = ask(harness, "cli-1")
    await listener.until(lambda m: m.type == pb.LISTEN_EVENT_TYPE_AVAILABLE)
    await harness.registry.stop()
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await producer
    assert exc.value.code() == grpc.StatusCode.UNAVAILABLE and reason(exc.value) == "REGISTRY_SHUTTING_DOWN"
    removed = await listener.next()
    assert removed.removal_reason == pb.REMOVAL_REASON_SHUTDOWN
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await listener.next()
    assert exc.value.code() == grpc.StatusCode.UNAVAILABLE
    assert await harness.registry.store.count_entries() == 0


async def test_waiting_pickers_timeouts_and_cancels_never_double_claim(tmp_path: Path) -> None:
    """Pickers waiting in PickNext, timing out and being cancelled at random while producers
    arrive: every entry is handed to exactly one picker, none is stranded."""
    rng = random.Random(11)
    db = Database(f"sqlite:///{tmp_path}/p.db", MIGRATIONS)
    db.migrate()
    entries = PendingEntries(PendingStore(db), clock=lambda: 1)
    claims: dict[str, list[str]] = defaultdict(list)
    stop = asyncio.Event()

    async def picker(name: str, prefix: str) -> None:
        while not stop.is_set():
            attempt = entries.pick(name, PickFilter(prefix), max_wait_s=rng.choice([0, 0.001, 0.01, 0.05]))
            try:
                # Sometimes the caller gives up (cancels) at an arbitrary moment.
                entry = await asyncio.wait_for(attempt, rng.choice([0.0005, 0.005, 1.0]))
            except TimeoutError:
                continue
            if entry is None:
                await asyncio.sleep(0)
                continue
            claims[entry.entry_id].append(name)
            entries.reply(entry.entry_id, name, picker=name)

    async def producer(i: int) -> tuple[str, str]:
        await asyncio.sleep(rng.random() * 0.2)
        return await entries.ask(NewAsk(f"{['tg-', 'dc-', 'cli-'][i % 3]}s{i}", EntryKind.ASK, str(i), agent_id=AGENT))

    try:
        pickers = [asyncio.ensure_future(picker(f"p{i}", ["", "tg-", "dc-", "cli-"][i % 4])) for i in range(24)]
        answers = await asyncio.wait_for(asyncio.gather(*(producer(i) for i in range(150))), 30)
        stop.set()
        await asyncio.gather(*pickers)
        assert len(claims) == 150 and all(len(names) == 1 for names in claims.values())
        assert all(claims[entry_id] == [name] for entry_id, name in answers)
        assert len({name for names in claims.values() for name in names}) > 5  # they really raced
        assert entries.live_count == 0
    finally:
        stop.set()
        await entries.close()
        db.close()


async def test_waiting_pick_next_gets_the_next_entry(harness: Harness) -> None:
    listener = harness.listen("")
    await listener.synced()
    waiting = harness.stub.PickNext(pb.PickNextRequest(prefix="tg-", picker="bot", max_wait=_seconds(10)))
    other = harness.stub.PickNextMatch(
        pb.PickNextMatchRequest(prefix="", picker="web", kinds=[pb.ENTRY_KIND_SECRET], max_wait=_seconds(10))
    )
    await eventually(lambda: _waiting_is(harness, 2), what="two waiting pickers")
    dc = ask(harness, "dc-1", "not for the tg- picker")
    assert (await listener.next()).type == pb.LISTEN_EVENT_TYPE_AVAILABLE  # nobody waits for it
    tg = ask(harness, "tg-1", "for the tg- picker")
    picked = await waiting
    assert picked.entry.session_id == "tg-1" and picked.entry.claimed_by == "bot"
    claimed = await listener.next()  # handed over at once: listeners only hear it was claimed
    assert claimed.type == pb.LISTEN_EVENT_TYPE_CLAIMED and claimed.entry.entry_id == picked.entry.entry_id
    await harness.stub.Reply(pb.ReplyRequest(entry_id=picked.entry.entry_id, answer="ok", picker="bot"))
    assert (await tg).answer == "ok"
    other.cancel()
    dc.cancel()
    await eventually(lambda: _waiting_is(harness, 0), what="the cancelled picker to leave")

    empty = await harness.stub.PickNext(pb.PickNextRequest(prefix="cli-", picker="p", max_wait=_seconds(0.2)))
    assert not empty.HasField("entry")
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await harness.stub.PickNext(pb.PickNextRequest(prefix="cli-", picker="p", max_wait=_seconds(301)))
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT and reason(exc.value) == "INVALID_WAIT"
    listener.cancel()


def _seconds(value: float) -> Duration:
    wait = Duration()
    wait.FromNanoseconds(int(value * 1e9))
    return wait


async def _waiting_is(h: Harness, n: int) -> bool:
    return h.registry.entries.waiting_pickers == n
