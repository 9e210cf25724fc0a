"""Where SQLite's WAL checkpoints run: in the commits (SQLite's default) or on the checkpoint thread.

Run: .venv/bin/python bench/bench_checkpoint.py [N]
The scheduler's store lifecycle of ``bench_store`` (N tasks, default 2000: create, claim,
launch, identity, running, completed, a log follower), in a temporary SQLite database on
the data disk, in two modes taken in turns (A B B A B A):

- ``in commits``: SQLite's default — the commit that takes the log past 1,000 pages
  checkpoints it (``wal_autocheckpoint=1000``), and no checkpoint thread;
- ``on thread``: taskgate's — the writers' threshold is the backstop
  (``wal_checkpoint.BACKSTOP_PAGES``) and the process's checkpoint thread copies the log
  once 1,000 pages wait.

Prints, per mode (medians of three rounds), each commit's wall time on the database thread
(p50, p99, max), the commits that took over 5 ms and their total, the checkpoints the
thread ran, tasks/s and CPU ms per task (the whole process, the checkpoint thread included).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import structlog  # noqa: E402
from sqlalchemy.engine import default  # noqa: E402

from bench import bench_store  # noqa: E402
from bench.stats import pct  # noqa: E402
from libs import wal_checkpoint  # noqa: E402

SLOW_MS = 5.0
MODES = ("in commits", "on thread")
commit_ms: list[float] = []


def time_commits() -> None:
    real = default.DefaultDialect.do_commit

    def timed(self: default.DefaultDialect, dbapi_connection: Any) -> None:
        began = time.perf_counter()
        try:
            real(self, dbapi_connection)
        finally:
            commit_ms.append((time.perf_counter() - began) * 1000)

    default.DefaultDialect.do_commit = timed  # type: ignore[method-assign]


async def one_round(mode: str, n: int) -> dict[str, float]:
    backstop, threshold = wal_checkpoint.BACKSTOP_PAGES, wal_checkpoint.THRESHOLD_PAGES
    if mode == "in commits":
        wal_checkpoint.BACKSTOP_PAGES, wal_checkpoint.THRESHOLD_PAGES = 1000, 10**9
    watches: list[wal_checkpoint.Watch] = []
    real_watch = wal_checkpoint.watch

    def kept(path: Any, threshold: int | None = None) -> wal_checkpoint.Watch:
        watches.append(real_watch(path, threshold))
        return watches[-1]

    wal_checkpoint.watch = kept  # type: ignore[assignment]
    commit_ms.clear()
    try:
        with tempfile.TemporaryDirectory(dir=Path(__file__).resolve().parent.parent / "var") as tmp:
            cpu0 = time.process_time()
            figures = await bench_store.one_round(Path(tmp), n)
            cpu = time.process_time() - cpu0
    finally:
        wal_checkpoint.BACKSTOP_PAGES, wal_checkpoint.THRESHOLD_PAGES = backstop, threshold
        wal_checkpoint.watch = real_watch  # type: ignore[assignment]
    slow = [ms for ms in commit_ms if ms > SLOW_MS]
    return {
        "commit p50 ms": statistics.median(commit_ms),
        "commit p99 ms": pct(commit_ms, 0.99),
        "commit max ms": max(commit_ms),
        f"commits over {SLOW_MS:g} ms": float(len(slow)),
        "their total ms": sum(slow),
        "checkpoints by the thread": float(sum(w.checkpoints for w in watches)),
        "tasks/s": figures["tasks_per_s"],
        "CPU ms/task (process)": 1000 * cpu / n,
    }


async def main(n: int) -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    (Path(__file__).resolve().parent.parent / "var").mkdir(exist_ok=True)
    time_commits()
    runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    for mode in ("in commits", "on thread", "on thread", "in commits", "on thread", "in commits"):
        runs[mode].append(await one_round(mode, n))
    print(f"SQLite WAL checkpoints, the store lifecycle of {n} tasks, data disk (median of 3, A B B A B A):")
    for key in runs[MODES[0]][0]:
        cells = "   ".join(f"{mode}: {statistics.median(r[key] for r in runs[mode]):9.2f}" for mode in MODES)
        print(f"  {key:28} {cells}")
    print(f"  (reproduce: .venv/bin/python bench/bench_checkpoint.py {n})")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 2000))
