"""python -m services.notifier"""

from __future__ import annotations

import asyncio
import contextlib
import os

import httpx
import structlog

from libs.clock import SystemClock
from libs.db import Database
from libs.grpc_client import ClientSecurity, aio_channel
from libs.grpc_server import serve
from libs.settings import Settings
from libs.startup import StopSignal, boot, migrate
from services.notifier.activity import ActivityHub
from services.notifier.delivery import Deliverer
from services.notifier.retention import ConversationRetention, NotificationRetention
from services.notifier.scheduler_link import EventLogFollower, SchedulerSessionTasks
from services.notifier.servicer import NotifierServicer
from services.notifier.store import MIGRATIONS, NotifierStore
from taskgate.notifier.v1 import notifier_pb2, notifier_pb2_grpc
from taskgate.scheduler.v1 import scheduler_pb2_grpc

log = structlog.get_logger("notifier")


async def prune_loop(store: NotifierStore, settings: Settings, clock: SystemClock) -> None:
    while True:
        try:
            removed = await store.prune_activity(clock.now_ms() - settings.notifier.activity_retention_ms)
            if removed:
                log.info("activity_pruned", frames=removed)
        except Exception:  # noqa: BLE001 - try again next round
            log.exception("activity_prune_failed")
        await asyncio.sleep(60)


async def main() -> None:
    stop = StopSignal.install()
    settings = boot("notifier", os.environ, one_per_data_dir=True)
    db = Database(settings.db_url("notifier"), MIGRATIONS)
    await migrate(db)
    store = NotifierStore(db, settings.notifier.activity_retention_frames)
    clock = SystemClock()
    scheduler_channel = aio_channel(settings.scheduler_addr, ClientSecurity.for_identity(settings, "notifier"))
    scheduler = scheduler_pb2_grpc.SchedulerServiceStub(scheduler_channel)
    http = httpx.AsyncClient(follow_redirects=False)
    deliverer = Deliverer(store, settings.notifier, dict(settings.channels), clock, http, settings.http_addr)
    servicer = NotifierServicer(
        store,
        ActivityHub(),
        clock,
        channel_of=lambda agent_id: settings.agent(agent_id).channel,
        session_tasks=SchedulerSessionTasks(scheduler, settings.rpc_timeout_ms / 1000),
        wake_delivery=deliverer.wake,
        reminder_base_ms=settings.notifier.question_reminder_ms,
        snooze_ms=settings.notifier.question_snooze_ms,
    )
    follower = EventLogFollower(scheduler, servicer, store)
    retention = NotificationRetention(store, settings.notifier.notification_retention_ms, clock)
    history = ConversationRetention(store, settings.notifier.conversation_retention_ms, clock)
    loops: list[asyncio.Task[None]] = []

    async def started() -> None:
        loops.extend(
            [
                asyncio.create_task(follower.run(), name="event-log-follower"),
                asyncio.create_task(deliverer.run(), name="delivery"),
                asyncio.create_task(prune_loop(store, settings, clock), name="activity-prune"),
                asyncio.create_task(retention.loop(), name="notification-retention"),
                asyncio.create_task(history.loop(), name="conversation-retention"),
            ]
        )

    async def stopping() -> None:
        for loop_task in loops:
            loop_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*loops, return_exceptions=True)

    try:
        await serve(
            addr=settings.notifier_addr,
            settings=settings,
            stop=stop,
            registrars=[lambda server: notifier_pb2_grpc.add_NotifierServiceServicer_to_server(servicer, server)],
            service_names=[notifier_pb2.DESCRIPTOR.services_by_name["NotifierService"].full_name],
            on_started=started,
            on_stopping=stopping,
            metrics_port=settings.notifier_metrics_port,
            process=True,
        )
    finally:
        await http.aclose()
        await scheduler_channel.close()
        db.close()


if __name__ == "__main__":
    asyncio.run(main())
