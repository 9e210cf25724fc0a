"""Settling: the transactions that close an attempt's story on its task.

``finish`` ends a task the worker itself ended (or that never launched);
``settle`` applies the outcome of a stop that was proven; ``unconfirmed`` parks
the task in ``needs_reconciliation`` with that outcome kept for RetryCleanup.
The rules are in ``domain``; this commits them and tells watchers.
"""

from __future__ import annotations

from services.scheduler import domain
from services.scheduler.domain import Attempt, Failure, PendingOutcome, Result, State, Task
from services.scheduler.runtime import Runtime


class Settler:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    async def finish(
        self,
        task_id: str,
        state: State,
        failure: Failure | None,
        *,
        result: Result | None = None,
        attempt: Attempt | None = None,
        only_from: tuple[State, ...] | None = None,
        keep_reported_result: bool = False,
    ) -> Task:
        """``keep_reported_result``: the worker exited 0, so the task completes with the result it
        reported — read in the same transaction, so a report racing the exit is not lost."""
        rt = self.rt
        now = rt.clock.now_ms()

        def change(t: Task) -> Task | None:
            final = domain.exit_result(state, t.result) if keep_reported_result else result
            return t if domain.finish(t, state, now, failure, final, only_from) else None

        task, stored = await rt.store.update_task(task_id, change, "task.state_changed", now, attempt=attempt)
        if stored is None and attempt is not None:
            await rt.store.save_attempt(attempt)
        rt.published(stored, task)
        return task

    async def settle(self, task_id: str, outcome: PendingOutcome, attempt: Attempt | None) -> Task:
        rt = self.rt
        now = rt.clock.now_ms()

        def change(t: Task) -> Task | None:
            return t if domain.settle(t, outcome, now) else None

        task, stored = await rt.store.update_task(task_id, change, "task.state_changed", now, attempt=attempt)
        rt.published(stored, task)
        return task

    async def unconfirmed(self, task_id: str, outcome: PendingOutcome, attempt: Attempt, detail: str) -> Task:
        rt = self.rt
        now = rt.clock.now_ms()

        def change(t: Task) -> Task | None:
            return t if domain.mark_unconfirmed(t, outcome, detail, now) else None

        task, stored = await rt.store.update_task(task_id, change, "task.state_changed", now, attempt=attempt)
        rt.published(stored, task)
        return task
