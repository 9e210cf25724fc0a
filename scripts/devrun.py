"""`make run`: start all five taskgate processes, prefix their logs, keep them up.

A second run on the same data directory exits 1 before starting anything.
A service that dies is restarted after a backoff (0.25 s, doubling, at most 4 s;
back to 0.25 s once it has stayed up for 30 s), with a log line each time. A
service that dies 5 times within 60 s keeps dying: everything is stopped and
`make run` exits 1. Ctrl+C or SIGTERM stops every child (SIGTERM first, SIGKILL
after a grace) and exits 0.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from libs.internal_auth import ensure_secrets
from libs.settings import SettingsError, load_settings
from libs.startup import FolderInUse, hold_data_dir

REPO = Path(__file__).resolve().parent.parent
PROCESSES = [
    ("scheduler", "services.scheduler"),
    ("pending", "services.pending_registry"),
    ("telemetry", "services.telemetry_agent"),
    ("notifier", "services.notifier"),
    ("gateway", "gateway_http"),
]
COLORS = ["36", "35", "33", "32", "34"]
STOP_GRACE_S = 15.0
BACKOFF_INITIAL_S = 0.25
BACKOFF_MAX_S = 4.0
STABLE_AFTER_S = 30.0
GIVE_UP_DEATHS = 5
GIVE_UP_WINDOW_S = 60.0
_print_lock = threading.Lock()


def _say(text: str) -> None:
    with _print_lock:
        print(f"taskgate: {text}", file=sys.stderr, flush=True)


def _pump(name: str, color: str, stream: object) -> None:
    tty = sys.stdout.isatty()
    label = f"\033[{color}m{name:>9}\033[0m |" if tty else f"{name:>9} |"
    for raw in iter(stream.readline, b""):  # type: ignore[attr-defined]
        with _print_lock:
            sys.stdout.write(f"{label} {raw.decode(errors='replace').rstrip()}\n")
            sys.stdout.flush()


@dataclass
class Child:
    """One supervised service: its process, its restart schedule and its recent deaths."""

    name: str
    module: str
    color: str
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    restart_at: float | None = None
    backoff_s: float = BACKOFF_INITIAL_S
    deaths: deque[float] = field(default_factory=deque)

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", self.module],
            cwd=REPO,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl+C reaches us only; we stop the children in order
        )
        self.started_at = time.monotonic()
        self.restart_at = None
        threading.Thread(target=_pump, args=(self.name, self.color, self.proc.stdout), daemon=True).start()

    def check(self, now: float) -> bool:
        """Restart when due; False once it keeps dying."""
        if self.restart_at is not None:
            if now >= self.restart_at:
                _say(f"restarting {self.name}")
                self.start()
            return True
        if self.proc is None or self.proc.poll() is None:
            return True
        if now - self.started_at >= STABLE_AFTER_S:
            self.backoff_s = BACKOFF_INITIAL_S
        self.deaths.append(now)
        while self.deaths and now - self.deaths[0] > GIVE_UP_WINDOW_S:
            self.deaths.popleft()
        if len(self.deaths) >= GIVE_UP_DEATHS:
            _say(f"{self.name} died {len(self.deaths)} times within {GIVE_UP_WINDOW_S:.0f} s; stopping everything")
            return False
        _say(f"{self.name} exited with code {self.proc.returncode}; restarting in {self.backoff_s:.2f} s")
        self.restart_at = now + self.backoff_s
        self.backoff_s = min(self.backoff_s * 2, BACKOFF_MAX_S)
        return True

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def wait(self, deadline: float) -> None:
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _say(f"{self.name} did not stop in {STOP_GRACE_S:.0f}s; killing it")
            self.proc.kill()
            self.proc.wait()


def main() -> int:
    env = dict(os.environ)
    env.setdefault("TASKGATE_DATA_DIR", str(REPO / "var"))
    env.setdefault("TASKGATE_LOG_FORMAT", "console")
    Path(env["TASKGATE_DATA_DIR"]).mkdir(parents=True, exist_ok=True)
    try:
        settings = load_settings(env)
    except SettingsError as exc:
        _say(str(exc))
        return 2
    # A second `make run` on the same data directory would start services that each refuse it
    # (see hold_data_dir) and restart them until it gives up: say so once, before starting any.
    try:
        hold_data_dir(settings.data_dir, "run")
    except FolderInUse as exc:
        _say(
            f"`make run` is already running on {settings.data_dir} (pid {exc.holder}): stop it first, "
            "or give this one another TASKGATE_DATA_DIR"
        )
        return 1
    # The internal gRPC caller secrets, made once (0600) and reused on every run.
    created = ensure_secrets(settings.secrets_path)
    if created:
        _say(f"created internal caller secrets for {', '.join(created)} in {settings.secrets_path}")
    http_addr = env.get("TASKGATE_HTTP_ADDR", "127.0.0.1:8080")
    stopping = threading.Event()

    def request_stop(signum: int, _frame: object) -> None:
        stopping.set()

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)

    children = [Child(name, module, color, env) for (name, module), color in zip(PROCESSES, COLORS, strict=True)]
    for child in children:
        child.start()

    url = f"http://{http_addr}"
    ready = False
    exit_code = 0
    deadline = time.monotonic() + 60
    while not stopping.is_set():
        now = time.monotonic()
        if not all(child.check(now) for child in children):
            exit_code = 1
            break
        if not ready:
            try:
                ready = httpx.get(f"{url}/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                ready = False
            if ready:
                print(
                    f"\ntaskgate is up at {url}  (Ctrl+C stops everything)\n"
                    "Create an API key and a membership, then call the API:\n"
                    "  .venv/bin/taskgate admin keys create --principal me --agent agent-1\n"
                    "  .venv/bin/taskgate admin members add --agent agent-1 --session cli-1 --principal me\n"
                    "  curl -H 'Authorization: Bearer <key>' -H 'Content-Type: application/json' \\\n"
                    f'       -d \'{{"title":"hello"}}\' {url}/api/v1/agents/agent-1/sessions/cli-1/tasks\n',
                    flush=True,
                )
            elif time.monotonic() > deadline:
                _say("/healthz did not reach 200 within 60 s; still waiting")
                deadline = float("inf")
        time.sleep(0.2)

    for child in reversed(children):
        child.stop()
    end = time.monotonic() + STOP_GRACE_S
    for child in children:
        child.wait(end)
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
