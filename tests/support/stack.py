"""The whole taskgate system as separate processes on free ports, for end-to-end tests."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

import grpc
import httpx

from tests.support.postgres import fresh_database
from tests.support.procs import REPO, ServiceProcess, as_nobody_command, channel, free_port, wait_grpc_serving

BEHAVE = REPO / "tests" / "workers" / "behave.py"
HOSTILE = REPO / "tests" / "workers" / "hostile.py"

TEST_CONFIG = """
[tasks]
max_running = {max_running}
cancel_grace_ms = {cancel_grace_ms}
cleanup_confirm_ms = 1500
supervisor_interval_ms = {supervisor_interval_ms}
observation_interval_ms = {observation_interval_ms}
progress_stale_limit_ms = {progress_stale_limit_ms}
max_duration_ms = {max_duration_ms}
background_grace_ms = {background_grace_ms}
idle_timeout_ms = {idle_timeout_ms}
project_root = "{project_root}"
max_subtask_depth = 2
max_subtasks_per_task = 2

[workers.default-worker]
command = ["python", "-m", "examples.workers.demo"]

[workers.behave]
command = ["python", "{behave}"]
uses_sdk = true

[workers.behave-codex]
command = ["python", "{behave}"]
harness = "codex"
harness_model = "gpt-x"

[workers.worktree]
command = ["python", "{behave}"]
workspace_policy = "isolated-worktree"

[workers.worktree-nogit]
command = ["python", "{behave}"]
workspace_policy = "isolated-worktree"
project_root = "{plain_dir}"

[skills.review]
profile = "behave"
instructions_file = "{skill_file}"
cli = true
args_schema = {{ target = {{ type = "string", required = true }}, depth = {{ type = "integer" }} }}

[targets.remote]
adapter = "http"
url = "http://127.0.0.1:{target_port}/dispatch"
secret = "{target_secret}"
display_name = "Remote agent"
options = {{ tier = "default" }}
dispatch_timeout_ms = 3000

[targets.polled]
url = "http://127.0.0.1:{target_port}/dispatch"
secret = "{target_secret}"
poll_interval_ms = 200

[targets.guarded]
url = "http://127.0.0.1:{target_port}/dispatch"
secret = "{target_secret}"
safemode = true

[workers.hostile]
{hostile_profile}

[workers.exit-at-once]
command = ["python", "-c", "pass"]

[workers.sleeper]
command = ["sleep", "300"]

[workers.true]
command = ["/bin/true"]

[agents.agent-off]
orchestration_enabled = false
"""

SERVICES = [
    ("scheduler", "services.scheduler", "TASKGATE_SCHEDULER_ADDR"),
    ("pending", "services.pending_registry", "TASKGATE_PENDING_ADDR"),
    ("telemetry", "services.telemetry_agent", "TASKGATE_TELEMETRY_ADDR"),
    ("notifier", "services.notifier", "TASKGATE_NOTIFIER_ADDR"),
]


def worker_socket_dir() -> str:
    """A short folder for a scheduler's worker sockets (a Unix socket path is limited to 107
    bytes, so not under the test's data dir), removed when the test run ends: a stack may be
    stopped and started again, so not at its stop."""
    path = tempfile.mkdtemp(prefix="tg-workers-")
    atexit.register(shutil.rmtree, path, True)
    return path


@dataclass
class Stack:
    data_dir: Path
    env: dict[str, str]
    http_url: str
    procs: dict[str, ServiceProcess] = field(default_factory=dict)
    # Where the services' logs go (default: <data_dir>/logs); elsewhere when the data dir's disk fills.
    log_dir: Path | None = None
    # Extra scheduler replicas on the same database (see ``add_scheduler_replicas``): name -> env.
    replicas: dict[str, dict[str, str]] = field(default_factory=dict)
    # Where the gateway-managed target `remote` is expected to listen (a test's local server).
    target_port: int = 0

    def addr(self, name: str) -> str:
        return self.env[dict((n, e) for n, _, e in SERVICES)[name]]

    def metrics_url(self, name: str) -> str:
        """A service's /metrics (the stack was made with ``metrics=True``)."""
        return f"http://127.0.0.1:{self.env[METRICS_PORTS[name]]}/metrics"

    def channel(self, name: str, identity: str = "operator") -> grpc.Channel:
        """A sync gRPC channel to one service, calling as ``identity`` (operator: the local admin)."""
        return channel(self.addr(name), self.env, identity)

    @property
    def worker_addr(self) -> str:
        """The worker API (a Unix socket) that workers running as this uid get."""
        return f"unix:{self.env['TASKGATE_WORKER_SOCKET_DIR']}/{os.getuid()}/worker.sock"

    def use_postgresql(self, postgres_url: str, prefix: str = "") -> Stack:
        """Every service that keeps a database gets a fresh one on the cluster at ``postgres_url``."""
        for service in ("scheduler", "pending", "notifier", "gateway"):
            self.env[f"TASKGATE_{service.upper()}_DB_URL"] = fresh_database(postgres_url, f"{prefix}{service}")
        return self

    def add_scheduler_replicas(self, count: int, lease_ms: int | None = None, grace_ms: int | None = None) -> list[str]:
        """``count`` more scheduler processes on the scheduler's (PostgreSQL) database, each with its
        own data dir (so its own default host id), port and worker sockets; the gateway and the
        notifier keep talking to the first one. They share the one telemetry agent of this machine.
        Returns their names ("scheduler-1", ...); ``start`` starts them with the rest."""
        assert "TASKGATE_SCHEDULER_DB_URL" in self.env, "replicas need the scheduler on PostgreSQL"
        if lease_ms is not None:
            self.env["TASKGATE_TASKS_LEASE_MS"] = str(lease_ms)
        if grace_ms is not None:
            self.env["TASKGATE_TASKS_HOST_LOST_GRACE_MS"] = str(grace_ms)
        names = []
        for i in range(len(self.replicas) + 1, len(self.replicas) + 1 + count):
            name = f"scheduler-{i}"
            self.replicas[name] = {
                **self.env,
                "TASKGATE_DATA_DIR": str(self.data_dir / f"replica-{i}"),
                # One set of caller secrets for the whole system.
                "TASKGATE_SECRETS_DIR": str((self.data_dir / "secrets").resolve()),
                "TASKGATE_SCHEDULER_ADDR": f"127.0.0.1:{free_port()}",
                "TASKGATE_WORKER_SOCKET_DIR": worker_socket_dir(),
            }
            names.append(name)
        return names

    def scheduler_names(self) -> list[str]:
        return ["scheduler", *self.replicas]

    def scheduler_channel(self, name: str, identity: str = "operator") -> grpc.Channel:
        """A sync channel to one scheduler replica ("scheduler" is the first)."""
        env = self.replicas.get(name, self.env)
        return channel(env["TASKGATE_SCHEDULER_ADDR"], self.env, identity)

    def replica_process(self, name: str) -> ServiceProcess:
        """A (not yet started) process for replica ``name``, e.g. to restart it after a kill."""
        env = self.replicas.get(name, self.env)
        logs = self.log_dir or self.data_dir / "logs"
        return ServiceProcess("services.scheduler", env, logs / f"{name}.log", env["TASKGATE_SCHEDULER_ADDR"])

    def start(self) -> Stack:
        """Start every service and wait until the stack is healthy. A start that fails prints
        the services' logs (pytest shows them with the failure) and stops what it started: a
        caller (a benchmark) that only stops a stack it got back would otherwise leave the
        services that did come up running."""
        logs = self.log_dir or self.data_dir / "logs"
        try:
            for name, module, env_name in SERVICES:
                self.procs[name] = ServiceProcess(module, self.env, logs / f"{name}.log", self.env[env_name]).start(
                    wait=False
                )
            for name in self.replicas:
                self.procs[name] = self.replica_process(name).start(wait=False)
            self.procs["gateway"] = ServiceProcess("gateway_http", self.env, logs / "gateway.log")
            self.procs["gateway"].start(wait=False)
            self.wait_healthy()
        except BaseException:
            print(self.logs())
            self.stop()
            raise
        return self

    def wait_healthy(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        last: Any = None
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.proc is not None and proc.proc.poll() is not None:
                    raise RuntimeError(f"{name} exited early:\n{proc.logs()[-3000:]}")
            try:
                last = httpx.get(f"{self.http_url}/healthz", timeout=2)
                # 200 already when only an advisory backend (telemetry) is missing: wait for all.
                if last.status_code == 200 and last.json().get("status") == "ok":
                    return
            except httpx.HTTPError as exc:
                last = exc
            time.sleep(0.1)
        raise TimeoutError(f"stack not healthy: {last}")

    def wait_replicas_serving(self) -> None:
        for name in self.replicas:
            wait_grpc_serving(self.replicas[name]["TASKGATE_SCHEDULER_ADDR"], proc=self.procs[name].proc)

    def stop(self) -> None:
        for proc in reversed(list(self.procs.values())):
            proc.stop()

    def logs(self) -> str:
        return "\n".join(f"--- {n}\n{p.logs()[-4000:]}" for n, p in self.procs.items())


def start_fresh(make: Callable[[int], Stack], attempts: int = 3) -> Stack:
    """``make(attempt)``'s stack, started. Its ports are picked free before the services bind
    them, and a test's own servers take ports too: a start that fails with "address already in
    use" is tried again with a fresh stack (new ports), at most ``attempts`` times."""
    for attempt in range(attempts):
        try:
            return make(attempt).start()
        except RuntimeError as exc:
            if "address already in use" not in str(exc) or attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


def hostile_profile() -> str:
    """The hostile worker runs as ``nobody`` where the tests can switch users (the isolated mode)."""
    command = as_nobody_command(HOSTILE)
    if command is None:
        return f'command = ["python", "{HOSTILE}"]'
    return f'command = {json.dumps(command)}\nuser = "nobody"'


METRICS_PORTS = {
    "scheduler": "TASKGATE_SCHEDULER_METRICS_PORT",
    "pending": "TASKGATE_PENDING_METRICS_PORT",
    "telemetry": "TASKGATE_TELEMETRY_METRICS_PORT",
    "notifier": "TASKGATE_NOTIFIER_METRICS_PORT",
    "gateway": "TASKGATE_GATEWAY_METRICS_PORT",
}


# A skill's body: steps for the behave worker, with a marker that must never leave the scheduler.
SKILL_BODY_MARKER = "SKILL-BODY-7f3a9c-never-shown"
TARGET_SECRET = "target-secret-0123456789"


def git_project(path: Path) -> Path:
    """A Git repository with one commit (the isolated-worktree profiles' project)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "README.md").write_text("project\n")
    git = ["git", "-c", "user.name=taskgate", "-c", "user.email=t@example.invalid", "-C", str(path)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "README.md"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "init"], check=True)
    return path


def plain_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def skill_file(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    # The worker writes what it was assigned next to the body (a test reads it).
    out = path.parent / "assigned.json"
    path.write_text(json.dumps([{"note": SKILL_BODY_MARKER}, {"write_assignment": str(out)}]))
    return path


class StackTasks(TypedDict, total=False):
    """Some of the ``[tasks]`` settings ``make_stack`` takes as keywords, for a caller that keeps
    them in a dict (``**`` of a plain ``dict[str, int]`` could be ``metrics`` or ``extra_config``
    for all a type checker knows)."""

    max_running: int
    cancel_grace_ms: int
    supervisor_interval_ms: int
    observation_interval_ms: int


def make_stack(data_dir: Path, metrics: bool = False, extra_config: str = "", **tasks: int) -> Stack:
    """A stack in ``data_dir``; ``metrics`` gives every service a /metrics port (off otherwise);
    ``extra_config`` is appended to its configuration file."""
    settings = {
        "max_running": 4,
        "cancel_grace_ms": 1000,
        "progress_stale_limit_ms": 0,
        "max_duration_ms": 0,
        "background_grace_ms": 900000,
        "idle_timeout_ms": 300000,
        # Ten and seventy-five times faster than the shipped defaults: tests see timers act soon.
        "supervisor_interval_ms": 100,
        "observation_interval_ms": 200,
        **tasks,
    }
    data_dir.mkdir(parents=True, exist_ok=True)
    target_port = free_port()
    config = data_dir / "taskgate.toml"
    config.write_text(
        TEST_CONFIG.format(
            behave=BEHAVE,
            hostile_profile=hostile_profile(),
            project_root=git_project(data_dir / "project"),
            plain_dir=plain_dir(data_dir / "plain"),
            skill_file=skill_file(data_dir / "skills" / "review.json"),
            target_port=target_port,
            target_secret=TARGET_SECRET,
            **settings,
        )
        + extra_config
    )
    http_port = free_port()
    env = {
        "TASKGATE_CONFIG": str(config),
        "TASKGATE_DATA_DIR": str(data_dir),
        "TASKGATE_HTTP_ADDR": f"127.0.0.1:{http_port}",
        # Short: a Unix socket path is limited to 107 bytes.
        "TASKGATE_WORKER_SOCKET_DIR": worker_socket_dir(),
    }
    for _, _, env_name in SERVICES:
        env[env_name] = f"127.0.0.1:{free_port()}"
    # Off unless asked: `make run` from this env (test_make_run) would take the default ports.
    env.update({env_name: str(free_port()) if metrics else "0" for env_name in METRICS_PORTS.values()})
    return Stack(data_dir=data_dir, env=env, http_url=f"http://127.0.0.1:{http_port}", target_port=target_port)
