"""Issue 10 item 6: every committed change raises a task's version, and a watcher never sends
an older snapshot of a task after a newer one — under concurrent changes of the same tasks on
PostgreSQL, where the scheduler's store runs on four database threads."""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict
from pathlib import Path

import grpc

from libs.db import Database
from services.scheduler import domain
from services.scheduler.domain import Task
from services.scheduler.store import MIGRATIONS
from taskgate.scheduler.v1 import scheduler_pb2 as pb
from taskgate.scheduler.v1 import scheduler_pb2_grpc as pb_grpc
from tests.support.postgres import fresh_database
from tests.unit.scheduler.test_engine import start_harness

TASKS, WRITERS, CHANGES = 4, 8, 40


async def test_watchers_see_each_task_s_versions_only_rise_under_concurrent_changes_on_postgresql(
    tmp_path: Path, postgres_url: str
) -> None:
    db = Database(fresh_database(postgres_url, "watch_order"), MIGRATIONS)
    assert db.threads.workers == 4, "PostgreSQL gets four database threads"
    h = await start_harness(tmp_path, db=db)
    rt = h.engine.runtime
    channel = grpc.aio.insecure_channel(h.engine.settings.scheduler_addr)
    try:
        tasks = [await h.create("sleeper", title=f"t{i}") for i in range(TASKS)]
        stub = pb_grpc.SchedulerServiceStub(channel)
        streams = [
            stub.WatchTasks(pb.WatchTasksRequest(agent_id="agent-1", session_id="cli-1")),
            *(stub.WatchTasks(pb.WatchTasksRequest(task_id=t.task_id)) for t in tasks[:2]),
        ]
        seen: list[defaultdict[str, list[int]]] = [defaultdict(list) for _ in streams]
        snapshots_in = [asyncio.Event() for _ in streams]

        async def read(i: int) -> None:
            wanted = TASKS if i == 0 else 1
            async for event in streams[i]:
                seen[i][event.task.task_id].append(event.task.version)
                if len(seen[i]) == wanted:
                    snapshots_in[i].set()

        readers = [asyncio.create_task(read(i)) for i in range(len(streams))]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in snapshots_in)), 30)

        async def writer(seed: int) -> None:
            rng = random.Random(seed)
            for n in range(CHANGES):
                task_id = rng.choice(tasks).task_id
                now = rt.clock.now_ms()

                def change(t: Task, text: str = f"w{seed}-{n}", at: int = now) -> Task:
                    domain.apply_progress(t, text, at)
                    t.updated_at = at
                    return t

                task, stored = await rt.store.update_task(task_id, change, "task.progress", now)
                rt.published(stored, task)

        await asyncio.gather(*(writer(seed) for seed in range(WRITERS)))
        final = {t.task_id: (await rt.store.get_task(t.task_id)).version for t in tasks}
        assert sum(final.values()) - sum(t.version for t in tasks) == WRITERS * CHANGES, "each change: +1"

        async def caught_up() -> None:
            while not all(
                got[task_id][-1] == version
                for i, got in enumerate(seen)
                for task_id, version in final.items()
                if i == 0 or task_id == tasks[i - 1].task_id
            ):
                await asyncio.sleep(0.02)

        await asyncio.wait_for(caught_up(), 30)
        for got in seen:
            for task_id, versions in got.items():
                assert versions == sorted(set(versions)), f"{task_id}: an older snapshot after a newer one"
        for r in readers:
            r.cancel()
    finally:
        await channel.close()
        await h.close()
