"""Pending-registry round trips over gRPC on loopback, next to a bare grpc.aio unary echo.

Run: .venv/bin/python bench/bench_pending.py   (or `make bench`)

- ask round trip: a producer's Ask is sent -> a front-end hears of it on its Listen
  stream -> PickNext claims it -> Reply -> the producer's Ask returns. Timed at the producer.
  Second form: front-ends parked in PickNext(max_wait) get the entry handed over directly.
- answer -> waiter: a worker blocks in AwaitAnswer; AnswerQuestion is sent -> the
  answer is committed -> the worker's AwaitAnswer returns. Timed from the answer call.
- floor: a unary echo on a bare grpc.aio server (no interceptor, no database) in its
  own process, called the same way (1 caller, then 64 concurrent callers).

The registry runs as the real process (SQLite WAL in a temp dir, default logging);
producers, front-end and workers share one client process and event loop.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
from google.protobuf.duration_pb2 import Duration

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.stats import pct  # noqa: E402
from libs.grpc_client import ClientSecurity, aio_channel  # noqa: E402
from taskgate.pending.v1 import pending_pb2 as pb  # noqa: E402
from taskgate.pending.v1 import pending_pb2_grpc as pb_grpc  # noqa: E402
from tests.support.procs import REPO, ServiceProcess, client_security, free_port, wait_grpc_serving  # noqa: E402

ECHO_METHOD = "/bench.Echo/Echo"
PAYLOAD = b"x" * 96
WARMUP = 50
SEQUENTIAL = 800
CONCURRENCY = 64
PER_TASK = 25


# --- the floor: a bare echo server ------------------------------------------------


async def serve_echo(addr: str) -> None:
    async def echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return request

    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler("bench.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(echo)})]
    )
    # Health, so the same readiness wait works.
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_health.v1.health import aio as health_aio

    health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    server.add_insecure_port(addr)
    await server.start()
    await health.set("", health_pb2.HealthCheckResponse.SERVING)
    await server.wait_for_termination()


# --- measuring --------------------------------------------------------------------


async def measure(one: Callable[[], Awaitable[float]], concurrency: int, per_task: int) -> list[float]:
    """Latencies (ms) of ``one`` run ``per_task`` times by each of ``concurrency`` tasks, after warm-up."""
    for _ in range(WARMUP):
        await one()
    results: list[float] = []

    async def worker() -> None:
        for _ in range(per_task):
            results.append(await one())

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return results


async def bench_echo(addr: str) -> dict[int, list[float]]:
    async with grpc.aio.insecure_channel(addr) as channel:
        echo = channel.unary_unary(ECHO_METHOD)

        async def one() -> float:
            start = time.perf_counter()
            await echo(PAYLOAD, timeout=10)
            return (time.perf_counter() - start) * 1000

        return {
            1: await measure(one, 1, SEQUENTIAL),
            CONCURRENCY: await measure(one, CONCURRENCY, PER_TASK),
        }


async def bench_registry(addr: str, security: ClientSecurity) -> dict[str, list[float]]:
    # As the operator identity: one credential may both produce asks and answer them.
    async with aio_channel(addr, security) as channel:
        stub = pb_grpc.PendingRegistryServiceStub(channel)
        stop = asyncio.Event()
        handlers: set[asyncio.Task[None]] = set()

        async def claim_and_reply() -> None:
            picked = await stub.PickNext(pb.PickNextRequest(prefix="cli-", picker="bench-ui"), timeout=10)
            if picked.HasField("entry"):
                await stub.Reply(
                    pb.ReplyRequest(entry_id=picked.entry.entry_id, answer="yes", picker="bench-ui"), timeout=10
                )

        async def front_end(ready: asyncio.Event) -> None:
            stream = stub.Listen(pb.ListenRequest(prefix="cli-", listener_name="bench-ui"))
            async for event in stream:
                if event.type == pb.LISTEN_EVENT_TYPE_SYNCED:
                    ready.set()
                elif event.type == pb.LISTEN_EVENT_TYPE_AVAILABLE:
                    task = asyncio.ensure_future(claim_and_reply())
                    handlers.add(task)
                    task.add_done_callback(handlers.discard)
                if stop.is_set():
                    break
            stream.cancel()

        ready = asyncio.Event()
        listener = asyncio.ensure_future(front_end(ready))
        await asyncio.wait_for(ready.wait(), 10)

        async def ask_round_trip() -> float:
            start = time.perf_counter()
            reply = await stub.Ask(
                pb.AskRequest(session_id="cli-bench", kind=pb.ENTRY_KIND_CONFIRM, payload="run the migration?"),
                timeout=10,
            )
            assert reply.answer == "yes"
            return (time.perf_counter() - start) * 1000

        results = {
            "listen 1": await measure(ask_round_trip, 1, SEQUENTIAL),
            f"listen {CONCURRENCY}": await measure(ask_round_trip, CONCURRENCY, PER_TASK),
        }
        stop.set()
        listener.cancel()
        await asyncio.gather(listener, *handlers, return_exceptions=True)

        # Front-ends parked in PickNext(max_wait): the registry hands each new entry
        # to a waiting picker at once, no Listen push and no extra claim round trip.
        wait = Duration(seconds=30)
        done = asyncio.Event()

        async def waiting_picker(name: str) -> None:
            while not done.is_set():
                try:
                    picked = await stub.PickNext(
                        pb.PickNextRequest(prefix="cli-", picker=name, max_wait=wait), timeout=35
                    )
                except grpc.aio.AioRpcError:
                    return
                if picked.HasField("entry"):
                    await stub.Reply(
                        pb.ReplyRequest(entry_id=picked.entry.entry_id, answer="yes", picker=name), timeout=10
                    )

        for concurrency, pickers in ((1, 1), (CONCURRENCY, 16)):
            done.clear()
            picker_tasks = [asyncio.ensure_future(waiting_picker(f"picker-{i}")) for i in range(pickers)]
            results[f"wait {concurrency}"] = await measure(
                ask_round_trip, concurrency, SEQUENTIAL if concurrency == 1 else PER_TASK
            )
            done.set()
            for task in picker_tasks:
                task.cancel()
            await asyncio.gather(*picker_tasks, return_exceptions=True)

        async def answer_to_waiter() -> float:
            task_id = uuid.uuid4().hex
            q = (
                await stub.AskQuestion(
                    pb.AskQuestionRequest(task_id=task_id, session_id="cli-bench", text="which branch?"), timeout=10
                )
            ).question
            waiter = stub.AwaitAnswer(pb.AwaitAnswerRequest(question_id=q.question_id), timeout=10)
            # The waiter is parked once GetQuestion, sent after it on the same channel, has returned.
            await stub.GetQuestion(pb.GetQuestionRequest(question_id=q.question_id), timeout=10)
            start = time.perf_counter()
            await stub.AnswerQuestion(
                pb.AnswerQuestionRequest(task_id=task_id, question_id=q.question_id, answer="main"), timeout=10
            )
            got = await waiter
            elapsed = (time.perf_counter() - start) * 1000
            assert got.question.answer == "main"
            return elapsed

        results["answer 1"] = await measure(answer_to_waiter, 1, SEQUENTIAL // 2)
        results[f"answer {CONCURRENCY}"] = await measure(answer_to_waiter, CONCURRENCY, PER_TASK // 2)
        return results


def row(name: str, values: list[float], floor: list[float] | None) -> str:
    p50, p99 = pct(values, 0.50), pct(values, 0.99)
    if floor is None:
        return f"{name:<40} {len(values):>6} {p50:>8.3f} {p99:>8.3f} {'':>10} {'':>10}"
    f50, f99 = pct(floor, 0.50), pct(floor, 0.99)
    return f"{name:<40} {len(values):>6} {p50:>8.3f} {p99:>8.3f} {p50 / f50:>9.1f}x {p99 / f99:>9.1f}x"


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        echo_addr = f"127.0.0.1:{free_port()}"
        echo = subprocess.Popen([sys.executable, __file__, "--echo-server", echo_addr], cwd=REPO)
        reg_addr = f"127.0.0.1:{free_port()}"
        registry = ServiceProcess(
            "services.pending_registry",
            {"TASKGATE_PENDING_ADDR": reg_addr, "TASKGATE_DATA_DIR": str(Path(tmp) / "data")},
            Path(tmp) / "pending.log",
            reg_addr,
        )
        try:
            wait_grpc_serving(echo_addr, proc=echo)
            registry.start()
            print(f"cpus: {os.cpu_count()}  python: {sys.version.split()[0]}  grpcio: {grpc.__version__}")
            started = time.perf_counter()
            floor = await bench_echo(echo_addr)
            measured = await bench_registry(reg_addr, client_security(registry.env))
            took = time.perf_counter() - started
        finally:
            registry.stop()
            echo.terminate()
            echo.wait(timeout=10)

    print(f"\n{'latency in ms':<40} {'n':>6} {'p50':>8} {'p99':>8} {'p50/floor':>10} {'p99/floor':>10}")
    print(row("echo unary (floor), 1 caller", floor[1], None))
    print(row(f"echo unary (floor), {CONCURRENCY} callers", floor[CONCURRENCY], None))
    print(row("Ask->Listen->PickNext->Reply, 1 producer", measured["listen 1"], floor[1]))
    print(row(f"  same, {CONCURRENCY} producers", measured[f"listen {CONCURRENCY}"], floor[CONCURRENCY]))
    print(row("Ask->PickNext(waiting)->Reply, 1 producer", measured["wait 1"], floor[1]))
    print(row(f"  same, {CONCURRENCY} producers, 16 pickers", measured[f"wait {CONCURRENCY}"], floor[CONCURRENCY]))
    print(row("AnswerQuestion->AwaitAnswer, 1 worker", measured["answer 1"], floor[1]))
    print(
        row(
            f"AnswerQuestion->AwaitAnswer, {CONCURRENCY} workers", measured[f"answer {CONCURRENCY}"], floor[CONCURRENCY]
        )
    )
    print(f"\n(whole run {took:.1f} s)")
    print(
        "A Listen-driven round trip is three RPCs (Ask, PickNext, Reply), a Listen push and a durable insert;\n"
        "with a waiting PickNext it is Ask + Reply with the claim handed over in memory."
    )


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--echo-server":
        asyncio.run(serve_echo(sys.argv[2]))
    else:
        asyncio.run(main())
