"""The launch and exit path of the scheduler's engine alone: thread hops and /proc reads per task.

Run: .venv/bin/python bench/bench_exit_path.py
Runs N `/bin/true` tasks through the engine in this process (SQLite, no gRPC, no
HTTP; up to 32 at a time), queued -> completed, and counts per task what the
launch and exit path costs besides the database: hops to a thread
(``asyncio.to_thread``, by the module that asked), process-table reads, and exits
whose proof needed a stop (``Stopper.stop_tree``) instead of the shared reads.
Prints the CPU of this process per task too (user and system; the database
thread included). Both proof modes are measured where the host allows them.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import structlog

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from libs import proctree  # noqa: E402
from libs.db import Database  # noqa: E402
from libs.settings import Settings, TaskSettings, WorkerProfile  # noqa: E402
from services.scheduler.domain import NewTask, State  # noqa: E402
from services.scheduler.engine import Engine  # noqa: E402
from services.scheduler.stopping import Stopper  # noqa: E402
from services.scheduler.store import MIGRATIONS, SchedulerStore  # noqa: E402

N = 300
ROUNDS = 3
MAX_RUNNING = 32

hops: collections.Counter[str] = collections.Counter()
reads = 0
stops = 0


def instrument() -> None:
    real_to_thread = asyncio.to_thread

    async def counted(func: Any, /, *args: Any, **kwargs: Any) -> Any:
        hops[sys._getframe(1).f_globals.get("__name__", "?")] += 1
        return await real_to_thread(func, *args, **kwargs)

    asyncio.to_thread = counted  # type: ignore[assignment]

    real_stop_tree = Stopper.stop_tree

    async def counted_stop(self: Stopper, attempt: Any) -> Any:
        global stops
        stops += 1
        return await real_stop_tree(self, attempt)

    Stopper.stop_tree = counted_stop  # type: ignore[method-assign]


def counted_table() -> dict[int, proctree.ProcStat]:
    global reads
    reads += 1
    return proctree.process_table()


async def one_round(tmp: Path, mode: str) -> dict[str, float]:
    global reads, stops
    settings = Settings(
        data_dir=tmp,
        tasks=TaskSettings(
            max_running=MAX_RUNNING,
            supervisor_interval_ms=3_600_000,
            cancel_grace_ms=1000,
            proof_mode=mode,  # type: ignore[arg-type]
        ),
        workers={"true": WorkerProfile(command=["true"])},
    )
    db = Database(f"sqlite:///{tmp / 'scheduler.db'}", MIGRATIONS)
    db.migrate()
    engine = Engine(settings, SchedulerStore(db), table_reader=counted_table)
    await engine.start(run_loops=False)
    ids = [
        (await engine.create_task(NewTask("agent", "bench", f"t{i}", "", "true", None, None, None))).task_id
        for i in range(N)
    ]
    hops.clear()
    reads = stops = 0
    cpu0, began = os.times(), time.perf_counter()
    pending = set(ids)
    while pending:
        await engine.dispatch_once()
        await asyncio.sleep(0.002)
        if not engine.runtime.live:
            done = await engine.store.find_tasks(list(pending))
            pending = {t for t in pending if done[t].state not in (State.COMPLETED, State.FAILED)}
    elapsed = time.perf_counter() - began
    cpu1 = os.times()
    failed = [t for t, task in (await engine.store.find_tasks(ids)).items() if task.state != State.COMPLETED]
    assert not failed, f"{len(failed)} tasks did not complete"
    await engine.shutdown()
    db.close()
    figures = {f"hops/task {k}": v / N for k, v in hops.items()}
    figures.update(
        {
            "hops/task (all to_thread)": sum(hops.values()) / N,
            "/proc reads/task": reads / N,
            "exits needing a stop": float(stops),
            "tasks/s": N / elapsed,
            "cpu ms/task user": 1000 * (cpu1.user - cpu0.user) / N,
            "cpu ms/task system": 1000 * (cpu1.system - cpu0.system) / N,
        }
    )
    return figures


def cgroup_mode_available() -> bool:
    from services.scheduler import cgroups

    try:
        cgroups.Cgroups.detect("taskgate-bench-probe", (2,)).close()
    except cgroups.CgroupUnavailable as exc:
        print(f"cgroup mode not measured: {exc}")
        return False
    return True


async def main() -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))
    instrument()
    modes = (["cgroup"] if cgroup_mode_available() else []) + ["subreaper"]
    for mode in modes:
        runs = []
        for _ in range(ROUNDS):
            with tempfile.TemporaryDirectory() as tmp:
                runs.append(await one_round(Path(tmp), mode))
        print(f"{mode} mode, N={N} /bin/true tasks, up to {MAX_RUNNING} at a time (median of {ROUNDS}):")
        for key in sorted({k for r in runs for k in r}):
            print(f"  {key:40} {statistics.median(r.get(key, 0.0) for r in runs):8.2f}")


if __name__ == "__main__":
    asyncio.run(main())
