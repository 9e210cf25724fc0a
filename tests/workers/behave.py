"""A worker whose behaviour is scripted by its instructions (a JSON list of steps).

Used by the tests and benchmarks; run by absolute path, so it imports only the SDK.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from libs.worker_sdk import Worker
from taskgate.scheduler.v1 import scheduler_pb2 as pb


def main() -> int:
    w = Worker.from_env()
    steps = json.loads(w.instructions or "[]")
    for step in steps:
        ((action, arg),) = step.items()
        if action == "progress":
            w.progress(arg)
        elif action == "tool":
            w.tool(arg["name"], arg.get("status", "returned"), arg.get("exit_code"))
        elif action == "touched":
            w.touched(*arg)
        elif action == "usage":
            w.usage(**arg)
        elif action == "result":
            w.result(arg["text"], unresolved_background=arg.get("unresolved_background", False))
        elif action == "print":
            print(arg, flush=True)  # to the attempt's worker log
        elif action == "sleep":
            time.sleep(arg)
        elif action == "sleep_unless_resumed":
            if os.environ.get("TASKGATE_RESUME") != "1":
                time.sleep(arg)
        elif action == "note":
            pass  # carries text (e.g. a skill body's marker) and does nothing
        elif action == "write_assignment":
            a = w.assignment
            Path(arg).write_text(
                json.dumps(
                    {
                        "instructions": a.instructions,
                        "skill_name": a.skill_name,
                        "skill_args": a.skill_args,
                        "cwd": os.getcwd(),
                        "task_id": a.task_id,
                    }
                )
            )
        elif action == "write_file":
            Path(arg["path"]).write_text(arg["text"])  # relative: in the task's workspace
        elif action == "spawn":
            # Starts a sub-task running `steps`; its id is appended to `out` (one per line).
            try:
                child = w.spawn(arg["title"], json.dumps(arg.get("steps", [])), arg.get("profile", ""))
                line = child.task_id
            except Exception as exc:  # the refusal itself is what a test looks at
                line = f"error: {exc}"
            with open(arg["out"], "a") as out:
                out.write(line + "\n")
        elif action == "wait_children":
            ids = [x for x in Path(arg["ids"]).read_text().splitlines() if x and not x.startswith("error")]
            states = [w.wait(i, timeout_s=arg.get("timeout_s", 30)).state for i in ids]
            w.progress("children: " + ",".join(states))
        elif action == "cancel_task":
            # Cancels a sub-task (its id given, or the last line of `ids`); writes the state or the refusal.
            target = arg.get("task_id") or Path(arg["ids"]).read_text().splitlines()[-1]
            try:
                line = w.cancel(target).state
            except Exception as exc:
                line = f"error: {exc}"
            with open(arg["out"], "a") as out:
                out.write(line + "\n")
        elif action == "exit":
            return int(arg)
        elif action == "trap_term":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        elif action == "write_token":
            Path(arg).write_text(dict(w._metadata)["x-taskgate-worker-token"])
        elif action == "write_env":
            Path(arg).write_text(json.dumps(dict(os.environ)))
        elif action == "spy":
            # Tries to read a sibling's environment and open files through /proc.
            pid = Path(arg["pid_file"]).read_text().strip()
            found = []
            for name in ["environ", *(f"fd/{n}" for n in range(64))]:
                try:
                    fd = os.open(f"/proc/{pid}/{name}", os.O_RDONLY | os.O_NONBLOCK)
                    try:
                        found.append(os.read(fd, 4096).decode("utf-8", "replace"))
                    finally:
                        os.close(fd)
                except OSError:
                    pass
            Path(arg["out"]).write_text("\n".join(found))
        elif action == "write_pid":
            Path(arg).write_text(str(os.getpid()))
        elif action == "grandchild":
            # sh forks sleep: a grandchild in the worker's own process group.
            proc = subprocess.Popen(["sh", "-c", f"sleep {arg['seconds']}; :"])
            _wait_for_child_of(proc.pid)
            Path(arg["pid_file"]).write_text(str(proc.pid))
        elif action == "escape":
            # A child in a new session: it leaves the worker's process group.
            proc = subprocess.Popen(["sleep", str(arg["seconds"])], start_new_session=True)
            Path(arg["pid_file"]).write_text(str(proc.pid))
        elif action == "burn":
            end = time.monotonic() + arg
            while time.monotonic() < end:
                pass
        elif action == "ask_nowait":
            # Registers a question without waiting for it (tests of replaced questions).
            w._call(w._stub.AskQuestion, pb.AskQuestionRequest(text=arg), patient=True)
        elif action == "ask":
            answer = w.ask(arg)
            w.progress(f"answer: {answer}")
        else:
            print(f"unknown step {action}", file=sys.stderr)
            return 90
    return 0


def _wait_for_child_of(pid: int, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if Path(f"/proc/{pid}/task/{pid}/children").read_text().strip():
            return
        time.sleep(0.01)


if __name__ == "__main__":
    sys.exit(main())
