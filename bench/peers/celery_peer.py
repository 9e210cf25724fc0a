"""Celery with Redis (broker and result backend): N no-op tasks, enqueue -> result stored.

Run (peers' environment, a redis-server listening at URL):
  var/bench-peers-venv/bin/python bench/peers/celery_peer.py --url redis://127.0.0.1:PORT --n 1000
Broker in database 0, results in database 1 (so that counting the results is one DBSIZE).
The worker is Celery's default: the prefork pool with one child per core (CELERY_CONCURRENCY to
change it), without gossip, mingle and heartbeat (they only add start-up time on one machine).
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import redis  # noqa: E402
from celery import Celery  # noqa: E402
from celery.exceptions import SecurityWarning  # noqa: E402
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

CONCURRENCY = int(os.environ.get("CELERY_CONCURRENCY", str(os.cpu_count() or 1)))


def make_app(url: str) -> Celery:
    app = Celery("bench", broker=f"{url}/0", backend=f"{url}/1")
    app.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
    )

    @app.task(name="noop")
    def noop(enqueued_at: float) -> list[float]:
        return [enqueued_at, time.time()]

    return app


def run_worker(app: Celery) -> None:
    # This machine runs everything as root; Celery warns about that on every start.
    warnings.filterwarnings("ignore", category=SecurityWarning)
    app.worker_main(
        [
            "--quiet",  # no banner
            "worker",
            "--pool=prefork",
            f"--concurrency={CONCURRENCY}",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "--loglevel=WARNING",
        ]
    )


def one_round(n: int, app: Celery, url: str) -> RoundFigures:
    broker = redis.Redis.from_url(f"{url}/0")
    backend = redis.Redis.from_url(f"{url}/1")
    broker.flushdb()  # queue and results of an earlier round
    backend.flushdb()
    noop = app.tasks["noop"]
    worker = start_worker(sys.argv[:])
    try:
        noop.delay(time.time())  # ready once the worker answers a first task
        wait_until(lambda: backend.dbsize() >= 1, 60, "the celery worker", worker)
        backend.flushdb()
        began = time.perf_counter()
        results = [noop.delay(time.time()) for _ in range(n)]
        wait_until(lambda: backend.dbsize() >= n, 600, f"{n} celery results", worker)
        elapsed = time.perf_counter() - began
        latencies = []
        for r in results:
            enqueued, finished = r.get(timeout=10)
            latencies.append((finished - enqueued) * 1000)
        return RoundFigures(tasks_per_s=n / elapsed, latencies_ms=tuple(latencies))
    finally:
        stop_worker(worker)


def main() -> None:
    args = parse_args(__doc__ or "")
    if not args.url:
        sys.exit("--url redis://HOST:PORT is required")
    args.url = args.url.rstrip("/")
    app = make_app(args.url)
    if args.worker:
        run_worker(app)
        return
    rounds = []
    for r in range(args.rounds):
        figures = one_round(args.n, app, args.url)
        progress(f"  celery round {r + 1}/{args.rounds}: {figures.tasks_per_s:8.1f} tasks/s")
        rounds.append(figures)
    config = {"pool": "prefork", "concurrency": CONCURRENCY, "broker": "redis", "backend": "redis"}
    write_rounds(args.json, rounds, version_of("celery", "redis"), config)


if __name__ == "__main__":
    main()
