"""Finished-task retention: how fast a pass deletes history, and what it costs the lifecycle's commits meanwhile.

Run: .venv/bin/python bench/bench_history_retention.py [TASKS]   (default 20000)
The scheduler's store alone on SQLite (a file in a temporary folder): TASKS finished tasks, each
with an attempt and two events (created running, then completed), all past the retention, and a
few hundred unfinished ones. Then one pass of ``HistoryRetention`` (batches of 500, each its own
transaction) while another coroutine creates tasks one after another, as the dispatcher's commits
would go on: the pass's rate, its longest batch (the longest a lifecycle commit can wait behind
it) and the create latency p50/p99 during the pass against the same loop idle just before.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from libs.db import Database  # noqa: E402
from services.scheduler.domain import Attempt, State, Task  # noqa: E402
from services.scheduler.history_retention import HistoryRetention  # noqa: E402
from services.scheduler.store import MIGRATIONS, PRUNE_BATCH, SchedulerStore  # noqa: E402

TASKS = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
UNFINISHED = 300
DAY_MS = 86_400_000
RETENTION_MS = 30 * DAY_MS
NOW_MS = 100 * DAY_MS


def task(i: int, state: State, at: int) -> Task:
    return Task(
        task_id=f"{i:032x}",
        agent_id="agent-1",
        session_id=f"s{i % 50}",
        title="a finished task of the benchmark",
        instructions="do the thing " * 8,
        profile="p",
        state=state,
        created_at=at,
        updated_at=at,
    )


def completed(t: Task) -> Task:
    t.state = State.COMPLETED
    return t


async def fill(store: SchedulerStore) -> None:
    began = time.perf_counter()
    for start in range(0, TASKS, 500):
        chunk = range(start, min(TASKS, start + 500))
        await asyncio.gather(*(store.create_task(task(i, State.RUNNING, DAY_MS + i)) for i in chunk))
        await store.save_attempts(
            [
                Attempt(attempt_id=f"{i:032x}", task_id=f"{i:032x}", number=1, boot_id="b", token_hash=f"{i:064x}")
                for i in chunk
            ]
        )
        await asyncio.gather(
            *(store.update_task(f"{i:032x}", completed, "task.state_changed", 2 * DAY_MS) for i in chunk)
        )
        if start % 5000 == 0:
            print(f"  filled {start + len(chunk):,}/{TASKS:,} finished tasks", flush=True)
    unfinished = range(TASKS, TASKS + UNFINISHED)
    await asyncio.gather(*(store.create_task(task(i, State.QUEUED, 3 * DAY_MS + i)) for i in unfinished))
    print(f"  filled in {time.perf_counter() - began:.1f} s", flush=True)


async def creates(store: SchedulerStore, first: int, stop: asyncio.Event) -> list[float]:
    """Create latencies (ms), one create after another until ``stop``."""
    times = []
    i = first
    while not stop.is_set():
        t0 = time.perf_counter()
        await store.create_task(task(i, State.QUEUED, NOW_MS))
        times.append((time.perf_counter() - t0) * 1000)
        i += 1
    return times


def p(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        db = Database(f"sqlite:///{Path(tmp) / 'scheduler.db'}", MIGRATIONS)
        db.migrate()
        store = SchedulerStore(db)
        store.may_have_asked = lambda t: False  # no question-close rows: every finished task is prunable
        await fill(store)
        size_before = (Path(tmp) / "scheduler.db").stat().st_size

        stop = asyncio.Event()
        idle_loop = asyncio.create_task(creates(store, 10_000_000, stop))
        await asyncio.sleep(2.0)
        stop.set()
        idle = await idle_loop

        rt = SimpleNamespace(
            store=store, closing=False, tasks_cfg=SimpleNamespace(finished_task_retention_ms=RETENTION_MS)
        )
        retention = HistoryRetention(rt, batch=PRUNE_BATCH)  # type: ignore[arg-type]
        batches: list[float] = []
        prune = store.prune_finished

        async def timed(cutoff: int, limit: int):  # type: ignore[no-untyped-def]
            t0 = time.perf_counter()
            try:
                return await prune(cutoff, limit)
            finally:
                batches.append((time.perf_counter() - t0) * 1000)

        store.prune_finished = timed  # type: ignore[method-assign]
        stop = asyncio.Event()
        busy_loop = asyncio.create_task(creates(store, 20_000_000, stop))
        t0 = time.perf_counter()
        pruned = await retention.prune_once(NOW_MS)
        seconds = time.perf_counter() - t0
        stop.set()
        during = await busy_loop
        db.close()

    assert pruned.tasks == TASKS, pruned
    print(
        f"finished-task retention, SQLite, {TASKS:,} finished tasks (each an attempt and 2 events) among "
        f"{UNFINISHED} unfinished, batches of {PRUNE_BATCH}:"
    )
    print(
        f"  pass: {pruned.tasks:,} tasks, {pruned.events:,} events, {pruned.attempts:,} attempts in {seconds:.2f} s "
        f"({pruned.tasks / seconds:,.0f} tasks/s); {pruned.batches} batches, p50 {statistics.median(batches):.1f} ms, "
        f"longest {max(batches):.1f} ms; database file {size_before / 2**20:.1f} MiB before "
        "(SQLite keeps the freed pages for reuse)"
    )
    print(
        f"  a create meanwhile: p50 {p(during, 0.5):.2f} ms, p99 {p(during, 0.99):.2f} ms ({len(during)} creates); "
        f"idle just before: p50 {p(idle, 0.5):.2f} ms, p99 {p(idle, 0.99):.2f} ms ({len(idle)} creates)"
    )
    print(f"  (reproduce: .venv/bin/python bench/bench_history_retention.py {TASKS})")


if __name__ == "__main__":
    asyncio.run(main())
