"""python -m services.pending_registry"""

from __future__ import annotations

import asyncio
import os
import sys

from libs.grpc_server import serve
from libs.log import configure_logging, get_logger
from libs.settings import SettingsError, load_settings
from services.pending_registry.registry import PendingRegistry


async def main() -> None:
    try:
        settings = load_settings(os.environ)
    except SettingsError as exc:
        sys.exit(f"pending-registry: {exc}")
    configure_logging("pending_registry", settings.log_level, settings.log_format)
    log = get_logger("pending_registry")
    registry = PendingRegistry.open(settings.db_url("pending"))
    applied = await asyncio.to_thread(registry.db.migrate)
    log.info(
        "database_ready", url=registry.db.engine.url.render_as_string(hide_password=True), migrations_applied=applied
    )
    await registry.start()
    try:
        await serve(
            addr=settings.pending_addr,
            registrars=[registry.registrar()],
            service_names=registry.service_names,
            on_stopping=registry.stop,
        )
    finally:
        registry.db.close()


if __name__ == "__main__":
    asyncio.run(main())
