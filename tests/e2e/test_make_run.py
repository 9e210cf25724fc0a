"""`make run`'s supervisor (scripts/devrun.py): all five up, Ctrl+C stops them all, a dead child fails it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil

from tests.support.procs import REPO
from tests.support.stack import make_stack


def start_devrun(tmp_path: Path) -> tuple[subprocess.Popen[str], str, dict[str, str]]:
    stack = make_stack(tmp_path)  # free ports and a data directory, nothing started
    proc = subprocess.Popen(
        [sys.executable, "scripts/devrun.py"],
        cwd=REPO,
        env={**os.environ, **stack.env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return proc, stack.http_url, stack.env


def wait_until_up(proc: subprocess.Popen[str], url: str) -> list[str]:
    assert proc.stdout is not None
    seen: list[str] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        assert line, "devrun exited before the system was up:\n" + "".join(seen[-40:])
        seen.append(line)
        if "taskgate is up at" in line:
            assert httpx.get(f"{url}/healthz", timeout=5).status_code == 200
            return seen
    raise AssertionError("not up within 60 s")


def service_children(proc: subprocess.Popen[str]) -> list[psutil.Process]:
    return psutil.Process(proc.pid).children()


def test_ctrl_c_stops_every_process(tmp_path: Path) -> None:
    proc, url, _ = start_devrun(tmp_path)
    try:
        lines = wait_until_up(proc, url)
        children = service_children(proc)
        assert len(children) == 5
        assert any(line.lstrip().startswith("scheduler |") for line in lines), "log lines carry the process name"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
        gone, alive = psutil.wait_procs(children, timeout=10)
        assert not alive
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_dying_child_stops_the_rest_and_fails(tmp_path: Path) -> None:
    proc, url, _ = start_devrun(tmp_path)
    try:
        wait_until_up(proc, url)
        children = service_children(proc)
        victim = next(c for c in children if "services.notifier" in " ".join(c.cmdline()))
        victim.kill()
        assert proc.wait(timeout=60) == 1
        _, alive = psutil.wait_procs(children, timeout=10)
        assert not alive
    finally:
        if proc.poll() is None:
            proc.kill()
