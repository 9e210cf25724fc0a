"""A worker asks, a person answers over REST, the worker gets it exactly once — also across restarts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import httpx
import pytest

from taskgate.pending.v1 import pending_pb2 as ppb
from taskgate.pending.v1 import pending_pb2_grpc as ppb_grpc
from taskgate.scheduler.v1 import scheduler_pb2 as pb
from tests.e2e.conftest import Api, add_member, run_cli
from tests.support.procs import REPO
from tests.support.stack import Stack


def asking(api: Api, *questions: str, title: str = "asks") -> dict:
    steps: list[dict] = [{"ask_nowait": q} for q in questions[:-1]] + [{"ask": questions[-1]}]
    steps.append({"result": {"text": "finished"}})
    created = api.create(title, profile="behave", instructions=json.dumps(steps))
    return api.wait_for(
        created["taskId"], lambda t: t.state == pb.TASK_STATE_WAITING_INPUT and t.pending_question.text == questions[-1]
    )


def answer(api: Api, task_id: str, question_id: str, text: str | None) -> httpx.Response:
    body = {"questionId": question_id} | ({"answer": text} if text is not None else {})
    return api.request("POST", f"/tasks/{task_id}/answer", json=body)


def test_question_answer_and_resume(api: Api) -> None:
    long_question = "Which database should I use? " + "context " * 100
    task = asking(api, long_question)
    question = task["pendingQuestion"]
    assert task["state"] == "waiting_input" and question["text"] == long_question and question["revision"] == 1
    listed = next(t for t in api.request("GET", "/tasks").json()["tasks"] if t["taskId"] == task["taskId"])
    assert listed["pendingQuestion"]["questionId"] == question["questionId"]
    assert len(listed["pendingQuestion"]["text"]) < len(long_question), "list previews are bounded"

    response = answer(api, task["taskId"], question["questionId"], "Use the existing database.")
    assert response.status_code == 200, response.text
    assert response.json()["task"]["taskId"] == task["taskId"]
    done = api.wait_state(task["taskId"], "completed", "failed")
    assert done["state"] == "completed" and done["progress"]["text"] == "answer: Use the existing database."
    assert "pendingQuestion" not in done

    again = answer(api, task["taskId"], question["questionId"], "Use the existing database.")
    assert again.status_code == 200, "the same answer again is idempotent"
    other = answer(api, task["taskId"], question["questionId"], "Use a new one.")
    assert other.status_code == 403 and other.json()["error"]


def test_a_new_question_replaces_the_open_one(api: Api) -> None:
    steps = [{"ask_nowait": "first?"}, {"ask": "second?"}, {"result": {"text": "finished"}}]
    created = api.create("asks twice", profile="behave", instructions=json.dumps(steps))
    seen: dict[str, str] = {}

    def both_asked(t: pb.Task) -> bool:
        if t.pending_question.question_id:
            seen[t.pending_question.text] = t.pending_question.question_id
        return "second?" in seen

    task = api.wait_for(created["taskId"], both_asked)
    current = task["pendingQuestion"]
    assert current["text"] == "second?" and current["revision"] == 2
    assert seen["first?"] != current["questionId"]
    stale = answer(api, task["taskId"], seen["first?"], "late answer")
    assert stale.status_code == 403, "a replaced question cannot be answered"
    assert answer(api, task["taskId"], current["questionId"], "ok").status_code == 200
    assert api.wait_state(task["taskId"], "completed", "failed")["state"] == "completed"


def test_bad_answers(stack: Stack, api: Api) -> None:
    task = asking(api, "pick one?")
    qid = task["pendingQuestion"]["questionId"]
    for body_answer, status in [("", 400), ("   ", 400), (None, 400)]:
        response = answer(api, task["taskId"], qid, body_answer)
        assert response.status_code == status, (body_answer, response.text)
    assert answer(api, task["taskId"], "not-a-uuid", "x").status_code == 400
    assert answer(api, task["taskId"], "f" * 32, "x").status_code == 403
    add_member(stack, api.agent, "cli-q-other", "alice")
    elsewhere = Api(stack, api.key, session="cli-q-other")
    assert answer(elsewhere, task["taskId"], qid, "x").status_code == 403
    api.request("POST", f"/tasks/{task['taskId']}/cancel")
    api.wait_state(task["taskId"], "cancelled")


def test_the_answer_survives_a_registry_restart(stack: Stack, api: Api) -> None:
    task = asking(api, "still there?")
    stack.procs["pending"].kill()
    stack.procs["pending"].start()
    response = answer(api, task["taskId"], task["pendingQuestion"]["questionId"], "yes")
    assert response.status_code == 200, response.text
    done = api.wait_state(task["taskId"], "completed", "failed", timeout_s=60)
    assert done["state"] == "completed" and done["progress"]["text"] == "answer: yes"


def test_a_resumed_worker_gets_the_answer_saved_while_it_was_down(stack: Stack, api: Api) -> None:
    task = asking(api, "what now?")
    qid = task["pendingQuestion"]["questionId"]
    stack.procs["scheduler"].stop()  # graceful: the worker is stopped, the task re-queued for resumption
    with stack.channel("pending") as channel:
        ppb_grpc.PendingRegistryServiceStub(channel).AnswerQuestion(
            ppb.AnswerQuestionRequest(
                task_id=task["taskId"], question_id=qid, answer="carry on", answered_by="chat-bot"
            ),
            timeout=10,
        )
    stack.procs["scheduler"].start()
    done = api.wait_state(task["taskId"], "completed", "failed", timeout_s=60)
    assert done["state"] == "completed" and done["progress"]["text"] == "answer: carry on"
    # Resumed once in revision 1; the answer then started revision 2 (its resume count starts again).
    assert done["restartResume"] == {"count": 0, "revision": 2, "pending": False}
    assert len(done["attempts"]) == 2


def test_cli_answers_a_task_question(stack: Stack, api: Api) -> None:
    task = asking(api, "cli?")
    result = run_cli(
        stack,
        "tasks",
        "--url",
        stack.http_url,
        "--api-key",
        api.key,
        "--agent",
        api.agent,
        "--session",
        api.session,
        "answer",
        task["taskId"],
        "--question",
        task["pendingQuestion"]["questionId"],
        "from the terminal",
    )
    assert result.returncode == 0, result.stderr
    assert "answer saved" in result.stdout
    assert api.wait_state(task["taskId"], "completed")["progress"]["text"] == "answer: from the terminal"


def test_pending_listen_claims_and_answers_entries(stack: Stack) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway_http.cli.main", "pending", "listen", "--prefix", "cli-"],
        cwd=REPO,
        env={**os.environ, **stack.env},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert "listening" in proc.stdout.readline()
        with stack.channel("pending", "frontend") as channel:
            stub = ppb_grpc.PendingRegistryServiceStub(channel)
            assert stub.HasListener(ppb.HasListenerRequest(origin="cli-"), timeout=10).has_listener
            result: dict[str, str] = {}

            def produce() -> None:
                reply = stub.Ask(
                    ppb.AskRequest(session_id="cli-42", kind=ppb.ENTRY_KIND_CONFIRM, payload="delete the branch?"),
                    timeout=30,
                )
                result["answer"] = reply.answer

            producer = threading.Thread(target=produce)
            producer.start()
            shown = ""
            while "delete the branch?" not in shown:
                shown = proc.stdout.readline()
                assert shown, "the CLI stopped before showing the entry"
            proc.stdin.write("yes\n")
            proc.stdin.flush()
            producer.join(timeout=30)
            assert result == {"answer": "yes"}
    finally:
        proc.terminate()
        proc.wait(timeout=10)


pytestmark = pytest.mark.e2e


def _question_state(stack: Stack, question_id: str) -> int:
    with stack.channel("pending") as channel:
        stub = ppb_grpc.PendingRegistryServiceStub(channel)
        return stub.GetQuestion(ppb.GetQuestionRequest(question_id=question_id), timeout=10).question.state


def _wait_question_state(stack: Stack, question_id: str, state: int) -> None:
    import time

    deadline = time.monotonic() + 15
    while _question_state(stack, question_id) != state:
        assert time.monotonic() < deadline, "the question did not reach the expected state"
        time.sleep(0.05)


def test_pause_keeps_the_question_and_user_cancel_closes_it(stack: Stack, api: Api) -> None:
    from taskgate.scheduler.v1 import scheduler_pb2_grpc as pb_grpc

    paused = asking(api, "keep me?", title="paused")
    cancelled = asking(api, "drop me?", title="user-cancelled")
    with stack.channel("scheduler") as channel:
        stub = pb_grpc.SchedulerServiceStub(channel)
        stub.CancelTask(pb.CancelTaskRequest(task_id=paused["taskId"], cause="paused"), timeout=30)
    api.request("POST", f"/tasks/{cancelled['taskId']}/cancel")
    assert api.wait_state(paused["taskId"], "cancelled")["cancellation"]["cause"] == "paused"
    assert api.wait_state(cancelled["taskId"], "cancelled")["cancellation"]["cause"] == "user_canceled"
    _wait_question_state(stack, cancelled["pendingQuestion"]["questionId"], ppb.QUESTION_STATE_CANCELLED)
    assert _question_state(stack, paused["pendingQuestion"]["questionId"]) == ppb.QUESTION_STATE_OPEN


def test_cli_watch_prints_only_changes_until_the_task_ends(stack: Stack, api: Api) -> None:
    steps = [{"progress": "one"}, {"sleep": 0.6}, {"progress": "two"}, {"sleep": 0.6}, {"result": {"text": "ok"}}]
    task = api.create("watched", profile="behave", instructions=json.dumps(steps))
    result = run_cli(
        stack,
        "tasks",
        "--url",
        stack.http_url,
        "--api-key",
        api.key,
        "--agent",
        api.agent,
        "--session",
        api.session,
        "watch",
        task["taskId"],
        "--interval",
        "0.1",
    )
    assert result.returncode == 0, result.stderr
    lines = [line.split("] ", 1)[1] for line in result.stdout.splitlines() if line.startswith("[")]
    assert lines[-1].startswith("completed")
    assert all(a != b for a, b in zip(lines, lines[1:], strict=False)), "consecutive lines always differ"
    assert len(lines) < 15, "the ~12 polls of an unchanged snapshot print nothing"
    assert any("two" in line for line in lines)
