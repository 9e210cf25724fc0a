"""The notifier's history retention, batch by batch (``libs.retention``), each kind off by
default (0 keeps everything):

- ``[notifier] notification_retention_ms``: notifications done with that long after they were
  made go with their delivery attempts (``NotifierStore.prune_notifications``);
- ``[notifier] conversation_retention_ms``: the conversation's history messages, the final
  response snapshots behind them and its conversation events that old
  (``NotifierStore.prune_conversations``).

The activity stream has its own bounds (``activity_retention_*``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import structlog

from libs.clock import Clock
from libs.retention import in_batches, run_passes
from services.notifier.metrics import CONVERSATION_ROWS_PRUNED, NOTIFICATIONS_PRUNED
from services.notifier.store import PRUNE_BATCH, ConversationsPruned, NotificationsPruned, NotifierStore

log = structlog.get_logger("notifier")

B = TypeVar("B")  # one batch's counts
T = TypeVar("T")  # a pass's totals: the batch's fields summed, and the batches


@dataclass
class NotificationsPrunedTotal:
    notifications: int = 0
    attempts: int = 0
    batches: int = 0


@dataclass
class ConversationsPrunedTotal:
    messages: int = 0
    responses: int = 0
    events: int = 0
    batches: int = 0


class _Retention(Generic[B, T]):
    """Passes of one kind of history: each deletes batch after batch (``prune``, given the
    cutoff and the batch size) until one finds nothing old (``found``), then counts and logs
    what went."""

    total: Callable[..., T]  # a pass's totals from the batches' summed fields and their number
    event: str  # the log line of a pass that deleted something
    failure_event: str

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

    async def prune(self, cutoff: int, limit: int) -> B:
        raise NotImplementedError

    def found(self, batch: B) -> int:
        """The old rows a batch found (none: the pass is over)."""
        raise NotImplementedError

    def counted(self, total: T) -> None:
        """Add a pass's deletions to the service's metrics."""

    async def loop(self) -> None:
        await run_passes(self.retention_ms, self.prune_once, self.clock.now_ms, self.stop, log, self.failure_event)

    async def prune_once(self, now_ms: int) -> T:
        cutoff = now_ms - self.retention_ms
        began = time.perf_counter()
        batches = await in_batches(lambda: self.prune(cutoff, self.batch), self.found, self.stop)
        sums: dict[str, int] = {}
        for found in batches:  # each field summed over the batches
            for name, rows in dataclasses.asdict(found).items():  # type: ignore[call-overload]
                sums[name] = sums.get(name, 0) + rows
        total = self.total(**sums, batches=len(batches))
        if batches:
            self.counted(total)
            log.info(self.event, **vars(total), seconds=round(time.perf_counter() - began, 3))
        return total


class NotificationRetention(_Retention[NotificationsPruned, NotificationsPrunedTotal]):
    total = NotificationsPrunedTotal
    event = "notifications_pruned"
    failure_event = "notification_prune_failed"

    async def prune(self, cutoff: int, limit: int) -> NotificationsPruned:
        return await self.store.prune_notifications(cutoff, limit)

    def found(self, batch: NotificationsPruned) -> int:
        return batch.notifications

    def counted(self, total: NotificationsPrunedTotal) -> None:
        NOTIFICATIONS_PRUNED.inc(total.notifications)


class ConversationRetention(_Retention[ConversationsPruned, ConversationsPrunedTotal]):
    total = ConversationsPrunedTotal
    event = "conversations_pruned"
    failure_event = "conversation_prune_failed"

    async def prune(self, cutoff: int, limit: int) -> ConversationsPruned:
        return await self.store.prune_conversations(cutoff, limit)

    def found(self, batch: ConversationsPruned) -> int:
        return batch.messages + batch.events

    def counted(self, total: ConversationsPrunedTotal) -> None:
        for kind, rows in (("message", total.messages), ("response", total.responses), ("event", total.events)):
            if rows:
                CONVERSATION_ROWS_PRUNED.labels(kind=kind).inc(rows)
