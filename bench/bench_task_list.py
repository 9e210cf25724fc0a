"""The default task list (a session's unfinished tasks, newest first) as the session's history grows.

Run: .venv/bin/python bench/bench_task_list.py
The scheduler's store alone on SQLite: one session with 1,000 and then 10,000 tasks, of which 50
stay unfinished; p50 of the default list (first page of 20, with its total) at each size. Then
the other layout: the 50 unfinished tasks are the session's oldest, every finished one newer.
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

SIZES = (1_000, 10_000)
UNFINISHED = 50
CALLS = 200


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


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        db = Database(f"sqlite:///{Path(tmp) / 'scheduler.db'}", MIGRATIONS)
        db.migrate()
        store = SchedulerStore(db)
        made = 0
        results = {}
        for size in SIZES:
            # Finished history first; the unfinished tasks are the newest.
            while made < size - UNFINISHED:
                batch = range(made, min(size - UNFINISHED, made + 500))
                await asyncio.gather(*(store.create_task(task(i, State.COMPLETED)) for i in batch))
                made = batch[-1] + 1
            await asyncio.gather(*(store.create_task(task(made + j, State.QUEUED)) for j in range(UNFINISHED)))
            made += UNFINISHED
            times = []
            for _ in range(CALLS):
                t0 = time.perf_counter()
                total, page = await store.list_tasks("agent-1", "cli-1", False, 0, 20, lambda total: 0)
                times.append((time.perf_counter() - t0) * 1000)
            # Earlier sizes' unfinished tasks stay unfinished too.
            assert total == UNFINISHED * (SIZES.index(size) + 1) and len(page) == 20, (total, len(page))
            results[size] = statistics.median(times)
            print(f"default list, {size:6} tasks in the session: p50 {results[size]:6.2f} ms", flush=True)
        db.close()
    print(f"ratio 10k/1k: {results[SIZES[1]] / results[SIZES[0]]:.2f}x")
    oldest = {size: await unfinished_oldest(size) for size in SIZES}
    for size, p50 in oldest.items():
        print(f"default list, {size:6} tasks, the {UNFINISHED} unfinished the oldest: p50 {p50:6.2f} ms", flush=True)
    print(f"ratio 10k/1k (unfinished oldest): {oldest[SIZES[1]] / oldest[SIZES[0]]:.2f}x")


async def unfinished_oldest(size: int) -> float:
    """The other layout: long-running tasks older than the whole finished history after them."""
    with tempfile.TemporaryDirectory() as tmp:
        db = Database(f"sqlite:///{Path(tmp) / 'scheduler.db'}", MIGRATIONS)
        db.migrate()
        store = SchedulerStore(db)
        await asyncio.gather(*(store.create_task(task(j, State.RUNNING)) for j in range(UNFINISHED)))
        for start in range(UNFINISHED, size, 500):
            await asyncio.gather(
                *(store.create_task(task(i, State.COMPLETED)) for i in range(start, min(size, start + 500)))
            )
        times = []
        for _ in range(CALLS):
            t0 = time.perf_counter()
            total, page = await store.list_tasks("agent-1", "cli-1", False, 0, 20, lambda total: 0)
            times.append((time.perf_counter() - t0) * 1000)
        assert total == UNFINISHED and len(page) == 20, (total, len(page))
        db.close()
        return statistics.median(times)


if __name__ == "__main__":
    asyncio.run(main())
