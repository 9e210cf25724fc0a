"""The notifier over real processes: the activity stream (SSE), conversation history,
reports from the scheduler's event log delivered to a real local webhook receiver
with retries — across a SIGKILL of the notifier and while it is down."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Api, add_member, add_members, create_key, run_cli
from tests.support.procs import REPO, free_port
from tests.support.stack import Stack, make_stack, start_fresh

SECRET = "webhook-secret-for-tests"
HOOK_AGENT = "agent-hook"
RETRY_INITIAL_MS = 400


# --- a real webhook receiver on loopback ---------------------------------------------


@dataclass
class Received:
    at: float
    headers: dict[str, str]
    body: bytes

    @property
    def doc(self) -> dict[str, Any]:
        return json.loads(self.body)  # type: ignore[no-any-return]


@dataclass
class Receiver:
    port: int
    # sessionId -> replies to give, in order, before answering 200: (status, Retry-After or None)
    script: dict[str, list[tuple[int, str | None]]] = field(default_factory=dict)
    got: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def for_session(self, session: str) -> list[Received]:
        with self.lock:
            return [r for r in self.got if r.doc["sessionId"] == session]

    def wait(self, session: str, done: Callable[[list[Received]], bool], timeout_s: float = 30) -> list[Received]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            got = self.for_session(session)
            if done(got):
                return got
            time.sleep(0.05)
        raise AssertionError(f"receiver saw {len(self.for_session(session))} requests for {session}")


def start_receiver() -> tuple[Receiver, ThreadingHTTPServer]:
    port = free_port()
    receiver = Receiver(port)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            session = json.loads(body)["sessionId"]
            with receiver.lock:
                receiver.got.append(Received(time.monotonic(), {k.lower(): v for k, v in self.headers.items()}, body))
                replies = receiver.script.get(session, [])
                status, retry_after = replies.pop(0) if replies else (200, None)
            self.send_response(status)
            if retry_after:
                self.send_header("Retry-After", retry_after)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return receiver, server


# --- one stack for the module, with shortened notifier settings -----------------------


@dataclass
class Env:
    stack: Stack
    receiver: Receiver
    key: str
    key_id: str

    def api(self, session: str, agent: str = "agent-1", key: str | None = None) -> Api:
        return Api(self.stack, key or self.key, agent=agent, session=session)


SESSIONS = ["sse-1", "sse-2", "promise-1", "revoke-1", "revoke-2", "cli-1", "ask-1"]
HOOK_SESSIONS = ["hook-1", "hook-2", "hook-3", "hook-4"]


NOTIFIER_CONFIG = """
[notifier]
sse_heartbeat_ms = 300
sse_client_buffer = 16
retry_initial_ms = {retry_initial_ms}
retry_max_ms = 3000
delivery_timeout_ms = 2000

[channels.hook]
kind = "webhook"
url = "http://127.0.0.1:{port}/hook"
secret = "{secret}"

[agents.{agent}]
channel = "hook"
"""


def start_stack(base: Path, receiver: Receiver) -> Stack:
    extra = NOTIFIER_CONFIG.format(
        retry_initial_ms=RETRY_INITIAL_MS, port=receiver.port, secret=SECRET, agent=HOOK_AGENT
    )
    return start_fresh(lambda attempt: make_stack(base / f"try{attempt}", extra_config=extra))


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    receiver, server = start_receiver()
    stack = start_stack(tmp_path_factory.mktemp("notifier-stack"), receiver)
    try:
        result = run_cli(
            stack, "admin", "keys", "create", "--principal", "nora", "--agent", "agent-1", "--agent", HOOK_AGENT
        )
        assert result.returncode == 0, result.stderr
        lines = result.stdout.strip().splitlines()
        key, key_id = lines[-1], lines[0].split()[-1]
        add_members(stack, "agent-1", SESSIONS, "nora")
        add_members(stack, HOOK_AGENT, HOOK_SESSIONS, "nora")
        yield Env(stack, receiver, key, key_id)
    except Exception:
        print(stack.logs())
        raise
    finally:
        stack.stop()
        server.shutdown()


# --- SSE reading -------------------------------------------------------------------------


@dataclass
class Frame:
    event: str | None
    id: str | None
    data: dict[str, Any] | None
    comment: bool = False


class SseReader:
    """Reads an SSE response on a thread into a queue, so the test can wait with bounds."""

    def __init__(self, api: Api, last_event_id: str | None = None, path: str = "/activity/stream") -> None:
        headers = {"Authorization": f"Bearer {api.key}", "Accept": "text/event-stream"}
        if last_event_id:
            headers["Last-Event-ID"] = last_event_id
        self.client = httpx.Client(timeout=httpx.Timeout(30, read=30))
        self.response = self.client.send(
            self.client.build_request("GET", api.base + path, headers=headers), stream=True
        )
        self.frames: queue.Queue[Frame | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        event: dict[str, Any] = {}
        try:
            for line in self.response.iter_lines():
                if line.startswith(":"):
                    self.frames.put(Frame(None, None, None, comment=True))
                elif line == "":
                    if event:
                        data = json.loads(event["data"]) if "data" in event else None
                        self.frames.put(Frame(event.get("event"), event.get("id"), data))
                    event = {}
                else:
                    name, _, value = line.partition(":")
                    event[name] = value.removeprefix(" ")
        except (httpx.HTTPError, ValueError):
            pass
        finally:
            self.frames.put(None)

    def next(self, timeout_s: float = 15, comments: bool = False) -> Frame | None:
        deadline = time.monotonic() + timeout_s
        while True:
            frame = self.frames.get(timeout=max(0.01, deadline - time.monotonic()))
            if frame is None or comments or not frame.comment:
                return frame

    def close(self) -> None:
        self.response.close()
        self.client.close()


def put(api: Api, response_id: str, text: str, final: bool = False) -> httpx.Response:
    return api.request("PUT", f"/responses/{response_id}", json={"text": text, "final": final})


# --- the activity stream -----------------------------------------------------------------


def test_activity_stream_replays_replaces_finalizes_and_resumes(env: Env) -> None:
    api = env.api("sse-1")
    assert put(api, "r1", "Hel").status_code == 200
    reader = SseReader(api)
    try:
        assert reader.response.headers["content-type"].startswith("text/event-stream")
        assert reader.response.headers["cache-control"] == "no-store"
        assert reader.response.headers["x-accel-buffering"] == "no"
        first = reader.next()
        assert first is not None and first.data == {"responseId": "r1", "text": "Hel", "final": False} and first.id
        assert put(api, "r1", "Hello").status_code == 200
        second = reader.next()
        assert second is not None and second.data == {"responseId": "r1", "text": "Hello", "final": False}
        done = put(api, "r1", "Hello, world", final=True)
        assert done.status_code == 200 and done.json()["response"]["final"] is True
        third = reader.next()
        assert third is not None and third.data == {"responseId": "r1", "text": "Hello, world", "final": True}
        assert int(first.id or 0) < int(second.id or 0) < int(third.id or 0)
        # The heartbeat comment comes every sse_heartbeat_ms (300 ms here) while nothing happens.
        heartbeat = reader.next(timeout_s=5, comments=True)
        assert heartbeat is not None and heartbeat.comment
    finally:
        reader.close()

    again = put(api, "r1", "more")
    assert again.status_code == 409 and again.json()["error"] == "RESPONSE_FINAL"
    history = api.request("GET", "/messages").json()
    assistant = [m for m in history["messages"] if m["role"] == "assistant"]
    assert [(m["responseId"], m["text"]) for m in assistant] == [("r1", "Hello, world")]
    assert assistant[0]["completedAt"] >= assistant[0]["createdAt"]

    # While disconnected two snapshots pass; Last-Event-ID resumes with both, in order.
    put(api, "r2", "a")
    put(api, "r2", "ab")
    resumed = SseReader(api, last_event_id=third.id)
    try:
        got = [resumed.next(), resumed.next()]
        assert [f.data["text"] for f in got if f and f.data] == ["a", "ab"]
    finally:
        resumed.close()

    # Over 64 KiB: past the schema's character bound, or within it but past the byte bound.
    too_long = put(api, "r3", "x" * (64 * 1024 + 1))
    assert too_long.status_code == 400 and too_long.json()["error"] == "INVALID_ARGUMENT"
    too_many_bytes = put(api, "r3", "é" * (40 * 1024))
    assert too_many_bytes.status_code == 400 and too_many_bytes.json()["error"] == "TEXT_TOO_LARGE"
    bad = api.request("GET", "/activity/stream", headers={"Last-Event-ID": "nope"})
    assert bad.status_code == 400


def test_the_openapi_document_lists_the_conversation_endpoints(env: Env) -> None:
    paths = httpx.get(f"{env.stack.http_url}/openapi.json", timeout=10).json()["paths"]
    base = "/api/v1/agents/{agentId}/sessions/{sessionId}"
    stream = paths[base + "/activity/stream"]["get"]["responses"]["200"]["content"]
    assert "text/event-stream" in stream
    for path in ("/responses/{responseId}", "/messages", "/notifications", "/events"):
        assert base + path in paths


def test_user_messages_are_history(env: Env) -> None:
    api = env.api("sse-1")
    created = api.request("POST", "/messages", json={"text": "hi there"})
    assert created.status_code == 201 and created.json()["message"]["role"] == "user"
    page = api.request("GET", "/messages", params={"page": 99, "page_size": 1}).json()
    assert page["page"] == page["pages"] - 1 and page["messages"][0]["text"] == "hi there"
    assert api.request("GET", "/messages", params={"page_size": 0}).status_code == 400
    assert api.request("POST", "/messages", json={"text": " "}).status_code == 400


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_a_client_that_stops_reading_is_cut_while_another_keeps_receiving(env: Env) -> None:
    api = env.api("sse-2")
    gateway = env.stack.procs["gateway"].proc
    assert gateway is not None
    host, port = env.stack.http_url.removeprefix("http://").split(":")
    # A small receive window from the handshake on, so the stall shows after a few frames.
    stalled = socket.socket()
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stalled.connect((host, int(port)))
    stalled.sendall(
        (
            f"GET /api/v1/agents/agent-1/sessions/sse-2/activity/stream HTTP/1.1\r\nHost: {host}\r\n"
            f"Authorization: Bearer {env.key}\r\nAccept: text/event-stream\r\n\r\n"
        ).encode()
    )
    reader = SseReader(api)
    time.sleep(0.3)
    before = rss_kb(gateway.pid)
    chunk = "y" * 32 * 1024
    n = 120
    received: list[str] = []
    try:
        for i in range(n):
            assert put(api, "big", f"{i}:{chunk}").status_code == 200

        while len(received) < n:
            frame = reader.next(timeout_s=20)
            assert frame is not None, f"the reading client stopped after {len(received)} frames"
            if frame.data:
                received.append(frame.data["text"].split(":")[0])
    finally:
        reader.close()
    assert received == [str(i) for i in range(n)]
    growth_mb = (rss_kb(gateway.pid) - before) / 1024
    # 120 × 32 KiB went to the stalled client's stream; it is cut with at most its 16-frame buffer held.
    assert growth_mb < 40, f"gateway grew {growth_mb:.1f} MiB"
    deadline = time.monotonic() + 20
    while "sse_client_too_slow" not in env.stack.procs["gateway"].logs():
        assert time.monotonic() < deadline, "the stalled client was not disconnected"
        time.sleep(0.1)
    stalled.close()


def test_a_revoked_key_ends_the_stream(env: Env) -> None:
    result = run_cli(env.stack, "admin", "keys", "create", "--principal", "nora", "--agent", "agent-1")
    key_id, key = result.stdout.strip().splitlines()[0].split()[-1], result.stdout.strip().splitlines()[-1]
    reader = SseReader(env.api("revoke-1", key=key))
    try:
        assert reader.next(timeout_s=5, comments=True) is not None
        assert run_cli(env.stack, "admin", "keys", "revoke", key_id).returncode == 0
        deadline = time.monotonic() + 10
        frame = reader.next(timeout_s=10)
        while frame is not None and frame.event != "error":
            assert time.monotonic() < deadline
            frame = reader.next(timeout_s=10)
        assert frame is not None and frame.data == {"error": "UNAUTHENTICATED", "message": "the API key was revoked"}
        assert reader.next(timeout_s=10, comments=True) is None  # then the stream ends
    finally:
        reader.close()


def test_a_removed_member_loses_the_session_task_stream_and_the_others_keep_theirs(env: Env) -> None:
    # The session's task stream: after its snapshots the gateway writes each frame to the
    # connection itself; the access recheck (shared per key) still ends one client's stream.
    otto = create_key(env.stack, "otto", "agent-1")
    add_member(env.stack, "agent-1", "revoke-2", "otto")
    staying = SseReader(env.api("revoke-2"), path="/tasks/events")
    leaving = SseReader(env.api("revoke-2", key=otto), path="/tasks/events")
    try:
        for reader in (staying, leaving):
            assert reader.next(timeout_s=5, comments=True) is not None  # a heartbeat: the stream is open
        removed = run_cli(
            env.stack,
            "admin",
            "members",
            "remove",
            "--agent",
            "agent-1",
            "--session",
            "revoke-2",
            "--principal",
            "otto",
        )
        assert removed.returncode == 0, removed.stderr
        frame = leaving.next(timeout_s=10)
        assert frame is not None and frame.event == "error" and frame.data is not None, frame
        assert frame.data["error"] == "NOT_A_MEMBER"
        assert leaving.next(timeout_s=10, comments=True) is None  # then the stream ends
        task = env.api("revoke-2").create("after", profile="exit-at-once")
        states = []
        while "completed" not in states:
            frame = staying.next(timeout_s=15)
            assert frame is not None and frame.data is not None
            if frame.data["task"]["taskId"] == task["taskId"]:
                states.append(frame.data["task"]["state"])
    finally:
        staying.close()
        leaving.close()


# --- reports delivered to the webhook ------------------------------------------------------


def signed(r: Received) -> bool:
    expected = "sha256=" + hmac.new(SECRET.encode(), r.body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(r.headers.get("x-taskgate-signature", ""), expected)


def ending_task(api: Api) -> str:
    task = api.create("quick", profile="exit-at-once")
    api.wait_state(task["taskId"], "completed")
    return str(task["taskId"])


def test_a_report_fails_twice_then_is_delivered_once_on_the_schedule(env: Env) -> None:
    api = env.api("hook-1", agent=HOOK_AGENT)
    env.receiver.script["hook-1"] = [(500, None), (500, None)]
    task_id = ending_task(api)
    got = env.receiver.wait("hook-1", lambda g: len(g) >= 3)
    assert all(r.doc["taskId"] == task_id and r.doc["kind"] == "task.completed" for r in got)
    assert len({r.headers["idempotency-key"] for r in got}) == 1
    assert got[0].headers["idempotency-key"] == got[0].doc["notificationId"]
    assert all(signed(r) for r in got)
    gaps_ms = [(b.at - a.at) * 1000 for a, b in zip(got, got[1:], strict=False)]
    assert gaps_ms[0] >= RETRY_INITIAL_MS - 20 and gaps_ms[1] >= 2 * RETRY_INITIAL_MS - 20, gaps_ms
    assert gaps_ms[1] < 10_000
    listed = api.request("GET", "/notifications", params={"state": "delivered"}).json()
    (note,) = listed["notifications"]
    assert note["state"] == "delivered" and note["nextAttemptAt"] is None
    assert [(a["outcome"], a.get("httpStatus")) for a in note["attempts"]] == [
        ("failed", 500),
        ("failed", 500),
        ("delivered", 200),
    ]
    time.sleep(1.5)
    assert len(env.receiver.for_session("hook-1")) == 3  # delivered: never sent again
    # The notification is also a history message.
    history = api.request("GET", "/messages").json()["messages"]
    assert [m["notificationId"] for m in history if m["role"] == "notification"] == [note["notificationId"]]


def test_retry_after_is_honoured(env: Env) -> None:
    api = env.api("hook-2", agent=HOOK_AGENT)
    env.receiver.script["hook-2"] = [(429, "2")]
    ending_task(api)
    first, second = env.receiver.wait("hook-2", lambda g: len(g) >= 2)
    assert second.at - first.at >= 2.0 - 0.02


def test_sigkill_during_a_retry_wait_keeps_the_schedule(env: Env) -> None:
    api = env.api("hook-3", agent=HOOK_AGENT)
    env.receiver.script["hook-3"] = [(503, "4")]
    ending_task(api)
    (first,) = env.receiver.wait("hook-3", lambda g: len(g) >= 1)
    # Wait until the failed attempt is stored, then kill the notifier in the middle of its 4 s wait.
    deadline = time.monotonic() + 10
    while not api.request("GET", "/notifications", params={"state": "pending"}).json()["notifications"]:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    notifier = env.stack.procs["notifier"]
    notifier.kill()
    notifier.start()
    second = env.receiver.wait("hook-3", lambda g: len(g) >= 2)[1]
    assert second.at - first.at >= 4.0 - 0.02  # the restart kept the clock
    assert second.headers["idempotency-key"] == first.headers["idempotency-key"]
    time.sleep(1.0)
    assert len(env.receiver.for_session("hook-3")) == 2


def test_tasks_ending_while_the_notifier_is_down_are_reported_once_each(env: Env) -> None:
    api = env.api("hook-4", agent=HOOK_AGENT)
    notifier = env.stack.procs["notifier"]
    notifier.stop()
    try:
        ended = {ending_task(api) for _ in range(3)}
    finally:
        notifier.start()
    got = env.receiver.wait("hook-4", lambda g: {r.doc["taskId"] for r in g} >= ended)
    time.sleep(1.0)
    got = env.receiver.for_session("hook-4")
    assert sorted(r.doc["taskId"] for r in got) == sorted(ended)
    listed = api.request("GET", "/notifications").json()
    assert listed["total"] == 3 and {n["state"] for n in listed["notifications"]} == {"delivered"}


# --- report replies ------------------------------------------------------------------------


def wait_notification(api: Api, task_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        for n in api.request("GET", "/notifications", params={"page_size": 100}).json()["notifications"]:
            if n.get("taskId") == task_id:
                return n  # type: ignore[no-any-return]
        time.sleep(0.05)
    raise AssertionError(f"no notification for {task_id}")


def test_a_question_and_the_ending_are_notified_once_each(env: Env) -> None:
    api = env.api("ask-1")
    steps = [{"ask": "Which database?"}, {"result": {"text": "finished"}}]
    task = api.create("asks", profile="behave", instructions=json.dumps(steps))
    waiting = api.wait_state(task["taskId"], "waiting_input")
    question = waiting["pendingQuestion"]
    note = wait_notification(api, task["taskId"])
    assert note["kind"] == "task.question" and note["questionId"] == question["questionId"]
    assert "Which database?" in note["text"] and note["state"] == "delivered"  # no channel: history is delivery
    answered = api.request(
        "POST", f"/tasks/{task['taskId']}/answer", json={"questionId": question["questionId"], "answer": "SQLite"}
    )
    assert answered.status_code == 200, answered.text
    api.wait_state(task["taskId"], "completed")
    deadline = time.monotonic() + 20
    while True:
        kinds = sorted(
            n["kind"]
            for n in api.request("GET", "/notifications").json()["notifications"]
            if n.get("taskId") == task["taskId"]
        )
        if kinds == ["task.completed", "task.question"] or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert kinds == ["task.completed", "task.question"]


def test_unbacked_promise_is_recorded_only_without_work_behind_it(env: Env) -> None:
    api = env.api("promise-1")
    note = wait_notification(api, ending_task(api))
    path = f"/notifications/{note['notificationId']}/reply"
    asks = api.request("POST", path, json={"text": "Which next?", "followUp": "asks_user"})
    assert asks.status_code == 201 and asks.json()["unbackedPromise"] is False
    promise = api.request("POST", path, json={"text": "I'm on it.", "followUp": "continues"})
    assert promise.status_code == 201 and promise.json()["unbackedPromise"] is True
    assert promise.json()["message"]["text"] == "I'm on it."  # delivered unchanged
    events = api.request("GET", "/events").json()
    assert [e["kind"] for e in events["events"]] == ["response.unbacked_promise"]
    assert events["events"][0]["notificationId"] == note["notificationId"]
    # With a task running in the conversation the same reply is backed.
    sleeper = api.create("sleeps", profile="sleeper")
    api.wait_state(sleeper["taskId"], "running")
    try:
        backed = api.request("POST", path, json={"text": "Still going.", "followUp": "continues"})
        assert backed.status_code == 201 and backed.json()["unbackedPromise"] is False
    finally:
        api.request("POST", f"/tasks/{sleeper['taskId']}/cancel")
    assert api.request("GET", "/events").json()["total"] == 1
    bad = api.request("POST", path, json={"text": "x", "followUp": "maybe"})
    assert bad.status_code == 400


# --- CLI -------------------------------------------------------------------------------------


def test_cli_lists_messages_and_notifications_and_watches_activity(env: Env) -> None:
    api = env.api("cli-1")
    rest = ["--url", env.stack.http_url, "--api-key", env.key, "--agent", "agent-1", "--session", "cli-1"]
    put(api, "cli-r", "first draft")
    listed = run_cli(env.stack, "messages", *rest, "list", "--page-size", "100")
    assert listed.returncode == 0 and "message(s)" in listed.stdout, listed.stderr
    notes = run_cli(env.stack, "notifications", *rest, "list", "--state", "pending")
    assert notes.returncode == 0 and "0 notification(s)" in notes.stdout, notes.stderr
    # SIGINT back to its default first: a suite started in the background (``make test &``, a CI
    # job) inherits it ignored, and Python then installs no Ctrl+C handler in the CLI.
    watcher = subprocess.Popen(
        ["env", "--default-signal=INT", sys.executable, "-m", "gateway_http.cli.main", "activity", *rest, "watch"],
        cwd=REPO,
        env={**os.environ, **env.stack.env},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert watcher.stdout is not None
        assert watcher.stdout.readline().strip() == "[cli-r …] first draft"
        put(api, "cli-r", "done", final=True)
        assert watcher.stdout.readline().strip() == "[cli-r final] done"
    finally:
        watcher.send_signal(signal.SIGINT)
        try:
            assert watcher.wait(timeout=10) == 0
        finally:
            watcher.kill()  # no-op once it exited; never left running after a failure
