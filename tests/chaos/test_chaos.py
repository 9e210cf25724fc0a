"""Chaos: SIGKILL each service in turn with tasks running, waiting for an answer,
cancelling and queued; SIGTERM the whole stack; fill the data directory's disk.

Run with ``make chaos`` (SQLite and PostgreSQL). Each round uses its own session:

- two tasks running (``run``), one waiting for an answer (``ask``), one cancelling
  (``stubborn``: ignores SIGTERM, so it is ``cancel_requested`` for the cancel grace),
  two queued behind them (``max_running = 4``);
- the round's victim is killed with SIGKILL (or the whole stack gets SIGTERM) and started again;
- the question is answered over REST; every task must end.

Then, per round: no task lost or duplicated (the session lists exactly the created tasks,
each run to its end once), an old process tree is gone before its task runs again (the
worker checks its earlier runs' pid + start time), resume counts and revisions are exact,
the one answer arrives once, each ending and question is notified once (distinct
``Idempotency-Key`` s at the webhook receiver) and every SSE client reconnects and
catches up with every notification. Figures are printed at the end.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Api, add_member, add_members, run_cli
from tests.e2e.test_notifier import Receiver, start_receiver
from tests.support.stack import Stack, make_stack

WORKER = Path(__file__).resolve().parent / "worker.py"
AGENT = "agent-chaos"
SECRET = "chaos-webhook-secret"
VICTIMS = ["scheduler", "pending", "notifier", "telemetry", "gateway"]
ROUNDS = [*VICTIMS, "sigterm-all"]
if os.environ.get("CHAOS_ROUNDS"):
    ROUNDS = os.environ["CHAOS_ROUNDS"].split(",")
TERMINAL = {"completed", "failed", "cancelled", "needs_reconciliation"}

CHAOS_CONFIG = """
[workers.chaos]
command = ["python", "{worker}"]
uses_sdk = true

[notifier]
sse_heartbeat_ms = 500
retry_initial_ms = 300
retry_max_ms = 2000
delivery_timeout_ms = 2000

[channels.hook]
kind = "webhook"
url = "http://127.0.0.1:{port}/hook"
secret = "{secret}"

[agents.{agent}]
channel = "hook"
"""

FIGURES: dict[str, Counter[str]] = {}


# --- SSE clients that reconnect with Last-Event-ID ------------------------------------------


@dataclass
class SseFollower:
    """Follows a session's activity stream on a thread; reconnects (Last-Event-ID) when cut."""

    api: Api
    notifications: list[str] = field(default_factory=list)
    last_id: str | None = None
    connects: int = 0
    stop_flag: threading.Event = field(default_factory=threading.Event)

    def start(self) -> SseFollower:
        threading.Thread(target=self._run, daemon=True).start()
        return self

    def _run(self) -> None:
        while not self.stop_flag.is_set():
            headers = {"Authorization": f"Bearer {self.api.key}", "Accept": "text/event-stream"}
            if self.last_id:
                headers["Last-Event-ID"] = self.last_id
            try:
                with httpx.stream(
                    "GET", self.api.base + "/activity/stream", headers=headers, timeout=httpx.Timeout(10, read=5)
                ) as response:
                    if response.status_code != 200:
                        time.sleep(0.2)
                        continue
                    self.connects += 1
                    self._read(response)
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.2)

    def _read(self, response: httpx.Response) -> None:
        event: dict[str, str] = {}
        for line in response.iter_lines():
            if self.stop_flag.is_set():
                return
            if line.startswith(":"):
                continue
            if line == "":
                if event.get("event") == "notification" and "data" in event:
                    self.notifications.append(json.loads(event["data"])["notificationId"])
                if event.get("id"):
                    self.last_id = event["id"]
                event = {}
            else:
                name, _, value = line.partition(":")
                event[name] = value.removeprefix(" ")

    def stop(self) -> None:
        self.stop_flag.set()


# --- the stack ------------------------------------------------------------------------------


@dataclass
class Chaos:
    stack: Stack
    receiver: Receiver
    key: str
    base: Path
    figures: Counter[str] = field(default_factory=Counter)

    def api(self, session: str) -> Api:
        return Api(self.stack, self.key, agent=AGENT, session=session)


def configure(stack: Stack, receiver: Receiver) -> None:
    config = Path(stack.env["TASKGATE_CONFIG"])
    text = config.read_text().replace("cancel_grace_ms = 1000", "cancel_grace_ms = 2000")
    config.write_text(text + CHAOS_CONFIG.format(worker=WORKER, port=receiver.port, secret=SECRET, agent=AGENT))


@pytest.fixture(params=["sqlite", "postgresql"])
def chaos(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Chaos]:
    receiver, server = start_receiver()
    stack = make_stack(tmp_path / "stack")
    configure(stack, receiver)
    if request.param == "postgresql":
        stack.use_postgresql(request.getfixturevalue("postgres_url"), prefix="chaos_")
    try:
        stack.start()
        result = run_cli(stack, "admin", "keys", "create", "--principal", "chaos", "--agent", AGENT)
        assert result.returncode == 0, result.stderr
        key = result.stdout.strip().splitlines()[-1]
        add_members(stack, AGENT, [f"round-{victim}" for victim in ROUNDS], "chaos")
        c = Chaos(stack, receiver, key, tmp_path / "work")
        FIGURES[request.param] = c.figures
        yield c
    except Exception:
        print(stack.logs())
        raise
    finally:
        stack.stop()
        server.shutdown()


# --- one round ------------------------------------------------------------------------------


def create(api: Api, folder: Path, kind: str, seconds: float = 0) -> str:
    folder.mkdir(parents=True)
    spec = {"kind": kind, "dir": str(folder), "seconds": seconds}
    return str(api.create(f"{kind} {folder.name}", profile="chaos", instructions=json.dumps(spec))["taskId"])


def poll(api: Api, task_id: str, done: Any, timeout_s: float = 60, what: str = "") -> dict[str, Any]:
    """The task's REST snapshot once ``done(snapshot)``; tolerates the edge being down meanwhile."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            response = api.request("GET", f"/tasks/{task_id}")
            if response.status_code == 200:
                last = response.json()["task"]
                if done(last):
                    return last  # type: ignore[no-any-return]
            else:
                last = response.text
        except httpx.HTTPError as exc:
            last = exc
        time.sleep(0.1)
    raise AssertionError(f"task {task_id} never got {what}: {last}")


def in_state(*states: str) -> Any:
    return lambda t: t["state"] in states


def restart(stack: Stack, victim: str) -> None:
    if victim == "sigterm-all":
        # SIGTERM to every service at once (as a supervisor stopping the stack), then each exits.
        for proc in stack.procs.values():
            assert proc.proc is not None
            proc.proc.send_signal(signal.SIGTERM)
        for name, proc in stack.procs.items():
            assert proc.proc is not None
            code = proc.proc.wait(timeout=30)
            # uvicorn re-raises the signal it handled once it has shut down: -15 after a clean stop.
            clean = {0, -signal.SIGTERM} if name == "gateway" else {0}
            assert code in clean, f"{name} exited {code} on SIGTERM"
        stack.procs.clear()
        stack.start()
        return
    proc = stack.procs[victim]
    proc.kill()  # SIGKILL
    proc.start(wait=False)
    stack.wait_healthy()


def answer_once(api: Api, task_id: str, timeout_s: float = 90) -> None:
    """Answer the task's current question; retried while the question moves (a re-asked one)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        task = poll(api, task_id, lambda t: t["state"] == "waiting_input" and "pendingQuestion" in t, what="a question")
        try:
            response = api.request(
                "POST",
                f"/tasks/{task_id}/answer",
                json={"questionId": task["pendingQuestion"]["questionId"], "answer": "left"},
            )
        except httpx.HTTPError:
            continue
        if response.status_code == 200:
            return
        time.sleep(0.2)
    raise AssertionError(f"the question of {task_id} could not be answered")


def play_round(c: Chaos, victim: str) -> None:
    api = c.api(f"round-{victim}")
    folder = c.base / victim
    follower = SseFollower(api).start()
    running = [create(api, folder / f"run{i}", "run", seconds=6) for i in range(2)]
    asking = create(api, folder / "ask", "ask", seconds=0.5)
    stubborn = create(api, folder / "stubborn", "stubborn")
    queued = [create(api, folder / f"queued{i}", "run", seconds=0.5) for i in range(2)]
    for task_id in running:
        poll(api, task_id, lambda t: t.get("progress", {}).get("text") == "working", what="progress")
    poll(api, asking, in_state("waiting_input"), what="waiting_input")
    poll(api, stubborn, lambda t: t.get("progress", {}).get("text") == "ignoring SIGTERM", what="progress")
    for task_id in queued:
        assert api.get(task_id)["state"] == "queued"
    cancelled = api.request("POST", f"/tasks/{stubborn}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["task"]["state"] == "cancel_requested"

    restart(c.stack, victim)
    c.figures["kills" if victim != "sigterm-all" else "stack_sigterms"] += 1

    answer_once(api, asking)
    created = [*running, asking, stubborn, *queued]
    ended = {t: poll(api, t, in_state(*TERMINAL), timeout_s=90, what="an end") for t in created}
    check_round(c, api, victim, folder, ended, running, asking, stubborn, follower)


def check_round(
    c: Chaos,
    api: Api,
    victim: str,
    folder: Path,
    ended: dict[str, dict[str, Any]],
    running: list[str],
    asking: str,
    stubborn: str,
    follower: SseFollower,
) -> None:
    created = list(ended)
    c.figures["tasks"] += len(created)
    # No task lost or duplicated: the session lists exactly the created tasks.
    listed = api.request("GET", "/tasks", params={"all": "true", "page_size": 100}).json()
    ids = [t["taskId"] for t in listed["tasks"]]
    c.figures["lost"] += len(set(created) - set(ids))
    c.figures["duplicated"] += len(ids) - len(set(ids)) + len(set(ids) - set(created))
    assert sorted(ids) == sorted(created), (victim, ids, created)

    # Ends: the stubborn task cancelled, the rest completed.
    states = {t: ended[t]["state"] for t in created}
    assert states[stubborn] == "cancelled", (victim, ended[stubborn])
    assert all(states[t] == "completed" for t in created if t != stubborn), (victim, states)

    # Resume counts and revisions: only what was running when the scheduler went away resumed,
    # each exactly once, in revision 1; the answer started revision 2 of the asking task (its
    # count starts again at 0), whether or not it was interrupted before.
    interrupted = set(running) | {asking} if victim in ("scheduler", "sigterm-all") else set()
    for task_id in created:
        resume = ended[task_id].get("restartResume")
        if task_id == asking:
            assert resume is not None and (resume["count"], resume["revision"]) == (0, 2), json.dumps(resume)
        elif task_id in interrupted:
            assert resume is not None and (resume["count"], resume["revision"]) == (1, 1), json.dumps(resume)
        else:
            assert resume is None, (victim, task_id, ended[task_id])
        c.figures["resumed"] += task_id in interrupted

    # Each task's runs: an old tree gone before the next run; one run reached its end.
    for name, task_id in [("run0", running[0]), ("run1", running[1]), ("ask", asking), ("stubborn", stubborn)]:
        lines = (folder / name / "runs").read_text().splitlines()
        starts = [ln for ln in lines if ln.startswith("start")]
        assert all(ln.endswith("earlier_alive=0") for ln in starts), (victim, name, lines)
        expected_runs = 2 if task_id in interrupted else 1
        assert len(starts) == expected_runs, (victim, name, lines)
        assert lines.count("done") == (0 if task_id == stubborn else 1), (victim, name, lines)
        for ln in starts:
            pid, start = int(ln.split()[1]), ln.split()[2]
            assert not Path(f"/proc/{pid}").exists() or _start_time(pid) != start, f"{name} pid {pid} survived"
    # The one answer arrived once.
    assert (folder / "ask" / "answers").read_text().splitlines() == ["left"], victim
    c.figures["answers"] += 1

    # Notifications: one per ending and one per question, each delivered (distinct keys).
    expected_endings = {(t, f"task.{states[t]}") for t in created}
    deadline = time.monotonic() + 60
    while True:
        got = c.receiver.for_session(api.session)
        keys: dict[str, tuple[str, str]] = {}
        for r in got:
            keys[r.headers["idempotency-key"]] = (r.doc["taskId"], r.doc["kind"])
        endings = [v for v in keys.values() if v[1] != "task.question"]
        questions = [v for v in keys.values() if v[1] == "task.question"]
        if set(endings) >= expected_endings and questions or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    c.figures["notifications"] += len(keys)
    c.figures["notifications_lost"] += len(expected_endings - set(endings))
    c.figures["notifications_duplicated"] += len(endings) - len(set(endings))
    assert sorted(endings) == sorted(expected_endings), (victim, endings)
    assert [q[0] for q in questions] == [asking], (victim, questions)

    # Every SSE client reconnected and caught up: it saw each notification exactly once.
    deadline = time.monotonic() + 30
    while set(follower.notifications) < set(keys) and time.monotonic() < deadline:
        time.sleep(0.1)
    follower.stop()
    assert sorted(follower.notifications) == sorted(keys), (victim, follower.notifications, keys)
    c.figures["sse_reconnects"] += max(0, follower.connects - 1)


def _start_time(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except OSError:
        return None


def test_kill_every_service_in_turn(chaos: Chaos, request: pytest.FixtureRequest) -> None:
    for victim in ROUNDS:
        play_round(chaos, victim)
    figures = chaos.figures
    print(
        f"\nchaos[{request.node.callspec.id}]: tasks={figures['tasks']} kills={figures['kills']}"
        f" stack_sigterms={figures['stack_sigterms']} resumed={figures['resumed']}"
        f" lost={figures['lost']} duplicated={figures['duplicated']} answers={figures['answers']}"
        f" notifications={figures['notifications']} notifications_lost={figures['notifications_lost']}"
        f" notifications_duplicated={figures['notifications_duplicated']}"
        f" sse_reconnects={figures['sse_reconnects']}"
    )
    assert figures["lost"] == 0 and figures["duplicated"] == 0


# --- a full disk under the data directory -----------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 48 MiB tmpfs mounted for the test (as root), unmounted after it."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk: Path) -> Path:
    """Write a file until the disk is full (ENOSPC), big chunks first, then small ones."""
    filler = disk / "filler"
    with filler.open("wb", buffering=0) as out:
        for chunk in (1 << 20, 4096, 64):
            try:
                while True:
                    out.write(b"\0" * chunk)
            except OSError:
                pass
    return filler


def test_a_full_disk_gives_clear_errors_and_no_corruption(small_disk: Path, tmp_path: Path) -> None:
    stack = make_stack(small_disk / "data")
    stack.log_dir = tmp_path / "logs"  # the logs live elsewhere: only the databases fill the disk
    figures: Counter[str] = Counter()
    errors_seen: set[str] = set()
    try:
        stack.start()
        result = run_cli(stack, "admin", "keys", "create", "--principal", "disk", "--agent", "agent-1")
        assert result.returncode == 0, result.stderr
        api = Api(stack, result.stdout.strip().splitlines()[-1], session="disk-1")
        add_member(stack, "agent-1", "disk-1", "disk")
        assert (
            api.wait_state(api.create("before", profile="exit-at-once")["taskId"], "completed")["state"] == "completed"
        )

        filler = fill(small_disk)
        for i in range(20):
            response = api.request(
                "POST",
                "/tasks",
                json={"title": f"while full {i}", "instructions": "x" * 20000, "profile": "exit-at-once"},
            )
            if response.status_code == 201:
                figures["accepted_while_full"] += 1
                continue
            figures["refused_while_full"] += 1
            body = response.json()
            assert response.status_code == 503 and body["error"] == "STORAGE_FULL" and body["message"], body
            errors_seen.add(f"{response.status_code} {body['error']}: {body['message']}")
        assert figures["refused_while_full"] > 0, "the disk was full: some writes must have been refused"
        for name, proc in stack.procs.items():
            assert proc.proc is not None and proc.proc.poll() is None, f"{name} died on a full disk"

        filler.unlink()
        after = api.create("after", profile="exit-at-once")
        assert api.wait_state(after["taskId"], "completed", timeout_s=60)["state"] == "completed"
    except Exception:
        print(stack.logs())
        raise
    finally:
        stack.stop()
    for db in sorted((small_disk / "data").glob("*.db")):
        with sqlite3.connect(db) as conn:
            assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",), db
        figures["databases_ok"] += 1
    print(
        f"\nchaos[disk-full]: accepted_while_full={figures['accepted_while_full']}"
        f" refused_while_full={figures['refused_while_full']} databases_ok={figures['databases_ok']} corrupted=0"
        f" errors={sorted(errors_seen)}"
    )
