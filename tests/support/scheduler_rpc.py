"""A real scheduler servicer on an in-process grpc.aio server over loopback, SQLite behind it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc

from libs.db import Database
from libs.grpc_server import NO_CALLER_AUTH, ServerSecurity, ServiceHost, start_server
from libs.settings import Settings, WorkerProfile
from services.scheduler.engine import Engine
from services.scheduler.servicer import SchedulerServicer
from services.scheduler.store import MIGRATIONS, SchedulerStore
from taskgate.scheduler.v1 import scheduler_pb2_grpc as pb_grpc

ServedScheduler = tuple[Engine, pb_grpc.SchedulerServiceStub]


@asynccontextmanager
async def scheduler_server(
    data_dir: Path, profile: str = "w", security: ServerSecurity = NO_CALLER_AUTH
) -> AsyncIterator[tuple[Engine, SchedulerServicer, ServiceHost]]:
    """An engine (one worker profile ``profile`` running `true`, nothing dispatching), its
    servicer, and the in-process server serving it on a loopback port."""
    db = Database(f"sqlite:///{data_dir / 's.db'}", MIGRATIONS)
    db.migrate()
    settings = Settings(data_dir=data_dir, workers={profile: WorkerProfile(command=["true"])})
    engine = Engine(settings, SchedulerStore(db))
    servicer = SchedulerServicer(engine)
    host = await start_server(
        "127.0.0.1:0",
        [lambda s: pb_grpc.add_SchedulerServiceServicer_to_server(servicer, s)],
        [],
        security=security,
    )
    try:
        yield engine, servicer, host
    finally:
        await host.server.stop(0)
        db.close()


@asynccontextmanager
async def served_scheduler(data_dir: Path, profile: str = "w") -> AsyncIterator[ServedScheduler]:
    """``scheduler_server`` and a stub calling it (also the event-stream benchmark's server)."""
    async with scheduler_server(data_dir, profile) as (engine, _, host):
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{host.port}")
        try:
            yield engine, pb_grpc.SchedulerServiceStub(channel)
        finally:
            await channel.close()
