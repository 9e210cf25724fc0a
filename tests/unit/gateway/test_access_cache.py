"""The gateway's memory of verified keys and memberships: it spares the database on every
request, yet a change committed by another connection (the operator CLI) counts at once — on
SQLite through its data version, on PostgreSQL through the tables' notifications."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from gateway_http.access_cache import AccessCache, DataVersionProbe, NotifyProbe, probe_for
from gateway_http.store import MIGRATIONS, GatewayStore, hash_key
from libs.db import Database, libpq_url
from tests.support.postgres import fresh_database
from tests.unit.gateway.conftest import Gateway


class CountingDatabase(Database):
    def __init__(self, url: str) -> None:
        super().__init__(url, MIGRATIONS)
        self.reads = 0

    async def run(self, fn: Callable[[Any], Any]) -> Any:
        self.reads += 1
        return await super().run(fn)


@pytest.fixture
def db(tmp_path: Path) -> Iterator[CountingDatabase]:
    database = CountingDatabase(f"sqlite:///{tmp_path}/gateway.db")
    database.migrate()
    yield database
    database.close()


def other_connection(tmp_path: Path) -> sqlite3.Connection:
    """What the operator CLI is to the gateway: another connection to the same file."""
    return sqlite3.connect(tmp_path / "gateway.db", isolation_level=None)


def new_key(store: GatewayStore, principal: str = "dana") -> tuple[str, str]:
    with store.db.session() as s, s.begin():
        key, secret = store.create_key(s, principal, ["agent-1"], None)
        store.add_member(s, "agent-1", "cli-1", principal)
    return key.key_id, secret


async def test_a_verified_key_and_membership_are_answered_from_memory(db: CountingDatabase) -> None:
    store = GatewayStore(db)
    _, secret = new_key(store)
    assert (await store.authenticate(secret)) is not None and await store.member("agent-1", "cli-1", "dana")
    reads = db.reads
    for _ in range(5):
        assert (await store.authenticate(secret)) is not None
        assert await store.member("agent-1", "cli-1", "dana")
    assert db.reads == reads
    # Remembered by the secret's hash only.
    assert secret not in repr(store.cache._keys.entries) and hash_key(secret) in store.cache._keys.entries
    store.close()


async def test_a_revocation_by_another_connection_counts_on_the_next_call(db: CountingDatabase, tmp_path: Path) -> None:
    store = GatewayStore(db)
    key_id, secret = new_key(store)
    assert await store.authenticate(secret) is not None
    assert await store.authenticate(secret) is not None
    other_connection(tmp_path).execute("UPDATE api_keys SET revoked_at = 1 WHERE key_id = ?", (key_id,))
    assert await store.authenticate(secret) is None
    store.close()


async def test_a_removed_member_is_refused_on_the_next_call(db: CountingDatabase, tmp_path: Path) -> None:
    store = GatewayStore(db)
    new_key(store)
    assert await store.member("agent-1", "cli-1", "dana") and await store.member("agent-1", "cli-1", "dana")
    assert not await store.member("agent-1", "cli-2", "dana")
    conn = other_connection(tmp_path)
    conn.execute("DELETE FROM memberships WHERE session_id = 'cli-1'")
    assert not await store.member("agent-1", "cli-1", "dana")
    # A negative answer is forgotten as soon: the member added again is let in.
    conn.execute("INSERT INTO memberships VALUES ('agent-1', 'cli-2', 'dana', 0)")
    assert await store.member("agent-1", "cli-2", "dana")
    store.close()


async def test_unknown_keys_are_not_remembered(db: CountingDatabase) -> None:
    store = GatewayStore(db)
    for i in range(3):
        assert await store.authenticate(f"tg_guess-{i}") is None
        assert await store.authenticate(f"tg_guess-{i}") is None
    assert db.reads == 6 and not store.cache._keys.entries
    store.close()


async def test_the_rest_api_refuses_a_revoked_key_at_once(gateway: Gateway, tmp_path: Path) -> None:
    key, secret = await gateway.store.db.run(lambda s: gateway.store.create_key(s, "dana", ["agent-1"], None))
    headers = {"Authorization": f"Bearer {secret}"}
    for _ in range(2):
        assert (await gateway.client.get("/api/v1/me", headers=headers)).status_code == 200
    other_connection(tmp_path).execute("UPDATE api_keys SET revoked_at = 1 WHERE key_id = ?", (key.key_id,))
    refused = await gateway.client.get("/api/v1/me", headers=headers)
    assert refused.status_code == 401 and refused.json()["error"] == "UNAUTHENTICATED"


class FakeProbe(DataVersionProbe):
    def __init__(self) -> None:
        super().__init__("unused")
        self.value: int | None = 1

    def version(self) -> int | None:
        return self.value


def test_an_answer_read_before_a_change_the_cache_has_seen_is_dropped() -> None:
    probe = FakeProbe()
    cache: AccessCache[str] = AccessCache(probe)
    ticket = cache.ticket()
    assert ticket == 1
    # ... the database read is under way; meanwhile the key is revoked and another request
    # already noticed the change ...
    probe.value = 2
    assert cache.ticket() == 2
    cache.remember_key(ticket, "h", "stale")
    assert cache.key("h") is None
    cache.remember_key(2, "h", "fresh")
    assert cache.key("h") == "fresh"


def test_entries_expire_and_the_memory_is_bounded() -> None:
    now = [0.0]
    cache: AccessCache[str] = AccessCache(FakeProbe(), ttl_s=10, max_keys=3, max_memberships=2, clock=lambda: now[0])
    ticket = cache.ticket()
    assert ticket is not None
    for i in range(5):
        cache.remember_key(ticket, f"h{i}", f"k{i}")
        cache.remember_membership(ticket, "a", f"s{i}", "p", True)
    assert [cache.key(f"h{i}") for i in range(5)] == [None, None, "k2", "k3", "k4"]
    assert [cache.membership("a", f"s{i}", "p") for i in range(5)] == [None, None, None, True, True]
    now[0] = 10.0
    assert cache.key("h4") is None and cache.membership("a", "s4", "p") is None


def test_a_probe_that_cannot_tell_disables_the_memory() -> None:
    probe = FakeProbe()
    cache: AccessCache[str] = AccessCache(probe)
    ticket = cache.ticket()
    assert ticket is not None
    cache.remember_key(ticket, "h", "k")
    probe.value = None
    assert cache.ticket() is None and cache.key("h") is None


def test_a_sqlite_file_and_postgresql_have_a_probe(tmp_path: Path) -> None:
    from psycopg import pq

    from gateway_http.access_cache import CONNECTION_OK

    assert CONNECTION_OK == pq.ConnStatus.OK
    assert probe_for("sqlite:///:memory:") is None
    assert isinstance(probe_for(f"sqlite:///{tmp_path}/g.db"), DataVersionProbe)
    probe = probe_for("postgresql+psycopg://u@localhost/db")
    assert isinstance(probe, NotifyProbe) and probe.url == "postgresql://u@localhost/db"
    probe.close()  # nothing was connected: it connects on its first use


# --- PostgreSQL: notifications --------------------------------------------------------


@pytest.fixture
def pg_db(postgres_url: str) -> Iterator[CountingDatabase]:
    database = CountingDatabase(fresh_database(postgres_url, "access"))
    database.migrate()
    yield database
    database.close()


async def eventually(check: Callable[[], Any], timeout_s: float = 10.0) -> Any:
    """``check()``'s first truthy answer, asked on the event loop until ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not (answer := check()):
        assert time.monotonic() < deadline, "not within the time allowed"
        await asyncio.sleep(0.01)
    return answer


def pg_execute(db: Database, sql: str, *params: object) -> None:
    """What the operator CLI is to the gateway: another connection, committing at once."""
    with psycopg.connect(libpq_url(db.url), autocommit=True) as conn:
        conn.execute(sql, params)  # type: ignore[arg-type]


async def test_on_postgresql_a_revocation_counts_once_its_notification_has_arrived(
    pg_db: CountingDatabase,
) -> None:
    store = GatewayStore(pg_db)
    key_id, secret = new_key(store)
    assert store.cache.ticket() is None  # not listening yet: nothing is remembered meanwhile
    assert await store.authenticate(secret) is not None
    assert not store.cache._keys.entries
    ticket = await eventually(store.cache.ticket)  # the listener is connected
    assert await store.authenticate(secret) is not None and await store.member("agent-1", "cli-1", "dana")
    reads = pg_db.reads
    for _ in range(3):
        assert await store.authenticate(secret) is not None and await store.member("agent-1", "cli-1", "dana")
    assert pg_db.reads == reads

    pg_execute(pg_db, "UPDATE api_keys SET revoked_at = 1 WHERE key_id = %s", key_id)
    await eventually(lambda: store.cache.ticket() != ticket)
    assert await store.authenticate(secret) is None
    # A removed membership, the same way; a change to another table forgets nothing.
    ticket = store.cache.ticket()
    assert ticket is not None  # the listener is connected
    pg_execute(pg_db, "INSERT INTO channel_bindings VALUES ('tg', '1', '', 'agent-1', 'cli-1', 0)")
    pg_execute(pg_db, "DELETE FROM memberships WHERE session_id = 'cli-1'")
    await eventually(lambda: store.cache.ticket() != ticket)
    assert store.cache.ticket() == ticket + 1  # one notification: the membership's
    assert not await store.member("agent-1", "cli-1", "dana")
    store.close()


async def test_on_postgresql_a_lost_listener_disables_the_memory_until_it_is_back(pg_db: CountingDatabase) -> None:
    store = GatewayStore(pg_db)
    _, secret = new_key(store)
    probe = store.cache.probe
    assert isinstance(probe, NotifyProbe)
    ticket = await eventually(store.cache.ticket)
    assert await store.authenticate(secret) is not None and store.cache._keys.entries
    (remembered,) = store.cache._keys.entries.values()
    listener_pid = probe._conn.info.backend_pid
    pg_execute(pg_db, "SELECT pg_terminate_backend(%s)", listener_pid)
    # Until a new connection listens, every call reads the database (and one that comes after
    # it, with nothing remembered since, reads it too: the listener may be back already).
    assert await eventually(lambda: store.cache.ticket() is None)
    reads = pg_db.reads
    assert await store.authenticate(secret) is not None and pg_db.reads == reads + 1
    later = await eventually(store.cache.ticket)
    assert later != ticket
    # What it remembered before is gone (the key may be remembered again, read under the new ticket).
    assert all(entry is not remembered for entry in store.cache._keys.entries.values())
    assert probe._conn.info.backend_pid != listener_pid
    store.close()
