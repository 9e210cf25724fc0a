"""The chaos suite's worker: records every run, so the suite can prove what ran when.

Instructions: ``{"kind": "run"|"ask"|"stubborn", "dir": <folder of this task>, "seconds": N}``.
Each start appends ``start <pid> <starttime> resume=<0|1> earlier_alive=<n>`` to ``runs`` —
``earlier_alive`` counts earlier runs of the task whose process (pid + kernel start time)
still exists: it must be 0, since an old tree is stopped before a task is re-queued.
A run that finishes appends ``done``; an answer received appends a line to ``answers``.
Run by absolute path, so it imports only the SDK.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from libs.worker_sdk import Worker


def start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] == "Z" else fields[19]


def record_start(runs: Path) -> None:
    alive = 0
    if runs.exists():
        for line in runs.read_text().splitlines():
            parts = line.split()
            if parts and parts[0] == "start" and start_time(int(parts[1])) == parts[2]:
                alive += 1
    me = os.getpid()
    resume = os.environ.get("TASKGATE_RESUME", "0")
    with runs.open("a") as out:
        out.write(f"start {me} {start_time(me)} resume={resume} earlier_alive={alive}\n")


def main() -> int:
    w = Worker.from_env()
    spec = json.loads(w.instructions)
    folder = Path(spec["dir"])
    record_start(folder / "runs")
    kind = spec["kind"]
    if kind == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        w.progress("ignoring SIGTERM")
        time.sleep(300)
        return 0
    w.progress("working")
    if kind == "ask":
        answer = w.ask("which way?")
        with (folder / "answers").open("a") as out:
            out.write(f"{answer}\n")
    time.sleep(float(spec.get("seconds", 0)))
    w.result("done")
    with (folder / "runs").open("a") as out:
        out.write("done\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
