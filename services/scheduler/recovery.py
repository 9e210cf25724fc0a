"""Start-up recovery: settle what an earlier incarnation of the scheduler left behind.

Launches it had not committed (attempt rows still ``launching``) are stopped;
tasks it left active go ``recovering``, their worker is stopped (identity-checked)
and, once that is proven, they are resumed (``domain.resume_after_interruption``)
or, when not, wait in ``needs_reconciliation``.
"""

from __future__ import annotations

import asyncio

import structlog

from services.scheduler import domain, processes
from services.scheduler.domain import ACTIVE, PendingOutcome, State, Task
from services.scheduler.runtime import Runtime
from services.scheduler.settling import Settler
from services.scheduler.stopping import Stopper

log = structlog.get_logger("scheduler")


class Recovery:
    def __init__(self, rt: Runtime, settler: Settler, stopper: Stopper) -> None:
        self.rt = rt
        self.settler = settler
        self.stopper = stopper

    async def recover_launches(self) -> None:
        """Stop what remains of launches an earlier incarnation had not committed.

        Its task is still queued. The attempt's cgroup (cgroup mode) says what may remain:
        its pid commits only with `running` (a row of an older version may have one, and
        then it is stopped by it too); the held trampoline exits when its pipe closes. Once
        that is proven gone the task is dispatched again, else it needs reconciliation.
        """
        rt = self.rt
        for attempt in await rt.store.launching_attempts():
            if attempt.boot_id == rt.boot_id or attempt.host_id not in (None, rt.host_id) and rt.multi_host:
                continue  # this incarnation's, or another host's (only that host can look)
            status = await self.stopper.stop_tree(attempt)
            attempt.state, attempt.outcome = "ended", "launch_interrupted"
            attempt.ended_at = attempt.ended_at or rt.clock.now_ms()
            log.info("recovered_launch", task_id=attempt.task_id, pid=attempt.pid, confirmed=status.gone)
            if status.gone:
                await rt.store.save_attempt(attempt)
                continue
            await self.settler.unconfirmed(attempt.task_id, domain.interrupted_outcome(), attempt, status.describe())

    async def adopt_legacy_failures(self) -> int:
        """Resume tasks an older version left ``failed`` ``GATEWAY_SHUTDOWN`` (seed 004).

        Only a failure less than ten minutes old, with resumes left in its revision, and whose
        report the notifier confirms no one received (it then never sends it) is queued again,
        the way a shutdown re-queue does. Returns how many candidates are still undecided
        because the notifier could not be asked (the caller tries again).
        """
        rt = self.rt
        reports = rt.failure_reports
        if reports is None:
            return 0
        undecided = 0
        now = rt.clock.now_ms()
        for task, sequence in await rt.store.legacy_shutdown_failures(now - domain.LEGACY_ADOPTION_WINDOW_MS):
            if not domain.legacy_shutdown_adoptable(task, now):
                continue
            try:
                claimed = await reports.claim_unreported_failure(task, sequence)
            except Exception as exc:  # noqa: BLE001 - the notifier is down: ask again later
                undecided += 1
                log.warning("legacy_adoption_deferred", task_id=task.task_id, error=str(exc))
                continue
            if not claimed:
                log.info("legacy_failure_already_reported", task_id=task.task_id)
                continue
            at = rt.clock.now_ms()

            def adopt(t: Task, at: int = at) -> Task | None:
                return domain.adopt_legacy_shutdown(t, at)

            adopted, stored = await rt.store.update_task(
                task.task_id, adopt, "task.state_changed", at, legacy_adoption=True
            )
            rt.published(stored, adopted)
            if stored is not None:
                log.info("legacy_failure_adopted", task_id=task.task_id, resumes=adopted.restart_resume)
                rt.wake.set()
        return undecided

    async def legacy_adoption_loop(self, first_retry_s: float = 1.0, max_retry_s: float = 15.0) -> None:
        """Adopt at start-up, then again while the notifier could not be asked; the ten-minute
        window ends the candidates, so the loop ends too."""
        delay = first_retry_s
        while True:
            try:
                if await self.adopt_legacy_failures() == 0:
                    return
            except Exception:  # noqa: BLE001 - e.g. the database: try again
                log.exception("legacy_adoption_failed")
            await asyncio.sleep(delay)
            delay = min(delay * 2, max_retry_s)

    async def recover(self) -> None:
        """Settle tasks an earlier incarnation left active: stop its worker, then resume."""
        rt = self.rt
        await self.recover_launches()
        await self.reconcile_host_lost()
        # Several hosts: only this host's tasks (the others' workers are not on this machine).
        for task in await rt.store.tasks_in_states(ACTIVE, owner=rt.own):
            if task.gateway_managed:
                continue  # no worker to stop; its outcome may still come (else its deadline ends it)
            attempts = await rt.store.attempts_of(task.task_id)
            attempt = attempts[-1] if attempts else None
            if attempt is not None and attempt.boot_id == rt.boot_id:
                continue
            outcome = domain.recovery_outcome(task)
            now = rt.clock.now_ms()
            if task.state != State.RECOVERING:

                def to_recovering(t: Task, at: int = now) -> Task:
                    return domain.start_recovering(t, at)

                task, stored = await rt.store.update_task(task.task_id, to_recovering, "task.state_changed", now)
                rt.published(stored, task)
            if attempt is None:
                await self.settler.settle(task.task_id, outcome, None)
                continue
            before = await asyncio.to_thread(processes.look, attempt, rt.ownership.stop_context())
            if outcome.state == State.QUEUED and domain.finished_before_crash(task, attempt, before.gone):
                # Its worker reported the result and exited; only the exit's record was lost.
                outcome = PendingOutcome(state=State.COMPLETED, result=task.result)
                attempt.outcome = attempt.outcome or "exited"
            status = await self.stopper.stop_tree(attempt)
            attempt.outcome = attempt.outcome or "interrupted"
            attempt.state = "ended"
            attempt.ended_at = attempt.ended_at or now
            if status.gone:
                await self.settler.settle(task.task_id, outcome, attempt)
            else:
                await self.settler.unconfirmed(task.task_id, outcome, attempt, status.describe())
            log.info("recovered_task", task_id=task.task_id, confirmed=status.gone)

    async def reconcile_host_lost(self) -> int:
        """This host's tasks another replica marked HOST_LOST while it was away (or silent):
        their worker is looked for here, identity-checked; once proven gone the task goes where
        its recorded exit (or its kept outcome) leads — never re-run while it may be alive."""
        rt = self.rt
        if not rt.multi_host:
            return 0
        done = 0
        for task in await rt.store.tasks_in_states([State.NEEDS_RECONCILIATION], owner=rt.host_id):
            if not domain.host_lost_here(task, rt.host_id):
                continue
            if task.task_id in rt.live:
                # Only with its lease renewed again: else the next sweep would take it away again.
                if rt.clock.now_ms() < rt.lease_held_until:
                    done += await self._take_back_live(task.task_id)
                continue
            async with rt.locks[task.task_id]:
                task, attempts = await rt.store.task_with_attempts(task.task_id)
                if task.state != State.NEEDS_RECONCILIATION or task.task_id in rt.live:
                    continue
            attempt = attempts[-1] if attempts else None
            status = await self.stopper.stop_tree(attempt) if attempt is not None else None
            outcome = domain.host_lost_outcome(task, attempt)
            if attempt is not None:
                attempt.state = "ended"
                attempt.outcome = attempt.outcome or "interrupted"
                attempt.ended_at = attempt.ended_at or rt.clock.now_ms()
            async with rt.locks[task.task_id]:
                if status is None or status.gone:
                    await self.settler.settle(task.task_id, outcome, attempt)
                else:
                    assert attempt is not None
                    await self.settler.unconfirmed(task.task_id, outcome, attempt, status.describe())
            done += 1
            log.info("reconciled_host_lost", task_id=task.task_id, confirmed=status is None or status.gone)
        return done

    async def _take_back_live(self, task_id: str) -> int:
        """A task swept HOST_LOST while this host was only silent, whose worker this process
        still holds, not exited and not being stopped: it runs on here (``take_back_live``)."""
        rt = self.rt
        async with rt.locks[task_id]:
            live = rt.live.get(task_id)
            # Checked under the lock the exit waiter settles under: an exit already seen is
            # left to the next tick, which settles the task by it.
            if live is None or live.process is None or live.exited.is_set() or live.stopping:
                return 0
            now = rt.clock.now_ms()
            task, stored = await rt.store.update_task(
                task_id,
                lambda t: t if domain.take_back_live(t, rt.host_id, now) else None,
                "task.state_changed",
                now,
            )
            rt.published(stored, task)
        if stored is None:
            return 0
        log.warning("host_lost_task_taken_back", task_id=task_id, state=task.state.value, pid=live.attempt.pid)
        return 1
