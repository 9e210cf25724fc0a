"""Per-task locks of the event loop, kept only while held.

A ``defaultdict(asyncio.Lock)`` keeps a lock for every task id ever locked: a scheduler that
ran a million tasks kept a million locks (≈ 200 bytes each with its key) until it
restarted. Here a task's entry exists while its lock is held — the waiters queue in it, and
each release hands the lock straight to the first of them — so what is kept is bounded by the
work under way.
"""

from __future__ import annotations

import asyncio
from collections import deque
from types import TracebackType


class TaskLocks:
    """``async with locks[task_id]:`` — one task's critical section, first come first served."""

    def __init__(self) -> None:
        # Task id -> the waiters of its held lock (a free lock has no entry).
        self._held: dict[str, deque[asyncio.Future[None]]] = {}

    def __getitem__(self, key: str) -> _Section:
        return _Section(self, key)

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, key: object) -> bool:
        return key in self._held

    async def acquire(self, key: str) -> None:
        waiters = self._held.get(key)
        if waiters is None:
            self._held[key] = deque()
            return
        turn = asyncio.get_running_loop().create_future()
        waiters.append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self.release(key)  # handed the lock as the wait was cancelled: pass it on
            elif turn in waiters:  # (a release in between has passed over it already)
                waiters.remove(turn)
            raise

    def release(self, key: str) -> None:
        waiters = self._held.get(key)
        if waiters is None:
            raise RuntimeError(f"the lock of {key} is not held")
        while waiters:
            turn = waiters.popleft()
            if not turn.done():  # (a cancelled wait has left, or is leaving)
                turn.set_result(None)
                return
        del self._held[key]


class _Section:
    __slots__ = ("_locks", "_key")

    def __init__(self, locks: TaskLocks, key: str) -> None:
        self._locks = locks
        self._key = key

    async def __aenter__(self) -> None:
        await self._locks.acquire(self._key)

    async def __aexit__(
        self, _type: type[BaseException] | None, _value: BaseException | None, _tb: TracebackType | None
    ) -> None:
        self._locks.release(self._key)
