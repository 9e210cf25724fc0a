"""Worker reports and questions: what a worker tells the scheduler over ``WorkerService``.

Every call is authenticated by the attempt's token (only its hash is kept). A
report changes the task in one transaction (rules in ``domain``); a question is
relayed to the pending-registry and the task waits for input until the worker
has its answer.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

from libs import errors
from services.scheduler import domain
from services.scheduler.domain import Attempt, Task, ToolEvent, Usage
from services.scheduler.runtime import LiveAttempt, QuestionsPort, Runtime, hash_token


class WorkerReports:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def authenticate(self, token: str) -> LiveAttempt:
        live = self.rt.by_token.get(hash_token(token)) if token else None
        if live is None:
            raise domain.WorkerDenied("INVALID_WORKER_TOKEN", "unknown or stale worker token")
        return live

    async def assignment(self, token: str) -> tuple[Task, Attempt]:
        live = self.authenticate(token)
        attempt = live.attempt
        task = await self.rt.store.get_task(attempt.task_id)
        if attempt.first_contact_at is None:
            attempt.first_contact_at = self.rt.clock.now_ms()
            await self.rt.store.save_attempt(attempt)
        return task, attempt

    async def _report(self, token: str, event_type: str, apply: Callable[[Task, int], None]) -> Task:
        live = self.authenticate(token)
        now = self.rt.clock.now_ms()
        if live.attempt.first_contact_at is None:
            live.attempt.first_contact_at = now

        def change(t: Task) -> Task | None:
            domain.check_reporting(t)
            apply(t, now)
            return t

        task, stored = await self.rt.store.update_task(live.attempt.task_id, change, event_type, now)
        self.rt.published(stored, task)
        return task

    async def report_progress(self, token: str, text: str) -> None:
        text = domain.clamp_progress(text)
        await self._report(token, "task.progress", lambda t, now: domain.apply_progress(t, text, now))

    async def report_tool(self, token: str, name: str, status: str, exit_code: int | None) -> None:
        domain.validate_tool(name, status)
        keep = self.rt.tasks_cfg.recent_tools

        def apply(t: Task, now: int) -> None:
            domain.apply_tool(t, ToolEvent(name=name, status=status, at=now, exit_code=exit_code), keep)

        await self._report(token, "task.tool", apply)

    async def report_touched(self, token: str, paths: list[str]) -> None:
        domain.validate_paths(paths)
        keep = self.rt.tasks_cfg.observed_paths

        def apply(t: Task, now: int) -> None:
            domain.apply_touched(t, paths, keep)
            domain.touched_at(t, now)

        await self._report(token, "task.tool", apply)

    async def report_usage(self, token: str, usage: Usage, delta: bool = False) -> None:
        domain.validate_usage(usage)
        live = self.authenticate(token)
        task = await self.rt.store.get_task(live.attempt.task_id)
        domain.check_reporting(task)
        live.attempt.usage = domain.merge_usage(live.attempt.usage, usage, delta)
        await self.rt.store.save_attempt(live.attempt)

    async def report_result(self, token: str, text: str, unresolved_background: bool) -> None:
        domain.validate_result(text)

        def apply(t: Task, now: int) -> None:
            domain.apply_result(t, text, unresolved_background, now)

        await self._report(token, "task.progress", apply)

    # --- questions -----------------------------------------------------------

    def _questions(self) -> QuestionsPort:
        if self.rt.questions is None:
            raise errors.Unavailable("PENDING_REGISTRY_UNAVAILABLE", "no pending-registry is configured")
        return self.rt.questions

    async def ask_question(self, token: str, text: str) -> domain.PendingQuestion:
        """Relay a worker's question; the task waits for input until the worker has the answer."""
        domain.validate_question(text)
        questions = self._questions()
        live = self.authenticate(token)
        task = await self.rt.store.get_task(live.attempt.task_id)
        domain.check_can_ask(task)
        event_type = "task.question"
        if task.pending_question is not None and task.pending_question.text == text:
            # The same question again, e.g. from a resumed attempt: no new question (nor a
            # second notification), but the task waits for input again (it resumed running).
            pending = task.pending_question
            event_type = "task.state_changed"
        else:
            request_id = f"{live.attempt.attempt_id}-{hashlib.sha256(text.encode()).hexdigest()[:24]}"
            task = await self.rt.store.mark_may_have_asked(task, self.rt.clock.now_ms())
            question = await questions.ask(task.task_id, task.session_id, text, request_id)
            pending = domain.PendingQuestion(question_id=question.question_id, text=text, revision=question.revision)
        if task.state == domain.State.WAITING_INPUT and task.pending_question == pending:
            return pending
        now = self.rt.clock.now_ms()
        task, stored = await self.rt.store.update_task(
            task.task_id, lambda t: domain.wait_for_input(t, pending, now), event_type, now
        )
        self.rt.published(stored, task)
        return pending

    async def await_answer(self, token: str, question_id: str, wait_s: float) -> str | None:
        """The answer once saved (the task then runs again), or None when ``wait_s`` passed."""
        questions = self._questions()
        live = self.authenticate(token)
        task = await self.rt.store.get_task(live.attempt.task_id)
        domain.check_current_question(task, question_id)
        question = await questions.await_answer(question_id, wait_s)
        if question is None:
            return None
        if not question.answer:
            raise domain.InvalidTransition("QUESTION_CLOSED", "the question was closed without an answer")
        now = self.rt.clock.now_ms()

        def change(t: Task) -> Task | None:
            return t if domain.answer_delivered(t, question_id, now) else None

        task, stored = await self.rt.store.update_task(task.task_id, change, "task.state_changed", now)
        self.rt.published(stored, task)
        return str(question.answer)
