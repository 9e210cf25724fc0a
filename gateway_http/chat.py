"""Chat commands, pure: what a chat adapter's text asks for, or why it is no command.

Exactly ``/task_question <question-id> answer <text>``, ``/task_question <question-id>
snooze`` and ``/task_question <question-id> mute``. Anything else (an ordinary reply
included) is not an answer: ordinary replies go through the agent, never straight to
a question. A question id is 32 hex digits, or a UUID with dashes (the same id).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

# A chat id: Telegram's group ids are negative numbers; threads and other adapters use id words.
CHAT_ID_REGEX = r"^-?[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$"
_COMMAND = re.compile(r"^/task_question(?:@[A-Za-z0-9_]{1,64})?(?=\s|$)")
_UUID = re.compile(r"^(?:[0-9a-f]{32}|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})$")


class NotACommand(Exception):
    """The text is not a chat command; ``reason`` and the message say why."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class ChatCommand:
    question_id: str  # 32 hex digits
    action: Literal["answer", "snooze", "mute"]
    answer: str = ""


USAGE = "use /task_question <question-id> answer <text>, /task_question <question-id> snooze or ... mute"


def parse_command(text: str) -> ChatCommand:
    """The command in ``text``; raises NotACommand for anything else."""
    stripped = text.strip()
    head = _COMMAND.match(stripped)
    if head is None:
        raise NotACommand("NOT_A_COMMAND", "ordinary messages do not answer a question; " + USAGE)
    rest = stripped[head.end() :].strip()
    parts = rest.split(None, 2)
    if len(parts) < 2:
        raise NotACommand("MALFORMED_COMMAND", USAGE)
    raw_id, action = parts[0].lower(), parts[1]
    if not _UUID.match(raw_id):
        raise NotACommand("INVALID_ID", f"{parts[0]!r} is not a question id (32 hex digits or a UUID)")
    question_id = raw_id.replace("-", "")
    if action == "answer":
        answer = parts[2].strip() if len(parts) == 3 else ""
        if not answer:
            raise NotACommand("EMPTY_ANSWER", "the answer must not be empty")
        return ChatCommand(question_id, "answer", answer)
    if action in ("snooze", "mute") and len(parts) == 2:
        return ChatCommand(question_id, action)  # type: ignore[arg-type]
    raise NotACommand("MALFORMED_COMMAND", USAGE)
