"""The HTTP edge's cost per request: GET .../tasks/{taskId} through the real gateway
(key check, membership, request id, typed answer) next to the scheduler's GetTask over
raw gRPC, the floor the gateway adds to; and a chunked oversize body refused with 413.

Run: .venv/bin/python bench/bench_edge.py   (or `make bench`)
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from taskgate.scheduler.v1 import scheduler_pb2 as pb  # noqa: E402
from taskgate.scheduler.v1 import scheduler_pb2_grpc as pb_grpc  # noqa: E402
from tests.e2e.conftest import add_member, create_key  # noqa: E402
from tests.support.stack import make_stack  # noqa: E402

AGENT, SESSION = "agent-1", "cli-bench"
N = 400
N_REJECT = 50


def timed(n: int, call: Callable[[], object]) -> list[float]:
    for _ in range(20):  # warm-up: connections, caches
        call()
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        call()
        samples.append((time.perf_counter() - start) * 1000)
    return samples


def report(name: str, samples: list[float]) -> None:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * (len(ordered) - 1)))]
    print(
        f"{name:<46} p50 {statistics.median(samples):6.2f} ms  p99 {p99:6.2f} ms  "
        f"{len(samples) / (sum(samples) / 1000):7.0f} req/s (one client, sequential, N={len(samples)})"
    )


def chunks(total: int, size: int = 64 * 1024) -> Iterator[bytes]:
    for _ in range(total // size):
        yield b" " * size


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        stack = make_stack(Path(tmp))
        print("starting the five services ...", flush=True)
        stack.start()
        try:
            key = create_key(stack, "bench", AGENT)
            add_member(stack, AGENT, SESSION, "bench")
            base = f"{stack.http_url}/api/v1/agents/{AGENT}/sessions/{SESSION}"
            with httpx.Client(headers={"Authorization": f"Bearer {key}"}, timeout=30) as client:
                created = client.post(f"{base}/tasks", json={"title": "bench", "profile": "exit-at-once"})
                task_id = created.json()["task"]["taskId"]
                with stack.channel("scheduler", "gateway") as channel:
                    stub = pb_grpc.SchedulerServiceStub(channel)
                    floor = timed(N, lambda: stub.GetTask(pb.GetTaskRequest(task_id=task_id), timeout=10))
                rest = timed(N, lambda: client.get(f"{base}/tasks/{task_id}").raise_for_status())

                def refuse() -> None:
                    response = client.post(
                        f"{base}/tasks", content=chunks(4 * 1024 * 1024), headers={"Content-Type": "application/json"}
                    )
                    assert response.status_code == 413, response.text

                rejected = timed(N_REJECT, refuse)
            report("scheduler GetTask, raw gRPC (floor)", floor)
            report("GET .../tasks/{taskId} through the gateway", rest)
            print(f"{'':<46} gateway adds {statistics.median(rest) - statistics.median(floor):.2f} ms at p50")
            report("POST 4 MiB chunked (bound 256 KiB) → 413", rejected)
        finally:
            stack.stop()


if __name__ == "__main__":
    main()
