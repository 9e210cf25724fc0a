"""The shared process-table read: every caller gets a read that began after its call."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

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


async def test_looks_run_in_the_reads_own_hop_one_hop_for_all_and_a_failed_look_is_its_callers_alone() -> None:
    threads: list[str] = []

    def reader() -> dict:  # type: ignore[type-arg]
        threads.append(threading.current_thread().name)
        return {1: None}

    def look(n: int) -> Callable[[dict], object]:  # type: ignore[type-arg]
        def run(table: dict) -> object:  # type: ignore[type-arg]
            threads.append(threading.current_thread().name)
            if n == 2:
                raise ValueError("this look failed")
            return (n, table)

        return run

    scan = SharedScan(reader)
    calls = [scan.then(look(n)) for n in range(4)]
    results = await asyncio.gather(*calls, scan.fresh(), return_exceptions=True)
    assert results[0] == (0, {1: None}) and results[1] == (1, {1: None}) and results[3] == (3, {1: None})
    assert isinstance(results[2], ValueError)
    assert results[4] == {1: None}
    assert scan.reads == 1 and scan.hops == 1, "one read and one hop served every look"
    assert len(set(threads)) == 1 and threads[0] != threading.current_thread().name, "all in the read's thread"


async def test_a_failed_read_reaches_the_looks_waiting_for_it() -> None:
    def reader() -> dict:  # type: ignore[type-arg]
        raise OSError("proc unreadable")

    scan = SharedScan(reader)
    with pytest.raises(OSError):
        await scan.then(lambda table: table)


async def test_a_look_runs_on_a_read_that_began_after_its_call() -> None:
    started = threading.Event()
    release = threading.Event()
    reads: list[int] = []

    def reader() -> dict:  # type: ignore[type-arg]
        reads.append(len(reads) + 1)
        started.set()
        release.wait(5)
        return {len(reads): None}

    scan = SharedScan(reader)
    first = asyncio.create_task(scan.fresh())
    await asyncio.to_thread(started.wait, 5)
    late = asyncio.create_task(scan.then(lambda table: table))
    await asyncio.sleep(0.01)
    release.set()
    assert await first == {1: None}
    assert await late == {2: None}, "the look waited for the next read"
