"""The CPU of the create path's own Python, in-process, apart from gRPC and the other services.

1. The server interceptor (libs/grpc_server.py) around one unary call: metadata, caller
   authentication, request id, log context, the RPC histogram and the canonical log line
   (written to a file, as in production) — minus a bare call of the same handler.
2. SchedulerServicer.CreateTask called directly (no gRPC) on an engine with a SQLite store,
   16 in flight: conversion, admission, validation, the store's insert and event on its
   database thread, the reply. Tasks stay queued (no dispatcher runs).
3. The admission steps alone, per call.

The system-level figure (a real stack over gRPC) is bench/bench_create_rpc.py; on a shared
machine its noise (±50 us per call) hides differences of a few microseconds that these show.

Run: .venv/bin/python bench/bench_rpc_overhead.py
"""

from __future__ import annotations

import asyncio
import logging
import os
import statistics
import sys
import tempfile
import time
import timeit
from pathlib import Path
from typing import Any

import grpc
import structlog

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from libs import grpc_server, internal_auth  # noqa: E402
from libs.db import Database  # noqa: E402
from libs.internal_auth import CallerAuth  # noqa: E402
from libs.log import configure_logging  # noqa: E402
from libs.settings import Settings, TaskSettings, WorkerProfile  # noqa: E402
from services.scheduler import admission, domain  # noqa: E402
from services.scheduler.domain import NewTask  # noqa: E402
from services.scheduler.engine import Engine  # noqa: E402
from services.scheduler.servicer import SchedulerServicer  # noqa: E402
from services.scheduler.store import MIGRATIONS, SchedulerStore  # noqa: E402
from taskgate.scheduler.v1 import scheduler_pb2 as pb  # noqa: E402

ROUNDS = 5
SECRETS = {identity: f"{identity}-" + "s" * 43 for identity in internal_auth.IDENTITIES}
METHOD = "/taskgate.scheduler.v1.SchedulerService/CreateTask"
METADATA = (
    ("authorization", f"Bearer {SECRETS['gateway']}"),
    ("x-request-id", "0123456789abcdef0123456789abcdef"),
    ("user-agent", "grpc-python-asyncio/1.85.1 grpc-c/53.0.0 (linux; chttp2)"),
)


class _Details:
    method = METHOD
    invocation_metadata = METADATA


async def _echo(request: Any, context: Any) -> Any:
    return request


async def interceptor_us(n: int) -> tuple[float, float]:
    """(interceptor overhead, bare call) in microseconds of CPU per unary call."""
    interceptor = grpc_server.ServiceInterceptor(CallerAuth.from_secrets(SECRETS))
    handler = grpc.unary_unary_rpc_method_handler(_echo)
    details = _Details()

    async def continuation(_: Any) -> grpc.RpcMethodHandler:
        return handler

    async def bare() -> None:
        for _ in range(n):
            found = await continuation(details)
            await found.unary_unary(1, None)

    async def intercepted() -> None:
        for _ in range(n):
            wrapped = await interceptor.intercept_service(continuation, details)
            await wrapped.unary_unary(1, None)

    results: dict[str, list[float]] = {"bare": [], "intercepted": []}
    for _ in range(ROUNDS):
        for name, run in (("bare", bare), ("intercepted", intercepted)):
            began = time.process_time()
            await run()
            results[name].append((time.process_time() - began) * 1e6 / n)
    bare_us = statistics.median(results["bare"])
    return statistics.median(results["intercepted"]) - bare_us, bare_us


async def create_task_us(tmp: Path, n: int) -> float:
    settings = Settings(
        data_dir=tmp,
        tasks=TaskSettings(max_running=1, supervisor_interval_ms=3_600_000),
        workers={"true": WorkerProfile(command=["/bin/true"])},
    )
    db = Database(f"sqlite:///{tmp / 'scheduler.db'}", MIGRATIONS)
    db.migrate()
    engine = Engine(settings, SchedulerStore(db))
    await engine.start(run_loops=False)
    servicer = SchedulerServicer(engine)
    request = pb.CreateTaskRequest(agent_id="agent-1", session_id="bench", title="b", profile="true")
    slots = asyncio.Semaphore(16)

    async def one() -> None:
        async with slots:
            await servicer.CreateTask(request, None)  # type: ignore[arg-type]

    try:
        await asyncio.gather(*(one() for _ in range(200)))  # warm up
        per_call = []
        for _ in range(ROUNDS):
            began = time.process_time()  # the whole process: the database thread too
            await asyncio.gather(*(one() for _ in range(n)))
            per_call.append((time.process_time() - began) * 1e6 / n)
        return statistics.median(per_call)
    finally:
        await engine.shutdown()
        db.close()


def admission_steps_us(tmp: Path, n: int) -> dict[str, float]:
    settings = Settings(data_dir=tmp, workers={"true": WorkerProfile(command=["/bin/true"])})
    profile = settings.workers["true"]
    request = NewTask("agent-1", "bench", "b", "", "true", None, None, None)
    steps = {
        "validate_new_task": lambda: domain.validate_new_task(request, settings.workers),
        "shared_workspace": lambda: admission.shared_workspace(settings, profile, "agent-1"),
    }
    return {name: min(timeit.repeat(step, number=n, repeat=ROUNDS)) * 1e6 / n for name, step in steps.items()}


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp, open(Path(tmp) / "service.log", "w") as log_file:
        configure_logging("scheduler", fmt="json")
        # The same processors as a service, writing to a file instead of stderr.
        structlog.configure(logger_factory=structlog.WriteLoggerFactory(file=log_file))
        overhead, bare = await interceptor_us(20_000)
        print(
            f"interceptor around one unary call: {overhead:.1f} us CPU (bare call {bare:.1f} us; "
            f"median of {ROUNDS} x 20000; load average {os.getloadavg()[0]:.1f})",
            flush=True,
        )
        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))  # quiet engine
        per_create = await create_task_us(Path(tmp), 1000)
        print(
            f"CreateTask in-process (servicer, engine, SQLite store, reply): {per_create:.0f} us CPU per call "
            f"(median of {ROUNDS} x 1000; load average {os.getloadavg()[0]:.1f})",
            flush=True,
        )
        steps = admission_steps_us(Path(tmp), 20_000)
        print("admission steps: " + ", ".join(f"{name} {us:.2f} us" for name, us in steps.items()), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
