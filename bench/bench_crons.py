"""Cron ticks: what claiming a tick costs, won and lost, against creating a task (the floor).

Run: .venv/bin/python bench/bench_crons.py [--postgres URL]
The scheduler's engine alone (no workers launched), SQLite by default. Two engines share one
database and an injected clock; each of N ticks is fired by engine A (it wins: the claim insert,
the task and its event in one transaction) and then by engine B (it loses: the insert finds the
tick taken and creates nothing). Then the pass that closes runs, with N runs open.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from libs.db import Database  # noqa: E402
from libs.settings import CronJob, Settings, WorkerProfile  # noqa: E402
from services.scheduler.cron_store import MIGRATIONS  # noqa: E402
from services.scheduler.domain import NewTask  # noqa: E402
from services.scheduler.engine import Engine  # noqa: E402
from services.scheduler.store import SchedulerStore  # noqa: E402

N = 300


class Clock:
    def __init__(self) -> None:
        self.now = 1_767_225_600_000

    def now_ms(self) -> int:
        return self.now


def p50_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


async def main(url: str | None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        url = url or f"sqlite:///{Path(tmp) / 'scheduler.db'}"
        settings = Settings(
            data_dir=Path(tmp),
            workers={"default-worker": WorkerProfile(command=["true"])},
            crons={
                "tick": CronJob(
                    schedule="* * * * *", agent="agent-1", session="cron-bench", title="tick", timeout_ms=10**12
                )
            },
        )
        dbs = [Database(url, MIGRATIONS), Database(url, MIGRATIONS)]
        dbs[0].migrate()
        clock = Clock()
        a, b = (Engine(settings, SchedulerStore(db), clock=clock) for db in dbs)
        won: list[float] = []
        lost: list[float] = []
        created: list[float] = []
        for _ in range(N):
            clock.now += 60_000
            t0 = time.perf_counter()
            assert len(await a.crons.fire_due()) == 1
            t1 = time.perf_counter()
            assert await b.crons.fire_due() == []
            t2 = time.perf_counter()
            await a.create_task(NewTask("agent-1", "cron-bench", "floor", "", "", None, None, None))
            created.append(time.perf_counter() - t2)
            won.append(t1 - t0)
            lost.append(t2 - t1)
        t0 = time.perf_counter()
        await a.crons.settle_once()  # N runs open, none ended: one read of runs, one of tasks
        settle = time.perf_counter() - t0
        print(f"database: {url.split(':', 1)[0]}, {N} ticks")
        print(f"{'tick fired (won: claim + task + event)':48} p50 {p50_ms(won):7.3f} ms")
        print(f"{'tick already taken (lost: claim only)':48} p50 {p50_ms(lost):7.3f} ms")
        print(f"{'create_task (the floor)':48} p50 {p50_ms(created):7.3f} ms")
        print(f"{'settle pass with ' + str(N) + ' open runs':48}     {settle * 1000:7.3f} ms")
        for db in dbs:
            db.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--postgres", help="a PostgreSQL database URL (an empty database)")
    asyncio.run(main(parser.parse_args().postgres))
