"""Several scheduler hosts on one database: the host id, its lease, wake-ups and the lost-host sweep.

Each replica names itself (``host_id``) and owns the tasks it claimed: only it
signals, reaps or proves their workers. Its claim lasts as long as its lease, one
row per host renewed on a tick (a task's lease is its owner's). A replica that
stops renewing is not replaced by re-running its tasks: past the lease and a grace
any other replica moves its tasks to ``needs_reconciliation`` (``HOST_LOST``), and
the host itself reconciles them when it returns with the same id.

On PostgreSQL the replicas wake each other with LISTEN/NOTIFY (the NOTIFY is sent
in the transaction that made the change, so it arrives only if it committed); a
slow safety poll covers a lost notification. The listening connection also holds
an advisory lock on the host id: two live processes can never share one.
On SQLite there is one replica: a second one with another host id is refused.
"""

from __future__ import annotations

import asyncio
import hashlib
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from libs.db import libpq_url
from services.scheduler import domain
from services.scheduler.domain import HostSummary, Task
from services.scheduler.runtime import Runtime, woken
from services.scheduler.store import HOST_ID_LOCK, NOTIFY_CHANNEL, SecondReplica

log = structlog.get_logger("scheduler")

RECONNECT_MAX_S = 5.0


def default_host_id(hostname: str, data_dir: Path) -> str:
    """The hostname plus a digest of the data dir: two replicas on one machine differ by data dir."""
    digest = hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:8]
    return f"{hostname or 'host'}-{digest}"[:128]


def resolve_host_id(configured: str, data_dir: Path) -> str:
    return configured or default_host_id(socket.gethostname(), data_dir)


class HostIdInUse(Exception):
    """Another live scheduler process holds this host id."""


class Listener:
    """LISTEN on the replicas' channel (PostgreSQL) and route each wake-up; holds the host id's lock."""

    def __init__(self, rt: Runtime, url: str) -> None:
        self.rt = rt
        self.url = libpq_url(url)
        self._conn: object | None = None

    async def connect(self) -> None:
        """Take the host id's advisory lock and start listening; HostIdInUse when it is held."""
        import psycopg

        conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
        cur = await conn.execute("SELECT pg_try_advisory_lock(hashtext(%s))", (HOST_ID_LOCK + self.rt.host_id,))
        row = await cur.fetchone()
        if not row or not row[0]:
            await conn.close()
            raise HostIdInUse(f"another live scheduler uses host id {self.rt.host_id!r}")
        await conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
        self._conn = conn

    async def run(self) -> None:
        import psycopg

        rt = self.rt
        delay = 0.1
        while not rt.closing:
            try:
                if self._conn is None:
                    await self.connect()
                    self.wake_all()  # notifications sent while disconnected are lost: look at everything
                conn = self._conn
                assert isinstance(conn, psycopg.AsyncConnection)
                delay = 0.1
                async for note in conn.notifies():
                    self.route(note.payload)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("notify_listener_lost", error=repr(exc))
                await self.close()
                await asyncio.sleep(delay)
                delay = min(delay * 2, RECONNECT_MAX_S)

    def route(self, payload: str) -> None:
        rt = self.rt
        kind, _, host = payload.partition(":")
        if kind == "queued":
            rt.wake.set()
        elif kind == "control" and host == rt.host_id:
            rt.control_wake.set()
        elif kind == "events" and host != rt.host_id:
            rt.events_wake.set()

    def wake_all(self) -> None:
        for event in (self.rt.wake, self.rt.control_wake, self.rt.events_wake):
            event.set()

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                await conn.close()  # type: ignore[attr-defined]
            except Exception:  # already broken
                pass


# PostgreSQL ends a scheduler session idle in a transaction this long — never a healthy one
# (its statements run back to back on a database thread): a host frozen mid-transaction (a
# stopped process, a paused VM) must not hold the row locks the other replicas' sweeps of it
# wait for until TCP gives up on it, hours later.
MIN_IDLE_IN_TRANSACTION_MS = 10_000


def scheduler_pg_settings(lease_ms: int) -> dict[str, str]:
    """The PostgreSQL session settings of the scheduler's database connections."""
    return {"idle_in_transaction_session_timeout": str(max(lease_ms, MIN_IDLE_IN_TRANSACTION_MS))}


class HostLease:
    """Renews this host's lease on a tick and, with several hosts, sweeps the lost ones."""

    def __init__(self, rt: Runtime, reconcile: Callable[[], Awaitable[int]] | None = None) -> None:
        self.rt = rt
        # This host's own HOST_LOST tasks (swept while it was silent) are reconciled on each tick.
        self.reconcile = reconcile

    async def register(self) -> None:
        rt = self.rt
        now = rt.clock.now_ms()
        try:
            await rt.store.register_host(rt.boot_id, now, rt.tasks_cfg.lease_ms, only_one=not rt.multi_host)
        except SecondReplica as exc:
            log.error("second_replica_refused", host_id=rt.host_id, reason=str(exc))
            raise
        rt.lease_held_until = now + rt.tasks_cfg.lease_ms
        log.info("scheduler_host_registered", host_id=rt.host_id, multi_host=rt.multi_host)

    async def loop(self) -> None:
        """Renew on its own tick, apart from the sweep and the reconciliation: those take a
        transaction per task (and a stop may take its grace), so sharing the tick let a sweep
        of a lost host's many tasks delay this host's own renewal past its lease and grace —
        and another replica then swept this live host's tasks as HOST_LOST."""
        if self.rt.multi_host:
            await asyncio.gather(
                self._every_tick(self.renew_once, "lease_renewal_failed"),
                self._every_tick(self._sweep_and_reconcile, "lost_host_sweep_failed"),
            )
        else:
            await self._every_tick(self.renew_once, "lease_renewal_failed")

    async def _every_tick(self, step: Callable[[], Awaitable[object]], failed: str) -> None:
        rt = self.rt
        period = rt.tasks_cfg.lease_ms / 3000
        while not rt.closing:
            try:
                await step()
            except Exception:
                log.exception(failed)
            await asyncio.sleep(period)

    async def _sweep_and_reconcile(self) -> None:
        try:
            await self.sweep_once()
        finally:  # a sweep that failed (a lock it gave up on) does not hold back this host's own
            if self.reconcile is not None:
                await self.reconcile()

    async def renew_once(self) -> None:
        rt = self.rt
        now = rt.clock.now_ms()
        previous = await rt.store.renew_lease(now + rt.tasks_cfg.lease_ms)
        rt.lease_held_until = now + rt.tasks_cfg.lease_ms if previous is not None else 0
        if previous is None or previous < now:
            # Silent past its own lease: another replica may have swept this host's tasks.
            log.warning("lease_lapsed", host_id=rt.host_id, expired_at=previous)
            if previous is None:
                await self.register()

    async def sweep_once(self) -> int:
        """Tasks of hosts silent past lease + grace: HOST_LOST (or released when never launched)."""
        rt = self.rt
        now = rt.clock.now_ms()
        cutoff = now - rt.tasks_cfg.host_lost_grace_ms
        swept = 0
        for host in await rt.store.lost_hosts(cutoff):
            task_ids = await rt.store.tasks_held_by(host)
            if not task_ids:
                await rt.store.forget_host(host, cutoff)
                continue
            for task_id in task_ids:
                task, stored = await rt.store.sweep_lost(task_id, host, now, cutoff)
                rt.published(stored, task)
                if stored is not None:
                    swept += 1
                    log.warning("host_lost_task", task_id=task_id, host_id=host)
            rt.wake.set()  # released tasks may run here
        return swept


@dataclass(frozen=True)
class HostResolution:
    """What resolving a lost host did: the tasks settled on the operator's word, and what was left."""

    host_id: str
    resolved: list[Task] = field(default_factory=list)
    # Tasks of that host in needs_reconciliation that the operator's word does not settle.
    left: int = 0
    forgotten: bool = False

    @property
    def message(self) -> str:
        waiting = "HOST_LOST or CLEANUP_UNCONFIRMED"
        if not self.resolved:
            return f"nothing to resolve: host {self.host_id} holds no task waiting for it ({waiting})"
        return f"resolved {len(self.resolved)} task(s) of host {self.host_id} that waited for it ({waiting})"


class LostHosts:
    """The operator's view of the scheduler hosts, and the way out of HOST_LOST for a host that
    never comes back: the operator asserts it is gone (its workers with it) and its tasks get the
    outcome their own host's recovery would have given them."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    async def list(self) -> list[HostSummary]:
        return await self.rt.store.host_summaries()

    async def summary(self, host_id: str) -> HostSummary | None:
        return next((h for h in await self.list() if h.host_id == host_id), None)

    async def resolve(self, host_id: str) -> HostResolution:
        rt = self.rt
        domain.check_resolvable(host_id, rt.host_id, await self.summary(host_id), rt.clock.now_ms(), rt.multi_host)
        now = rt.clock.now_ms()
        # The operator's word stands for the sweep's grace: what the host still held is marked
        # HOST_LOST first (never-launched claims are released), so nothing stays stranded on it.
        for task_id in await rt.store.tasks_held_by(host_id):
            task, stored = await rt.store.sweep_lost(task_id, host_id, now, now)
            rt.published(stored, task)
        resolved: list[Task] = []
        left = 0
        after = ""
        while batch := await rt.store.host_lost_tasks_of(host_id, after):
            after = batch[-1]
            for task_id in batch:
                task, stored = await rt.store.resolve_host_gone(task_id, host_id, rt.clock.now_ms())
                rt.published(stored, task)
                if stored is None:
                    left += 1
                    continue
                resolved.append(task)
                log.warning(
                    "host_lost_task_resolved", task_id=task_id, host_id=host_id, state=task.state.value, by="operator"
                )
                if task.state == domain.State.QUEUED:
                    rt.wake.set()  # it may run here
        forgotten = False
        if not await rt.store.tasks_held_by(host_id, limit=1):
            await rt.store.forget_host(host_id, now)
            forgotten = True
        result = HostResolution(host_id, resolved, left, forgotten)
        log.info("lost_host_resolved", host_id=host_id, resolved=len(resolved), left=left, forgotten=forgotten)
        return result


# How long a busy relay lets other replicas' commits gather before its next read (a read
# that found events: each NOTIFY would otherwise cost a read of its own). With three replicas
# under load, reads per task 0.29 -> 0.19 on the replica with subscribers, for at most 10 ms
# more before its watchers see another replica's change.
RELAY_BUSY_COALESCE_S = 0.01


class EventRelay:
    """Other replicas' task events, read from the durable log and published to this one's
    watchers (WatchTasks, SSE), so a change made anywhere is seen everywhere.

    With no one subscribed here, it reads the log's ids alone, to keep its place: a subscriber
    reads its snapshot after subscribing, so what committed before is in that, and the relay
    reads whole events again from its next read on. Events this replica wrote are counted, never
    parsed: they were published here at their commit."""

    def __init__(self, rt: Runtime, gap_wait_ms: int) -> None:
        self.rt = rt
        self.gap_wait_ms = gap_wait_ms

    async def loop(self) -> None:
        rt = self.rt
        cursor = await rt.store.last_event_id()
        gaps: dict[int, int] = {}  # ids skipped (a lower id may commit later) -> first seen missing
        poll = rt.tasks_cfg.safety_poll_ms / 1000
        while not rt.closing:
            await woken(rt.events_wake, 0.5 if gaps else poll)
            try:
                before = cursor
                cursor, gaps = await self.relay_once(cursor, gaps)
                if cursor != before:  # busy: let the next commits gather (a lone one is read at once)
                    await asyncio.sleep(RELAY_BUSY_COALESCE_S)
            except Exception:
                log.exception("event_relay_failed")
                await asyncio.sleep(poll)

    async def relay_once(self, cursor: int, gaps: dict[int, int]) -> tuple[int, dict[int, int]]:
        rt = self.rt
        while True:
            now = rt.clock.now_ms()
            gaps = {i: at for i, at in gaps.items() if now - at < self.gap_wait_ms}
            if rt.hub.subscriber_count:
                ids, events = await rt.store.events_after(cursor, (), 500, gaps, skip_origin=rt.host_id)
            else:
                ids, events = await rt.store.event_ids_after(cursor, 500, gaps), []
                if rt.hub.subscriber_count:
                    continue  # subscribed during the read, maybe after its snapshot: read them whole
            fresh = [i for i in ids if i > cursor]
            if fresh:
                for missing in set(range(cursor + 1, fresh[-1] + 1)) - set(fresh):
                    gaps.setdefault(missing, now)
            for i in ids:
                gaps.pop(i, None)
            for stored in events:  # other hosts' only (``skip_origin``)
                if stored.origin is not None:  # a row from before origins were recorded: unknown
                    rt.hub.publish(stored.type, stored.at, stored.task)
            if fresh:
                cursor = fresh[-1]
            if len(ids) < 500:
                return cursor, gaps


async def control_loop(rt: Runtime, apply: Callable[[], Awaitable[int]]) -> None:
    """Stops other replicas recorded for this host's tasks: on NOTIFY, and on a slow safety poll."""
    poll = rt.tasks_cfg.safety_poll_ms / 1000
    while not rt.closing:
        await woken(rt.control_wake, poll)
        try:
            await apply()
        except Exception:
            log.exception("requested_stops_failed")
