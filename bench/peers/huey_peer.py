"""Huey with SQLite storage: N no-op tasks, enqueue -> result stored, one consumer process.

Run (peers' environment): var/bench-peers-venv/bin/python bench/peers/huey_peer.py --n 1000 --rounds 3
The consumer runs HUEY_WORKERS threads (default 4) and polls an empty queue every 10 ms at most
(huey's default backs off to 10 s, which would measure its idle back-off rather than its work).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    RoundFigures,
    parse_args,
    progress,
    start_worker,
    stop_worker,
    version_of,
    wait_until,
    write_rounds,
)
from huey import SqliteHuey  # noqa: E402

WORKERS = int(os.environ.get("HUEY_WORKERS", "4"))


def make_app(db: Path) -> tuple[SqliteHuey, Any]:
    huey = SqliteHuey(name="bench", filename=str(db))

    @huey.task(name="noop")
    def noop(enqueued_at: float) -> tuple[float, float]:
        return enqueued_at, time.time()

    return huey, noop


def run_worker(huey: SqliteHuey) -> None:
    consumer = huey.create_consumer(
        workers=WORKERS, worker_type="thread", periodic=False, initial_delay=0.001, backoff=1.15, max_delay=0.01
    )
    consumer.run()  # SIGTERM stops it


def one_round(n: int, huey: SqliteHuey, noop: Any) -> RoundFigures:
    huey.flush()  # queue and results of an earlier round
    worker = start_worker(sys.argv[:])
    try:
        warm = noop(time.time())  # ready once the consumer answers a first task
        wait_until(lambda: warm.get() is not None, 30, "the huey consumer", worker)
        began = time.perf_counter()
        for _ in range(n):
            noop(time.time())
        wait_until(lambda: huey.result_count() >= n, 600, f"{n} huey results", worker)
        elapsed = time.perf_counter() - began
        latencies = []
        for key in huey.all_results():
            value = huey.get(key)
            if value is not None:
                enqueued, finished = huey.serializer.deserialize(value) if isinstance(value, bytes) else value
                latencies.append((finished - enqueued) * 1000)
        return RoundFigures(tasks_per_s=n / elapsed, latencies_ms=tuple(latencies))
    finally:
        stop_worker(worker)


def main() -> None:
    args = parse_args(__doc__ or "")
    args.workdir.mkdir(parents=True, exist_ok=True)
    db = args.workdir / "huey.db"
    if args.worker:
        run_worker(make_app(db)[0])
        return
    for suffix in ("", "-wal", "-shm"):  # a fresh database per run, before anything opens it
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    huey, noop = make_app(db)
    rounds = []
    for r in range(args.rounds):
        figures = one_round(args.n, huey, noop)
        progress(f"  huey round {r + 1}/{args.rounds}: {figures.tasks_per_s:8.1f} tasks/s")
        rounds.append(figures)
    config = {"workers": WORKERS, "worker_type": "thread", "storage": "sqlite"}
    write_rounds(args.json, rounds, version_of("huey"), config)


if __name__ == "__main__":
    main()
