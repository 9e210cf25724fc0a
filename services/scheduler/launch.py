"""Launch: the dispatcher (queued -> running within ``max_running``) and each worker's exit.

The launch protocol: the attempt row (``launching``, its token hash) is committed
before the fork; the worker is held before exec until its identity (pid, pgid,
kernel start time) is committed; then the task becomes ``running``. A failure
after the spawn stops the tree — a worker is never left running untracked.
"""

from __future__ import annotations

import asyncio
import functools
import os
import secrets
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

import structlog

from libs.settings import WorkerProfile
from services.scheduler import cgroups, containers, domain, processes
from services.scheduler.dispatch_targets import TargetDispatcher
from services.scheduler.domain import Attempt, Failure, FailureCode, PendingOutcome, State, Task
from services.scheduler.metrics import LAUNCH_STEP, LAUNCH_STEPS, WORKER_SPAWNS
from services.scheduler.runtime import LiveAttempt, Runtime, hash_token, woken
from services.scheduler.settling import Settler
from services.scheduler.stopping import Stopper
from services.scheduler.worker_log import attempt_log_path

log = structlog.get_logger("scheduler")

# What a worker's environment may inherit from the scheduler's (plus LC_* and the
# profile's own `env` and `inherit_env`).
ALLOWED_ENV = frozenset({"PATH", "HOME", "LANG", "TZ", "TMPDIR"})


def worker_env(
    environ: Mapping[str, str],
    task: Task,
    attempt: Attempt,
    profile: WorkerProfile,
    run_as: processes.RunAs | None,
    worker_addr: str,
) -> dict[str, str]:
    # An allow-list: service settings (database URLs, secrets) never reach a worker.
    env = {k: v for k, v in environ.items() if k in ALLOWED_ENV or k.startswith("LC_") or k in profile.inherit_env}
    if run_as is not None:
        env["HOME"] = run_as.home
    env.update(profile.env)
    env.update(
        {
            "TASKGATE_TASK_ID": task.task_id,
            "TASKGATE_ATTEMPT_ID": attempt.attempt_id,
            "TASKGATE_WORKER_ADDR": worker_addr,
        }
    )
    resume = task.restart_resume
    if resume is not None and resume.pending:
        env["TASKGATE_RESUME"] = "1"
        env["TASKGATE_LAST_PROGRESS"] = resume.last_progress or ""
    return env


# The launch-step histogram's children, made once (``libs.metrics.Children`` explains why).
_STEP_SECONDS = {step: LAUNCH_STEP.labels(step) for step in LAUNCH_STEPS}
_SPAWNED_BY = {by: WORKER_SPAWNS.labels(by) for by in ("helper", "scheduler")}


class Launcher:
    def __init__(self, rt: Runtime, settler: Settler, stopper: Stopper) -> None:
        self.rt = rt
        self.settler = settler
        self.stopper = stopper
        # Gateway-managed tasks are dispatched, not launched (``dispatch_targets``; set by the engine).
        self.targets: TargetDispatcher | None = None
        # What of the scheduler's environment any worker may inherit, read once: decoding all
        # of ``os.environ`` per launch cost more than building the rest of the worker's env.
        inheritable = {name for p in rt.settings.workers.values() for name in p.inherit_env}
        self.environ = {
            k: v for k, v in os.environ.items() if k in ALLOWED_ENV or k.startswith("LC_") or k in inheritable
        }
        # The dispatch loop's launches under way, by task id: claimed, not yet running or failed.
        self._launching: dict[str, asyncio.Task[bool]] = {}

    async def dispatch_loop(self) -> None:
        """Claim queued tasks whenever there is room and launch each on its own.

        A launch is not waited for before the next claim: slots that fast tasks free are filled
        at a following wake-up, not after the slowest launch of an earlier claim (a claim of 64
        launched together held every freed slot until the last of them was running). While
        launches are under way a claim waits for a quarter of the slots: claiming each freed
        slot alone cost more CPU per task than the wait it saved.
        Cancelled (the scheduler's shutdown), it cancels the launches under way and waits for
        them, as ``dispatch_once`` would be: none is left to run after the live ones are stopped.
        """
        rt = self.rt
        # Several hosts: woken by NOTIFY (another replica's enqueue) and local exits, so the
        # timer is only a slow safety poll.
        interval = (rt.tasks_cfg.safety_poll_ms if rt.multi_host else rt.tasks_cfg.supervisor_interval_ms) / 1000
        try:
            while not rt.closing:
                await woken(rt.wake, interval)
                try:
                    await self._start_launches()
                except Exception:  # keep dispatching; the error is logged
                    log.exception("dispatch_failed")
        finally:
            launching = list(self._launching.values())
            for launch in launching:
                launch.cancel()
            await asyncio.gather(*launching, return_exceptions=True)

    async def _start_launches(self) -> None:
        """Claim what the room allows and start each claimed task's launch (not waited for)."""
        # While launches are under way a claim waits for a quarter of the slots: a claim is a
        # transaction that reads past every launching task, and one per freed slot cost more.
        batch = max(1, self.rt.tasks_cfg.max_running // 4)
        while await self._claim_and_start(min_room=batch if self._launching else 1):
            pass

    async def _claim_and_start(self, min_room: int = 1) -> list[asyncio.Task[bool]]:
        """One claim of up to the free room (none below ``min_room``) for this host — FOR UPDATE
        SKIP LOCKED on PostgreSQL, so another replica dispatching at once takes other tasks —
        and each claimed task's launch started; the launches (empty: nothing claimed)."""
        rt = self.rt
        busy = rt.live.keys() | self._launching.keys()
        room = rt.tasks_cfg.max_running - len(busy)
        if rt.closing or room < min_room:
            return []
        claimed = await rt.store.claim_queued(room, skip=list(busy), any_owner=not rt.multi_host)
        launches = []
        for task_id in claimed:
            if task_id in self._launching:
                continue
            launch = asyncio.create_task(self.launch(task_id), name=f"launch-{task_id}")
            self._launching[task_id] = launch
            launch.add_done_callback(functools.partial(self._launch_done, task_id))
            launches.append(launch)
        return launches

    def _launch_done(self, task_id: str, launch: asyncio.Task[bool]) -> None:
        self._launching.pop(task_id, None)
        if launch.cancelled():
            return
        error = launch.exception()
        if error is not None:
            log.error("dispatch_failed", task_id=task_id, error=repr(error))
        if error is not None or not launch.result() or not self._launching:
            self.rt.wake.set()  # its slot is free again, or claims no longer wait for launches

    async def dispatch_once(self) -> int:
        """Launch queued tasks while there is room, each claim's launches awaited before the next
        claim; returns how many were launched (one pass, for tests and tools: the dispatch loop
        does not wait for launches)."""
        launched = 0
        # Concurrently: one launch's database work overlaps another's fork/exec.
        while launches := await self._claim_and_start():
            launched += sum(await asyncio.gather(*launches))
        return launched

    async def launch(self, task_id: str) -> bool:
        rt = self.rt
        async with rt.locks[task_id]:
            if task_id in rt.live or rt.closing:
                return False
            token = secrets.token_urlsafe(32)

            def plan(task: Task, previous: list[Attempt]) -> Attempt | None:
                """The attempt to launch (None: a gateway-managed task, or a profile that cannot run)."""
                if task.gateway_managed and self.targets is not None:
                    return None
                if task.profile not in rt.settings.workers or task.profile in rt.cannot_run:
                    return None
                attempt_id = uuid.uuid4().hex
                return Attempt(
                    attempt_id=attempt_id,
                    task_id=task_id,
                    number=len(previous) + 1,
                    boot_id=rt.boot_id,
                    token_hash=hash_token(token),
                    harness=task.harness,
                    harness_model=task.harness_model,
                    state="launching",
                    cgroup=rt.ownership.cgroup_for(attempt_id),
                    host_id=rt.host_id,
                )

            # The task, its earlier attempts and (for a worker) the `launching` attempt row in one
            # transaction. Committed before the fork: whatever happens next, recovery finds the
            # row; and only while the task is still queued and this host's (another host's cancel
            # or a lost-host sweep may have come first).
            marks = [time.perf_counter()]  # the steps' ends, for taskgate_task_launch_step_seconds
            begun = await rt.store.begin_launch(task_id, plan)
            marks.append(time.perf_counter())
            if begun is None:
                return False
            task, previous, planned = begun
            if planned is None:
                return await self._not_launched(task, previous)
            attempt = planned
            profile = rt.settings.workers[task.profile]
            live = LiveAttempt(attempt=attempt, profile=profile)
            # Registered before the process exists, so its first call always finds it.
            rt.live[task_id] = live
            rt.by_token[attempt.token_hash] = live
            run_as = rt.run_as.get(task.profile)
            log_path = attempt_log_path(rt.settings.data_dir, task_id, attempt.number)
            try:
                await rt.ownership.forking(attempt, create_cgroup=False)  # the spawn creates it
                addr = rt.worker_addr(run_as.uid if run_as else None)
                command = profile.command
                if profile.container is not None:  # created and admitted first; refused -> nothing runs
                    command = await containers.ContainerEngine(profile.container).prepare(
                        containers.container_name(attempt.attempt_id), profile.command, Path(task.workspace_path)
                    )
                launched = await processes.launch(
                    command,
                    Path(task.workspace_path),
                    worker_env(self.environ, task, attempt, profile, run_as, addr),
                    log_path,
                    token,
                    run_as=run_as,
                    cgroup=Path(attempt.cgroup) if attempt.cgroup else None,
                    cgroup_v1=rt.ownership.cgroups is not None and rt.ownership.cgroups.version == 1,
                    on_spawn=lambda pid: rt.ownership.spawned(attempt.attempt_id, pid),
                    hold=rt.hold,
                    spawner=rt.live_spawner(),
                )
            except Exception as exc:  # any failure, not only OSError: never a queued task holding a slot
                log.error("launch_failed", task_id=task_id, attempt=attempt.number, error=repr(exc))
                rt.forget(live)
                rt.ownership.drop(attempt)
                attempt.state, attempt.outcome = "ended", "launch_failed"
                if attempt.cgroup:
                    await asyncio.to_thread(cgroups.remove, Path(attempt.cgroup))
                await self.settler.finish(
                    task_id,
                    State.FAILED,
                    Failure(code=FailureCode.WORKER_LAUNCH_FAILED, message=f"cannot start the worker: {exc}"),
                    attempt=attempt,
                )
                return False
            marks.append(time.perf_counter())
            _SPAWNED_BY[launched.by].inc()
            live.process = launched.process
            launched.process.attempt = attempt
            attempt.pid, attempt.pgid, attempt.pid_start_time = launched.pid, launched.pgid, launched.start_time
            rt.ownership.forked(attempt)
            try:
                # Kept until the attempt is proven gone: its group stays reachable, and provably
                # its own, after the leader exits (``processes.tree_status``).
                rt.ownership.keep_group(attempt, launched.process.duplicate_pidfd())
                started_at = attempt.started_at = rt.clock.now_ms()
                attempt.state = "running"

                def to_running(t: Task) -> Task | None:
                    if t.state == State.CANCEL_REQUESTED:
                        return None  # another host's cancel arrived during the launch
                    if domain.host_lost_here(t, rt.host_id):
                        # This host's lease lapsed during the launch and another replica swept the
                        # task. The worker is ours: it is released and runs on, and this host's next
                        # reconciliation takes the task back (or settles it by the worker's exit).
                        return None
                    # Dated when the worker was spawned, just before this commit — not when the
                    # launch began (its claim commit and the spawn come between).
                    return domain.start_running(t, started_at, started_at, attempt.harness, attempt.harness_model)

                # The identity (pid, start time) and `running` in one commit, while the worker is
                # still held before exec: it runs only once both are durable, and a launch costs
                # one transaction fewer than an identity commit followed by a running commit.
                task, stored = await rt.store.update_task(
                    task_id, to_running, "task.state_changed", started_at, attempt=attempt
                )
                if stored is None:  # not running here after all; the identity is recorded even so
                    await rt.store.save_attempt(attempt)
                marks.append(time.perf_counter())
                if live.stopping:
                    # The scheduler shut down during the commit: its stop settles the task, and the
                    # held worker, never released, exits without running.
                    launched.abandon()
                    return False
                if task.state == State.CANCEL_REQUESTED:
                    launched.abandon()  # cancelled during the launch: the worker never runs (stopped below)
                else:
                    launched.release()
                if rt.tasks_cfg.fault_hold_launch_ms:
                    log.warning("fault_hold_launch", task_id=task_id, pid=launched.pid)
                    await asyncio.sleep(rt.tasks_cfg.fault_hold_launch_ms / 1000)
            except Exception as exc:
                launched.abandon()
                await self.launch_failed_after_spawn(live, exc)
                return False
            if task.state == State.CANCEL_REQUESTED:
                live.stopping = True
                rt.spawn(self.wait_exit(task_id, live), f"wait-{task_id}")
                rt.spawn(self.stopper.stop_and_settle(live, domain.requested_stop(task), "stopped on request"))
                return True
            rt.published(stored, task)
            marks.append(time.perf_counter())
            for step, began, ended in zip(LAUNCH_STEPS, marks[:-1], marks[1:], strict=True):
                _STEP_SECONDS[step].observe(ended - began)
            if domain.host_lost_here(task, rt.host_id):
                log.warning("launched_while_host_lost", task_id=task_id, attempt=attempt.number, pid=launched.pid)
            log.info("worker_started", task_id=task_id, attempt=attempt.number, pid=launched.pid)
            rt.spawn(self.wait_exit(task_id, live), f"wait-{task_id}")
            return True

    async def _not_launched(self, task: Task, previous: list[Attempt]) -> bool:
        """A claimed task that gets no worker here: dispatched to its target, or failed."""
        rt = self.rt
        if task.gateway_managed and self.targets is not None:
            return await self.targets.dispatch(task, previous)  # no process, no pool slot
        message = rt.cannot_run.get(task.profile, f"worker profile {task.profile!r} is no longer configured")
        await self.settler.finish(
            task.task_id, State.FAILED, Failure(code=FailureCode.WORKER_LAUNCH_FAILED, message=message)
        )
        return False

    async def launch_failed_after_spawn(self, live: LiveAttempt, exc: Exception) -> None:
        """A spawned worker whose launch could not be committed is stopped, never left running."""
        rt = self.rt
        attempt = live.attempt
        log.error("launch_failed_after_spawn", task_id=attempt.task_id, pid=attempt.pid, error=repr(exc))
        live.stopping = True
        status = await self.stopper.stop_tree(attempt)
        attempt.state, attempt.outcome = "ended", "launch_failed"
        attempt.ended_at = rt.clock.now_ms()
        rt.forget(live)
        failure = Failure(code=FailureCode.WORKER_LAUNCH_FAILED, message=f"the launch failed after the spawn: {exc}")
        try:
            if status.gone:
                rt.ownership.drop(attempt)
                await self.settler.finish(attempt.task_id, State.FAILED, failure, attempt=attempt)
            else:
                outcome = PendingOutcome(state=State.FAILED, failure=failure)
                await self.settler.unconfirmed(attempt.task_id, outcome, attempt, status.describe())
        except Exception:  # the database may be what failed; recovery settles the launching row
            log.exception("launch_failure_not_recorded", task_id=attempt.task_id)

    async def wait_exit(self, task_id: str, live: LiveAttempt) -> None:
        """The worker's own exit ends its task, unless taskgate is stopping it."""
        rt = self.rt
        assert live.process is not None
        returncode = await live.process.wait()
        live.returncode = returncode
        live.exited.set()
        if live.watched:
            rt.telemetry.unwatch(task_id)
        attempt = live.attempt
        attempt.ended_at = rt.clock.now_ms()
        attempt.exit_code = returncode if returncode >= 0 else None
        attempt.signal = -returncode if returncode < 0 else None
        attempt.state = "ended"
        try:
            if not live.stopping:
                await self.stopper.reap_leftovers(live)
            async with rt.locks[task_id]:
                if live.stopping:
                    return  # the stopper records the outcome
                state, failure = domain.describe_exit(returncode)
                attempt.outcome = "exited" if returncode >= 0 else "killed"
                await self.settler.finish(
                    task_id,
                    state,
                    failure,
                    attempt=attempt,
                    only_from=(State.RUNNING, State.WAITING_INPUT),
                    keep_reported_result=state == State.COMPLETED,
                )
                log.info("worker_exited", task_id=task_id, returncode=returncode, state=state.value)
        finally:
            rt.forget(live)
            rt.wake.set()
