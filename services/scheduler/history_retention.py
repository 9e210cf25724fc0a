"""Finished-task retention: tasks that finished ``[tasks] finished_task_retention_ms`` ago
are deleted with their events and attempts (``SchedulerStore.prune_finished``).

Off by default (0 keeps every task): deleting a user's history is the operator's choice.
When set, the scheduler looks once soon after it starts and then hourly (every tenth of a
shorter retention), and deletes in batches, each its own short transaction with a pause as
long after it, so the lifecycle's commits go on between them. Every replica on one
PostgreSQL may run it: a batch skips the rows another one holds.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import structlog

from services.scheduler.metrics import TASKS_PRUNED
from services.scheduler.runtime import Runtime
from services.scheduler.store import PRUNE_BATCH

log = structlog.get_logger("scheduler")

PRUNE_INTERVAL_S = 3600.0
FIRST_PRUNE_AFTER_S = 60.0  # after start-up's recovery and first launches
MIN_INTERVAL_S = 1.0
MIN_PAUSE_S = 0.002


def pass_interval_s(retention_ms: int) -> float:
    """Hourly, or a tenth of a shorter retention (at least a second): a task goes within
    a tenth of its retention after it is due."""
    return min(PRUNE_INTERVAL_S, max(MIN_INTERVAL_S, retention_ms / 10_000))


@dataclass
class HistoryPruned:
    tasks: int = 0
    events: int = 0
    attempts: int = 0
    batches: int = 0


class HistoryRetention:
    def __init__(self, rt: Runtime, batch: int = PRUNE_BATCH) -> None:
        self.rt = rt
        self.batch = batch

    async def loop(self) -> None:
        retention_ms = self.rt.tasks_cfg.finished_task_retention_ms
        if not retention_ms:
            return  # 0: every finished task is kept
        interval = pass_interval_s(retention_ms)
        delay = min(FIRST_PRUNE_AFTER_S, interval)
        while not self.rt.closing:
            await asyncio.sleep(delay)
            delay = interval
            try:
                await self.prune_once(self.rt.clock.now_ms())
            except Exception:
                log.exception("finished_task_prune_failed")

    async def prune_once(self, now_ms: int) -> HistoryPruned:
        """Delete, batch after batch, the tasks that finished before ``now_ms`` less the
        retention. A batch that deletes nothing ends the pass (what is left is kept for now:
        a sub-task still running, a question still to close)."""
        rt = self.rt
        cutoff = now_ms - rt.tasks_cfg.finished_task_retention_ms
        began = time.perf_counter()
        total = HistoryPruned()
        while not rt.closing:
            batch_began = time.perf_counter()
            pruned = await rt.store.prune_finished(cutoff, self.batch)
            if not pruned.tasks:
                break
            # As long again before the next batch: the lifecycle's commits, which wait for the
            # database thread while a batch holds it, get at least half of it during a pass.
            await asyncio.sleep(max(MIN_PAUSE_S, time.perf_counter() - batch_began))
            total.tasks += pruned.tasks
            total.events += pruned.events
            total.attempts += pruned.attempts
            total.batches += 1
            TASKS_PRUNED.inc(pruned.tasks)
        if total.tasks:
            log.info(
                "finished_tasks_pruned",
                tasks=total.tasks,
                events=total.events,
                attempts=total.attempts,
                batches=total.batches,
                seconds=round(time.perf_counter() - began, 3),
            )
        return total
