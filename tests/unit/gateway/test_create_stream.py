"""The gateway's create batches over one StreamCreateTasks stream (``gateway_http.create_stream``):
each batch answered, refused and failed as its CreateTasks call would have been, on one stream
that outlives a batch's refusal or deadline and is opened anew after it broke."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal

import grpc
import pytest
from prometheus_client import REGISTRY

from gateway_http.create_stream import CreateStream
from gateway_http.errors import from_rpc_error
from libs.grpc_client import ClientSecurity, aio_channel
from libs.grpc_server import ServerSecurity
from libs.internal_auth import CallerAuth
from services.scheduler.engine import Engine
from services.scheduler.servicer import SchedulerServicer
from taskgate.scheduler.v1 import scheduler_pb2 as pb
from taskgate.scheduler.v1 import scheduler_pb2_grpc as pb_grpc
from tests.support.scheduler_rpc import scheduler_server, served_scheduler
from tests.support.waiting import until

SERVICE = "taskgate.scheduler.v1.SchedulerService"


def _streams_ended(code: str) -> float:
    labels = {"method": f"/{SERVICE}/StreamCreateTasks", "code": code}
    return REGISTRY.get_sample_value("taskgate_rpc_duration_seconds_count", labels) or 0.0


def create(title: str, profile: str = "w") -> pb.CreateTaskRequest:
    return pb.CreateTaskRequest(agent_id="a", session_id="s", title=title, profile=profile)


def batch(*requests: pb.CreateTaskRequest) -> pb.CreateTasksRequest:
    return pb.CreateTasksRequest(items=[pb.CreateTasksItem(request=r, call_id=f"call-{r.title}") for r in requests])


def titles(reply: pb.CreateTasksResponse) -> list[str]:
    return [o.task.title if o.WhichOneof("outcome") == "task" else "!" for o in reply.outcomes]


async def test_each_batch_is_answered_as_its_create_tasks_call_would_be(tmp_path: Path) -> None:
    async with served_scheduler(tmp_path) as (_, stub):
        stream = CreateStream(stub, ())
        try:
            request = batch(create("fine"), create("bad", profile="nope"))
            streamed = await stream(request, timeout=10)
            called = await stub.CreateTasks(batch(create("fine"), create("bad", profile="nope")))
            assert titles(streamed) == titles(called) == ["fine", "!"]
            assert streamed.outcomes[1].error_status == called.outcomes[1].error_status
            # Batches in flight together: each gets its own answer, on the one stream.
            replies = await asyncio.gather(*(stream(batch(create(f"{i}a"), create(f"{i}b")), 10) for i in range(6)))
            assert [titles(r) for r in replies] == [[f"{i}a", f"{i}b"] for i in range(6)]
            assert stream.opened == 1 and not stream.unary
        finally:
            await stream.close()


async def test_a_batch_refused_whole_fails_as_the_call_would_and_the_stream_goes_on(tmp_path: Path) -> None:
    async with served_scheduler(tmp_path) as (_, stub):
        stream = CreateStream(stub, ())
        try:
            with pytest.raises(grpc.aio.AioRpcError) as streamed:
                await stream(pb.CreateTasksRequest(), timeout=10)
            with pytest.raises(grpc.aio.AioRpcError) as called:
                await stub.CreateTasks(pb.CreateTasksRequest())
            assert streamed.value.code() == called.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert vars(from_rpc_error(streamed.value)) == vars(from_rpc_error(called.value))
            assert titles(await stream(batch(create("after")), timeout=10)) == ["after"]
            assert stream.opened == 1
        finally:
            await stream.close()


class FakeScheduler:
    """A server with only what a test gives it: StreamCreateTasks and/or CreateTasks handlers."""

    def __init__(self, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        self.server = grpc.aio.server()
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{self.port}")
        self.stub = pb_grpc.SchedulerServiceStub(self.channel)

    async def __aenter__(self) -> FakeScheduler:
        await self.server.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.channel.close()
        await self.server.stop(0)


def stream_handler(behavior: Callable[[Any, Any], Any]) -> grpc.RpcMethodHandler:
    return grpc.stream_stream_rpc_method_handler(
        behavior,
        request_deserializer=pb.StreamCreateTasksRequest.FromString,
        response_serializer=pb.StreamCreateTasksResponse.SerializeToString,
    )


def answer(request: pb.StreamCreateTasksRequest) -> pb.StreamCreateTasksResponse:
    return pb.StreamCreateTasksResponse(
        batch_id=request.batch_id,
        outcomes=[pb.CreateTaskOutcome(task=pb.Task(title=i.request.title)) for i in request.items],
    )


async def test_a_broken_stream_fails_its_waiting_batches_and_the_next_batch_opens_another() -> None:
    streams = 0
    first_read = asyncio.Event()

    async def serve(requests: AsyncIterator[pb.StreamCreateTasksRequest], context: Any) -> None:
        nonlocal streams
        streams += 1
        async for request in requests:
            if streams == 1:  # the first stream takes a batch and breaks without answering
                first_read.set()
                await context.abort(grpc.StatusCode.UNAVAILABLE, "going away")
            await context.write(answer(request))

    async with FakeScheduler({"StreamCreateTasks": stream_handler(serve)}) as fake:
        stream = CreateStream(fake.stub, ())
        try:
            with pytest.raises(grpc.aio.AioRpcError) as broken:
                await stream(batch(create("lost")), timeout=10)
            assert first_read.is_set()
            assert broken.value.code() == grpc.StatusCode.UNAVAILABLE
            assert from_rpc_error(broken.value).status == 503
            assert titles(await stream(batch(create("next")), timeout=10)) == ["next"]
            assert stream.opened == 2
        finally:
            await stream.close()


async def test_a_batch_past_its_deadline_is_deadline_exceeded_and_the_stream_lives_on() -> None:
    """The late batch's wait ends, not the stream: cancelling a write would cancel the whole
    call, so the deadline covers only the wait for the answer."""
    held = asyncio.Event()

    async def serve(requests: AsyncIterator[pb.StreamCreateTasksRequest], context: Any) -> None:
        async for request in requests:
            if request.items[0].request.title == "slow":
                continue  # never answered
            await context.write(answer(request))
        held.set()

    async with FakeScheduler({"StreamCreateTasks": stream_handler(serve)}) as fake:
        stream = CreateStream(fake.stub, ())
        try:
            with pytest.raises(grpc.aio.AioRpcError) as late:
                await stream(batch(create("slow")), timeout=0.2)
            assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert titles(await stream(batch(create("quick")), timeout=10)) == ["quick"]
            assert stream.opened == 1
        finally:
            await stream.close()


async def test_a_scheduler_without_the_stream_gets_create_tasks_calls() -> None:
    calls = 0

    async def create_tasks(request: pb.CreateTasksRequest, context: Any) -> pb.CreateTasksResponse:
        nonlocal calls
        calls += 1
        return pb.CreateTasksResponse(outcomes=[pb.CreateTaskOutcome(task=pb.Task(title="old"))])

    unary = grpc.unary_unary_rpc_method_handler(
        create_tasks,
        request_deserializer=pb.CreateTasksRequest.FromString,
        response_serializer=pb.CreateTasksResponse.SerializeToString,
    )
    async with FakeScheduler({"CreateTasks": unary}) as fake:
        stream = CreateStream(fake.stub, ())
        try:
            assert titles(await stream(batch(create("x")), timeout=10)) == ["old"]
            assert stream.unary and calls == 1
            assert titles(await stream(batch(create("y")), timeout=10)) == ["old"]
            assert calls == 2 and stream.opened == 1, "not tried again"
        finally:
            await stream.close()


async def test_only_the_gateway_with_its_credential_may_open_the_stream(tmp_path: Path) -> None:
    """The stream is authenticated like any call: without a credential, or as a caller outside
    the method's list, it is refused; the gateway's credential opens it."""
    secrets = {"gateway": "gateway-secret", "notifier": "notifier-secret"}
    callers = ServerSecurity(auth=CallerAuth.from_secrets(secrets))
    async with scheduler_server(tmp_path, security=callers) as (engine, _, host):
        for identity, secret, code in (
            ("gateway", "wrong", grpc.StatusCode.UNAUTHENTICATED),
            ("notifier", "notifier-secret", grpc.StatusCode.PERMISSION_DENIED),
        ):
            security = ClientSecurity(identity, secret)
            async with aio_channel(f"127.0.0.1:{host.port}", security) as channel:
                stream = CreateStream(pb_grpc.SchedulerServiceStub(channel), security.metadata)
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stream(batch(create("no")), timeout=10)
                assert refused.value.code() == code
                await stream.close()
        security = ClientSecurity("gateway", "gateway-secret")
        ended_before = _streams_ended("OK")
        async with aio_channel(f"127.0.0.1:{host.port}", security) as channel:
            stream = CreateStream(pb_grpc.SchedulerServiceStub(channel), security.metadata)
            assert titles(await stream(batch(create("yes")), timeout=10)) == ["yes"]
            await stream.close()
        assert sum((await engine.store.count_by_state()).values()) == 1
        # The interceptor saw the stream through: one duration (and log line) when it ended.
        await until(lambda: _streams_ended("OK") == ended_before + 1)


async def test_a_fault_in_one_batch_is_its_internal_answer_and_the_stream_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch must always be answered: a fault while creating it (not a refusal) comes back
    as INTERNAL, as the call would have failed, without the details; the next batch is served."""
    async with served_scheduler(tmp_path) as (engine, stub):
        real = engine.create_batch
        faults = [RuntimeError("disk on fire")]

        async def create_batch(requests: Any) -> Any:
            if faults:
                raise faults.pop()
            return await real(requests)

        monkeypatch.setattr(engine, "create_batch", create_batch)
        stream = CreateStream(stub, ())
        try:
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await stream(batch(create("unlucky")), timeout=10)
            assert failed.value.code() == grpc.StatusCode.INTERNAL
            assert "fire" not in (failed.value.details() or "")
            assert from_rpc_error(failed.value).status == 500
            assert titles(await stream(batch(create("lucky")), timeout=10)) == ["lucky"]
            assert stream.opened == 1
        finally:
            await stream.close()


@dataclass
class _HeldScheduler:
    """A scheduler served in-process whose batches stop at their creates until ``release``."""

    servicer: SchedulerServicer
    engine: Engine
    stream: CreateStream  # the gateway's side
    holding: asyncio.Event  # a batch has been read and is at its creates
    release: asyncio.Event


@contextlib.asynccontextmanager
async def held_scheduler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, room: Callable[[], asyncio.Semaphore] | None = None
) -> AsyncIterator[_HeldScheduler]:
    async with scheduler_server(tmp_path) as (engine, servicer, host):
        if room is not None:
            monkeypatch.setattr(servicer, "_stream_room", room)
        real = engine.create_batch
        holding, release = asyncio.Event(), asyncio.Event()

        async def held_create_batch(requests: Any) -> Any:
            holding.set()
            await release.wait()
            return await real(requests)

        monkeypatch.setattr(engine, "create_batch", held_create_batch)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{host.port}") as channel:
            stream = CreateStream(pb_grpc.SchedulerServiceStub(channel), ())
            try:
                yield _HeldScheduler(servicer, engine, stream, holding, release)
            finally:
                await stream.close()


async def test_a_stopping_scheduler_answers_what_it_read_and_ends_its_create_streams(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream stays open as long as its gateway: a stopping scheduler must end it rather than
    wait out its server's grace. The batch it read is answered first; then the stream ends, and
    a new one is refused UNAVAILABLE (503) until a scheduler is back."""
    async with held_scheduler(tmp_path, monkeypatch) as held:
        stream = held.stream
        read = asyncio.create_task(stream(batch(create("read")), timeout=30))
        await held.holding.wait()  # the scheduler has read the batch and is creating it
        ending = asyncio.create_task(held.servicer.end_create_streams(grace_s=30))
        await asyncio.sleep(0.05)
        assert not ending.done(), "the stream ended before answering the batch it read"
        held.release.set()
        assert titles(await read) == ["read"]
        await asyncio.wait_for(ending, 10)  # ended with its batch, not after the 30 s grace
        await until(lambda: stream._stream is not None and stream._stream.broken is not None)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stream(batch(create("after")), timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert from_rpc_error(refused.value).status == 503
        assert sum((await held.engine.store.count_by_state()).values()) == 1  # "read" only


class _CountedRoom(asyncio.Semaphore):
    """A stream's room for batches, which says how many batches wait for a place in it."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.waiting = 0

    async def acquire(self) -> Literal[True]:
        self.waiting += 1
        try:
            return await super().acquire()
        finally:
            self.waiting -= 1


async def test_a_stopping_scheduler_also_answers_a_batch_it_read_while_waiting_for_room(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reader holds a batch it read until one being answered leaves room. A stop then must
    not drop it (its creates would fail 503 though nothing went wrong): it is answered too."""
    rooms: list[_CountedRoom] = []

    def one_batch_at_a_time() -> asyncio.Semaphore:
        rooms.append(_CountedRoom(1))
        return rooms[-1]

    async with held_scheduler(tmp_path, monkeypatch, room=one_batch_at_a_time) as held:
        first = asyncio.create_task(held.stream(batch(create("first")), timeout=30))
        await held.holding.wait()  # read, and being created: the room is full
        second = asyncio.create_task(held.stream(batch(create("second")), timeout=30))
        await until(lambda: rooms and rooms[0].waiting == 1)  # read, waiting for room
        ending = asyncio.create_task(held.servicer.end_create_streams(grace_s=30))
        held.release.set()
        assert titles(await first) == ["first"]
        assert titles(await second) == ["second"]
        await asyncio.wait_for(ending, 10)
        assert sum((await held.engine.store.count_by_state()).values()) == 2


class _WriteBreaks:
    """A stream call whose writes fail as grpc fails them when the connection breaks under one."""

    def __init__(self, call: Any) -> None:
        self._call = call

    def __getattr__(self, name: str) -> Any:
        return getattr(self._call, name)

    def __aiter__(self) -> Any:
        return self._call.__aiter__()

    async def write(self, request: Any) -> None:
        raise grpc.aio.AioRpcError(grpc.StatusCode.INTERNAL, grpc.aio.Metadata(), grpc.aio.Metadata(), "Stream removed")


async def test_a_batch_whose_write_breaks_is_unavailable_and_the_next_batch_opens_another_stream() -> None:
    """A chaos run SIGKILLed the scheduler while batches were being written: grpc failed the
    writes with INTERNAL, and their creates came back 500 where a client should retry. A write
    that breaks is a broken stream: the batch fails UNAVAILABLE (503: its creates may or may not
    have been made, as for a call cut off), that stream is cancelled, the next batch opens another."""

    async def serve(requests: AsyncIterator[pb.StreamCreateTasksRequest], context: Any) -> None:
        async for request in requests:
            await context.write(answer(request))

    async with FakeScheduler({"StreamCreateTasks": stream_handler(serve)}) as fake:
        calls: list[Any] = []

        def open_stream(**kwargs: Any) -> Any:
            calls.append(fake.stub.StreamCreateTasks(**kwargs))
            return _WriteBreaks(calls[-1]) if len(calls) == 1 else calls[-1]

        stub = SimpleNamespace(StreamCreateTasks=open_stream)
        stream = CreateStream(stub, ())  # type: ignore[arg-type]
        try:
            with pytest.raises(grpc.aio.AioRpcError) as broken:
                await stream(batch(create("unsent")), timeout=10)
            assert broken.value.code() == grpc.StatusCode.UNAVAILABLE
            assert from_rpc_error(broken.value).status == 503
            assert titles(await stream(batch(create("next")), timeout=10)) == ["next"]
            assert stream.opened == 2 and calls[0].cancelled()
        finally:
            await stream.close()


class _RefusedCall:
    """A stream the scheduler refused as a call (here UNAUTHENTICATED): its reader sees the
    refusal first, then the batch's write fails with it."""

    def __init__(self) -> None:
        self.refused = asyncio.Event()

    def __aiter__(self) -> _RefusedCall:
        return self

    async def __anext__(self) -> Any:
        self.refused.set()
        raise _refusal()

    async def write(self, request: Any) -> None:
        await self.refused.wait()  # the reader has failed the waiting batches by now
        raise _refusal()

    def cancel(self) -> bool:
        return False


def _refusal() -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(grpc.StatusCode.UNAUTHENTICATED, grpc.aio.Metadata(), grpc.aio.Metadata(), "no")


async def test_a_refused_write_leaves_no_error_unretrieved() -> None:
    """The refusal is raised to the batch's sender once, from its write; the same error set on
    the batch's answer by the reader is not left for asyncio to report as never retrieved."""
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: reported.append(context))
    try:
        stub = SimpleNamespace(StreamCreateTasks=lambda **_: _RefusedCall())
        stream = CreateStream(stub, ())  # type: ignore[arg-type]
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stream(batch(create("no")), timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        await stream.close()
        del refused
        gc.collect()
        assert [c["message"] for c in reported] == []
    finally:
        loop.set_exception_handler(previous)
