"""python -m services.pending_registry"""

from __future__ import annotations

import asyncio
import contextlib
import os

from libs.clock import SystemClock
from libs.grpc_server import serve
from libs.metrics import register_scrape_gauge
from libs.startup import StopSignal, boot, migrate
from services.pending_registry.registry import PendingRegistry
from services.pending_registry.retention import QuestionRetention


async def main() -> None:
    stop = StopSignal.install()
    settings = boot("pending_registry", os.environ, one_per_data_dir=True)
    registry = PendingRegistry.open(settings.db_url("pending"))
    await migrate(registry.db)
    await registry.start()

    async def open_entries() -> dict[tuple[str, ...], float]:
        return {(): float(registry.entries.live_count)}

    async def waiting() -> dict[tuple[str, ...], float]:
        return {
            ("picker",): float(registry.entries.waiting_pickers),
            ("answer",): float(registry.questions.waiter_count),
        }

    register_scrape_gauge("taskgate_pending_open_entries", "Pending entries waiting for a reply", [], open_entries)
    register_scrape_gauge(
        "taskgate_pending_waiters", "Calls blocked waiting: PickNext pickers, AwaitAnswer workers", ["kind"], waiting
    )
    retention = QuestionRetention(registry.store, settings.pending_question_retention_ms, SystemClock())
    loops: list[asyncio.Task[None]] = []

    async def started() -> None:
        loops.append(asyncio.create_task(retention.loop(), name="question-retention"))

    async def stopping() -> None:
        for loop_task in loops:
            loop_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*loops, return_exceptions=True)
        await registry.stop()

    try:
        await serve(
            addr=settings.pending_addr,
            settings=settings,
            stop=stop,
            registrars=[registry.registrar()],
            service_names=registry.service_names,
            on_started=started,
            on_stopping=stopping,
            metrics_port=settings.pending_metrics_port,
            process=True,
        )
    finally:
        registry.db.close()


if __name__ == "__main__":
    asyncio.run(main())
