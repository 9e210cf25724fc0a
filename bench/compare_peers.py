"""taskgate next to its job-queue peers on this machine, in one run (issue 11 item 6).

Run: make bench-peers                      (creates the peers' environment, then runs this)
     .venv/bin/python bench/compare_peers.py [--n 1000] [--rounds 3] [--quick] [--only huey,celery]

Each system gets the same N tasks, enqueued as fast as its client goes, timed until the last one has
completed (tasks/s, median of the rounds), and per-task latency enqueue -> completion (p50/p99 pooled
over the rounds; a burst of N, so queue wait is part of it):
  - taskgate: REST created -> completed, a `/bin/true` worker process per task, the five real
    processes (bench/bench_tasks.py --throughput N);
  - Huey (SQLite), procrastinate (PostgreSQL, a throwaway cluster), Celery (Redis, a throwaway
    redis-server; skipped with the reason when redis-server is not on PATH): a no-op task, no process
    per task, each in the peers' own environment (var/bench-peers-venv), never the project's;
  - the spawn floor: bare asyncio.create_subprocess_exec('/bin/true') + wait, one at a time and 8 in flight.
Writes docs/bench/results.json and results.md, and draws docs/bench/*.png (matplotlib, peers' environment).
With --only the figures go to var/bench-peers/results.json and no chart is drawn, so that docs/bench
always holds one whole run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.comparison import (  # noqa: E402
    SPAWN_PARALLEL,
    SPAWN_SEQUENTIAL,
    TASKGATE,
    Comparison,
    RoundFigures,
    SystemResult,
    markdown_table,
    summary_lines,
    targets_table,
)
from tests.support.postgres import PostgresUnavailable, fresh_database, start_postgres  # noqa: E402
from tests.support.procs import free_port  # noqa: E402

PEERS_PYTHON = REPO / "var" / "bench-peers-venv" / "bin" / "python"
DOCS = REPO / "docs" / "bench"
SYSTEMS = (TASKGATE, "huey", "procrastinate", "celery", SPAWN_SEQUENTIAL, SPAWN_PARALLEL)
QUICK_N, QUICK_ROUNDS = 200, 1

LABELS = {
    TASKGATE: ("taskgate", "REST created→completed, a /bin/true worker per task"),
    "huey": ("Huey (SQLite)", "no-op task, 4 consumer threads"),
    "procrastinate": ("procrastinate (PostgreSQL)", "no-op task, 1 worker, concurrency 8"),
    "celery": ("Celery (Redis)", "no-op task, prefork pool, 1 child per core"),
    SPAWN_SEQUENTIAL: (
        "spawn floor, sequential",
        "bare asyncio.create_subprocess_exec('/bin/true') + wait; latency: one spawn, no queue",
    ),
    SPAWN_PARALLEL: (
        "spawn floor, 8 in flight",
        "bare asyncio.create_subprocess_exec('/bin/true') + wait; latency: one spawn, no queue",
    ),
}


def progress(message: str) -> None:
    print(message, flush=True)


def reproduce(key: str, n: int, rounds: int) -> str:
    if key == TASKGATE:
        return f".venv/bin/python bench/bench_tasks.py --throughput {n} --rounds {rounds}"
    return f"make bench-peers BENCH_ARGS='--only {key} --n {n} --rounds {rounds}'"


def result_from_file(key: str, path: Path, n: int, command: str) -> SystemResult:
    raw = json.loads(path.read_text())
    rounds = [RoundFigures.from_json(r) for r in raw["rounds"]]
    label, workload = LABELS[key]
    return SystemResult.from_rounds(key, label, workload, command, n, rounds, version=str(raw.get("version", "")))


def skipped(key: str, command: str, reason: str) -> SystemResult:
    label, workload = LABELS[key]
    progress(f"  {label}: skipped — {reason}")
    return SystemResult.skip(key, label, workload, command, reason)


# --- the spawn floor -------------------------------------------------------------------------------


async def spawn_round(n: int, in_flight: int) -> RoundFigures:
    """N `/bin/true` processes through bare asyncio, at most ``in_flight`` alive at once."""
    sem = asyncio.Semaphore(in_flight)
    latencies: list[float] = []

    async def one() -> None:
        async with sem:
            t0 = time.perf_counter()
            proc = await asyncio.create_subprocess_exec("/bin/true")
            await proc.wait()
            latencies.append((time.perf_counter() - t0) * 1000)

    began = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n)))
    return RoundFigures(tasks_per_s=n / (time.perf_counter() - began), latencies_ms=tuple(latencies))


def run_spawn_floor(key: str, in_flight: int, n: int, rounds: int) -> SystemResult:
    label, workload = LABELS[key]
    figures = []
    for r in range(rounds):
        figures.append(asyncio.run(spawn_round(n, in_flight)))
        progress(f"  {label} round {r + 1}/{rounds}: {figures[-1].tasks_per_s:8.1f} spawns/s")
    version = f"Python {platform.python_version()}"
    return SystemResult.from_rounds(key, label, workload, reproduce(key, n, rounds), n, figures, version=version)


# --- taskgate and the peers: a runner process each, figures through a JSON file ---------------------


def run_runner(key: str, argv: list[str], n: int, rounds: int, workdir: Path) -> SystemResult:
    out = workdir / f"{key}.json"
    out.unlink(missing_ok=True)
    cmd = [*argv, "--n" if key != TASKGATE else "--throughput", str(n), "--rounds", str(rounds), "--json", str(out)]
    if key != TASKGATE:
        cmd += ["--workdir", str(workdir / key)]
    progress(f"  $ {shlex.join(cmd)}")
    done = subprocess.run(cmd, cwd=REPO, check=False)
    command = reproduce(key, n, rounds)
    if done.returncode != 0 or not out.exists():
        return skipped(key, command, f"its run failed (exit {done.returncode}); see the output above")
    return result_from_file(key, out, n, command)


def redis_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@contextmanager
def throwaway_redis(workdir: Path) -> Iterator[str]:
    """A redis-server on a free loopback port, no persistence; stopped (its group) on exit."""
    port = free_port()
    log = (workdir / "redis.log").open("wb")
    proc = subprocess.Popen(
        [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(workdir),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 20
        while not redis_ping(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not answer PING (see {workdir / 'redis.log'})")
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def run_taskgate(n: int, rounds: int, workdir: Path) -> SystemResult:
    return run_runner(TASKGATE, [sys.executable, "bench/bench_tasks.py"], n, rounds, workdir)


def run_huey(peers: Path, n: int, rounds: int, workdir: Path) -> SystemResult:
    return run_runner("huey", [str(peers), "bench/peers/huey_peer.py"], n, rounds, workdir)


def run_procrastinate(peers: Path, n: int, rounds: int, workdir: Path) -> SystemResult:
    try:
        url, stop = start_postgres(workdir / "postgres")
    except PostgresUnavailable as exc:
        return skipped("procrastinate", reproduce("procrastinate", n, rounds), f"no PostgreSQL here ({exc})")
    try:
        database = fresh_database(url, "bench")
        argv = [str(peers), "bench/peers/procrastinate_peer.py", "--url", database]
        return run_runner("procrastinate", argv, n, rounds, workdir)
    finally:
        stop()


def run_celery(peers: Path, n: int, rounds: int, workdir: Path) -> SystemResult:
    if shutil.which("redis-server") is None:
        reason = "redis-server is not on PATH (apt-get install -y redis-server)"
        return skipped("celery", reproduce("celery", n, rounds), reason)
    with throwaway_redis(workdir) as url:
        return run_runner("celery", [str(peers), "bench/peers/celery_peer.py", "--url", url], n, rounds, workdir)


# --- the whole run ------------------------------------------------------------------------------------


def machine() -> dict[str, object]:
    return {
        "cpus": os.cpu_count(),
        "load_average_at_start": list(os.getloadavg()),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=None, help="tasks per round (default 1000; 200 with --quick)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per system (default 3; 1 with --quick)")
    parser.add_argument("--quick", action="store_true", help="N=200, one round: a smoke run, not the figures")
    parser.add_argument("--only", default="", help=f"comma-separated subset of: {', '.join(SYSTEMS)}")
    parser.add_argument("--peers-python", type=Path, default=PEERS_PYTHON)
    parser.add_argument("--out", type=Path, default=None, help="results JSON (default docs/bench/results.json)")
    args = parser.parse_args()
    n = args.n or (QUICK_N if args.quick else 1000)
    rounds = args.rounds or (QUICK_ROUNDS if args.quick else 3)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = sorted(set(only) - set(SYSTEMS))
    if unknown or n < 1 or rounds < 1:
        parser.error(f"unknown system(s) {unknown}" if unknown else "--n and --rounds must be at least 1")
    partial = bool(only)
    out = args.out or (REPO / "var" / "bench-peers" / "results.json" if partial else DOCS / "results.json")
    peers = args.peers_python

    load = os.getloadavg()
    progress(f"comparing taskgate with its peers: N={n}, {rounds} round(s), load average {load[0]:.2f}")
    if load[0] > (os.cpu_count() or 1):
        progress("  note: the machine is busy; the absolute rates will be low")

    workdir = Path(tempfile.mkdtemp(prefix="taskgate-bench-peers-"))
    runs: dict[str, Callable[[], SystemResult]] = {
        SPAWN_SEQUENTIAL: lambda: run_spawn_floor(SPAWN_SEQUENTIAL, 1, n, rounds),
        SPAWN_PARALLEL: lambda: run_spawn_floor(SPAWN_PARALLEL, 8, n, rounds),
        TASKGATE: lambda: run_taskgate(n, rounds, workdir),
        "huey": lambda: run_huey(peers, n, rounds, workdir),
        "procrastinate": lambda: run_procrastinate(peers, n, rounds, workdir),
        "celery": lambda: run_celery(peers, n, rounds, workdir),
    }
    results = []
    try:
        for key in SYSTEMS:
            if only and key not in only:
                continue
            progress(f"\n[{LABELS[key][0]}]")
            if key not in (TASKGATE, SPAWN_SEQUENTIAL, SPAWN_PARALLEL) and not peers.exists():
                reason = f"the peers' environment is missing ({peers}); `make bench-peers` creates it"
                results.append(skipped(key, reproduce(key, n, rounds), reason))
                continue
            results.append(runs[key]())
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    comparison = Comparison(
        systems=tuple(results), generated_at=datetime.now(UTC).isoformat(timespec="seconds"), machine=machine()
    )
    comparison.write(out)
    progress(f"\nfigures (tasks/s median of {rounds}; latency enqueue→completion pooled over the rounds):")
    for line in summary_lines(comparison):
        progress(line)
    progress(f"\nwrote {out.relative_to(REPO) if out.is_relative_to(REPO) else out}")
    if partial:
        return
    (out.parent / "results.md").write_text(
        f"<!-- written by bench/compare_peers.py on {comparison.generated_at}; do not edit -->\n\n"
        f"{markdown_table(comparison)}\n\n{targets_table(comparison)}\n"
    )
    progress(f"wrote {(out.parent / 'results.md').relative_to(REPO)}")
    if not peers.exists():
        progress("no chart: the peers' environment (with matplotlib) is missing")
        return
    drawn = subprocess.run([str(peers), "bench/peers/chart.py", str(out), str(out.parent)], cwd=REPO, check=False)
    if drawn.returncode != 0:
        sys.exit("drawing the chart failed")


if __name__ == "__main__":
    main()
