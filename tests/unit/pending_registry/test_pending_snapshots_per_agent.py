"""Pending snapshots are kept per agent and session; snapshots stored before that keep reading."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import pytest
from sqlalchemy import text

from libs.db import Database
from services.pending_registry.domain import EntryKind, NewAsk, Snapshot, ToolResult, new_entry
from services.pending_registry.store import MIGRATIONS, PendingStore
from taskgate.pending.v1 import pending_pb2 as pb
from tests.support.postgres import fresh_database

from .harness import Harness, eventually, reason
from .test_pending_entries import ask, snapshot_or_none


def _live_is(harness: Harness, count: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return harness.registry.entries.live_count == count

    return check


async def _withdrawn_ask(harness: Harness, session_id: str, agent: str, payload: str) -> None:
    """An ask whose producer went away: its snapshot stays (as after a pause)."""
    producer = ask(harness, session_id, payload, agent=agent)
    await eventually(_live_is(harness, 1), what="the entry")
    producer.cancel()
    await eventually(_live_is(harness, 0), what="the withdrawal")


async def test_two_agents_keep_their_own_snapshot_of_one_session(harness: Harness) -> None:
    await _withdrawn_ask(harness, "tg-shared", "agent-a", "from a")
    await _withdrawn_ask(harness, "tg-shared", "agent-b", "from b")
    mine = await snapshot_or_none(harness, "tg-shared", agent="agent-a")
    theirs = await snapshot_or_none(harness, "tg-shared", agent="agent-b")
    assert mine is not None and (mine.agent_id, mine.payload) == ("agent-a", "from a")
    assert theirs is not None and (theirs.agent_id, theirs.payload) == ("agent-b", "from b")
    assert await snapshot_or_none(harness, "tg-shared", agent="agent-c") is None

    # A user cancel through one agent deletes that agent's snapshot only.
    reply = await harness.stub.CancelSession(
        pb.CancelSessionRequest(session_id="tg-shared", cause="user_canceled", agent_id="agent-a")
    )
    assert reply.deleted
    assert await snapshot_or_none(harness, "tg-shared", agent="agent-a") is None
    assert await snapshot_or_none(harness, "tg-shared", agent="agent-b") is not None


async def test_an_agent_is_required_to_read_a_snapshot(harness: Harness) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await harness.stub.GetSessionTask(pb.GetSessionTaskRequest(session_id="tg-1"), timeout=5)
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT and reason(exc.value) == "INVALID_ID"


async def test_listeners_see_the_agent_of_an_entry(harness: Harness) -> None:
    listener = harness.listen("dc-")
    await listener.synced()
    producer = ask(harness, "dc-7", "go?", agent="agent-z")
    available = await listener.until(lambda m: m.type == pb.LISTEN_EVENT_TYPE_AVAILABLE)
    assert available.entry.agent_id == "agent-z"
    producer.cancel()


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'pending.db'}"
    return fresh_database(request.getfixturevalue("postgres_url"), "pending")


async def test_migration_keeps_older_snapshots_readable(db_url: str) -> None:
    before = Database(db_url, MIGRATIONS[:1])
    assert before.migrate() == [1]
    with before.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO pending_snapshots (session_id, entry_id, origin, kind, payload, tool_results, created_at)"
                " VALUES ('tg-old', :entry, 'tg-', 'ask', 'old question', :tools, 7)"
            ),
            {"entry": "e" * 32, "tools": '[{"tool_call_id": "c", "name": "ls", "arguments": "{}", "output": "x"}]'},
        )
    before.close()

    db = Database(db_url, MIGRATIONS)
    assert db.migrate() == [2, 3]
    store = PendingStore(db)
    try:
        # Any agent reads the session's older snapshot, unchanged.
        legacy = await store.get_snapshot("agent-a", "tg-old")
        assert legacy == Snapshot(
            session_id="tg-old",
            entry_id="e" * 32,
            origin="tg-",
            kind=EntryKind.ASK,
            payload="old question",
            tool_results=(ToolResult("c", "ls", "{}", "x"),),
            created_at=7,
            agent_id="",
        )
        assert await store.get_snapshot("agent-b", "tg-old") == legacy

        # A new ask of agent-a gives agent-a its own; agent-b still reads the older one.
        entry, snapshot = new_entry(NewAsk("tg-old", EntryKind.ASK, "new question", agent_id="agent-a"), now=9)
        await store.insert_entry(entry, snapshot)
        mine = await store.get_snapshot("agent-a", "tg-old")
        assert mine is not None and mine.payload == "new question" and mine.agent_id == "agent-a"
        assert await store.get_snapshot("agent-b", "tg-old") == legacy

        # A user cancel through agent-a removes agent-a's and the older (session-wide) one.
        assert await store.delete_session("tg-old", "agent-a")
        assert await store.get_snapshot("agent-b", "tg-old") is None
    finally:
        db.close()
