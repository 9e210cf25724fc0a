"""python -m services.pending_registry"""

from __future__ import annotations

import asyncio
import os

from libs.grpc_server import serve
from libs.startup import StopSignal, boot, migrate
from services.pending_registry.registry import PendingRegistry


async def main() -> None:
    stop = StopSignal.install()
    settings = boot("pending_registry", os.environ)
    registry = PendingRegistry.open(settings.db_url("pending"))
    await migrate(registry.db)
    await registry.start()
    try:
        await serve(
            addr=settings.pending_addr,
            settings=settings,
            stop=stop,
            registrars=[registry.registrar()],
            service_names=registry.service_names,
            on_stopping=registry.stop,
        )
    finally:
        registry.db.close()


if __name__ == "__main__":
    asyncio.run(main())
