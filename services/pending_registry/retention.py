"""Question retention (``pending_question_retention_ms``; 0, the default, keeps everything).

The scheduler closes a task's questions when the task ends for good (``CancelQuestions``; a
task only paused keeps them for its resume), and the registry marks the task closed then. That
long after, the task's questions go — answered, cancelled or replaced alike — with the
marker, batch by batch (``libs.retention``). An ended task never asks again, so no question
revision starts over and no worker still waits on one.
"""

from __future__ import annotations

from dataclasses import dataclass

import structlog

from libs.retention import Retention
from services.pending_registry.metrics import QUESTIONS_PRUNED
from services.pending_registry.store import PendingStore, QuestionsPruned

log = structlog.get_logger("pending_registry")


@dataclass
class QuestionsPrunedTotal:
    tasks: int = 0
    questions: int = 0
    batches: int = 0


class QuestionRetention(Retention[PendingStore, QuestionsPruned, QuestionsPrunedTotal]):
    total = QuestionsPrunedTotal
    event = "questions_pruned"
    failure_event = "question_prune_failed"
    log = log

    async def prune(self, cutoff: int, limit: int) -> QuestionsPruned:
        return await self.store.prune_closed(cutoff, limit)

    def found(self, batch: QuestionsPruned) -> int:
        return batch.tasks

    def counted(self, total: QuestionsPrunedTotal) -> None:
        QUESTIONS_PRUNED.inc(total.questions)
