"""CreateTasks: several creates in one call, each answered as its own CreateTask would be.

A real scheduler servicer on an in-process grpc.aio server over loopback, SQLite behind it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from google.rpc import status_pb2

from libs.grpc_client import error_info
from services.scheduler.engine import Engine
from services.scheduler.servicer import MAX_BATCH_CREATES
from taskgate.scheduler.v1 import scheduler_pb2 as pb
from taskgate.scheduler.v1 import scheduler_pb2_grpc as pb_grpc
from tests.support.scheduler_rpc import served_scheduler

Stack = tuple[Engine, pb_grpc.SchedulerServiceStub]


@pytest.fixture
async def scheduler(tmp_path: Path) -> AsyncIterator[Stack]:
    async with served_scheduler(tmp_path) as served:
        yield served


def create(title: str = "t", **fields: object) -> pb.CreateTaskRequest:
    fields.setdefault("profile", "w")
    return pb.CreateTaskRequest(agent_id="a", session_id="s", title=title, **fields)  # type: ignore[arg-type]


def items(*requests: pb.CreateTaskRequest) -> pb.CreateTasksRequest:
    return pb.CreateTasksRequest(
        items=[pb.CreateTasksItem(request=r, call_id=f"call-{i}") for i, r in enumerate(requests)]
    )


async def test_each_create_of_a_batch_succeeds_or_fails_alone_in_order(scheduler: Stack) -> None:
    engine, stub = scheduler
    bad = create("x", profile="nope")
    reply = await stub.CreateTasks(items(create("first"), bad, create("third")))
    assert [o.WhichOneof("outcome") for o in reply.outcomes] == ["task", "error_status", "task"]
    assert [reply.outcomes[0].task.title, reply.outcomes[2].task.title] == ["first", "third"]
    stored = await engine.store.find_tasks([reply.outcomes[0].task.task_id, reply.outcomes[2].task.task_id])
    assert {t.title for t in stored.values()} == {"first", "third"}

    # The failed item carries what the CreateTask call fails with: code, message and ErrorInfo.
    with pytest.raises(grpc.aio.AioRpcError) as unary:
        await stub.CreateTask(bad)
    status = status_pb2.Status.FromString(reply.outcomes[1].error_status)
    assert status.code == unary.value.code().value[0] == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert status.message == unary.value.details()
    unary_info = error_info(unary.value)
    assert unary_info is not None and unary_info.reason == "UNKNOWN_PROFILE"
    trailer = grpc.aio.AioRpcError(
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.aio.Metadata(),
        grpc.aio.Metadata(("grpc-status-details-bin", reply.outcomes[1].error_status)),
    )
    assert error_info(trailer) == unary_info


async def test_a_request_id_repeated_within_a_batch_creates_one_task(scheduler: Stack) -> None:
    _, stub = scheduler
    reply = await stub.CreateTasks(items(create("a", request_id="same"), create("a", request_id="same")))
    first, second = (o.task.task_id for o in reply.outcomes)
    assert first and first == second


@pytest.mark.parametrize("count", [0, MAX_BATCH_CREATES + 1])
async def test_an_empty_or_oversized_batch_is_refused_whole(scheduler: Stack, count: int) -> None:
    engine, stub = scheduler
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.CreateTasks(items(*(create(f"t{i}") for i in range(count))))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    info = error_info(refused.value)
    assert info is not None and info.reason == "BATCH_SIZE"
    assert sum((await engine.store.count_by_state()).values()) == 0


async def test_a_malformed_call_id_refuses_the_batch_before_any_create(scheduler: Stack) -> None:
    engine, stub = scheduler
    request = items(create("ok"))
    request.items.append(pb.CreateTasksItem(request=create("also ok"), call_id="x" * 65))
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.CreateTasks(request)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    info = error_info(refused.value)
    assert info is not None and info.reason == "INVALID_CALL_ID"
    assert sum((await engine.store.count_by_state()).values()) == 0


async def test_a_batch_mixing_plain_creates_with_others_answers_each_as_create_task_would(scheduler: Stack) -> None:
    """Plain creates are admitted at once and stored together; a continuation (it reads the
    task it continues) goes through CreateTask's own path. Each answer keeps its place, and each
    refusal is the one CreateTask gives, whichever path it took."""
    _, stub = scheduler
    unknown = create("c", continue_task_id="0" * 32)
    bad_profile = create("x", profile="nope")
    reply = await stub.CreateTasks(items(create("first"), unknown, bad_profile, create("fourth")))
    kinds = [o.WhichOneof("outcome") for o in reply.outcomes]
    assert kinds == ["task", "error_status", "error_status", "task"]
    assert [reply.outcomes[0].task.title, reply.outcomes[3].task.title] == ["first", "fourth"]
    for outcome, request in ((reply.outcomes[1], unknown), (reply.outcomes[2], bad_profile)):
        with pytest.raises(grpc.aio.AioRpcError) as unary:
            await stub.CreateTask(request)
        status = status_pb2.Status.FromString(outcome.error_status)
        assert (status.code, status.message) == (unary.value.code().value[0], unary.value.details())


async def test_a_batch_of_plain_creates_is_stored_in_one_transaction(scheduler: Stack) -> None:
    engine, stub = scheduler
    before = engine.store.group.transactions
    reply = await stub.CreateTasks(items(*(create(f"t{i}") for i in range(8))))
    assert all(o.WhichOneof("outcome") == "task" for o in reply.outcomes)
    assert len({o.task.task_id for o in reply.outcomes}) == 8
    assert engine.store.group.transactions == before + 1
