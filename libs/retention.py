"""Deleting old history in short batches (the scheduler's finished tasks, the notifier's
finished notifications): each batch is its own transaction, and a pause as long as the batch
took follows it, so the service's own commits, which wait for the database while a batch
holds it, get at least half of it during a pass."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import structlog

B = TypeVar("B")

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
