"""The default task list (a session's unfinished tasks, newest first) as the session's history grows.

Run: .venv/bin/python bench/bench_task_list.py [SMALL LARGE]   (default 1000 10000)
The scheduler's store alone on SQLite: one session with 1,000 tasks in one database and 10,000 (or
the sizes given) in another, 50 of them unfinished; p50 of the default list (first page of 20, with its total) on each,
the two taking turns. First with the unfinished tasks the session's newest, then the oldest (every
finished one newer).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from libs.db import Database  # noqa: E402
from services.scheduler.domain import State, Task  # noqa: E402
from services.scheduler.store import MIGRATIONS, SchedulerStore  # noqa: E402

SIZES = tuple(int(n) for n in sys.argv[1:]) or (1_000, 10_000)
UNFINISHED = 50
CALLS = 1000


def task(i: int, state: State) -> Task:
    return Task(
        task_id=f"{i:032x}",
        agent_id="agent-1",
        session_id="cli-1",
        title="t",
        instructions="",
        profile="p",
        state=state,
        created_at=1_000 + i,
        updated_at=1_000 + i,
    )


ROUNDS = 10  # the sizes take turns, CALLS // ROUNDS calls each per round


async def filled(path: Path, size: int, unfinished_oldest: bool) -> SchedulerStore:
    """A store whose one session holds ``size`` tasks, ``UNFINISHED`` of them not finished:
    the newest (the usual layout) or the oldest (long-running tasks under newer history)."""
    db = Database(f"sqlite:///{path}", MIGRATIONS)
    db.migrate()
    store = SchedulerStore(db)
    first = 0 if unfinished_oldest else size - UNFINISHED
    unfinished = range(first, first + UNFINISHED)
    for start in range(0, size, 500):
        await asyncio.gather(
            *(
                store.create_task(task(i, State.QUEUED if i in unfinished else State.COMPLETED))
                for i in range(start, min(size, start + 500))
            )
        )
    return store


async def list_p50s(stores: dict[int, SchedulerStore]) -> dict[int, float]:
    """p50 of the default list on each store, the stores taking turns (a few calls each per
    round): this VM's speed drifts by 2x within minutes, and one size measured after the other
    put that drift in the ratio (single runs read 0.96x to 1.65x)."""
    times: dict[int, list[float]] = {size: [] for size in stores}
    for _ in range(ROUNDS):
        for size, store in stores.items():
            for _ in range(CALLS // ROUNDS):
                t0 = time.perf_counter()
                total, page = await store.list_tasks("agent-1", "cli-1", False, 0, 20, lambda total: 0)
                times[size].append((time.perf_counter() - t0) * 1000)
                assert total == UNFINISHED and len(page) == 20, (total, len(page))
    return {size: statistics.median(t) for size, t in times.items()}


async def main() -> None:
    for oldest, layout in ((False, "unfinished the newest"), (True, "unfinished the oldest")):
        with tempfile.TemporaryDirectory() as tmp:
            stores = {size: await filled(Path(tmp) / f"{size}.db", size, oldest) for size in SIZES}
            p50 = await list_p50s(stores)
            for store in stores.values():
                store.db.close()
        for size in SIZES:
            print(f"default list, {size:6} tasks, {layout}: p50 {p50[size]:6.2f} ms", flush=True)
        print(f"ratio {SIZES[1]:,}/{SIZES[0]:,} ({layout}): {p50[SIZES[1]] / p50[SIZES[0]]:.2f}x", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
