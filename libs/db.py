"""Database access shared by the services that own a database.

SQLite (WAL) by default, PostgreSQL when the URL says so. Each service keeps its
own ordered list of migrations; ``migrate`` applies the missing ones, each in one
transaction together with its row in ``schema_migrations``. All database work of a
service runs through ``Database.run`` on a few threads of its own (``DatabaseThreads``),
never on the event loop.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import os
import queue
import select
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import structlog
from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.exc import DisconnectionError
from sqlmodel import Session

from libs import wal_checkpoint
from libs.thread_names import name_os_thread

T = TypeVar("T")

log = structlog.get_logger("db")


# The few words of DDL that differ between the dialects, written {LIKE_THIS} in migrations.
DIALECT_WORDS = {
    "sqlite": {"ID_PK": "INTEGER PRIMARY KEY"},
    "postgresql": {"ID_PK": "BIGSERIAL PRIMARY KEY"},
}


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    # Portable DDL: runs on SQLite and PostgreSQL; {ID_PK} is an auto-increasing key.
    statements: Sequence[str]
    # The dialects the statements are for (None: all). Elsewhere the version is recorded with
    # nothing run, so a database's version says the same on every dialect.
    dialects: tuple[str, ...] | None = None


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


def libpq_url(url: str) -> str:
    """A SQLAlchemy PostgreSQL URL as libpq takes it (no ``+driver``)."""
    scheme, rest = url.split("://", 1)
    return f"{scheme.split('+', 1)[0]}://{rest}"


def sqlite_file(url: str) -> str | None:
    """The file of a SQLite URL; None for another database or one in memory."""
    if not is_sqlite(url) or "///" not in url:
        return None
    path = url.split("///", 1)[1]
    return path if path and path != ":memory:" else None


def sqlite_footprint(path: Path) -> int:
    """Bytes a SQLite database takes on disk: its file and its write-ahead log."""
    return sum(f.stat().st_size for f in (path, Path(f"{path}-wal")) if f.exists())


def compact_sqlite(path: Path) -> tuple[int, int]:
    """(Blocking.) Rewrite a SQLite database without its free pages (``VACUUM``), then fold
    the write-ahead log back and truncate it; (bytes before, bytes after). Deleted rows leave
    free pages that SQLite reuses but never gives back: only this shrinks the file. It holds
    the write lock for as long as it takes (seconds per hundred MiB): run it while the
    service that owns the file is stopped."""
    import sqlite3

    before = sqlite_footprint(path)
    conn = sqlite3.connect(path, timeout=30, isolation_level=None)
    try:
        conn.execute("VACUUM")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    return before, sqlite_footprint(path)


def make_engine(url: str, pg_settings: Mapping[str, str] | None = None) -> Engine:
    """``pg_settings``: server settings every PostgreSQL session of this engine starts with."""
    if is_sqlite(url):
        path = sqlite_file(url) or ""
        if path:
            Path(path).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            # Let SQLAlchemy, not the sqlite3 module, decide where transactions
            # begin, so DDL is transactional too.
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            if path:
                os.chmod(path, 0o600)  # whatever the umask: a database is its service's alone
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            # A commit checkpoints only if the process's checkpoint thread (``wal_checkpoint``,
            # started by ``Database``) falls far behind, or where there is none.
            cur.execute(f"PRAGMA wal_autocheckpoint={wal_checkpoint.BACKSTOP_PAGES}")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn: Any) -> None:
            # Take the write lock up front: a deferred transaction that later
            # writes can fail with SQLITE_BUSY instead of waiting. Straight on the
            # driver: SQLAlchemy's statement path costs more than SQLite's BEGIN.
            conn.connection.driver_connection.execute("BEGIN IMMEDIATE")

        return engine
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://") :]
    connect_args = {"options": " ".join(f"-c {k}={v}" for k, v in pg_settings.items())} if pg_settings else {}
    engine = create_engine(url, pool_size=5, max_overflow=5, connect_args=connect_args)
    _ping_when_in_doubt(engine)
    return engine


# A pooled PostgreSQL connection back in use after this long idle is pinged before use.
PING_AFTER_IDLE_S = 10.0


def _ping_when_in_doubt(engine: Engine) -> None:
    """SQLAlchemy's ``pool_pre_ping``, without its round trip on every checkout.

    A pre-ping is a ``SELECT 1`` before each transaction: one more round trip through the
    driver per transaction (≈ 5 % of a busy scheduler's database thread on PostgreSQL). A
    connection the server closed (a restart, ``pg_terminate_backend``, an idle timeout) has
    something to read on its socket: the server's last message, or the end of the stream. So
    a checkout pings only when the socket is readable (one ``poll``, no round trip) or the
    connection sat idle a while (``PING_AFTER_IDLE_S``, for what a socket cannot show); a
    failed ping makes the pool replace the connection (``DisconnectionError``), as a failed
    pre-ping did."""

    @event.listens_for(engine, "connect")
    @event.listens_for(engine, "checkin")
    def _idle_from(_dbapi_conn: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _check(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        idle_s = time.monotonic() - record.info.get("idle_since", 0.0)
        if idle_s < PING_AFTER_IDLE_S and not _socket_readable(dbapi_conn):
            return
        try:
            alive = engine.dialect.do_ping(dbapi_conn)
        except Exception as exc:
            raise DisconnectionError(f"the pooled connection failed its ping: {exc}") from exc
        if not alive:
            raise DisconnectionError("the pooled connection failed its ping")


def _socket_readable(dbapi_conn: Any) -> bool:
    """Whether an idle connection's socket has anything to read (no wait): between
    transactions a live PostgreSQL session sends nothing unless asked."""
    try:
        poller = select.poll()
        poller.register(dbapi_conn.fileno(), select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError, AttributeError):  # no socket (closed): let the ping say so
        return True


def migrate(engine: Engine, migrations: Sequence[Migration]) -> list[int]:
    """Apply missing migrations in order; returns the versions applied now."""
    versions = [m.version for m in migrations]
    if versions != sorted(set(versions)):
        raise ValueError("migration versions must be unique and ascending")
    applied_now: list[int] = []
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            # Several replicas starting at once migrate one after another.
            conn.execute(text("SELECT pg_advisory_xact_lock(7215502)"))
        conn.execute(
            text(
                "CREATE TABLE IF NOT EXISTS schema_migrations ("
                "version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at BIGINT NOT NULL)"
            )
        )
        done = {row[0] for row in conn.execute(text("SELECT version FROM schema_migrations"))}
        for m in migrations:
            if m.version in done:
                continue
            for stmt in m.statements if m.dialects is None or engine.dialect.name in m.dialects else ():
                for word, replacement in DIALECT_WORDS.get(engine.dialect.name, {}).items():
                    stmt = stmt.replace("{" + word + "}", replacement)
                conn.execute(text(stmt))
            conn.execute(
                text("INSERT INTO schema_migrations (version, name, applied_at) VALUES (:v, :n, :t)"),
                {"v": m.version, "n": m.name, "t": int(time.time() * 1000)},
            )
            applied_now.append(m.version)
    return applied_now


def lock_key(session: Session, key: str) -> None:
    """Serialize transactions on ``key`` until this one ends.

    PostgreSQL: a transaction-scoped advisory lock (rows that do not exist yet
    cannot be locked with FOR UPDATE). SQLite: every write transaction already
    holds the database lock (BEGIN IMMEDIATE), so nothing to do.
    """
    if session.get_bind().dialect.name == "postgresql":
        session.exec(text("SELECT pg_advisory_xact_lock(hashtext(:key))").bindparams(key=key))  # type: ignore[call-overload]


# (work, its caller's future and loop); submitted work has neither.
_Work = tuple[Callable[[], Any], "asyncio.Future[Any] | None", "asyncio.AbstractEventLoop | None"]


class DatabaseThreads:
    """The threads a database's blocking calls run on: each takes work from one queue and
    hands the outcome straight back to the caller's loop.

    What ``run_in_executor`` on a ThreadPoolExecutor does, without its per-call cost: a
    concurrent future chained to an asyncio one, a shutdown lock and an idle semaphore (a
    Python-level Condition whose lock the loop and the thread contend for under load) —
    about a third of a database round trip's CPU on the loop's side. Work whose caller
    stopped waiting before it began is skipped, as the executor did; queued work still
    runs before ``close`` (or the interpreter's exit) ends the threads.
    """

    def __init__(self, workers: int, name: str = "db") -> None:
        self.workers = workers
        self._name = name
        self._queue: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = False
        self._unfinished = 0  # work queued or running (``idle``); changed under ``_lock``

    async def run(self, fn: Callable[[], T]) -> T:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        if len(self._threads) < self.workers:
            self._start_thread()  # started as needed, as the executor did
        self._put((fn, future, loop))
        return await future

    def idle(self) -> bool:
        """Whether the threads are open and no work is queued or running on them (nothing holds
        the database for them). Only meaningful to the thread that alone gives them work: none
        can start while that thread does something else."""
        return self._unfinished == 0 and not self._closed

    def _put(self, work: _Work) -> None:
        with self._lock:
            self._unfinished += 1
        self._queue.put(work)

    def _done(self) -> None:
        with self._lock:
            self._unfinished -= 1

    def submit(self, fn: Callable[[], Callable[[], None] | None]) -> None:
        """Run ``fn`` on a database thread with nobody waiting for it: ``fn`` hands its own
        outcomes over (the group commit's drain). What ``fn`` returns, if anything, is called
        once ``fn`` no longer counts as running (``idle`` may then be true: the drain going back
        to the loop). Callable from any thread; RuntimeError once closed. An error escaping
        ``fn`` is logged."""
        if len(self._threads) < self.workers:
            self._start_thread()
        self._put((fn, None, None))

    def others_waiting(self) -> bool:
        """Whether work is queued for the database threads (a long job lets it go first)."""
        return not self._queue.empty()

    def _start_thread(self) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("the database is closed")
            if len(self._threads) >= self.workers:
                return
            thread = threading.Thread(
                target=self._serve, name=f"{self._name}_{len(self._threads)}", daemon=True
            )  # daemon: an unclosed database does not hold the process; at exit it is drained
            thread.start()
            if not self._threads:
                _at_exit.add(self)
            self._threads.append(thread)

    def _serve(self) -> None:
        name_os_thread(threading.current_thread().name)
        while (work := self._queue.get()) is not None:
            self._serve_one(*work)
            del work  # nothing kept alive while the thread waits

    def _serve_one(
        self, fn: Callable[[], Any], future: asyncio.Future[Any] | None, loop: asyncio.AbstractEventLoop | None
    ) -> None:
        if future is None:  # submitted: nobody waits, ``fn`` hands its outcomes over itself
            after = None
            try:
                after = fn()
            except BaseException:  # noqa: BLE001 - the thread keeps serving; said in the log
                log.exception("database_work_failed", work=getattr(fn, "__qualname__", repr(fn)))
            finally:
                self._done()
            if after is not None:
                try:
                    after()
                except BaseException:  # noqa: BLE001 - as above
                    log.exception("database_work_failed", work=getattr(after, "__qualname__", repr(after)))
            return
        if future.cancelled():  # the caller stopped waiting before it began
            self._done()
            return
        assert loop is not None
        try:
            outcome: tuple[Any, BaseException | None] = (fn(), None)
        except BaseException as exc:  # handed to the caller, as the executor did
            outcome = (None, exc)
        finally:
            self._done()  # finished before its caller hears of it: idle by then, if nothing else waits
        try:
            loop.call_soon_threadsafe(_settle, future, *outcome)
        except RuntimeError:  # the caller's loop closed meanwhile: nobody is waiting
            pass

    def close(self) -> None:
        """Run what is queued, then end the threads (idempotent)."""
        with self._lock:
            self._closed = True
            threads, self._threads = self._threads, []
        for _ in threads:
            self._queue.put(None)
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join()
        _at_exit.discard(self)


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


# Databases whose threads run: drained at the interpreter's exit (daemon threads would
# otherwise stop wherever they are, possibly in the middle of a commit).
_at_exit: weakref.WeakSet[DatabaseThreads] = weakref.WeakSet()


@atexit.register
def _drain_at_exit() -> None:
    for threads in list(_at_exit):
        threads.close()


class Database:
    """An engine plus the threads its blocking calls run on."""

    def __init__(
        self, url: str, migrations: Sequence[Migration] = (), pg_settings: Mapping[str, str] | None = None
    ) -> None:
        self.url = url
        self.engine = make_engine(url, pg_settings)
        self.migrations = migrations
        # SQLite has one writer at a time: one thread avoids lock waits inside
        # the process. PostgreSQL gets a few.
        # SQLite: statements run in this process and never wait for a server (nor, with one
        # writer thread, for a lock), so short work may run on the event loop (``GroupCommit``).
        self.embedded = is_sqlite(url)
        workers = 1 if self.embedded else 4
        self.threads = DatabaseThreads(workers)
        self._kept = threading.local()  # each database thread's connection (``run_connection``)
        self._all_kept: list[Connection] = []
        file = sqlite_file(url)
        self._wal = wal_checkpoint.watch(file) if file else None

    def migrate(self) -> list[int]:
        return migrate(self.engine, self.migrations)

    def session(self) -> Session:
        return Session(self.engine, expire_on_commit=False)

    async def run(self, fn: Callable[[Session], T]) -> T:
        """Run ``fn`` in one transaction on the database thread; commit on success."""

        def work() -> T:
            with self.session() as session, session.begin():
                return fn(session)

        return await self.threads.run(work)

    async def run_connection(self, fn: Callable[[Connection], T]) -> T:
        """Like ``run`` on a bare connection: for Core-only work, without the ORM session's
        cost (about 90 µs per transaction, more than the statements of a hot unit).

        SQLite: each database thread keeps its connection between transactions (a pool
        checkout per transaction cost as much again); one that failed is dropped, and the
        next transaction starts on a fresh one. PostgreSQL: a pooled connection per
        transaction, so the pool's pre-ping replaces one the server dropped (a restart)
        before any work is lost on it.
        """

        return await self.threads.run(functools.partial(self.transaction, fn))

    def transaction(self, fn: Callable[[Connection], T]) -> T:
        """(On a database thread.) ``fn`` in one transaction on a bare connection, committed
        when it returns: what ``run_connection`` runs, for work already on a database thread."""
        if not self.embedded:
            with self.engine.begin() as pooled:
                return fn(pooled)
        conn = getattr(self._kept, "conn", None)
        if conn is None or conn.closed or conn.invalidated:
            conn = self._kept.conn = self.engine.connect()
            self._all_kept.append(conn)
        try:
            with conn.begin():
                return fn(conn)
        except BaseException:
            self._kept.conn = None
            self._all_kept.remove(conn)
            conn.close()
            raise

    def close(self) -> None:
        if self._wal is not None:
            self._wal.close()
        self.threads.close()
        for conn in self._all_kept:  # the threads are gone: nobody uses them any more
            conn.close()
        self._all_kept.clear()
        self.engine.dispose()


def storage_full(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) says the database's disk is full.

    SQLite: SQLITE_FULL ("database or disk is full"); PostgreSQL: SQLSTATE 53100
    (disk_full); a plain ENOSPC from the file system.
    """
    import errno
    import sqlite3

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, sqlite3.Error) and (
            getattr(current, "sqlite_errorcode", None) == 13 or "disk is full" in str(current)
        ):
            return True
        if getattr(current, "sqlstate", None) == "53100":
            return True
        if isinstance(current, OSError) and current.errno == errno.ENOSPC:
            return True
        current = current.__cause__ or current.__context__
    return False
