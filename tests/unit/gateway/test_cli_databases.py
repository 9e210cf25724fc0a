"""`taskgate admin databases compact`: a stopped service's SQLite database shrinks after
deletions; a running one (its data-directory lock held) is passed over and left as it was."""

from __future__ import annotations

import io
import sqlite3
from pathlib import Path

import pytest

from gateway_http.cli import main as cli
from libs.db import sqlite_footprint
from libs.startup import hold_folder


def bloated(path: Path) -> int:
    """A WAL database whose rows were written and then deleted: its size on disk."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, body BLOB)")
    conn.executemany("INSERT INTO t (body) VALUES (?)", [(b"x" * 4000,) for _ in range(1500)])
    conn.execute("INSERT INTO t (body) VALUES (?)", (b"kept",))
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.execute("DELETE FROM t WHERE body <> ?", (b"kept",))
    conn.close()
    return sqlite_footprint(path)


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("SCHEDULER", "PENDING", "NOTIFIER", "GATEWAY"):
        monkeypatch.delenv(f"TASKGATE_{name}_DB_URL", raising=False)
    monkeypatch.setenv("TASKGATE_DATA_DIR", str(tmp_path))
    return tmp_path


def run(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    return cli.main(["admin", "databases", "compact", *args], out), out.getvalue()


def test_a_stopped_services_database_shrinks_and_keeps_its_rows(data_dir: Path) -> None:
    db = data_dir / "scheduler.db"
    before = bloated(db)
    assert before > 5 * 2**20
    code, printed = run()
    assert code == 0, printed
    assert sqlite_footprint(db) < before / 10
    rows = {line.split()[0]: line for line in printed.splitlines()[1:]}
    assert "compacted" in rows["scheduler"]
    assert all("skipped: no database yet" in rows[name] for name in ("pending", "notifier", "gateway"))
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT body FROM t").fetchall() == [(b"kept",)]


def test_a_running_service_is_passed_over(data_dir: Path) -> None:
    db = data_dir / "notifier.db"
    before = bloated(db)
    running = hold_folder(data_dir, "notifier")  # as the live notifier holds it
    try:
        code, printed = run("--service", "notifier")
    finally:
        running.release()
    assert code == 1
    assert "skipped: running" in printed and "stop it first" in printed
    assert sqlite_footprint(db) == before
    assert run("--service", "notifier")[0] == 0  # once it has stopped
    assert sqlite_footprint(db) < before / 10


def test_a_postgresql_database_is_the_servers_to_vacuum(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TASKGATE_PENDING_DB_URL", "postgresql://taskgate@db/pending")
    code, printed = run("--service", "pending")
    assert code == 0 and "not SQLite" in printed
    assert len(printed.splitlines()) == 2  # the header and that one service


def test_a_database_another_process_holds_is_reported_not_raised(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bloated(data_dir / "gateway.db")

    def locked(path: Path) -> tuple[int, int]:
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr("gateway_http.cli.databases.compact_sqlite", locked)
    code, printed = run("--service", "gateway")
    assert code == 1 and "failed: database is locked" in printed
