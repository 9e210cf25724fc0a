"""Sub-task trees: a worker starts, waits for and cancels sub-tasks of its own task.

A sub-task is an ordinary task of the same agent and session with ``parent_task_id``; its
depth and each task's fan-out are bounded by ``[tasks] max_subtask_depth`` and
``max_subtasks_per_task``. Cancelling a task that has unfinished sub-tasks stops them first,
with the same proof as any cancel, and only then the task's own worker: the task shows
``cancel_requested`` at once, its worker is signalled once every sub-task is settled
(``cancelled``, or ``needs_reconciliation`` when its stop could not be proven).
"""

from __future__ import annotations

import asyncio

import structlog

from libs.ids import ID_PATTERN
from services.scheduler import domain
from services.scheduler.catalog import TaskCatalog
from services.scheduler.dispatch_targets import TargetDispatcher
from services.scheduler.domain import TERMINAL, Attempt, NewTask, State, Task
from services.scheduler.reports import WorkerReports
from services.scheduler.runtime import Runtime
from services.scheduler.stopping import Stopper

log = structlog.get_logger("scheduler")

# A child's stop counts as settled here: proven (terminal) or unprovable (reconciliation).
SETTLED = frozenset({*TERMINAL, State.NEEDS_RECONCILIATION, State.PAUSED})
MAX_SUB_REQUEST_ID = 64


class SubTasks:
    def __init__(
        self, rt: Runtime, catalog: TaskCatalog, stopper: Stopper, reports: WorkerReports, targets: TargetDispatcher
    ) -> None:
        self.rt = rt
        self.catalog = catalog
        self.stopper = stopper
        self.reports = reports
        self.targets = targets

    # --- what a worker calls -------------------------------------------------------

    async def spawn(self, token: str, title: str, instructions: str, profile: str, request_id: str) -> Task:
        live = self.reports.authenticate(token)
        parent_id = live.attempt.task_id
        if request_id and (len(request_id) > MAX_SUB_REQUEST_ID or not ID_PATTERN.match(request_id)):
            raise domain.InvalidArgument("INVALID_ID", "request_id must be 1-64 id characters", field="request_id")
        # One spawn of a parent at a time: the fan-out count and the insert agree.
        async with self.rt.locks[f"spawn:{parent_id}"]:
            parent = await self.rt.store.get_task(parent_id)
            domain.check_reporting(parent)
            domain.check_spawn(parent, await self.rt.store.count_children(parent_id), self.rt.tasks_cfg)
            child = await self.catalog.create_task(
                NewTask(
                    agent_id=parent.agent_id,
                    session_id=parent.session_id,
                    title=title,
                    instructions=instructions,
                    profile=profile or parent.profile,
                    # Scoped to the parent: the same key of another parent is another task.
                    request_id=f"sub-{parent_id}-{request_id}" if request_id else None,
                    harness=None,
                    harness_model=None,
                ),
                parent=parent,
            )
        log.info("subtask_started", task_id=parent_id, child_task_id=child.task_id, depth=child.depth)
        return child

    async def _own_child(self, token: str, task_id: str) -> Task:
        live = self.reports.authenticate(token)
        domain.validate_task_id(task_id)
        child = await self.rt.store.get_task(task_id)
        if child.parent_task_id != live.attempt.task_id:
            raise domain.WorkerDenied("NOT_A_SUBTASK", "the task is not a sub-task of this worker's task")
        return child

    async def wait(self, token: str, task_id: str, wait_s: float) -> Task:
        """The sub-task once it has finished, or as it is after ``wait_s``."""
        child = await self._own_child(token, task_id)
        return await self._wait_for(task_id, TERMINAL, wait_s) if not child.terminal else child

    async def cancel_own(self, token: str, task_id: str) -> Task:
        await self._own_child(token, task_id)
        return await self.cancel(task_id, domain.USER_CANCELED, None, wait_s=1.0)

    # --- trees -----------------------------------------------------------------------

    async def detail(self, task_id: str) -> tuple[Task, list[Attempt], domain.TreeView]:
        """A task, its attempts, its direct sub-tasks and its tree's evidence (one trip to the
        database, one query per level of the tree)."""
        domain.validate_task_id(task_id)
        task, attempts, levels = await self.rt.store.task_detail(task_id, self.rt.tasks_cfg.max_subtask_depth)
        descendants = [t for level in levels for t in level]
        evidence = domain.tree_evidence(task, descendants, self.rt.tasks_cfg.observed_paths)
        return task, attempts, domain.TreeView(children=levels[0] if levels else [], evidence=evidence)

    async def cancel(self, task_id: str, cause: str, replaced_by: str | None, wait_s: float) -> Task:
        """Cancel a task; its unfinished sub-tasks (and theirs) are stopped first."""
        domain.validate_task_id(task_id)
        task = await self.rt.store.get_task(task_id)
        if task.gateway_managed:
            return await self.targets.cancel(task_id, cause, replaced_by)  # a request: the target is told
        children = [c for c in await self.rt.store.children_of([task_id]) if c.state not in SETTLED]
        if not children:
            return await self.stopper.cancel(task_id, cause, replaced_by, wait_s)

        async def children_first() -> None:
            await asyncio.gather(*(self._cancel_settled(c.task_id, cause) for c in children))

        if task_id in self.rt.live:
            # Shows cancel_requested now; the worker is signalled once the children are settled.
            return await self.stopper.cancel(task_id, cause, replaced_by, wait_s, before_stop=children_first)
        await children_first()
        return await self.stopper.cancel(task_id, cause, replaced_by, wait_s)

    def _settle_bound_s(self) -> float:
        cfg = self.rt.tasks_cfg
        per_level = (cfg.cancel_grace_ms + cfg.cleanup_confirm_ms) / 1000 + 2.0
        return per_level * (cfg.max_subtask_depth + 1)

    async def _cancel_settled(self, task_id: str, cause: str) -> None:
        await self.cancel(task_id, cause, None, wait_s=0.0)
        task = await self._wait_for(task_id, SETTLED, self._settle_bound_s())
        if task.state not in SETTLED:
            log.warning("subtask_stop_not_settled", task_id=task_id, state=task.state.value)

    async def _wait_for(self, task_id: str, states: frozenset[State], wait_s: float) -> Task:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        with self.rt.hub.subscribe(lambda t: t.task_id == task_id) as sub:
            task = await self.rt.store.get_task(task_id)  # read after subscribing: no change is missed
            while task.state not in states:
                left = deadline - loop.time()
                if left <= 0 or sub.overflowed:
                    return await self.rt.store.get_task(task_id)
                try:
                    async with asyncio.timeout(left):
                        task = (await sub.queue.get()).task
                except TimeoutError:
                    return await self.rt.store.get_task(task_id)
            return task
