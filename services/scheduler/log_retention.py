"""Worker log retention: logs not written to for ``[tasks] worker_log_retention_ms`` are deleted.

One file per attempt: at a few hundred tasks a second that is tens of millions of files a
day, and a folder that large slows every launch's file create. The scheduler looks once
soon after it starts and then hourly (every tenth of a shorter retention: ``libs.retention``),
on a thread; a task running on this host keeps its logs however quiet its worker has been.
"""

from __future__ import annotations

import asyncio
import time

import structlog

from libs.retention import run_passes
from services.scheduler import worker_log
from services.scheduler.runtime import Runtime

log = structlog.get_logger("scheduler")


class LogRetention:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    async def loop(self) -> None:
        rt = self.rt
        # The wall clock, not the runtime's: files' times are compared.
        await run_passes(
            rt.tasks_cfg.worker_log_retention_ms,
            lambda now_ms: self.prune_once(now_ms / 1000),
            lambda: int(time.time() * 1000),
            lambda: rt.closing,
            log,
            "worker_log_prune_failed",
        )

    async def prune_once(self, now_s: float) -> worker_log.Pruned:
        """Delete the logs older than the retention as of ``now_s`` (epoch seconds, as file times are)."""
        rt = self.rt
        retention_s = rt.tasks_cfg.worker_log_retention_ms / 1000
        live = frozenset(rt.live)  # read on the loop: the thread gets a snapshot
        began = time.perf_counter()
        pruned = await asyncio.to_thread(
            worker_log.prune, rt.settings.data_dir, now_s - retention_s, live, lambda: rt.closing
        )
        if pruned.files or pruned.kept_live:
            log.info(
                "worker_logs_pruned",
                files=pruned.files,
                bytes=pruned.bytes,
                kept_live=pruned.kept_live,
                seconds=round(time.perf_counter() - began, 3),
            )
        return pruned
