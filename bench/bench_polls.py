"""The scheduler's store calls that run on every tick or wake-up, in-process (SQLite).

Run: .venv/bin/python bench/bench_polls.py
CPU of this process per call (the event loop's side and the database thread's), 2,000 calls
each after 200 to warm up, on an empty store: the dispatcher's claim (nothing to skip, and 16
tasks to skip), the question closer's poll, a one-id `find_tasks` (the supervisor's read, built
per call by SQLAlchemy), and an empty unit of work (the round trip's floor).
"""

from __future__ import annotations

import asyncio
import logging
import resource
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import structlog

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from libs.db import Database  # noqa: E402
from services.scheduler.store import MIGRATIONS, SchedulerStore  # noqa: E402

CALLS = 2000


def cpu_s() -> float:
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime


async def per_call_us(call: Callable[[], Awaitable[Any]]) -> float:
    for _ in range(200):
        await call()
    began = cpu_s()
    for _ in range(CALLS):
        await call()
    return 1e6 * (cpu_s() - began) / CALLS


async def main() -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))
    with tempfile.TemporaryDirectory() as tmp:
        db = Database(f"sqlite:///{tmp}/scheduler.db", MIGRATIONS)
        db.migrate()
        store = SchedulerStore(db)
        busy = [f"{i:032x}" for i in range(16)]
        calls: dict[str, Callable[[], Awaitable[Any]]] = {
            "claim_queued, nothing to skip": lambda: store.claim_queued(16, [], True),
            "claim_queued, 16 to skip": lambda: store.claim_queued(16, busy, True),
            "due_question_closes": lambda: store.due_question_closes(0),
            "find_tasks, one id": lambda: store.find_tasks([busy[0]]),
            "an empty unit": lambda: store.group.alone(lambda s: None),
        }
        print(f"CPU per call, {CALLS} calls each, SQLite, in-process:")
        for name, call in calls.items():
            print(f"  {name:32} {await per_call_us(call):7.1f} µs")
        db.close()


if __name__ == "__main__":
    asyncio.run(main())
