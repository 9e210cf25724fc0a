"""python -m gateway_http"""

from __future__ import annotations

import asyncio
import os

import uvicorn

from gateway_http.app import create_app
from gateway_http.sse_wire import expose_connection
from gateway_http.store import MIGRATIONS, GatewayStore
from libs.db import Database
from libs.log import get_logger
from libs.metrics import MetricsEndpoint
from libs.startup import boot, migrate, settle_heap


async def main() -> None:
    settings = boot("gateway_http", os.environ)
    db = Database(settings.db_url("gateway"), MIGRATIONS)
    await migrate(db)
    log = get_logger("gateway_http")
    host, _, port = settings.http_addr.rpartition(":")
    store = GatewayStore(db)
    config = uvicorn.Config(
        # The task stream writes its frames to the connection itself (gateway_http.sse_wire).
        expose_connection(create_app(settings, store)),
        host=host,
        port=int(port),
        log_config=None,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=5,
    )
    metrics = MetricsEndpoint.start(settings.metrics_host, settings.gateway_metrics_port)
    settle_heap()  # the application is built; what uvicorn's start-up adds is small
    try:
        await uvicorn.Server(config).serve()
    finally:
        if metrics is not None:
            await metrics.stop()
        store.close()
        db.close()
        log.info("stopped")


if __name__ == "__main__":
    asyncio.run(main())
