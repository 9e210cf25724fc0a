"""Operator-declared cron jobs: firing ticks, manual runs, and how each run ends.

One loop per scheduler: each pass claims the due ticks of every enabled job (a tick
is claimed in the transaction that creates its task, see ``cron_store``, so with
several replicas on one database exactly one fires it) and closes open runs whose
tasks finished or whose ``timeout_ms`` passed (the task is then cancelled and the run
ends ``timed_out``). Run history is durable, so any replica can close a run and a
waiter on any replica sees it. A manual run's waiter stopping never touches the run.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable

import structlog

from libs.settings import CronJob
from services.scheduler import cron_domain, domain
from services.scheduler.catalog import TaskCatalog
from services.scheduler.cron_domain import CronAccessDenied, CronNotFound, CronRun
from services.scheduler.cron_store import CronStore
from services.scheduler.domain import NewTask, State, Task
from services.scheduler.runtime import Runtime

log = structlog.get_logger("scheduler.crons")

CancelTask = Callable[[str, str], Awaitable[Task]]


class CronRunner:
    def __init__(self, rt: Runtime, catalog: TaskCatalog, cancel: CancelTask) -> None:
        self.rt = rt
        self.catalog = catalog
        self.cancel = cancel
        self.store = CronStore(rt.store)
        self.jobs: dict[str, CronJob] = dict(rt.settings.crons)
        self.poll_s = rt.settings.cron_poll_ms / 1000
        # The last instant each job's ticks were looked for: ticks from this incarnation's
        # start on fire (missed ones while no scheduler ran are not caught up).
        self._checked: dict[str, int] = {}
        self._since = rt.clock.now_ms()
        self._ended = asyncio.Event()  # a run ended here: waiters look again

    # --- jobs ----------------------------------------------------------------

    def job(self, cron_id: str, agent_ids: set[str] | None = None) -> CronJob:
        job = self.jobs.get(cron_id)
        if job is None:
            raise CronNotFound("CRON_NOT_FOUND", f"no cron job {cron_id!r}")
        if agent_ids is not None and job.agent not in agent_ids:
            raise CronAccessDenied("AGENT_ACCESS_DENIED", "no access to the cron job's agent")
        return job

    def list_jobs(self, agent_ids: set[str] | None = None) -> list[tuple[str, CronJob]]:
        return sorted((i, j) for i, j in self.jobs.items() if agent_ids is None or j.agent in agent_ids)

    async def list_runs(
        self, cron_id: str, agent_ids: set[str] | None, page: int, page_size: int
    ) -> tuple[CronJob, int, int, int, list[CronRun]]:
        """The job and a page of its runs, newest first: (job, page, pages, total, runs)."""
        job = self.job(cron_id, agent_ids)
        request = domain.validate_page(page, page_size)
        clamped: dict[str, int] = {}

        def clamp(total: int) -> int:
            clamped["page"], clamped["pages"] = domain.clamp_page(request, total)
            return clamped["page"]

        total, runs = await self.store.list_runs(cron_id, request.page_size, clamp)
        return job, clamped["page"], clamped["pages"], total, runs

    # --- starting runs -------------------------------------------------------

    async def _start(self, cron_id: str, job: CronJob, kind: str, scheduled_for: int | None) -> CronRun | None:
        rt = self.rt
        now = rt.clock.now_ms()
        task = self.catalog.new_task(
            NewTask(
                agent_id=job.agent,
                session_id=job.session,
                title=job.title,
                instructions=job.instructions,
                profile=job.profile,
                request_id=None,
                harness=None,
                harness_model=None,
            )
        )
        run = CronRun(
            run_id=uuid.uuid4().hex,
            cron_id=cron_id,
            kind=kind,
            scheduled_for=scheduled_for,
            started_at=now,
            deadline_at=now + job.timeout_ms,
            task_ids=(task.task_id,),
        )
        stored = await self.store.start_run(run, task)
        if stored is None:
            return None
        rt.published(stored, task)
        rt.wake.set()
        log.info(
            "cron_run_started",
            cron_id=cron_id,
            run_id=run.run_id,
            kind=kind,
            task_id=task.task_id,
            scheduled_for=scheduled_for,
        )
        return run

    async def run_now(self, cron_id: str, agent_ids: set[str] | None = None) -> CronRun:
        """A manual run: started now whatever the schedule says."""
        job = self.job(cron_id, agent_ids)
        run = await self._start(cron_id, job, cron_domain.MANUAL, None)
        assert run is not None  # a manual run claims no tick
        return run

    async def fire_due(self) -> list[CronRun]:
        """Claim every due tick of every enabled job; the runs this replica started."""
        now = self.rt.clock.now_ms()
        started: list[CronRun] = []
        for cron_id, job in self.jobs.items():
            if not job.enabled or not self.rt.settings.agent(job.agent).orchestration_enabled:
                continue
            after = self._checked.get(cron_id, self._since)
            ticks, skipped = cron_domain.due_ticks(job.schedule, after, now)
            if skipped:
                log.warning("cron_ticks_skipped", cron_id=cron_id, skipped=skipped)
            for tick in ticks:
                run = await self._start(cron_id, job, cron_domain.SCHEDULE, tick)
                if run is None:
                    log.info("cron_tick_taken", cron_id=cron_id, scheduled_for=tick)
                else:
                    started.append(run)
            self._checked[cron_id] = now
        return started

    # --- ending runs ---------------------------------------------------------

    async def settle_once(self) -> list[CronRun]:
        """Close the open runs whose tasks finished or whose deadline passed."""
        rt = self.rt
        runs = await self.store.open_runs()
        if not runs:
            return []
        tasks = await rt.store.find_tasks(sorted({t for r in runs for t in r.task_ids}))
        states = {task_id: task.state for task_id, task in tasks.items()}
        now = rt.clock.now_ms()
        ended: list[CronRun] = []
        for run in runs:
            outcome = cron_domain.run_outcome(run, states, now)
            if outcome is None:
                continue
            failure = None
            if outcome == cron_domain.TIMED_OUT:
                for task_id in run.task_ids:
                    if task_id in states and states[task_id] not in (State.COMPLETED, State.FAILED, State.CANCELLED):
                        # The job's bound: its task is stopped (with the usual proof).
                        rt.spawn(self._cancel_quietly(task_id), name=f"cron-timeout-{task_id}")
            else:
                failure = next((tasks[t].failure for t in run.task_ids if t in tasks and tasks[t].failure), None)
            done = run.ending(outcome, now, failure)
            if await self.store.end_run(done):
                log.info("cron_run_ended", cron_id=run.cron_id, run_id=run.run_id, outcome=outcome)
                ended.append(done)
        if ended:
            self._ended.set()
            self._ended = asyncio.Event()
        return ended

    async def _cancel_quietly(self, task_id: str) -> None:
        try:
            await self.cancel(task_id, cron_domain.CRON_TIMED_OUT)
        except Exception as exc:  # the run has ended timed_out either way
            log.warning("cron_timeout_cancel_failed", task_id=task_id, error=repr(exc))

    async def wait_for_end(self, run_id: str, timeout_s: float) -> CronRun | None:
        """The run once it has ended, or as it is after ``timeout_s``; None if unknown."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            ended = self._ended
            run = await self.store.get_run(run_id)
            left = deadline - loop.time()
            if run is None or run.ended or left <= 0:
                return run
            # Ended here (event) or by another replica (the poll).
            try:
                async with asyncio.timeout(min(left, self.poll_s)):
                    await ended.wait()
            except TimeoutError:
                pass

    # --- the loop ------------------------------------------------------------

    def _sleep_s(self) -> float:
        """Until the next tick of any enabled job, at most one poll period."""
        now = self.rt.clock.now_ms()
        ticks = [cron_domain.next_tick(j.schedule, now) for j in self.jobs.values() if j.enabled]
        return max(0.0, min([self.poll_s, *((t - now) / 1000 for t in ticks)]))

    async def loop(self) -> None:
        # A finished task may end a run: look at once instead of at the next poll.
        with self.rt.hub.subscribe(lambda task: task.terminal) as finished:
            while True:
                try:
                    await self.fire_due()
                    await self.settle_once()
                    sleep_s = self._sleep_s()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # a database hiccup must not end the crons
                    log.error("cron_pass_failed", error=repr(exc))
                    sleep_s = self.poll_s
                try:
                    async with asyncio.timeout(sleep_s):
                        await finished.queue.get()
                except TimeoutError:
                    pass
                while not finished.queue.empty():
                    finished.queue.get_nowait()
