"""The notifier's own CPU per scheduler event-log event (issue 11 item 1).

The follower (services/notifier/scheduler_link.py) applies the scheduler's task
events — per `/bin/true` task: queued, running, completed; the last makes a
notification, its history message and activity frame — to the real store (SQLite,
WAL) in-process, with no operator channel (as in the five-process benchmark). CPU is
the whole process's (every thread: the event loop and the database thread), per event
and per task (3 events), for:

- one event per transaction (``EventLogFollower.handle``: the follower's path before
  batching, and what a batch of one costs now);
- batches of 5 and 32 (``handle_batch``; ~5 is what a stack at ~80 tasks/s gives with
  the follower's 5 ms linger);
- the whole backlog through ``follow`` (reader task + batches of up to 256, no linger),
  as after a restart.

Run: .venv/bin/python bench/bench_notifier_follow.py   (or `make bench`)
     TASKGATE_REPO=/path/to/checkout ... --one-only  measures another checkout's
     one-event path (it has ``handle`` too) for a before/after.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

sys.path.insert(0, os.environ.get("TASKGATE_REPO") or str(Path(__file__).resolve().parent.parent))

from libs.db import Database  # noqa: E402
from libs.log import configure_logging  # noqa: E402
from services.notifier.activity import ActivityHub  # noqa: E402
from services.notifier.scheduler_link import EventLogFollower  # noqa: E402
from services.notifier.servicer import NotifierServicer  # noqa: E402
from services.notifier.store import MIGRATIONS, NotifierStore  # noqa: E402
from taskgate.scheduler.v1 import scheduler_pb2 as spb  # noqa: E402

TASKS = 600
STATES = (spb.TASK_STATE_QUEUED, spb.TASK_STATE_RUNNING, spb.TASK_STATE_COMPLETED)


def task_events(tasks: int) -> list[spb.WatchTasksResponse]:
    """What the scheduler's log holds for ``tasks`` `/bin/true` tasks, in its order."""
    events: list[spb.WatchTasksResponse] = []
    for i in range(tasks):
        for state in STATES:
            task = spb.Task(
                task_id=f"{i:032x}",
                agent_id="agent-1",
                session_id="bench",
                title="b",
                state=state,
                target_profile="true",
            )
            if state == spb.TASK_STATE_COMPLETED:
                task.result.text = ""
            events.append(
                spb.WatchTasksResponse(sequence=len(events) + 1, type=spb.TASK_EVENT_TYPE_STATE_CHANGED, task=task)
            )
    return events


async def measure(
    label: str, tasks: int, drive: Callable[[EventLogFollower, list[spb.WatchTasksResponse]], Coroutine[Any, Any, None]]
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        db = Database(f"sqlite:///{Path(tmp) / 'notifier.db'}", MIGRATIONS)
        db.migrate()
        store = NotifierStore(db, retention_frames=1000)
        follower = EventLogFollower(None, NotifierServicer(store, ActivityHub()), store)  # type: ignore[arg-type]
        warm = task_events(20)
        await drive(follower, warm)  # statement caches, the executor thread
        events = task_events(tasks + 20)[len(warm) :]
        cpu0, wall0 = time.process_time(), time.perf_counter()
        await drive(follower, events)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        assert await store.cursor("scheduler.task_events") == events[-1].sequence
        page, notes = await store.list_notifications("agent-1", "bench", None, 0, 1)
        assert page.total == tasks + 20, page.total  # one per completed task, the warm-up's included
        db.close()
    n = len(events)
    print(
        f"  {label:34s} {1000 * cpu / n:6.3f} ms CPU/event  {3000 * cpu / n:6.3f} ms CPU/task"
        f"  {n / wall:8.0f} events/s  ({n} events)"
    )


def one_by_one() -> Callable[[EventLogFollower, list[spb.WatchTasksResponse]], Coroutine[Any, Any, None]]:
    async def drive(follower: EventLogFollower, events: list[spb.WatchTasksResponse]) -> None:
        for e in events:
            await follower.handle(e)

    return drive


def batches_of(size: int) -> Callable[[EventLogFollower, list[spb.WatchTasksResponse]], Coroutine[Any, Any, None]]:
    async def drive(follower: EventLogFollower, events: list[spb.WatchTasksResponse]) -> None:
        for i in range(0, len(events), size):
            await follower.handle_batch(events[i : i + size])

    return drive


async def backlog(follower: EventLogFollower, events: list[spb.WatchTasksResponse]) -> None:
    async def stream() -> AsyncIterator[spb.WatchTasksResponse]:
        for e in events:
            yield e

    follower.linger_s = 0.0
    await follower.follow(stream())


def quiet_json_logs() -> None:
    """The service's JSON log lines (their cost counts), written to /dev/null instead of stderr."""
    real, sys.stderr = sys.stderr, open(os.devnull, "w")  # noqa: SIM115 - the loggers keep it
    try:
        configure_logging("notifier", fmt="json")
    finally:
        sys.stderr = real


async def main() -> None:
    quiet_json_logs()
    print(f"notifier event-log follower, SQLite, {TASKS} tasks x {len(STATES)} events (queued, running, completed)")
    await measure("one event per transaction", TASKS, one_by_one())
    if "--one-only" in sys.argv:
        return
    await measure("batches of 5", TASKS, batches_of(5))
    await measure("batches of 32", TASKS, batches_of(32))
    await measure("backlog through follow() (<=256)", TASKS * 3, backlog)


if __name__ == "__main__":
    asyncio.run(main())
