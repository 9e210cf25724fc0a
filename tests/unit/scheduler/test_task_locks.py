"""``TaskLocks``: the scheduler's per-task locks, kept only while held."""

from __future__ import annotations

import asyncio

import pytest

from services.scheduler.task_locks import TaskLocks


async def test_a_released_lock_leaves_nothing_behind() -> None:
    locks = TaskLocks()
    for i in range(1000):
        async with locks[f"task-{i}"]:
            assert f"task-{i}" in locks
    assert len(locks) == 0, "a lock per task ever locked was kept (a defaultdict's leak)"


async def test_one_holder_at_a_time_in_the_order_they_came() -> None:
    locks = TaskLocks()
    order: list[int] = []
    inside = 0

    async def section(n: int) -> None:
        nonlocal inside
        async with locks["t"]:
            inside += 1
            assert inside == 1, "two holders at once"
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            order.append(n)
            inside -= 1

    await asyncio.gather(*(section(n) for n in range(5)))
    assert order == [0, 1, 2, 3, 4]
    assert len(locks) == 0


async def test_other_keys_do_not_wait() -> None:
    locks = TaskLocks()
    async with locks["a"]:
        async with asyncio.timeout(5):
            async with locks["b"]:
                pass


async def test_a_waiter_gets_the_lock_when_it_is_released() -> None:
    locks = TaskLocks()
    await locks.acquire("t")
    entered = asyncio.Event()

    async def waiter() -> None:
        async with locks["t"]:
            entered.set()

    task = asyncio.create_task(waiter())
    for _ in range(3):
        await asyncio.sleep(0)
    assert not entered.is_set(), "the waiter entered a held lock"
    locks.release("t")
    async with asyncio.timeout(5):
        await task
    assert len(locks) == 0


async def test_a_cancelled_waiter_neither_holds_nor_blocks_the_lock() -> None:
    locks = TaskLocks()
    await locks.acquire("t")
    cancelled = asyncio.create_task(locks.acquire("t"))
    await asyncio.sleep(0)
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    locks.release("t")
    assert len(locks) == 0
    async with asyncio.timeout(5), locks["t"]:
        pass


async def test_a_waiter_cancelled_just_as_it_is_handed_the_lock_passes_it_on() -> None:
    locks = TaskLocks()
    await locks.acquire("t")
    first = asyncio.create_task(locks.acquire("t"))
    second = asyncio.create_task(locks.acquire("t"))
    await asyncio.sleep(0)
    locks.release("t")  # handed to `first`, which has not run yet
    first.cancel()  # and is cancelled before it does
    with pytest.raises(asyncio.CancelledError):
        await first
    async with asyncio.timeout(5):
        await second  # the lock went on to the next waiter
    locks.release("t")
    assert len(locks) == 0


async def test_releasing_a_free_lock_is_an_error() -> None:
    with pytest.raises(RuntimeError):
        TaskLocks().release("t")


async def test_a_waiter_cancelled_just_before_a_release_passes_it_over() -> None:
    """Its wait is cancelled, then the lock is released before the waiter has run again: the
    release passes over the cancelled wait (and finds no one else), and the waiter's own
    leaving does not trip over the wait already gone."""
    locks = TaskLocks()
    await locks.acquire("t")
    waiter = asyncio.create_task(locks.acquire("t"))
    await asyncio.sleep(0)
    waiter.cancel()  # its wait is cancelled now; the waiter itself runs at the next turn
    locks.release("t")
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert len(locks) == 0
    async with asyncio.timeout(5), locks["t"]:
        pass
