"""Cron run history: one row per run, claimed together with its task.

A scheduled tick is claimed by inserting ``(cron_id, scheduled_for)`` under a unique
index in the same transaction that creates the run's task: however many scheduler
replicas share the database, one insert wins and the others create nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from libs.db import Migration
from services.scheduler import store
from services.scheduler.cron_domain import CronRun
from services.scheduler.domain import Failure, Task
from services.scheduler.group_commit import Tx
from services.scheduler.store import SchedulerStore, StoredEvent

CRON_MIGRATION = Migration(
    6,
    "cron run history",
    [
        "CREATE TABLE cron_runs ("
        " run_id VARCHAR(32) PRIMARY KEY, cron_id VARCHAR(128) NOT NULL, kind VARCHAR(16) NOT NULL,"
        " scheduled_for BIGINT, started_at BIGINT NOT NULL, deadline_at BIGINT NOT NULL,"
        " ended_at BIGINT, outcome VARCHAR(32), doc TEXT NOT NULL)",
        # The tick claim. Manual runs have no tick (NULL): NULLs never conflict.
        "CREATE UNIQUE INDEX ux_cron_runs_tick ON cron_runs (cron_id, scheduled_for)",
        "CREATE INDEX ix_cron_runs_cron ON cron_runs (cron_id, started_at)",
        "CREATE INDEX ix_cron_runs_open ON cron_runs (ended_at, deadline_at)",
    ],
)
# The scheduler's migrations with the cron history (others number theirs below 6).
MIGRATIONS = [*store.MIGRATIONS, CRON_MIGRATION]

RUNS = sa.Table(
    "cron_runs",
    sa.MetaData(),
    sa.Column("run_id", sa.String(32), primary_key=True),
    sa.Column("cron_id", sa.String(128)),
    sa.Column("kind", sa.String(16)),
    sa.Column("scheduled_for", sa.BigInteger, nullable=True),
    sa.Column("started_at", sa.BigInteger),
    sa.Column("deadline_at", sa.BigInteger),
    sa.Column("ended_at", sa.BigInteger, nullable=True),
    sa.Column("outcome", sa.String(32), nullable=True),
    sa.Column("doc", sa.Text),
)


_ENDED_BEFORE = (
    sa.select(RUNS.c.run_id)
    .where(RUNS.c.ended_at < sa.bindparam("cutoff"))
    .order_by(RUNS.c.ended_at)
    .limit(sa.bindparam("limit"))
    .with_for_update(skip_locked=True)
)


def _doc(run: CronRun) -> str:
    doc: dict[str, Any] = {"taskIds": list(run.task_ids)}
    if run.failure is not None:
        doc["failure"] = run.failure.model_dump(exclude_none=True)
    return json.dumps(doc)


def _run_from_row(row: Any) -> CronRun:
    doc = json.loads(row.doc)
    return CronRun(
        run_id=row.run_id,
        cron_id=row.cron_id,
        kind=row.kind,
        scheduled_for=row.scheduled_for,
        started_at=row.started_at,
        deadline_at=row.deadline_at,
        ended_at=row.ended_at,
        outcome=row.outcome,
        task_ids=tuple(doc.get("taskIds", [])),
        failure=Failure.model_validate(doc["failure"]) if "failure" in doc else None,
    )


def _insert_run(s: Tx, run: CronRun) -> bool:
    """Insert the run; False when its tick was already claimed (by any replica)."""
    values = {
        "run_id": run.run_id,
        "cron_id": run.cron_id,
        "kind": run.kind,
        "scheduled_for": run.scheduled_for,
        "started_at": run.started_at,
        "deadline_at": run.deadline_at,
        "doc": _doc(run),
    }
    # ON CONFLICT DO NOTHING (SQLite and PostgreSQL alike): on PostgreSQL a concurrent
    # claim of the same tick waits for the other transaction and then inserts nothing.
    result = s.connection().execute(
        sa.text(
            "INSERT INTO cron_runs (run_id, cron_id, kind, scheduled_for, started_at, deadline_at, doc)"
            " VALUES (:run_id, :cron_id, :kind, :scheduled_for, :started_at, :deadline_at, :doc)"
            " ON CONFLICT (cron_id, scheduled_for) DO NOTHING"
        ),
        values,
    )
    return bool(result.rowcount)


class CronStore:
    def __init__(self, tasks: SchedulerStore) -> None:
        self.tasks = tasks
        self._run = tasks.group.run  # the same group commit as every task change

    async def start_run(self, run: CronRun, task: Task) -> StoredEvent | None:
        """Claim the run and create its task in one transaction; None when the tick was taken."""

        def work(s: Tx) -> StoredEvent | None:
            if not _insert_run(s, run):
                return None
            store._write_task(s, task, new=True)
            return store._append_event(s, task, "task.state_changed", task.created_at, self.tasks.host_id)

        return await self._run(work)

    async def get_run(self, run_id: str) -> CronRun | None:
        def work(s: Tx) -> CronRun | None:
            rows = list(s.connection().execute(sa.select(RUNS).where(RUNS.c.run_id == run_id)))
            return _run_from_row(rows[0]) if rows else None

        return await self._run(work)

    async def open_runs(self, limit: int = 500) -> list[CronRun]:
        def work(s: Tx) -> list[CronRun]:
            rows = s.connection().execute(
                sa.select(RUNS).where(RUNS.c.ended_at.is_(None)).order_by(RUNS.c.deadline_at).limit(limit)
            )
            return [_run_from_row(r) for r in rows]

        return await self._run(work)

    async def end_run(self, ended: CronRun) -> bool:
        """Record how a run ended; False when it had already ended (another replica won)."""

        def work(s: Tx) -> bool:
            result = s.connection().execute(
                sa.update(RUNS)
                .where(RUNS.c.run_id == ended.run_id, RUNS.c.ended_at.is_(None))
                .values(ended_at=ended.ended_at, outcome=ended.outcome, doc=_doc(ended))
            )
            return bool(result.rowcount)

        return await self._run(work)

    async def prune_ended(self, cutoff: int, limit: int) -> int:
        """Delete up to ``limit`` runs that ended before ``cutoff`` (ms), oldest first
        (``ix_cron_runs_open``), in a transaction of their own; how many. An open run stays. No
        tick that old is looked for again (each scheduler looks from its own start on), so its
        claim's row is no longer needed. PostgreSQL: FOR UPDATE SKIP LOCKED, as a task batch."""

        def work(s: Tx) -> int:
            conn = s.connection()
            ids = list(conn.execute(_ENDED_BEFORE, {"cutoff": cutoff, "limit": limit}).scalars())
            if ids:
                conn.execute(sa.delete(RUNS).where(RUNS.c.run_id.in_(ids)))
            return len(ids)

        return await self.tasks.group.alone(work)

    async def list_runs(self, cron_id: str, page_size: int, clamp: Callable[[int], int]) -> tuple[int, list[CronRun]]:
        """(total, the runs of the page ``clamp(total)`` picks), newest first."""

        def work(s: Tx) -> tuple[int, list[CronRun]]:
            conn = s.connection()
            where = RUNS.c.cron_id == cron_id
            total = int(conn.execute(sa.select(sa.func.count()).select_from(RUNS).where(where)).scalar_one())
            page = clamp(total)
            rows = conn.execute(
                sa.select(RUNS)
                .where(where)
                .order_by(RUNS.c.started_at.desc(), RUNS.c.run_id.desc())
                .offset(page * page_size)
                .limit(page_size)
            )
            return total, [_run_from_row(r) for r in rows]

        return await self._run(work)
