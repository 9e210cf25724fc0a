"""History retention: how fast a pass deletes, and what it costs the service's own commits meanwhile.

Run: .venv/bin/python bench/bench_history_retention.py [TASKS]   (default 20000)
The scheduler's store alone on SQLite (a file in a temporary folder): TASKS finished tasks, each
with an attempt and two events (created running, then completed), all past the retention, and a
few hundred unfinished ones. Then one pass of ``HistoryRetention`` (batches of 500, each its own
transaction) while another coroutine creates tasks one after another, as the dispatcher's commits
would go on: the pass's rate, its longest batch (the longest a lifecycle commit can wait behind
it) and the create latency p50/p99 during the pass against the same loop idle just before.
Then the notifier's store alone, the same way: TASKS / 4 delivered notifications past the
retention, one ``NotificationRetention`` pass, and a notification enqueued one after another
meanwhile.
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

from libs.clock import SystemClock  # noqa: E402
from libs.db import Database  # noqa: E402
from services.notifier.domain import Kind, Notification  # noqa: E402
from services.notifier.retention import NotificationRetention  # noqa: E402
from services.notifier.store import MIGRATIONS as NOTIFIER_MIGRATIONS  # noqa: E402
from services.notifier.store import NotifierStore  # noqa: E402
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


def notification(i: int, at: int) -> Notification:
    return Notification(
        notification_id=f"{i:032x}",
        agent_id="agent-1",
        session_id=f"s{i % 50}",
        kind=Kind.TASK_COMPLETED,
        task_id=f"{i:032x}",
        text="Task finished: a finished task of the benchmark. " * 3,
        created_at=at,
        key=f"{i:032x}:completed",
    )


async def enqueues(store: NotifierStore, first: int, stop: asyncio.Event) -> list[float]:
    times = []
    i = first
    while not stop.is_set():
        t0 = time.perf_counter()
        await store.enqueue(notification(i, NOW_MS), f"{i:032x}")
        times.append((time.perf_counter() - t0) * 1000)
        i += 1
    return times


async def notifier_pass(tmp: Path) -> None:
    count = TASKS // 4  # an enqueue costs ~10x a task create here: the fill would dominate the run
    db = Database(f"sqlite:///{tmp / 'notifier.db'}", NOTIFIER_MIGRATIONS)
    db.migrate()
    store = NotifierStore(db)
    began = time.perf_counter()
    for start in range(0, count, 200):
        chunk = range(start, min(count, start + 200))
        await asyncio.gather(*(store.enqueue(notification(i, DAY_MS + i), f"{i:032x}") for i in chunk))
    print(f"  filled {count:,} delivered notifications in {time.perf_counter() - began:.1f} s", flush=True)
    stop = asyncio.Event()
    idle_loop = asyncio.create_task(enqueues(store, 10_000_000, stop))
    await asyncio.sleep(2.0)
    stop.set()
    idle = await idle_loop
    retention = NotificationRetention(store, RETENTION_MS, SystemClock())
    batches: list[float] = []
    prune = store.prune_notifications

    async def timed(cutoff: int, limit: int):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        try:
            return await prune(cutoff, limit)
        finally:
            batches.append((time.perf_counter() - t0) * 1000)

    store.prune_notifications = timed  # type: ignore[method-assign]
    stop = asyncio.Event()
    busy_loop = asyncio.create_task(enqueues(store, 20_000_000, stop))
    t0 = time.perf_counter()
    pruned = await retention.prune_once(NOW_MS)
    seconds = time.perf_counter() - t0
    stop.set()
    during = await busy_loop
    db.close()
    assert pruned.notifications == count, pruned
    print(f"notification retention, SQLite, {count:,} delivered notifications (each a conversation message, kept):")
    print(
        f"  pass: {pruned.notifications:,} notifications in {seconds:.2f} s ({pruned.notifications / seconds:,.0f}/s); "
        f"{pruned.batches} batches, p50 {statistics.median(batches):.1f} ms, longest {max(batches):.1f} ms"
    )
    print(
        f"  an enqueue meanwhile: p50 {p(during, 0.5):.2f} ms, p99 {p(during, 0.99):.2f} ms ({len(during)}); "
        f"idle just before: p50 {p(idle, 0.5):.2f} ms, p99 {p(idle, 0.99):.2f} ms ({len(idle)})"
    )


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
        report_tasks(pruned, seconds, batches, size_before, during, idle)
        await notifier_pass(Path(tmp))
    print(f"  (reproduce: .venv/bin/python bench/bench_history_retention.py {TASKS})")


def report_tasks(  # type: ignore[no-untyped-def]
    pruned, seconds: float, batches: list[float], size_before: int, during: list[float], idle: list[float]
) -> None:
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


if __name__ == "__main__":
    asyncio.run(main())
