"""A bounded, short-lived memory of verified API keys and session memberships.

Every REST call checks its key and (on session routes) the principal's membership; read
from the database each time, that was the larger part of the gateway's CPU per call.
Keys and memberships change only through the operator CLI — another process writing the
same database — so the cache must notice a commit it did not make, and forgets everything
when one happened:

- SQLite: it asks ``PRAGMA data_version`` (it moves whenever another connection commits)
  before every use, so a revoked key or a removed member is refused on the very next request.
- PostgreSQL: triggers on the two tables NOTIFY at commit (gateway store, migration 4); a
  private connection LISTENs, and every use first drains what has arrived on its socket
  without waiting. A change counts from the moment its notification reaches the gateway — in
  practice well under a millisecond after the commit, before the CLI that made it has exited.
  While that connection is down nothing is cached (and it is reconnected in the background).

Entries live at most ``ttl_s`` whatever happens. Keys are remembered by the SHA-256 of the
secret, never the secret itself; unknown keys are not remembered (a flood of guesses must not
evict real entries).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import structlog

from libs.db import libpq_url

log = structlog.get_logger("gateway_http")

V = TypeVar("V")

# What the gateway store's triggers NOTIFY on PostgreSQL when a key or a membership changes.
ACCESS_CHANNEL = "taskgate_access"
RECONNECT_MIN_S = 0.5
RECONNECT_MAX_S = 10.0
CONNECTION_OK = 0  # libpq's CONNECTION_OK (psycopg.pq.ConnStatus.OK; psycopg is imported only on PostgreSQL)


class Probe(Protocol):
    def version(self) -> int | None:
        """A number that moves whenever a key or a membership may have changed; None: cannot tell."""

    def close(self) -> None: ...


DEFAULT_TTL_S = 10.0
DEFAULT_MAX_KEYS = 1024
DEFAULT_MAX_MEMBERSHIPS = 8192


class DataVersionProbe:
    """Whether another connection committed to a SQLite database since the last look.

    One private connection that never writes nor holds a transaction open; the pragma
    reads the WAL index in shared memory (a few microseconds) and never waits for a lock
    (timeout 0), so it may run on the event loop. ``None`` means "cannot tell".
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._conn: sqlite3.Connection | None = None

    def version(self) -> int | None:
        try:
            if self._conn is None:
                self._conn = sqlite3.connect(self.path, isolation_level=None, timeout=0, check_same_thread=False)
            row = self._conn.execute("PRAGMA data_version").fetchone()
            return int(row[0])
        except sqlite3.Error:
            return None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class NotifyProbe:
    """Whether a key or a membership changed on a PostgreSQL database since the last look.

    One private connection LISTENs on ``ACCESS_CHANNEL``. A look drains what has arrived on
    its socket (libpq's sockets never block: a few microseconds, so it may run on the event
    loop): each notification moves the version, and so does each new connection — what
    changed while nobody listened is unknown. While there is no connection the answer is
    None, and a thread connects again, waiting longer after each failure.
    """

    def __init__(self, url: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.url = libpq_url(url)
        self.clock = clock
        self._conn: Any = None  # a psycopg.Connection in LISTEN, used by the event loop only
        self._ready: Any = None  # a connection the connecting thread hands over
        self._generation = 0
        self._lock = threading.Lock()
        self._connecting = False
        self._next_attempt = 0.0
        self._delay = RECONNECT_MIN_S
        self._closed = False

    def version(self) -> int | None:
        if self._conn is None:
            with self._lock:
                self._conn, self._ready = self._ready, None
            if self._conn is None:
                self._connect_later()
                return None
            self._generation += 1  # a fresh connection: whatever was remembered before is stale
        try:
            pgconn = self._conn.pgconn
            pgconn.consume_input()
            while pgconn.notifies() is not None:
                self._generation += 1
            if pgconn.status != CONNECTION_OK:
                raise ConnectionError(f"the connection's status is {pgconn.status}")
        except Exception as exc:  # the server or the network dropped it: cache nothing meanwhile
            log.warning("access_listener_lost", error=repr(exc))
            self._drop()
            self._connect_later()
            return None
        return self._generation

    def _connect_later(self) -> None:
        with self._lock:
            if self._closed or self._connecting or self.clock() < self._next_attempt:
                return
            self._connecting = True
        threading.Thread(target=self._connect, name="access-listener-connect", daemon=True).start()

    def _connect(self) -> None:
        import psycopg

        conn = None
        try:
            conn = psycopg.connect(self.url, autocommit=True, connect_timeout=5)
            conn.execute(f"LISTEN {ACCESS_CHANNEL}")
        except Exception as exc:
            log.warning("access_listener_connect_failed", error=repr(exc), retry_in_s=self._delay)
            if conn is not None:
                conn.close()
            conn = None
        with self._lock:
            self._connecting = False
            if conn is None:
                self._next_attempt = self.clock() + self._delay
                self._delay = min(self._delay * 2, RECONNECT_MAX_S)
            elif self._closed:
                conn.close()
            else:
                self._ready, self._delay = conn, RECONNECT_MIN_S

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # already broken
                pass

    def close(self) -> None:
        with self._lock:
            self._closed = True
            ready, self._ready = self._ready, None
        if ready is not None:
            ready.close()
        self._drop()


def probe_for(url: str) -> Probe | None:
    """The probe for a SQLAlchemy URL: a SQLite file's data version, or PostgreSQL's
    notifications (an in-memory SQLite database is private to its connection: none)."""
    if url.startswith("postgresql"):
        return NotifyProbe(url)
    if not url.startswith("sqlite") or "///" not in url:
        return None
    path = url.split("///", 1)[1]
    return None if not path or path == ":memory:" else DataVersionProbe(path)


@dataclass(frozen=True)
class _Entry(Generic[V]):
    value: V
    expires_at: float


class _Bounded(Generic[V]):
    """Insertion-ordered: when full, the oldest entry goes."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self.entries: dict[object, _Entry[V]] = {}

    def get(self, key: object, now: float) -> _Entry[V] | None:
        entry = self.entries.get(key)
        if entry is not None and entry.expires_at <= now:
            del self.entries[key]
            return None
        return entry

    def put(self, key: object, entry: _Entry[V]) -> None:
        self.entries.pop(key, None)
        while len(self.entries) >= self.max_entries:
            del self.entries[next(iter(self.entries))]
        self.entries[key] = entry


class AccessCache(Generic[V]):
    """Verified keys (``V``) by secret hash and membership answers, valid while the
    database has not changed underneath and for at most ``ttl_s``.

    Use: ``ticket = cache.ticket()`` first; ``None`` means read the database and do not
    remember. Otherwise look up, and on a miss read the database and ``remember_*(ticket,
    ...)``: an answer read before a change that the cache has already seen is dropped, so a
    slow read racing a revocation cannot bring the revoked key back.
    """

    def __init__(
        self,
        probe: Probe | None,
        ttl_s: float = DEFAULT_TTL_S,
        max_keys: int = DEFAULT_MAX_KEYS,
        max_memberships: int = DEFAULT_MAX_MEMBERSHIPS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.probe = probe
        self.ttl_s = ttl_s
        self.clock = clock
        self._keys: _Bounded[V] = _Bounded(max_keys)
        self._members: _Bounded[bool] = _Bounded(max_memberships)
        self._generation: int | None = None

    def ticket(self) -> int | None:
        if self.probe is None:
            return None
        version = self.probe.version()
        if version != self._generation:
            self.clear()
            self._generation = version
        return version

    def clear(self) -> None:
        self._keys.entries.clear()
        self._members.entries.clear()

    def key(self, key_hash: str) -> V | None:
        entry = self._keys.get(key_hash, self.clock())
        return entry.value if entry is not None else None

    def remember_key(self, ticket: int, key_hash: str, key: V) -> None:
        if ticket == self._generation:
            self._keys.put(key_hash, _Entry(key, self.clock() + self.ttl_s))

    def membership(self, agent_id: str, session_id: str, principal: str) -> bool | None:
        entry = self._members.get((agent_id, session_id, principal), self.clock())
        return entry.value if entry is not None else None

    def remember_membership(self, ticket: int, agent_id: str, session_id: str, principal: str, member: bool) -> None:
        if ticket == self._generation:
            self._members.put((agent_id, session_id, principal), _Entry(member, self.clock() + self.ttl_s))

    def close(self) -> None:
        if self.probe is not None:
            self.probe.close()
