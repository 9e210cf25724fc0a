"""Memory kept per task: does any service grow with the tasks it has run?

Run: .venv/bin/python bench/bench_retained.py [--warmup 2000] [--batch 6000] [--batches 5]
The real five-process system (SQLite) runs `/bin/true` tasks through REST in batches; after
the warm-up and after each batch (all its tasks completed) every service's resident set
(``VmRSS``) and its open file descriptors are read. A service that keeps something per task
(a lock, a cache entry, a subscription) grows in a line with the tasks: the slope, KiB per
1,000 tasks over the measured batches (least squares), is the figure, and the same over the
later half of them: caches that fill up (SQLite's pages, pydantic's string cache, 16,384
strings) flatten there once the run is long enough (the default's 32,000 tasks), a leak does
not. Pages the allocator keeps make a few hundred KiB of noise; a per-task leak of ~200 bytes
shows as ~200 KiB per 1,000. A descriptor leak shows as a count that climbs batch by batch.
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_tasks import AGENT, CREATES_IN_FLIGHT, SESSION, THROUGHPUT_SETTINGS  # noqa: E402
from bench.lean_http import LeanClient  # noqa: E402
from bench.stats import rss_mib  # noqa: E402
from tests.e2e.conftest import add_member, create_key  # noqa: E402
from tests.support.stack import make_stack  # noqa: E402

SERVICES = ("scheduler", "gateway", "notifier", "pending", "telemetry")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def slope(xs: list[float], ys: list[float]) -> float:
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


async def run(warmup: int, batch: int, batches: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        stack = make_stack(Path(tmp), **THROUGHPUT_SETTINGS)
        stack.start()
        try:
            key = create_key(stack, "bench", AGENT)
            add_member(stack, AGENT, SESSION, "bench")
            pids = {}
            for name in SERVICES:
                proc = stack.procs[name].proc
                assert proc is not None
                pids[name] = proc.pid
            path = f"/api/v1/agents/{AGENT}/sessions/{SESSION}/tasks"
            headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
            async with LeanClient(stack.http_url, CREATES_IN_FLIGHT) as lean:
                create = lean.request("POST", path, headers, json.dumps({"title": "r", "profile": "true"}).encode())
                poll = lean.request("GET", f"{path}?page_size=1", headers)

                async def run_batch(n: int) -> float:
                    began = time.perf_counter()
                    await lean.repeat(create, n, expect=201)
                    while True:
                        answer = await lean.send(poll)
                        if answer.status != 200:
                            raise RuntimeError(f"the task list answered {answer.status}")
                        if json.loads(answer.body)["total"] == 0:
                            return n / (time.perf_counter() - began)
                        await asyncio.sleep(0.05)

                rate = await run_batch(warmup)
                await asyncio.sleep(1.0)  # the last exits' follow-ups (deliveries, proofs)
                done = [warmup]
                samples = {name: [rss_mib(pid) * 1024] for name, pid in pids.items()}
                fds = {name: [open_fds(pid)] for name, pid in pids.items()}
                print(f"warm-up: {warmup} tasks ({rate:.0f}/s)", flush=True)
                for i in range(batches):
                    rate = await run_batch(batch)
                    await asyncio.sleep(1.0)
                    done.append(done[-1] + batch)
                    for name, pid in pids.items():
                        samples[name].append(rss_mib(pid) * 1024)
                        fds[name].append(open_fds(pid))
                    row = ", ".join(f"{name} {samples[name][-1] / 1024:.1f}" for name in pids)
                    print(f"batch {i + 1}/{batches}: {done[-1]} tasks ({rate:.0f}/s); RSS MiB: {row}", flush=True)
            half = len(done) // 2
            print(
                f"\nresident set growth, KiB per 1,000 tasks (least squares): over {done[0]}..{done[-1]} tasks,"
                f" and over the later {done[half]}..{done[-1]} (caches filled: a leak keeps its slope there)"
            )
            xs = [float(d) for d in done]
            for name in pids:
                ys = [float(v) for v in samples[name]]
                grown = (ys[-1] - ys[0]) / 1024
                print(
                    f"  {name:<10} {slope(xs, ys) * 1000:8.1f} {slope(xs[half:], ys[half:]) * 1000:8.1f}"
                    f"   ({ys[0] / 1024:.1f} -> {ys[-1] / 1024:.1f} MiB, {grown:+.1f})"
                )
            print("open file descriptors after the warm-up and after each batch (a leak grows with the tasks):")
            for name in pids:
                print(f"  {name:<10} {' '.join(str(n) for n in fds[name])}")
            print(
                f"  (reproduce: .venv/bin/python bench/bench_retained.py --warmup {warmup} --batch {batch}"
                f" --batches {batches})"
            )
        finally:
            stack.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--warmup", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=6000)
    parser.add_argument("--batches", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(run(args.warmup, args.batch, args.batches))


if __name__ == "__main__":
    main()
