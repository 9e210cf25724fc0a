"""Watching tasks live: current snapshots first, then each event after commit."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

from libs import errors
from services.scheduler import domain
from services.scheduler.domain import State, Task
from services.scheduler.events import TaskEvent
from services.scheduler.runtime import Runtime

# Called once the watcher is subscribed, before its snapshots are read (e.g. to send the
# call's initial metadata, so a client knows every later change will reach it).
OnLive = Callable[[], Awaitable[None]]


class Watchers:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    async def watch_task(self, task_id: str, on_live: OnLive | None = None) -> AsyncIterator[TaskEvent]:
        domain.validate_task_id(task_id)

        async def one() -> list[Task]:
            return [await self.rt.store.get_task(task_id)]

        async for event in self._watch(lambda t: t.task_id == task_id, one, on_live):
            yield event

    async def watch_session(
        self, agent_id: str, session_id: str, on_live: OnLive | None = None
    ) -> AsyncIterator[TaskEvent]:
        domain.validate_id("agentId", agent_id)
        domain.validate_id("sessionId", session_id)

        def accepts(t: Task) -> bool:
            return t.agent_id == agent_id and t.session_id == session_id

        async def active() -> list[Task]:
            live_states = [s for s in State if s not in domain.TERMINAL]
            # Only this session's tasks are read (ix_tasks_session_state), however many others exist.
            return await self.rt.store.tasks_in_states(live_states, session=(agent_id, session_id))

        async for event in self._watch(accepts, active, on_live):
            yield event

    async def _watch(
        self,
        accepts: Callable[[Task], bool],
        initial: Callable[[], Awaitable[list[Task]]],
        on_live: OnLive | None = None,
    ) -> AsyncIterator[TaskEvent]:
        """Current snapshots first, then each event after commit.

        Subscribed before the snapshots are read, so no change falls between them
        (a change may show twice: snapshot, then event — never not at all).
        """
        sent: dict[str, int] = {}  # task id -> the newest version sent
        with self.rt.hub.subscribe(accepts) as sub:
            if on_live is not None:
                await on_live()
            now = self.rt.clock.now_ms()
            for task in await initial():
                sent[task.task_id] = task.version
                yield TaskEvent(0, "task.snapshot", now, task)
            while True:
                try:
                    async with asyncio.timeout(1.0):
                        event = await sub.queue.get()
                except TimeoutError:
                    if sub.overflowed:
                        raise errors.ResourceExhausted(
                            "WATCHER_TOO_SLOW", "the watcher fell behind; reconnect to resume"
                        ) from None
                    continue
                if event.task.version < sent.get(event.task.task_id, 0):
                    continue  # stale: a newer snapshot of this task was already sent
                sent[event.task.task_id] = event.task.version
                yield event
