"""What a PostgreSQL transaction costs this client, and what the pooled connections' check saves.

Run: .venv/bin/python bench/bench_pg_roundtrip.py [N] [ROUNDS]   (default 3000 3)
On a throwaway PostgreSQL 15 cluster (tests/support/postgres.py), in this process, ROUNDS
alternating rounds of N transactions each:
  - a lone `SELECT 1` transaction through SQLAlchemy (what ``Database.transaction`` runs on
    PostgreSQL), once on the project's engine (``libs.db.make_engine``: a pooled connection is
    pinged only when its socket is readable or it sat idle) and once on an engine with
    SQLAlchemy's ``pool_pre_ping`` (a ping before every transaction, as before f702ef7);
  - a bare psycopg `SELECT 1` + `COMMIT` over 127.0.0.1 and over the cluster's Unix socket.
Prints wall and CPU µs per transaction, medians of the rounds.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg  # noqa: E402
from sqlalchemy import create_engine, text  # noqa: E402

from libs.db import libpq_url, make_engine  # noqa: E402
from tests.support.postgres import PostgresUnavailable, fresh_database, throwaway_cluster  # noqa: E402

N = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 3


def timed(n: int, one: Callable[[], object]) -> tuple[float, float]:
    """(wall µs, CPU µs) per call of ``one``, after a warm-up."""
    for _ in range(200):
        one()
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(n):
        one()
    return (time.perf_counter() - wall) / n * 1e6, (time.process_time() - cpu) / n * 1e6


def main() -> None:
    try:
        with throwaway_cluster() as cluster:
            url = fresh_database(cluster, "roundtrip")
            sa_url = "postgresql+psycopg://" + url.split("://", 1)[1]
            project, pre_ping = make_engine(url), create_engine(sa_url, pool_pre_ping=True)
            port = url.rsplit(":", 1)[1].split("/")[0]
            socket_dir = next(Path("/tmp").glob(f"taskgate-pg-*/.s.PGSQL.{port}")).parent
            tcp = psycopg.connect(libpq_url(url))
            unix = psycopg.connect(f"host={socket_dir} port={port} user=postgres dbname={url.rsplit('/', 1)[1]}")

            def through(engine: object) -> Callable[[], object]:
                def one() -> object:
                    with engine.begin() as conn:  # type: ignore[attr-defined]
                        return conn.execute(text("SELECT 1")).scalar_one()

                return one

            def bare(conn: psycopg.Connection) -> Callable[[], object]:
                def one() -> object:
                    row = conn.execute("SELECT 1").fetchone()
                    conn.commit()
                    return row

                return one

            cases = {
                "SQLAlchemy transaction, pinged only in doubt (the project's engine)": through(project),
                "SQLAlchemy transaction, pool_pre_ping (a ping each time)": through(pre_ping),
                "bare psycopg SELECT 1 + COMMIT over 127.0.0.1": bare(tcp),
                "bare psycopg SELECT 1 + COMMIT over the Unix socket": bare(unix),
            }
            figures: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
            for _ in range(ROUNDS):  # alternating: the VM's drift falls on every case alike
                for name, one in cases.items():
                    figures[name].append(timed(N, one))
            for name, runs in figures.items():
                wall = statistics.median(w for w, _ in runs)
                cpu = statistics.median(c for _, c in runs)
                print(f"{name}: {wall:6.0f} us wall, {cpu:6.0f} us CPU per transaction (median of {ROUNDS})")
            tcp.close()
            unix.close()
            project.dispose()
            pre_ping.dispose()
    except PostgresUnavailable as exc:
        print(f"skipped: {exc}")
        return
    print(f"  (reproduce: .venv/bin/python bench/bench_pg_roundtrip.py {N} {ROUNDS})")


if __name__ == "__main__":
    main()
