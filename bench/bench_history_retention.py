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
meanwhile; then one ``ConversationRetention`` pass over those notifications' history messages,
the same way. Then the pending-registry's store: TASKS / 4 ended tasks with two questions each
(one replaced, one answered), closed past the retention, one ``QuestionRetention`` pass, and a
task's question asked one after another meanwhile.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from libs.clock import SystemClock  # noqa: E402
from libs.db import Database, compact_sqlite  # noqa: E402
from services.notifier.domain import Kind, Notification  # noqa: E402
from services.notifier.retention import ConversationRetention, NotificationRetention  # noqa: E402
from services.notifier.store import MIGRATIONS as NOTIFIER_MIGRATIONS  # noqa: E402
from services.notifier.store import NotifierStore  # noqa: E402
from services.pending_registry.domain import AnswerAttempt, NewQuestion  # noqa: E402
from services.pending_registry.retention import QuestionRetention  # noqa: E402
from services.pending_registry.store import MIGRATIONS as PENDING_MIGRATIONS  # noqa: E402
from services.pending_registry.store import PendingStore  # noqa: E402
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
        may_have_asked=False,  # no question-close rows: every finished task is prunable
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
    """Enqueue latencies (ms), one notification after another until ``stop``."""
    times = []
    i = first
    while not stop.is_set():
        t0 = time.perf_counter()
        await store.enqueue(notification(i, NOW_MS), f"{i:032x}")
        times.append((time.perf_counter() - t0) * 1000)
        i += 1
    return times


@dataclass
class Measured:
    pruned: Any  # the pass's totals (HistoryPruned, NotificationsPrunedTotal)
    seconds: float
    batches: list[float]  # each batch's wall ms
    idle: list[float]  # the concurrent work's latencies (ms) just before the pass
    during: list[float]  # and during it


async def measured_pass(
    store: Any,
    prune_name: str,
    run_pass: Callable[[], Awaitable[Any]],
    work: Callable[[int, asyncio.Event], Awaitable[list[float]]],
) -> Measured:
    """``work`` alone for 2 s, then one pass with ``work`` beside it; each batch (the store's
    ``prune_name`` call) timed."""
    stop = asyncio.Event()
    idle_loop = asyncio.ensure_future(work(10_000_000, stop))
    await asyncio.sleep(2.0)
    stop.set()
    idle = await idle_loop
    batches: list[float] = []
    prune = getattr(store, prune_name)

    async def timed(*args: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return await prune(*args)
        finally:
            batches.append((time.perf_counter() - t0) * 1000)

    setattr(store, prune_name, timed)
    stop = asyncio.Event()
    busy_loop = asyncio.ensure_future(work(20_000_000, stop))
    t0 = time.perf_counter()
    pruned = await run_pass()
    seconds = time.perf_counter() - t0
    stop.set()
    return Measured(pruned, seconds, batches, idle, await busy_loop)


def p(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def latencies(what: str, m: Measured) -> str:
    return (
        f"  {what} meanwhile: p50 {p(m.during, 0.5):.2f} ms, p99 {p(m.during, 0.99):.2f} ms ({len(m.during)}); "
        f"idle just before: p50 {p(m.idle, 0.5):.2f} ms, p99 {p(m.idle, 0.99):.2f} ms ({len(m.idle)})"
    )


def batch_figures(m: Measured) -> str:
    return f"{m.pruned.batches} batches, p50 {statistics.median(m.batches):.1f} ms, longest {max(m.batches):.1f} ms"


async def scheduler_pass(tmp: Path) -> None:
    db = Database(f"sqlite:///{tmp / 'scheduler.db'}", MIGRATIONS)
    db.migrate()
    store = SchedulerStore(db)
    await fill(store)
    size_before = (tmp / "scheduler.db").stat().st_size
    rt = SimpleNamespace(store=store, closing=False, tasks_cfg=SimpleNamespace(finished_task_retention_ms=RETENTION_MS))
    retention = HistoryRetention(rt, batch=PRUNE_BATCH)  # type: ignore[arg-type]
    m = await measured_pass(
        store, "prune_finished", lambda: retention.prune_once(NOW_MS), lambda first, stop: creates(store, first, stop)
    )
    db.close()
    assert m.pruned.tasks == TASKS, m.pruned
    print(
        f"finished-task retention, SQLite, {TASKS:,} finished tasks (each an attempt and 2 events) among "
        f"{UNFINISHED} unfinished, batches of {PRUNE_BATCH}:"
    )
    print(
        f"  pass: {m.pruned.tasks:,} tasks, {m.pruned.events:,} events, {m.pruned.attempts:,} attempts in "
        f"{m.seconds:.2f} s ({m.pruned.tasks / m.seconds:,.0f} tasks/s); {batch_figures(m)}; database file "
        f"{size_before / 2**20:.1f} MiB before (SQLite keeps the freed pages for reuse)"
    )
    print(latencies("a create", m))
    # What `taskgate admin databases compact` gives back, the scheduler stopped.
    began = time.perf_counter()
    before, after = compact_sqlite(tmp / "scheduler.db")
    print(
        f"  compacted afterwards (VACUUM, the service stopped): {before / 2**20:.1f} -> {after / 2**20:.1f} MiB "
        f"in {time.perf_counter() - began:.2f} s"
    )


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
    retention = NotificationRetention(store, RETENTION_MS, SystemClock())
    m = await measured_pass(
        store,
        "prune_notifications",
        lambda: retention.prune_once(NOW_MS),
        lambda first, stop: enqueues(store, first, stop),
    )
    assert m.pruned.notifications == count, m.pruned
    print(f"notification retention, SQLite, {count:,} delivered notifications (each a conversation message, kept):")
    print(
        f"  pass: {m.pruned.notifications:,} notifications in {m.seconds:.2f} s "
        f"({m.pruned.notifications / m.seconds:,.0f}/s); {batch_figures(m)}"
    )
    print(latencies("an enqueue", m))
    # The same conversations' history: the notifications' messages, all past the retention (the
    # enqueues above and meanwhile are recent and stay).
    history = ConversationRetention(store, RETENTION_MS, SystemClock())
    m = await measured_pass(
        store,
        "prune_conversations",
        lambda: history.prune_once(NOW_MS),
        lambda first, stop: enqueues(store, 20_000_000 + first, stop),
    )
    db.close()
    assert m.pruned.messages == count, m.pruned
    print(f"conversation retention, SQLite, {count:,} history messages past the retention:")
    print(
        f"  pass: {m.pruned.messages:,} messages in {m.seconds:.2f} s ({m.pruned.messages / m.seconds:,.0f}/s); "
        f"{batch_figures(m)}"
    )
    print(latencies("an enqueue", m))


async def asks(store: PendingStore, first: int, stop: asyncio.Event) -> list[float]:
    """Question latencies (ms): a new task's question, one after another until ``stop``."""
    times = []
    i = first
    while not stop.is_set():
        t0 = time.perf_counter()
        await store.ask_question(NewQuestion(f"{i:032x}", "s1", "which branch should I use?"), NOW_MS)
        times.append((time.perf_counter() - t0) * 1000)
        i += 1
    return times


async def registry_pass(tmp: Path) -> None:
    count = TASKS // 4  # tasks that asked are a fraction of all
    db = Database(f"sqlite:///{tmp / 'pending.db'}", PENDING_MIGRATIONS)
    db.migrate()
    store = PendingStore(db)
    began = time.perf_counter()

    async def ended(i: int) -> None:
        task_id = f"{i:032x}"
        await store.ask_question(NewQuestion(task_id, f"s{i % 50}", "first, replaced?"), DAY_MS)
        second, _, _ = await store.ask_question(NewQuestion(task_id, f"s{i % 50}", "second, answered?"), DAY_MS)
        await store.answer_question(AnswerAttempt(task_id, second.question_id, "yes", "alice"), DAY_MS)
        await store.cancel_questions(task_id, DAY_MS + i)

    for start in range(0, count, 200):
        await asyncio.gather(*(ended(i) for i in range(start, min(count, start + 200))))
    print(f"  filled {count:,} ended tasks with 2 questions each in {time.perf_counter() - began:.1f} s", flush=True)
    retention = QuestionRetention(store, RETENTION_MS, SystemClock())
    m = await measured_pass(
        store, "prune_closed", lambda: retention.prune_once(NOW_MS), lambda first, stop: asks(store, first, stop)
    )
    db.close()
    assert m.pruned.tasks == count and m.pruned.questions == 2 * count, m.pruned
    print(f"question retention, SQLite, {count:,} ended tasks' {2 * count:,} questions past the retention:")
    print(
        f"  pass: {m.pruned.tasks:,} tasks' questions in {m.seconds:.2f} s ({m.pruned.tasks / m.seconds:,.0f} "
        f"tasks/s); {batch_figures(m)}"
    )
    print(latencies("a question asked", m))


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        await scheduler_pass(Path(tmp))
        await notifier_pass(Path(tmp))
        await registry_pass(Path(tmp))
    print(f"  (reproduce: .venv/bin/python bench/bench_history_retention.py {TASKS})")


if __name__ == "__main__":
    asyncio.run(main())
