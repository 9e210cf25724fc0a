"""Notification retention: notifications done with ``[notifier] notification_retention_ms``
after they were made are deleted with their delivery attempts
(``NotifierStore.prune_notifications``), batch by batch (``libs.retention``).

Off by default (0 keeps them). The conversation's messages are its history and stay; the
activity stream has its own bounds (``activity_retention_*``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from libs.clock import Clock
from libs.retention import in_batches, pass_interval_s
from services.notifier.metrics import NOTIFICATIONS_PRUNED
from services.notifier.store import PRUNE_BATCH, NotifierStore

log = structlog.get_logger("notifier")

FIRST_PRUNE_AFTER_S = 60.0


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
        if not self.retention_ms:
            return  # 0: every notification is kept
        interval = pass_interval_s(self.retention_ms)
        delay = min(FIRST_PRUNE_AFTER_S, interval)
        while not self.stop():
            await asyncio.sleep(delay)
            delay = interval
            try:
                await self.prune_once(self.clock.now_ms())
            except Exception:
                log.exception("notification_prune_failed")

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
