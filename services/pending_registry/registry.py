"""The pending registry assembled: database, store, live entries, questions and the servicer."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from libs.db import Database
from libs.grpc_server import Registrar
from services.pending_registry.entries import PendingEntries
from services.pending_registry.questions import Questions
from services.pending_registry.servicer import SERVICE_NAME, PendingRegistryServicer, registrar
from services.pending_registry.store import MIGRATIONS, PendingStore


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class PendingRegistry:
    db: Database
    store: PendingStore
    entries: PendingEntries
    questions: Questions

    @classmethod
    def open(cls, url: str, clock: Callable[[], int] = now_ms) -> PendingRegistry:
        """A registry on ``url``; call ``db.migrate()`` (blocking) and ``start()`` before serving."""
        db = Database(url, MIGRATIONS)
        store = PendingStore(db)
        return cls(db, store, PendingEntries(store, clock), Questions(store, clock))

    @property
    def service_names(self) -> list[str]:
        return [SERVICE_NAME]

    def registrar(self) -> Registrar:
        return registrar(PendingRegistryServicer(self.entries, self.questions))

    async def start(self) -> None:
        await self.entries.start()

    async def stop(self) -> None:
        """Wake every waiter with UNAVAILABLE (they call again); entries go, snapshots stay."""
        await self.questions.close()
        await self.entries.close()
