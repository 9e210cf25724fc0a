"""Closing a finished task's questions in the pending-registry, through an outbox.

The ending transaction writes a ``question_closes`` row (``store.update_task``); this loop
calls the registry until it confirms: at start-up (the sweep), when a task ends, and on a
timer. A failure is logged and retried with backoff, never fatal to the loop.
"""

from __future__ import annotations

import structlog

from services.scheduler import domain
from services.scheduler.runtime import Runtime, woken

log = structlog.get_logger("scheduler")


class QuestionCloser:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    async def run(self) -> None:
        interval = max(self.rt.tasks_cfg.supervisor_interval_ms / 1000, 0.05)
        while not self.rt.closing:
            try:
                await self.close_once()
            except Exception:
                log.exception("question_close_pass_failed")
            await woken(self.rt.questions_wake, interval)

    async def close_once(self) -> int:
        """Close the questions of finished tasks that are due; returns how many were confirmed."""
        questions = self.rt.questions
        if questions is None:
            return 0
        confirmed = 0
        now = self.rt.clock.now_ms()
        for task_id, attempts in await self.rt.store.due_question_closes(now):
            try:
                await questions.cancel_open(task_id)
            except Exception as exc:  # the registry is down or refused: try again later
                retry_ms = domain.question_close_retry_ms(attempts + 1)
                log.warning(
                    "question_close_failed", task_id=task_id, attempts=attempts + 1, retry_ms=retry_ms, error=str(exc)
                )
                await self.rt.store.question_close_failed(task_id, attempts + 1, now + retry_ms)
                continue
            await self.rt.store.question_close_done(task_id)
            confirmed += 1
        return confirmed
