"""Finished-task retention: tasks that finished ``[tasks] finished_task_retention_ms`` ago
are deleted with their events and attempts (``SchedulerStore.prune_finished``), and cron runs
that ended that long ago (``CronStore.prune_ended``).

Off by default (0 keeps every task): deleting a user's history is the operator's choice.
When set, the scheduler looks once soon after it starts and then hourly (every tenth of a
shorter retention), and deletes in batches (``libs.retention``) so the lifecycle's commits
go on between them. Every replica on one PostgreSQL may run it: a batch skips the rows
another one holds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import structlog

from libs.retention import in_batches, run_passes
from services.scheduler.cron_store import CronStore
from services.scheduler.metrics import CRON_RUNS_PRUNED, TASKS_PRUNED
from services.scheduler.runtime import Runtime
from services.scheduler.store import PRUNE_BATCH, PrunedTasks

log = structlog.get_logger("scheduler")

# The kept candidates one pass skips at most (an IN list in every later batch): past it the pass
# ends, and the next one starts over.
MAX_SKIPPED = 5000


@dataclass
class HistoryPruned:
    tasks: int = 0
    events: int = 0
    attempts: int = 0
    batches: int = 0
    kept: int = 0  # candidates kept for now (a sub-task below still running, the log's newest event)
    cron_runs: int = 0


class HistoryRetention:
    def __init__(self, rt: Runtime, batch: int = PRUNE_BATCH, runs: CronStore | None = None) -> None:
        """``runs``: the cron run history, pruned after the tasks (None: a database without it)."""
        self.rt = rt
        self.batch = batch
        self.runs = runs

    async def loop(self) -> None:
        rt = self.rt
        await run_passes(
            rt.tasks_cfg.finished_task_retention_ms,
            self.prune_once,
            rt.clock.now_ms,
            lambda: rt.closing,
            log,
            "finished_task_prune_failed",
        )

    async def prune_once(self, now_ms: int) -> HistoryPruned:
        """Delete, batch after batch, the tasks that finished before ``now_ms`` less the
        retention, until a batch finds none. A candidate kept (a sub-task below it still
        running, the log's newest event) is skipped by the batches after it, so however many
        there are they never hold back the others (up to ``MAX_SKIPPED`` in one pass)."""
        rt = self.rt
        cutoff = now_ms - rt.tasks_cfg.finished_task_retention_ms
        began = time.perf_counter()
        skip: set[str] = set()

        async def batch() -> PrunedTasks:
            pruned = await rt.store.prune_finished(cutoff, self.batch, skip)
            skip.update(pruned.kept)
            return pruned

        batches = await in_batches(
            batch, lambda pruned: pruned.tasks + len(pruned.kept), lambda: rt.closing or len(skip) > MAX_SKIPPED
        )
        runs = self.runs
        run_batches = (
            await in_batches(lambda: runs.prune_ended(cutoff, self.batch), lambda n: n, lambda: rt.closing)
            if runs is not None
            else []
        )
        total = HistoryPruned(
            tasks=sum(b.tasks for b in batches),
            events=sum(b.events for b in batches),
            attempts=sum(b.attempts for b in batches),
            batches=len(batches) + len(run_batches),
            kept=len(skip),
            cron_runs=sum(run_batches),
        )
        if total.tasks or total.cron_runs:
            TASKS_PRUNED.inc(total.tasks)
            CRON_RUNS_PRUNED.inc(total.cron_runs)
            log.info(
                "finished_tasks_pruned",
                tasks=total.tasks,
                events=total.events,
                attempts=total.attempts,
                cron_runs=total.cron_runs,
                batches=total.batches,
                kept=total.kept,
                seconds=round(time.perf_counter() - began, 3),
            )
        return total
