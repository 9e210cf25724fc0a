"""``woken``: the wait of the scheduler's loops (dispatch, question closer, hosts)."""

from __future__ import annotations

import asyncio

import pytest

from services.scheduler.runtime import woken


@pytest.mark.parametrize("turns", range(6))
async def test_a_cancel_is_honoured_even_when_the_wake_up_comes_in_the_same_moment(turns: int) -> None:
    """Cancelled (the scheduler's shutdown) just as its event is set, the wait ends cancelled.
    ``asyncio.wait_for`` on Python 3.11 returns the inner result instead when both land in the
    same turn of the loop, so the loop around the wait carried on and a shutdown that cancelled
    it waited for ever (the dispatch loop did, one test run in ~40 under load)."""
    event = asyncio.Event()
    waiting = asyncio.create_task(woken(event, 30))
    await asyncio.sleep(0)  # it waits now
    event.set()
    for _ in range(turns):  # each moment between the wake-up and the waiter running again
        await asyncio.sleep(0)
    if waiting.done():
        return  # it woke before the cancel: nothing to cancel in this moment
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting


async def test_it_ends_on_the_event_or_the_timeout_and_clears_the_event() -> None:
    event = asyncio.Event()
    loop = asyncio.get_running_loop()
    began = loop.time()
    await woken(event, 0.05)
    assert loop.time() - began >= 0.04 and not event.is_set()
    event.set()
    async with asyncio.timeout(5):
        await woken(event, 30)
    assert not event.is_set()
