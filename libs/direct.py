"""Hot statements compiled once by SQLAlchemy and run on the driver's own cursor.

SQLAlchemy's execution path (context, cache lookup, parameter processing, result object)
costs tens of µs a statement — more than SQLite's own work for a primary-key lookup or a
small insert. The scheduler's lifecycle and the notifier's event-log batches run a dozen
such statements per task; they compile each once per dialect here and hand the SQL and
the parameters straight to the DBAPI connection (sqlite3 or psycopg).
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Iterable, Sequence
from typing import Any, NoReturn, Protocol

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql import ClauseElement


class DriverTx(Protocol):
    """What a statement runs in: SQLAlchemy's connection (for its dialect) and the driver's
    cursor the transaction's statements share."""

    conn: Connection

    def cursor(self) -> Any: ...


class OnConnection:
    """A bare transaction's connection with its driver connection looked up once."""

    __slots__ = ("conn", "driver", "_cursor")

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.driver: Any = conn.connection.driver_connection
        self._cursor: Any = None

    def cursor(self) -> Any:
        """The transaction's one driver cursor, which every ``Direct`` statement runs on: psycopg
        builds a new cursor for each ``connection.execute``, 15–30 µs of CPU a statement here
        (sqlite3's ≈ 0.3 µs). A statement's rows are read before the next one runs."""
        cursor = self._cursor
        if cursor is None:
            cursor = self._cursor = self.driver.cursor()
        return cursor


def _raise_translated(conn: Connection, sql: str, params: Any, exc: Exception) -> NoReturn:
    """Raise the driver's error as SQLAlchemy would have (``IntegrityError`` for a unique
    violation, …), so callers catch one family whichever path ran the statement; the driver's
    own error stays its ``orig`` and its cause. Anything else goes on as it was."""
    dbapi_error = conn.dialect.loaded_dbapi.Error
    if not isinstance(exc, dbapi_error):
        raise exc
    raise DBAPIError.instance(sql, params, exc, dbapi_error, dialect=conn.dialect) from exc


class Direct:
    """A statement compiled once per dialect by SQLAlchemy and run on the driver's cursor.

    ``keys``: the parameters (an insert's columns) it is run with; ``returns``: the names of
    the columns ``rows`` gives back. A driver error is raised as SQLAlchemy's (``_raise_translated``).
    """

    def __init__(self, stmt: ClauseElement, keys: Sequence[str] = (), returns: Sequence[str] = ()) -> None:
        self.stmt = stmt
        self.keys = list(keys)
        self.row: Any = namedtuple("Row", returns) if returns else None  # type: ignore[misc]
        self._compiled: dict[str, tuple[str, list[str] | None, dict[str, Any]]] = {}

    def _for(self, conn: Connection) -> tuple[str, list[str] | None, dict[str, Any]]:
        found = self._compiled.get(conn.dialect.name)
        if found is None:
            compiled = self.stmt.compile(dialect=conn.dialect, column_keys=self.keys or None)
            positional = getattr(compiled, "positional", False)  # qmark (SQLite) vs named (psycopg)
            order = list(getattr(compiled, "positiontup", None) or []) if positional else None
            # Values the dialect bound itself (SQLite's LIMIT ? comes with an OFFSET ? of 0).
            fixed = {k: v for k, v in compiled.params.items() if v is not None}
            found = self._compiled[conn.dialect.name] = (compiled.string, order, fixed)
        return found

    def execute(self, tx: DriverTx, params: dict[str, Any]) -> Any:
        """The driver's cursor after running the statement with ``params`` (the transaction's
        shared cursor: read what it returns before running another statement on ``tx``)."""
        sql, order, fixed = self._for(tx.conn)
        if fixed:
            params = {**fixed, **params}
        bound = tuple(params[k] for k in order) if order is not None else params
        cursor = tx.cursor()
        try:
            return cursor.execute(sql, bound)
        except Exception as exc:
            _raise_translated(tx.conn, sql, bound, exc)

    def executemany(self, tx: DriverTx, many: Iterable[dict[str, Any]]) -> None:
        """The statement once per parameter set, in one driver call (no rows come back)."""
        sql, order, fixed = self._for(tx.conn)
        if fixed:
            many = ({**fixed, **params} for params in many)
        rows: Iterable[Any] = many if order is None else [tuple(params[k] for k in order) for params in many]
        try:
            tx.cursor().executemany(sql, rows)
        except Exception as exc:
            _raise_translated(tx.conn, sql, None, exc)

    def rows(self, tx: DriverTx, params: dict[str, Any]) -> list[Any]:
        assert self.row is not None
        make = self.row._make
        return [make(r) for r in self.execute(tx, params).fetchall()]
