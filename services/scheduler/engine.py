"""The scheduler's application layer: a thin facade over its collaborators.

The servicer, ``__main__``, benchmarks and tests use ``Engine``. Behind it, one
runtime context (``runtime.Runtime``: settings, store, clock, ports, the live
attempts of this incarnation, locks) is shared by small collaborator classes,
one concern each:

- ``catalog.TaskCatalog``: create, get and list tasks
- ``launch.Launcher``: the dispatcher, the launch protocol, a worker's own exit
- ``supervision.Supervisor``: the supervisor loop (timers, descendants), telemetry
- ``stopping.Stopper``: stop and proof, cancel, retry cleanup
- ``settling.Settler``: the transactions that end or park a task after a stop
- ``reports.WorkerReports``: what workers report, their questions and answers
- ``recovery.Recovery``: start-up recovery of an earlier incarnation's work
- ``watch.Watchers`` and ``log_follower.LogFollower``: live watching, the event log

State-transition rules live in ``domain`` (pure), rows in ``store``, processes in
``processes`` / ``ownership``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Sequence

import structlog

from libs import proctree
from libs.clock import Clock, SystemClock
from libs.settings import Settings
from services.scheduler import domain, processes, skills, spawner
from services.scheduler.catalog import TaskCatalog, TaskPage
from services.scheduler.crons import CronRunner
from services.scheduler.dispatch_targets import TargetDispatcher
from services.scheduler.domain import Attempt, NewTask, Task, Usage
from services.scheduler.events import TaskEvent
from services.scheduler.history_retention import HistoryRetention
from services.scheduler.hosts import (
    EventRelay,
    HostIdInUse,
    HostLease,
    HostResolution,
    Listener,
    LostHosts,
    control_loop,
)
from services.scheduler.launch import ALLOWED_ENV, Launcher
from services.scheduler.log_follower import LOG_GAP_WAIT_MS, LogFollower
from services.scheduler.log_retention import LogRetention
from services.scheduler.question_closer import QuestionCloser
from services.scheduler.recovery import Recovery
from services.scheduler.reports import WorkerReports
from services.scheduler.runtime import (
    FailureReportsPort,
    LiveAttempt,
    NoTelemetry,
    QuestionsPort,
    Runtime,
    TelemetryHook,
    hash_token,
)
from services.scheduler.settling import Settler
from services.scheduler.spawner import SpawnHelper
from services.scheduler.stopping import Stopper
from services.scheduler.store import SchedulerStore
from services.scheduler.subtasks import SubTasks
from services.scheduler.supervision import Supervisor
from services.scheduler.watch import OnLive, Watchers
from services.scheduler.worker_log import LogTail

log = structlog.get_logger("scheduler")

__all__ = [
    "ALLOWED_ENV",
    "LOG_GAP_WAIT_MS",
    "Clock",
    "Engine",
    "LiveAttempt",
    "NoTelemetry",
    "QuestionsPort",
    "SystemClock",
    "TaskPage",
    "TelemetryHook",
    "hash_token",
]


class Engine:
    def __init__(
        self,
        settings: Settings,
        store: SchedulerStore,
        clock: Clock | None = None,
        telemetry: TelemetryHook | None = None,
        questions: QuestionsPort | None = None,
        boot_id: str | None = None,
        table_reader: Callable[[], dict[int, proctree.ProcStat]] = proctree.process_table,
        worker_addr: Callable[[int | None], str] | None = None,
        reap_unknown_orphans: bool = False,
        failure_reports: FailureReportsPort | None = None,
    ) -> None:
        rt = Runtime(
            settings, store, clock, telemetry, questions, boot_id, table_reader, worker_addr, reap_unknown_orphans
        )
        rt.failure_reports = failure_reports
        self.runtime = rt
        # What callers read directly; the same objects the collaborators share.
        self.settings, self.tasks_cfg, self.store = rt.settings, rt.tasks_cfg, rt.store
        self.clock, self.telemetry = rt.clock, rt.telemetry
        self.boot_id, self.hub, self.ownership = rt.boot_id, rt.hub, rt.ownership
        self.catalog = TaskCatalog(rt)
        self.settler = Settler(rt)
        self.stopper = Stopper(rt, self.settler)
        self.launcher = Launcher(rt, self.settler, self.stopper)
        self.supervisor = Supervisor(rt, self.stopper)
        self.log_retention = LogRetention(rt)
        self.reports = WorkerReports(rt)
        self.recovery = Recovery(rt, self.settler, self.stopper)
        self.watchers = Watchers(rt)
        self.log_follower = LogFollower(rt)
        self.question_closer = QuestionCloser(rt)
        self.lease = HostLease(rt, self.recovery.reconcile_host_lost)
        self.listener: Listener | None = Listener(rt, store.db.url) if rt.multi_host else None
        self.relay = EventRelay(rt, LOG_GAP_WAIT_MS)
        self.lost_hosts = LostHosts(rt)
        self.crons = CronRunner(rt, self.catalog, lambda task_id, cause: self.cancel(task_id, cause))
        self.history_retention = HistoryRetention(rt, runs=self.crons.store)
        self.targets = TargetDispatcher(rt, self.settler)
        self.launcher.targets = self.targets
        self.subtasks = SubTasks(rt, self.catalog, self.stopper, self.reports, self.targets)
        self._loops: list[asyncio.Task[None]] = []

    @property
    def questions(self) -> QuestionsPort | None:
        """The pending-registry port; one copy, in the runtime the collaborators share."""
        return self.runtime.questions

    @questions.setter
    def questions(self, value: QuestionsPort | None) -> None:
        self.runtime.questions = value

    @property
    def worker_addr(self) -> Callable[[int | None], str]:
        """The worker API's address for a worker uid (``__main__`` sets it once sockets exist)."""
        return self.runtime.worker_addr

    @worker_addr.setter
    def worker_addr(self, value: Callable[[int | None], str]) -> None:
        self.runtime.worker_addr = value

    # --- lifecycle -----------------------------------------------------------

    async def start(self, run_loops: bool = True) -> None:
        rt = self.runtime
        if self.listener is not None:
            # First: the host id's lock (refuses a second live process with this id).
            try:
                await self.listener.connect()
            except HostIdInUse as exc:
                log.error("host_id_in_use", host_id=rt.host_id, reason=str(exc))
                raise
        await self.lease.register()
        if rt.multi_host:
            await rt.store.adopt_unowned()
        rt.ownership.start(rt.tasks_cfg.proof_mode, rt.settings.data_dir)
        other_users = any(r is not None and r.uid != os.geteuid() for r in rt.run_as.values())
        rt.hold = await asyncio.to_thread(
            processes.choose_hold, rt.tasks_cfg.worker_hold, processes.HOLD_PROGRAM, other_users
        )
        log.info(
            "worker_hold",
            kind=rt.hold.kind,
            program=rt.hold.prefix[0],
            requested=rt.tasks_cfg.worker_hold,
            fallback_reason=rt.hold.fallback_reason or None,
        )
        rt.spawners = await self._start_spawners()
        await self.recover()
        await rt.ownership.sweep()  # what recovery did not need is an empty leftover
        if run_loops:
            self._loops = [
                asyncio.create_task(self.launcher.dispatch_loop(), name="dispatcher"),
                asyncio.create_task(self.supervisor.loop(), name="supervisor"),
                asyncio.create_task(self.question_closer.run(), name="question-closer"),
                asyncio.create_task(self.recovery.legacy_adoption_loop(), name="legacy-adoption"),
                asyncio.create_task(self.lease.loop(), name="host-lease"),
                asyncio.create_task(self.targets.loop(lambda: rt.closing), name="dispatch-deadlines"),
                asyncio.create_task(self.log_retention.loop(), name="worker-log-retention"),
                asyncio.create_task(self.history_retention.loop(), name="finished-task-retention"),
            ]
            if self.listener is not None:
                self._loops += [
                    asyncio.create_task(self.listener.run(), name="notify-listener"),
                    asyncio.create_task(self.relay.loop(), name="event-relay"),
                    asyncio.create_task(control_loop(rt, self.stopper.apply_requested_stops), name="requested-stops"),
                ]
            if rt.settings.crons:
                self._loops.append(asyncio.create_task(self.crons.loop(), name="crons"))
        rt.wake.set()

    async def _start_spawners(self) -> list[SpawnHelper]:
        """The spawn helpers as ``[tasks] worker_spawn`` and ``spawn_helpers`` ask (none: the
        scheduler spawns)."""
        tasks_cfg = self.runtime.tasks_cfg
        mode = tasks_cfg.worker_spawn
        helpers: list[SpawnHelper] = []
        why = ""
        if mode != "scheduler":
            why = await asyncio.to_thread(processes.unsafe_program, spawner.SPAWN_PROGRAM, False)
            if not why:
                try:
                    for _ in range(tasks_cfg.spawn_helpers):
                        helpers.append(spawner.SpawnHelper.start())
                except OSError as exc:
                    why = f"{spawner.SPAWN_PROGRAM}: {exc}"
                    for started in helpers:
                        await started.close()
                    helpers = []
            if not helpers and mode == "helper":
                raise RuntimeError(f"worker_spawn = helper, but {why} (run `make hold`)")
        log.info(
            "worker_spawn",
            by="helper" if helpers else "scheduler",
            pids=[helper.pid for helper in helpers] or None,
            requested=mode,
            fallback_reason=why or None,
        )
        return helpers

    async def shutdown(self) -> None:
        """Stop every running worker and re-queue its task for resumption."""
        rt = self.runtime
        rt.closing = True
        for loop_task in self._loops:
            loop_task.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)
        await self.targets.close()
        live = list(rt.live.values())
        await asyncio.gather(
            *(self.stopper.stop_and_settle(la, "shutdown", "the scheduler shut down") for la in live),
            return_exceptions=True,
        )
        await rt.drain_background()
        for helper in rt.spawners:
            await helper.close()
        await rt.ownership.close()
        try:
            # Every worker was stopped and its task re-queued (released); claims not yet
            # launched go back to any host: nothing is left for a sweep.
            await rt.store.release_claims()
            await rt.store.release_lease()
        except Exception:
            log.exception("lease_release_failed")
        if self.listener is not None:
            await self.listener.close()

    def worker_uids(self) -> set[int]:
        """The uids workers will run as (each gets its own worker socket)."""
        rt = self.runtime
        return {r.uid for name, r in rt.run_as.items() if r is not None and name not in rt.cannot_run}

    # --- tasks ---------------------------------------------------------------

    async def create_task(self, request: NewTask) -> Task:
        return await self.catalog.create_task(request)

    async def create_batch(self, requests: Sequence[tuple[NewTask, str]]) -> list[Task | Exception]:
        return await self.catalog.create_batch(requests)

    async def get_task(self, task_id: str) -> tuple[Task, list[Attempt]]:
        return await self.catalog.get_task(task_id)

    async def task_detail(self, task_id: str) -> tuple[Task, list[Attempt], domain.TreeView]:
        """A task with its attempts, direct sub-tasks and tree's evidence (its detail)."""
        return await self.subtasks.detail(task_id)

    async def list_tasks(
        self, agent_id: str, session_id: str, page: int, page_size: int, include_finished: bool
    ) -> TaskPage:
        return await self.catalog.list_tasks(agent_id, session_id, page, page_size, include_finished)

    async def worker_log(self, task_id: str, attempt_number: int, tail_bytes: int) -> LogTail:
        return await self.catalog.worker_log(task_id, attempt_number, tail_bytes)

    async def dispatch_once(self) -> int:
        return await self.launcher.dispatch_once()

    async def supervise_once(self) -> None:
        await self.supervisor.supervise_once()

    async def record_observation(self, task_id: str, observation: domain.Execution) -> None:
        await self.supervisor.record_observation(task_id, observation)

    async def cancel(
        self, task_id: str, cause: str = domain.USER_CANCELED, replaced_by: str | None = None, wait_s: float = 0.0
    ) -> Task:
        # A task with unfinished sub-tasks stops them first (subtasks); otherwise a plain cancel.
        return await self.subtasks.cancel(task_id, cause, replaced_by, wait_s)

    async def pause(self, task_id: str, wait_s: float = 0.0) -> Task:
        domain.validate_task_id(task_id)
        if (await self.store.get_task(task_id)).gateway_managed:
            raise domain.InvalidTransition("PAUSE_NOT_SUPPORTED", "a gateway-managed task cannot be paused")
        return await self.stopper.pause(task_id, wait_s)

    async def resume(self, task_id: str) -> Task:
        return await self.stopper.resume(task_id)

    async def retry_cleanup(self, task_id: str) -> Task:
        domain.validate_task_id(task_id)
        if (await self.store.get_task(task_id)).gateway_managed:
            return await self.targets.retry_cleanup(task_id)  # tell the target again
        return await self.stopper.retry_cleanup(task_id)

    async def record_dispatch_outcome(self, request_id: str, body: bytes, signature: str) -> Task:
        return await self.targets.record_outcome(request_id, body, signature)

    async def check_dispatch_deadlines_once(self) -> int:
        return await self.targets.overdue_once()

    async def recover(self) -> None:
        await self.recovery.recover()

    # --- hosts (operator) ------------------------------------------------------

    async def list_hosts(self) -> list[domain.HostSummary]:
        return await self.lost_hosts.list()

    async def resolve_lost_host(self, host_id: str) -> HostResolution:
        return await self.lost_hosts.resolve(host_id)

    # --- workers -------------------------------------------------------------

    def authenticate(self, token: str) -> LiveAttempt:
        return self.reports.authenticate(token)

    async def assignment(self, token: str) -> tuple[Task, Attempt]:
        return await self.reports.assignment(token)

    async def report_progress(self, token: str, text: str) -> None:
        await self.reports.report_progress(token, text)

    async def report_tool(self, token: str, name: str, status: str, exit_code: int | None) -> None:
        await self.reports.report_tool(token, name, status, exit_code)

    async def report_touched(self, token: str, paths: list[str]) -> None:
        await self.reports.report_touched(token, paths)

    async def report_usage(self, token: str, usage: Usage, delta: bool = False) -> None:
        await self.reports.report_usage(token, usage, delta)

    async def report_result(self, token: str, text: str, unresolved_background: bool) -> None:
        await self.reports.report_result(token, text, unresolved_background)

    async def ask_question(self, token: str, text: str) -> domain.PendingQuestion:
        return await self.reports.ask_question(token, text)

    async def await_answer(self, token: str, question_id: str, wait_s: float) -> str | None:
        return await self.reports.await_answer(token, question_id, wait_s)

    async def skill_instructions(self, task: Task) -> str:
        """A skill task's instructions: the skill's body, for its own worker only."""
        assert task.skill is not None
        return await skills.body(task.skill.name, skills.lookup(self.settings.skills, task.skill.name))

    async def spawn_subtask(self, token: str, title: str, instructions: str, profile: str, request_id: str) -> Task:
        return await self.subtasks.spawn(token, title, instructions, profile, request_id)

    async def wait_subtask(self, token: str, task_id: str, wait_s: float) -> Task:
        return await self.subtasks.wait(token, task_id, wait_s)

    async def cancel_subtask(self, token: str, task_id: str) -> Task:
        return await self.subtasks.cancel_own(token, task_id)

    # --- watching ------------------------------------------------------------

    async def close_questions_once(self) -> int:
        return await self.question_closer.close_once()

    async def adopt_legacy_failures_once(self) -> int:
        return await self.recovery.adopt_legacy_failures()

    async def reconcile_once(self) -> int:
        return await self.supervisor.reconcile_once()

    def watch_task(self, task_id: str, on_live: OnLive | None = None) -> AsyncIterator[TaskEvent]:
        return self.watchers.watch_task(task_id, on_live)

    def watch_session(self, agent_id: str, session_id: str, on_live: OnLive | None = None) -> AsyncIterator[TaskEvent]:
        return self.watchers.watch_session(agent_id, session_id, on_live)

    def follow_log_batches(self, since: int, types: set[str], batch: int = 500) -> AsyncIterator[list[TaskEvent]]:
        return self.log_follower.follow_batches(since, types, batch)
