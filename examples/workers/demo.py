"""The demo worker: reports a little progress and a result built from its instructions."""

from __future__ import annotations

import time

from libs.worker_sdk import Worker


def main() -> None:
    w = Worker.from_env()
    steps = ["reading the instructions", "doing the work", "writing the result"]
    for i, step in enumerate(steps, 1):
        w.progress(f"step {i}/{len(steps)}: {step}")
        w.tool("think", "returned")
        time.sleep(0.2)
    words = len(w.instructions.split())
    w.result(f"Done: {w.assignment.title!r} ({words} words of instructions).")


if __name__ == "__main__":
    main()
