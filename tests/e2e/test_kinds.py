"""More than one kind of task (issue 13), end to end over REST and gRPC: harness routing,
isolated-worktree admission, continuation, skill tasks and sub-task trees."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from google.rpc import error_details_pb2

from libs import proctree
from libs.grpc_client import error_info
from taskgate.scheduler.v1 import scheduler_pb2 as pb
from taskgate.scheduler.v1 import scheduler_pb2_grpc as pb_grpc
from tests.e2e.conftest import AGENT, SESSION, Api, wait_pid_file
from tests.support.stack import SKILL_BODY_MARKER


def steps(*items: object) -> str:
    return json.dumps(list(items))


def grpc_create(api: Api, **fields: Any) -> pb.Task:
    with api.stack.channel("scheduler", "gateway") as channel:
        reply = pb_grpc.SchedulerServiceStub(channel).CreateTask(
            pb.CreateTaskRequest(agent_id=AGENT, session_id=SESSION, **fields), timeout=30
        )
    return reply.task


def grpc_get(api: Api, task_id: str) -> pb.Task:
    with api.stack.channel("scheduler", "gateway") as channel:
        return pb_grpc.SchedulerServiceStub(channel).GetTask(pb.GetTaskRequest(task_id=task_id), timeout=30).task


def grpc_refusal(api: Api, **fields: Any) -> tuple[grpc.RpcError, error_details_pb2.ErrorInfo]:
    with pytest.raises(grpc.RpcError) as caught:
        grpc_create(api, **fields)
    info = error_info(caught.value)
    assert info is not None
    return caught.value, info


def count_tasks(api: Api) -> int:
    return int(api.request("GET", "/tasks?all=true&page_size=1").json()["total"])


def wait_text(path: Path, timeout_s: float = 15.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text()
        time.sleep(0.02)
    raise AssertionError(f"{path} was not written")


def alive(pid: int) -> bool:
    stat = proctree.read_stat(pid)
    return stat is not None and stat.alive


# --- 3: harness is routing, not a label -------------------------------------------------


def test_harness_comes_from_the_profile_and_a_mismatch_is_refused(api: Api) -> None:
    before = count_tasks(api)
    refused = api.request("POST", "/tasks", json={"title": "label", "profile": "behave", "harness": "codex"})
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"] == "HARNESS_MISMATCH"
    refused = api.request(
        "POST", "/tasks", json={"title": "model", "profile": "behave-codex", "harnessModel": "gpt-other"}
    )
    assert refused.status_code == 400 and refused.json()["error"] == "HARNESS_MISMATCH", refused.text
    exc, info = grpc_refusal(api, title="grpc label", profile="behave-codex", harness="claude")
    assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT and info.reason == "HARNESS_MISMATCH"
    assert count_tasks(api) == before, "a refused create leaves no task"

    # Asking for nothing, or for exactly what the profile runs, routes to it.
    created = api.create(
        "routed",
        profile="behave-codex",
        harness="codex",
        instructions=steps(
            {"usage": {"input_tokens": 10, "output_tokens": 1, "delta": True}},
            {"usage": {"input_tokens": 5, "cached_input_tokens": 2, "delta": True}},
        ),
    )
    assert created["harness"] == "codex" and created["harnessModel"] == "gpt-x"
    task = api.wait_state(created["taskId"], "completed", "failed")
    assert task["state"] == "completed"
    attempt = task["attempts"][0]
    assert attempt["harness"] == "codex" and attempt["harnessModel"] == "gpt-x"
    assert attempt["usage"] == {"inputTokens": 15, "cachedInputTokens": 2, "outputTokens": 1}, "deltas add up"
    totals = api.wait_state(
        api.create(
            "totals",
            profile="behave",
            instructions=steps({"usage": {"input_tokens": 10}}, {"usage": {"input_tokens": 12, "output_tokens": 3}}),
        )["taskId"],
        "completed",
    )
    assert totals["attempts"][0]["usage"] == {"inputTokens": 12, "outputTokens": 3}, "totals replace"
    assert "harness" not in totals and "harness" not in totals["attempts"][0], "never guessed"
    via_grpc = grpc_create(api, title="grpc routed", profile="behave-codex", instructions="[]")
    assert via_grpc.harness == "codex" and via_grpc.harness_model == "gpt-x"


# --- 7: admission -----------------------------------------------------------------------


def test_isolated_worktree_per_task_and_refusal_without_git(api: Api) -> None:
    out = api.stack.data_dir / "worktree-assigned.json"
    task = api.wait_state(
        api.create("in a worktree", profile="worktree", instructions=steps({"write_assignment": str(out)}))["taskId"],
        "completed",
        "failed",
    )
    assert task["state"] == "completed", task
    workspace = Path(task["workspace"]["path"])
    assert task["workspace"]["mode"] == "worktree" and workspace.name == task["taskId"]
    assert json.loads(out.read_text())["cwd"] == str(workspace), "the worker ran in its worktree"
    top = subprocess.run(
        ["git", "-C", str(workspace), "rev-parse", "--show-toplevel"], capture_output=True, text=True, check=True
    )
    assert top.stdout.strip() == str(workspace) and (workspace / "README.md").exists()
    other = api.create("another worktree", profile="worktree", instructions="[]")
    assert other["workspace"]["path"] != str(workspace), "one worktree per task"

    before = count_tasks(api)
    refused = api.request(
        "POST",
        "/tasks",
        json={"title": "no git", "profile": "worktree-nogit", "continueTaskId": task["taskId"]},
    )
    assert refused.status_code == 400, refused.text
    body = refused.json()
    assert body["error"] == "WORKER_GIT_PROJECT_REQUIRED" and body["retryable"] is True
    assert body["continueTaskId"] == task["taskId"], "echoed so the caller can retry"
    assert "project_root" in body["message"] and str(api.stack.data_dir) not in body["message"]
    exc, info = grpc_refusal(api, title="no git", profile="worktree-nogit")
    assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT and info.reason == "WORKER_GIT_PROJECT_REQUIRED"
    assert info.metadata["retryable"] == "true"
    assert count_tasks(api) == before, "refused before any task row exists"
    # default-worker needs no Git.
    assert api.create("no git needed", profile="exit-at-once")["workspace"]["mode"] == "agent"


# --- 6: continuation ------------------------------------------------------------------------


def test_continuation_works_in_the_same_workspace_and_links_both_ways(api: Api) -> None:
    first = api.wait_state(
        api.create(
            "first", profile="worktree", instructions=steps({"write_file": {"path": "notes.txt", "text": "step 1"}})
        )["taskId"],
        "completed",
    )
    out = api.stack.data_dir / "continued-assigned.json"
    second = api.create("second", continueTaskId=first["taskId"], instructions=steps({"write_assignment": str(out)}))
    assert second["continueTaskId"] == first["taskId"] and second["targetProfile"] == "worktree"
    assert second["workspace"] == first["workspace"], "the same workspace"
    api.wait_state(second["taskId"], "completed")
    assert json.loads(out.read_text())["cwd"] == first["workspace"]["path"]
    assert (Path(first["workspace"]["path"]) / "notes.txt").read_text() == "step 1"
    earlier = api.get(first["taskId"])
    assert earlier["continuedByTaskId"] == second["taskId"] and earlier["state"] == "completed"
    assert earlier["updatedAt"] == first["updatedAt"], "a link is not a state change"
    assert grpc_get(api, first["taskId"]).continued_by_task_id == second["taskId"]

    again = api.request("POST", "/tasks", json={"title": "third", "continueTaskId": first["taskId"]})
    assert again.status_code == 409 and again.json()["error"] == "ALREADY_CONTINUED", again.text
    running = api.create("running", profile="sleeper")
    api.wait_state(running["taskId"], "running")
    refused = api.request("POST", "/tasks", json={"title": "too early", "continueTaskId": running["taskId"]})
    assert refused.status_code == 400 and refused.json()["error"] == "TASK_NOT_FINISHED", refused.text
    missing = api.request("POST", "/tasks", json={"title": "nothing", "continueTaskId": "0" * 32})
    assert missing.status_code == 404, missing.text
    api.request("POST", f"/tasks/{running['taskId']}/cancel", json={})
    via_grpc = grpc_create(api, title="grpc continues", continue_task_id=second["taskId"], instructions="[]")
    assert via_grpc.continue_task_id == second["taskId"] and via_grpc.workspace.path == first["workspace"]["path"]


def test_updated_at_moves_with_tool_activity_and_state_changes(api: Api) -> None:
    created = api.create(
        "busy", profile="behave", instructions=steps({"sleep": 0.3}, {"tool": {"name": "bash"}}, {"sleep": 300})
    )
    running = api.wait_state(created["taskId"], "running")
    assert running["updatedAt"] > created["updatedAt"]
    tooled = api.wait_for(created["taskId"], lambda t: t.activity.last_tool.name == "bash")
    assert tooled["updatedAt"] == tooled["activity"]["lastTool"]["at"] > running["updatedAt"]
    api.request("POST", f"/tasks/{created['taskId']}/cancel", json={})
    ended = api.wait_state(created["taskId"], "cancelled")
    assert ended["updatedAt"] >= ended["timing"]["endedAt"] > tooled["updatedAt"]


# --- 4: skill tasks ------------------------------------------------------------------------


def test_a_skill_task_never_shows_its_body_or_host_paths(api: Api) -> None:
    skill_file = api.stack.data_dir / "skills" / "review.json"
    secrets = (SKILL_BODY_MARKER, str(skill_file), "review.json")
    seen: list[str] = []
    with httpx.stream(
        "GET", api.base + "/tasks/events", headers={"Authorization": f"Bearer {api.key}"}, timeout=30
    ) as stream:
        created = api.create("a review", skill={"name": "review", "args": {"target": "src", "depth": 2}})
        for line in stream.iter_lines():
            seen.append(line)
            if line.startswith("data: "):
                task = json.loads(line[len("data: ") :])["task"]
                if task["taskId"] == created["taskId"] and task["state"] in ("completed", "failed"):
                    break
    assert created["skill"] == {
        "name": "review",
        "args": {"depth": 2, "target": "src"},
        "invocation": '/review {"depth": 2, "target": "src"}',
    }
    assert created["instructions"] == "" and created["targetProfile"] == "behave"
    task = api.wait_state(created["taskId"], "completed", "failed")
    assert task["state"] == "completed", task
    assigned = json.loads((skill_file.parent / "assigned.json").read_text())
    assert SKILL_BODY_MARKER in assigned["instructions"], "the worker gets the body"
    assert assigned["skill_name"] == "review" and assigned["skill_args"] == {"depth": 2, "target": "src"}

    grpc_task = grpc_get(api, created["taskId"])
    assert grpc_task.skill.name == "review" and json.loads(grpc_task.skill.args_json)["target"] == "src"
    with api.stack.channel("scheduler", "gateway") as channel:
        events = pb_grpc.SchedulerServiceStub(channel).WatchTasks(
            pb.WatchTasksRequest(since_sequence=0, all_sessions=True), timeout=3
        )
        logged: list[str] = []
        try:
            for event in events:
                logged.append(str(event))
        except grpc.RpcError:
            pass
    time.sleep(0.5)  # the notifier's report of the ending
    answers = [
        api.request("GET", f"/tasks/{created['taskId']}").text,
        api.request("GET", "/tasks?all=true&page_size=100").text,
        api.request("GET", "/notifications?page_size=100").text,
        api.request("GET", "/messages?page_size=100").text,
        str(grpc_task),
        "\n".join(seen),
        "\n".join(logged),
    ]
    service_logs = "\n".join(p.logs() for p in api.stack.procs.values())
    for secret in secrets:
        for i, text in enumerate(answers):
            assert secret not in text, f"{secret!r} leaked in answer {i}"
        assert secret not in service_logs, f"{secret!r} leaked in a service log"

    for body, reason in (
        ({"name": "review", "args": {"depth": 2}}, "INVALID_SKILL_ARGS"),
        ({"name": "review", "args": {"target": "x", "depth": "deep"}}, "INVALID_SKILL_ARGS"),
        ({"name": "review", "args": {"target": "x", "extra": 1}}, "INVALID_SKILL_ARGS"),
        ({"name": "nope", "args": {}}, "UNKNOWN_SKILL"),
    ):
        refused = api.request("POST", "/tasks", json={"title": "bad", "skill": body})
        assert refused.status_code == 400 and refused.json()["error"] == reason, (body, refused.text)
    refused = api.request("POST", "/tasks", json={"title": "bad", "instructions": "x", "skill": {"name": "review"}})
    assert refused.status_code == 400, refused.text
    exc, info = grpc_refusal(api, title="g", skill=pb.SkillInvocation(name="review", args_json="[1]"))
    assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT and info.reason == "INVALID_SKILL_ARGS"


# --- 5: sub-task trees -----------------------------------------------------------------------


def test_a_three_level_tree_is_cancelled_from_the_top_children_first(api: Api, tmp_path: Path) -> None:
    pids = {name: tmp_path / f"{name}.pid" for name in ("root", "child", "sibling", "grandchild")}
    spawned = {name: tmp_path / f"{name}.ids" for name in ("root", "child", "grandchild")}
    grandchild = [
        {"spawn": {"title": "too deep", "out": str(spawned["grandchild"])}},
        {"write_pid": str(pids["grandchild"])},
        {"trap_term": True},
        {"sleep": 300},
    ]
    child = [
        {"spawn": {"title": "grandchild", "steps": grandchild, "out": str(spawned["child"])}},
        {"tool": {"name": "bash"}},
        {"touched": ["src/child.py"]},
        {"write_pid": str(pids["child"])},
        {"sleep": 300},
    ]
    root = api.create(
        "root",
        profile="behave",
        instructions=steps(
            {"spawn": {"title": "child", "steps": child, "profile": "behave-codex", "out": str(spawned["root"])}},
            {
                "spawn": {
                    "title": "sibling",
                    "steps": [{"write_pid": str(pids["sibling"])}, {"sleep": 300}],
                    "out": str(spawned["root"]),
                }
            },
            {"spawn": {"title": "one too many", "out": str(spawned["root"])}},
            {"tool": {"name": "read_file"}},
            {"write_pid": str(pids["root"])},
            {"sleep": 300},
        ),
    )
    live = {name: wait_pid_file(path, timeout_s=30) for name, path in pids.items()}
    wait_text(spawned["grandchild"])
    root_ids = spawned["root"].read_text().splitlines()
    child_id, sibling_id = root_ids[0], root_ids[1]
    assert root_ids[2].startswith("error: INVALID_ARGUMENT") and "at most 2 sub-tasks" in root_ids[2], root_ids
    grandchild_id = spawned["child"].read_text().splitlines()[0]
    too_deep = spawned["grandchild"].read_text()
    assert too_deep.startswith("error: INVALID_ARGUMENT") and "2 levels" in too_deep, too_deep

    detail = api.wait_for(
        root["taskId"], lambda t: len(t.activity.recent_tools) > 0 and t.state == pb.TASK_STATE_RUNNING
    )
    assert [(s["taskId"], s["title"]) for s in detail["subagents"]] == [(child_id, "child"), (sibling_id, "sibling")]
    assert detail["subagents"][0]["harness"] == "codex" and detail["subagents"][0]["harnessModel"] == "gpt-x"
    evidence = detail["evidence"]
    assert sorted(evidence["subagents"]) == sorted([child_id, sibling_id, grandchild_id])
    assert evidence["subagentModels"] == ["gpt-x"] and evidence["currentFilesystemVerified"] is False
    assert {"name": "read_file", "count": 1} in evidence["toolCounts"]
    child_detail = api.wait_for(child_id, lambda t: "src/child.py" in t.observed_paths)
    assert child_detail["parentTaskId"] == root["taskId"]
    assert child_detail["subagents"][0]["taskId"] == grandchild_id
    assert grpc_get(api, root["taskId"]).evidence.subagents, "the same over gRPC"
    full = api.get(root["taskId"])
    assert "src/child.py" in full["evidence"]["observedPaths"]
    assert {"name": "bash", "count": 1} in full["evidence"]["toolCounts"]
    listed = api.request("GET", "/tasks").json()["tasks"]
    assert all("subagents" not in t for t in listed), "detail only"

    response = api.request("POST", f"/tasks/{root['taskId']}/cancel", json={})
    assert response.status_code == 200 and response.json()["task"]["state"] == "cancel_requested"
    ended = api.wait_state(root["taskId"], "cancelled", "needs_reconciliation", timeout_s=60)
    assert ended["state"] == "cancelled" and ended["cancellation"]["cleanup"] == "confirmed"
    tree = {
        name: api.get(task_id)
        for name, task_id in (("child", child_id), ("sibling", sibling_id), ("grandchild", grandchild_id))
    }
    assert {t["state"] for t in tree.values()} == {"cancelled"}
    assert all(t["cancellation"]["cleanup"] == "confirmed" for t in tree.values())
    # Children first: the grandchild (it ignores SIGTERM) ended before its parent, which ended before the root.
    assert tree["grandchild"]["timing"]["endedAt"] <= tree["child"]["timing"]["endedAt"]
    assert tree["child"]["timing"]["endedAt"] <= ended["timing"]["endedAt"]
    assert tree["sibling"]["timing"]["endedAt"] <= ended["timing"]["endedAt"]
    assert not [name for name, pid in live.items() if alive(pid)], "every process of the tree is gone"


def test_a_worker_waits_for_cancels_only_its_own_sub_tasks(api: Api, tmp_path: Path) -> None:
    ids, sleepers, out = tmp_path / "ids", tmp_path / "sleepers", tmp_path / "cancels"
    stranger = api.create("stranger", profile="sleeper")
    root = api.create(
        "waiter",
        profile="behave",
        instructions=steps(
            {"spawn": {"title": "quick", "steps": [{"result": {"text": "sub done"}}], "out": str(ids)}},
            {"wait_children": {"ids": str(ids)}},
            {"spawn": {"title": "sleepy", "steps": [{"sleep": 300}], "out": str(sleepers)}},
            {"cancel_task": {"task_id": stranger["taskId"], "out": str(out)}},
            {"cancel_task": {"ids": str(sleepers), "out": str(out)}},
            {"progress": "cancelled"},
            {"sleep": 300},
        ),
    )
    said: list[str] = []

    def children_said(t: pb.Task) -> bool:
        # Kept from the event itself: the worker moves on at once, so a later snapshot may say more.
        if t.progress.text.startswith("children:"):
            said.append(t.progress.text)
        return bool(said)

    api.wait_for(root["taskId"], children_said)
    assert said == ["children: completed"]
    child_id = ids.read_text().split()[0]
    assert api.get(child_id)["result"]["text"] == "sub done"
    api.wait_for(root["taskId"], lambda t: t.progress.text == "cancelled")
    refused, cancelled = out.read_text().splitlines()
    assert refused.startswith("error: PERMISSION_DENIED") and "not a sub-task" in refused, refused
    assert cancelled in ("cancel_requested", "cancelled")
    sleepy = api.wait_state(sleepers.read_text().split()[0], "cancelled")
    assert sleepy["cancellation"]["cleanup"] == "confirmed"
    assert api.get(stranger["taskId"])["state"] == "running", "another tree's task is untouched"
    # The root cancelled over gRPC; its finished sub-tasks keep their states.
    with api.stack.channel("scheduler", "gateway") as channel:
        reply = pb_grpc.SchedulerServiceStub(channel).CancelTask(
            pb.CancelTaskRequest(task_id=root["taskId"]), timeout=30
        )
    assert reply.task.state in (pb.TASK_STATE_CANCEL_REQUESTED, pb.TASK_STATE_CANCELLED)
    api.wait_state(root["taskId"], "cancelled")
    assert api.get(child_id)["state"] == "completed"
    api.request("POST", f"/tasks/{stranger['taskId']}/cancel", json={})
