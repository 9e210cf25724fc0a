"""The service interceptor's error mapping, alike for every kind of handler: a DomainError is
its status (code, message, ErrorInfo), NotImplementedError is UNIMPLEMENTED, anything else
INTERNAL; each counted once under its method and code."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2
from prometheus_client import REGISTRY

from libs.errors import InvalidArgument
from libs.grpc_client import error_info
from libs.grpc_server import NO_CALLER_AUTH, start_server
from tests.support.waiting import until

SERVICE = "taskgate.test.Errors"
Request, Response = health_pb2.HealthCheckRequest, health_pb2.HealthCheckResponse


def _raise(kind: str) -> None:
    if kind == "domain":
        raise InvalidArgument("BAD_THING", "that thing is bad", field="thing")
    if kind == "unimplemented":
        raise NotImplementedError
    raise RuntimeError("a bug")


async def unary(request: Any, context: Any) -> Any:
    _raise(request.service)


async def server_stream(request: Any, context: Any) -> AsyncIterator[Any]:
    yield Response(status=Response.SERVING)  # one answer, then the error
    _raise(request.service)


async def both_ways(requests: Any, context: Any) -> None:
    async for request in requests:
        await context.write(Response(status=Response.SERVING))
        _raise(request.service)


def _count(method: str, code: str) -> float:
    labels = {"method": f"/{SERVICE}/{method}", "code": code}
    return REGISTRY.get_sample_value("taskgate_rpc_duration_seconds_count", labels) or 0.0


@pytest.fixture
async def channel() -> AsyncIterator[grpc.aio.Channel]:
    serializers = {"request_deserializer": Request.FromString, "response_serializer": Response.SerializeToString}
    handlers = {
        "Unary": grpc.unary_unary_rpc_method_handler(unary, **serializers),
        "ServerStream": grpc.unary_stream_rpc_method_handler(server_stream, **serializers),
        "BothWays": grpc.stream_stream_rpc_method_handler(both_ways, **serializers),
    }

    def register(server: grpc.aio.Server) -> None:
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))

    host = await start_server("127.0.0.1:0", [register], [], security=NO_CALLER_AUTH)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{host.port}") as opened:
        yield opened
    await host.stop(0)


async def _ended(channel: grpc.aio.Channel, method: str, kind: str) -> grpc.aio.AioRpcError:
    path = f"/{SERVICE}/{method}"
    codecs = {"request_serializer": Request.SerializeToString, "response_deserializer": Response.FromString}
    with pytest.raises(grpc.aio.AioRpcError) as ended:
        if method == "Unary":
            await channel.unary_unary(path, **codecs)(Request(service=kind), timeout=5)
        elif method == "ServerStream":
            call = channel.unary_stream(path, **codecs)(Request(service=kind), timeout=5)
            assert (await call.read()).status == Response.SERVING
            await call.read()
        else:
            call = channel.stream_stream(path, **codecs)(timeout=5)
            await call.write(Request(service=kind))
            assert (await call.read()).status == Response.SERVING
            await call.read()
    return ended.value


@pytest.mark.parametrize("method", ["Unary", "ServerStream", "BothWays"])
async def test_each_kind_of_handler_ends_with_the_status_its_error_maps_to(
    channel: grpc.aio.Channel, method: str
) -> None:
    for kind, code in (
        ("domain", grpc.StatusCode.INVALID_ARGUMENT),
        ("unimplemented", grpc.StatusCode.UNIMPLEMENTED),
        ("bug", grpc.StatusCode.INTERNAL),
    ):
        before = _count(method, code.name)
        error = await _ended(channel, method, kind)
        assert error.code() == code, (kind, error)
        if kind == "domain":
            info = error_info(error)
            assert error.details() == "that thing is bad"
            assert info is not None and info.reason == "BAD_THING" and info.metadata["field"] == "thing"
        elif kind == "bug":
            assert "a bug" not in (error.details() or ""), "no internals in the answer"
        assert _count(method, code.name) == before + 1


async def test_a_stopping_service_ends_its_open_streams_unavailable_not_after_its_grace() -> None:
    """Watches stay open as long as their clients: a stopping service ends them UNAVAILABLE at
    once (its clients reconnect) instead of waiting out its grace and cancelling them; a stream
    its client cancelled before is not counted as ended by the stop."""
    forever = asyncio.Event()

    async def watch(request: Any, context: Any) -> AsyncIterator[Any]:
        yield Response(status=Response.SERVING)
        await forever.wait()

    async def follow(requests: Any, context: Any) -> None:
        async for _ in requests:
            await context.write(Response(status=Response.SERVING))

    serializers = {"request_deserializer": Request.FromString, "response_serializer": Response.SerializeToString}
    handlers = {
        "Watch": grpc.unary_stream_rpc_method_handler(watch, **serializers),
        "Follow": grpc.stream_stream_rpc_method_handler(follow, **serializers),
    }

    def register(server: grpc.aio.Server) -> None:
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))

    codecs = {"request_serializer": Request.SerializeToString, "response_deserializer": Response.FromString}
    host = await start_server("127.0.0.1:0", [register], [], security=NO_CALLER_AUTH)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{host.port}") as channel:
            left = channel.unary_stream(f"/{SERVICE}/Watch", **codecs)(Request())
            assert (await left.read()).status == Response.SERVING
            left.cancel()  # its client went away before the stop
            await until(lambda: _count("Watch", "CANCELLED") >= 1)
            unavailable_before = _count("Watch", "UNAVAILABLE"), _count("Follow", "UNAVAILABLE")
            watching = channel.unary_stream(f"/{SERVICE}/Watch", **codecs)(Request())
            assert (await watching.read()).status == Response.SERVING
            following = channel.stream_stream(f"/{SERVICE}/Follow", **codecs)()
            await following.write(Request())
            assert (await following.read()).status == Response.SERVING

            await asyncio.wait_for(host.end_streams(grace=30), 10)  # not the 30 s grace
            for call in (watching, following):
                with pytest.raises(grpc.aio.AioRpcError) as ended:
                    await call.read()
                assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
                assert "stopping" in (ended.value.details() or "")
            assert (_count("Watch", "UNAVAILABLE"), _count("Follow", "UNAVAILABLE")) == (
                unavailable_before[0] + 1,
                unavailable_before[1] + 1,
            )
    finally:
        await host.stop(0)
