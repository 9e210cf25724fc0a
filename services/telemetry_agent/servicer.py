"""gRPC servicer of the telemetry agent: translate requests, call the agent, translate back."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from services.telemetry_agent import convert
from services.telemetry_agent.agent import Agent
from taskgate.telemetry.v1 import telemetry_pb2 as pb
from taskgate.telemetry.v1 import telemetry_pb2_grpc as pb_grpc

# Observations per response in batch mode (a few hundred bytes each; far below the message limit).
MAX_BATCH = 500
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["TelemetryAgentService"].full_name


class TelemetryAgentServicer(pb_grpc.TelemetryAgentServiceServicer):
    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    async def Watch(self, request: pb.WatchRequest, context: grpc.aio.ServicerContext) -> pb.WatchResponse:
        await self.agent.watch(request.task_id, request.pid, request.pid_start_time)
        return pb.WatchResponse()

    async def Unwatch(self, request: pb.UnwatchRequest, context: grpc.aio.ServicerContext) -> pb.UnwatchResponse:
        await self.agent.unwatch(request.task_id)
        return pb.UnwatchResponse()

    async def ListWatches(
        self, request: pb.ListWatchesRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListWatchesResponse:
        entries, next_token = self.agent.list_watches(request.page_size, request.page_token)
        return pb.ListWatchesResponse(
            watches=[convert.watch_entry_to_pb(e) for e in entries], next_page_token=next_token
        )

    async def StreamObservations(
        self, request: pb.StreamObservationsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.StreamObservationsResponse]:
        subscription = self.agent.subscribe(include_latest=request.include_latest)
        try:
            # Headers now: a client that awaited them knows it is subscribed.
            await context.send_initial_metadata(())
            async for batch in subscription:
                if request.batch:
                    for start in range(0, len(batch), MAX_BATCH):
                        yield pb.StreamObservationsResponse(
                            observations=[convert.observation_to_pb(o) for o in batch[start : start + MAX_BATCH]]
                        )
                else:
                    for observation in batch:
                        yield pb.StreamObservationsResponse(observation=convert.observation_to_pb(observation))
        finally:
            self.agent.unsubscribe(subscription)
