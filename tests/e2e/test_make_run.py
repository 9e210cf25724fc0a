"""`make run`'s supervisor (scripts/devrun.py): all five up, Ctrl+C stops them all, a dead
child is restarted, one that keeps dying fails it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil

from libs.internal_auth import ensure_secrets
from tests.support.procs import REPO, wait_grpc_serving
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


def kill_tree(proc: subprocess.Popen[str]) -> None:
    """A failed test must not leave devrun's services running (they would outlive it)."""
    if proc.poll() is not None:
        return
    children = psutil.Process(proc.pid).children(recursive=True)
    proc.kill()
    proc.wait()
    for child in children:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass


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
        kill_tree(proc)


def _is_notifier(process: psutil.Process) -> bool:
    try:
        return "services.notifier" in " ".join(process.cmdline())
    except psutil.Error:  # already exited, not yet reaped
        return False


def _notifier(children: list[psutil.Process]) -> psutil.Process:
    return next(c for c in children if _is_notifier(c))


def test_a_dead_child_is_restarted_and_one_that_keeps_dying_fails_it(tmp_path: Path) -> None:
    proc, url, _ = start_devrun(tmp_path)
    try:
        wait_until_up(proc, url)
        victim = _notifier(service_children(proc))
        victim.kill()
        deadline = time.monotonic() + 30
        while True:  # a new notifier process, and the system healthy again
            assert proc.poll() is None, "devrun gave up after one death"
            children = service_children(proc)
            # psutil compares processes by pid and start time: a restart given the victim's pid
            # again (pids wrap at 32,768 here) is still a new notifier.
            fresh = [c for c in children if _is_notifier(c) and c != victim]
            healthy = httpx.get(f"{url}/healthz", timeout=5).status_code == 200
            if fresh and healthy and len(children) == 5:
                break
            assert time.monotonic() < deadline, "the notifier was not restarted"
            time.sleep(0.2)
        # Now it keeps dying: killed as soon as it is back, five times within the minute.
        killed = {victim}
        others = [c for c in service_children(proc) if not _is_notifier(c)]
        deadline = time.monotonic() + 60
        while proc.poll() is None:
            assert time.monotonic() < deadline, "devrun did not give up on a service that keeps dying"
            for child in service_children(proc):
                if _is_notifier(child) and child not in killed:
                    killed.add(child)
                    child.kill()
            time.sleep(0.05)
        assert proc.wait(timeout=60) == 1
        assert len(killed) == 5
        _, alive = psutil.wait_procs(others, timeout=10)
        assert not alive, "the other services were stopped too"
    finally:
        kill_tree(proc)


def test_a_service_whose_output_is_gone_still_stops_on_sigterm(tmp_path: Path) -> None:
    """Its supervisor died (stdout is a pipe nobody reads): SIGTERM must still stop it."""
    stack = make_stack(tmp_path)
    env = {**os.environ, **stack.env, "TASKGATE_LOG_FORMAT": "json"}
    ensure_secrets(tmp_path / "secrets")
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.telemetry_agent"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline(), "the service said nothing"
        wait_grpc_serving(stack.addr("telemetry"), proc=proc)
        proc.stdout.close()  # as when the supervisor is killed
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            raise AssertionError("the service ignored SIGTERM once its output was gone")


def test_a_second_run_on_the_same_data_dir_exits_at_once_and_the_first_runs_on(tmp_path: Path) -> None:
    proc, url, env = start_devrun(tmp_path)
    try:
        wait_until_up(proc, url)
        second = subprocess.run(
            [sys.executable, "scripts/devrun.py"],
            cwd=REPO,
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert second.returncode == 1, second.stderr
        assert f"`make run` is already running on {env['TASKGATE_DATA_DIR']} (pid {proc.pid})" in second.stderr
        assert "scheduler |" not in second.stdout, "the second run started services"
        assert len(service_children(proc)) == 5
        assert httpx.get(f"{url}/healthz", timeout=5).status_code == 200
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
    finally:
        kill_tree(proc)
