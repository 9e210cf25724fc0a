"""Deleting old history in short batches (the scheduler's finished tasks, the notifier's
finished notifications and conversations, the pending-registry's questions of ended tasks):
each batch is its own transaction, and a pause as long as the batch took follows it, so the
service's own commits, which wait for the database while a batch holds it, get at least half
of it during a pass."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

import structlog

from libs.clock import Clock

B = TypeVar("B")  # one batch's counts (a dataclass of ints)
T = TypeVar("T")  # a pass's totals: the batch's fields summed, and the batches
S = TypeVar("S")  # the store a kind prunes

MIN_PAUSE_S = 0.002
PASS_INTERVAL_S = 3600.0
MIN_INTERVAL_S = 1.0
FIRST_PASS_AFTER_S = 60.0  # after the service's start-up work


def pass_interval_s(retention_ms: int) -> float:
    """Hourly, or a tenth of a shorter retention (at least a second): a row goes within a
    tenth of its retention after it is due."""
    return min(PASS_INTERVAL_S, max(MIN_INTERVAL_S, retention_ms / 10_000))


async def in_batches(batch: Callable[[], Awaitable[B]], found: Callable[[B], int], stop: Callable[[], bool]) -> list[B]:
    """Run ``batch`` until one finds nothing to look at (or ``stop``), pausing after each as
    long as it took. Returns the batches that found something."""
    done: list[B] = []
    while not stop():
        began = time.perf_counter()
        result = await batch()
        if not found(result):
            break
        done.append(result)
        await asyncio.sleep(max(MIN_PAUSE_S, time.perf_counter() - began))
    return done


async def run_passes(
    retention_ms: int,
    prune_once: Callable[[int], Awaitable[Any]],
    now_ms: Callable[[], int],
    stop: Callable[[], bool],
    log: structlog.typing.FilteringBoundLogger,
    failure_event: str,
) -> None:
    """A pass soon after start-up and then every ``pass_interval_s`` until ``stop`` (or the
    task is cancelled); a pass that fails is logged and the next one comes as planned.
    ``retention_ms`` 0: nothing is ever deleted, no pass runs."""
    if not retention_ms:
        return
    interval = pass_interval_s(retention_ms)
    delay = min(FIRST_PASS_AFTER_S, interval)
    while not stop():
        await asyncio.sleep(delay)
        delay = interval
        try:
            await prune_once(now_ms())
        except Exception:
            log.exception(failure_event)


class Retention(Generic[S, B, T]):
    """Passes of one kind of history: each deletes batch after batch (``prune``, given the
    cutoff and the batch size) until one finds nothing old (``found``), then counts and logs
    what went. A kind says its totals, its log lines and its logger."""

    total: Callable[..., T]  # a pass's totals from the batches' summed fields and their number
    event: str  # the log line of a pass that deleted something
    failure_event: str
    log: structlog.typing.FilteringBoundLogger

    def __init__(
        self, store: S, retention_ms: int, clock: Clock, stop: Callable[[], bool] = lambda: False, batch: int = 100
    ) -> None:
        self.store = store
        self.retention_ms = retention_ms
        self.clock = clock
        self.stop = stop
        self.batch = batch

    async def prune(self, cutoff: int, limit: int) -> B:
        raise NotImplementedError

    def found(self, batch: B) -> int:
        """The old rows a batch found (none: the pass is over)."""
        raise NotImplementedError

    def counted(self, total: T) -> None:
        """Add a pass's deletions to the service's metrics."""

    async def loop(self) -> None:
        await run_passes(self.retention_ms, self.prune_once, self.clock.now_ms, self.stop, self.log, self.failure_event)

    async def prune_once(self, now_ms: int) -> T:
        cutoff = now_ms - self.retention_ms
        began = time.perf_counter()
        batches = await in_batches(lambda: self.prune(cutoff, self.batch), self.found, self.stop)
        sums: dict[str, int] = {}
        for found in batches:  # each field summed over the batches
            for name, rows in dataclasses.asdict(found).items():  # type: ignore[call-overload]
                sums[name] = sums.get(name, 0) + rows
        total = self.total(**sums, batches=len(batches))
        if batches:
            self.counted(total)
            self.log.info(self.event, **vars(total), seconds=round(time.perf_counter() - began, 3))
        return total
