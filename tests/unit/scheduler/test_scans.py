"""The shared process-table read: every caller gets a read that began after its call."""

from __future__ import annotations

import asyncio
import threading

import pytest

from services.scheduler.scans import SharedScan


async def test_concurrent_callers_share_one_read_that_began_after_their_calls() -> None:
    started = threading.Event()
    release = threading.Event()
    calls: list[int] = []

    def reader() -> dict:  # type: ignore[type-arg]
        calls.append(len(calls))
        started.set()
        release.wait(5)
        return {len(calls): None}

    scan = SharedScan(reader)
    first = asyncio.create_task(scan.fresh())
    await asyncio.to_thread(started.wait, 5)
    # These arrive while the first read runs: it may be too early for them, so they share the next.
    late = [asyncio.create_task(scan.fresh()) for _ in range(5)]
    await asyncio.sleep(0.01)
    release.set()
    assert await first == {1: None}
    assert [await t for t in late] == [{2: None}] * 5
    assert scan.reads == 2


async def test_a_failed_read_reaches_its_waiters_and_the_next_call_reads_again() -> None:
    outcomes: list[object] = [OSError("proc unreadable"), {7: None}]

    def reader() -> dict:  # type: ignore[type-arg]
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome  # type: ignore[return-value]

    scan = SharedScan(reader)
    with pytest.raises(OSError):
        await scan.fresh()
    assert await scan.fresh() == {7: None}


async def test_reads_begin_at_least_the_minimum_interval_apart_and_callers_meanwhile_share_one() -> None:
    import time

    starts: list[float] = []

    def reader() -> dict:  # type: ignore[type-arg]
        starts.append(time.monotonic())
        return {len(starts): None}

    scan = SharedScan(reader, min_interval_s=0.3)
    assert await scan.fresh() == {1: None}
    called_at = time.monotonic()
    # Exits arriving one after another within the interval: one read serves them all.
    results = await asyncio.gather(*(scan.fresh() for _ in range(5)))
    assert results == [{2: None}] * 5 and scan.reads == 2
    assert starts[1] - starts[0] >= 0.3, "the second read waited out the interval"
    assert starts[1] >= called_at, "and still began after the callers' calls"
