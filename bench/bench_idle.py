"""What a stack's services cost while nothing happens, per thread.

Run: .venv/bin/python bench/bench_idle.py [--seconds 10] [--test-timers]
Starts the five services (the tests' stack, `tests.support.stack.make_stack`) with the
supervisor and telemetry timers at their shipped defaults (1 s, 15 s; `--test-timers`: the
tests' 100 / 200 ms), waits 3 s, then reads every thread's CPU from /proc over the window and
prints the threads that used any, in ms of CPU per second.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.stack import StackTasks, make_stack  # noqa: E402

TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def threads_cpu(pid: int) -> dict[tuple[int, str], tuple[float, float]]:
    """(tid, name) -> (user s, system s) of each thread of ``pid``."""
    found = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                raw = f.read()
        except FileNotFoundError:
            continue
        name = raw[raw.index("(") + 1 : raw.rindex(")")]
        fields = raw[raw.rindex(")") + 2 :].split()
        found[(int(tid), name)] = (int(fields[11]) * TICK_S, int(fields[12]) * TICK_S)
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--test-timers", action="store_true", help="the tests' 100 / 200 ms timers")
    args = parser.parse_args()
    shipped = StackTasks(supervisor_interval_ms=1000, observation_interval_ms=15000)
    timers = StackTasks() if args.test_timers else shipped
    with tempfile.TemporaryDirectory() as tmp:
        stack = make_stack(Path(tmp), **timers)
        stack.start()
        try:
            time.sleep(3)
            pids = {name: proc.proc.pid for name, proc in stack.procs.items() if proc.proc is not None}
            before = {name: threads_cpu(pid) for name, pid in pids.items()}
            time.sleep(args.seconds)
            after = {name: threads_cpu(pid) for name, pid in pids.items()}
        finally:
            stack.stop()
    label = "the tests' 100 / 200 ms" if args.test_timers else "the shipped 1 s / 15 s"
    print(f"idle CPU over {args.seconds:.0f} s, ms per second (timers: {label}; /proc ticks of 10 ms):")
    for name in pids:
        for key, (user, system) in sorted(after[name].items()):
            user0, system0 = before[name].get(key, (0.0, 0.0))
            if user > user0 or system > system0:
                print(
                    f"  {name:10} {key[1]:16} user {1000 * (user - user0) / args.seconds:5.1f}"
                    f"  system {1000 * (system - system0) / args.seconds:5.1f}"
                )


if __name__ == "__main__":
    main()
