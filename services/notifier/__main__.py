"""python -m services.notifier"""

from __future__ import annotations

import asyncio
import os
import sys

from libs.db import Database
from libs.grpc_server import serve
from libs.log import configure_logging, get_logger
from libs.settings import SettingsError, load_settings
from services.notifier.servicer import NotifierServicer
from services.notifier.store import MIGRATIONS, NotifierStore
from taskgate.notifier.v1 import notifier_pb2, notifier_pb2_grpc


async def main() -> None:
    try:
        settings = load_settings(os.environ)
    except SettingsError as exc:
        sys.exit(f"notifier: {exc}")
    configure_logging("notifier", settings.log_level, settings.log_format)
    db = Database(settings.db_url("notifier"), MIGRATIONS)
    applied = await asyncio.to_thread(db.migrate)
    get_logger("notifier").info("database_ready", migrations_applied=applied)
    servicer = NotifierServicer(NotifierStore(db))
    try:
        await serve(
            addr=settings.notifier_addr,
            registrars=[lambda server: notifier_pb2_grpc.add_NotifierServiceServicer_to_server(servicer, server)],
            service_names=[notifier_pb2.DESCRIPTOR.services_by_name["NotifierService"].full_name],
        )
    finally:
        db.close()


if __name__ == "__main__":
    asyncio.run(main())
