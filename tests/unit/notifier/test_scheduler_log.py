"""The scheduler's durable event log as the notifier follows it: WatchTasks with since_sequence."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from libs.db import Database
from libs.grpc_server import NO_CALLER_AUTH, start_server
from libs.settings import Settings, WorkerProfile
from services.scheduler.domain import NewTask
from services.scheduler.engine import Engine
from services.scheduler.servicer import SchedulerServicer
from services.scheduler.store import MIGRATIONS, SchedulerStore
from taskgate.scheduler.v1 import scheduler_pb2 as pb
from taskgate.scheduler.v1 import scheduler_pb2_grpc as pb_grpc


@pytest.fixture
async def scheduler(tmp_path: Path) -> AsyncIterator[tuple[Engine, pb_grpc.SchedulerServiceStub]]:
    db = Database(f"sqlite:///{tmp_path / 's.db'}", MIGRATIONS)
    db.migrate()
    settings = Settings(data_dir=tmp_path, workers={"w": WorkerProfile(command=["true"])})
    engine = Engine(settings, SchedulerStore(db))
    servicer = SchedulerServicer(engine)
    host = await start_server(
        "127.0.0.1:0",
        [lambda s: pb_grpc.add_SchedulerServiceServicer_to_server(servicer, s)],
        [],
        security=NO_CALLER_AUTH,
    )
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{host.port}")
    yield engine, pb_grpc.SchedulerServiceStub(channel)
    await channel.close()
    await host.server.stop(0)
    db.close()


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
