"""The gateway app in-process (httpx over ASGI), its backends' health served by real
grpc.aio servers on port 0 whose status each test sets."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import pytest
from fastapi import FastAPI
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from gateway_http.app import create_app
from gateway_http.backends import BACKEND_NAMES, Backends
from gateway_http.store import MIGRATIONS, GatewayStore
from libs.db import Database
from libs.settings import Settings, load_settings

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@dataclass
class Gateway:
    app: FastAPI
    client: httpx.AsyncClient
    settings: Settings
    store: GatewayStore
    health: dict[str, health.aio.HealthServicer]
    servers: dict[str, grpc.aio.Server]

    async def set_health(self, name: str, status: int) -> None:
        await self.health[name].set("", status)

    async def stop_backend(self, name: str) -> None:
        await self.servers[name].stop(0)


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[Gateway]:
    servers: dict[str, grpc.aio.Server] = {}
    servicers: dict[str, health.aio.HealthServicer] = {}
    env = {
        "TASKGATE_DATA_DIR": str(tmp_path),
        "TASKGATE_MAX_BODY_BYTES": "4096",
        "TASKGATE_SECRET_GATEWAY": "unit-test-gateway",
    }
    for name in BACKEND_NAMES:
        server = grpc.aio.server()
        servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        await servicer.set("", SERVING)
        servers[name], servicers[name] = server, servicer
        env[f"TASKGATE_{name.upper()}_ADDR"] = f"127.0.0.1:{port}"
    settings = load_settings(env)
    db = Database(f"sqlite:///{tmp_path}/gateway.db", MIGRATIONS)
    db.migrate()
    store = GatewayStore(db)
    app = create_app(settings, store)
    # The lifespan is not run over ASGITransport: open the channels as it would.
    app.state.backends = Backends.open(settings)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway")
    try:
        yield Gateway(app, client, settings, store, servicers, servers)
    finally:
        await client.aclose()
        await app.state.backends.close()
        for server in servers.values():
            await server.stop(0)
        db.close()
