"""Creating and reading tasks: admission of a new task, one task, a session's page."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import structlog

from libs import errors
from libs.ids import time_ordered_id
from libs.settings import WorkerProfile
from services.scheduler import admission, domain, skills
from services.scheduler.domain import Attempt, NewTask, State, Task
from services.scheduler.runtime import Runtime
from services.scheduler.store import StoredEvent
from services.scheduler.worker_log import LogTail, log_expired, read_tail, validate_tail_request


@dataclass(frozen=True)
class TaskPage:
    page: int
    pages: int
    total: int
    tasks: list[Task]


class TaskCatalog:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    async def create_task(self, request: NewTask, parent: Task | None = None) -> Task:
        """Admit and store a new task (``parent``: a worker's sub-task, see ``subtasks``).

        Everything that can refuse it runs before the row exists: validation, the harness the
        profile really runs, the skill and its arguments, the continued task, the Git project.
        """
        rt = self.rt
        settings = rt.settings
        if request.target is not None and parent is None:
            gateway_managed = self._gateway_managed_task(request)
            return self._created(*await rt.store.create_task(gateway_managed))
        skill_ref = None
        skill_cfg = None
        if request.skill_name is not None:
            skill_cfg = skills.lookup(settings.skills, request.skill_name)
            if request.profile and request.profile != skill_cfg.profile:
                raise domain.InvalidArgument(
                    "SKILL_PROFILE_MISMATCH",
                    f"skill {request.skill_name!r} runs profile {skill_cfg.profile!r}; leave profile out",
                    field="profile",
                )
            if request.instructions:
                raise domain.InvalidArgument(
                    "SKILL_INSTRUCTIONS", "a skill task takes arguments, not instructions", field="instructions"
                )
            request = replace(request, profile=skill_cfg.profile)
        earlier = None
        if request.continue_task_id is not None:
            domain.validate_task_id(request.continue_task_id)
            earlier = await rt.store.get_task(request.continue_task_id)
            domain.check_continuable(earlier, request.agent_id, request.session_id)
            if earlier.gateway_managed:
                raise domain.InvalidArgument(
                    "CONTINUE_NOT_SUPPORTED", "a gateway-managed task has no workspace to continue in"
                )
            if not request.profile:
                request = replace(request, profile=earlier.profile)
        request = domain.validate_new_task(request, settings.workers)
        profile = settings.workers[request.profile]
        domain.check_harness(
            request.profile, profile.harness, profile.harness_model, request.harness, request.harness_model
        )
        if skill_cfg is not None and request.skill_name is not None:
            args = skills.validate_args(request.skill_name, skill_cfg, request.skill_args_json)
            await skills.body(request.skill_name, skill_cfg)  # refuse now what the worker could not read
            skill_ref = skills.skill_ref(request.skill_name, skill_cfg, args)
        plan = await admission.plan_workspace(
            settings, request.profile, profile, request.agent_id, earlier, request.continue_task_id
        )
        now = rt.clock.now_ms()
        task_id = time_ordered_id(now)
        workspace = plan.path
        if plan.worktree_from is not None:
            workspace = admission.worktree_path(settings, task_id)
            await admission.create_worktree(plan.worktree_from, workspace)
        task = _queued_worker_task(request, profile, task_id, now, plan.mode, workspace)
        task.continue_task_id = request.continue_task_id
        task.skill = skill_ref
        if parent is not None:
            task.parent_task_id = parent.task_id
            task.root_task_id = parent.root_task_id or parent.task_id
            task.depth = parent.depth + 1
        created = False
        try:
            task, stored = await rt.store.create_task(task, continues=request.continue_task_id)
            created = task.task_id == task_id
        finally:
            if plan.worktree_from is not None and not created:
                await admission.remove_worktree(plan.worktree_from, workspace)  # refused, or a repeat won
        return self._created(task, stored)

    def _gateway_managed_task(self, request: NewTask) -> Task:
        """The queued task for an operator-configured target: no profile, workspace or worker."""
        rt = self.rt
        target = domain.validate_target_request(request)
        config = rt.settings.targets.get(target.name)
        if config is None:
            raise domain.InvalidArgument("UNKNOWN_TARGET", f"no target named {target.name!r}", field="target.name")
        if config.safemode and not target.safemode_cleared:
            # Grants and assignments live in the gateway (changed only by the operator CLI).
            raise domain.WorkerDenied(
                "SAFEMODE_NOT_GRANTED", f"target {target.name!r} is in safemode; no grant and assignment for this agent"
            )
        request = domain.validate_new_task(
            replace(request, profile=domain.DEFAULT_PROFILE, target=None), {domain.DEFAULT_PROFILE}
        )
        now = rt.clock.now_ms()
        task_id = time_ordered_id(now)
        return Task(
            task_id=task_id,
            agent_id=request.agent_id,
            session_id=request.session_id,
            title=request.title,
            instructions=request.instructions,
            profile=domain.GATEWAY_MANAGED,
            state=State.QUEUED,
            created_at=now,
            updated_at=now,
            request_id=request.request_id,
            workspace_mode="none",
            workspace_path="",
            may_have_asked=False,
            execution_type=domain.GATEWAY_MANAGED,
            gateway_target=domain.GatewayTarget(
                name=target.name,
                adapter=config.adapter,
                native_session_id=target.native_session_id,
                display_name=target.display_name or config.display_name,
                options={**config.options, **target.options},
                safemode_cleared=config.safemode and target.safemode_cleared,
            ),
            # The request id is the task id: the outcome callback finds its task by primary key.
            gateway_dispatch=domain.GatewayDispatch(request_id=task_id),
        )

    def _created(self, task: Task, stored: StoredEvent | None) -> Task:
        """A create committed (``stored`` None: an earlier task with its request id came back)."""
        rt = self.rt
        rt.published(stored, task)
        rt.wake.set()
        return task

    def admit_at_once(self, request: NewTask) -> Task | None:
        """The queued task ``create_task`` would store for ``request``, when admitting it needs
        no read, file or Git: no continuation, skill or worktree (those: None, for ``create_task``).
        Refuses what ``create_task`` would refuse, the same way."""
        if request.target is not None:
            return self._gateway_managed_task(request)
        if request.skill_name is not None or request.continue_task_id is not None:
            return None
        return self._shared_workspace_task(request)

    def _shared_workspace_task(self, request: NewTask) -> Task | None:
        """The validated queued task of a plain request, when its profile works in a shared
        workspace; None when the profile needs a Git worktree per task."""
        rt = self.rt
        request = domain.validate_new_task(request, rt.settings.workers)
        profile = rt.settings.workers[request.profile]
        if profile.workspace_policy != "shared":
            return None
        domain.check_harness(
            request.profile, profile.harness, profile.harness_model, request.harness, request.harness_model
        )
        now = rt.clock.now_ms()
        plan = admission.shared_workspace(rt.settings, profile, request.agent_id)
        return _queued_worker_task(request, profile, time_ordered_id(now), now, plan.mode, plan.path)

    async def create_admitted(self, tasks: list[Task]) -> list[Task | Exception]:
        """Store tasks ``admit_at_once`` made, in one group commit; each created task (or the
        earlier one with its request id), or its error, in order."""
        answers = await self.rt.store.create_tasks(tasks)
        return [answer if isinstance(answer, Exception) else self._created(*answer) for answer in answers]

    async def create_batch(self, requests: Sequence[tuple[NewTask, str]]) -> list[Task | Exception]:
        """Each request's created task, or what ``create_task`` would have raised for it, in order.

        Plain creates (most) are admitted at once and stored together in one group commit, this
        call waking once when they have committed; the others (a continuation, a skill, a Git
        worktree: reads, files, processes) go through ``create_task`` one by one, concurrently with
        them, each logging with its caller's request id (the second of each pair; "" for none)."""
        answers: list[Task | Exception | None] = [None] * len(requests)
        admitted: list[tuple[int, Task]] = []
        others: list[int] = []
        for i, (request, _) in enumerate(requests):
            try:
                task = self.admit_at_once(request)
            except Exception as exc:  # noqa: BLE001 - this create's refusal, as create_task's
                answers[i] = exc
                continue
            if task is None:
                others.append(i)
            else:
                admitted.append((i, task))
        one_by_one = asyncio.gather(*(self._create_one(*requests[i]) for i in others)) if others else None
        if admitted:
            for (i, _), answer in zip(admitted, await self.create_admitted([t for _, t in admitted]), strict=True):
                answers[i] = answer
        if one_by_one is not None:
            for i, answer in zip(others, await one_by_one, strict=True):
                answers[i] = answer
        done = [answer for answer in answers if answer is not None]
        if len(done) != len(requests):  # every path above answers its request: never a shifted reply
            raise RuntimeError(f"{len(requests) - len(done)} creates of a batch went unanswered")
        return done

    async def _create_one(self, request: NewTask, request_id: str) -> Task | Exception:
        if request_id:  # this create's own log lines carry its caller's request id
            structlog.contextvars.bind_contextvars(request_id=request_id)
        try:
            return await self.create_task(request)
        except Exception as exc:  # noqa: BLE001 - its answer, as create_task's caller would see it
            return exc

    def new_task(self, request: NewTask) -> Task:
        """The queued task a cron tick makes (validated), not stored yet: a plain worker task of
        a shared-workspace profile (no skill, continuation, target or Git worktree)."""
        task = self._shared_workspace_task(request)
        if task is None:
            raise domain.InvalidArgument(
                "CRON_WORKSPACE_UNSUPPORTED",
                f"profile {request.profile!r} needs a Git worktree per task",
                field="profile",
            )
        return task

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
        ended_at = next(a.ended_at for a in attempts if a.number == number)
        expired = log_expired(ended_at, self.rt.tasks_cfg.worker_log_retention_ms, self.rt.clock.now_ms())
        return await asyncio.to_thread(read_tail, self.rt.settings.data_dir, task_id, number, wanted, expired)

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


def _queued_worker_task(
    request: NewTask, profile: WorkerProfile, task_id: str, now: int, workspace_mode: str, workspace: Path
) -> Task:
    """A new worker task as admitted: queued, in its workspace, on the harness its profile runs."""
    return Task(
        task_id=task_id,
        agent_id=request.agent_id,
        session_id=request.session_id,
        title=request.title,
        instructions=request.instructions,
        profile=request.profile,
        state=State.QUEUED,
        created_at=now,
        updated_at=now,
        request_id=request.request_id,
        # Routing, not a label: what the profile runs (recorded again on each attempt).
        harness=profile.harness,
        harness_model=profile.harness_model,
        workspace_mode=workspace_mode,
        workspace_path=str(workspace),
        may_have_asked=False,
    )
