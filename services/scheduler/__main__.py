"""python -m services.scheduler"""

from __future__ import annotations

import asyncio
import os

from libs.db import Database
from libs.grpc_client import ClientSecurity
from libs.grpc_server import serve
from libs.startup import StopSignal, boot, migrate
from services.scheduler.engine import Engine
from services.scheduler.questions import QuestionsClient
from services.scheduler.servicer import SchedulerServicer, WorkerServicer
from services.scheduler.store import MIGRATIONS, SchedulerStore
from services.scheduler.telemetry import TelemetryClient
from taskgate.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc


async def main() -> None:
    stop = StopSignal.install()
    settings = boot("scheduler", os.environ)
    db = Database(settings.db_url("scheduler"), MIGRATIONS)
    await migrate(db)
    security = ClientSecurity.for_identity(settings, "scheduler")
    telemetry = TelemetryClient(settings.telemetry_addr, security)
    questions = QuestionsClient(settings.pending_addr, security)
    engine = Engine(settings, SchedulerStore(db), telemetry=telemetry, questions=questions)

    async def started() -> None:
        telemetry.start(engine.record_observation)
        await engine.start()

    async def stopping() -> None:
        await engine.shutdown()
        await telemetry.close()
        await questions.close()

    def register(server: object) -> None:
        scheduler_pb2_grpc.add_SchedulerServiceServicer_to_server(SchedulerServicer(engine), server)
        scheduler_pb2_grpc.add_WorkerServiceServicer_to_server(WorkerServicer(engine), server)

    names = [
        scheduler_pb2.DESCRIPTOR.services_by_name["SchedulerService"].full_name,
        scheduler_pb2.DESCRIPTOR.services_by_name["WorkerService"].full_name,
    ]
    try:
        await serve(
            addr=settings.scheduler_addr,
            settings=settings,
            stop=stop,
            registrars=[register],
            service_names=names,
            on_started=started,
            on_stopping=stopping,
        )
    finally:
        db.close()


if __name__ == "__main__":
    asyncio.run(main())
