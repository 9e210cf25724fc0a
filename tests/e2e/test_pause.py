"""Pause keeps, user cancel deletes (seed 000), over the real processes: a paused task
keeps its question; an answer given while paused reaches the resumed worker
(TASKGATE_RESUME=1); a user cancel closes the question and a later answer is refused."""

from __future__ import annotations

import json
from pathlib import Path

from tests.e2e.conftest import Api


def test_pause_keeps_the_question_and_resume_delivers_the_answer(api: Api, tmp_path: Path) -> None:
    env_file = tmp_path / "env.json"
    steps = [
        {"write_env": str(env_file)},
        {"progress": "half way"},
        {"ask": "Which database?"},
        {"result": {"text": "done"}},
    ]
    task = api.create("pausable", profile="behave", instructions=json.dumps(steps))
    task_id = task["taskId"]
    question = api.wait_state(task_id, "waiting_input")["pendingQuestion"]
    assert json.loads(env_file.read_text()).get("TASKGATE_RESUME") is None
    paused = api.request("POST", f"/tasks/{task_id}/pause")
    assert paused.status_code == 200, paused.text
    snapshot = api.wait_state(task_id, "paused")
    assert snapshot["pendingQuestion"]["questionId"] == question["questionId"]  # the question is kept
    assert "endedAt" not in snapshot["timing"]  # not terminal
    assert api.request("POST", f"/tasks/{task_id}/pause").json()["task"]["state"] == "paused"  # a no-op
    # Answered while paused: stored, the worker gets it once resumed.
    answered = api.request(
        "POST", f"/tasks/{task_id}/answer", json={"questionId": question["questionId"], "answer": "Postgres"}
    )
    assert answered.status_code == 200, answered.text
    assert answered.json()["task"]["state"] == "paused"
    env_file.unlink()
    resumed = api.request("POST", f"/tasks/{task_id}/resume")
    assert resumed.status_code == 200 and resumed.json()["task"]["state"] in ("queued", "running"), resumed.text
    done = api.wait_state(task_id, "completed")
    assert done["progress"]["text"] == "answer: Postgres" and done["result"]["text"] == "done"
    worker_env = json.loads(env_file.read_text())
    assert worker_env["TASKGATE_RESUME"] == "1" and worker_env["TASKGATE_LAST_PROGRESS"] == "half way"


def test_user_cancel_closes_the_question_and_a_later_answer_is_403(api: Api) -> None:
    steps = [{"ask": "Which database?"}, {"result": {"text": "done"}}]
    task = api.create("cancel me", profile="behave", instructions=json.dumps(steps))
    task_id = task["taskId"]
    question = api.wait_state(task_id, "waiting_input")["pendingQuestion"]
    assert api.request("POST", f"/tasks/{task_id}/pause").status_code == 200
    api.wait_state(task_id, "paused")
    cancelled = api.request("POST", f"/tasks/{task_id}/cancel")
    assert cancelled.json()["task"]["state"] == "cancelled", cancelled.text  # nothing runs: at once
    late = api.request(
        "POST", f"/tasks/{task_id}/answer", json={"questionId": question["questionId"], "answer": "Postgres"}
    )
    assert late.status_code == 403 and late.json()["error"] == "TASK_FINISHED", late.text
    assert api.request("POST", f"/tasks/{task_id}/resume").json()["task"]["state"] == "cancelled"
