"""The scheduler's event-log stream to the notifier: CPU per event, one response per
event vs batches (WatchTasks ``batch``), and the task conversion alone (issue 11 item 1).

A real scheduler servicer (SQLite event log) on an in-process grpc.aio server; a client
in the same process reads the whole log over loopback, so the CPU figures are server +
client together (the process's, every thread). The log holds, per task, the events a
cancelled queued task makes (queued, cancelled) — real task snapshots from the store.
Reads are the follower's own (up to 500 events each, as after a notifier restart); on a
live stack a busy read holds ~20 events (see services/scheduler/log_follower.py).

Run: .venv/bin/python bench/bench_event_stream.py   (or `make bench`)
     TASKGATE_REPO=/path/to/checkout ... measures another checkout (the unbatched mode and
     the conversion, when it has no batches) for a before/after.
"""

from __future__ import annotations

import asyncio
import functools
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.environ.get("TASKGATE_REPO") or str(Path(__file__).resolve().parent.parent))

import grpc  # noqa: E402

from libs.db import Database  # noqa: E402
from libs.grpc_server import NO_CALLER_AUTH, start_server  # noqa: E402
from libs.log import configure_logging  # noqa: E402
from libs.settings import Settings, WorkerProfile  # noqa: E402
from services.scheduler import convert  # noqa: E402
from services.scheduler import servicer as servicer_module  # noqa: E402
from services.scheduler.domain import NewTask  # noqa: E402
from services.scheduler.engine import Engine  # noqa: E402
from services.scheduler.servicer import SchedulerServicer  # noqa: E402
from services.scheduler.store import MIGRATIONS, SchedulerStore  # noqa: E402
from taskgate.scheduler.v1 import scheduler_pb2 as pb  # noqa: E402
from taskgate.scheduler.v1 import scheduler_pb2_grpc as pb_grpc  # noqa: E402

TASKS = 1000
LIVE_READ = 22
ROUNDS = 3
# A checkout before batches (TASKGATE_REPO) has no batch_replies: only the unbatched mode.
BATCHES = hasattr(servicer_module, "batch_replies")


def quiet_json_logs() -> None:
    """The service's JSON log lines (their cost counts), written to /dev/null instead of stderr."""
    real, sys.stderr = sys.stderr, open(os.devnull, "w")  # noqa: SIM115 - the loggers keep it
    try:
        configure_logging("scheduler", fmt="json")
    finally:
        sys.stderr = real


async def stream_all(stub: pb_grpc.SchedulerServiceStub, total: int, batch: bool) -> tuple[float, float, int]:
    """CPU s and wall s to read ``total`` events from the start of the log; responses read."""
    request = pb.WatchTasksRequest(all_sessions=True, since_sequence=0)
    if batch:
        request.batch = True
    cpu0, wall0 = time.process_time(), time.perf_counter()
    seen = replies = 0
    call = stub.WatchTasks(request, timeout=120)
    async for reply in call:
        replies += 1
        seen += len(reply.events) if batch else 1
        if seen >= total:
            break
    call.cancel()
    assert seen == total, seen
    return time.process_time() - cpu0, time.perf_counter() - wall0, replies


async def main() -> None:
    quiet_json_logs()
    with tempfile.TemporaryDirectory() as tmp:
        db = Database(f"sqlite:///{Path(tmp) / 's.db'}", MIGRATIONS)
        db.migrate()
        settings = Settings(data_dir=Path(tmp), workers={"true": WorkerProfile(command=["true"])})
        engine = Engine(settings, SchedulerStore(db))
        tasks = []
        for i in range(TASKS):
            task = await engine.create_task(
                NewTask(
                    agent_id="agent-1",
                    session_id=f"cli-{i % 10}",
                    title="b",
                    instructions="",
                    profile="true",
                    request_id=None,
                    harness=None,
                    harness_model=None,
                )
            )
            tasks.append(await engine.cancel(task.task_id))
        total = 2 * TASKS
        servicer = SchedulerServicer(engine)
        host = await start_server(
            "127.0.0.1:0",
            [lambda s: pb_grpc.add_SchedulerServiceServicer_to_server(servicer, s)],
            [],
            security=NO_CALLER_AUTH,
        )
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{host.port}")
        stub = pb_grpc.SchedulerServiceStub(channel)
        print(
            f"scheduler event-log stream, SQLite, {total} events ({TASKS} tasks: queued, cancelled), best of {ROUNDS}"
        )
        await stream_all(stub, total, False)  # warm-up: statement caches, the executor thread
        # Today both modes read through follow_log_batches; a checkout before batches has follow_log.
        follow_log, follow_batches = getattr(engine, "follow_log", None), getattr(engine, "follow_log_batches", None)
        for read in (500, LIVE_READ):
            # Reads of LIVE_READ events: what a busy live stack's reads hold (the follower's
            # own read size is 500, what a catch-up gets).
            if follow_log is not None:
                engine.follow_log = functools.partial(follow_log, batch=read)  # type: ignore[method-assign]
            if follow_batches is not None:
                engine.follow_log_batches = functools.partial(follow_batches, batch=read)  # type: ignore[method-assign]
            for batch in (False, True) if BATCHES else (False,):
                best = min([await stream_all(stub, total, batch) for _ in range(ROUNDS)])
                cpu, wall, replies = best
                label = ("batched" if batch else "one response per event") + f", reads of {read}"
                print(
                    f"  {label:36s} {1e6 * cpu / total:7.1f} us CPU/event (server+client)"
                    f"  {total / wall:8.0f} events/s  {replies} responses"
                )
        await channel.close()
        await host.server.stop(0)
        db.close()
    now = tasks[-1].updated_at
    n = 20_000
    for label, task in (("a cancelled queued task", tasks[-1]),):
        convert.task_to_pb(task, now)
        cpu0 = time.process_time()
        for _ in range(n):
            convert.task_to_pb(task, now)
        print(f"  task_to_pb, {label:23s} {1e6 * (time.process_time() - cpu0) / n:7.2f} us")


if __name__ == "__main__":
    asyncio.run(main())
