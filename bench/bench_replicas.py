"""Several scheduler replicas on one PostgreSQL: throughput and exactly-once (issue 11 item 3).

Run: .venv/bin/python bench/bench_replicas.py   (or `make bench`)
     .venv/bin/python bench/bench_replicas.py --tasks 2000 --replicas 1 2 3
For each replica count: a fresh five-process stack on a throwaway PostgreSQL cluster
with that many scheduler processes (one machine, one telemetry agent), N `/bin/true`
tasks created over gRPC round-robin over the replicas, timed until every one is
completed; then every task is checked to have run exactly once (one attempt). No
speed-up is expected on 2 cores: the replicas share them (and the database).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg  # noqa: E402

from bench.bench_tasks import THROUGHPUT_SETTINGS  # noqa: E402
from bench.stats import Profile, cpu_seconds  # noqa: E402
from libs.grpc_client import aio_channel  # noqa: E402
from taskgate.scheduler.v1 import scheduler_pb2 as pb  # noqa: E402
from taskgate.scheduler.v1 import scheduler_pb2_grpc as pb_grpc  # noqa: E402
from tests.support.postgres import PostgresUnavailable, throwaway_cluster  # noqa: E402
from tests.support.procs import client_security  # noqa: E402
from tests.support.stack import make_stack  # noqa: E402


async def one_round(
    pg_url: str, replicas: int, n: int, profile_to: str | None = None
) -> tuple[float, float, dict[str, int]]:
    """(tasks/s created -> completed, schedulers' CPU ms per task, tasks per host).
    ``profile_to``: a py-spy profile of the first replica (.txt: raw stacks, else a flame graph)."""
    with tempfile.TemporaryDirectory() as tmp:
        # The throughput run's settings (64 running per replica, the shipped timer intervals).
        stack = make_stack(Path(tmp), **THROUGHPUT_SETTINGS)
        stack.use_postgresql(pg_url, prefix="bench_")
        stack.add_scheduler_replicas(replicas - 1)
        stack.start()
        stack.wait_replicas_serving()
        try:
            names = stack.scheduler_names()
            envs = [stack.replicas.get(name, stack.env) for name in names]
            security = client_security(stack.env, "gateway")
            channels = [aio_channel(env["TASKGATE_SCHEDULER_ADDR"], security) for env in envs]
            stubs = [pb_grpc.SchedulerServiceStub(c) for c in channels]
            pids = [stack.procs[name].proc.pid for name in names]  # type: ignore[union-attr]
            sem = asyncio.Semaphore(16)

            async def create(i: int) -> None:
                async with sem:
                    await stubs[i % replicas].CreateTask(
                        pb.CreateTaskRequest(agent_id="agent-1", session_id="cli-bench", title="b", profile="true"),
                        timeout=30,
                    )

            url = stack.env["TASKGATE_SCHEDULER_DB_URL"]
            profile = await Profile.start(pids[0], profile_to)
            cpu0 = sum(cpu_seconds(p) for p in pids)
            began = time.perf_counter()
            await asyncio.gather(*(create(i) for i in range(n)))
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                while True:
                    cur = await conn.execute("SELECT count(*) FROM tasks WHERE state = 'completed'")
                    row = await cur.fetchone()
                    if row and row[0] >= n:
                        break
                    await asyncio.sleep(0.02)
                total_s = time.perf_counter() - began
                cpu_ms = (sum(cpu_seconds(p) for p in pids) - cpu0) * 1000
                await profile.stop()
                cur = await conn.execute("SELECT count(*) FROM attempts GROUP BY task_id HAVING count(*) <> 1")
                assert not await cur.fetchall(), "a task ran other than exactly once"
                cur = await conn.execute("SELECT doc::json->>'host_id' FROM attempts")
                hosts = Counter(str(r[0]) for r in await cur.fetchall())
            for c in channels:
                await c.close()
            return n / total_s, cpu_ms / n, dict(hosts)
        finally:
            stack.stop()


async def main(n: int, counts: list[int], profile_to: str | None = None) -> None:
    try:
        with throwaway_cluster() as url:
            for replicas in counts:
                rate, cpu, hosts = await one_round(url, replicas, n, profile_to if replicas == counts[0] else None)
                spread = "/".join(str(v) for v in sorted(hosts.values(), reverse=True))
                print(
                    f"replicas={replicas}: gRPC created->completed, /bin/true, N={n}: {rate:7.1f} tasks/s, "
                    f"schedulers' CPU {cpu:5.2f} ms/task, tasks per replica {spread}, each ran exactly once",
                    flush=True,
                )
    except PostgresUnavailable as exc:
        print(f"skipped: {exc}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--profile", default=None, help="py-spy profile of the first replica (first count)")
    args = parser.parse_args()
    asyncio.run(main(args.tasks, args.replicas, args.profile))
