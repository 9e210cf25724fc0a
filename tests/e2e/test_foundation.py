"""The first task path over real HTTP to real services, auth, validation and pagination."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx

from libs.internal_auth import ensure_secrets
from libs.settings import load_settings
from tests.e2e.conftest import AGENT, SESSION, Api, add_member, create_key
from tests.support.procs import METRICS_OFF, REPO, free_port
from tests.support.stack import Stack, make_stack


def test_healthz_reports_every_backend_serving(stack: Stack) -> None:
    response = httpx.get(f"{stack.http_url}/healthz", timeout=10)
    assert response.status_code == 200
    assert response.json() == {
        "status": "ok",
        "required": {n: "SERVING" for n in ("scheduler", "pending", "notifier")},
        "advisory": {"telemetry": "SERVING"},
    }


def test_openapi_document_lists_the_task_endpoints(stack: Stack) -> None:
    paths = httpx.get(f"{stack.http_url}/openapi.json", timeout=10).json()["paths"]
    assert "/api/v1/agents/{agentId}/sessions/{sessionId}/tasks" in paths
    assert "/api/v1/agents/{agentId}/sessions/{sessionId}/tasks/{taskId}/cancel" in paths


def test_demo_task_runs_to_completion(api: Api) -> None:
    created = api.create("hello", instructions="say hello to the world")
    assert created["state"] == "queued" and created["targetProfile"] == "default-worker"
    assert created["executionType"] == "worker"
    task = api.wait_state(created["taskId"], "completed", "failed")
    assert task["state"] == "completed", task
    assert task["result"]["text"] == "Done: 'hello' (5 words of instructions)."
    assert task["progress"]["text"].startswith("step 3/3")
    assert task["attempts"][0]["exitCode"] == 0 and task["attempts"][0]["pid"] > 0
    assert task["timing"]["endedAt"] >= task["timing"]["firstStartedAt"] >= task["timing"]["createdAt"]


def test_non_zero_exit_fails_with_the_exit_code(api: Api) -> None:
    created = api.create("fails", profile="behave", instructions=json.dumps([{"exit": 3}]))
    task = api.wait_state(created["taskId"], "completed", "failed")
    assert task["state"] == "failed"
    assert task["failure"]["code"] == "WORKER_EXITED" and task["failure"]["exitCode"] == 3


def test_missing_or_unknown_key_is_401(api: Api) -> None:
    assert httpx.get(api.base + "/tasks", timeout=10).status_code == 401
    response = httpx.get(api.base + "/tasks", headers={"Authorization": "Bearer tg_nope"}, timeout=10)
    assert response.status_code == 401 and response.json()["error"] == "UNAUTHENTICATED"
    response = httpx.get(api.base + "/tasks", headers={"Authorization": "Basic abc"}, timeout=10)
    assert response.status_code == 401


def test_agent_access_and_membership_are_checked(stack: Stack, api: Api) -> None:
    other_agent = Api(stack, api.key, agent="agent-2")
    response = other_agent.request("GET", "/tasks")
    assert response.status_code == 403 and response.json()["error"] == "AGENT_ACCESS_DENIED"
    not_member = Api(stack, api.key, session="cli-other")
    response = not_member.request("GET", "/tasks")
    assert response.status_code == 403 and response.json()["error"] == "NOT_A_MEMBER"
    bob = Api(stack, create_key(stack, "bob", AGENT))
    assert bob.request("GET", "/tasks").status_code == 403
    add_member(stack, AGENT, SESSION, "bob")
    assert bob.request("GET", "/tasks").status_code == 200


def test_disabled_orchestration_is_409(stack: Stack, api: Api) -> None:
    response = Api(stack, api.key, agent="agent-off").request("GET", "/tasks")
    assert response.status_code == 409 and response.json()["error"] == "ORCHESTRATION_DISABLED"


def test_a_task_of_another_session_is_403(stack: Stack, api: Api) -> None:
    task = api.create("mine", profile="exit-at-once")
    add_member(stack, AGENT, "cli-elsewhere", "alice")
    elsewhere = Api(stack, api.key, session="cli-elsewhere")
    for method, path in [("GET", ""), ("POST", "/cancel"), ("POST", "/retry-cleanup")]:
        response = elsewhere.request(method, f"/tasks/{task['taskId']}{path}")
        assert response.status_code == 403, (method, path, response.text)
    assert api.request("GET", "/tasks/" + "0" * 32).status_code == 404
    response = api.request("GET", "/tasks/not-a-task-id")
    assert response.status_code == 400 and response.json()["error"] == "INVALID_ID"


def test_bad_input_is_400_and_nothing_is_written(api: Api) -> None:
    before = api.request("GET", "/tasks?all=true").json()["total"]
    cases = [
        ({"title": "x", "profile": "no-such-profile"}, "UNKNOWN_PROFILE"),
        ({"title": "   "}, "EMPTY_TITLE"),
        ({"title": ""}, "EMPTY_TITLE"),
        ({"title": "x" * 201}, "INVALID_ARGUMENT"),
        ({"title": "x", "instructions": "y" * 70000}, "INVALID_ARGUMENT"),
        ({"instructions": "no title"}, "INVALID_ARGUMENT"),
        ({"title": "x", "command": ["rm", "-rf", "/"]}, "INVALID_ARGUMENT"),
        ({"title": 5}, "INVALID_ARGUMENT"),
    ]
    for body, error in cases:
        response = api.request("POST", "/tasks", json=body)
        assert response.status_code == 400, (body, response.text)
        assert response.json()["error"] == error and response.json()["message"], body
    response = api.request("POST", "/tasks", content=b'{"title": "broken', headers={"Content-Type": "application/json"})
    assert response.status_code == 400 and response.json()["error"] == "INVALID_JSON"
    response = api.request("POST", "/tasks", content=b"x" * 300_000, headers={"Content-Type": "application/json"})
    assert response.status_code == 413 and response.json()["error"] == "PAYLOAD_TOO_LARGE"
    assert api.request("GET", "/tasks?all=true").json()["total"] == before


def test_request_id_makes_create_idempotent(api: Api) -> None:
    first = api.create("once", profile="exit-at-once", requestId="req-42")
    again = api.create("once", profile="exit-at-once", requestId="req-42")
    assert again["taskId"] == first["taskId"]


def test_pagination_rules(stack: Stack, api: Api) -> None:
    add_member(stack, AGENT, "cli-pages", "alice")
    pages_api = Api(stack, api.key, session="cli-pages")
    ids = [pages_api.create(f"p{i}", profile="exit-at-once")["taskId"] for i in range(5)]
    for task_id in ids:
        pages_api.wait_state(task_id, "completed")
    assert pages_api.request("GET", "/tasks").json() == {"page": 0, "pages": 1, "total": 0, "tasks": []}
    body = pages_api.request("GET", "/tasks?all=true&page_size=2").json()
    assert (body["page"], body["pages"], body["total"], len(body["tasks"])) == (0, 3, 5, 2)
    assert [t["taskId"] for t in body["tasks"]] == ids[::-1][:2], "newest first"
    body = pages_api.request("GET", "/tasks?all=true&page_size=2&page=99").json()
    assert body["page"] == 2 and [t["taskId"] for t in body["tasks"]] == [ids[0]]
    for query in ["page=-1", "page=abc", "page_size=0", "page_size=101", "all=maybe"]:
        response = pages_api.request("GET", f"/tasks?{query}")
        assert response.status_code == 400, query
        assert response.json()["error"] == "INVALID_PAGINATION"


def test_task_events_stream_over_sse(api: Api) -> None:
    seen: list[tuple[str, str]] = []
    with httpx.stream(
        "GET", api.base + "/tasks/events", headers={"Authorization": f"Bearer {api.key}"}, timeout=30
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        task_id = api.create("streamed", profile="exit-at-once")["taskId"]
        event = ""
        for line in response.iter_lines():
            if line.startswith("event: "):
                event = line[len("event: ") :]
            elif line.startswith("data: "):
                task = json.loads(line[len("data: ") :])["task"]
                if task["taskId"] == task_id:
                    seen.append((event, task["state"]))
                    if task["state"] == "completed":
                        break
    assert ("task.state_changed", "running") in seen and seen[-1] == ("task.state_changed", "completed")
    assert httpx.get(api.base + "/tasks/events", timeout=10).status_code == 401


def test_every_service_serves_health_and_reflection(stack: Stack) -> None:
    import grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    expected = {
        "scheduler": {"taskgate.scheduler.v1.SchedulerService"},
        "pending": {"taskgate.pending.v1.PendingRegistryService"},
        "telemetry": {"taskgate.telemetry.v1.TelemetryAgentService"},
        "notifier": {"taskgate.notifier.v1.NotifierService"},
    }
    for name, services in expected.items():
        with grpc.insecure_channel(stack.addr(name)) as channel:
            stub = reflection_pb2_grpc.ServerReflectionStub(channel)
            replies = stub.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10
            )
            listed = {s.name for reply in replies for s in reply.list_services_response.service}
        assert services | {"grpc.health.v1.Health"} <= listed, name
        if name == "scheduler":
            assert "taskgate.scheduler.v1.WorkerService" not in listed, "workers have their own listener"


def exit_of(module: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``python -m module`` with ``env`` over this process's environment and no metrics
    ports, run to its end (it is expected to exit at once)."""
    return subprocess.run(
        [sys.executable, "-m", module],
        cwd=REPO,
        env={**os.environ, **METRICS_OFF, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_second_process_of_a_service_on_the_same_data_dir_exits_and_the_first_runs_on(stack: Stack) -> None:
    """Another scheduler, notifier or pending registry on the running stack's data directory (own
    port and no metrics, so nothing else stands in its way) exits at once naming the holder; so
    does another scheduler on the running one's worker socket folder."""
    for name, key, module, addr_env in [
        ("scheduler", "scheduler", "services.scheduler", "TASKGATE_SCHEDULER_ADDR"),
        ("notifier", "notifier", "services.notifier", "TASKGATE_NOTIFIER_ADDR"),
        ("pending_registry", "pending", "services.pending_registry", "TASKGATE_PENDING_ADDR"),
    ]:
        second = exit_of(module, {**stack.env, addr_env: f"127.0.0.1:{free_port()}"})
        holder = stack.procs[key].proc
        assert holder is not None and second.returncode == 1, (name, second.stderr[-2000:])
        assert (
            f"{name}: another {name} process (pid {holder.pid}) runs on the data directory {stack.data_dir}"
            in second.stderr
        ), second.stderr[-2000:]
    # Its own data directory but the running scheduler's worker socket folder: it would unlink
    # that scheduler's sockets and take its workers' calls.
    own = {
        "TASKGATE_DATA_DIR": str(stack.data_dir / "another"),
        "TASKGATE_SECRETS_DIR": str(stack.data_dir / "secrets"),
        "TASKGATE_SCHEDULER_ADDR": f"127.0.0.1:{free_port()}",
    }
    second = exit_of("services.scheduler", {**stack.env, **own})
    holder = stack.procs["scheduler"].proc
    assert holder is not None and second.returncode == 1, second.stderr[-2000:]
    assert f"another scheduler process (pid {holder.pid}) runs on the worker socket folder" in second.stderr, (
        second.stderr[-2000:]
    )
    assert list(Path(stack.env["TASKGATE_WORKER_SOCKET_DIR"]).glob("*/worker.sock")), "its worker socket is gone"
    health = httpx.get(stack.http_url + "/healthz", timeout=10)
    assert health.status_code == 200 and health.json()["status"] == "ok", health.text


def test_a_port_already_taken_ends_the_service_with_one_line_not_a_traceback(tmp_path: Path) -> None:
    env = make_stack(tmp_path / "unstarted").env
    ensure_secrets(load_settings({**os.environ, **env}).secrets_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for override, says in [
            ({"TASKGATE_PENDING_ADDR": f"127.0.0.1:{port}"}, f"cannot listen on 127.0.0.1:{port}"),
            (
                {"TASKGATE_PENDING_ADDR": f"127.0.0.1:{free_port()}", "TASKGATE_PENDING_METRICS_PORT": str(port)},
                f"cannot serve metrics on 127.0.0.1:{port}: Address already in use",
            ),
        ]:
            run = exit_of("services.pending_registry", {**env, **override})
            assert run.returncode == 1, run.stderr[-2000:]
            assert says in run.stderr and "Traceback" not in run.stderr, run.stderr[-2000:]
