"""`make run`: start all five taskgate processes, prefix their logs, stop them together.

Exits non-zero as soon as one child dies; Ctrl+C or SIGTERM stops every child
(SIGTERM first, SIGKILL after a grace).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from libs.internal_auth import ensure_secrets
from libs.settings import SettingsError, load_settings

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
_print_lock = threading.Lock()


def _pump(name: str, color: str, stream: object) -> None:
    tty = sys.stdout.isatty()
    label = f"\033[{color}m{name:>9}\033[0m |" if tty else f"{name:>9} |"
    for raw in iter(stream.readline, b""):  # type: ignore[attr-defined]
        with _print_lock:
            sys.stdout.write(f"{label} {raw.decode(errors='replace').rstrip()}\n")
            sys.stdout.flush()


def main() -> int:
    env = dict(os.environ)
    env.setdefault("TASKGATE_DATA_DIR", str(REPO / "var"))
    env.setdefault("TASKGATE_LOG_FORMAT", "console")
    Path(env["TASKGATE_DATA_DIR"]).mkdir(parents=True, exist_ok=True)
    try:
        settings = load_settings(env)
    except SettingsError as exc:
        print(f"taskgate: {exc}", file=sys.stderr)
        return 2
    # The internal gRPC caller secrets, made once (0600) and reused on every run.
    created = ensure_secrets(settings.secrets_path)
    if created:
        print(f"taskgate: created internal caller secrets for {', '.join(created)} in {settings.secrets_path}")
    http_addr = env.get("TASKGATE_HTTP_ADDR", "127.0.0.1:8080")
    children: list[tuple[str, subprocess.Popen[bytes]]] = []
    stopping = threading.Event()

    def request_stop(signum: int, _frame: object) -> None:
        stopping.set()

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)

    for (name, module), color in zip(PROCESSES, COLORS, strict=True):
        proc = subprocess.Popen(
            [sys.executable, "-m", module],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl+C reaches us only; we stop the children in order
        )
        children.append((name, proc))
        threading.Thread(target=_pump, args=(name, color, proc.stdout), daemon=True).start()

    url = f"http://{http_addr}"
    ready = False
    exit_code = 0
    deadline = time.monotonic() + 60
    while not stopping.is_set():
        dead = [(n, p.returncode) for n, p in children if p.poll() is not None]
        if dead:
            for name, code in dead:
                print(f"taskgate: {name} exited with code {code}; stopping the others", file=sys.stderr)
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
                print("taskgate: /healthz did not reach 200 within 60 s; still waiting", file=sys.stderr)
                deadline = float("inf")
        time.sleep(0.2)

    for _, proc in reversed(children):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    end = time.monotonic() + STOP_GRACE_S
    for name, proc in children:
        try:
            proc.wait(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            print(f"taskgate: {name} did not stop in {STOP_GRACE_S:.0f}s; killing it", file=sys.stderr)
            proc.kill()
            proc.wait()
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
