"""A full disk under a database is recognised (and so answered UNAVAILABLE STORAGE_FULL, not INTERNAL)."""

from __future__ import annotations

import errno
import sqlite3

from libs.db import storage_full


class _PgDiskFull(Exception):
    sqlstate = "53100"


def test_storage_full_is_recognised_through_wrappers() -> None:
    full = sqlite3.OperationalError("database or disk is full")
    try:
        try:
            raise full
        except sqlite3.OperationalError as exc:
            raise RuntimeError("wrapped") from exc
    except RuntimeError as wrapped:
        assert storage_full(wrapped)
    assert storage_full(_PgDiskFull())
    assert storage_full(OSError(errno.ENOSPC, "No space left on device"))


def test_other_errors_are_not_storage_full() -> None:
    assert not storage_full(sqlite3.OperationalError("database is locked"))
    assert not storage_full(OSError(errno.EACCES, "denied"))
    assert not storage_full(ValueError("x"))
