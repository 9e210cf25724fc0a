"""WAL checkpoints on the process's checkpoint thread, not in the commits (``libs.wal_checkpoint``)."""

from __future__ import annotations

import os
import sqlite3
import struct
import time
from pathlib import Path

import pytest
from sqlalchemy import Connection, text

from libs import wal_checkpoint
from libs.db import Database

ROW_BYTES = 3000  # a row of its own page or so: pages grow with rows


def write_rows(conn: sqlite3.Connection, rows: int) -> None:
    for _ in range(rows):
        conn.execute("INSERT INTO t VALUES (?)", (os.urandom(ROW_BYTES // 2).hex(),))


def test_the_pages_read_from_the_wal_index_are_sqlites_own_count(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("CREATE TABLE t (x)")
    write_rows(conn, 200)
    pending = wal_checkpoint.pending_pages(tmp_path / "t.db-shm")
    assert pending is not None
    other = sqlite3.connect(path, isolation_level=None)
    ((busy, frames, copied),) = other.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
    assert busy == 0 and pending == frames == copied and pending > 200
    assert wal_checkpoint.pending_pages(tmp_path / "t.db-shm") == 0, "all copied"
    write_rows(conn, 10)  # the log starts over from its beginning
    assert 10 <= (wal_checkpoint.pending_pages(tmp_path / "t.db-shm") or 0) < 50
    assert wal_checkpoint.pending_pages(tmp_path / "missing.db-shm") is None
    other.close()
    conn.close()


def test_a_header_of_another_format_is_refused_and_a_torn_one_is_read_again(tmp_path: Path) -> None:
    header = struct.pack("=IIIBBHII24x", 3007000, 0, 5, 1, 0, 4096, 1200, 10)
    shm = tmp_path / "x.db-shm"
    shm.write_bytes(header + header + struct.pack("=I", 200))
    assert wal_checkpoint.pending_pages(shm) == 1000
    link = tmp_path / "l.db-shm"
    link.symlink_to(shm)
    assert wal_checkpoint.pending_pages(link) is None, "never read through a symlink"
    shm.write_bytes(header + header.replace(struct.pack("=I", 1200), struct.pack("=I", 1201)) + bytes(4))
    assert wal_checkpoint.pending_pages(shm) is None, "two copies that differ: being written"
    os.mkfifo(tmp_path / "f.db-shm")
    assert wal_checkpoint.pending_pages(tmp_path / "f.db-shm") is None, "a FIFO neither blocks nor counts"
    other = struct.pack("=IIIBBHII24x", 3099000, 0, 5, 1, 0, 4096, 1200, 10)
    shm.write_bytes(other + other + bytes(4))
    with pytest.raises(wal_checkpoint.UnknownWalIndex):
        wal_checkpoint.pending_pages(shm)


def insert_rows(rows: int) -> object:
    def work(conn: Connection) -> None:
        for _ in range(rows):
            conn.execute(text("INSERT INTO t VALUES (:x)"), {"x": os.urandom(ROW_BYTES // 2).hex()})

    return work


async def test_commits_leave_the_checkpoint_to_the_checkpoint_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(wal_checkpoint, "POLL_S", 0.01)
    monkeypatch.setattr(wal_checkpoint, "THRESHOLD_PAGES", 10**9)  # the thread holds back first
    db = Database(f"sqlite:///{tmp_path / 'w.db'}")
    shm = tmp_path / "w.db-shm"
    try:
        await db.run_connection(lambda c: c.execute(text("CREATE TABLE t (x)")))
        for _ in range(15):
            await db.run_connection(insert_rows(100))  # type: ignore[arg-type]
        pending = wal_checkpoint.pending_pages(shm)
        # SQLite's own commits would have checkpointed once past 1,000 pages.
        assert pending is not None and pending > 1500, pending
        assert db._wal is not None and db._wal.checkpoints == 0
        db._wal.threshold = 1000  # now the thread's threshold is SQLite's
        deadline = time.monotonic() + 10  # generous on a loaded machine
        while db._wal.checkpoints == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert db._wal.checkpoints >= 1
        assert (wal_checkpoint.pending_pages(shm) or 0) < 1000, "copied by the checkpoint thread"
        ((setting,),) = await db.run_connection(lambda c: list(c.execute(text("PRAGMA wal_autocheckpoint"))))
        assert setting == wal_checkpoint.BACKSTOP_PAGES
    finally:
        db.close()
    assert db._wal.closed
    assert db._wal not in wal_checkpoint._checkpointer._watches, "a closed database is not watched"
