"""An in-process pending registry on port 0, reached through a real grpc.aio channel."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from libs.grpc_server import NO_CALLER_AUTH, start_server
from services.pending_registry.registry import PendingRegistry
from taskgate.pending.v1 import pending_pb2_grpc as pb_grpc

from .harness import Harness


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[Harness]:
    registry = PendingRegistry.open(f"sqlite:///{tmp_path}/pending.db")
    await asyncio.to_thread(registry.db.migrate)
    await registry.start()
    host = await start_server("127.0.0.1:0", [registry.registrar()], registry.service_names, security=NO_CALLER_AUTH)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{host.port}")
    try:
        yield Harness(registry, host, channel, pb_grpc.PendingRegistryServiceStub(channel))
    finally:
        await registry.stop()
        await channel.close()
        await host.stop(0)
        registry.db.close()
