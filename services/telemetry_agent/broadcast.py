"""Fan-out of observations to any number of subscribers, each with a bounded backlog.

Observations travel in batches (those of one sample). A subscriber whose
backlog would exceed its limit (counted in observations) is dropped: its
backlog is discarded and its iterator raises ``SubscriberTooSlow``, instead of
buffering without bound; it may reconnect. Used on the event loop only.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Sequence

from services.telemetry_agent.domain import Observation, ResourceExhausted

Batch = tuple[Observation, ...]


class SubscriberTooSlow(ResourceExhausted):
    def __init__(self, limit: int) -> None:
        super().__init__(
            "SUBSCRIBER_TOO_SLOW",
            f"the stream fell {limit} observations behind and was dropped; reconnect",
            limit=str(limit),
        )


class Subscription:
    """Iterates batches of observations, in the order they were offered."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._batches: deque[Batch] = deque()
        self._pending = 0
        self._wake = asyncio.Event()
        self.dropped = False
        self.closed = False

    def offer(self, batch: Sequence[Observation]) -> bool:
        """Queue one batch; False (and dropped) when the backlog would exceed the limit."""
        if self.dropped or self.closed:
            return False
        if not batch:
            return True
        if self._pending + len(batch) > self.limit:
            self.dropped = True
            self._batches.clear()
            self._pending = 0
            self._wake.set()
            return False
        self._batches.append(tuple(batch))
        self._pending += len(batch)
        self._wake.set()
        return True

    def close(self) -> None:
        """End the iteration once the backlog is delivered."""
        self.closed = True
        self._wake.set()

    def backlog(self) -> int:
        return self._pending

    def __aiter__(self) -> AsyncIterator[Batch]:
        return self

    async def __anext__(self) -> Batch:
        while True:
            if self.dropped:
                raise SubscriberTooSlow(self.limit)
            if self._batches:
                batch = self._batches.popleft()
                self._pending -= len(batch)
                return batch
            if self.closed:
                raise StopAsyncIteration
            self._wake.clear()
            await self._wake.wait()


class Broadcaster:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._subscribers: set[Subscription] = set()

    def subscribe(self, limit: int | None = None) -> Subscription:
        subscription = Subscription(limit or self.limit)
        self._subscribers.add(subscription)
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        self._subscribers.discard(subscription)

    def publish(self, batch: Sequence[Observation]) -> list[Subscription]:
        """Offer to every subscriber; returns those dropped by this offer (now unsubscribed)."""
        if not batch:
            return []
        shared = tuple(batch)
        dropped = [s for s in self._subscribers if not s.offer(shared)]
        for subscription in dropped:
            self._subscribers.discard(subscription)
        return dropped

    def close_all(self) -> None:
        for subscription in self._subscribers:
            subscription.close()
        self._subscribers.clear()

    def __len__(self) -> int:
        return len(self._subscribers)
