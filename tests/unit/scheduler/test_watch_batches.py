"""WatchTasks' batched log mode (``batch``): one response per read of the event log.

Served by a real scheduler servicer on an in-process grpc.aio server over loopback; the
events come from its real event log (SQLite).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from services.scheduler import domain
from services.scheduler.domain import NewTask, State
from services.scheduler.engine import Engine
from services.scheduler.events import TaskEvent
from services.scheduler.servicer import WATCH_BATCH_MAX_BYTES, batch_replies
from taskgate.scheduler.v1 import scheduler_pb2 as pb
from taskgate.scheduler.v1 import scheduler_pb2_grpc as pb_grpc
from tests.support.scheduler_rpc import served_scheduler

Stack = tuple[Engine, pb_grpc.SchedulerServiceStub]


@pytest.fixture
async def scheduler(tmp_path: Path) -> AsyncIterator[Stack]:
    async with served_scheduler(tmp_path) as served:
        yield served


async def create(engine: Engine, session: str = "s1", instructions: str = "") -> str:
    task = await engine.create_task(
        NewTask(
            agent_id="a",
            session_id=session,
            title="t",
            instructions=instructions,
            profile="w",
            request_id=None,
            harness=None,
            harness_model=None,
        )
    )
    return task.task_id


def log_request(since: int, batch: bool = True, **fields: object) -> pb.WatchTasksRequest:
    fields.setdefault("all_sessions", True)
    return pb.WatchTasksRequest(since_sequence=since, batch=batch, **fields)  # type: ignore[arg-type]


async def take_events(stream: grpc.aio.UnaryStreamCall, n: int) -> tuple[list[pb.TaskEvent], int]:
    """The first ``n`` events of a batched stream, and how many responses carried them."""
    events: list[pb.TaskEvent] = []
    replies = 0
    async for reply in stream:
        assert not reply.HasField("task") and reply.sequence == 0, "a batch sets only `events`"
        assert reply.events, "no empty batch is sent"
        replies += 1
        events.extend(reply.events)
        if len(events) >= n:
            break
    return events, replies


async def test_one_read_of_the_log_is_one_response_in_order_then_live_batches(scheduler: Stack) -> None:
    engine, stub = scheduler
    ids = [await create(engine, session=f"s{i % 2}") for i in range(7)]
    stream = stub.WatchTasks(log_request(0), timeout=20)
    backlog, replies = await take_events(stream, 7)
    assert replies == 1, "everything one read found goes out together"
    assert [e.task.task_id for e in backlog] == ids
    sequences = [e.sequence for e in backlog]
    assert sequences == sorted(sequences) and len(set(sequences)) == 7
    assert all(e.type == pb.TASK_EVENT_TYPE_STATE_CHANGED and e.HasField("event_time") for e in backlog)
    assert all(e.task.state == pb.TASK_STATE_QUEUED for e in backlog)

    # Live: new events arrive (in one or more batches), after the backlog, in order.
    later = asyncio.ensure_future(take_events(stream, 3))
    more = [await create(engine) for _ in range(3)]
    live, _ = await asyncio.wait_for(later, 20)
    assert [e.task.task_id for e in live] == more
    assert live[0].sequence > sequences[-1]
    stream.cancel()


async def test_the_batched_and_the_unbatched_mode_carry_the_same_events(scheduler: Stack) -> None:
    engine, stub = scheduler
    for i in range(4):
        await create(engine, session=f"s{i % 2}")
    cancelled = await create(engine)
    await engine.cancel(cancelled)  # queued: cancelled at once, a second event for it
    plain_stream = stub.WatchTasks(log_request(0, batch=False), timeout=20)
    plain: list[pb.WatchTasksResponse] = []
    async for reply in plain_stream:
        assert not reply.events, "the unbatched mode sets no batch"
        plain.append(reply)
        if len(plain) == 6:
            break
    plain_stream.cancel()
    batched_stream = stub.WatchTasks(log_request(0), timeout=20)
    batched, _ = await take_events(batched_stream, 6)
    batched_stream.cancel()
    assert [e.task.state for e in batched][-2:] == [pb.TASK_STATE_QUEUED, pb.TASK_STATE_CANCELLED]
    for one, entry in zip(plain, batched, strict=True):
        assert (one.sequence, one.type, one.event_time) == (entry.sequence, entry.type, entry.event_time)
        assert one.task == entry.task


async def test_resuming_from_a_cursor_inside_a_batch_loses_and_repeats_nothing(scheduler: Stack) -> None:
    engine, stub = scheduler
    ids = [await create(engine) for _ in range(6)]
    first = stub.WatchTasks(log_request(0), timeout=20)
    events, replies = await take_events(first, 6)
    assert replies == 1
    first.cancel()
    # A follower that committed the first three events of that batch reconnects from there.
    cursor = events[2].sequence
    second = stub.WatchTasks(log_request(cursor), timeout=20)
    rest, _ = await take_events(second, 3)
    assert [e.task.task_id for e in rest] == ids[3:]
    assert [e.sequence for e in rest] == [e.sequence for e in events[3:]]
    second.cancel()


async def test_a_session_log_watch_batches_only_that_session(scheduler: Stack) -> None:
    engine, stub = scheduler
    mine = []
    for i in range(6):
        task_id = await create(engine, session="s1" if i % 3 == 0 else "other")
        if i % 3 == 0:
            mine.append(task_id)
    stream = stub.WatchTasks(log_request(0, all_sessions=False, agent_id="a", session_id="s1"), timeout=20)
    events, replies = await take_events(stream, 2)
    assert [e.task.task_id for e in events] == mine and replies == 1
    stream.cancel()


async def test_a_read_larger_than_the_bound_is_split_between_whole_events(scheduler: Stack) -> None:
    engine, stub = scheduler
    big = "x" * (domain.MAX_INSTRUCTIONS_BYTES - 1024)
    n = WATCH_BATCH_MAX_BYTES // len(big) + 4  # together well above the bound
    ids = [await create(engine, instructions=big) for _ in range(n)]
    stream = stub.WatchTasks(log_request(0), timeout=20)
    seen: list[pb.TaskEvent] = []
    sizes = []
    async for reply in stream:
        sizes.append(reply.ByteSize())
        seen.extend(reply.events)
        if len(seen) >= n:
            break
    stream.cancel()
    assert len(sizes) >= 2, "one read, more than one response"
    assert max(sizes) <= WATCH_BATCH_MAX_BYTES
    assert [e.task.task_id for e in seen] == ids, "nothing lost or reordered by the split"
    assert all(e.task.instructions == big for e in seen), "no event is cut"


def stored_event(sequence: int, instructions: str) -> TaskEvent:
    task = domain.Task(
        task_id=f"t{sequence}",
        agent_id="a",
        session_id="s",
        title="t",
        instructions=instructions,
        profile="w",
        state=State.QUEUED,
        created_at=1_000,
        updated_at=1_000,
    )
    return TaskEvent(sequence, "task.state_changed", 1_000 + sequence, task)


def test_the_split_keeps_each_response_under_the_bound_and_an_oversized_event_alone() -> None:
    events = [stored_event(i, "y" * size) for i, size in enumerate([100, 300, 2_000, 50, 50, 600, 10], start=1)]
    replies = batch_replies(events, 5_000, max_bytes=800)
    assert [[e.sequence for e in r.events] for r in replies] == [[1, 2], [3], [4, 5], [6, 7]]
    assert all(r.ByteSize() <= 800 for r in replies if len(r.events) > 1)
    assert replies[1].events[0].task.instructions == "y" * 2_000, "too big for the bound: sent whole, alone"
    (whole,) = batch_replies(events, 5_000)
    assert [e.sequence for e in whole.events] == [1, 2, 3, 4, 5, 6, 7]
    assert [e for r in replies for e in r.events] == list(whole.events)


@pytest.mark.parametrize(
    "request_",
    [
        pb.WatchTasksRequest(agent_id="a", session_id="s1", batch=True),
        pb.WatchTasksRequest(task_id="t", batch=True),
    ],
)
async def test_batch_outside_the_log_mode_is_invalid(scheduler: Stack, request_: pb.WatchTasksRequest) -> None:
    _, stub = scheduler
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for _ in stub.WatchTasks(request_, timeout=5):
            pass
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
