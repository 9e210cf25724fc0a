"""Notification retention: notifications done with ``[notifier] notification_retention_ms``
after they were made are deleted with their delivery attempts
(``NotifierStore.prune_notifications``), batch by batch (``libs.retention``).

Off by default (0 keeps them). The conversation's messages are its history and stay; the
activity stream has its own bounds (``activity_retention_*``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from libs.clock import Clock
from libs.retention import in_batches, run_passes
from services.notifier.metrics import NOTIFICATIONS_PRUNED
from services.notifier.store import PRUNE_BATCH, NotifierStore

log = structlog.get_logger("notifier")


@dataclass
class NotificationsPrunedTotal:
    notifications: int = 0
    attempts: int = 0
    batches: int = 0


class NotificationRetention:
    def __init__(
        self,
        store: NotifierStore,
        retention_ms: int,
        clock: Clock,
        stop: Callable[[], bool] = lambda: False,
        batch: int = PRUNE_BATCH,
    ) -> None:
        self.store = store
        self.retention_ms = retention_ms
        self.clock = clock
        self.stop = stop
        self.batch = batch

    async def loop(self) -> None:
        await run_passes(
            self.retention_ms, self.prune_once, self.clock.now_ms, self.stop, log, "notification_prune_failed"
        )

    async def prune_once(self, now_ms: int) -> NotificationsPrunedTotal:
        cutoff = now_ms - self.retention_ms
        began = time.perf_counter()
        batches = await in_batches(
            lambda: self.store.prune_notifications(cutoff, self.batch), lambda p: p.notifications, self.stop
        )
        total = NotificationsPrunedTotal(
            notifications=sum(b.notifications for b in batches),
            attempts=sum(b.attempts for b in batches),
            batches=len(batches),
        )
        if total.notifications:
            NOTIFICATIONS_PRUNED.inc(total.notifications)
            log.info(
                "notifications_pruned",
                notifications=total.notifications,
                attempts=total.attempts,
                batches=total.batches,
                seconds=round(time.perf_counter() - began, 3),
            )
        return total
