"""In-process fan-out of task events to watchers, after commit.

A watcher whose queue fills is dropped (told through ``overflowed``) rather than
letting memory grow; it may reconnect and start again from a fresh snapshot.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from services.scheduler.domain import Task


@dataclass(frozen=True)
class TaskEvent:
    sequence: int
    type: str  # task.state_changed | task.progress | task.tool | task.execution | task.question
    at: int
    task: Task


@dataclass(eq=False)
class Subscription:
    accepts: Callable[[Task], bool]
    queue: asyncio.Queue[TaskEvent] = field(default_factory=lambda: asyncio.Queue(maxsize=512))
    overflowed: bool = False


class EventHub:
    def __init__(self) -> None:
        self._subscriptions: set[Subscription] = set()
        self._sequence = itertools.count(1)

    def publish(self, event_type: str, at: int, task: Task) -> TaskEvent:
        event = TaskEvent(next(self._sequence), event_type, at, task)
        for sub in list(self._subscriptions):
            if sub.overflowed or not sub.accepts(task):
                continue
            try:
                sub.queue.put_nowait(event)
            except asyncio.QueueFull:
                sub.overflowed = True
                self._subscriptions.discard(sub)
        return event

    @contextmanager
    def subscribe(self, accepts: Callable[[Task], bool]) -> Iterator[Subscription]:
        sub = Subscription(accepts)
        self._subscriptions.add(sub)
        try:
            yield sub
        finally:
            self._subscriptions.discard(sub)

    @property
    def subscriber_count(self) -> int:
        return len(self._subscriptions)
