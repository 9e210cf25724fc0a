"""Worker lifecycle end to end: reports, exits, kills and cancellation proven by the process tree."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import grpc
import pytest

from libs import proctree
from taskgate.scheduler.v1 import scheduler_pb2 as pb
from taskgate.scheduler.v1 import scheduler_pb2_grpc as pb_grpc
from tests.e2e.conftest import Api, wait_pid_file

RUNNING = pb.TASK_STATE_RUNNING


def steps(*items: object) -> str:
    return json.dumps(list(items))


def started(api: Api, title: str, *items: object, **extra: object) -> dict:
    created = api.create(title, profile="behave", instructions=steps(*items), **extra)
    return api.wait_state(created["taskId"], "running")


def wait_progress(api: Api, task_id: str, text: str) -> dict:
    return api.wait_for(task_id, lambda t: t.progress.text == text)


def alive(pid: int) -> bool:
    stat = proctree.read_stat(pid)
    return stat is not None and stat.alive


def test_reports_fill_the_snapshot(api: Api) -> None:
    created = api.create(
        "reporting",
        profile="behave-codex",
        harness="codex",
        harnessModel="gpt-x",
        instructions=steps(
            {"progress": "reading"},
            {"tool": {"name": "bash", "status": "error", "exit_code": 2}},
            {"tool": {"name": "read_file"}},
            {"touched": ["src/a.py", "src/b.py"]},
            {"usage": {"input_tokens": 100, "output_tokens": 7}},
            {"result": {"text": "the full result " * 40}},
        ),
    )
    task = api.wait_state(created["taskId"], "completed", "failed")
    assert task["state"] == "completed"
    assert task["progress"]["text"] == "reading"
    assert task["activity"]["lastTool"]["name"] == "read_file"
    assert "exitCode" not in task["activity"]["lastTool"], "no exit code unless one was given"
    assert [t["name"] for t in task["activity"]["recentTools"]] == ["bash", "read_file"]
    assert task["activity"]["recentTools"][0] == {
        **task["activity"]["recentTools"][0],
        "status": "error",
        "exitCode": 2,
    }
    assert task["observedPaths"] == ["src/a.py", "src/b.py"]
    assert task["currentFilesystemVerified"] is False
    assert task["harness"] == "codex" and task["harnessModel"] == "gpt-x"
    assert task["attempts"][0]["usage"] == {"inputTokens": 100, "outputTokens": 7}
    assert task["result"]["text"] == "the full result " * 40
    assert task["workspace"]["mode"] == "agent" and task["workspace"]["path"].endswith("/workspaces/agent-1")
    elapsed = task["timing"]["elapsedMs"]
    time.sleep(0.05)
    assert api.get(created["taskId"])["timing"]["elapsedMs"] == elapsed, "elapsed freezes at the end"
    listed = api.request("GET", "/tasks?all=true").json()["tasks"]
    entry = next(t for t in listed if t["taskId"] == created["taskId"])
    assert len(entry["result"]["text"]) <= 280 < len(task["result"]["text"]), "list previews are bounded"


def test_the_worker_log_tail_over_rest(api: Api) -> None:
    created = api.create("printing", profile="behave", instructions=steps({"print": "line one"}, {"print": "line two"}))
    api.wait_state(created["taskId"], "completed")
    log = api.request("GET", f"/tasks/{created['taskId']}/log").json()
    assert log == {
        "taskId": created["taskId"],
        "attempt": 1,
        "sizeBytes": 18,
        "truncated": False,
        "expired": False,
        "text": "line one\nline two\n",
    }
    tail = api.request("GET", f"/tasks/{created['taskId']}/log?tailBytes=9").json()
    assert (tail["text"], tail["truncated"]) == ("line two\n", True)


def test_harness_is_omitted_when_unknown(api: Api) -> None:
    task = api.wait_state(api.create("plain", profile="exit-at-once")["taskId"], "completed")
    assert "harness" not in task and "harnessModel" not in task


def test_killed_from_outside_is_worker_killed(api: Api, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    task = started(api, "victim", {"write_pid": str(pid_file)}, {"sleep": 300})
    os.kill(wait_pid_file(pid_file), signal.SIGKILL)
    task = api.wait_state(task["taskId"], "failed", "completed")
    assert task["failure"]["code"] == "WORKER_KILLED" and "SIGKILL" in task["failure"]["message"]


def test_cancel_a_cooperative_worker(api: Api, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    task = started(api, "coop", {"write_pid": str(pid_file)}, {"sleep": 300})
    pid = wait_pid_file(pid_file)
    marker = Path(task["workspace"]["path"]) / "keep-me.txt"
    marker.write_text("work in progress")
    response = api.request("POST", f"/tasks/{task['taskId']}/cancel", json={})
    assert response.status_code == 200
    assert set(response.json()["task"]) == {"taskId", "state"}
    assert response.json()["task"]["state"] in ("cancel_requested", "cancelled")
    task = api.wait_state(task["taskId"], "cancelled", "needs_reconciliation")
    assert task["state"] == "cancelled"
    assert task["cancellation"]["cause"] == "user_canceled" and task["cancellation"]["cleanup"] == "confirmed"
    assert not alive(pid) and marker.read_text() == "work in progress", "workspace files are kept"


def test_cancel_records_the_replacement(api: Api) -> None:
    replacement = api.create("replacement", profile="sleeper")
    task = api.create("replaced", profile="sleeper")
    api.wait_state(task["taskId"], "running")
    response = api.request("POST", f"/tasks/{task['taskId']}/cancel", json={"replacedByTaskId": replacement["taskId"]})
    assert response.status_code == 200
    done = api.wait_state(task["taskId"], "cancelled")
    assert done["cancellation"]["replacedByTaskId"] == replacement["taskId"]
    assert (
        api.request("POST", f"/tasks/{replacement['taskId']}/cancel", json={"replacedByTaskId": "nope"}).status_code
        == 400
    )
    api.request("POST", f"/tasks/{replacement['taskId']}/cancel")
    api.wait_state(replacement["taskId"], "cancelled")


def test_a_worker_ignoring_sigterm_is_killed_after_the_grace(api: Api, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    task = started(api, "stubborn", {"trap_term": True}, {"write_pid": str(pid_file)}, {"sleep": 300})
    pid = wait_pid_file(pid_file)
    began = time.monotonic()
    api.request("POST", f"/tasks/{task['taskId']}/cancel")
    task = api.wait_state(task["taskId"], "cancelled", "needs_reconciliation")
    assert task["state"] == "cancelled"
    assert time.monotonic() - began >= 1.0, "SIGKILL only after cancel_grace_ms (1000 in this stack)"
    assert not alive(pid)
    assert task["attempts"][0]["outcome"] == "stopped:cancel"


def test_cancel_stops_grandchildren_in_the_group(api: Api, tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild-parent"
    task = started(api, "family", {"grandchild": {"seconds": 300, "pid_file": str(pid_file)}}, {"sleep": 300})
    shell = wait_pid_file(pid_file)
    table = proctree.process_table()
    grandchildren = [p.pid for p in proctree.live_descendants(table, shell)]
    assert grandchildren, "the shell's sleep is running"
    api.request("POST", f"/tasks/{task['taskId']}/cancel")
    task = api.wait_state(task["taskId"], "cancelled", "needs_reconciliation")
    assert task["state"] == "cancelled"
    assert not alive(shell) and not any(alive(p) for p in grandchildren)


def test_processes_left_in_the_group_end_with_the_worker(api: Api, tmp_path: Path) -> None:
    pid_file = tmp_path / "leftover"
    task = api.create(
        "leaves a child behind",
        profile="behave",
        instructions=steps({"grandchild": {"seconds": 300, "pid_file": str(pid_file)}}, {"result": {"text": "ok"}}),
    )
    done = api.wait_state(task["taskId"], "completed", "failed")
    assert done["state"] == "completed" and done["result"]["text"] == "ok"
    shell = wait_pid_file(pid_file)
    assert not alive(shell), "a leftover in the worker's group is stopped before the task ends"


def test_a_child_that_escaped_the_group_is_recorded_and_stopped_before_cancelled(api: Api, tmp_path: Path) -> None:
    pid_file = tmp_path / "escaped"
    task = started(api, "escapee", {"escape": {"seconds": 300, "pid_file": str(pid_file)}}, {"sleep": 300})
    escaped = wait_pid_file(pid_file)
    try:
        api.request("POST", f"/tasks/{task['taskId']}/cancel")
        task = api.wait_state(task["taskId"], "cancelled", "needs_reconciliation")
        assert task["state"] == "cancelled" and task["cancellation"]["cleanup"] == "confirmed"
        assert escaped in [d["pid"] for d in task["attempts"][0]["descendants"]]
        assert not alive(escaped), "a recorded descendant (identity-checked) is stopped with its task"
    finally:
        if alive(escaped):
            os.kill(escaped, signal.SIGKILL)


def test_cancel_of_a_finished_task_keeps_its_state(api: Api) -> None:
    task = api.wait_state(api.create("quick", profile="exit-at-once")["taskId"], "completed")
    response = api.request("POST", f"/tasks/{task['taskId']}/cancel")
    assert response.status_code == 200 and response.json()["task"]["state"] == "completed"
    assert "cancellation" not in api.get(task["taskId"])


def test_cancel_of_a_queued_task_is_immediate(api: Api) -> None:
    blockers = [api.create(f"block{i}", profile="sleeper") for i in range(4)]  # max_running = 4
    for b in blockers:
        api.wait_state(b["taskId"], "running")
    queued = api.create("waits", profile="sleeper")
    try:
        assert api.get(queued["taskId"])["state"] == "queued"
        response = api.request("POST", f"/tasks/{queued['taskId']}/cancel")
        assert response.json()["task"]["state"] == "cancelled"
        assert api.get(queued["taskId"])["attempts"] == []
    finally:
        for b in blockers:
            api.request("POST", f"/tasks/{b['taskId']}/cancel")
        for b in blockers:
            api.wait_state(b["taskId"], "cancelled")


def test_worker_reports_need_the_current_token(api: Api, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    task = api.create("leaks its token", profile="behave", instructions=steps({"write_token": str(token_file)}))
    api.wait_state(task["taskId"], "completed")
    stale = token_file.read_text()
    with grpc.insecure_channel(api.stack.worker_addr) as channel:
        stub = pb_grpc.WorkerServiceStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.ReportProgress(
                pb.ReportProgressRequest(text="late"), metadata=(("x-taskgate-worker-token", stale),), timeout=10
            )
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED, "a finished attempt's token is stale"
    assert "progress" not in api.get(task["taskId"])
    with grpc.insecure_channel(api.stack.addr("scheduler")) as channel:
        with pytest.raises(grpc.RpcError) as err:
            pb_grpc.WorkerServiceStub(channel).GetAssignment(pb.GetAssignmentRequest(), timeout=10)
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED, "the scheduler's port serves no worker API"
    with grpc.insecure_channel(api.stack.worker_addr) as channel:
        stub = pb_grpc.WorkerServiceStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.ReportProgress(
                pb.ReportProgressRequest(text="x"), metadata=(("x-taskgate-worker-token", "forged"),), timeout=10
            )
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        with pytest.raises(grpc.RpcError) as err:
            stub.ReportProgress(pb.ReportProgressRequest(text="x"), timeout=10)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
