"""Questions reach people, over real processes and a local webhook receiver: the question
notification says how to answer; reminders follow user messages and cooldowns; snooze
and mute hold across a notifier restart; chat commands answer, snooze and mute, and are
refused for an unbound chat, a non-member, a malformed id or plain text."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import ThreadingHTTPServer

import httpx
import pytest

from tests.e2e.conftest import Api, add_members, create_key, run_cli
from tests.e2e.test_notifier import Received, Receiver, start_receiver
from tests.support.stack import Stack, make_stack, start_fresh

AGENT = "agent-q"
BASE_MS = 1500  # the shortened question_reminder_ms
SESSIONS = ["rem-1", "rem-2", "rem-3", "cmd-1"]

CONFIG = """
[notifier]
retry_initial_ms = 200
question_reminder_ms = {base}

[channels.hook]
kind = "webhook"
url = "http://127.0.0.1:{port}/hook"
secret = "webhook-secret-for-tests"

[agents.{agent}]
channel = "hook"
"""


@dataclass
class Env:
    stack: Stack
    receiver: Receiver
    key: str
    server: ThreadingHTTPServer

    def api(self, session: str, key: str | None = None) -> Api:
        return Api(self.stack, key or self.key, agent=AGENT, session=session)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    receiver, server = start_receiver()
    base = tmp_path_factory.mktemp("reminders")
    extra = CONFIG.format(base=BASE_MS, port=receiver.port, agent=AGENT)
    stack = start_fresh(lambda attempt: make_stack(base / f"try{attempt}", extra_config=extra))
    try:
        key = create_key(stack, "nora", AGENT)
        add_members(stack, AGENT, SESSIONS, "nora")
        yield Env(stack, receiver, key, server)
    except Exception:
        print(stack.logs())
        raise
    finally:
        stack.stop()
        server.shutdown()


def kinds(got: list[Received], kind: str) -> list[Received]:
    return [r for r in got if r.doc["kind"] == kind]


def asking_task(env: Env, session: str) -> tuple[str, str, float]:
    """A task waiting on a question; (task id, question id, when its notification arrived)."""
    api = env.api(session)
    steps = [{"ask": "Which database?"}, {"result": {"text": "done"}}]
    task = api.create("db choice", profile="behave", instructions=json.dumps(steps))
    waiting = api.wait_state(task["taskId"], "waiting_input")
    question_id = waiting["pendingQuestion"]["questionId"]
    got = env.receiver.wait(session, lambda g: len(kinds(g, "task.question")) == 1)
    note = kinds(got, "task.question")[0]
    assert note.doc["questionId"] == question_id and note.doc["taskId"] == task["taskId"]
    assert "Which database?" in note.doc["text"] and "db choice" in note.doc["text"]
    assert f"/task_question {question_id} answer <text>" in note.doc["text"]
    return task["taskId"], question_id, note.at


def say(api: Api, n: int) -> None:
    for _ in range(n):
        r = api.request("POST", "/messages", json={"text": "what about lunch?"})
        assert r.status_code == 201, r.text


def reminders_after(env: Env, session: str, settle_s: float = 0.8) -> list[Received]:
    """The reminders delivered for the session, after letting delivery catch up."""
    time.sleep(settle_s)
    return kinds(env.receiver.for_session(session), "reminder")


def sleep_until(monotonic_at: float) -> None:
    time.sleep(max(0.0, monotonic_at - time.monotonic()))


def test_reminders_come_after_three_messages_and_the_growing_cooldown(env: Env) -> None:
    api = env.api("rem-1")
    _, question_id, asked_at = asking_task(env, "rem-1")
    sleep_until(asked_at + BASE_MS / 1000 + 0.2)
    say(api, 2)
    assert reminders_after(env, "rem-1") == []  # cooldown passed, but only 2 messages
    say(api, 1)
    env.receiver.wait("rem-1", lambda g: len(kinds(g, "reminder")) == 1)
    first = kinds(env.receiver.for_session("rem-1"), "reminder")[0]
    assert first.doc["questionId"] == question_id and "still waits" in first.doc["text"]
    # Three more messages at once: the second reminder waits for 3x the base.
    say(api, 3)
    assert len(reminders_after(env, "rem-1")) == 1
    sleep_until(first.at + 3 * BASE_MS / 1000 + 0.2)
    say(api, 1)
    env.receiver.wait("rem-1", lambda g: len(kinds(g, "reminder")) == 2)


def bind(env: Env, session: str, chat: str) -> None:
    result = run_cli(
        env.stack,
        "admin",
        "channels",
        "bind",
        "--agent",
        AGENT,
        "--session",
        session,
        "--channel",
        "hook",
        "--chat",
        chat,
    )
    assert result.returncode == 0, result.stderr


def command(env: Env, session: str, text: str, chat: str, principal: str = "nora") -> httpx.Response:
    return env.api(session).request(
        "POST", "/chat/commands", json={"text": text, "channel": "hook", "chatId": chat, "principal": principal}
    )


def test_snooze_and_mute_hold_across_a_notifier_restart(env: Env) -> None:
    _, snoozed_q, asked_2 = asking_task(env, "rem-2")
    _, muted_q, asked_3 = asking_task(env, "rem-3")
    r = env.api("rem-2").request("POST", f"/tasks/{_task_of(env, 'rem-2')}/questions/{snoozed_q}/snooze")
    assert r.status_code == 200, r.text
    assert r.json()["question"]["snoozedUntil"]
    bind(env, "rem-3", "-1003")
    r = command(env, "rem-3", f"/task_question {muted_q} mute", "-1003")
    assert r.status_code == 200 and r.json()["action"] == "mute", r.text
    notifier = env.stack.procs["notifier"]
    notifier.kill()
    notifier.start()
    sleep_until(max(asked_2, asked_3) + BASE_MS / 1000 + 0.2)
    say(env.api("rem-2"), 4)
    say(env.api("rem-3"), 4)
    assert reminders_after(env, "rem-2", 1.0) == [] and reminders_after(env, "rem-3", 0.0) == []


def _task_of(env: Env, session: str) -> str:
    tasks = env.api(session).request("GET", "/tasks").json()["tasks"]
    return str(tasks[0]["taskId"])


def test_chat_commands_answer_and_refuse(env: Env) -> None:
    api = env.api("cmd-1")
    task_id, question_id, _ = asking_task(env, "cmd-1")
    bind(env, "cmd-1", "42")
    assert (
        run_cli(
            env.stack, "admin", "members", "add", "--agent", AGENT, "--session", "rem-1", "--principal", "olga"
        ).returncode
        == 0
    )
    refusals = [
        (command(env, "cmd-1", f"/task_question {question_id} answer x", "43"), 403, "CHAT_NOT_BOUND"),
        (command(env, "cmd-1", f"/task_question {question_id} answer x", "42", "olga"), 403, "NOT_A_MEMBER"),
        (command(env, "cmd-1", "/task_question 12345 answer x", "42"), 400, "INVALID_ID"),
        (command(env, "cmd-1", "Postgres, please", "42"), 400, "NOT_A_COMMAND"),
    ]
    for reply, status, reason in refusals:
        assert (reply.status_code, reply.json()["error"]) == (status, reason), reply.text
    assert api.get(task_id)["state"] == "waiting_input"  # nothing above answered
    snoozed = command(env, "cmd-1", f"/task_question {question_id} snooze", "42")
    assert snoozed.status_code == 200 and "snoozed" in snoozed.json()["reply"], snoozed.text
    answered = command(env, "cmd-1", f"/task_question {question_id} answer Postgres", "42")
    assert answered.status_code == 200 and answered.json()["action"] == "answer", answered.text
    done = api.wait_state(task_id, "completed")
    assert done["result"]["text"] == "done"
    # The question is answered: muting it now is refused.
    late = command(env, "cmd-1", f"/task_question {question_id} mute", "42")
    assert late.status_code == 403 and late.json()["error"] == "QUESTION_STALE", late.text


def test_a_new_key_without_task_answer_is_refused(env: Env) -> None:
    result = run_cli(
        env.stack, "admin", "keys", "create", "--principal", "nora", "--agent", AGENT, "--allow-tool", "task_cancel"
    )
    key = result.stdout.strip().splitlines()[-1]
    r = env.api("cmd-1", key=key).request(
        "POST", "/chat/commands", json={"text": "x", "channel": "hook", "chatId": "42", "principal": "nora"}
    )
    assert r.status_code == 403 and r.json()["error"] == "TOOL_ACCESS_DENIED"
