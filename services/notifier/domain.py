"""Notification rules (pure)."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel

from libs import errors
from libs.ids import ID_PATTERN

MAX_BODY_BYTES = 64 * 1024


class InvalidArgument(errors.InvalidArgument):
    pass


class Kind(StrEnum):
    TASK_REPORT = "task_report"
    TASK_QUESTION = "task_question"
    REMINDER = "reminder"


class Notification(BaseModel):
    notification_id: str
    agent_id: str
    session_id: str
    kind: Kind
    task_id: str | None = None
    body: str
    handled: bool = False
    created_at: int
    request_id: str | None = None
    attempt_count: int = 0


def validate_new(agent_id: str, session_id: str, task_id: str | None, body: str, request_id: str | None) -> None:
    for name, value in (("agentId", agent_id), ("sessionId", session_id)):
        if not ID_PATTERN.match(value):
            raise InvalidArgument("INVALID_ID", f"{name} must be 1-128 id characters", field=name)
    for name, optional in (("taskId", task_id), ("requestId", request_id)):
        if optional is not None and not ID_PATTERN.match(optional):
            raise InvalidArgument("INVALID_ID", f"{name} must be 1-128 id characters", field=name)
    if not body.strip():
        raise InvalidArgument("EMPTY_BODY", "body must not be empty", field="body")
    if len(body.encode()) > MAX_BODY_BYTES:
        raise InvalidArgument("FIELD_TOO_LONG", f"body exceeds {MAX_BODY_BYTES} bytes", field="body")
