"""Task questions: asked by a worker, answered by a person, awaited by the worker.

The answer is committed before any waiter is woken. Waiters are asyncio futures
keyed by question id; a waiter registers before it reads the row, so an answer
committed in between still reaches it. After a restart a waiter simply calls
again and reads the stored answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from libs.log import get_logger
from services.pending_registry import domain
from services.pending_registry.domain import AnswerAttempt, NewQuestion, Question, QuestionState
from services.pending_registry.metrics import QUESTIONS
from services.pending_registry.store import PendingStore

log = get_logger("pending_registry.questions")


class Questions:
    def __init__(self, store: PendingStore, clock: Callable[[], int]) -> None:
        self.store = store
        self.clock = clock
        self._waiters: dict[str, set[asyncio.Future[Question]]] = {}
        self._closing = False

    async def ask(self, new: NewQuestion) -> Question:
        domain.validate_new_question(new)
        question, replaced, created = await self.store.ask_question(new, self.clock())
        if replaced is not None:
            self._wake(replaced)
        if created:
            QUESTIONS.labels("asked").inc()
            log.info(
                "question_asked",
                task_id=question.task_id,
                question_id=question.question_id,
                revision=question.revision,
                replaced=replaced.question_id if replaced else None,
            )
        return question

    async def get(self, question_id: str) -> Question:
        domain.validate_uuid("questionId", question_id)
        question = await self.store.get_question(question_id)
        if question is None:
            raise domain.question_not_found(question_id)
        return question

    async def answer(self, attempt: AnswerAttempt) -> tuple[Question, bool]:
        """(the answered question, replayed: it already had this very answer)."""
        domain.validate_answer_attempt(attempt)
        question, changed = await self.store.answer_question(attempt, self.clock())
        if changed:
            QUESTIONS.labels("answered").inc()
            log.info(
                "question_answered",
                task_id=question.task_id,
                question_id=question.question_id,
                revision=question.revision,
            )
            self._wake(question)
        return question, not changed

    async def await_answer(self, question_id: str) -> Question:
        """The question once it is no longer open (answered, replaced or cancelled)."""
        domain.validate_uuid("questionId", question_id)
        if self._closing:
            raise domain.shutting_down()
        waiter: asyncio.Future[Question] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(question_id, set()).add(waiter)
        try:
            question = await self.store.get_question(question_id)
            if question is None:
                raise domain.question_not_found(question_id)
            if question.state != QuestionState.OPEN:
                return question
            return await waiter
        finally:
            waiters = self._waiters.get(question_id)
            if waiters is not None:
                waiters.discard(waiter)
                if not waiters:
                    del self._waiters[question_id]
            if waiter.done() and not waiter.cancelled():
                waiter.exception()  # retrieved: no "never retrieved" warning

    async def cancel_task(self, task_id: str) -> list[Question]:
        domain.validate_uuid("taskId", task_id)
        cancelled = await self.store.cancel_questions(task_id, self.clock())
        for question in cancelled:
            log.info("question_cancelled", task_id=task_id, question_id=question.question_id)
            self._wake(question)
        return cancelled

    async def close(self) -> None:
        """Wake every waiter with UNAVAILABLE: it calls again after reconnecting."""
        self._closing = True
        for waiters in list(self._waiters.values()):
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_exception(domain.shutting_down())

    @property
    def waiter_count(self) -> int:
        return sum(len(w) for w in self._waiters.values())

    def _wake(self, question: Question) -> None:
        for waiter in self._waiters.pop(question.question_id, set()):
            if not waiter.done():
                waiter.set_result(question)
