"""The scheduler's event-log stream to the notifier: CPU per event, one response per
event vs batches (WatchTasks ``batch``), and the task conversion alone (issue 11 item 1).

A real scheduler servicer (SQLite event log) on an in-process grpc.aio server; a client
in the same process reads the whole log over loopback, so the CPU figures are server +
client together (the process's, every thread). The log holds, per task, the events a
cancelled queued task makes (queued, cancelled) — real task snapshots from the store.
Reads are the follower's own (up to 500 events each, as after a notifier restart); on a
live stack a busy read holds ~20 events (see services/scheduler/log_follower.py).

Run: .venv/bin/python bench/bench_event_stream.py   (or `make bench`)
(The README's "before" figures came from a checkout before batches; this version needs
``tests/support/scheduler_rpc.py`` and the batched log reads, so it measures this checkout only.)
"""

from __future__ import annotations

import asyncio
import functools
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


from libs.log import configure_logging  # noqa: E402
from services.scheduler import convert  # noqa: E402
from services.scheduler.domain import NewTask  # noqa: E402
from taskgate.scheduler.v1 import scheduler_pb2 as pb  # noqa: E402
from taskgate.scheduler.v1 import scheduler_pb2_grpc as pb_grpc  # noqa: E402
from tests.support.scheduler_rpc import served_scheduler  # noqa: E402

TASKS = 1000
LIVE_READ = 22
ROUNDS = 3


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
        async with served_scheduler(Path(tmp), profile="true") as (engine, stub):
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
            print(
                f"scheduler event-log stream, SQLite, {total} events ({TASKS} tasks: queued, cancelled),"
                f" best of {ROUNDS}"
            )
            await stream_all(stub, total, False)  # warm-up: statement caches, the executor thread
            follow_batches = engine.follow_log_batches  # both modes read through it
            for read in (500, LIVE_READ):
                # Reads of LIVE_READ events: what a busy live stack's reads hold (the follower's
                # own read size is 500, what a catch-up gets).
                engine.follow_log_batches = functools.partial(follow_batches, batch=read)  # type: ignore[method-assign]
                for batch in (False, True):
                    best = min([await stream_all(stub, total, batch) for _ in range(ROUNDS)])
                    cpu, wall, replies = best
                    label = ("batched" if batch else "one response per event") + f", reads of {read}"
                    print(
                        f"  {label:36s} {1e6 * cpu / total:7.1f} us CPU/event (server+client)"
                        f"  {total / wall:8.0f} events/s  {replies} responses"
                    )
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
