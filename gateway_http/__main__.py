"""python -m gateway_http"""

from __future__ import annotations

import asyncio
import os
import sys

import uvicorn

from gateway_http.app import create_app
from gateway_http.store import MIGRATIONS, GatewayStore
from libs.db import Database
from libs.log import configure_logging, get_logger
from libs.settings import SettingsError, load_settings


async def main() -> None:
    try:
        settings = load_settings(os.environ)
    except SettingsError as exc:
        sys.exit(f"gateway_http: {exc}")
    configure_logging("gateway_http", settings.log_level, settings.log_format)
    db = Database(settings.db_url("gateway"), MIGRATIONS)
    applied = await asyncio.to_thread(db.migrate)
    log = get_logger("gateway_http")
    log.info("database_ready", migrations_applied=applied)
    host, _, port = settings.http_addr.rpartition(":")
    config = uvicorn.Config(
        create_app(settings, GatewayStore(db)),
        host=host,
        port=int(port),
        log_config=None,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=5,
    )
    try:
        await uvicorn.Server(config).serve()
    finally:
        db.close()
        log.info("stopped")


if __name__ == "__main__":
    asyncio.run(main())
