"""python -m services.notifier"""

from __future__ import annotations

import asyncio
import os

from libs.db import Database
from libs.grpc_server import serve
from libs.startup import StopSignal, boot, migrate
from services.notifier.servicer import NotifierServicer
from services.notifier.store import MIGRATIONS, NotifierStore
from taskgate.notifier.v1 import notifier_pb2, notifier_pb2_grpc


async def main() -> None:
    stop = StopSignal.install()
    settings = boot("notifier", os.environ)
    db = Database(settings.db_url("notifier"), MIGRATIONS)
    await migrate(db)
    servicer = NotifierServicer(NotifierStore(db))
    try:
        await serve(
            addr=settings.notifier_addr,
            settings=settings,
            stop=stop,
            registrars=[lambda server: notifier_pb2_grpc.add_NotifierServiceServicer_to_server(servicer, server)],
            service_names=[notifier_pb2.DESCRIPTOR.services_by_name["NotifierService"].full_name],
        )
    finally:
        db.close()


if __name__ == "__main__":
    asyncio.run(main())
