"""History retention across the real processes: the scheduler deletes a task past
``[tasks] finished_task_retention_ms`` (REST then answers 404) and the newest task stays; the
notifier deletes the delivered report past ``[notifier] notification_retention_ms``, and the
conversation keeps the report's message until ``[notifier] conversation_retention_ms``; the
worker's log goes by ``worker_log_retention_ms``; the pending-registry deletes an ended task's
questions past ``pending_question_retention_ms``."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import grpc
import pytest

from services.scheduler.worker_log import attempt_log_path
from taskgate.pending.v1 import pending_pb2 as ppb
from taskgate.pending.v1 import pending_pb2_grpc as ppb_grpc
from taskgate.scheduler.v1 import scheduler_pb2 as pb
from tests.e2e.conftest import AGENT, SESSION, Api, add_member, create_key
from tests.support.stack import Stack, make_stack

RETENTION_MS = 3000  # the scheduler then looks every second (a tenth, at least 1 s)
# Long enough after the notification's that the message is seen to outlive it, however slow the run.
CONVERSATION_RETENTION_MS = 4 * RETENTION_MS


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    stack: Stack = make_stack(tmp_path_factory.mktemp("retention"))
    stack.env["TASKGATE_TASKS_FINISHED_TASK_RETENTION_MS"] = str(RETENTION_MS)
    stack.env["TASKGATE_NOTIFIER_NOTIFICATION_RETENTION_MS"] = str(RETENTION_MS)
    stack.env["TASKGATE_TASKS_WORKER_LOG_RETENTION_MS"] = str(RETENTION_MS)
    stack.env["TASKGATE_NOTIFIER_CONVERSATION_RETENTION_MS"] = str(CONVERSATION_RETENTION_MS)
    stack.env["TASKGATE_PENDING_QUESTION_RETENTION_MS"] = str(RETENTION_MS)
    stack.start()
    try:
        key = create_key(stack, "alice", AGENT)
        add_member(stack, AGENT, SESSION, "alice")
        yield Api(stack, key)
    finally:
        stack.stop()


def reported(api: Api, task_id: str) -> list[dict[str, object]]:
    notes = api.request("GET", "/notifications").json()["notifications"]
    return [n for n in notes if n.get("taskId") == task_id]


def test_a_task_its_notification_and_then_its_message_go_past_their_retentions(api: Api) -> None:
    old = api.create("old", profile="behave", instructions='[{"result": {"text": "old result"}}]')
    api.wait_state(old["taskId"], "completed")
    old_log = attempt_log_path(api.stack.data_dir, old["taskId"], 1)
    assert old_log.exists()
    finished_at = time.monotonic()
    deadline = finished_at + 30
    while not reports_of(api):
        assert time.monotonic() < deadline, "the notifier never reported the task"
        time.sleep(0.1)
    assert api.request("GET", f"/tasks/{old['taskId']}").status_code == 200  # not yet past the retention
    assert [n["state"] for n in reported(api, old["taskId"])] == ["delivered"]  # to the conversation (no channel)

    # A newer task: its events are then the log's newest, which retention never deletes.
    new = api.create("new", profile="behave", instructions='[{"result": {"text": "new result"}}]')
    api.wait_state(new["taskId"], "completed")
    while (gone := api.request("GET", f"/tasks/{old['taskId']}")).status_code == 200:
        assert time.monotonic() < deadline, "the finished task was never deleted"
        time.sleep(0.2)
    assert time.monotonic() - finished_at >= RETENTION_MS / 1000 - 0.5  # not before its time (clock slack)
    assert gone.status_code == 404 and gone.json()["error"] == "TASK_NOT_FOUND"
    listed = api.request("GET", "/tasks?all=true").json()
    assert [t["taskId"] for t in listed["tasks"]] == [new["taskId"]]
    assert api.get(new["taskId"])["state"] == "completed"
    while reported(api, old["taskId"]):
        assert time.monotonic() < deadline, "the delivered notification was never deleted"
        time.sleep(0.2)
    # The conversation keeps the report's message, task and notification gone.
    assert any("old result" in m["text"] for m in reports_of(api)), reports_of(api)
    while old_log.exists():  # the worker's log too, by its own retention
        assert time.monotonic() < deadline, "the worker log was never deleted"
        time.sleep(0.2)
    # Until the conversation's own retention takes the message too.
    while any("old result" in m["text"] for m in reports_of(api)):
        assert time.monotonic() < deadline, "the report's message was never deleted"
        time.sleep(0.2)
    assert time.monotonic() - finished_at >= CONVERSATION_RETENTION_MS / 1000 - 0.5
    # Each pass logs once it has found nothing more to delete: a moment after the row went.
    events = ("finished_tasks_pruned", "notifications_pruned", "worker_logs_pruned", "conversations_pruned")
    while missing := [e for e in events if e not in "".join(proc.logs() for proc in api.stack.procs.values())]:
        assert time.monotonic() < deadline, f"no log line of these passes: {missing}"
        time.sleep(0.2)


def reports_of(api: Api) -> list[dict[str, str]]:
    return [m for m in api.request("GET", "/messages").json()["messages"] if m["role"] == "notification"]


def test_an_ended_tasks_questions_go_past_their_retention(api: Api) -> None:
    steps = [{"ask_nowait": "first?"}, {"ask": "second?"}, {"result": {"text": "finished"}}]
    created = api.create("asks", profile="behave", instructions=json.dumps(steps))
    asked: dict[str, str] = {}

    def both_asked(t: pb.Task) -> bool:
        if t.pending_question.question_id:
            asked[t.pending_question.text] = t.pending_question.question_id
        return "second?" in asked

    api.wait_for(created["taskId"], both_asked)
    answered = api.request(
        "POST", f"/tasks/{created['taskId']}/answer", json={"questionId": asked["second?"], "answer": "yes"}
    )
    assert answered.status_code == 200, answered.text
    api.wait_state(created["taskId"], "completed")
    ended_at = time.monotonic()
    with api.stack.channel("pending") as channel:
        stub = ppb_grpc.PendingRegistryServiceStub(channel)

        def known(question_id: str) -> bool:
            try:
                stub.GetQuestion(ppb.GetQuestionRequest(question_id=question_id), timeout=10)
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.NOT_FOUND, exc
                return False
            return True

        # Both revisions (the replaced one and the answered one) stay until the retention, then go.
        assert known(asked["first?"]) and known(asked["second?"])
        deadline = ended_at + 30
        while known(asked["first?"]) or known(asked["second?"]):
            assert time.monotonic() < deadline, "the ended task's questions were never deleted"
            time.sleep(0.2)
    assert time.monotonic() - ended_at >= RETENTION_MS / 1000 - 0.5  # not before its time (clock slack)
    while "questions_pruned" not in api.stack.procs["pending"].logs():  # logged once the pass ends
        assert time.monotonic() < deadline, "no questions_pruned line"
        time.sleep(0.2)
