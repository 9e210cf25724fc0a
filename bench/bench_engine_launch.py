"""Launch rate of the scheduler's engine alone (no HTTP, no gRPC): queued -> running.

Run: .venv/bin/python bench/bench_engine_launch.py
Creates N queued `sleep` tasks in a temporary SQLite database, then times one
`dispatch_once()` (which launches them all), next to N bare
`asyncio.create_subprocess_exec` calls of the same command as the floor.

The launch protocol is the one in force: attempt row committed `launching` before
the fork, the worker held in its trampoline until its identity is committed (and,
in cgroup mode, it is in its own cgroup), then `running` committed. Both proof
modes are measured: `cgroup` (where this host allows it) and `subreaper` only.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import structlog

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from libs.db import Database  # noqa: E402
from libs.settings import Settings, TaskSettings, WorkerProfile  # noqa: E402
from services.scheduler.domain import NewTask  # noqa: E402
from services.scheduler.engine import Engine  # noqa: E402
from services.scheduler.store import MIGRATIONS, SchedulerStore  # noqa: E402

N = 100
ROUNDS = 3


async def engine_round(tmp: Path, mode: str) -> float:
    settings = Settings(
        data_dir=tmp,
        tasks=TaskSettings(
            max_running=N,
            supervisor_interval_ms=3_600_000,
            cancel_grace_ms=200,
            proof_mode=mode,  # type: ignore[arg-type]
        ),
        workers={"sleeper": WorkerProfile(command=["sleep", "300"])},
    )
    db = Database(f"sqlite:///{tmp / 'scheduler.db'}", MIGRATIONS)
    db.migrate()
    engine = Engine(settings, SchedulerStore(db))
    await engine.start(run_loops=False)
    assert (engine.ownership.cgroups is not None) == mode.startswith("cgroup")
    for i in range(N):
        await engine.create_task(NewTask("agent", "bench", f"t{i}", "", "sleeper", None, None, None))
    began = time.perf_counter()
    launched = await engine.dispatch_once()
    elapsed = time.perf_counter() - began
    assert launched == N, launched
    await engine.shutdown()
    db.close()
    return N / elapsed


async def floor_round() -> float:
    began = time.perf_counter()
    procs = [await asyncio.create_subprocess_exec("sleep", "300", start_new_session=True) for _ in range(N)]
    elapsed = time.perf_counter() - began
    for p in procs:
        os.killpg(p.pid, signal.SIGKILL)
        await p.wait()
    return N / elapsed


def cgroup_mode_available(version: int) -> bool:
    from services.scheduler import cgroups

    try:
        cgroups.Cgroups.detect("taskgate-bench-probe", (version,)).close()
    except cgroups.CgroupUnavailable as exc:
        print(f"cgroup v{version} mode not measured: {exc}")
        return False
    return True


async def main() -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))
    modes = [m for m, v in (("cgroup", 2), ("cgroup_v1", 1)) if cgroup_mode_available(v)] + ["subreaper"]
    rates: dict[str, list[float]] = {m: [] for m in modes}
    floor_rates = []
    for r in range(ROUNDS):
        for mode in modes:
            with tempfile.TemporaryDirectory() as tmp:
                rates[mode].append(await engine_round(Path(tmp), mode))
        floor_rates.append(await floor_round())
        shown = ", ".join(f"{m} {rates[m][-1]:.0f}/s" for m in modes)
        print(f"round {r + 1}/{ROUNDS}: engine {shown}, floor {floor_rates[-1]:.0f}/s", flush=True)
    f = statistics.median(floor_rates)
    print()
    for mode in modes:
        e = statistics.median(rates[mode])
        print(f"engine launches ({mode:9} mode), queued->running, N={N} (median of {ROUNDS}): {e:7.1f} /s")
    print(f"floor: bare asyncio.create_subprocess_exec of the same command:  {f:7.1f} /s")


if __name__ == "__main__":
    asyncio.run(main())
