"""procrastinate on PostgreSQL: N no-op jobs, defer -> job succeeded, one worker process.

Run (peers' environment, an empty PostgreSQL database at URL):
  var/bench-peers-venv/bin/python bench/peers/procrastinate_peer.py --url postgresql://... --n 1000
The worker runs PROCRASTINATE_CONCURRENCY concurrent jobs (default 8) and wakes on LISTEN/NOTIFY.
Latency is read from procrastinate's own event table (the `deferred` and `succeeded` events).
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg  # noqa: E402
from common import POLL_S, RoundFigures, parse_args, progress, start_worker, stop_worker, version_of, write_rounds  # noqa: E402
from procrastinate import App, PsycopgConnector  # noqa: E402

CONCURRENCY = int(os.environ.get("PROCRASTINATE_CONCURRENCY", "8"))


class _TopLevelAppWarning(logging.Filter):
    """Drops procrastinate's advice against an App in __main__: the tasks here have explicit names."""

    def filter(self, record: logging.LogRecord) -> bool:
        return getattr(record, "action", None) != "app_defined_in___main__"


logging.getLogger("procrastinate.blueprints").addFilter(_TopLevelAppWarning())

LATENCIES_SQL = """
SELECT extract(epoch FROM s.at - d.at) * 1000
  FROM procrastinate_events d
  JOIN procrastinate_events s ON s.job_id = d.job_id AND s.type = 'succeeded'
 WHERE d.type = 'deferred' AND d.job_id > %s
"""


def make_app(url: str) -> App:
    app = App(connector=PsycopgConnector(conninfo=url))

    @app.task(name="noop")
    async def noop() -> None:
        return None

    return app


async def run_worker(app: App) -> None:
    async with app.open_async():
        await app.run_worker_async(concurrency=CONCURRENCY, install_signal_handlers=True)  # SIGTERM stops it


async def succeeded(conn: psycopg.AsyncConnection, after_id: int) -> int:
    cur = await conn.execute(
        "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded' AND id > %s", (after_id,)
    )
    row = await cur.fetchone()
    return int(row[0]) if row else 0


async def wait_count(
    conn: psycopg.AsyncConnection,
    after_id: int,
    n: int,
    timeout_s: float,
    what: str,
    worker: subprocess.Popen[bytes],
) -> None:
    deadline = time.monotonic() + timeout_s
    while await succeeded(conn, after_id) < n:
        if worker.poll() is not None:
            raise RuntimeError(f"the worker exited ({worker.returncode}) while waiting for {what}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        await asyncio.sleep(POLL_S)


async def one_round(n: int, app: App, url: str) -> RoundFigures:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute("TRUNCATE procrastinate_jobs CASCADE")  # jobs and events of an earlier round
        worker = start_worker(sys.argv[:])
        try:
            noop = app.tasks["noop"]
            warm_id = await noop.defer_async()  # ready once the worker has run a first job
            await wait_count(conn, warm_id - 1, 1, 60, "the procrastinate worker", worker)
            began = time.perf_counter()
            for _ in range(n):
                await noop.defer_async()
            await wait_count(conn, warm_id, n, 600, f"{n} procrastinate jobs", worker)
            elapsed = time.perf_counter() - began
            cur = await conn.execute(LATENCIES_SQL, (warm_id,))
            latencies = tuple(float(row[0]) for row in await cur.fetchall())
            return RoundFigures(tasks_per_s=n / elapsed, latencies_ms=latencies)
        finally:
            stop_worker(worker)


async def amain() -> None:
    args = parse_args(__doc__ or "")
    if not args.url:
        sys.exit("--url postgresql://... (an empty database) is required")
    app = make_app(args.url)
    if args.worker:
        await run_worker(app)
        return
    async with app.open_async():
        async with await psycopg.AsyncConnection.connect(args.url, autocommit=True) as conn:
            cur = await conn.execute("SELECT to_regclass('procrastinate_jobs') IS NOT NULL")
            row = await cur.fetchone()
        if not (row and row[0]):
            await app.schema_manager.apply_schema_async()
        rounds = []
        for r in range(args.rounds):
            figures = await one_round(args.n, app, args.url)
            progress(f"  procrastinate round {r + 1}/{args.rounds}: {figures.tasks_per_s:8.1f} tasks/s")
            rounds.append(figures)
    config = {"concurrency": CONCURRENCY, "database": "postgresql", "listen_notify": True}
    write_rounds(args.json, rounds, version_of("procrastinate", "psycopg"), config)


if __name__ == "__main__":
    asyncio.run(amain())
