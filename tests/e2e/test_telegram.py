"""The Telegram channel against a local Bot API stand-in (tests/support/botapi.py):
notifications go out with sendMessage; /task_question answers from a bound chat; the
/tasks live menu edits only on change, waits out a 429's retry_after, and stops on
Dismiss and on revoked access."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.e2e.conftest import Api, add_member, create_key, run_cli
from tests.support.botapi import BotApi, start_bot_api
from tests.support.stack import Stack, make_stack, start_fresh

AGENT = "agent-tg"
SESSION = "tg-1"
CHAT = 500
USER = 7
REFRESH_MS = 200

CONFIG = """
[channels.tg]
kind = "telegram"
secret = "telegram-adapter-secret"
bot_token = "{token}"
api_base_url = "{base}"
poll_timeout_s = 1
menu_refresh_ms = {refresh}

[notifier]
retry_initial_ms = 200

[agents.{agent}]
channel = "tg"
"""


@dataclass
class Env:
    stack: Stack
    bot: BotApi
    api: Api


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    bot = start_bot_api()
    base = tmp_path_factory.mktemp("telegram")
    extra = CONFIG.format(token=bot.token, base=bot.base_url, refresh=REFRESH_MS, agent=AGENT)
    stack = start_fresh(lambda attempt: make_stack(base / f"try{attempt}", extra_config=extra))
    try:
        key = create_key(stack, "nora", AGENT)
        add_member(stack, AGENT, SESSION, "nora")
        add_member(stack, AGENT, SESSION, f"tg:{USER}")
        result = run_cli(
            stack,
            "admin",
            "channels",
            "bind",
            "--agent",
            AGENT,
            "--session",
            SESSION,
            "--channel",
            "tg",
            "--chat",
            str(CHAT),
        )
        assert result.returncode == 0, result.stderr
        yield Env(stack, bot, Api(stack, key, agent=AGENT, session=SESSION))
    except Exception:
        print(stack.logs())
        raise
    finally:
        stack.stop()
        assert bot.server is not None
        bot.server.shutdown()


def sent_to(bot: BotApi, chat: int) -> list[str]:
    return [c.params["text"] for c in bot.of("sendMessage") if c.params["chat_id"] == chat]


def test_a_question_arrives_and_is_answered_from_the_chat(env: Env) -> None:
    steps = [{"ask": "Which database?"}, {"result": {"text": "done"}}]
    task = env.api.create("db choice", profile="behave", instructions=json.dumps(steps))
    question_id = env.api.wait_state(task["taskId"], "waiting_input")["pendingQuestion"]["questionId"]
    env.bot.wait(lambda: any(question_id in t and "Which database?" in t for t in sent_to(env.bot, CHAT)))
    # An ordinary reply is not an answer; a stranger's command is refused.
    env.bot.user_message(CHAT, USER, "Postgres, I think")
    env.bot.user_message(CHAT, 99, f"/task_question {question_id} answer SQLite")
    env.bot.wait(lambda: any("not a member" in t for t in sent_to(env.bot, CHAT)))
    assert env.api.get(task["taskId"])["state"] == "waiting_input"
    env.bot.user_message(CHAT, USER, f"/task_question {question_id} answer Postgres")
    env.bot.wait(lambda: any(t.startswith("Answer saved") for t in sent_to(env.bot, CHAT)))
    assert env.api.wait_state(task["taskId"], "completed")["result"]["text"] == "done"


def edits(bot: BotApi, message_id: int, ok_only: bool = True) -> list[str]:
    return [c.params["text"] for c in bot.of("editMessageText", ok_only) if c.params["message_id"] == message_id]


def open_menu(env: Env) -> int:
    before = len(env.bot.of("sendMessage"))
    env.bot.user_message(CHAT, USER, "/tasks")
    env.bot.wait(lambda: len(env.bot.of("sendMessage")) > before)
    menu = env.bot.of("sendMessage")[-1]
    assert menu.params["text"].startswith(f"Tasks of {SESSION}") and "Dismiss" in json.dumps(
        menu.params["reply_markup"]
    )
    return max(m for (c, m) in env.bot.messages if c == CHAT)  # the menu: the newest message of the chat


def quiet_edits(env: Env, message_id: int, periods: int = 6) -> int:
    """Edits made over several refresh periods in which nothing changes."""
    before = len(edits(env.bot, message_id, ok_only=False))
    time.sleep(periods * REFRESH_MS / 1000)
    return len(edits(env.bot, message_id, ok_only=False)) - before


def test_live_menu_edits_on_change_waits_out_429_and_stops_on_dismiss_and_revocation(env: Env) -> None:
    steps = [
        {"progress": "step one"},
        {"sleep": 0.8},
        {"progress": "step two"},
        {"sleep": 0.8},
        {"progress": "step three"},
        {"sleep": 60},
    ]
    task = env.api.create("long job", profile="behave", instructions=json.dumps(steps))
    message_id = open_menu(env)
    env.bot.wait(lambda: any("step three" in t for t in edits(env.bot, message_id)))
    shown = edits(env.bot, message_id)
    # One edit per change it showed, never the same text twice in a row.
    assert all(a != b for a, b in zip(shown, shown[1:], strict=False)) and len(shown) <= 5, shown
    assert quiet_edits(env, message_id) == 0  # the task runs on, but nothing shown changes
    # A 429: nothing is edited before its retry_after has passed.
    env.bot.throttle["editMessageText"] = [1]
    env.api.create("second", profile="behave", instructions=json.dumps([{"sleep": 60}]))
    env.bot.wait(lambda: any("second" in t for t in edits(env.bot, message_id)))
    refused = next(c for c in env.bot.of("editMessageText", ok_only=False) if c.status == 429)
    shown_after = next(c for c in env.bot.of("editMessageText") if "second" in c.params["text"])
    assert shown_after.at - refused.at >= 1.0 - 0.05
    # Dismiss: the menu says so and is no longer edited.
    env.bot.press(CHAT, USER, message_id, "menu:dismiss")
    env.bot.wait(lambda: edits(env.bot, message_id)[-1:] == ["Menu closed."])
    env.api.create("third", profile="behave", instructions=json.dumps([{"sleep": 60}]))
    assert quiet_edits(env, message_id) == 0
    # A new menu, then the member's access is revoked: it stops.
    second_menu = open_menu(env)
    assert second_menu != message_id
    result = run_cli(
        env.stack, "admin", "members", "remove", "--agent", AGENT, "--session", SESSION, "--principal", f"tg:{USER}"
    )
    assert result.returncode == 0, result.stderr
    env.bot.wait(lambda: edits(env.bot, second_menu)[-1:] == ["Menu closed: access revoked."])
    env.api.request("POST", f"/tasks/{task['taskId']}/cancel")
    assert quiet_edits(env, second_menu) == 0


def bind(env: Env, session: str) -> None:
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
        "tg",
        "--chat",
        str(CHAT),
    )
    assert result.returncode == 0, result.stderr


def test_live_menu_stops_on_a_session_change_and_when_its_message_is_gone(env: Env) -> None:
    add_member(env.stack, AGENT, SESSION, f"tg:{USER}")
    menu = open_menu(env)
    bind(env, "tg-other")
    env.bot.wait(lambda: edits(env.bot, menu)[-1:] == ["Menu closed: this chat's session changed."])
    bind(env, SESSION)
    menu = open_menu(env)
    env.bot.delete(CHAT, menu)
    env.api.create("fourth", profile="behave", instructions=json.dumps([{"sleep": 60}]))
    env.bot.wait(lambda: len(edits(env.bot, menu, ok_only=False)) == 1)  # refused: the message is gone
    assert quiet_edits(env, menu) == 0
