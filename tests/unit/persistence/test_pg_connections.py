"""PostgreSQL's pooled connections: checked without a round trip per transaction, and a
connection the server closed replaced before use (``libs.db._ping_when_in_doubt``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import Connection, text

from libs import db as db_module
from libs.db import Database, libpq_url
from tests.support.postgres import fresh_database


@pytest.fixture
def pg_db(postgres_url: str) -> Iterator[Database]:
    db = Database(fresh_database(postgres_url, "pings"), [])
    db.migrate()
    yield db
    db.close()


@pytest.fixture
def pings(pg_db: Database, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every ping the pool sends, counted."""
    sent: list[int] = []
    real = pg_db.engine.dialect.do_ping

    def counted(dbapi_conn: Any) -> bool:
        sent.append(1)
        return real(dbapi_conn)

    monkeypatch.setattr(pg_db.engine.dialect, "do_ping", counted)
    return sent


def _backend_pid(conn: Connection) -> int:
    return int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())


def test_back_to_back_transactions_send_no_ping(pg_db: Database, pings: list[int]) -> None:
    pids = {pg_db.transaction(_backend_pid) for _ in range(50)}
    assert pings == []
    assert len(pids) == 1  # one pooled connection, used again each time


def test_a_connection_the_server_closed_is_replaced_before_use(pg_db: Database, pings: list[int]) -> None:
    old = pg_db.transaction(_backend_pid)
    url = libpq_url(pg_db.engine.url.render_as_string(hide_password=False))
    with psycopg.connect(url, autocommit=True) as admin:
        assert admin.execute("SELECT pg_terminate_backend(%s)", (old,)).fetchone() == (True,)
        deadline = time.monotonic() + 30
        while admin.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (old,)).fetchone() != (0,):
            assert time.monotonic() < deadline, "the terminated backend did not exit"
            time.sleep(0.01)
    # The next transaction runs, on a new connection: the dead one's socket said so, its ping failed.
    new = pg_db.transaction(_backend_pid)
    assert new != old
    assert len(pings) == 1


def test_a_connection_idle_for_long_is_pinged(
    pg_db: Database, pings: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    first = pg_db.transaction(_backend_pid)
    monkeypatch.setattr(db_module, "PING_AFTER_IDLE_S", 0.0)
    assert pg_db.transaction(_backend_pid) == first  # alive: pinged, and kept
    assert len(pings) == 1
