"""gRPC channels and stubs to the internal services, opened in the app's lifespan."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import grpc
from fastapi import Request
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gateway_http.create_batches import CreateBatches
from gateway_http.create_stream import CreateStream
from gateway_http.task_reads import SharedTaskReads
from libs.grpc_client import REQUEST_ID_KEY, ClientSecurity, aio_channel
from libs.settings import Settings
from taskgate.notifier.v1 import notifier_pb2_grpc
from taskgate.pending.v1 import pending_pb2_grpc
from taskgate.scheduler.v1 import crons_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc

BACKEND_NAMES = ("scheduler", "pending", "telemetry", "notifier")


def request_metadata(request: Request) -> tuple[tuple[str, str], ...]:
    """gRPC metadata that carries the HTTP request's id into the backend's logs."""
    return ((REQUEST_ID_KEY, request.state.request_id),)


@dataclass
class Backends:
    channels: dict[str, grpc.aio.Channel]
    scheduler: scheduler_pb2_grpc.SchedulerServiceStub
    pending: pending_pb2_grpc.PendingRegistryServiceStub
    notifier: notifier_pb2_grpc.NotifierServiceStub
    timeout_s: float
    crons: crons_pb2_grpc.CronServiceStub
    creates: CreateBatches
    create_stream: CreateStream  # what ``creates`` sends its batches through
    reads: SharedTaskReads

    @classmethod
    def open(cls, settings: Settings) -> Backends:
        security = ClientSecurity.for_identity(settings, "gateway")
        channels = {name: aio_channel(getattr(settings, f"{name}_addr"), security) for name in BACKEND_NAMES}
        scheduler = scheduler_pb2_grpc.SchedulerServiceStub(channels["scheduler"])
        create_stream = CreateStream(scheduler, security.metadata)
        return cls(
            channels=channels,
            scheduler=scheduler,
            pending=pending_pb2_grpc.PendingRegistryServiceStub(channels["pending"]),
            notifier=notifier_pb2_grpc.NotifierServiceStub(channels["notifier"]),
            timeout_s=settings.rpc_timeout_ms / 1000,
            crons=crons_pb2_grpc.CronServiceStub(channels["scheduler"]),
            creates=CreateBatches(scheduler, send=create_stream),
            create_stream=create_stream,
            reads=SharedTaskReads(scheduler),
        )

    async def create_task(
        self, request: scheduler_pb2.CreateTaskRequest, request_id: str
    ) -> scheduler_pb2.CreateTaskResponse:
        """CreateTask, sent with the other creates of the moment (``gateway_http.create_batches``)."""
        return await self.creates.create(request, request_id, self.timeout_s)

    async def get_task(self, task_id: str, request_id: str) -> scheduler_pb2.GetTaskResponse:
        """GetTask from a read that began after this call, shared with the other callers for that task
        (``gateway_http.task_reads``): the reply must not be changed."""
        return await self.reads.get(task_id, request_id, self.timeout_s)

    async def health(self, timeout_s: float = 1.0) -> dict[str, str]:
        async def check(name: str, channel: grpc.aio.Channel) -> tuple[str, str]:
            stub = health_pb2_grpc.HealthStub(channel)
            try:
                reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout_s)
                return name, health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
            except grpc.aio.AioRpcError as exc:
                return name, f"UNREACHABLE ({exc.code().name})"

        results = await asyncio.gather(*(check(n, c) for n, c in self.channels.items()))
        return dict(results)

    async def close(self) -> None:
        await self.create_stream.close()
        await asyncio.gather(*(c.close() for c in self.channels.values()))
