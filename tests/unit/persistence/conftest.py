"""The stores' tests run on SQLite and on a throwaway PostgreSQL cluster alike."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from libs.db import Database
from services.scheduler.store import MIGRATIONS as SCHEDULER_MIGRATIONS
from tests.support.postgres import fresh_database


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'test.db'}"
    return fresh_database(request.getfixturevalue("postgres_url"), "store")


@pytest.fixture
def scheduler_db(db_url: str) -> Iterator[Database]:
    db = Database(db_url, SCHEDULER_MIGRATIONS)
    assert db.migrate() == [1, 2, 3, 4, 5]
    yield db
    db.close()
