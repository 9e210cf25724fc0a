"""GET .../tasks/{taskId}/events: one task's full snapshots over SSE (the dashboard's task page),
against the five real processes: the snapshot first, then telemetry and progress as they
happen, the stream ends after the finished snapshot; 404, 403 and 401 before any stream."""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.e2e.conftest import AGENT, Api, add_member, create_key
from tests.support.stack import Stack


def frames(response: httpx.Response) -> list[tuple[str, dict[str, Any]]]:
    """Every (event, data) of the stream, until the server ends it."""
    out: list[tuple[str, dict[str, Any]]] = []
    event = ""
    for line in response.iter_lines():
        if line.startswith("event: "):
            event = line[len("event: ") :]
        elif line.startswith("data: "):
            out.append((event, json.loads(line[len("data: ") :])))
    return out


def test_a_task_stream_sends_full_snapshots_then_ends_with_the_finished_one(api: Api) -> None:
    steps = [{"progress": "one"}, {"burn": 0.8}, {"progress": "two"}, {"sleep": 0.3}, {"result": {"text": "done"}}]
    task = api.create("watched", profile="behave", instructions=json.dumps(steps))
    headers = {"Authorization": f"Bearer {api.key}"}
    with httpx.stream("GET", f"{api.base}/tasks/{task['taskId']}/events", headers=headers, timeout=30) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        got = frames(response)  # returns: the server ends the stream after the finished snapshot
    names = [name for name, _ in got]
    snapshots = [data["task"] for _, data in got]
    assert names[0] == "task.snapshot" and snapshots[0]["taskId"] == task["taskId"]
    assert snapshots[0]["instructions"] == json.dumps(steps), "full snapshots, not slim ones"
    assert "task.execution" in names, names
    observed = [s["execution"] for n, s in zip(names, snapshots, strict=True) if n == "task.execution"]
    assert observed[-1]["available"] and "cpu" in observed[-1], observed[-1]
    progress = [s["progress"]["text"] for n, s in zip(names, snapshots, strict=True) if n == "task.progress"]
    assert "two" in progress, progress
    assert snapshots[-1]["state"] == "completed" and snapshots[-1]["result"]["text"] == "done"
    versions = [s["version"] for s in snapshots]
    assert versions == sorted(versions), "never an older snapshot after a newer one"
    # A finished task: its one snapshot, then the end.
    with httpx.stream("GET", f"{api.base}/tasks/{task['taskId']}/events", headers=headers, timeout=30) as response:
        assert [(n, d["task"]["state"]) for n, d in frames(response)] == [("task.snapshot", "completed")]


def test_a_task_stream_refuses_unknown_tasks_strangers_and_other_sessions(stack: Stack, api: Api) -> None:
    task = api.create("private", profile="exit-at-once")
    path = f"/tasks/{task['taskId']}/events"
    unknown = api.request("GET", f"/tasks/{'0' * 32}/events")
    assert unknown.status_code == 404 and unknown.json()["error"] == "TASK_NOT_FOUND", unknown.text
    assert api.request("GET", "/tasks/not-a-task/events").json()["error"] == "INVALID_ID"
    assert httpx.get(api.base + path, timeout=10).status_code == 401
    stranger = Api(stack, create_key(stack, "mallory", AGENT))  # access to the agent, not a member
    refused = stranger.request("GET", path)
    assert refused.status_code == 403 and refused.json()["error"] == "NOT_A_MEMBER", refused.text
    add_member(stack, AGENT, "cli-elsewhere", "alice")
    elsewhere = Api(stack, api.key, session="cli-elsewhere").request("GET", path)
    assert elsewhere.status_code == 403 and elsewhere.json()["error"] == "TASK_ACCESS_DENIED", elsewhere.text
