"""The HTTP edge's CPU per REST call, apart from the rest of the system: the real gateway
process in front of a canned scheduler (an in-process gRPC server that answers CreateTasks,
ListTasks and GetTask at once, or after a delay), driven by the lean client (bench/lean_http.py)
on 16 keep-alive connections. Also how many scheduler calls the creates and the GETs of one task
took (the gateway batches creates and shares concurrent reads of a task).

In the full system (bench_tasks.py --throughput) the scheduler and the notifier take most of
the two cores and their slowness changes the gateway's figure: a gateway that answers one
request per wake-up spends more per request than one that answers many. Hence two rates:
unthrottled, and the scheduler answering after 200 ms (about 75 creates/s with 16 in flight,
the rate of the full system today).

Run: .venv/bin/python bench/bench_gateway_cpu.py [--n 1000] [--postgres]   (or `make bench`)
  --postgres: the gateway's database on a throwaway PostgreSQL 15 cluster (as with several
  scheduler hosts) instead of SQLite.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.lean_http import LeanClient  # noqa: E402
from bench.stats import cpu_seconds, own_cpu_seconds  # noqa: E402
from taskgate.scheduler.v1 import scheduler_pb2 as pb  # noqa: E402
from taskgate.scheduler.v1 import scheduler_pb2_grpc as pb_grpc  # noqa: E402
from tests.e2e.conftest import add_member, create_key  # noqa: E402
from tests.support.postgres import fresh_database, start_postgres  # noqa: E402
from tests.support.procs import ServiceProcess  # noqa: E402
from tests.support.stack import make_stack  # noqa: E402

AGENT, SESSION = "agent-1", "cli-bench"
PATH = f"/api/v1/agents/{AGENT}/sessions/{SESSION}/tasks"


class CannedScheduler(pb_grpc.SchedulerServiceServicer):  # type: ignore[misc]
    """What the gateway's create and list need back, at once or after ``delay_s``."""

    def __init__(self) -> None:
        self.delay_s = 0.0
        self.task = pb.Task(task_id="f" * 32, agent_id=AGENT, session_id=SESSION, title="b", version=1)
        self.task.state = pb.TASK_STATE_QUEUED
        self.task.target_profile = "true"
        self.task.execution_type = pb.EXECUTION_TYPE_WORKER
        self.task.timing.create_time.GetCurrentTime()
        self.task.update_time.GetCurrentTime()

        self.calls = 0

    async def CreateTasks(self, request: pb.CreateTasksRequest, context: Any) -> pb.CreateTasksResponse:
        self.calls += 1
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        return pb.CreateTasksResponse(outcomes=[pb.CreateTaskOutcome(task=self.task) for _ in request.items])

    async def ListTasks(self, request: pb.ListTasksRequest, context: Any) -> pb.ListTasksResponse:
        self.calls += 1
        return pb.ListTasksResponse(total=1, page=0, pages=1, tasks=[self.task])

    async def GetTask(self, request: pb.GetTaskRequest, context: Any) -> pb.GetTaskResponse:
        self.calls += 1
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        return pb.GetTaskResponse(task=self.task)


async def wait_listening(port: int) -> None:
    for _ in range(300):
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.1)
            continue
        writer.close()
        return
    raise TimeoutError("the gateway did not start listening")


async def main(n: int, postgres: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        stack = make_stack(Path(tmp))
        stop_postgres = None
        if postgres:
            pg_url, stop_postgres = start_postgres(Path(tmp) / "pg")
            stack.env["TASKGATE_GATEWAY_DB_URL"] = fresh_database(pg_url, "bench_gateway")
        canned = CannedScheduler()
        server = grpc.aio.server()
        pb_grpc.add_SchedulerServiceServicer_to_server(canned, server)
        server.add_insecure_port(stack.env["TASKGATE_SCHEDULER_ADDR"])
        await server.start()
        key = create_key(stack, "bench", AGENT)
        add_member(stack, AGENT, SESSION, "bench")
        gateway = ServiceProcess("gateway_http", stack.env, Path(tmp) / "gateway.log").start(wait=False)
        assert gateway.proc is not None
        pid = gateway.proc.pid
        try:
            await wait_listening(int(stack.env["TASKGATE_HTTP_ADDR"].rpartition(":")[2]))
            headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
            async with LeanClient(stack.http_url, 16) as client:
                create = client.request("POST", PATH, headers, json.dumps({"title": "b", "profile": "true"}).encode())
                poll = client.request("GET", f"{PATH}?page_size=1", headers)
                detail = client.request("GET", f"{PATH}/{canned.task.task_id}", headers)
                await client.repeat(create, 200, expect=201)  # warm-up: connections, caches
                await client.repeat(poll, 200, expect=200)
                load = os.getloadavg()[0]
                database = "PostgreSQL" if postgres else "SQLite"
                print(
                    f"gateway CPU per REST call (real gateway process on {database}, canned scheduler; load {load:.2f})"
                )
                for label, request, code, delay_s, count in (
                    ("POST .../tasks, unthrottled", create, 201, 0.0, n),
                    ("POST .../tasks, scheduler answers in 200 ms", create, 201, 0.2, max(n // 3, 16)),
                    ("GET .../tasks?page_size=1, unthrottled", poll, 200, 0.0, n),
                    ("GET .../tasks/{id}, one task, unthrottled", detail, 200, 0.0, n),
                    ("GET .../tasks/{id}, one task, answered in 5 ms", detail, 200, 0.005, n),
                ):
                    canned.delay_s = delay_s
                    canned.calls = 0
                    gateway0, client0, began = cpu_seconds(pid), own_cpu_seconds(), time.perf_counter()
                    await client.repeat(request, count, expect=code)
                    elapsed = time.perf_counter() - began
                    gateway_ms = (cpu_seconds(pid) - gateway0) * 1000 / count
                    client_ms = (own_cpu_seconds() - client0) * 1000 / count
                    print(
                        f"  {label:<46} gateway {gateway_ms:5.2f} ms  client {client_ms:5.2f} ms  "
                        f"({count / elapsed:6.0f} req/s, N={count}, 16 in flight, "
                        f"{canned.calls / count:.2f} scheduler calls per request)"
                    )
            print(
                f"  reproduce: .venv/bin/python bench/bench_gateway_cpu.py --n {n}{' --postgres' if postgres else ''}"
            )
        finally:
            gateway.stop()
            await server.stop(0)
            if stop_postgres is not None:
                stop_postgres()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--postgres", action="store_true", help="the gateway's database on PostgreSQL")
    args = parser.parse_args()
    asyncio.run(main(args.n, args.postgres))
