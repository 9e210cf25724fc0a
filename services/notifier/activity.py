"""In-process fan-out of activity frames to the conversation's streams, after commit.

Each subscriber has a bounded queue; one that lets it fill is dropped (told through
``overflowed``) so a slow reader never holds the publisher or the others back.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from services.notifier.store import Frame

Conversation = tuple[str, str]


@dataclass(eq=False)
class Subscription:
    queue: asyncio.Queue[Frame] = field(default_factory=lambda: asyncio.Queue(maxsize=1024))
    overflowed: bool = False


class ActivityHub:
    def __init__(self) -> None:
        self._subs: defaultdict[Conversation, set[Subscription]] = defaultdict(set)

    def publish(self, frame: Frame) -> None:
        key = (frame.agent_id, frame.session_id)
        for sub in list(self._subs.get(key, ())):
            try:
                sub.queue.put_nowait(frame)
            except asyncio.QueueFull:
                sub.overflowed = True
                self._subs[key].discard(sub)

    @contextmanager
    def subscribe(self, agent_id: str, session_id: str) -> Iterator[Subscription]:
        key = (agent_id, session_id)
        sub = Subscription()
        self._subs[key].add(sub)
        try:
            yield sub
        finally:
            self._subs[key].discard(sub)
            if not self._subs[key]:
                del self._subs[key]

    @property
    def subscriber_count(self) -> int:
        return sum(len(s) for s in self._subs.values())
