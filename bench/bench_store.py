"""The scheduler's persistence and publishing path alone: CPU per task lifecycle.

Run: .venv/bin/python bench/bench_store.py [N] [--profile FILE]
N tasks (default 1000) go through the store calls a `/bin/true` task makes, in a
temporary SQLite database, 64 at a time (the stack's max_running in the throughput
benchmark): create, claim, begin_launch (`launching` attempt), save_attempt (identity),
update_task -> running (with the attempt), update_task -> completed (with the ended
attempt), each change published through ``Runtime.published``-equivalent calls (hub +
metrics); a log follower reads the event log as the notifier's does. No processes, no
gRPC: what is left is the database thread, the group commit, (de)serialisation,
publishing and one log line per start and per end.

Prints CPU ms per task (the whole process: loop + database thread), database hops
(executor round trips) per task and group-commit transactions per task; then the cost
of one JSON log line and of one line below the level.
"""

from __future__ import annotations

import asyncio
import io
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from libs import log as tglog  # noqa: E402
from libs.db import Database  # noqa: E402
from services.scheduler import domain  # noqa: E402
from services.scheduler.domain import Attempt, State, Task  # noqa: E402
from services.scheduler.events import EventHub  # noqa: E402
from services.scheduler.metrics import LifecycleMetrics  # noqa: E402
from services.scheduler.store import MIGRATIONS, SchedulerStore, StoredEvent  # noqa: E402

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
IN_FLIGHT = int(os.environ.get("BENCH_IN_FLIGHT", "64"))


def new_task(i: int, now: int) -> Task:
    return Task(
        task_id=uuid.uuid4().hex,
        agent_id="agent-1",
        session_id="cli-bench",
        title=f"t{i}",
        instructions="run /bin/true",
        profile="true",
        state=State.QUEUED,
        created_at=now,
        updated_at=now,
        workspace_path="/tmp/ws/agent-1",
        request_id=uuid.uuid4().hex,
    )


class Publisher:
    """What ``Runtime.published`` does with a committed change (hub + metrics), in-process."""

    def __init__(self) -> None:
        self.hub = EventHub()
        self.metrics = LifecycleMetrics()

    def published(self, stored: StoredEvent | None, task: Task) -> None:
        if stored is not None:
            self.hub.publish(stored.type, stored.at, task)
            self.metrics.published(stored.type, stored.at, stored.previous, task, int(time.time() * 1000))


async def lifecycle(store: SchedulerStore, pub: Publisher, log: object, i: int) -> None:
    now = int(time.time() * 1000)
    task, stored = await store.create_task(new_task(i, now))
    pub.published(stored, task)
    claimed = await store.claim_queued(1, skip=(), any_owner=True)
    assert task.task_id in claimed or claimed
    token_hash = uuid.uuid4().hex

    def plan(t: Task, previous: list[Attempt]) -> Attempt:
        return Attempt(
            attempt_id=uuid.uuid4().hex,
            task_id=t.task_id,
            number=len(previous) + 1,
            boot_id="boot",
            token_hash=token_hash,
            state="launching",
            host_id="local",
        )

    begun = await store.begin_launch(task.task_id, plan)
    if begun is None:  # another lifecycle's claim took this one: it is launched there
        return
    _, _, attempt = begun
    assert attempt is not None
    attempt.pid, attempt.pgid, attempt.pid_start_time = 1000 + i, 1000 + i, 5000 + i
    await store.save_attempt(attempt)
    attempt.started_at = started = int(time.time() * 1000)
    attempt.state = "running"
    task, stored = await store.update_task(
        task.task_id,
        lambda t: domain.start_running(t, started, now, None, None),
        "task.state_changed",
        now,
        attempt=attempt,
    )
    pub.published(stored, task)
    log.info("worker_started", task_id=task.task_id, attempt=attempt.number, pid=attempt.pid)  # type: ignore[attr-defined]
    ended = int(time.time() * 1000)
    attempt.state, attempt.ended_at, attempt.exit_code, attempt.outcome = "ended", ended, 0, "exited"
    task, stored = await store.update_task(
        task.task_id,
        lambda t: t if domain.finish(t, State.COMPLETED, ended, result=domain.Result(text="")) else None,
        "task.state_changed",
        ended,
        attempt=attempt,
    )
    pub.published(stored, task)
    log.info("task_finished", task_id=task.task_id, state=task.state.value, exit_code=0)  # type: ignore[attr-defined]


async def follower(store: SchedulerStore, pub: Publisher, want: int, done: asyncio.Event) -> int:
    """The notifier's log follower: reads the event log after each wake, 5 ms coalescing."""
    cursor, seen, reads = 0, 0, 0
    with pub.hub.subscribe(lambda _t: True) as sub:
        while seen < want:
            ids, events = await store.events_after(cursor, {"task.state_changed"}, 500)
            reads += 1
            seen += len(events)
            if ids:
                cursor = max(ids)
            if seen >= want:
                break
            try:
                await asyncio.wait_for(sub.queue.get(), timeout=1.0)
            except TimeoutError:
                if done.is_set():
                    break
            await asyncio.sleep(0.005)
            while not sub.queue.empty():
                sub.queue.get_nowait()
    return reads


async def one_round(tmp: Path, n: int) -> dict[str, float]:
    db = Database(f"sqlite:///{tmp / f'{uuid.uuid4().hex}.db'}", MIGRATIONS)
    db.migrate()
    store = SchedulerStore(db)
    pub = Publisher()
    log = tglog.get_logger("bench")
    hops = 0
    run = db.run_connection

    async def counted(fn):  # type: ignore[no-untyped-def]
        nonlocal hops
        hops += 1
        return await run(fn)

    db.run_connection = counted  # type: ignore[method-assign]
    sem = asyncio.Semaphore(IN_FLIGHT)

    async def one(i: int) -> None:
        async with sem:
            await lifecycle(store, pub, log, i)

    done = asyncio.Event()
    cpu0, t0, tx0 = time.process_time(), time.perf_counter(), store.group.transactions
    follow = asyncio.create_task(follower(store, pub, 3 * n, done))
    await asyncio.gather(*(one(i) for i in range(n)))
    done.set()
    reads = await follow
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
    figures = {
        "cpu_ms_per_task": 1000 * cpu / n,
        "tasks_per_s": n / wall,
        "hops_per_task": hops / n,
        "transactions_per_task": (store.group.transactions - tx0) / n,
        "follower_reads_per_task": reads / n,
    }
    db.close()
    return figures


def log_line_cost(lines: int = 20_000) -> tuple[float, float]:
    """µs per rendered JSON info line, and per debug line below the (info) level."""
    saved = sys.stderr
    sink = io.StringIO() if os.environ.get("BENCH_LOG_TO_MEMORY") else open(os.devnull, "w")  # noqa: SIM115
    sys.stderr = sink  # type: ignore[assignment]
    try:
        tglog.configure_logging("bench", "info", "json")
        log = tglog.get_logger("bench")
        t0 = time.process_time()
        for i in range(lines):
            log.info("worker_started", task_id="0123456789abcdef0123456789abcdef", attempt=1, pid=i)
        rendered = (time.process_time() - t0) / lines * 1e6
        t0 = time.process_time()
        for i in range(lines):
            log.debug("tick", task_id="0123456789abcdef0123456789abcdef", n=i)
        below = (time.process_time() - t0) / lines * 1e6
    finally:
        sys.stderr = saved
        sink.close()
    return rendered, below


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    n = int(args[0]) if args else 1000
    profile = sys.argv[sys.argv.index("--profile") + 1] if "--profile" in sys.argv else None
    rendered, below = log_line_cost()
    # The lifecycle's own log lines go to /dev/null, rendered as in production (JSON).
    sys.stderr = open(os.devnull, "w")  # noqa: SIM115
    tglog.configure_logging("bench", "info", "json")
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        if profile:
            import cProfile

            cProfile.run("asyncio.run(one_round(Path(tmp), n))", profile)
        for _ in range(ROUNDS):
            rounds.append(asyncio.run(one_round(Path(tmp), n)))
    sys.stderr = sys.__stderr__
    print(f"store lifecycle, SQLite, N={n}, {IN_FLIGHT} in flight, median of {ROUNDS} (load {os.getloadavg()[0]:.1f})")
    for key in rounds[0]:
        values = [r[key] for r in rounds]
        print(
            f"  {key:26s} {statistics.median(values):8.3f}   min {min(values):8.3f}"
            f"   ({', '.join(f'{v:.3f}' for v in values)})"
        )
    print(f"  log line (JSON, rendered)  {rendered:8.2f} µs")
    print(f"  log line below the level   {below:8.2f} µs")


if __name__ == "__main__":
    main()
