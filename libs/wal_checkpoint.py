"""SQLite WAL checkpoints on a thread of their own, off the path of every commit.

SQLite checkpoints a WAL database after the commit that takes its log past 1,000 pages
(``wal_autocheckpoint``), on the committing connection: that commit then also copies the
log into the database file and waits for two fsyncs. In the scheduler's store lifecycle
that was 15 commits over 5 ms per 2,000 tasks, each holding up every transaction queued
behind it (``bench/bench_checkpoint.py``). Here the writers' own threshold is raised to a backstop
(``BACKSTOP_PAGES``) and one thread per process watches the log of each database and
checkpoints it once ``THRESHOLD_PAGES`` wait — what SQLite would do, with the same
``PASSIVE`` checkpoint (writers and readers go on meanwhile), on its own connection.

How many pages wait is read from the wal-index header at the start of the ``-shm`` file
(mxFrame, and nBackfill after the two copies of the header: SQLite's "WAL-index format",
native byte order), read-only and without a lock, never through a symlink nor blocking on
what is not a file (the data folder is the service's own: defence in depth). A header whose
two copies differ is being written: read again next time. A header in another format leaves
the checkpoints to the writers' backstop (said once in the log).
"""

from __future__ import annotations

import os
import sqlite3
import struct
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from libs.thread_names import name_os_thread

log = structlog.get_logger("wal_checkpoint")

THRESHOLD_PAGES = 1000  # SQLite's default wal_autocheckpoint
BACKSTOP_PAGES = 10_000  # the writers' own wal_autocheckpoint: only if this thread falls behind
POLL_S = 0.25

_HEADER = struct.Struct("=IIIBBHII24x")  # iVersion, unused, iChange, isInit, bigEndCksum, szPage, mxFrame, nPage
_NBACKFILL = struct.Struct("=I")  # WalCkptInfo.nBackfill, right after the header's two copies
_WAL_INDEX_VERSION = 3007000


class UnknownWalIndex(Exception):
    """The ``-shm`` file's header is not the wal-index format this module reads."""


def pending_pages(shm: Path) -> int | None:
    """Pages in the database's WAL not yet copied into the database file; None when the
    wal-index cannot tell now (no ``-shm`` file: no connection is open; a header being
    written). UnknownWalIndex for a header of another format."""
    try:
        fd = os.open(shm, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        data = os.pread(fd, 2 * _HEADER.size + _NBACKFILL.size, 0)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(data) < 2 * _HEADER.size + _NBACKFILL.size or data[: _HEADER.size] != data[_HEADER.size : 2 * _HEADER.size]:
        return None
    version, _, _, is_init, _, _, max_frame, _ = _HEADER.unpack_from(data)
    if not is_init:
        return None
    if version != _WAL_INDEX_VERSION:
        raise UnknownWalIndex(f"wal-index version {version}")
    (backfilled,) = _NBACKFILL.unpack_from(data, 2 * _HEADER.size)
    return max(0, max_frame - backfilled)


@dataclass(eq=False)
class Watch:
    """One database whose log the checkpointer looks after."""

    path: Path
    threshold: int = THRESHOLD_PAGES
    checkpoints: int = 0  # PASSIVE checkpoints run by the checkpointer
    closed: bool = False
    _conn: sqlite3.Connection | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _unknown_said: bool = False

    def close(self) -> None:
        """Stop watching (idempotent); the checkpoint connection is closed, after a checkpoint under way."""
        with self._lock:
            self.closed = True
            if self._conn is not None:
                self._conn.close()
                self._conn = None
        _checkpointer.forget(self)

    def check(self) -> None:
        """(The checkpointer's thread.) Checkpoint when enough pages wait."""
        try:
            pending = pending_pages(self.path.with_name(self.path.name + "-shm"))
        except UnknownWalIndex as exc:
            if not self._unknown_said:
                self._unknown_said = True
                log.warning("wal_index_unknown", path=str(self.path), detail=str(exc), backstop_pages=BACKSTOP_PAGES)
            return
        if pending is None or pending < self.threshold:
            return
        with self._lock:
            if self.closed:
                return
            try:
                if self._conn is None:
                    # mode=rw: a database gone meanwhile is an error here, never a new empty file.
                    uri = f"{self.path.resolve().as_uri()}?mode=rw"
                    self._conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
                self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                self.checkpoints += 1
            except sqlite3.Error as exc:
                # Another checkpoint under way (a second process on the file), the disk full:
                # the next look tries again, and the writers' backstop bounds the log meanwhile.
                log.warning("wal_checkpoint_failed", path=str(self.path), error=str(exc))


class _Checkpointer:
    """The process's one checkpoint thread, started with the first watch."""

    def __init__(self) -> None:
        self._watches: weakref.WeakSet[Watch] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def watch(self, path: Path, threshold: int) -> Watch:
        watch = Watch(path, threshold)
        with self._lock:
            self._watches.add(watch)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="wal_checkpoint", daemon=True)
                self._thread.start()
        return watch

    def forget(self, watch: Watch) -> None:
        with self._lock:
            self._watches.discard(watch)

    def _run(self) -> None:
        name_os_thread("wal_checkpoint")
        while True:
            time.sleep(POLL_S)
            with self._lock:
                watches = list(self._watches)
            for watch in watches:
                try:
                    watch.check()
                except Exception:  # noqa: BLE001 - the thread keeps watching the others; said in the log
                    log.exception("wal_checkpoint_error", path=str(watch.path))
            del watches


_checkpointer = _Checkpointer()


def watch(path: str | Path, threshold: int | None = None) -> Watch:
    """Checkpoint the WAL of the SQLite database at ``path`` from the checkpoint thread
    once ``threshold`` (``THRESHOLD_PAGES``) pages wait, until the watch is closed."""
    return _checkpointer.watch(Path(path), THRESHOLD_PAGES if threshold is None else threshold)
