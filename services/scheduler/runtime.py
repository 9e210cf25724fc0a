"""What the scheduler's collaborators share: one explicit runtime context.

The engine's parts (launch, supervision, stopping, settling, reports, recovery,
watching) are small classes that each hold this one object instead of reaching
into each other: the live attempts of this incarnation, the per-task locks, the
dispatcher's wake-up, the background tasks, and the ports to the outside.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from libs import proctree
from libs.clock import Clock, SystemClock
from libs.settings import Settings, WorkerProfile
from services.scheduler import processes
from services.scheduler.domain import Attempt, Task
from services.scheduler.events import EventHub
from services.scheduler.metrics import LifecycleMetrics
from services.scheduler.ownership import Ownership
from services.scheduler.scans import SharedScan
from services.scheduler.spawner import SpawnHelper
from services.scheduler.store import SchedulerStore, StoredEvent
from services.scheduler.task_locks import TaskLocks

log = structlog.get_logger("scheduler")


async def woken(event: asyncio.Event, timeout_s: float) -> None:
    """Until ``event`` is set or ``timeout_s`` has passed, then clear it: the wait of the
    scheduler's loops that act on a wake-up and, failing one, on a timer."""
    try:
        async with asyncio.timeout(timeout_s):
            await event.wait()
    except TimeoutError:
        pass
    event.clear()


# Process-table reads for exit proofs begin at least this far apart (``SharedScan``).
SCAN_MIN_INTERVAL_S = 0.05


class TelemetryHook(Protocol):
    """What the engine tells the telemetry agent; a no-op when there is none."""

    def watch(self, task_id: str, pid: int, start_time: int) -> None: ...

    def unwatch(self, task_id: str) -> None: ...


class QuestionsPort(Protocol):
    """The pending-registry as the engine needs it (see ``questions.QuestionsClient``)."""

    async def ask(self, task_id: str, session_id: str, text: str, request_id: str) -> Any: ...

    async def await_answer(self, question_id: str, wait_s: float) -> Any | None: ...

    async def cancel_open(self, task_id: str) -> None: ...


class FailureReportsPort(Protocol):
    """The notifier as legacy adoption needs it (see ``failure_reports.FailureReportsClient``)."""

    async def claim_unreported_failure(self, task: Task, event_sequence: int) -> bool: ...


class NoTelemetry:
    def watch(self, task_id: str, pid: int, start_time: int) -> None:
        pass

    def unwatch(self, task_id: str) -> None:
        pass


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(eq=False)
class LiveAttempt:
    attempt: Attempt
    profile: WorkerProfile
    process: processes.WorkerProcess | None = None
    exited: asyncio.Event = field(default_factory=asyncio.Event)
    returncode: int | None = None
    # Set (under the task lock) once taskgate itself is stopping the tree, so the
    # exit waiter leaves the outcome to the stopper.
    stopping: bool = False
    # Registered with the telemetry agent (at the first supervisor pass that finds it alive).
    watched: bool = False


class Runtime:
    """Settings, ports and the in-memory state of one scheduler incarnation."""

    def __init__(
        self,
        settings: Settings,
        store: SchedulerStore,
        clock: Clock | None,
        telemetry: TelemetryHook | None,
        questions: QuestionsPort | None,
        boot_id: str | None,
        table_reader: Callable[[], dict[int, proctree.ProcStat]],
        worker_addr: Callable[[int | None], str] | None,
        reap_unknown_orphans: bool,
    ) -> None:
        self.settings = settings
        self.tasks_cfg = settings.tasks
        self.store = store
        self.clock: Clock = clock or SystemClock()
        self.telemetry: TelemetryHook = telemetry or NoTelemetry()
        self.questions = questions
        self.failure_reports: FailureReportsPort | None = None  # the notifier, for legacy adoption
        self.boot_id = boot_id or uuid.uuid4().hex
        self.hub = EventHub()
        self.metrics = LifecycleMetrics()
        self.table_reader = table_reader
        self.scans = SharedScan(table_reader, min_interval_s=SCAN_MIN_INTERVAL_S)
        self.live: dict[str, LiveAttempt] = {}  # task_id -> attempt being run now
        self.by_token: dict[str, LiveAttempt] = {}
        self.locks = TaskLocks()  # per task, kept while held
        self.wake = asyncio.Event()  # the dispatcher looks for queued work when set
        # Several hosts (PostgreSQL): this replica's id, and the wake-ups other replicas send.
        self.host_id = store.host_id
        self.multi_host = store.postgres
        # Until when this host's lease is known to hold (its last renewal's new expiry, by
        # this host's clock): only then may it take back tasks swept while it was silent.
        self.lease_held_until = 0
        self.control_wake = asyncio.Event()  # a stop of one of this host's tasks was asked elsewhere
        self.events_wake = asyncio.Event()  # another replica committed task events
        self.questions_wake = asyncio.Event()  # the question closer looks at its outbox when set
        self.background: set[asyncio.Task[Any]] = set()
        self.closing = False
        # The worker API's address for a worker uid (see ``worker_api.WorkerSockets``).
        self.worker_addr: Callable[[int | None], str] = worker_addr or (lambda uid: "")
        self.ownership = Ownership(table_reader, self.leader_pids, reap_unknown_orphans)
        # Who each profile's workers run as; why a profile cannot be launched here.
        self.run_as, self.cannot_run = processes.resolve_profiles(settings.workers)
        # What holds a worker until its release (chosen at start: ``processes.choose_hold``).
        self.hold = processes.Hold(processes.SH_HOLD, "sh")
        # What spawns workers when not the scheduler itself (started at start, ``[tasks]
        # spawn_helpers`` of them; none: the scheduler spawns).
        self.spawners: list[SpawnHelper] = []
        # A helper that died is started anew at most this often, whichever it was (``live_spawner``).
        self.spawner_restart_s = 10.0
        self._spawner_restart_at = 0.0

    @property
    def own(self) -> str | None:
        """The owner filter for this host's tasks; None with one host (SQLite), where every task
        is this scheduler's whatever host id an earlier run used."""
        return self.host_id if self.multi_host else None

    def mine(self, task: Task) -> bool:
        return not self.multi_host or task.owner_host in (None, self.host_id)

    def live_spawner(self) -> SpawnHelper | None:
        """The spawn helper for a launch: of the live ones, the one with the fewest requests
        waiting (None: the scheduler spawns it itself). One that died is started anew once it
        has been reaped — never a helper to tell from orphans at once — and at most every
        ``spawner_restart_s`` (whichever died); until then launches go to the others, or do
        without."""
        chosen: SpawnHelper | None = None
        for slot, helper in enumerate(self.spawners):
            if not helper.alive:
                restarted = self._restart(slot)
                if restarted is None:
                    continue
                helper = restarted
            if chosen is None or helper.unanswered < chosen.unanswered:
                chosen = helper
        return chosen

    def _restart(self, slot: int) -> SpawnHelper | None:
        helper = self.spawners[slot]
        if not helper.reaped or self.closing or time.monotonic() < self._spawner_restart_at:
            return None
        self._spawner_restart_at = time.monotonic() + self.spawner_restart_s
        try:
            fresh = SpawnHelper.start(helper.program)  # brief, and at most every spawner_restart_s
        except OSError as exc:
            log.error("spawn_helper_restart_failed", previous=helper.pid, error=str(exc))
            return None
        log.warning("spawn_helper_restarted", pid=fresh.pid, previous=helper.pid)
        self.spawners[slot] = fresh
        return fresh

    def leader_pids(self) -> set[int]:
        """Worker leaders, with the spawn helper: children of this process that are never orphans."""
        leaders = {la.attempt.pid for la in self.live.values() if la.attempt.pid is not None}
        leaders.update(helper.pid for helper in self.spawners if not helper.reaped)
        return leaders

    def forget(self, live: LiveAttempt) -> None:
        if self.live.get(live.attempt.task_id) is live:
            del self.live[live.attempt.task_id]
        self.by_token.pop(live.attempt.token_hash, None)

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str | None = None) -> asyncio.Task[Any]:
        """Run ``coro`` in the background; shutdown waits for it."""
        task: asyncio.Task[Any] = asyncio.create_task(coro, name=name)
        self.background.add(task)
        task.add_done_callback(self.background.discard)
        return task

    async def drain_background(self) -> None:
        while self.background:
            await asyncio.gather(*list(self.background), return_exceptions=True)

    def published(self, stored: StoredEvent | None, task: Task, event_type: str | None = None) -> None:
        """Tell watchers about a committed change (after commit, never before)."""
        if stored is not None:
            self.hub.publish(stored.type, stored.at, task)
            self.metrics.published(stored.type, stored.at, stored.previous, task, self.clock.now_ms())
            if stored.closes_questions:
                self.questions_wake.set()  # its question-close outbox row was committed with it
        elif event_type is not None:
            self.hub.publish(event_type, self.clock.now_ms(), task)
