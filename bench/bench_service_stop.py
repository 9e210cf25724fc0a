"""How long a scheduler takes to stop (SIGTERM → exit) with its clients' streams open.

Run: .venv/bin/python bench/bench_service_stop.py [--rounds 3]
Starts the five services (the tests' stack), makes one task through the gateway (so the gateway's
StreamCreateTasks stream is open; the notifier's event-log watch opens at start), waits until the
notifier has seen it end, then SIGTERMs the scheduler and times its exit; starts it again for the
next round. Prints each round's seconds and exit code and the median. Before a stopping service
ended its open streams, each stop took the server's whole 5 s grace.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.e2e.conftest import add_member, create_key  # noqa: E402
from tests.support.stack import make_stack  # noqa: E402

AGENT, SESSION = "bench-stop", "s1"


def one_stop(stack, key: str, n: int) -> tuple[float, int | None]:  # type: ignore[no-untyped-def]
    """Seconds from SIGTERM to the scheduler's exit, and its exit code."""
    created = httpx.post(
        f"{stack.http_url}/api/v1/agents/{AGENT}/sessions/{SESSION}/tasks",
        json={"title": f"before stop {n}", "profile": "true"},
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )
    created.raise_for_status()
    task_id = created.json()["task"]["taskId"]
    deadline = time.monotonic() + 30
    while task_id not in stack.procs["notifier"].logs():  # its watch delivered: the stream is open
        if time.monotonic() > deadline:
            raise RuntimeError("the notifier never saw the task end")
        time.sleep(0.05)
    scheduler = stack.procs["scheduler"]
    began = time.monotonic()
    code = scheduler.stop(signal.SIGTERM, timeout_s=30)
    took = time.monotonic() - began
    scheduler.start()
    stack.wait_healthy()
    return took, code


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        stack = make_stack(Path(tmp))
        stack.start()
        try:
            key = create_key(stack, "bench", AGENT)
            add_member(stack, AGENT, SESSION, "bench")
            took = []
            for n in range(1, args.rounds + 1):
                seconds, code = one_stop(stack, key, n)
                took.append(seconds)
                print(f"round {n}/{args.rounds}: the scheduler stopped {seconds:.2f} s after SIGTERM, exit {code}")
            print(
                f"scheduler stop with the gateway's create stream and the notifier's watch open: "
                f"median {statistics.median(took):.2f} s of {args.rounds}"
                f" (reproduce: .venv/bin/python bench/bench_service_stop.py --rounds {args.rounds})"
            )
        finally:
            stack.stop()


if __name__ == "__main__":
    main()
