"""One running taskgate (five processes) shared by the end-to-end tests of a session."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import httpx
import pytest

from taskgate.scheduler.v1 import scheduler_pb2 as pb
from taskgate.scheduler.v1 import scheduler_pb2_grpc as pb_grpc
from tests.support.procs import REPO
from tests.support.stack import Stack, make_stack

AGENT = "agent-1"
SESSION = "cli-e2e"
TERMINAL = {"completed", "failed", "cancelled"}


def run_cli(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway_http.cli.main", *args],
        cwd=REPO,
        env={**os.environ, **stack.env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def create_key(stack: Stack, principal: str, *agents: str) -> str:
    args = ["admin", "keys", "create", "--principal", principal]
    for agent in agents:
        args += ["--agent", agent]
    result = run_cli(stack, *args)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]


def add_member(stack: Stack, agent: str, session: str, principal: str) -> None:
    add_members(stack, agent, [session], principal)


def add_members(stack: Stack, agent: str, sessions: Sequence[str], principal: str) -> None:
    """``principal`` into each of ``sessions`` with one CLI run (each run starts a Python)."""
    args = ["admin", "members", "add", "--agent", agent, "--principal", principal]
    for session in sessions:
        args += ["--session", session]
    result = run_cli(stack, *args)
    assert result.returncode == 0, result.stderr


@dataclass
class Api:
    stack: Stack
    key: str
    agent: str = AGENT
    session: str = SESSION

    @property
    def base(self) -> str:
        return f"{self.stack.http_url}/api/v1/agents/{self.agent}/sessions/{self.session}"

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.key}", **kwargs.pop("headers", {})}
        return httpx.request(method, self.base + path, headers=headers, timeout=30, **kwargs)

    def create(
        self, title: str = "task", profile: str | None = None, instructions: str = "", **extra: Any
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"title": title, "instructions": instructions, **extra}
        if profile:
            body["profile"] = profile
        response = self.request("POST", "/tasks", json=body)
        assert response.status_code == 201, response.text
        return response.json()["task"]  # type: ignore[no-any-return]

    def get(self, task_id: str) -> dict[str, Any]:
        response = self.request("GET", f"/tasks/{task_id}")
        assert response.status_code == 200, response.text
        return response.json()["task"]  # type: ignore[no-any-return]

    def wait_for(self, task_id: str, done: Callable[[pb.Task], bool], timeout_s: float = 30.0) -> dict[str, Any]:
        """Follow the scheduler's WatchTasks stream (no polling) until ``done``; return the REST snapshot."""
        with self.stack.channel("scheduler") as channel:
            stream = pb_grpc.SchedulerServiceStub(channel).WatchTasks(
                pb.WatchTasksRequest(task_id=task_id), timeout=timeout_s
            )
            try:
                for event in stream:
                    if done(event.task):
                        break
            except grpc.RpcError as exc:
                raise AssertionError(f"task {task_id} did not get there: {exc}\n{self.get(task_id)}") from exc
            finally:
                stream.cancel()
        return self.get(task_id)

    def wait_state(self, task_id: str, *states: str, timeout_s: float = 30.0) -> dict[str, Any]:
        names = {getattr(pb, f"TASK_STATE_{s.upper()}") for s in states}
        return self.wait_for(task_id, lambda t: t.state in names, timeout_s)


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = make_stack(tmp_path_factory.mktemp("stack"), metrics=True).start()
    yield s
    s.stop()


@pytest.fixture(scope="session")
def api(stack: Stack) -> Api:
    key = create_key(stack, "alice", AGENT, "agent-off")
    add_member(stack, AGENT, SESSION, "alice")
    add_member(stack, "agent-off", SESSION, "alice")
    return Api(stack, key)


def wait_pid_file(path: Any, timeout_s: float = 15.0) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return int(path.read_text())
        time.sleep(0.02)
    raise AssertionError(f"{path} was not written")
