"""The scheduler reaps children it does not know (a worker's orphans) — but never the exit
status of a helper command it awaits itself (git for worktrees, a container engine's CLI)."""

from __future__ import annotations

import os
import subprocess
import time

from libs import proctree
from services.scheduler import helper_children
from services.scheduler.ownership import Ownership


def zombie(pid: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        stat = proctree.process_table().get(pid)
        if stat is not None and not stat.alive:
            return
        assert time.monotonic() < deadline, "the child did not exit"
        time.sleep(0.01)


def test_a_helper_s_exit_status_stays_with_its_waiter_and_an_unknown_child_is_reaped() -> None:
    ownership = Ownership(proctree.process_table, set, reap_unknown=True)
    with helper_children.running():
        helper = subprocess.Popen(["sh", "-c", "exit 3"])
        zombie(helper.pid)
        ownership.reap(proctree.process_table())
        assert helper.wait(timeout=10) == 3, "the helper's status was not stolen"
    unknown = subprocess.Popen(["sh", "-c", "exit 4"])
    zombie(unknown.pid)
    ownership.reap(proctree.process_table())
    try:
        os.waitpid(unknown.pid, os.WNOHANG)
        raise AssertionError("an unknown child's zombie is reaped by the scheduler")
    except ChildProcessError:
        pass
