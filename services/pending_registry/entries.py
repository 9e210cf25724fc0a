"""Live pending entries: producers blocked in Ask, listeners, pickers and replies.

All in-memory state is changed only on the event loop, between awaits, so a
claim or a removal is atomic with respect to every other request: once a
producer's Ask is cancelled its entry leaves ``_live`` in the same step, before
any picker can run again. The database keeps the durable record (entries and
pending snapshots); blocking waits are asyncio futures keyed by entry id.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from libs.log import get_logger
from services.pending_registry import domain
from services.pending_registry.domain import (
    USER_CANCELED,
    AskCanceled,
    Entry,
    EntryEvent,
    EventType,
    NewAsk,
    PickFilter,
    RemovalReason,
    Snapshot,
)
from services.pending_registry.metrics import ENTRIES_REGISTERED, ENTRY_CLAIMS
from services.pending_registry.store import PendingStore

log = get_logger("pending_registry.entries")

# Events a listener may hold unread before it is dropped (it can reconnect).
LISTENER_QUEUE_LIMIT = 4096


@dataclass(eq=False)
class _Live:
    entry: Entry
    waiter: asyncio.Future[str]


@dataclass(eq=False)
class _WaitingPicker:
    picker: str
    wanted: PickFilter
    future: asyncio.Future[Entry]


@dataclass(eq=False)
class _Listener:
    listener_id: int
    prefix: str
    name: str
    queue: asyncio.Queue[EntryEvent | None] = field(default_factory=asyncio.Queue)
    overflowed: bool = False


class PendingEntries:
    def __init__(
        self, store: PendingStore, clock: Callable[[], int], listener_queue_limit: int = LISTENER_QUEUE_LIMIT
    ) -> None:
        self.store = store
        self.clock = clock
        self.listener_queue_limit = listener_queue_limit
        # Creation order: the oldest unclaimed match is picked first.
        self._live: dict[str, _Live] = {}
        self._listeners: set[_Listener] = set()
        self._listener_ids = itertools.count(1)
        # Pickers waiting for an entry, first come first served.
        self._waiting: list[_WaitingPicker] = []
        self._background: set[asyncio.Task[Any]] = set()
        # The latest background write of each entry's row, to keep them in order.
        self._writes: dict[str, asyncio.Task[Any]] = {}
        self._closing = False

    # --- producers --------------------------------------------------------------

    async def ask(self, ask: NewAsk) -> tuple[str, str]:
        """Register an entry and wait for its reply: (entry id, answer)."""
        if self._closing:
            raise domain.shutting_down()
        entry, snapshot = domain.new_entry(ask, self.clock())
        entry_id = entry.entry_id
        insert = asyncio.ensure_future(self.store.insert_entry(entry, snapshot))
        try:
            await asyncio.shield(insert)
        except asyncio.CancelledError:
            # The row may still land: remove it once it has.
            self._spawn(self._discard_after(insert, entry_id))
            raise
        if self._closing:
            await self.store.delete_entry(entry_id, drop_snapshot=False)
            raise domain.shutting_down()
        waiter: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        live = _Live(entry, waiter)
        self._live[entry_id] = live
        ENTRIES_REGISTERED.labels(entry.kind.value).inc()
        log.debug(
            "entry_registered",
            entry_id=entry_id,
            session_id=entry.session_id,
            kind=entry.kind.value,
            snapshot=snapshot is not None,
        )
        self._offer(live)
        try:
            answer = await waiter
        except asyncio.CancelledError:
            # The producer went away (cancelled, deadline, disconnect): the entry
            # goes now; its snapshot stays so the session can be resumed.
            gone = self._live.pop(entry_id, None)
            if gone is not None:
                self._publish(EntryEvent(EventType.REMOVED, gone.entry, RemovalReason.WITHDRAWN))
            self._write(entry_id, lambda: self.store.delete_entry(entry_id, drop_snapshot=False))
            log.info("entry_withdrawn", entry_id=entry_id, session_id=entry.session_id)
            raise
        removal = self._write(entry_id, lambda: self.store.delete_entry(entry_id, drop_snapshot=True))
        if snapshot is not None:
            # The snapshot goes before the producer hears the answer, so a session
            # is never resumed both inline and from its snapshot.
            try:
                await asyncio.shield(removal)
            except Exception:  # noqa: BLE001 - logged by _spawn; the answer still counts
                pass
        # Without a snapshot the row is only a record: it is deleted behind the
        # answer (and by the start-up sweep should the process die first).
        return entry_id, answer

    async def _discard_after(self, insert: asyncio.Future[None], entry_id: str) -> None:
        try:
            await insert
        except Exception:  # noqa: BLE001 - nothing was written
            return
        await self.store.delete_entry(entry_id, drop_snapshot=False)

    # --- front-ends -------------------------------------------------------------

    async def listen(self, prefix: str, name: str) -> AsyncIterator[EntryEvent]:
        """The unclaimed matching entries, SYNCED, then every change of a matching entry."""
        domain.validate_prefix(prefix)
        domain.validate_name("listenerName", name, required=False)
        if self._closing:
            raise domain.shutting_down()
        listener = _Listener(next(self._listener_ids), prefix, name)
        # Backlog and registration in one step: nothing is missed or sent twice.
        for live in self._live.values():
            if live.entry.claimed_by is None and domain.prefix_matches(prefix, live.entry.session_id):
                listener.queue.put_nowait(EntryEvent(EventType.AVAILABLE, live.entry))
        listener.queue.put_nowait(EntryEvent(EventType.SYNCED))
        self._listeners.add(listener)
        log.info("listener_connected", prefix=prefix, listener=name, listener_id=listener.listener_id)
        try:
            while True:
                event = await listener.queue.get()
                if event is None:
                    if listener.overflowed:
                        raise domain.ResourceExhausted(
                            "LISTENER_OVERFLOW", "the listener fell too far behind; listen again"
                        )
                    raise domain.shutting_down()
                yield event
        finally:
            self._listeners.discard(listener)
            log.info("listener_disconnected", prefix=prefix, listener=name, listener_id=listener.listener_id)

    def has_listener(self, origin: str | None = None, session_id: str | None = None) -> bool:
        if (origin is None) == (session_id is None):
            raise domain.InvalidArgument("INVALID_ARGUMENT", "name either an origin or a session id")
        if origin is not None:
            domain.validate_origin(origin)
            return any(domain.listener_covers_origin(lst.prefix, origin) for lst in self._listeners)
        assert session_id is not None
        domain.origin_of(session_id)
        return any(domain.prefix_matches(lst.prefix, session_id) for lst in self._listeners)

    async def pick(self, picker: str, wanted: PickFilter, max_wait_s: float = 0.0) -> Entry | None:
        """Claim the oldest unclaimed entry ``wanted`` accepts.

        With ``max_wait_s`` > 0 and nothing waiting, wait up to that long for the
        next matching entry (waiting pickers are served first come, first served);
        None when there is none.
        """
        domain.validate_prefix(wanted.prefix)
        domain.validate_name("picker", picker)
        if wanted.session_id is not None:
            domain.validate_id("sessionId", wanted.session_id)
        domain.validate_wait(max_wait_s)
        live = next(
            (lv for lv in self._live.values() if lv.entry.claimed_by is None and wanted.accepts(lv.entry)), None
        )
        if live is not None:
            return self._claim(live, picker)
        if max_wait_s <= 0:
            return None
        if self._closing:
            raise domain.shutting_down()
        waiting = _WaitingPicker(picker, wanted, asyncio.get_running_loop().create_future())
        self._waiting.append(waiting)
        handed: Entry | None = None
        try:
            async with asyncio.timeout(max_wait_s):
                handed = await waiting.future
            return handed
        except TimeoutError:
            return None
        finally:
            if waiting in self._waiting:
                self._waiting.remove(waiting)
            future = waiting.future
            if handed is None and future.done() and not future.cancelled() and future.exception() is None:
                # Claimed for us, but we timed out or were cancelled in the same
                # instant: give the entry back rather than strand it.
                self._release(future.result())

    def reply(self, entry_id: str, answer: str, picker: str | None = None) -> None:
        """Hand the answer to the blocked producer (never stored: it may be a secret)."""
        domain.validate_uuid("entryId", entry_id)
        domain.validate_text("answer", answer, domain.MAX_ANSWER_BYTES, allow_empty=True)
        if picker:
            domain.validate_name("picker", picker)
        live = self._live.get(entry_id)
        if live is None or live.waiter.done():
            raise domain.NotFound(
                "ENTRY_NOT_FOUND",
                "no such pending entry (answered, withdrawn or cancelled)",
                entryId=entry_id,
            )
        if picker and live.entry.claimed_by not in (None, picker):
            raise domain.PermissionDenied(
                "ENTRY_CLAIMED_BY_OTHER", "another front-end claimed this entry", entryId=entry_id
            )
        del self._live[entry_id]
        live.waiter.set_result(answer)
        self._publish(EntryEvent(EventType.REMOVED, live.entry, RemovalReason.ANSWERED))
        log.debug("entry_answered", entry_id=entry_id, picker=picker or live.entry.claimed_by)

    # --- sessions ---------------------------------------------------------------

    async def cancel_session(self, session_id: str, cause: str, agent_id: str | None = None) -> tuple[bool, int]:
        """(deleted anything, producers told). Only ``user_canceled`` deletes.

        With ``agent_id``, only that agent's entries and snapshot of the session (and a
        snapshot stored before snapshots were kept per agent); without, every agent's.
        """
        domain.validate_id("sessionId", session_id)
        domain.validate_cause(cause)
        if agent_id is not None:
            domain.validate_id("agentId", agent_id)
        if cause != USER_CANCELED:
            log.info("session_cancel_kept", session_id=session_id, cause=cause)
            return False, 0
        victims = [
            lv
            for lv in self._live.values()
            if lv.entry.session_id == session_id and (agent_id is None or lv.entry.agent_id in (agent_id, ""))
        ]
        for live in victims:
            del self._live[live.entry.entry_id]
            if not live.waiter.done():
                live.waiter.set_exception(
                    AskCanceled(
                        "ASK_CANCELED",
                        "the session was cancelled by the user",
                        cause=cause,
                        sessionId=session_id,
                    )
                )
            self._publish(EntryEvent(EventType.REMOVED, live.entry, RemovalReason.CANCELED))
        deleted = await self.store.delete_session(session_id, agent_id)
        log.info(
            "session_canceled",
            session_id=session_id,
            agent_id=agent_id,
            cause=cause,
            entries=len(victims),
            deleted=deleted,
        )
        return deleted or bool(victims), len(victims)

    async def session_task(self, agent_id: str, session_id: str) -> Snapshot:
        """The agent's snapshot of the session, else one stored before snapshots were kept per agent."""
        domain.validate_id("agentId", agent_id)
        domain.validate_id("sessionId", session_id)
        snapshot = await self.store.get_snapshot(agent_id, session_id)
        if snapshot is None:
            raise domain.NotFound(
                "PENDING_TASK_NOT_FOUND",
                f"session {session_id} has no pending task for agent {agent_id}",
                sessionId=session_id,
                agentId=agent_id,
            )
        return snapshot

    # --- lifecycle --------------------------------------------------------------

    async def start(self) -> int:
        """Drop entries of an earlier incarnation: their producers' calls ended with it."""
        swept = await self.store.delete_all_entries()
        if swept:
            log.info("orphaned_entries_removed", count=swept)
        return swept

    async def close(self) -> None:
        """Wake every producer and listener with UNAVAILABLE; remove the entries."""
        self._closing = True
        for live in list(self._live.values()):
            if not live.waiter.done():
                live.waiter.set_exception(domain.shutting_down())
            self._publish(EntryEvent(EventType.REMOVED, live.entry, RemovalReason.SHUTDOWN))
        self._live.clear()
        for waiting in self._waiting:
            if not waiting.future.done():
                waiting.future.set_exception(domain.shutting_down())
        self._waiting.clear()
        for listener in list(self._listeners):
            listener.queue.put_nowait(None)
        self._listeners.clear()
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        await self.store.delete_all_entries()

    @property
    def live_count(self) -> int:
        return len(self._live)

    @property
    def waiting_pickers(self) -> int:
        return len(self._waiting)

    # --- internals --------------------------------------------------------------

    def _claim(self, live: _Live, picker: str) -> Entry:
        """Take the claim, synchronously: no other picker can take it after this line."""
        now = self.clock()
        live.entry = live.entry.claimed(picker, now)
        self._publish(EntryEvent(EventType.CLAIMED, live.entry))
        ENTRY_CLAIMS.inc()
        # The row is a record; who holds an entry is decided here, in memory.
        entry_id = live.entry.entry_id
        self._write(entry_id, lambda: self.store.claim_entry(entry_id, picker, now))
        log.debug("entry_claimed", entry_id=live.entry.entry_id, picker=picker)
        return live.entry

    def _offer(self, live: _Live) -> None:
        """Hand an unclaimed entry to the first waiting picker that wants it, else announce it."""
        for waiting in self._waiting:
            if not waiting.future.done() and waiting.wanted.accepts(live.entry):
                self._waiting.remove(waiting)
                waiting.future.set_result(self._claim(live, waiting.picker))
                return
        self._publish(EntryEvent(EventType.AVAILABLE, live.entry))

    def _release(self, entry: Entry) -> None:
        live = self._live.get(entry.entry_id)
        if live is None or live.entry.claimed_by != entry.claimed_by or entry.claimed_by is None:
            return
        live.entry = live.entry.released()
        entry_id, holder = entry.entry_id, entry.claimed_by
        self._write(entry_id, lambda: self.store.release_claim(entry_id, holder))
        self._offer(live)

    def _publish(self, event: EntryEvent) -> None:
        assert event.entry is not None
        session_id = event.entry.session_id
        for listener in list(self._listeners):
            if not domain.prefix_matches(listener.prefix, session_id):
                continue
            if listener.queue.qsize() >= self.listener_queue_limit:
                listener.overflowed = True
                self._listeners.discard(listener)
                while not listener.queue.empty():
                    listener.queue.get_nowait()
                listener.queue.put_nowait(None)
                log.warning("listener_overflowed", prefix=listener.prefix, listener=listener.name)
                continue
            listener.queue.put_nowait(event)

    def _write(self, entry_id: str, write: Callable[[], Coroutine[Any, Any, Any]]) -> asyncio.Task[Any]:
        """Run a write of an entry's row in the background, after the earlier writes of that
        row (the database may run writes on several threads)."""
        before = self._writes.get(entry_id)

        async def in_order() -> Any:
            if before is not None:
                await asyncio.wait([before])
            return await write()

        task = self._spawn(in_order())
        self._writes[entry_id] = task

        def forget(done: asyncio.Task[Any]) -> None:
            if self._writes.get(entry_id) is done:
                del self._writes[entry_id]

        task.add_done_callback(forget)
        return task

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(_log_failure)
        return task


def _log_failure(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("background_write_failed", exc_info=task.exception())
