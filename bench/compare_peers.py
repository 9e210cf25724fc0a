"""taskgate next to its job-queue peers on this machine, in one run (issue 11 item 6).

Run: make bench-peers                      (creates the peers' environment, then runs this)
     .venv/bin/python bench/compare_peers.py --render   (redraw results.md and the charts from results.json)
     .venv/bin/python bench/compare_peers.py [--n 1000] [--rounds 5] [--quick] [--only huey,celery]

Each system gets the same N tasks, enqueued as fast as its client goes, timed until the last one has
completed (tasks/s, median of the rounds), and per-task latency enqueue -> completion (p50/p99 pooled
over the rounds; a burst of N, so queue wait is part of it):
  - taskgate: REST created -> completed, a `/bin/true` worker process per task, the five real
    processes (bench/bench_tasks.py --throughput N), 16 creates in flight: the figure the issue's
    targets are judged on since it was filed, a closed loop on a create's latency (the creates take
    ~97 % of the run);
  - taskgate, with a backlog: the same with 64 creates in flight, so that the creates run ahead of
    the workers and the run drains a queue, as each peer's does (its client enqueues faster than
    its consumer runs: procrastinate's defers go at ~1,250/s);
  - Huey (SQLite), procrastinate (PostgreSQL, a throwaway cluster), Celery (Redis, a throwaway
    redis-server; skipped with the reason when redis-server is not on PATH): a no-op task, no process
    per task, each in the peers' own environment (var/bench-peers-venv), never the project's;
  - the spawn floor: bare asyncio.create_subprocess_exec('/bin/true') + wait, one at a time and 8 in flight.
Writes docs/bench/results.json and results.md, and draws docs/bench/*.png (matplotlib, peers' environment).
With --quick the figures, table and charts go to var/bench-peers/, with --only the figures alone, so
that docs/bench always holds one whole run at full size.
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
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.comparison import (  # noqa: E402
    BACKLOG_CREATES_IN_FLIGHT,
    SPAWN_PARALLEL,
    SPAWN_SEQUENTIAL,
    TASKGATE,
    TASKGATE_BACKLOG,
    Comparison,
    RoundFigures,
    SystemResult,
    is_taskgate,
    markdown_table,
    summary_lines,
    targets_table,
)
from tests.support.postgres import PostgresUnavailable, fresh_database, start_postgres  # noqa: E402
from tests.support.procs import free_port  # noqa: E402

PEERS_PYTHON = REPO / "var" / "bench-peers-venv" / "bin" / "python"
DOCS = REPO / "docs" / "bench"
# Where a run's data goes unless --data-root says (a new folder per run, removed at its end).
SCRATCH_DATA = REPO / "var" / "bench-peers" / "data"
SYSTEMS = (TASKGATE, TASKGATE_BACKLOG, "huey", "procrastinate", "celery", SPAWN_SEQUENTIAL, SPAWN_PARALLEL)
QUICK_N, QUICK_ROUNDS = 200, 1
# Five rounds by default: one system's rounds spread widely here (procrastinate 566-735 tasks/s
# within one run), and a median of three moved with it.
DEFAULT_ROUNDS = 5

LABELS = {
    TASKGATE: ("taskgate", "REST created→completed, a /bin/true worker per task"),
    TASKGATE_BACKLOG: (
        "taskgate, with a backlog",
        f"as taskgate, {BACKLOG_CREATES_IN_FLIGHT} creates in flight: the creates run ahead of the workers",
    ),
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


# bench_tasks.py's arguments for each of taskgate's runs, beside its size (the round's and the
# reproducing command's alike).
TASKGATE_RUN_ARGS = {TASKGATE: [], TASKGATE_BACKLOG: ["--creates-in-flight", str(BACKLOG_CREATES_IN_FLIGHT)]}


def reproduce(key: str, n: int, rounds: int) -> str:
    if is_taskgate(key):
        return shlex.join(
            [".venv/bin/python", "bench/bench_tasks.py", "--throughput", str(n), "--rounds", str(rounds)]
            + TASKGATE_RUN_ARGS[key]
        )
    return f"make bench-peers BENCH_ARGS='--only {key} --n {n} --rounds {rounds}'"


def result_from_file(key: str, path: Path, n: int, command: str) -> SystemResult:
    """A runner's JSON file (its rounds) as the system's result."""
    raw = json.loads(path.read_text())
    rounds = [RoundFigures.from_json(r) for r in raw["rounds"]]
    label, workload = LABELS[key]
    return SystemResult.from_rounds(key, label, workload, command, n, rounds, version=str(raw.get("version", "")))


class RoundFailed(Exception):
    """A system could not run (a round failed, or what it needs is missing); the message says why."""


def with_load(figures: RoundFigures) -> RoundFigures:
    """The round's figures plus the 1-minute load average at its end (the machine is shared)."""
    return RoundFigures(figures.tasks_per_s, figures.latencies_ms, {**figures.extra, "load_1m": os.getloadavg()[0]})


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


# --- taskgate and the peers: one runner process per round, figures through a JSON file ---------------


def run_runner(key: str, argv: list[str], n: int, workdir: Path) -> tuple[RoundFigures, str]:
    """One round of a runner: its figures and the versions it reports."""
    out = workdir / f"{key}.json"
    out.unlink(missing_ok=True)
    # taskgate's rounds keep their data until the whole comparison ends (``workdir`` is removed
    # then): a round's deleted worker logs would otherwise cost the next round's log creates on
    # a disk without a journal (see bench_tasks.throughput_round).
    size = (
        ["--throughput", str(n), "--data-root", str(workdir / key)]
        if is_taskgate(key)
        else ["--n", str(n), "--workdir", str(workdir / key)]
    )
    cmd = [*argv, *size, "--rounds", "1", "--json", str(out)]
    progress(f"  $ {shlex.join(cmd)}")
    done = subprocess.run(cmd, cwd=REPO, check=False)
    if done.returncode != 0 or not out.exists():
        raise RoundFailed(f"its run failed (exit {done.returncode}); see the output above")
    raw = json.loads(out.read_text())
    return RoundFigures.from_json(raw["rounds"][0]), str(raw.get("version", ""))


def redis_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@contextmanager
def throwaway_redis(workdir: Path) -> Iterator[str]:
    """A redis-server on a free loopback port, no persistence; stopped on exit."""
    port = free_port()
    log = (workdir / "redis.log").open("wb")
    argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    argv += ["--dir", str(workdir)]
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while not redis_ping(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RoundFailed(f"redis-server did not answer PING (see {workdir / 'redis.log'})")
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


@contextmanager
def throwaway_postgres(workdir: Path) -> Iterator[str]:
    """An empty database in a throwaway PostgreSQL cluster (tests/support/postgres.py); stopped on exit."""
    try:
        url, stop = start_postgres(workdir / "postgres")
    except PostgresUnavailable as exc:
        raise RoundFailed(f"no PostgreSQL here ({exc})") from exc
    try:
        yield fresh_database(url, "bench")
    finally:
        stop()


def round_runners(
    wanted: list[str], peers: Path, n: int, workdir: Path, services: ExitStack
) -> dict[str, Callable[[], tuple[RoundFigures, str]] | str]:
    """For each wanted system: how to run one round, or why it cannot run. Starts PostgreSQL and Redis."""
    python = f"Python {platform.python_version()}"
    runners: dict[str, Callable[[], tuple[RoundFigures, str]] | str] = {
        SPAWN_SEQUENTIAL: lambda: (asyncio.run(spawn_round(n, 1)), python),
        SPAWN_PARALLEL: lambda: (asyncio.run(spawn_round(n, 8)), python),
        **{
            key: partial(run_runner, key, [sys.executable, "bench/bench_tasks.py", *args], n, workdir)
            for key, args in TASKGATE_RUN_ARGS.items()
        },
    }
    missing_peers = f"the peers' environment is missing ({peers}); `make bench-peers` creates it"
    for key in ("huey", "procrastinate", "celery"):
        if key in wanted and not peers.exists():
            runners[key] = missing_peers
    if "huey" in wanted and "huey" not in runners:
        runners["huey"] = partial(run_runner, "huey", [str(peers), "bench/peers/huey_peer.py"], n, workdir)
    if "procrastinate" in wanted and "procrastinate" not in runners:
        try:
            database = services.enter_context(throwaway_postgres(workdir))
            argv = [str(peers), "bench/peers/procrastinate_peer.py", "--url", database]
            runners["procrastinate"] = partial(run_runner, "procrastinate", argv, n, workdir)
        except RoundFailed as exc:
            runners["procrastinate"] = str(exc)
    if "celery" in wanted and "celery" not in runners:
        if shutil.which("redis-server") is None:
            runners["celery"] = "redis-server is not on PATH (apt-get install -y redis-server)"
        else:
            try:
                url = services.enter_context(throwaway_redis(workdir))
                argv = [str(peers), "bench/peers/celery_peer.py", "--url", url]
                runners["celery"] = partial(run_runner, "celery", argv, n, workdir)
            except RoundFailed as exc:
                runners["celery"] = str(exc)
    return {key: runners[key] for key in wanted}


def run_all(wanted: list[str], peers: Path, n: int, rounds: int, data_root: Path | None = None) -> list[SystemResult]:
    """Round 1 of every system, then round 2 of every system, ...: a change in the machine's load
    during the run falls on all of them, not on whichever system happened to run then.

    The systems' data goes to a new folder under ``data_root`` (kept) or under ``SCRATCH_DATA``
    (removed at the end): not the system's temporary folder, where the benchmarks and tests run
    before it have just deleted thousands of files — on ext4 without a journal each of taskgate's
    per-worker log files would pay for those deletions, and the peers make no file per task."""
    figures: dict[str, list[RoundFigures]] = {key: [] for key in wanted}
    versions: dict[str, str] = {}
    parent = data_root if data_root is not None else SCRATCH_DATA
    parent.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="taskgate-bench-peers-", dir=parent))
    try:
        with ExitStack() as services:
            runners = round_runners(wanted, peers, n, workdir, services)
            failed = {key: why for key, why in runners.items() if isinstance(why, str)}
            for key, why in failed.items():
                progress(f"{LABELS[key][0]}: skipped — {why}")
            for r in range(rounds):
                for key, runner in runners.items():
                    if key in failed or isinstance(runner, str):
                        continue
                    progress(f"\n[{LABELS[key][0]}] round {r + 1}/{rounds}")
                    try:
                        one, versions[key] = runner()
                    except RoundFailed as exc:
                        failed[key] = str(exc)
                        progress(f"  {LABELS[key][0]}: skipped — {exc}")
                        continue
                    figures[key].append(with_load(one))
                    progress(f"  {one.tasks_per_s:8.1f} tasks/s (load average {os.getloadavg()[0]:.1f})")
    finally:
        if data_root is None:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            progress(f"\nthe run's data is kept in {workdir}")
    results = []
    for key in wanted:
        label, workload = LABELS[key]
        command = reproduce(key, n, rounds)
        if key in failed:
            results.append(SystemResult.skip(key, label, workload, command, failed[key]))
        else:
            results.append(SystemResult.from_rounds(key, label, workload, command, n, figures[key], versions[key]))
    return results


# --- the whole run ------------------------------------------------------------------------------------


def taskgate_commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else "unknown"


def machine() -> dict[str, object]:
    return {
        "taskgate_commit": taskgate_commit(),
        "cpus": os.cpu_count(),
        "load_average_at_start": list(os.getloadavg()),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=None, help="tasks per round (default 1000; 200 with --quick)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per system (default 5; 1 with --quick)")
    parser.add_argument("--quick", action="store_true", help="N=200, one round: a smoke run, not the figures")
    parser.add_argument("--only", default="", help=f"comma-separated subset of: {', '.join(SYSTEMS)}")
    parser.add_argument("--peers-python", type=Path, default=PEERS_PYTHON)
    parser.add_argument("--out", type=Path, default=None, help="results JSON (default docs/bench/results.json)")
    parser.add_argument(
        "--data-root",
        type=Path,
        default=None,
        help="put the systems' data in a new folder under this one and keep it (on ext4 without a journal a "
        "deletion makes the next minutes' file creates dear: docs/performance.md)",
    )
    parser.add_argument("--render", action="store_true", help="only redraw results.md and charts from results.json")
    args = parser.parse_args()
    if args.render:
        results = args.out or DOCS / "results.json"
        write_report(Comparison.read(results), results, args.peers_python)
        return
    n = args.n or (QUICK_N if args.quick else 1000)
    rounds = args.rounds or (QUICK_ROUNDS if args.quick else DEFAULT_ROUNDS)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = sorted(set(only) - set(SYSTEMS))
    if unknown or n < 1 or rounds < 1:
        parser.error(f"unknown system(s) {unknown}" if unknown else "--n and --rounds must be at least 1")
    partial = bool(only)
    # Only a whole run at full size replaces docs/bench; a smoke run or a subset goes to var/.
    scratch = REPO / "var" / "bench-peers" / "results.json"
    out = args.out or (scratch if partial or args.quick else DOCS / "results.json")
    peers = args.peers_python

    at_start = machine()
    load = os.getloadavg()[0]
    progress(f"comparing taskgate with its peers: N={n}, {rounds} round(s) each, load average {load:.2f}")
    if load > (os.cpu_count() or 1):
        progress("  note: the machine is busy; the absolute rates will be low")
    results = run_all([key for key in SYSTEMS if not only or key in only], peers, n, rounds, args.data_root)
    comparison = Comparison(
        systems=tuple(results), generated_at=datetime.now(UTC).isoformat(timespec="seconds"), machine=at_start
    )
    comparison.write(out)
    progress(f"\nfigures (tasks/s median of {rounds}; latency enqueue→completion pooled over the rounds):")
    for line in summary_lines(comparison):
        progress(line)
    progress(f"\nwrote {out}")
    if partial:
        return
    write_report(comparison, out, peers)


def write_report(comparison: Comparison, results: Path, peers: Path) -> None:
    """results.md (the README's tables) and the charts beside ``results``, from the figures of one whole run."""
    out_dir = results.parent
    (out_dir / "results.md").write_text(
        f"<!-- written by bench/compare_peers.py on {comparison.generated_at}; do not edit -->\n\n"
        f"{markdown_table(comparison)}\n\n{targets_table(comparison)}\n"
    )
    progress(f"wrote {out_dir / 'results.md'}")
    if not peers.exists():
        progress("no chart: the peers' environment (with matplotlib) is missing")
        return
    drawn = subprocess.run([str(peers), "bench/peers/chart.py", str(results), str(out_dir)], cwd=REPO, check=False)
    if drawn.returncode != 0:
        sys.exit("drawing the chart failed")


if __name__ == "__main__":
    main()
