"""The database threads: outcomes reach the caller's loop; cancelled work is skipped; close drains."""

from __future__ import annotations

import asyncio
import functools
import threading

import pytest

from libs.db import DatabaseThreads


async def test_results_and_errors_reach_the_caller_from_the_database_thread() -> None:
    threads = DatabaseThreads(1)
    try:
        names = await asyncio.gather(*(threads.run(lambda: threading.current_thread().name) for _ in range(20)))
        assert set(names) == {"db_0"}, "one thread for one worker, never the loop's"

        def fail() -> None:
            raise LookupError("no such row")

        with pytest.raises(LookupError, match="no such row"):
            await threads.run(fail)
        assert await threads.run(lambda: 7) == 7, "a failure leaves the thread serving"
    finally:
        threads.close()


async def test_work_whose_caller_stopped_waiting_before_it_began_is_skipped() -> None:
    threads = DatabaseThreads(1)
    gate, ran = threading.Event(), []
    try:
        busy = asyncio.ensure_future(threads.run(gate.wait))
        await asyncio.sleep(0.05)  # the thread is inside gate.wait
        waiting = asyncio.ensure_future(threads.run(lambda: ran.append("late")))
        await asyncio.sleep(0)
        waiting.cancel()
        gate.set()
        assert await busy is True
        assert await threads.run(lambda: "after") == "after"
        assert ran == [], "cancelled before it began: not run"
    finally:
        threads.close()


async def test_close_runs_what_is_queued_then_refuses_new_work() -> None:
    threads = DatabaseThreads(2)
    done: list[int] = []
    pending = [asyncio.ensure_future(threads.run(functools.partial(done.append, i))) for i in range(10)]
    await asyncio.sleep(0)  # all queued
    await asyncio.to_thread(threads.close)
    assert sorted(done) == list(range(10))
    await asyncio.gather(*pending)
    with pytest.raises(RuntimeError, match="closed"):
        await threads.run(lambda: None)


async def test_idle_says_whether_work_is_queued_or_running_and_is_true_once_a_caller_hears() -> None:
    """``idle`` is what lets the group commit run a batch on the loop: it must be false while
    anything is queued or running, and already true when a caller's result arrives."""
    threads = DatabaseThreads(1)
    gate = threading.Event()
    try:
        assert threads.idle()
        busy = asyncio.ensure_future(threads.run(gate.wait))
        queued = asyncio.ensure_future(threads.run(lambda: "queued"))
        await asyncio.sleep(0)
        assert not threads.idle(), "one running, one queued"
        gate.set()
        assert await busy is True and await queued == "queued"
        assert threads.idle(), "the work counted finished before its caller heard"
    finally:
        threads.close()
    assert not threads.idle(), "closed threads are never idle: nothing may run in their place"


async def test_what_submitted_work_returns_runs_once_it_no_longer_counts_as_running() -> None:
    threads = DatabaseThreads(1)
    loop = asyncio.get_running_loop()
    seen: asyncio.Future[bool] = loop.create_future()

    def follow_up() -> None:
        loop.call_soon_threadsafe(seen.set_result, threads.idle())

    try:
        threads.submit(lambda: follow_up)
        assert await asyncio.wait_for(seen, 10), "idle by the time the follow-up ran"
    finally:
        threads.close()
