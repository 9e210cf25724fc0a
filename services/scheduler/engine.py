"""The scheduler's application layer: it runs tasks through their lifecycle.

Owns the live worker processes of this scheduler incarnation, the dispatcher
(queued -> running within ``max_running``), the one supervisor loop (timers and
descendant recording), cancellation with proof, start-up recovery and graceful
shutdown. Rules live in ``domain``, rows in ``store``, processes in ``processes``.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import secrets
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import structlog

from libs import errors, proctree
from libs.ids import time_ordered_id
from libs.settings import Settings, WorkerProfile
from services.scheduler import cgroups, domain, processes
from services.scheduler.domain import (
    ACTIVE,
    Attempt,
    Cancellation,
    Failure,
    FailureCode,
    Inspection,
    NewTask,
    PendingOutcome,
    Progress,
    Result,
    State,
    Task,
    ToolEvent,
    Usage,
    Verdict,
)
from services.scheduler.events import EventHub, TaskEvent
from services.scheduler.ownership import Ownership
from services.scheduler.store import SchedulerStore, StoredEvent

log = structlog.get_logger("scheduler")

USER_CANCELED = "user_canceled"
# What a worker's environment may inherit from the scheduler's (plus LC_* and the
# profile's own `env` and `inherit_env`).
ALLOWED_ENV = frozenset({"PATH", "HOME", "LANG", "TZ", "TMPDIR"})


class Clock(Protocol):
    def now_ms(self) -> int: ...


class SystemClock:
    def now_ms(self) -> int:
        return int(time.time() * 1000)


class TelemetryHook(Protocol):
    """What the engine tells the telemetry agent; a no-op when there is none."""

    def watch(self, task_id: str, pid: int, start_time: int) -> None: ...

    def unwatch(self, task_id: str) -> None: ...


class QuestionsPort(Protocol):
    """The pending-registry as the engine needs it (see ``questions.QuestionsClient``)."""

    async def ask(self, task_id: str, session_id: str, text: str, request_id: str) -> Any: ...

    async def await_answer(self, question_id: str, wait_s: float) -> Any | None: ...

    async def cancel_open(self, task_id: str) -> None: ...


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
    process: asyncio.subprocess.Process | None = None
    exited: asyncio.Event = field(default_factory=asyncio.Event)
    returncode: int | None = None
    # Set (under the task lock) once taskgate itself is stopping the tree, so the
    # exit waiter leaves the outcome to the stopper.
    stopping: bool = False


@dataclass(frozen=True)
class TaskPage:
    page: int
    pages: int
    total: int
    tasks: list[Task]


# How long a log follower looks again for an id skipped in the event log.
LOG_GAP_WAIT_MS = 10_000


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
    ) -> None:
        self.settings = settings
        self.tasks_cfg = settings.tasks
        self.store = store
        self.clock = clock or SystemClock()
        self.telemetry = telemetry or NoTelemetry()
        self.questions = questions
        self.boot_id = boot_id or uuid.uuid4().hex
        self.hub = EventHub()
        self._table_reader = table_reader
        self._live: dict[str, LiveAttempt] = {}  # task_id -> attempt being run now
        self._by_token: dict[str, LiveAttempt] = {}
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._wake = asyncio.Event()
        self._background: set[asyncio.Task[object]] = set()
        self._loops: list[asyncio.Task[None]] = []
        self._closing = False
        # The worker API's address for a worker uid (see ``worker_api.WorkerSockets``).
        self.worker_addr: Callable[[int | None], str] = worker_addr or (lambda uid: "")
        self.ownership = Ownership(table_reader, self._leader_pids, reap_unknown_orphans)
        # Who each profile's workers run as; why a profile cannot be launched here.
        self._run_as, self._cannot_run = processes.resolve_profiles(settings.workers)

    # --- lifecycle -----------------------------------------------------------

    async def start(self, run_loops: bool = True) -> None:
        self.ownership.start(self.tasks_cfg.proof_mode, self.settings.data_dir)
        await self.recover()
        await self.ownership.sweep()  # what recovery did not need is an empty leftover
        if run_loops:
            self._loops = [
                asyncio.create_task(self._dispatch_loop(), name="dispatcher"),
                asyncio.create_task(self._supervise_loop(), name="supervisor"),
            ]
        self._wake.set()

    async def shutdown(self) -> None:
        """Stop every running worker and re-queue its task for resumption."""
        self._closing = True
        for loop_task in self._loops:
            loop_task.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)
        live = list(self._live.values())
        await asyncio.gather(
            *(self._stop_and_settle(la, "shutdown", "the scheduler shut down") for la in live),
            return_exceptions=True,
        )
        await self._drain_background()
        await self.ownership.close()

    def _leader_pids(self) -> set[int]:
        return {la.attempt.pid for la in self._live.values() if la.attempt.pid is not None}

    def worker_uids(self) -> set[int]:
        """The uids workers will run as (each gets its own worker socket)."""
        return {r.uid for name, r in self._run_as.items() if r is not None and name not in self._cannot_run}

    async def _drain_background(self) -> None:
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)

    def _spawn(self, coro: object, name: str) -> None:
        task: asyncio.Task[object] = asyncio.create_task(coro, name=name)  # type: ignore[arg-type]
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # --- events --------------------------------------------------------------

    def _published(self, stored: StoredEvent | None, task: Task, event_type: str | None = None) -> None:
        if stored is not None:
            self.hub.publish(stored.type, stored.at, task)
            if task.terminal and stored.type == "task.state_changed":
                self._close_questions(task)
        elif event_type is not None:
            self.hub.publish(event_type, self.clock.now_ms(), task)

    def _close_questions(self, task: Task) -> None:
        """A finished task's open question is closed, unless the cancel only paused the task."""
        paused = task.cancellation is not None and task.cancellation.cause != USER_CANCELED
        if self.questions is not None and not (task.state == State.CANCELLED and paused):
            self._spawn(self.questions.cancel_open(task.task_id), f"close-questions-{task.task_id}")

    async def watch_task(self, task_id: str) -> AsyncIterator[TaskEvent]:
        domain.validate_task_id(task_id)
        async for event in self._watch(lambda t: t.task_id == task_id, lambda: self._one(task_id)):
            yield event

    async def watch_session(self, agent_id: str, session_id: str) -> AsyncIterator[TaskEvent]:
        domain.validate_id("agentId", agent_id)
        domain.validate_id("sessionId", session_id)

        def accepts(t: Task) -> bool:
            return t.agent_id == agent_id and t.session_id == session_id

        async def active() -> list[Task]:
            live_states = [s for s in State if s not in domain.TERMINAL]
            return [t for t in await self.store.tasks_in_states(live_states) if accepts(t)]

        async for event in self._watch(accepts, active):
            yield event

    async def follow_log(self, since: int, types: set[str], batch: int = 500) -> AsyncIterator[TaskEvent]:
        """Every stored task event after ``since``, oldest first, then new ones as they commit.

        Served from the durable ``task_events`` table (sequence = its id), so a
        follower that was away resumes from its cursor; the hub only wakes the
        reader. Ids skipped on the way (a PostgreSQL transaction that took its id
        earlier but commits later) are looked for again for ``LOG_GAP_WAIT_MS``.
        """
        if since < 0:
            raise domain.InvalidArgument("INVALID_CURSOR", "since_sequence must be 0 or more")
        cursor = since
        gaps: dict[int, int] = {}  # skipped id -> when first skipped
        while True:
            with self.hub.subscribe(lambda _t: True) as sub:
                while not sub.overflowed:
                    now = self.clock.now_ms()
                    gaps = {i: at for i, at in gaps.items() if now - at < LOG_GAP_WAIT_MS}
                    ids, events = await self.store.events_after(cursor, types, batch, gaps)
                    fresh = [i for i in ids if i > cursor]
                    if fresh and cursor > 0:
                        expected = set(range(cursor + 1, fresh[-1] + 1))
                        for missing in expected - set(fresh):
                            gaps.setdefault(missing, now)
                    for i in ids:
                        gaps.pop(i, None)
                    for stored in events:
                        yield TaskEvent(stored.id, stored.type, stored.at, stored.task)
                    if fresh:
                        cursor = fresh[-1]
                    if len(ids) >= batch:
                        continue
                    try:
                        await asyncio.wait_for(sub.queue.get(), timeout=0.5 if gaps else 5.0)
                    except TimeoutError:
                        pass
                    while not sub.queue.empty():
                        sub.queue.get_nowait()

    async def _one(self, task_id: str) -> list[Task]:
        return [await self.store.get_task(task_id)]

    async def _watch(
        self, accepts: Callable[[Task], bool], initial: Callable[[], Awaitable[list[Task]]]
    ) -> AsyncIterator[TaskEvent]:
        """Current snapshots first, then each event after commit.

        Subscribed before the snapshots are read, so no change falls between them
        (a change may show twice: snapshot, then event — never not at all).
        """
        with self.hub.subscribe(accepts) as sub:
            now = self.clock.now_ms()
            for task in await initial():
                yield TaskEvent(0, "task.snapshot", now, task)
            while True:
                try:
                    event = await asyncio.wait_for(sub.queue.get(), timeout=1.0)
                except TimeoutError:
                    if sub.overflowed:
                        raise errors.ResourceExhausted(
                            "WATCHER_TOO_SLOW", "the watcher fell behind; reconnect to resume"
                        ) from None
                    continue
                yield event

    # --- queries -------------------------------------------------------------

    async def create_task(self, request: NewTask) -> Task:
        request = domain.validate_new_task(request, set(self.settings.workers))
        now = self.clock.now_ms()
        profile = self.settings.workers[request.profile]
        workspace = Path(profile.workspace) if profile.workspace else self.settings.agent_workspace(request.agent_id)
        task = Task(
            task_id=time_ordered_id(now),
            agent_id=request.agent_id,
            session_id=request.session_id,
            title=request.title,
            instructions=request.instructions,
            profile=request.profile,
            state=State.QUEUED,
            created_at=now,
            updated_at=now,
            request_id=request.request_id,
            harness=request.harness or profile.harness,
            harness_model=request.harness_model or profile.harness_model,
            workspace_mode="profile" if profile.workspace else "agent",
            workspace_path=str(workspace),
        )
        task, stored = await self.store.create_task(task)
        self._published(stored, task)
        self._wake.set()
        return task

    async def get_task(self, task_id: str) -> tuple[Task, list[Attempt]]:
        domain.validate_task_id(task_id)
        return await self.store.task_with_attempts(task_id)

    async def list_tasks(
        self, agent_id: str, session_id: str, page: int, page_size: int, include_finished: bool
    ) -> TaskPage:
        domain.validate_id("agentId", agent_id)
        domain.validate_id("sessionId", session_id)
        request = domain.validate_page(page, page_size)
        clamped: dict[str, int] = {}

        def clamp(total: int) -> int:
            clamped["page"], clamped["pages"] = domain.clamp_page(request, total)
            return clamped["page"]

        total, tasks = await self.store.list_tasks(
            agent_id, session_id, include_finished, request.page, request.page_size, clamp
        )
        return TaskPage(clamped["page"], clamped["pages"], total, tasks)

    # --- dispatch ------------------------------------------------------------

    async def _dispatch_loop(self) -> None:
        interval = self.tasks_cfg.supervisor_interval_ms / 1000
        while not self._closing:
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=interval)
            except TimeoutError:
                pass
            self._wake.clear()
            try:
                await self.dispatch_once()
            except Exception:  # keep dispatching; the error is logged
                log.exception("dispatch_failed")

    async def dispatch_once(self) -> int:
        """Launch queued tasks while there is room; returns how many were launched."""
        launched = 0
        while not self._closing:
            room = self.tasks_cfg.max_running - len(self._live)
            if room <= 0:
                break
            queued = [
                t
                for t in await self.store.tasks_in_states([State.QUEUED], limit=room + len(self._live))
                if t.task_id not in self._live
            ][:room]
            if not queued:
                break
            # Concurrently: one launch's database work overlaps another's fork/exec.
            results = await asyncio.gather(*(self._launch(task.task_id) for task in queued))
            launched += sum(results)
        return launched

    def _worker_env(
        self, task: Task, attempt: Attempt, profile: WorkerProfile, run_as: processes.RunAs | None
    ) -> dict[str, str]:
        # An allow-list: service settings (database URLs, secrets) never reach a worker.
        env = {
            k: v for k, v in os.environ.items() if k in ALLOWED_ENV or k.startswith("LC_") or k in profile.inherit_env
        }
        if run_as is not None:
            env["HOME"] = run_as.home
        env.update(profile.env)
        env.update(
            {
                "TASKGATE_TASK_ID": task.task_id,
                "TASKGATE_ATTEMPT_ID": attempt.attempt_id,
                "TASKGATE_WORKER_ADDR": self.worker_addr(run_as.uid if run_as else None),
            }
        )
        resume = task.restart_resume
        if resume is not None and resume.pending:
            env["TASKGATE_RESUME"] = "1"
            env["TASKGATE_LAST_PROGRESS"] = resume.last_progress or ""
        return env

    async def _launch(self, task_id: str) -> bool:
        async with self._locks[task_id]:
            task, previous = await self.store.task_with_attempts(task_id)
            if task.state != State.QUEUED or task_id in self._live or self._closing:
                return False
            now = self.clock.now_ms()
            profile = self.settings.workers.get(task.profile)
            if profile is None:
                await self._finish(
                    task_id,
                    State.FAILED,
                    Failure(
                        code=FailureCode.WORKER_LAUNCH_FAILED,
                        message=f"worker profile {task.profile!r} is no longer configured",
                    ),
                )
                return False
            if task.profile in self._cannot_run:
                await self._finish(
                    task_id,
                    State.FAILED,
                    Failure(code=FailureCode.WORKER_LAUNCH_FAILED, message=self._cannot_run[task.profile]),
                )
                return False
            token = secrets.token_urlsafe(32)
            attempt_id = uuid.uuid4().hex
            attempt = Attempt(
                attempt_id=attempt_id,
                task_id=task_id,
                number=len(previous) + 1,
                boot_id=self.boot_id,
                token_hash=hash_token(token),
                harness=task.harness,
                harness_model=task.harness_model,
                state="launching",
                cgroup=self.ownership.cgroup_for(attempt_id),
            )
            # Committed before the fork: whatever happens next, recovery finds this row.
            await self.store.save_attempt(attempt)
            live = LiveAttempt(attempt=attempt, profile=profile)
            # Registered before the process exists, so its first call always finds it.
            self._live[task_id] = live
            self._by_token[attempt.token_hash] = live
            run_as = self._run_as.get(task.profile)
            log_path = self.settings.data_dir.resolve() / "logs" / task_id / f"attempt-{attempt.number}.log"
            try:
                await self.ownership.forking(attempt)
                launched = await processes.launch(
                    profile.command,
                    Path(task.workspace_path),
                    self._worker_env(task, attempt, profile, run_as),
                    log_path,
                    token,
                    run_as=run_as,
                    cgroup=Path(attempt.cgroup) if attempt.cgroup else None,
                )
            except OSError as exc:
                self._forget(live)
                self.ownership.drop(attempt)
                attempt.state, attempt.outcome = "ended", "launch_failed"
                if attempt.cgroup:
                    await asyncio.to_thread(cgroups.remove, Path(attempt.cgroup))
                await self._finish(
                    task_id,
                    State.FAILED,
                    Failure(code=FailureCode.WORKER_LAUNCH_FAILED, message=f"cannot start the worker: {exc}"),
                    attempt=attempt,
                )
                return False
            live.process = launched.process
            attempt.pid, attempt.pgid, attempt.pid_start_time = launched.pid, launched.pgid, launched.start_time
            self.ownership.forked(attempt)
            try:
                # The identity is committed while the worker is still held before exec.
                await self.store.save_attempt(attempt)
                launched.release()
                if self.tasks_cfg.fault_hold_launch_ms:
                    log.warning("fault_hold_launch", task_id=task_id, pid=launched.pid)
                    await asyncio.sleep(self.tasks_cfg.fault_hold_launch_ms / 1000)
                if live.stopping:  # the scheduler shut down during the launch: its stop settles the task
                    return False
                attempt.started_at = self.clock.now_ms()
                attempt.state = "running"

                def to_running(t: Task) -> Task:
                    t.state = State.RUNNING
                    t.first_started_at = t.first_started_at or attempt.started_at
                    t.started_at = attempt.started_at
                    t.updated_at = now
                    t.inspection = None
                    t.harness, t.harness_model = attempt.harness, attempt.harness_model
                    if t.restart_resume is not None and t.restart_resume.pending:
                        t.restart_resume.pending = False
                        t.failure = None
                    return t

                task, stored = await self.store.update_task(
                    task_id, to_running, "task.state_changed", now, attempt=attempt
                )
            except Exception as exc:
                launched.abandon()
                await self._launch_failed_after_spawn(live, exc)
                return False
            self._published(stored, task)
            log.info("worker_started", task_id=task_id, attempt=attempt.number, pid=launched.pid)
            if launched.start_time is not None:
                self.telemetry.watch(task_id, launched.pid, launched.start_time)
            self._spawn(self._wait_exit(task_id, live), f"wait-{task_id}")
            return True

    async def _launch_failed_after_spawn(self, live: LiveAttempt, exc: Exception) -> None:
        """A spawned worker whose launch could not be committed is stopped, never left running."""
        attempt = live.attempt
        log.error("launch_failed_after_spawn", task_id=attempt.task_id, pid=attempt.pid, error=repr(exc))
        live.stopping = True
        status = await self._stop_tree(attempt)
        attempt.state, attempt.outcome = "ended", "launch_failed"
        attempt.ended_at = self.clock.now_ms()
        self._forget(live)
        failure = Failure(code=FailureCode.WORKER_LAUNCH_FAILED, message=f"the launch failed after the spawn: {exc}")
        try:
            if status.gone:
                self.ownership.drop(attempt)
                await self._finish(attempt.task_id, State.FAILED, failure, attempt=attempt)
            else:
                outcome = PendingOutcome(state=State.FAILED, failure=failure)
                await self._unconfirmed(attempt.task_id, outcome, attempt, status.describe())
        except Exception:  # the database may be what failed; recovery settles the launching row
            log.exception("launch_failure_not_recorded", task_id=attempt.task_id)

    def _forget(self, live: LiveAttempt) -> None:
        if self._live.get(live.attempt.task_id) is live:
            del self._live[live.attempt.task_id]
        self._by_token.pop(live.attempt.token_hash, None)

    async def _wait_exit(self, task_id: str, live: LiveAttempt) -> None:
        assert live.process is not None
        returncode = await live.process.wait()
        live.returncode = returncode
        live.exited.set()
        self.telemetry.unwatch(task_id)
        attempt = live.attempt
        attempt.ended_at = self.clock.now_ms()
        attempt.exit_code = returncode if returncode >= 0 else None
        attempt.signal = -returncode if returncode < 0 else None
        attempt.state = "ended"
        try:
            if not live.stopping:
                await self._reap_leftovers(live)
            async with self._locks[task_id]:
                if live.stopping:
                    return  # the stopper records the outcome
                state, failure = domain.describe_exit(returncode)
                attempt.outcome = "exited" if returncode >= 0 else "killed"
                result = None
                if state == State.COMPLETED:
                    current = await self.store.get_task(task_id)
                    reported = current.result
                    result = Result(text=reported.text if reported else "")
                await self._finish(
                    task_id,
                    state,
                    failure,
                    result=result,
                    attempt=attempt,
                    only_from=(State.RUNNING, State.WAITING_INPUT),
                )
                log.info("worker_exited", task_id=task_id, returncode=returncode, state=state.value)
        finally:
            self._forget(live)
            self._wake.set()

    async def _stop_tree(self, attempt: Attempt) -> processes.TreeStatus:
        """SIGTERM, SIGKILL after the grace, then look for proof (see ``processes.stop_tree``)."""
        status = await processes.stop_tree(
            attempt,
            self.tasks_cfg.cancel_grace_ms / 1000,
            self.tasks_cfg.cleanup_confirm_ms / 1000,
            ctx=self.ownership.stop_context(),
        )
        if status.gone:
            self.ownership.drop(attempt)
        return status

    async def _reap_leftovers(self, live: LiveAttempt) -> None:
        """Processes a worker leaves behind (group, cgroup, recorded daemons) end with it."""
        ctx = self.ownership.stop_context()
        status = await asyncio.to_thread(processes.look, live.attempt, ctx)
        if status.gone:
            self.ownership.drop(live.attempt)
            if live.attempt.cgroup:
                await asyncio.to_thread(cgroups.remove, Path(live.attempt.cgroup))
            return
        task_id = live.attempt.task_id
        log.info("reaping_leftover_processes", task_id=task_id, detail=status.describe())
        status = await self._stop_tree(live.attempt)
        if not status.gone:
            log.warning("leftover_processes_survive", task_id=task_id, detail=status.describe())

    async def _finish(
        self,
        task_id: str,
        state: State,
        failure: Failure | None,
        *,
        result: Result | None = None,
        attempt: Attempt | None = None,
        only_from: tuple[State, ...] | None = None,
    ) -> Task:
        now = self.clock.now_ms()

        def change(t: Task) -> Task | None:
            if t.terminal or (only_from is not None and t.state not in only_from):
                return None
            return domain.end_task(t, state, now, failure=failure, result=result)

        task, stored = await self.store.update_task(task_id, change, "task.state_changed", now, attempt=attempt)
        if stored is None and attempt is not None:
            await self.store.save_attempt(attempt)
        self._published(stored, task)
        return task

    # --- cancellation --------------------------------------------------------

    async def cancel(
        self,
        task_id: str,
        cause: str = USER_CANCELED,
        replaced_by: str | None = None,
        wait_s: float = 0.0,
    ) -> Task:
        """Request a cancel; returns the task (cancelled, cancel_requested or unchanged)."""
        domain.validate_task_id(task_id)
        if replaced_by:
            domain.validate_task_id(replaced_by)
        cause = cause or USER_CANCELED
        if not domain.ID_PATTERN.match(cause):
            raise domain.InvalidArgument("INVALID_CAUSE", "cause must be a short identifier", field="cause")
        now = self.clock.now_ms()
        stopper: asyncio.Task[object] | None = None
        async with self._locks[task_id]:
            task = await self.store.get_task(task_id)
            if task.terminal or task.state in (State.CANCEL_REQUESTED, State.NEEDS_RECONCILIATION, State.RECOVERING):
                return task
            cancellation = Cancellation(requested_at=now, cause=cause, replaced_by_task_id=replaced_by)
            live = self._live.get(task_id)
            if live is None:
                # Not launched by this incarnation: stop what the last attempt recorded
                # (for a queued task: a launch an earlier incarnation did not finish).
                attempts = await self.store.attempts_of(task_id)
                if attempts and (task.state != State.QUEUED or attempts[-1].state == "launching"):
                    live = LiveAttempt(
                        attempt=attempts[-1],
                        profile=self.settings.workers.get(task.profile, WorkerProfile(command=["unknown"])),
                    )
            if live is None:
                # Queued (or never launched): nothing runs, so nothing to prove.
                def to_cancelled(t: Task) -> Task:
                    t.cancellation = cancellation
                    return domain.end_task(t, State.CANCELLED, now)

                task, stored = await self.store.update_task(task_id, to_cancelled, "task.state_changed", now)
                self._published(stored, task)
                return task

            def to_cancel_requested(t: Task) -> Task:
                t.state = State.CANCEL_REQUESTED
                t.cancellation = cancellation
                t.updated_at = now
                return t

            task, stored = await self.store.update_task(task_id, to_cancel_requested, "task.state_changed", now)
            self._published(stored, task)
            live.stopping = True
            stopper = asyncio.create_task(self._stop_and_settle(live, "cancel", f"cancelled ({cause})"))
            self._background.add(stopper)  # type: ignore[arg-type]
            stopper.add_done_callback(self._background.discard)  # type: ignore[arg-type]
        if wait_s > 0:
            done, _ = await asyncio.wait({stopper}, timeout=wait_s)
            if done:
                return await self.store.get_task(task_id)
        return task

    async def _stop_and_settle(self, live: LiveAttempt, why: str, message: str) -> Task:
        """Stop an attempt's tree; settle the task by what could be proven.

        ``why``: cancel | stalled | max_duration | no_first_report | background | shutdown.
        """
        task_id = live.attempt.task_id
        live.stopping = True
        status = await self._stop_tree(live.attempt)
        if live.process is not None and not live.exited.is_set():
            try:
                await asyncio.wait_for(live.exited.wait(), timeout=1.0)
            except TimeoutError:
                pass
        attempt = live.attempt
        attempt.ended_at = attempt.ended_at or self.clock.now_ms()
        attempt.outcome = f"stopped:{why}"
        attempt.state = "ended"
        async with self._locks[task_id]:
            task = await self.store.get_task(task_id)
            outcome = self._outcome_for(why, task, message)
            if status.gone:
                task = await self._settle(task_id, outcome, attempt)
            else:
                log.warning("cleanup_unconfirmed", task_id=task_id, detail=status.describe())
                task = await self._unconfirmed(task_id, outcome, attempt, status.describe())
        self._forget(live)
        self._wake.set()
        return task

    def _outcome_for(self, why: str, task: Task, message: str) -> PendingOutcome:
        if why == "cancel":
            return PendingOutcome(state=State.CANCELLED)
        if why == "background":
            text = task.result.text if task.result else ""
            return PendingOutcome(state=State.COMPLETED, result=Result(text=text, unresolved_background=True))
        if why == "shutdown":
            return PendingOutcome(
                state=State.QUEUED, failure=Failure(code=FailureCode.GATEWAY_SHUTDOWN, message=message, retryable=True)
            )
        code = {
            "stalled": FailureCode.PROGRESS_STALLED,
            "max_duration": FailureCode.MAX_DURATION_EXCEEDED,
            "no_first_report": FailureCode.FIRST_REPORT_TIMEOUT,
        }[why]
        return PendingOutcome(state=State.FAILED, failure=Failure(code=code, message=message))

    async def _settle(self, task_id: str, outcome: PendingOutcome, attempt: Attempt | None) -> Task:
        now = self.clock.now_ms()

        def change(t: Task) -> Task | None:
            if t.terminal:
                return None
            if outcome.state == State.QUEUED:
                assert outcome.failure is not None
                return domain.resume_after_interruption(t, now, outcome.failure.message)
            return domain.end_task(t, outcome.state, now, failure=outcome.failure, result=outcome.result)

        task, stored = await self.store.update_task(task_id, change, "task.state_changed", now, attempt=attempt)
        self._published(stored, task)
        return task

    async def _unconfirmed(self, task_id: str, outcome: PendingOutcome, attempt: Attempt, detail: str) -> Task:
        now = self.clock.now_ms()

        def change(t: Task) -> Task | None:
            if t.terminal:
                return None
            t.state = State.NEEDS_RECONCILIATION
            t.updated_at = now
            t.pending_outcome = outcome
            t.failure = Failure(
                code=FailureCode.CLEANUP_UNCONFIRMED,
                message=f"cannot confirm the worker stopped: {detail}",
                retryable=True,
            )
            if t.cancellation is not None:
                t.cancellation.cleanup = "unconfirmed"
            return t

        task, stored = await self.store.update_task(task_id, change, "task.state_changed", now, attempt=attempt)
        self._published(stored, task)
        return task

    async def retry_cleanup(self, task_id: str) -> Task:
        domain.validate_task_id(task_id)
        async with self._locks[task_id]:
            task = await self.store.get_task(task_id)
            if task.state != State.NEEDS_RECONCILIATION:
                return task
            attempts = await self.store.attempts_of(task_id)
        outcome = task.pending_outcome or PendingOutcome(state=State.CANCELLED)
        attempt = attempts[-1] if attempts else None
        if attempt is not None:
            status = await self._stop_tree(attempt)
        async with self._locks[task_id]:
            if attempt is None or status.gone:
                return await self._settle(task_id, outcome, attempt)
            return await self._unconfirmed(task_id, outcome, attempt, status.describe())

    # --- supervision ---------------------------------------------------------

    async def _supervise_loop(self) -> None:
        interval = self.tasks_cfg.supervisor_interval_ms / 1000
        while not self._closing:
            await asyncio.sleep(interval)
            try:
                await self.supervise_once()
            except Exception:
                log.exception("supervise_failed")

    async def supervise_once(self) -> None:
        """One pass over the live attempts: record descendants, apply the timers."""
        live = [la for la in self._live.values() if la.process is not None and not la.stopping]
        if not live and not self.ownership.busy:
            return
        table = await asyncio.to_thread(self._table_reader)
        await asyncio.to_thread(self.ownership.look_after, table)
        now = self.clock.now_ms()
        for la in live:
            if processes.record_descendants(la.attempt, table):
                await self.store.save_attempt(la.attempt)
            task = await self.store.find_task(la.attempt.task_id)
            if task is None:
                continue
            verdict = domain.supervise(task, la.attempt, self.tasks_cfg, now, la.profile.uses_sdk)
            if verdict.verdict == Verdict.NONE:
                continue
            if verdict.verdict == Verdict.INSPECT:
                await self._set_inspection(task.task_id, verdict.detail, now)
                continue
            why = {
                Verdict.STOP_STALLED: "stalled",
                Verdict.STOP_MAX_DURATION: "max_duration",
                Verdict.STOP_NO_FIRST_REPORT: "no_first_report",
                Verdict.ACCEPT_BACKGROUND: "background",
            }[verdict.verdict]
            async with self._locks[task.task_id]:
                if la.stopping or la.exited.is_set():
                    continue
                la.stopping = True
            log.info("supervisor_stopping", task_id=task.task_id, why=why, detail=verdict.detail)
            self._spawn(self._stop_and_settle(la, why, verdict.detail or why), f"stop-{task.task_id}")

    async def _set_inspection(self, task_id: str, reason: str, now: int) -> None:
        def change(t: Task) -> Task | None:
            if t.state not in (State.RUNNING, State.WAITING_INPUT) or t.inspection is not None:
                return None
            t.inspection = Inspection(reason=reason, since=now)
            return t

        task, stored = await self.store.update_task(task_id, change, "task.execution", now)
        self._published(stored, task)

    # --- telemetry -----------------------------------------------------------

    async def record_observation(self, task_id: str, observation: domain.Execution) -> None:
        """Keep the latest observation; CPU/IO movement counts as activity, never as progress."""

        def change(t: Task) -> Task | None:
            return t if domain.apply_observation(t, observation) else None

        try:
            task, _ = await self.store.update_task(task_id, change, None, observation.observed_at)
        except domain.TaskNotFound:
            return
        if not task.terminal:  # a finished task's last observation stays as it was
            self.hub.publish("task.execution", observation.observed_at, task)

    # --- worker reports ------------------------------------------------------

    def authenticate(self, token: str) -> LiveAttempt:
        live = self._by_token.get(hash_token(token)) if token else None
        if live is None:
            raise domain.WorkerDenied("INVALID_WORKER_TOKEN", "unknown or stale worker token")
        return live

    async def assignment(self, token: str) -> tuple[Task, Attempt]:
        live = self.authenticate(token)
        attempt = live.attempt
        task = await self.store.get_task(attempt.task_id)
        if attempt.first_contact_at is None:
            attempt.first_contact_at = self.clock.now_ms()
            await self.store.save_attempt(attempt)
        return task, attempt

    @staticmethod
    def _reporting(task: Task, live: LiveAttempt) -> bool:
        """Reports are taken while the task runs, and from a worker whose launch is still committing."""
        launching = task.state == State.QUEUED and live.attempt.state == "launching"
        return launching or task.state in (State.RUNNING, State.WAITING_INPUT)

    async def _report(self, token: str, event_type: str, apply: Callable[[Task, int], None]) -> Task:
        live = self.authenticate(token)
        now = self.clock.now_ms()
        if live.attempt.first_contact_at is None:
            live.attempt.first_contact_at = now

        def change(t: Task) -> Task | None:
            if not self._reporting(t, live):
                raise domain.InvalidTransition("TASK_NOT_RUNNING", f"the task is {t.state}; report ignored")
            apply(t, now)
            return t

        task, stored = await self.store.update_task(live.attempt.task_id, change, event_type, now)
        self._published(stored, task)
        return task

    async def report_progress(self, token: str, text: str) -> None:
        text = domain.clamp_utf8(text, domain.MAX_PROGRESS_CHARS * 4)[: domain.MAX_PROGRESS_CHARS]

        def apply(t: Task, now: int) -> None:
            t.progress = Progress(text=text, updated_at=now)
            t.last_activity_at = now
            t.inspection = None

        await self._report(token, "task.progress", apply)

    async def report_tool(self, token: str, name: str, status: str, exit_code: int | None) -> None:
        if not name or len(name) > domain.MAX_TOOL_NAME_CHARS:
            raise domain.InvalidArgument("INVALID_TOOL", "tool name must be 1-200 characters", field="name")
        if status not in ("returned", "error"):
            raise domain.InvalidArgument("INVALID_TOOL_STATUS", "status must be returned or error", field="status")
        limit = self.tasks_cfg.recent_tools

        def apply(t: Task, now: int) -> None:
            event = ToolEvent(name=name, status=status, at=now, exit_code=exit_code)
            t.last_tool = event
            t.recent_tools = [*t.recent_tools, event][-limit:]
            t.last_activity_at = now
            t.updated_at = now  # persisted tool activity counts as an update
            t.inspection = None

        await self._report(token, "task.tool", apply)

    async def report_touched(self, token: str, paths: list[str]) -> None:
        for path in paths:
            if not path or len(path) > domain.MAX_PATH_CHARS or "\x00" in path:
                raise domain.InvalidArgument("INVALID_PATH", "paths must be 1-4096 characters", field="paths")
        limit = self.tasks_cfg.observed_paths

        def apply(t: Task, now: int) -> None:
            merged = list(dict.fromkeys([*t.observed_paths, *paths]))
            t.observed_paths = merged[-limit:]

        await self._report(token, "task.tool", apply)

    async def report_usage(self, token: str, usage: Usage) -> None:
        for value in (usage.input_tokens, usage.cached_input_tokens, usage.output_tokens):
            if value is not None and value < 0:
                raise domain.InvalidArgument("INVALID_USAGE", "token counters must be 0 or more", field="usage")
        live = self.authenticate(token)
        task = await self.store.get_task(live.attempt.task_id)
        if not self._reporting(task, live):
            raise domain.InvalidTransition("TASK_NOT_RUNNING", f"the task is {task.state}; report ignored")
        live.attempt.usage = usage
        await self.store.save_attempt(live.attempt)

    async def report_result(self, token: str, text: str, unresolved_background: bool) -> None:
        if len(text.encode()) > domain.MAX_RESULT_BYTES:
            raise domain.InvalidArgument("FIELD_TOO_LONG", "result exceeds 256 KiB", field="text")

        def apply(t: Task, now: int) -> None:
            t.result = Result(text=text, unresolved_background=unresolved_background)
            t.result_reported_at = now
            t.last_activity_at = now

        await self._report(token, "task.progress", apply)

    # --- questions -----------------------------------------------------------

    async def ask_question(self, token: str, text: str) -> domain.PendingQuestion:
        """Relay a worker's question; the task waits for input until the worker has the answer."""
        if not text.strip() or len(text.encode()) > domain.MAX_QUESTION_BYTES:
            raise domain.InvalidArgument("INVALID_QUESTION", "a question is 1 byte to 64 KiB of text", field="text")
        if self.questions is None:
            raise errors.Unavailable("PENDING_REGISTRY_UNAVAILABLE", "no pending-registry is configured")
        live = self.authenticate(token)
        task = await self.store.get_task(live.attempt.task_id)
        if task.state not in (State.RUNNING, State.WAITING_INPUT):
            raise domain.InvalidTransition("TASK_NOT_RUNNING", f"the task is {task.state}; question refused")
        if task.pending_question is not None and task.pending_question.text == text:
            return task.pending_question  # the same question again, e.g. from a resumed attempt
        request_id = f"{live.attempt.attempt_id}-{hashlib.sha256(text.encode()).hexdigest()[:24]}"
        question = await self.questions.ask(task.task_id, task.session_id, text, request_id)
        pending = domain.PendingQuestion(question_id=question.question_id, text=text, revision=question.revision)
        now = self.clock.now_ms()

        def change(t: Task) -> Task:
            if t.state not in (State.RUNNING, State.WAITING_INPUT):
                raise domain.InvalidTransition("TASK_NOT_RUNNING", f"the task is {t.state}; question refused")
            t.state = State.WAITING_INPUT
            t.pending_question = pending
            t.inspection = None
            t.last_activity_at = now
            t.updated_at = now
            return t

        task, stored = await self.store.update_task(task.task_id, change, "task.question", now)
        self._published(stored, task)
        return pending

    async def await_answer(self, token: str, question_id: str, wait_s: float) -> str | None:
        """The answer once saved (the task then runs again), or None when ``wait_s`` passed."""
        if self.questions is None:
            raise errors.Unavailable("PENDING_REGISTRY_UNAVAILABLE", "no pending-registry is configured")
        live = self.authenticate(token)
        task = await self.store.get_task(live.attempt.task_id)
        if task.pending_question is None or task.pending_question.question_id != question_id:
            raise domain.WorkerDenied("QUESTION_STALE", "this is not the task's current question")
        question = await self.questions.await_answer(question_id, wait_s)
        if question is None:
            return None
        if not question.answer:
            raise domain.InvalidTransition("QUESTION_CLOSED", "the question was closed without an answer")
        now = self.clock.now_ms()

        def change(t: Task) -> Task | None:
            if t.pending_question is None or t.pending_question.question_id != question_id:
                return None
            t.pending_question = None
            t.last_activity_at = now
            t.updated_at = now
            if t.state == State.WAITING_INPUT:
                t.state = State.RUNNING
            return t

        task, stored = await self.store.update_task(task.task_id, change, "task.state_changed", now)
        self._published(stored, task)
        return str(question.answer)

    # --- recovery ------------------------------------------------------------

    async def _recover_launches(self) -> None:
        """Stop what remains of launches an earlier incarnation had not committed.

        Its task is still queued. The attempt's cgroup (cgroup mode) and its recorded
        pid (committed while the worker was held) say what may remain; once that is
        proven gone the task is dispatched again, else it needs reconciliation.
        """
        for attempt in await self.store.launching_attempts():
            if attempt.boot_id == self.boot_id:
                continue
            status = await self._stop_tree(attempt)
            attempt.state, attempt.outcome = "ended", "launch_interrupted"
            attempt.ended_at = attempt.ended_at or self.clock.now_ms()
            log.info("recovered_launch", task_id=attempt.task_id, pid=attempt.pid, confirmed=status.gone)
            if status.gone:
                await self.store.save_attempt(attempt)
                continue
            failure = Failure(code=FailureCode.GATEWAY_SHUTDOWN, message="the scheduler restarted", retryable=True)
            outcome = PendingOutcome(state=State.QUEUED, failure=failure)
            await self._unconfirmed(attempt.task_id, outcome, attempt, status.describe())

    async def recover(self) -> None:
        """Settle tasks an earlier incarnation left active: stop its worker, then resume."""
        await self._recover_launches()
        for task in await self.store.tasks_in_states(ACTIVE):
            attempts = await self.store.attempts_of(task.task_id)
            attempt = attempts[-1] if attempts else None
            if attempt is not None and attempt.boot_id == self.boot_id:
                continue
            was_cancelling = task.state == State.CANCEL_REQUESTED
            now = self.clock.now_ms()
            if task.state != State.RECOVERING:

                def to_recovering(t: Task, at: int = now) -> Task:
                    t.state = State.RECOVERING
                    t.updated_at = at
                    return t

                task, stored = await self.store.update_task(task.task_id, to_recovering, "task.state_changed", now)
                self._published(stored, task)
            outcome = (
                PendingOutcome(state=State.CANCELLED)
                if was_cancelling or task.cancellation
                else PendingOutcome(
                    state=State.QUEUED,
                    failure=Failure(
                        code=FailureCode.GATEWAY_SHUTDOWN, message="the scheduler restarted", retryable=True
                    ),
                )
            )
            if attempt is None:
                await self._settle(task.task_id, outcome, None)
                continue
            status = await self._stop_tree(attempt)
            attempt.outcome = attempt.outcome or "interrupted"
            attempt.state = "ended"
            attempt.ended_at = attempt.ended_at or now
            if status.gone:
                await self._settle(task.task_id, outcome, attempt)
            else:
                await self._unconfirmed(task.task_id, outcome, attempt, status.describe())
            log.info("recovered_task", task_id=task.task_id, confirmed=status.gone)
