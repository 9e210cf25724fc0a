"""The scheduler's persistence and publishing path alone: CPU per task lifecycle.

Run: .venv/bin/python bench/bench_store.py [N] [--profile FILE] [--savepoints] [--postgres]
N tasks (default 1000) go through the store calls a `/bin/true` task makes, in a
temporary SQLite database (``--postgres``: a database in a throwaway PostgreSQL 15
cluster), shaped as in the throughput benchmark: creates 16 in flight, and one dispatch
loop claiming up to the free room of 64 (``Dispatcher``) and taking each claimed task
through begin_launch (`launching` attempt), update_task -> running (with the attempt's
identity, one commit as the launch makes it), update_task -> completed (with the ended
attempt); each change published through ``Runtime.published``-equivalent calls (hub +
metrics); a log follower reads the event log as the notifier's does. No processes, no
gRPC: what is left is the database thread, the group commit, (de)serialisation,
publishing and one log line per start and per end.

``--savepoints``: each unit of a batch in its own savepoint from the start, as before the group
commit ran batches optimistically on SQLite too (to compare).

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

from prometheus_client import REGISTRY  # noqa: E402

from bench.stats import store_counters  # noqa: E402
from libs import log as tglog  # noqa: E402
from libs.db import Database  # noqa: E402
from services.scheduler import domain  # noqa: E402
from services.scheduler.domain import Attempt, State, Task  # noqa: E402
from services.scheduler.events import EventHub  # noqa: E402
from services.scheduler.metrics import LifecycleMetrics  # noqa: E402
from services.scheduler.store import MIGRATIONS, SchedulerStore, StoredEvent  # noqa: E402
from tests.support.postgres import fresh_database, start_postgres  # noqa: E402

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
IN_FLIGHT = int(os.environ.get("BENCH_IN_FLIGHT", "16"))  # creates, as the throughput benchmark's client
MAX_RUNNING = 64  # the throughput benchmark's


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
        may_have_asked=False,  # as the catalog creates it: a task that never asks has nothing to close
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


class Dispatcher:
    """What the scheduler's dispatch loop does with the store: one claim at a time of up to the
    free room (``MAX_RUNNING`` less the tasks being launched or running; a quarter of it at least
    while launches are under way), passing over the tasks whose launch is under way, and each
    claimed task's lifecycle started on its own."""

    def __init__(self, store: SchedulerStore, pub: Publisher, log: object) -> None:
        self.store, self.pub, self.log = store, pub, log
        self.launching: set[str] = set()  # claimed, still queued
        self.busy: set[str] = set()  # claimed, not yet completed
        self.completed = 0
        self.wake = asyncio.Event()

    async def run(self, n: int) -> None:
        lifecycles: set[asyncio.Task[None]] = set()
        while self.completed < n:
            await self.wake.wait()
            self.wake.clear()
            room = MAX_RUNNING - len(self.busy)
            if room < (max(1, MAX_RUNNING // 4) if self.launching else 1):
                continue
            claimed = await self.store.claim_queued(room, skip=list(self.launching), any_owner=True)
            for task_id in claimed:
                self.launching.add(task_id)
                self.busy.add(task_id)
                lifecycle = asyncio.create_task(self.lifecycle(task_id))
                lifecycles.add(lifecycle)
                lifecycle.add_done_callback(lifecycles.discard)
            if len(claimed) == room:
                self.wake.set()  # there may be more
        await asyncio.gather(*lifecycles)

    async def lifecycle(self, task_id: str) -> None:
        """A claimed task through launch, running and completed."""
        store, pub, log = self.store, self.pub, self.log
        now = int(time.time() * 1000)
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

        begun = await store.begin_launch(task_id, plan)
        assert begun is not None, "a claimed task is this host's and still queued"
        task, _, attempt = begun
        assert attempt is not None
        attempt.pid, attempt.pgid, attempt.pid_start_time = 1000, 1000, 5000
        attempt.started_at = started = int(time.time() * 1000)
        attempt.state = "running"
        task, stored = await store.update_task(
            task.task_id,
            lambda t: domain.start_running(t, started, now, None, None),
            "task.state_changed",
            now,
            attempt=attempt,
        )
        self.launching.discard(task_id)  # running: no longer queued
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
        assert task.state == State.COMPLETED
        log.info("task_finished", task_id=task.task_id, state=task.state.value, exit_code=0)  # type: ignore[attr-defined]
        self.busy.discard(task_id)
        self.completed += 1
        self.wake.set()  # a slot is free


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


async def one_round(tmp: Path, n: int, pg_url: str | None = None) -> dict[str, float]:
    """``pg_url``: a PostgreSQL cluster to make this round's database in (else SQLite in ``tmp``)."""
    url = fresh_database(pg_url, "bench_store") if pg_url else f"sqlite:///{tmp / f'{uuid.uuid4().hex}.db'}"
    db = Database(url, MIGRATIONS)
    db.migrate()
    store = SchedulerStore(db)
    if "--savepoints" in sys.argv:  # every unit of a batch in its own savepoint from the start
        store.group.optimistic = False
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
    dispatcher = Dispatcher(store, pub, log)

    async def create(i: int) -> None:
        async with sem:
            task, stored = await store.create_task(new_task(i, int(time.time() * 1000)))
        pub.published(stored, task)
        dispatcher.wake.set()

    done = asyncio.Event()
    units0, _ = store_counters(REGISTRY.collect())
    cpu0, t0, tx0 = time.process_time(), time.perf_counter(), store.group.transactions
    follow = asyncio.create_task(follower(store, pub, 3 * n, done))
    await asyncio.gather(dispatcher.run(n), *(create(i) for i in range(n)))
    done.set()
    reads = await follow
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
    assert dispatcher.completed == n, f"{dispatcher.completed} of {n} tasks completed"
    figures = {
        "cpu_ms_per_task": 1000 * cpu / n,
        "tasks_per_s": n / wall,
        "hops_per_task": hops / n,
        "transactions_per_task": (store.group.transactions - tx0) / n,
        "follower_reads_per_task": reads / n,
    }
    # Each store call's units: µs of the database thread's CPU per unit (group_commit's counters).
    for unit, (count, seconds) in sorted(store_counters(REGISTRY.collect())[0].items()):
        count -= units0.get(unit, (0.0, 0.0))[0]
        seconds -= units0.get(unit, (0.0, 0.0))[1]
        if count:
            figures[f"us_per_{unit}"] = 1e6 * seconds / count
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
        pg_url, stop = start_postgres(tmp) if "--postgres" in sys.argv else (None, None)
        try:
            if profile:
                import cProfile

                # The loop's side only: cProfile sees the thread it runs in.
                cProfile.runctx(
                    "asyncio.run(one_round(Path(tmp), n, pg_url))",
                    globals(),
                    {"tmp": tmp, "n": n, "pg_url": pg_url},
                    profile,
                )
            for _ in range(ROUNDS):
                rounds.append(asyncio.run(one_round(Path(tmp), n, pg_url)))
        finally:
            if stop is not None:
                stop()
    sys.stderr = sys.__stderr__
    print(
        f"store lifecycle, {'PostgreSQL' if pg_url else 'SQLite'}, N={n}, {IN_FLIGHT} creates in flight, "
        f"{MAX_RUNNING} running, "
        f"median of {ROUNDS} (load {os.getloadavg()[0]:.1f})"
    )
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
