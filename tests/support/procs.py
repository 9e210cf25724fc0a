"""Starting real taskgate processes for tests: free ports, health waits, clean stops."""

from __future__ import annotations

import collections
import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from collections.abc import Mapping
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from libs.grpc_client import ClientSecurity, sync_channel
from libs.internal_auth import ensure_secrets
from libs.settings import load_settings

REPO = Path(__file__).resolve().parents[2]


def client_security(env: Mapping[str, str], identity: str = "operator") -> ClientSecurity:
    """The credential of ``identity`` for services started with ``env`` (their secrets directory)."""
    settings = load_settings(env)
    ensure_secrets(settings.secrets_path)
    return ClientSecurity.for_identity(settings, identity)


def channel(addr: str, env: Mapping[str, str], identity: str = "operator") -> grpc.Channel:
    """A sync channel to a service started with ``env``, calling as ``identity``."""
    return sync_channel(addr, client_security(env, identity))


def as_nobody_command(script: Path) -> list[str] | None:
    """A command line the user ``nobody`` can run for ``script``, with this venv's packages; None
    where the tests cannot switch users (not root, no ``nobody``, no interpreter it may run).

    The venv's interpreter may live where ``nobody`` cannot go (here: under /root); a system
    interpreter of the same version loads the venv's site-packages.
    """
    try:
        pwd.getpwnam("nobody")
    except KeyError:
        return None
    if os.geteuid() != 0:
        return None
    site_dir = sysconfig.get_paths()["purelib"]
    # The venv's packages first: a Debian python3-* package (e.g. an old python3-protobuf) in the
    # system interpreter's dist-packages must not shadow them.
    boot = (
        f"import site, sys, runpy; site.addsitedir({site_dir!r}); sys.path.remove({site_dir!r}); "
        f"sys.path.insert(0, {site_dir!r}); runpy.run_path({str(script)!r}, run_name='__main__')"
    )
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (sys.executable, shutil.which(version, path="/usr/bin:/usr/local/bin")):
        if candidate is None:
            continue
        try:
            probe = subprocess.run(
                [candidate, "-c", "import sys; print(sys.version_info[:2])"],
                user="nobody",
                capture_output=True,
                text=True,
                check=False,
                cwd="/",
            )
        except OSError:
            continue
        if probe.returncode == 0 and probe.stdout.strip() == str(tuple(sys.version_info[:2])):
            return [candidate, "-c", boot]
    return None


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


# Ports for services that bind them later come from below the kernel's ephemeral range. One
# picked by binding port 0 and closing is an ephemeral port: any outgoing connection on the
# host (a gRPC channel, the other test worker's) could take it before the service binds it
# ("Failed to bind", about once in 30 benchmark runs). Each pytest-xdist worker draws from a
# slice of its own, and a process does not hand out a port it handed out lately.
_PORTS_BELOW_EPHEMERAL = 12_000
_handed: collections.deque[int] = collections.deque(maxlen=512)
_random = random.Random()  # not the global one: a test that seeds it must not repeat our picks


def free_port() -> int:
    """A port on 127.0.0.1 nobody listens on now, outside the ephemeral range."""
    high = _ephemeral_low()
    low = max(1024, high - _PORTS_BELOW_EPHEMERAL)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    span = (high - low) // workers
    start = low + (int(worker) % workers if worker.isdigit() else 0) * span
    for _ in range(1000):
        port = _random.randrange(start, start + span)
        if port in _handed:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:  # someone listens there (or holds it): another one
                continue
        _handed.append(port)
        return port
    raise RuntimeError(f"no free port in {start}..{start + span - 1}")


def wait_grpc_serving(addr: str, timeout_s: float = 30.0, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    with grpc.insecure_channel(addr) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"process for {addr} exited with {proc.returncode}")
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError as exc:
                last = exc
            time.sleep(0.05)
    raise TimeoutError(f"{addr} not SERVING within {timeout_s}s: {last}")


# Every service's /metrics endpoint is off in tests (their default ports would collide
# across concurrent stacks) unless a test sets TASKGATE_<SERVICE>_METRICS_PORT itself.
METRICS_OFF = {
    f"TASKGATE_{name}_METRICS_PORT": "0" for name in ("SCHEDULER", "PENDING", "TELEMETRY", "NOTIFIER", "GATEWAY")
}


class ServiceProcess:
    """One ``python -m <module>`` child with its own log file."""

    def __init__(self, module: str, env: Mapping[str, str], log_path: Path, addr: str | None = None) -> None:
        self.module = module
        self.env = dict(env)
        self.log_path = log_path
        self.addr = addr
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, wait: bool = True) -> ServiceProcess:
        full_env = {**os.environ, **METRICS_OFF, **self.env, "TASKGATE_LOG_FORMAT": "json"}
        ensure_secrets(load_settings(full_env).secrets_path)  # as `make run` does on first use
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log_file = open(self.log_path, "ab")  # noqa: SIM115 - closed by the child's exit
        self.proc = subprocess.Popen(
            [sys.executable, "-m", self.module],
            cwd=REPO,
            env=full_env,
            stdout=log_file,
            stderr=log_file,
        )
        log_file.close()
        if wait and self.addr:
            wait_grpc_serving(self.addr, proc=self.proc)
        return self

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 20.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
