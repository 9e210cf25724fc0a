"""The scheduler's durable event log as the notifier follows it: WatchTasks with since_sequence."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from services.scheduler.domain import NewTask
from services.scheduler.engine import Engine
from taskgate.scheduler.v1 import scheduler_pb2 as pb
from taskgate.scheduler.v1 import scheduler_pb2_grpc as pb_grpc
from tests.support.scheduler_rpc import served_scheduler


@pytest.fixture
async def scheduler(tmp_path: Path) -> AsyncIterator[tuple[Engine, pb_grpc.SchedulerServiceStub]]:
    async with served_scheduler(tmp_path) as served:
        yield served


async def create(engine: Engine, session: str) -> str:
    task = await engine.create_task(
        NewTask(
            agent_id="a",
            session_id=session,
            title="t",
            instructions="",
            profile="w",
            request_id=None,
            harness=None,
            harness_model=None,
        )
    )
    return task.task_id


async def take(stream: grpc.aio.UnaryStreamCall, n: int) -> list[pb.WatchTasksResponse]:
    out: list[pb.WatchTasksResponse] = []
    async for event in stream:
        out.append(event)
        if len(out) == n:
            break
    return out


async def test_log_replays_from_a_cursor_then_follows(
    scheduler: tuple[Engine, pb_grpc.SchedulerServiceStub],
) -> None:
    engine, stub = scheduler
    first = await create(engine, "s1")
    second = await create(engine, "s2")
    stream = stub.WatchTasks(pb.WatchTasksRequest(all_sessions=True, since_sequence=0), timeout=10)
    replayed = await take(stream, 2)
    assert [e.task.task_id for e in replayed] == [first, second]
    assert replayed[0].sequence < replayed[1].sequence
    stream.cancel()
    # Resuming after the first event's sequence skips it; a new event arrives live.
    stream = stub.WatchTasks(pb.WatchTasksRequest(all_sessions=True, since_sequence=replayed[0].sequence), timeout=10)
    later = asyncio.ensure_future(take(stream, 2))
    await asyncio.sleep(0.2)
    third = await create(engine, "s1")
    events = await asyncio.wait_for(later, 10)
    assert [e.task.task_id for e in events] == [second, third]
    stream.cancel()


async def test_log_filters_by_session_and_type(scheduler: tuple[Engine, pb_grpc.SchedulerServiceStub]) -> None:
    engine, stub = scheduler
    await create(engine, "other")
    mine = await create(engine, "s1")
    stream = stub.WatchTasks(
        pb.WatchTasksRequest(
            agent_id="a", session_id="s1", since_sequence=0, event_types=[pb.TASK_EVENT_TYPE_STATE_CHANGED]
        ),
        timeout=10,
    )
    (event,) = await take(stream, 1)
    assert event.task.task_id == mine and event.type == pb.TASK_EVENT_TYPE_STATE_CHANGED
    stream.cancel()


@pytest.mark.parametrize(
    "request_",
    [
        pb.WatchTasksRequest(all_sessions=True),
        pb.WatchTasksRequest(all_sessions=True, since_sequence=0, session_id="s1"),
        pb.WatchTasksRequest(all_sessions=True, since_sequence=-1),
    ],
)
async def test_bad_log_watches_are_invalid(
    scheduler: tuple[Engine, pb_grpc.SchedulerServiceStub], request_: pb.WatchTasksRequest
) -> None:
    _, stub = scheduler
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for _ in stub.WatchTasks(request_, timeout=5):
            pass
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
