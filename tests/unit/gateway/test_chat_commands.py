"""Chat command parsing: exactly the three /task_question forms, nothing else."""

from __future__ import annotations

import pytest

from gateway_http.chat import ChatCommand, NotACommand, parse_command

Q = "0123456789abcdef0123456789abcdef"
DASHED = "01234567-89ab-cdef-0123-456789abcdef"


@pytest.mark.parametrize(
    ("text", "command"),
    [
        (f"/task_question {Q} answer Use Postgres", ChatCommand(Q, "answer", "Use Postgres")),
        (f"  /task_question {DASHED} answer  two\nlines ", ChatCommand(Q, "answer", "two\nlines")),
        (f"/task_question@taskgate_bot {Q} snooze", ChatCommand(Q, "snooze")),
        (f"/task_question {Q.upper()} mute", ChatCommand(Q, "mute")),
    ],
)
def test_commands(text: str, command: ChatCommand) -> None:
    assert parse_command(text) == command


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("Use Postgres", "NOT_A_COMMAND"),
        (f"reply: /task_question {Q} answer x", "NOT_A_COMMAND"),
        (f"/task_questions {Q} answer x", "NOT_A_COMMAND"),
        ("/task_question", "MALFORMED_COMMAND"),
        (f"/task_question {Q}", "MALFORMED_COMMAND"),
        (f"/task_question {Q} answer", "EMPTY_ANSWER"),
        (f"/task_question {Q} snooze now", "MALFORMED_COMMAND"),
        (f"/task_question {Q} approve", "MALFORMED_COMMAND"),
        ("/task_question 1234 answer x", "INVALID_ID"),
        (f"/task_question {Q}0 mute", "INVALID_ID"),
    ],
)
def test_not_commands(text: str, reason: str) -> None:
    with pytest.raises(NotACommand) as err:
        parse_command(text)
    assert err.value.reason == reason
