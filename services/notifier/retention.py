"""The notifier's history retention, batch by batch (``libs.retention``), each kind off by
default (0 keeps everything):

- ``[notifier] notification_retention_ms``: notifications done with that long after they were
  made go with their delivery attempts (``NotifierStore.prune_notifications``);
- ``[notifier] conversation_retention_ms``: the conversation's history messages, the final
  response snapshots behind them, its conversation events and its settled questions' reminder
  rows that old (``NotifierStore.prune_conversations``).

The activity stream has its own bounds (``activity_retention_*``).
"""

from __future__ import annotations

from dataclasses import dataclass

import structlog

from libs.retention import Retention
from services.notifier.metrics import CONVERSATION_ROWS_PRUNED, NOTIFICATIONS_PRUNED
from services.notifier.store import ConversationsPruned, NotificationsPruned, NotifierStore

log = structlog.get_logger("notifier")


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
    reminders: int = 0
    batches: int = 0


class NotificationRetention(Retention[NotifierStore, NotificationsPruned, NotificationsPrunedTotal]):
    log = log
    total = NotificationsPrunedTotal
    event = "notifications_pruned"
    failure_event = "notification_prune_failed"

    async def prune(self, cutoff: int, limit: int) -> NotificationsPruned:
        return await self.store.prune_notifications(cutoff, limit)

    def found(self, batch: NotificationsPruned) -> int:
        return batch.notifications

    def counted(self, total: NotificationsPrunedTotal) -> None:
        NOTIFICATIONS_PRUNED.inc(total.notifications)


class ConversationRetention(Retention[NotifierStore, ConversationsPruned, ConversationsPrunedTotal]):
    log = log
    total = ConversationsPrunedTotal
    event = "conversations_pruned"
    failure_event = "conversation_prune_failed"

    async def prune(self, cutoff: int, limit: int) -> ConversationsPruned:
        return await self.store.prune_conversations(cutoff, limit)

    def found(self, batch: ConversationsPruned) -> int:
        return batch.messages + batch.events + batch.reminders

    def counted(self, total: ConversationsPrunedTotal) -> None:
        kinds = ("message", total.messages), ("response", total.responses), ("event", total.events)
        for kind, rows in (*kinds, ("question_reminder", total.reminders)):
            if rows:
                CONVERSATION_ROWS_PRUNED.labels(kind=kind).inc(rows)
