"""`taskgate admin databases compact`: give the disk back after retention deleted rows.

SQLite reuses the pages of deleted rows but never shrinks its file; ``VACUUM`` does
(``libs.db.compact_sqlite``). Each service's database is compacted only while that service is
stopped: the command takes the service's data-directory lock for the while (so it cannot start
meanwhile) and passes a running one over, saying so. The gateway takes no such lock; its
database (keys, memberships, bindings) is small and does not grow with tasks. PostgreSQL
databases are the server's to vacuum (autovacuum; ``VACUUM FULL`` to shrink).
"""

from __future__ import annotations

import argparse
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from gateway_http.cli.tables import render_table
from libs.db import compact_sqlite, sqlite_file
from libs.settings import Settings
from libs.startup import FolderInUse, hold_folder

# (settings' database name, the lock file its service holds in the data directory, if any)
SERVICES = (("scheduler", "scheduler"), ("pending", "pending_registry"), ("notifier", "notifier"), ("gateway", None))


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"


def compact(settings: Settings, only: str | None = None) -> list[list[object]]:
    """Compact each stopped service's SQLite database (``only``: that one); a row per database."""
    rows: list[list[object]] = []
    for name, lock_name in SERVICES:
        if only is not None and name != only:
            continue
        url = settings.db_url(name)
        path = sqlite_file(url)
        if path is None:
            rows.append([name, "-", "-", "-", "skipped: not SQLite (vacuum it on its server)"])
            continue
        if not Path(path).exists():
            rows.append([name, path, "-", "-", "skipped: no database yet"])
            continue
        lock = None
        if lock_name is not None:
            try:
                lock = hold_folder(settings.data_dir, lock_name)
            except FolderInUse as exc:
                rows.append([name, path, "-", "-", f"skipped: running (pid {exc.holder}); stop it first"])
                continue
        try:
            began = time.perf_counter()
            before, after = compact_sqlite(Path(path))
            took = time.perf_counter() - began
        except sqlite3.Error as exc:  # e.g. another process holds it ("database is locked")
            rows.append([name, path, "-", "-", f"failed: {exc}"])
            continue
        finally:
            if lock is not None:
                lock.release()
        rows.append([name, path, _mib(before), _mib(after), f"compacted in {took:.2f} s"])
    return rows


def register(admin_sub: Any, settings: Callable[[], Settings]) -> None:
    """Add ``databases compact`` under ``taskgate admin``."""
    databases = admin_sub.add_parser("databases", help="the services' local databases")
    sub = databases.add_subparsers(dest="action", required=True)
    run = sub.add_parser(
        "compact",
        help="shrink each stopped service's SQLite database after deletions (VACUUM); a running one is passed over",
    )
    run.add_argument("--service", choices=[name for name, _ in SERVICES], help="only this service's database")

    def command(args: argparse.Namespace, out: TextIO) -> int:
        rows = compact(settings(), args.service)
        print(render_table(["service", "database", "before", "after", "outcome"], rows, max_width=80), file=out)
        return 0 if all(not str(r[4]).startswith(("skipped: running", "failed")) for r in rows) else 1

    run.set_defaults(fn=command)
