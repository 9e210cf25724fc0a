"""python -m services.telemetry_agent"""

from __future__ import annotations

import asyncio
import os

import grpc

from libs.grpc_server import serve
from libs.metrics import register_scrape_gauge
from libs.startup import StopSignal, boot
from services.telemetry_agent.agent import Agent
from services.telemetry_agent.procread import ProcfsReader
from services.telemetry_agent.sampler import Sampler
from services.telemetry_agent.servicer import SERVICE_NAME, TelemetryAgentServicer
from taskgate.telemetry.v1 import telemetry_pb2_grpc


async def main() -> None:
    stop = StopSignal.install()
    settings = boot("telemetry_agent", os.environ)
    agent = Agent(Sampler(ProcfsReader()), settings.tasks.observation_interval_ms / 1000)

    async def watched() -> dict[tuple[str, ...], float]:
        return {(): float(agent.watch_count)}

    register_scrape_gauge("taskgate_telemetry_watched_trees", "Process trees the agent watches", [], watched)

    def register(server: grpc.aio.Server) -> None:
        telemetry_pb2_grpc.add_TelemetryAgentServiceServicer_to_server(TelemetryAgentServicer(agent), server)

    await serve(
        addr=settings.telemetry_addr,
        settings=settings,
        stop=stop,
        registrars=[register],
        service_names=[SERVICE_NAME],
        on_started=agent.start,
        on_stopping=agent.stop,
        metrics_port=settings.telemetry_metrics_port,
        process=True,
    )


if __name__ == "__main__":
    asyncio.run(main())
