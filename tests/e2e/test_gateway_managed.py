"""Gateway-managed tasks (issue 13 item 1) against a local target server: dispatched, the
outcome callback, a lost outcome, cancel — over REST and gRPC — and an old row reading as a
worker task."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
import httpx
import pytest

from taskgate.scheduler.v1 import scheduler_pb2 as pb
from taskgate.scheduler.v1 import scheduler_pb2_grpc as pb_grpc
from tests.e2e.conftest import AGENT, SESSION, Api, run_cli
from tests.support.stack import TARGET_SECRET


def sign(body: bytes) -> str:
    return "sha256=" + hmac.new(TARGET_SECRET.encode(), body, hashlib.sha256).hexdigest()


class Target:
    """A local stand-in for an external agent: behaviour by the request's nativeSessionId."""

    def __init__(self, port: int) -> None:
        self.requests: list[tuple[str, dict[str, Any], bool]] = []  # (event, body, signature ok)
        self.answers: dict[str, dict[str, Any]] = {}  # request id -> what a poll answers
        self.polls: list[tuple[str, bool]] = []  # (request id, signature ok)
        target = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                request_id = self.path.rsplit("/", 1)[-1]
                ok = hmac.compare_digest(self.headers.get("X-Taskgate-Signature", ""), sign(request_id.encode()))
                target.polls.append((request_id, ok))
                answer = target.answers.get(request_id)
                data = json.dumps(answer or {"error": "not yet"}).encode()
                self.send_response(200 if answer else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                doc = json.loads(raw)
                ok = hmac.compare_digest(self.headers.get("X-Taskgate-Signature", ""), sign(raw))
                event = self.headers.get("X-Taskgate-Event", "")
                target.requests.append((event, doc, ok))
                session = doc.get("nativeSessionId", "")
                if event == "dispatch" and session == "lost":
                    self.close_connection = True
                    self.connection.shutdown(2)  # the request arrived; its answer never does
                    return
                answer = {"status": "acknowledged"}
                if event == "dispatch" and session == "instant":
                    answer = {"status": "answered", "text": "done at once"}
                data = json.dumps(answer).encode()
                self.send_response(202 if answer["status"] == "acknowledged" else 200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait_request(self, event: str, task_id: str, timeout_s: float = 15) -> tuple[dict[str, Any], bool]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for seen, doc, ok in self.requests:
                if seen == event and doc.get("requestId") == task_id:
                    return doc, ok
            time.sleep(0.02)
        raise AssertionError(f"no {event} request for {task_id}: {self.requests}")


@pytest.fixture(scope="module")
def target(api: Api) -> Iterator[Target]:
    server = Target(api.stack.target_port)
    yield server
    server.server.shutdown()


def outcome(api: Api, request_id: str, doc: dict[str, Any], signature: str | None = None) -> httpx.Response:
    body = json.dumps(doc).encode()
    return httpx.post(
        f"{api.stack.http_url}/api/v1/dispatch/{request_id}/outcome",
        content=body,
        headers={"X-Taskgate-Signature": signature if signature is not None else sign(body)},
        timeout=30,
    )


def test_dispatched_then_answered_by_the_outcome_callback(api: Api, target: Target) -> None:
    created = api.create(
        "ask the remote agent",
        instructions="summarise the thread",
        target={"name": "remote", "nativeSessionId": "ack", "options": {"lang": "en"}},
    )
    task_id = created["taskId"]
    assert created["executionType"] == "gateway-managed" and created["targetProfile"] == "gateway-managed"
    assert created["gatewayTarget"] == {
        "adapter": "http",
        "nativeSessionId": "ack",
        "displayName": "Remote agent",
        "options": {"tier": "default", "lang": "en"},
    }
    assert created["gatewayDispatch"] == {"requestId": task_id}, "not submitted yet"
    doc, signed = target.wait_request("dispatch", task_id)
    assert signed and doc["instructions"] == "summarise the thread" and doc["nativeSessionId"] == "ack"
    assert doc["outcomeUrl"].endswith(f"/api/v1/dispatch/{task_id}/outcome")
    running = api.wait_for(task_id, lambda t: t.state == pb.TASK_STATE_RUNNING)
    assert running["gatewayDispatch"]["submittedAt"]
    deadline = time.monotonic() + 10
    while api.get(task_id)["attempts"][0].get("outcome") != "acknowledged":
        assert time.monotonic() < deadline, api.get(task_id)
        time.sleep(0.05)

    assert outcome(api, task_id, {"status": "answered", "text": "x"}, signature="sha256=forged").status_code == 401
    assert outcome(api, "0" * 32, {"status": "answered"}).status_code == 401, "unknown request: the same answer"
    assert outcome(api, task_id, {"status": "maybe"}).status_code == 400
    answered = outcome(api, task_id, {"status": "answered", "text": "the summary"})
    assert answered.status_code == 200 and answered.json()["task"]["state"] == "completed", answered.text
    again = outcome(api, task_id, {"status": "failed", "error": "late"})
    assert again.status_code == 200 and again.json()["task"]["state"] == "completed", "an ended task stays ended"

    task = api.get(task_id)
    assert task["state"] == "completed" and task["result"]["text"] == "the summary"
    (attempt,) = task["attempts"]
    assert attempt["outcome"] == "answered" and attempt["endedAt"]
    for worker_only in ("pid", "pgid", "pidStartTime", "usage", "harness", "descendants"):
        assert worker_only not in attempt, f"no {worker_only} for a request"
    assert "execution" not in task and "activity" not in task and "harness" not in task
    notes = api.request("GET", "/notifications?page_size=100").json()["notifications"]
    deadline = time.monotonic() + 15
    while not any(n["taskId"] == task_id for n in notes):
        assert time.monotonic() < deadline, "the ending is notified as for a worker task"
        time.sleep(0.1)
        notes = api.request("GET", "/notifications?page_size=100").json()["notifications"]


def test_an_answer_with_the_acknowledgement_and_a_lost_outcome(api: Api, target: Target) -> None:
    instant = api.create("instant", target={"name": "remote", "nativeSessionId": "instant"})
    done = api.wait_state(instant["taskId"], "completed", "failed")
    assert done["state"] == "completed" and done["result"]["text"] == "done at once"

    lost = api.create("lost", target={"name": "remote", "nativeSessionId": "lost"})
    failed = api.wait_state(lost["taskId"], "failed", "completed")
    target.wait_request("dispatch", lost["taskId"])
    assert failed["failure"]["code"] == "DISPATCH_OUTCOME_UNKNOWN" and failed["failure"]["retryable"] is False
    assert failed["attempts"][0]["outcome"] == "outcome_unknown"
    assert len([r for r in target.requests if r[1].get("requestId") == lost["taskId"]]) == 1, "never sent again"


def test_a_target_asks_a_question_and_gets_the_answer(api: Api, target: Target) -> None:
    task_id = api.create("asks", target={"name": "remote", "nativeSessionId": "ack"})["taskId"]
    target.wait_request("dispatch", task_id)
    api.wait_state(task_id, "running")
    asked = outcome(api, task_id, {"status": "question", "text": "Which branch?"})
    assert asked.status_code == 200 and asked.json()["task"]["state"] == "waiting_input", asked.text
    question = api.get(task_id)["pendingQuestion"]
    assert question["text"] == "Which branch?"
    assert outcome(api, task_id, {"status": "question", "text": "Which branch?"}).status_code == 200
    assert api.get(task_id)["pendingQuestion"]["questionId"] == question["questionId"], "the same question"
    answered = api.request(
        "POST", f"/tasks/{task_id}/answer", json={"questionId": question["questionId"], "answer": "main"}
    )
    assert answered.status_code == 200, answered.text
    doc, signed = target.wait_request("answer", task_id)
    assert signed and doc["answer"] == "main" and doc["questionId"] == question["questionId"]
    running = api.wait_state(task_id, "running")
    assert "pendingQuestion" not in running
    done = outcome(api, task_id, {"status": "answered", "text": "merged into main"})
    assert done.json()["task"]["state"] == "completed"
    deadline = time.monotonic() + 15
    while True:
        notes = api.request("GET", "/notifications?page_size=100").json()["notifications"]
        if any(n["taskId"] == task_id and n["kind"] == "task.question" for n in notes):
            break
        assert time.monotonic() < deadline, [n for n in notes if n["taskId"] == task_id]
        time.sleep(0.1)


def test_the_outcome_by_polling_the_target(api: Api, target: Target) -> None:
    created = api.create("polled", target={"name": "polled", "nativeSessionId": "ack"})
    task_id = created["taskId"]
    target.wait_request("dispatch", task_id)
    deadline = time.monotonic() + 15
    while not any(rid == task_id for rid, _ in target.polls):
        assert time.monotonic() < deadline, "the target is asked"
        time.sleep(0.05)
    assert api.get(task_id)["state"] == "running", "a 404 means: not yet"
    target.answers[task_id] = {"status": "answered", "text": "polled answer"}
    task = api.wait_state(task_id, "completed", "failed")
    assert task["state"] == "completed" and task["result"]["text"] == "polled answer"
    assert all(ok for rid, ok in target.polls if rid == task_id), "every poll is signed"


def test_over_grpc_created_and_cancelled_with_the_target_told(api: Api, target: Target) -> None:
    with api.stack.channel("scheduler", "gateway") as channel:
        stub = pb_grpc.SchedulerServiceStub(channel)
        task = stub.CreateTask(
            pb.CreateTaskRequest(
                agent_id=AGENT,
                session_id=SESSION,
                title="grpc dispatch",
                target=pb.TargetRequest(name="remote", native_session_id="ack", display_name="Mine"),
            ),
            timeout=30,
        ).task
        assert task.execution_type == pb.EXECUTION_TYPE_GATEWAY_MANAGED
        assert task.gateway_target.display_name == "Mine" and task.gateway_dispatch.request_id == task.task_id
        target.wait_request("dispatch", task.task_id)
        api.wait_state(task.task_id, "running")
        cancelled = stub.CancelTask(pb.CancelTaskRequest(task_id=task.task_id), timeout=30).task
        assert cancelled.state == pb.TASK_STATE_CANCELLED, cancelled
        assert cancelled.cancellation.cleanup == "confirmed"
        with pytest.raises(grpc.RpcError) as caught:
            stub.PauseTask(pb.PauseTaskRequest(task_id=task.task_id), timeout=30)
        assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    cancel, signed = target.wait_request("cancel", task.task_id)
    assert signed and cancel["cancel"] is True


def test_refusals_before_anything_is_created(api: Api) -> None:
    cases = [
        ({"name": "nowhere", "nativeSessionId": "x"}, {}, 400, "UNKNOWN_TARGET"),
        ({"name": "remote", "nativeSessionId": "x"}, {"profile": "behave"}, 400, "TARGET_EXCLUSIVE"),
        ({"name": "remote", "nativeSessionId": "bad id!"}, {}, 400, "INVALID_ID"),
    ]
    for body, extra, status, reason in cases:
        response = api.request("POST", "/tasks", json={"title": "t", "target": body, **extra})
        assert response.status_code == status and response.json()["error"] == reason, (body, response.text)


def test_safemode_needs_a_live_grant_and_an_assignment_both_from_the_cli_only(api: Api, target: Target) -> None:
    def create() -> httpx.Response:
        return api.request(
            "POST", "/tasks", json={"title": "guarded", "target": {"name": "guarded", "nativeSessionId": "ack"}}
        )

    def discoverable() -> list[str]:
        response = httpx.get(
            f"{api.stack.http_url}/api/v1/agents/{AGENT}/targets",
            headers={"Authorization": f"Bearer {api.key}"},
            timeout=30,
        )
        assert response.status_code == 200, response.text
        return [t["name"] for t in response.json()["targets"]]

    def cli(*args: str) -> str:
        result = run_cli(api.stack, "admin", "safemode", *args)
        assert result.returncode == 0, result.stderr
        return result.stdout

    assert discoverable() == ["polled", "remote"], "a safemode target is hidden without a grant and an assignment"
    refused = create()
    assert refused.status_code == 403 and refused.json()["error"] == "SAFEMODE_NOT_GRANTED", refused.text
    with api.stack.channel("scheduler", "gateway") as channel:  # not around the gateway's check either
        with pytest.raises(grpc.RpcError) as caught:
            pb_grpc.SchedulerServiceStub(channel).CreateTask(
                pb.CreateTaskRequest(
                    agent_id=AGENT,
                    session_id=SESSION,
                    title="g",
                    target=pb.TargetRequest(name="guarded", native_session_id="ack"),
                ),
                timeout=30,
            )
        assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED

    cli("grant", "--agent", AGENT, "--target", "guarded")
    assert create().status_code == 403 and "guarded" not in discoverable(), "a grant alone is not enough"
    cli("assign", "--agent", AGENT, "--target", "guarded")
    assert "guarded" in discoverable()
    created = create()
    assert created.status_code == 201, created.text
    task_id = created.json()["task"]["taskId"]
    target.wait_request("dispatch", task_id)
    assert "live" in cli("list") and AGENT in cli("list")

    cli("revoke", "--agent", AGENT, "--target", "guarded")
    refused = create()
    assert refused.status_code == 403 and refused.json()["error"] == "SAFEMODE_NOT_GRANTED", "stopped at once"
    assert "guarded" not in discoverable()
    cli("grant", "--agent", AGENT, "--target", "guarded", "--ttl-s", "3600")  # expiry: tests/unit/gateway
    assert create().status_code == 201
    cli("unassign", "--agent", AGENT, "--target", "guarded")
    assert create().status_code == 403

    # REST cannot change them: there is no such operation.
    for method, path in (
        ("POST", f"/api/v1/agents/{AGENT}/safemode/guarded"),
        ("PUT", f"/api/v1/agents/{AGENT}/targets"),
    ):
        response = httpx.request(
            method, f"{api.stack.http_url}{path}", headers={"Authorization": f"Bearer {api.key}"}, json={}, timeout=30
        )
        assert response.status_code in (404, 405), (path, response.status_code)
    api.request("POST", f"/tasks/{task_id}/cancel", json={})
