"""python -m services.pending_registry"""

from __future__ import annotations

import asyncio
import os

from libs.grpc_server import serve
from libs.metrics import register_scrape_gauge
from libs.startup import StopSignal, boot, migrate
from services.pending_registry.registry import PendingRegistry


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
    try:
        await serve(
            addr=settings.pending_addr,
            settings=settings,
            stop=stop,
            registrars=[registry.registrar()],
            service_names=registry.service_names,
            on_stopping=registry.stop,
            metrics_port=settings.pending_metrics_port,
            process=True,
        )
    finally:
        registry.db.close()


if __name__ == "__main__":
    asyncio.run(main())
