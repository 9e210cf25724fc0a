"""The scheduler's CPU per create (one CreateTask call each, the gateway's batches as
CreateTasks calls, and the same batches on its StreamCreateTasks stream) and per cheap unary
RPC, apart from launching.

A real five-process stack; this client calls the scheduler's gRPC API directly as the gateway
(16 in flight on one channel; the batched creates go through the gateway's own
``CreateBatches``, so the batches form as they do there). One `sleeper` task holds the only
running slot (max_running=1), so every created task stays queued: the figure is the create path alone — the interceptor
(caller auth, request id, log line, RPC metric), the servicer, admission, the store's insert
and its event, the reply — plus the event it sends to the notifier's log follower. The last
figure is GetTask of one queued task: the per-RPC overhead with a small handler.

Scheduler CPU is read from /proc (user + system) around each round, this client's own (the
gateway's side of the calls) with ``time.process_time``; median of the rounds.

Run: .venv/bin/python bench/bench_create_rpc.py [--n 1500] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.stats import cpu_seconds  # noqa: E402
from gateway_http.create_batches import CreateBatches  # noqa: E402
from gateway_http.create_stream import CreateStream  # noqa: E402
from libs.grpc_client import aio_channel  # noqa: E402
from taskgate.scheduler.v1 import scheduler_pb2 as pb  # noqa: E402
from taskgate.scheduler.v1 import scheduler_pb2_grpc as pb_grpc  # noqa: E402
from tests.support.procs import client_security  # noqa: E402
from tests.support.stack import make_stack  # noqa: E402

AGENT, SESSION = "agent-1", "bench-create"
IN_FLIGHT = 16


async def _calls(n: int, call: object) -> float:
    """Seconds for ``n`` calls of ``call()`` with IN_FLIGHT at a time."""
    sem = asyncio.Semaphore(IN_FLIGHT)

    async def one() -> None:
        async with sem:
            await call()  # type: ignore[operator]

    began = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n)))
    return time.perf_counter() - began


async def run(n: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        stack = make_stack(Path(tmp), max_running=1).start()
        try:
            pid = stack.procs["scheduler"].proc.pid  # type: ignore[union-attr]
            security = client_security(stack.env, "gateway")
            async with aio_channel(stack.addr("scheduler"), security) as channel:
                stub = pb_grpc.SchedulerServiceStub(channel)
                base = {"agent_id": AGENT, "session_id": SESSION, "title": "b"}
                await stub.CreateTask(pb.CreateTaskRequest(**base, profile="sleeper"), timeout=10)
                one = await stub.CreateTask(pb.CreateTaskRequest(**base, profile="true"), timeout=10)
                await asyncio.sleep(1.0)  # the sleeper runs; nothing else will launch

                async def create() -> None:
                    await stub.CreateTask(pb.CreateTaskRequest(**base, profile="true"), timeout=30)

                batches = CreateBatches(stub)
                stream = CreateStream(stub, security.metadata)
                streamed = CreateBatches(stub, send=stream)

                async def create_batched() -> None:
                    await batches.create(pb.CreateTaskRequest(**base, profile="true"), "bench", 30)

                async def create_streamed() -> None:
                    await streamed.create(pb.CreateTaskRequest(**base, profile="true"), "bench", 30)

                async def get() -> None:
                    await stub.GetTask(pb.GetTaskRequest(task_id=one.task.task_id), timeout=30)

                for name, call, batching in (
                    ("CreateTask", create, None),
                    ("CreateTasks batches", create_batched, batches),
                    ("StreamCreateTasks batches", create_streamed, streamed),
                    ("GetTask", get, None),
                ):
                    per_call, own, rates, calls = [], [], [], []
                    for _ in range(rounds):
                        cpu0, own0 = cpu_seconds(pid), time.process_time()
                        calls0 = batching.calls if batching else 0
                        took = await _calls(n, call)
                        per_call.append((cpu_seconds(pid) - cpu0) * 1000 / n)
                        own.append((time.process_time() - own0) * 1000 / n)
                        rates.append(n / took)
                        calls.append(batching.calls - calls0 if batching else 0)
                    batch = f", {n * rounds / sum(calls):.1f} creates per batch" if sum(calls) else ""
                    print(
                        f"{name}: scheduler CPU {statistics.median(per_call):.3f} ms/create or call "
                        f"(rounds {', '.join(f'{x:.3f}' for x in per_call)}), caller CPU "
                        f"{statistics.median(own):.3f} ms, {statistics.median(rates):.0f}/s{batch}, N={n}, "
                        f"load average {os.getloadavg()[0]:.1f}",
                        flush=True,
                    )
                await stream.close()
        finally:
            stack.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(run(args.n, args.rounds))
