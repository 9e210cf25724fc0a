"""Test helpers: the in-process harness, Listen streams read with timeouts, error reasons."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import grpc

from libs.grpc_client import error_info
from libs.grpc_server import ServiceHost
from services.pending_registry.registry import PendingRegistry
from taskgate.pending.v1 import pending_pb2 as pb
from taskgate.pending.v1 import pending_pb2_grpc as pb_grpc


@dataclass
class Harness:
    registry: PendingRegistry
    host: ServiceHost
    channel: grpc.aio.Channel
    stub: pb_grpc.PendingRegistryServiceStub

    def listen(self, prefix: str, name: str = "test") -> Listener:
        return Listener(self.stub.Listen(pb.ListenRequest(prefix=prefix, listener_name=name)))

    async def has_listener(self, origin: str = "", session_id: str = "") -> bool:
        reply = await self.stub.HasListener(pb.HasListenerRequest(origin=origin, session_id=session_id), timeout=5)
        return reply.has_listener


class Listener:
    """A Listen stream read with timeouts, never with sleeps."""

    def __init__(self, call: grpc.aio.UnaryStreamCall) -> None:
        self.call = call

    async def next(self, timeout: float = 10.0) -> pb.ListenResponse:
        msg = await asyncio.wait_for(self.call.read(), timeout)
        assert msg is not grpc.aio.EOF, "listen stream ended"
        return msg  # type: ignore[no-any-return]

    async def until(self, accept: Callable[[pb.ListenResponse], bool], timeout: float = 10.0) -> pb.ListenResponse:
        deadline = time.monotonic() + timeout
        while True:
            msg = await self.next(max(0.01, deadline - time.monotonic()))
            if accept(msg):
                return msg

    async def synced(self) -> list[pb.ListenResponse]:
        """The backlog sent before SYNCED."""
        backlog: list[pb.ListenResponse] = []
        while True:
            msg = await self.next()
            if msg.type == pb.LISTEN_EVENT_TYPE_SYNCED:
                return backlog
            backlog.append(msg)

    def cancel(self) -> None:
        self.call.cancel()


def reason(exc: grpc.aio.AioRpcError) -> str:
    info = error_info(exc)
    return info.reason if info else ""


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float = 10.0, what: str = "condition") -> None:
    """Bounded polling for state another task or process changes."""
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)
