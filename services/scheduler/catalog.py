"""Creating and reading tasks: admission of a new task, one task, a session's page."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from libs import errors
from libs.ids import time_ordered_id
from services.scheduler import domain
from services.scheduler.domain import Attempt, NewTask, State, Task
from services.scheduler.runtime import Runtime
from services.scheduler.worker_log import LogTail, read_tail, validate_tail_request


@dataclass(frozen=True)
class TaskPage:
    page: int
    pages: int
    total: int
    tasks: list[Task]


class TaskCatalog:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    async def create_task(self, request: NewTask) -> Task:
        rt = self.rt
        task, stored = await rt.store.create_task(self.new_task(request))
        if stored is not None:
            rt.never_asked.add(task.task_id)
        rt.published(stored, task)
        rt.wake.set()
        return task

    def new_task(self, request: NewTask) -> Task:
        """The queued task a request makes (validated), not stored yet."""
        rt = self.rt
        request = domain.validate_new_task(request, set(rt.settings.workers))
        now = rt.clock.now_ms()
        profile = rt.settings.workers[request.profile]
        workspace = Path(profile.workspace) if profile.workspace else rt.settings.agent_workspace(request.agent_id)
        return Task(
            task_id=time_ordered_id(now),
            agent_id=request.agent_id,
            session_id=request.session_id,
            title=request.title,
            instructions=request.instructions,
            profile=request.profile,
            state=State.QUEUED,
            created_at=now,
            updated_at=now,
            request_id=request.request_id,
            harness=request.harness or profile.harness,
            harness_model=request.harness_model or profile.harness_model,
            workspace_mode="profile" if profile.workspace else "agent",
            workspace_path=str(workspace),
        )

    async def get_task(self, task_id: str) -> tuple[Task, list[Attempt]]:
        domain.validate_task_id(task_id)
        return await self.rt.store.task_with_attempts(task_id)

    async def worker_log(self, task_id: str, attempt_number: int, tail_bytes: int) -> LogTail:
        """The tail of an attempt's log (``attempt_number`` 0: the latest attempt)."""
        domain.validate_task_id(task_id)
        wanted = validate_tail_request(attempt_number, tail_bytes)
        _, attempts = await self.rt.store.task_with_attempts(task_id)
        numbers = {a.number for a in attempts}
        number = attempt_number or max(numbers, default=0)
        if number == 0:
            return LogTail(0, b"", 0)
        if number not in numbers:
            raise errors.NotFound("ATTEMPT_NOT_FOUND", f"the task has no attempt {number}")
        return await asyncio.to_thread(read_tail, self.rt.settings.data_dir, task_id, number, wanted)

    async def list_tasks(
        self, agent_id: str, session_id: str, page: int, page_size: int, include_finished: bool
    ) -> TaskPage:
        domain.validate_id("agentId", agent_id)
        domain.validate_id("sessionId", session_id)
        request = domain.validate_page(page, page_size)
        clamped: dict[str, int] = {}

        def clamp(total: int) -> int:
            clamped["page"], clamped["pages"] = domain.clamp_page(request, total)
            return clamped["page"]

        total, tasks = await self.rt.store.list_tasks(
            agent_id, session_id, include_finished, request.page, request.page_size, clamp
        )
        return TaskPage(clamped["page"], clamped["pages"], total, tasks)
