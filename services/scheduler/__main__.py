"""python -m services.scheduler"""

from __future__ import annotations

import asyncio
import os
import sys

import grpc
import structlog

from libs.db import Database
from libs.grpc_client import ClientSecurity
from libs.grpc_server import serve
from libs.metrics import register_scrape_gauge
from libs.startup import FolderInUse, StopSignal, boot, migrate
from services.scheduler.cron_servicer import CronServicer
from services.scheduler.cron_store import MIGRATIONS
from services.scheduler.domain import State
from services.scheduler.engine import Engine
from services.scheduler.failure_reports import FailureReportsClient
from services.scheduler.hosts import resolve_host_id, scheduler_pg_settings
from services.scheduler.processes import open_files_for
from services.scheduler.questions import QuestionsClient
from services.scheduler.servicer import SchedulerServicer, WorkerServicer
from services.scheduler.store import SchedulerStore
from services.scheduler.telemetry import TelemetryClient
from services.scheduler.worker_api import WorkerSockets, start_worker_server
from taskgate.scheduler.v1 import crons_pb2, crons_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc

log = structlog.get_logger("scheduler")

# How long a stopping scheduler waits for its create streams to answer the batches they read.
CREATE_STREAMS_GRACE_S = 3.0


async def main() -> None:
    stop = StopSignal.install()
    settings = boot("scheduler", os.environ, one_per_data_dir=True)
    limit, needed = open_files_for(settings.tasks.max_running)
    if limit < needed:
        log.warning(
            "open_files_limit_low",
            limit=limit,
            needed=needed,
            detail=f"max_running = {settings.tasks.max_running} keeps about {needed} files open; raise the hard limit",
        )
    db = Database(settings.db_url("scheduler"), MIGRATIONS, pg_settings=scheduler_pg_settings(settings.tasks.lease_ms))
    host_id = resolve_host_id(settings.scheduler_host_id, settings.data_dir)
    await migrate(db)
    security = ClientSecurity.for_identity(settings, "scheduler")
    telemetry = TelemetryClient(settings.telemetry_addr, security)
    questions = QuestionsClient(settings.pending_addr, security)
    failure_reports = FailureReportsClient(settings.notifier_addr, security)
    # This process spawns nothing but workers, so every other child is a worker's orphan.
    engine = Engine(
        settings,
        SchedulerStore(db, host_id),
        telemetry=telemetry,
        questions=questions,
        reap_unknown_orphans=True,
        failure_reports=failure_reports,
    )
    # Workers reach only this listener (Unix sockets), never the SchedulerService port.
    try:
        sockets = WorkerSockets(settings.worker_socket_dir, engine.worker_uids())
    except FolderInUse as exc:
        db.close()
        sys.exit(f"scheduler: {exc}")
    engine.worker_addr = sockets.addr_for
    worker_server: grpc.aio.Server | None = None

    async def started() -> None:
        nonlocal worker_server
        worker_server = await start_worker_server(
            lambda server: scheduler_pb2_grpc.add_WorkerServiceServicer_to_server(WorkerServicer(engine), server),
            sockets,
        )
        log.info("worker_api_listening", addrs=[sockets.addr_for(uid) for uid in sockets.uids])
        telemetry.start(engine.record_observation)
        await engine.start()

    servicer = SchedulerServicer(engine)

    async def stopping() -> None:
        # First, while the engine still answers: the gateways' create streams end (their
        # batches read are answered) instead of holding the server's grace to its end.
        await servicer.end_create_streams(grace_s=CREATE_STREAMS_GRACE_S)
        await engine.shutdown()
        if worker_server is not None:
            await worker_server.stop(1.0)
        sockets.close()
        await telemetry.close()
        await questions.close()
        await failure_reports.close()

    def register(server: object) -> None:
        scheduler_pb2_grpc.add_SchedulerServiceServicer_to_server(servicer, server)
        crons_pb2_grpc.add_CronServiceServicer_to_server(CronServicer(engine.crons), server)

    async def tasks_by_state() -> dict[tuple[str, ...], float]:
        counts = await engine.runtime.store.count_by_state()
        return {(state.value,): float(counts.get(state.value, 0)) for state in State}

    async def watchers() -> dict[tuple[str, ...], float]:
        return {(): float(engine.runtime.hub.subscriber_count)}

    register_scrape_gauge("taskgate_tasks", "Tasks by state (read from the store on scrape)", ["state"], tasks_by_state)
    register_scrape_gauge(
        "taskgate_task_watchers", "Live WatchTasks subscriptions (session and task watchers)", [], watchers
    )

    names = [
        scheduler_pb2.DESCRIPTOR.services_by_name["SchedulerService"].full_name,
        crons_pb2.DESCRIPTOR.services_by_name["CronService"].full_name,
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
            metrics_port=settings.scheduler_metrics_port,
            process=True,
        )
    finally:
        db.close()


if __name__ == "__main__":
    asyncio.run(main())
