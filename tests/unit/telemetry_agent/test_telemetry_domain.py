"""Validation, paging and the bounded fan-out."""

from __future__ import annotations

import asyncio

import pytest

from services.telemetry_agent.broadcast import Broadcaster, SubscriberTooSlow
from services.telemetry_agent.domain import (
    InvalidArgument,
    Member,
    Observation,
    Watch,
    WatchEntry,
    page_of,
    validate_page,
    validate_watch,
)


@pytest.mark.parametrize(
    ("task_id", "pid", "start", "reason"),
    [
        ("", 10, 5, "INVALID_TASK_ID"),
        ("x" * 129, 10, 5, "INVALID_TASK_ID"),
        ("bad id", 10, 5, "INVALID_TASK_ID"),
        ("t", 0, 5, "INVALID_PID"),
        ("t", 1, 5, "INVALID_PID"),
        ("t", -3, 5, "INVALID_PID"),
        ("t", 1 << 23, 5, "INVALID_PID"),
        ("t", 10, 0, "INVALID_PID_START_TIME"),
        ("t", 10, -1, "INVALID_PID_START_TIME"),
    ],
)
def test_invalid_watches_are_refused(task_id: str, pid: int, start: int, reason: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        validate_watch(task_id, pid, start)
    assert info.value.reason == reason


def test_a_valid_watch() -> None:
    assert validate_watch("0f" * 16, 1234, 99) == Watch("0f" * 16, 1234, 99)


def test_paging_is_ordered_by_task_id_with_a_token() -> None:
    entries = [WatchEntry(Watch(f"t{i:02d}", 10 + i, 5), 0) for i in reversed(range(5))]
    page, token = page_of(entries, validate_page(2, ""))
    assert [e.watch.task_id for e in page] == ["t00", "t01"] and token == "t01"
    page, token = page_of(entries, validate_page(2, token))
    assert [e.watch.task_id for e in page] == ["t02", "t03"] and token == "t03"
    page, token = page_of(entries, validate_page(2, token))
    assert [e.watch.task_id for e in page] == ["t04"] and token == ""
    assert validate_page(0, "").size == 1000
    with pytest.raises(InvalidArgument):
        validate_page(1001, "")
    with pytest.raises(InvalidArgument):
        validate_page(10, "not a token!")


def _obs(i: int) -> Observation:
    return Observation(task_id=f"t{i}", root=Member(10, 5), observed_at=i, available=True)


async def test_every_subscriber_gets_every_batch() -> None:
    hub = Broadcaster(limit=10)
    a, b = hub.subscribe(), hub.subscribe()
    hub.publish([_obs(0), _obs(1)])
    hub.publish([])  # nothing to send: no empty batch
    hub.publish([_obs(2)])
    hub.close_all()
    for sub in (a, b):
        assert [[o.task_id for o in batch] async for batch in sub] == [["t0", "t1"], ["t2"]]


async def test_a_slow_subscriber_is_dropped_not_buffered_without_bound() -> None:
    hub = Broadcaster(limit=3)
    slow, fast = hub.subscribe(), hub.subscribe()
    received: list[str] = []

    async def consume() -> None:
        async for batch in fast:
            received.extend(o.task_id for o in batch)

    consumer = asyncio.create_task(consume())
    for i in range(10):
        dropped = hub.publish([_obs(i)])
        await asyncio.sleep(0)  # let the fast one read
        if i == 3:  # the 4th pending observation is one too many
            assert dropped == [slow]
    assert len(hub) == 1 and slow.backlog() == 0
    with pytest.raises(SubscriberTooSlow):
        await slow.__anext__()
    hub.close_all()
    await asyncio.wait_for(consumer, 5)
    assert received == [f"t{i}" for i in range(10)]


def test_the_backlog_limit_counts_observations_not_batches() -> None:
    hub = Broadcaster(limit=5)
    sub = hub.subscribe()
    assert hub.publish([_obs(i) for i in range(5)]) == []
    assert sub.backlog() == 5
    assert hub.publish([_obs(9)]) == [sub]
