"""Supervision: the one supervisor loop (timers, descendant recording) and telemetry.

Each pass reads the process table once (in a thread), records the descendants of
every live attempt, and asks ``domain.supervise`` what each task's timers call
for: nothing, an inspection mark, or a stop (``stopping.Stopper``).
"""

from __future__ import annotations

import asyncio

import structlog

from libs.settings import WorkerProfile
from services.scheduler import domain, processes
from services.scheduler.domain import State, Task, Verdict
from services.scheduler.runtime import LiveAttempt, Runtime
from services.scheduler.stopping import Stopper

log = structlog.get_logger("scheduler")

# How often the supervisor looks for running tasks of this boot with no live attempt.
RECONCILE_INTERVAL_MS = 30_000


class Supervisor:
    def __init__(self, rt: Runtime, stopper: Stopper) -> None:
        self.rt = rt
        self.stopper = stopper

    async def loop(self) -> None:
        rt = self.rt
        interval = rt.tasks_cfg.supervisor_interval_ms / 1000
        last_reconcile = rt.clock.now_ms()
        while not rt.closing:
            await asyncio.sleep(interval)
            try:
                await self.supervise_once()
            except Exception:
                log.exception("supervise_failed")
            if rt.clock.now_ms() - last_reconcile >= RECONCILE_INTERVAL_MS:
                last_reconcile = rt.clock.now_ms()
                try:
                    await self.reconcile_once()
                except Exception:
                    log.exception("reconcile_failed")

    async def reconcile_once(self) -> int:
        """Find tasks this boot runs (``running``/``waiting_input``) with no live attempt — an exit
        or stop whose record was lost (a database error) — stop what remains of the attempt
        (identity-checked) and settle them as interrupted. Returns how many were found."""
        rt = self.rt
        found = 0
        for task in await rt.store.tasks_in_states([State.RUNNING, State.WAITING_INPUT], owner=rt.own):
            if task.task_id in rt.live or task.gateway_managed:  # a request, not a process
                continue
            async with rt.locks[task.task_id]:
                # Again under the task's lock: a task that just ended or launched is not an orphan.
                current, attempts = await rt.store.task_with_attempts(task.task_id)
                if current.state not in (State.RUNNING, State.WAITING_INPUT) or task.task_id in rt.live:
                    continue
                attempt = attempts[-1] if attempts else None
                if attempt is None or attempt.boot_id != rt.boot_id:
                    continue  # an earlier boot's: start-up recovery's
            found += 1
            log.warning("orphaned_task_found", task_id=task.task_id, attempt=attempt.number)
            profile = rt.settings.workers.get(current.profile, WorkerProfile(command=["unknown"]))
            await self.stopper.stop_and_settle(
                LiveAttempt(attempt=attempt, profile=profile), "shutdown", "the scheduler lost track of its worker"
            )
        return found

    async def supervise_once(self) -> None:
        """One pass over the live attempts: record descendants, apply the timers."""
        rt = self.rt
        live = [la for la in rt.live.values() if la.process is not None and not la.stopping]
        if not live and not rt.ownership.busy:
            return
        table = await rt.scans.fresh()
        await asyncio.to_thread(rt.ownership.look_after, table)
        now = rt.clock.now_ms()
        for la in live:
            # Telemetry only for workers alive past their first tick: a short-lived worker
            # costs the agent (and the scheduler) no Watch/Unwatch pair.
            attempt = la.attempt
            if not la.watched and not la.exited.is_set() and attempt.pid is not None and attempt.pid_start_time:
                la.watched = True
                rt.telemetry.watch(attempt.task_id, attempt.pid, attempt.pid_start_time)
        changed = [la.attempt for la in live if processes.record_descendants(la.attempt, table)]
        if changed:
            await rt.store.save_attempts(changed)
        # One read for all live tasks, not one per task.
        tasks = await rt.store.find_tasks([la.attempt.task_id for la in live])
        for la in live:
            task = tasks.get(la.attempt.task_id)
            if task is None:
                continue
            verdict = domain.supervise(task, la.attempt, rt.tasks_cfg, now, la.profile.uses_sdk)
            if verdict.verdict == Verdict.NONE:
                continue
            if verdict.verdict == Verdict.INSPECT:
                await self.set_inspection(task.task_id, verdict.detail, now)
                continue
            why = domain.STOP_REASONS[verdict.verdict]
            async with rt.locks[task.task_id]:
                if la.stopping or la.exited.is_set():
                    continue
                la.stopping = True
            log.info("supervisor_stopping", task_id=task.task_id, why=why, detail=verdict.detail)
            rt.spawn(self.stopper.stop_and_settle(la, why, verdict.detail or why), f"stop-{task.task_id}")

    async def set_inspection(self, task_id: str, reason: str, now: int) -> None:
        def change(t: Task) -> Task | None:
            return t if domain.mark_for_inspection(t, reason, now) else None

        task, stored = await self.rt.store.update_task(task_id, change, "task.execution", now)
        self.rt.published(stored, task)

    async def record_observation(self, task_id: str, observation: domain.Execution) -> None:
        """Keep the latest observation; CPU/IO movement counts as activity, never as progress."""

        def change(t: Task) -> Task | None:
            return t if domain.apply_observation(t, observation) else None

        try:
            task, _ = await self.rt.store.update_task(task_id, change, None, observation.observed_at)
        except domain.TaskNotFound:
            return
        if not task.terminal:  # a finished task's last observation stays as it was
            self.rt.hub.publish("task.execution", observation.observed_at, task)
