"""The HTTP edge over a real socket: chunked bodies, request ids, the session task per agent."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import grpc
import httpx

from taskgate.pending.v1 import pending_pb2 as ppb
from taskgate.pending.v1 import pending_pb2_grpc as ppb_grpc
from tests.e2e.conftest import AGENT, Api, add_member, create_key, run_cli
from tests.support.stack import Stack


def chunks(total: int, size: int = 16 * 1024) -> Iterator[bytes]:
    sent = 0
    while sent < total:
        chunk = b" " * min(size, total - sent)
        sent += len(chunk)
        yield chunk


def test_a_chunked_body_over_the_bound_is_413(api: Api) -> None:
    before = api.request("GET", "/tasks?all=true").json()["total"]
    response = api.request("POST", "/tasks", content=chunks(300_000), headers={"Content-Type": "application/json"})
    assert "content-length" not in response.request.headers
    assert response.request.headers["transfer-encoding"] == "chunked"
    assert response.status_code == 413
    assert response.json()["error"] == "PAYLOAD_TOO_LARGE" and response.json()["message"]
    # A chunked body within the bound is read whole and used.
    body = b'{"title": "chunked", "profile": "exit-at-once"}'
    response = api.request(
        "POST", "/tasks", content=iter([body[:10], body[10:]]), headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 201, response.text
    assert api.request("GET", "/tasks?all=true").json()["total"] == before + 1


def test_a_bad_request_id_gets_a_normal_answer_with_a_new_id(api: Api) -> None:
    for offered in ["x" * 65, "two words", "<script>", "ü", "a\\b"]:
        response = api.request("GET", "/tasks", headers={"X-Request-Id": offered.encode()})
        assert response.status_code == 200, (offered, response.text)
        assert re.fullmatch(r"[0-9a-f]{32}", response.headers["x-request-id"]), offered
    response = api.request("GET", "/tasks", headers={"X-Request-Id": "client:42.a_b-c"})
    assert response.status_code == 200 and response.headers["x-request-id"] == "client:42.a_b-c"


def _leave_snapshot(stack: Stack, agent: str, session: str, payload: str) -> None:
    """An ask whose producer went away: its pending snapshot stays."""
    with stack.channel("pending", "frontend") as channel:
        stub = ppb_grpc.PendingRegistryServiceStub(channel)
        producer = stub.Ask.future(
            ppb.AskRequest(session_id=session, agent_id=agent, kind=ppb.ENTRY_KIND_CONFIRM, payload=payload),
            timeout=30,
        )
        deadline = time.monotonic() + 15
        while True:
            try:
                stub.GetSessionTask(ppb.GetSessionTaskRequest(agent_id=agent, session_id=session), timeout=5)
                break
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.NOT_FOUND and time.monotonic() < deadline, exc
                time.sleep(0.05)
        producer.cancel()


def test_the_session_task_is_the_agents(stack: Stack, api: Api) -> None:
    session = "tg-edge"
    _leave_snapshot(stack, AGENT, session, "deploy to staging?")
    _leave_snapshot(stack, "agent-2", session, "agent 2's question")
    url = f"{stack.http_url}/v1/session/{session}/task"

    def get(key: str, **params: str) -> httpx.Response:
        return httpx.get(url, params=params, headers={"Authorization": f"Bearer {key}"}, timeout=10)

    # A key with one agent: that agent's snapshot.
    carol = create_key(stack, "carol", AGENT)
    assert get(carol).status_code == 403  # not a member yet
    add_member(stack, AGENT, session, "carol")
    response = get(carol)
    assert response.status_code == 200, response.text
    task = response.json()["task"]
    assert (task["agentId"], task["sessionId"], task["kind"], task["payload"]) == (
        AGENT,
        session,
        "confirm",
        "deploy to staging?",
    )
    assert get(carol, agentId=AGENT).json() == response.json()
    # Naming an agent the key has no access to.
    assert get(carol, agentId="agent-2").json()["error"] == "AGENT_ACCESS_DENIED"

    # A key with several agents must say which.
    dave = create_key(stack, "dave", AGENT, "agent-2")
    add_member(stack, AGENT, session, "dave")
    response = get(dave)
    assert response.status_code == 400 and response.json()["error"] == "AGENT_AMBIGUOUS"
    assert get(dave, agentId=AGENT).json()["task"]["payload"] == "deploy to staging?"
    assert get(dave, agentId="agent-2").status_code == 403  # not a member through agent-2
    add_member(stack, "agent-2", session, "dave")
    assert get(dave, agentId="agent-2").json()["task"]["payload"] == "agent 2's question"

    # Malformed ids are 400; a session without a snapshot is 404.
    assert get(carol, agentId="bad agent").json()["error"] == "INVALID_ID"
    add_member(stack, AGENT, "tg-empty", "carol")
    response = httpx.get(
        f"{stack.http_url}/v1/session/tg-empty/task", headers={"Authorization": f"Bearer {carol}"}, timeout=10
    )
    assert response.status_code == 404 and response.json()["error"] == "PENDING_TASK_NOT_FOUND"


def test_a_cancel_naming_an_unknown_replacement_is_409(api: Api) -> None:
    task = api.create("to replace", profile="sleeper")
    response = api.request("POST", f"/tasks/{task['taskId']}/cancel", json={"replacedByTaskId": "0" * 32})
    assert response.status_code == 409 and response.json()["error"] == "REPLACEMENT_NOT_FOUND"
    assert api.get(task["taskId"])["state"] in ("queued", "running")  # nothing was cancelled
    response = api.request("POST", f"/tasks/{task['taskId']}/cancel", json={"replacedByTaskId": task["taskId"]})
    assert response.status_code == 400
    assert api.request("POST", f"/tasks/{task['taskId']}/cancel").status_code == 200
    api.wait_state(task["taskId"], "cancelled")


def test_the_operator_clis_revocations_count_on_the_next_request(stack: Stack) -> None:
    """The gateway remembers verified keys and memberships; the CLI, another process, changes
    them in the database — the very next request must see it (no waiting out a cache)."""
    created = run_cli(stack, "admin", "keys", "create", "--principal", "rita", "--agent", AGENT)
    assert created.returncode == 0, created.stderr
    key_id = re.search(r"key id:\s+(\S+)", created.stdout)
    assert key_id is not None, created.stdout
    rita = Api(stack, created.stdout.strip().splitlines()[-1], session="revoke-edge")
    add_member(stack, AGENT, "revoke-edge", "rita")
    for _ in range(3):  # answered from memory after the first
        assert rita.request("GET", "/tasks?page_size=1").status_code == 200
    members = ("admin", "members")
    removed = run_cli(stack, *members, "remove", "--agent", AGENT, "--session", "revoke-edge", "--principal", "rita")
    assert removed.returncode == 0, removed.stderr
    refused = rita.request("GET", "/tasks?page_size=1")
    assert refused.status_code == 403 and refused.json()["error"] == "NOT_A_MEMBER", refused.text
    add_member(stack, AGENT, "revoke-edge", "rita")
    assert rita.request("GET", "/tasks?page_size=1").status_code == 200
    assert run_cli(stack, "admin", "keys", "revoke", key_id.group(1)).returncode == 0
    revoked = rita.request("POST", "/tasks", json={"title": "after revoke"})
    assert revoked.status_code == 401 and revoked.json()["error"] == "UNAUTHENTICATED", revoked.text
