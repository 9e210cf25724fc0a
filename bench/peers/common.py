"""What the peer runners share: arguments, the worker subprocess, the output file.

Each runner runs in the peers' own environment (never the project's .venv) as
``<peers python> bench/peers/<peer>.py --n N --rounds R --json OUT [--url URL]``; it starts the
peer's worker as a child process in its own process group, enqueues N no-op tasks from this
process, waits until the last one has completed, and writes the rounds to OUT as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.comparison import RoundFigures  # noqa: E402

POLL_S = 0.005  # how often a runner looks for completions: small next to a round of N tasks


def parse_args(description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, required=False, help="write the rounds here")
    parser.add_argument("--url", default="", help="broker/database URL (Celery: redis, procrastinate: postgres)")
    parser.add_argument("--workdir", type=Path, default=Path("var/bench-peers"))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # internal: run the worker
    args = parser.parse_args()
    if args.n < 1 or args.rounds < 1:
        parser.error("--n and --rounds must be at least 1")
    return args


def start_worker(argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """This script again with --worker, in its own process group so that stop_worker ends all of it."""
    return subprocess.Popen(
        [sys.executable, *argv, "--worker"],
        start_new_session=True,
        stdout=sys.stderr,  # stdout carries the figures when no --json is given
        env={**os.environ, **(env or {})},
    )


def stop_worker(proc: subprocess.Popen[bytes], timeout_s: float = 15.0) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def wait_until(
    check: Callable[[], bool], timeout_s: float, what: str, worker: subprocess.Popen[bytes] | None = None
) -> None:
    """Poll ``check``; fail at the deadline, or at once when ``worker`` has died."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if worker is not None and worker.poll() is not None:
            raise RuntimeError(f"the worker exited ({worker.returncode}) while waiting for {what}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(POLL_S)


def version_of(*dists: str) -> str:
    return ", ".join(f"{d} {metadata.version(d)}" for d in dists)


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def write_rounds(path: Path | None, rounds: list[RoundFigures], version: str, config: dict[str, object]) -> None:
    out = {"version": version, "config": config, "rounds": [r.to_json() for r in rounds]}
    if path is None:
        print(json.dumps(out))
    else:
        path.write_text(json.dumps(out))
