"""Notifier rules, pure: no grpc, no sql, time passed in.

- which task events become a notification, and its text;
- the delivery retry schedule, derived from the stored attempts alone;
- response snapshots: a snapshot replaces the previous one, a final one closes it;
- the unbacked-promise rule for report replies.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from pydantic import BaseModel

from libs import errors
from libs.ids import ID_PATTERN

# Bound of a notification body, a response snapshot and a message: 64 KiB of UTF-8.
MAX_TEXT_BYTES = 64 * 1024
MAX_PAGE_SIZE = 100


class InvalidArgument(errors.InvalidArgument):
    pass


class NotFound(errors.NotFound):
    pass


class QuestionClosed(errors.FailedPrecondition):
    """Snooze or mute of a question that was answered, replaced or closed."""


class ResponseFinal(errors.Aborted):
    """A publish after the response's final snapshot (HTTP 409)."""


class Kind(StrEnum):
    TASK_COMPLETED = "task.completed"
    TASK_FAILED = "task.failed"
    TASK_CANCELLED = "task.cancelled"
    TASK_NEEDS_RECONCILIATION = "task.needs_reconciliation"
    TASK_QUESTION = "task.question"
    REMINDER = "reminder"
    # Rows of the foundation outbox, before kinds named the ending.
    TASK_REPORT = "task_report"


ENDING_KINDS = {
    "completed": Kind.TASK_COMPLETED,
    "failed": Kind.TASK_FAILED,
    "cancelled": Kind.TASK_CANCELLED,
    "needs_reconciliation": Kind.TASK_NEEDS_RECONCILIATION,
}


class State(StrEnum):
    PENDING = "pending"
    DELIVERED = "delivered"
    STOPPED = "stopped"


class Outcome(StrEnum):
    DELIVERED = "delivered"
    FAILED = "failed"


class FollowUp(StrEnum):
    CONTINUES = "continues"
    ASKS_USER = "asks_user"
    NONE = "none"


class Attempt(BaseModel):
    at: int
    outcome: Outcome
    http_status: int | None = None
    error: str | None = None
    # A Retry-After the receiver asked for (429/503), in ms.
    retry_after_ms: int | None = None


class Notification(BaseModel):
    notification_id: str
    agent_id: str
    session_id: str
    kind: Kind
    task_id: str | None = None
    question_id: str | None = None
    text: str
    created_at: int
    state: State = State.PENDING
    # The operator's channel at creation; None: the conversation (history + SSE) is the channel.
    channel: str | None = None
    # Idempotency key: derived from the task event, unique.
    key: str | None = None
    next_attempt_at: int | None = None
    delivered_at: int | None = None
    attempts: list[Attempt] = []


class Message(BaseModel):
    message_id: str
    agent_id: str
    session_id: str
    role: str  # user | assistant | notification
    text: str
    response_id: str | None = None
    notification_id: str | None = None
    follow_up: FollowUp | None = None
    created_at: int
    completed_at: int | None = None


class Response(BaseModel):
    agent_id: str
    session_id: str
    response_id: str
    text: str
    final: bool
    created_at: int
    updated_at: int
    completed_at: int | None = None


class ConversationEvent(BaseModel):
    kind: str
    at: int
    data: dict[str, str] = {}


# --- validation ----------------------------------------------------------------


def validate_id(name: str, value: str) -> str:
    if not ID_PATTERN.match(value or ""):
        raise InvalidArgument("INVALID_ID", f"{name} must be 1-128 id characters", field=name)
    return value


def validate_conversation(agent_id: str, session_id: str) -> None:
    validate_id("agentId", agent_id)
    validate_id("sessionId", session_id)


def validate_text(text: str, name: str = "text", allow_empty: bool = False) -> str:
    if not allow_empty and not text.strip():
        raise InvalidArgument("EMPTY_TEXT", f"{name} must not be empty", field=name)
    if len(text.encode()) > MAX_TEXT_BYTES:
        raise InvalidArgument("TEXT_TOO_LARGE", f"{name} exceeds {MAX_TEXT_BYTES} bytes", field=name)
    return text


def validate_page(page: int, page_size: int) -> None:
    if page < 0:
        raise InvalidArgument("INVALID_PAGINATION", "page must be 0 or more", field="page")
    if not 1 <= page_size <= MAX_PAGE_SIZE:
        raise InvalidArgument("INVALID_PAGINATION", f"page_size must be 1-{MAX_PAGE_SIZE}", field="page_size")


@dataclass(frozen=True)
class Page:
    page: int
    pages: int
    total: int


def clamp_page(page: int, page_size: int, total: int) -> Page:
    """Zero-based; an out-of-range page is the last one."""
    pages = max(1, -(-total // page_size))
    return Page(page=min(page, pages - 1), pages=pages, total=total)


# --- task events -> notifications -----------------------------------------------


@dataclass(frozen=True)
class TaskFact:
    """What the notifier needs of a task event (the servicer builds it from the scheduler's proto)."""

    event_type: str  # task.state_changed | task.question
    task_id: str
    agent_id: str
    session_id: str
    title: str
    state: str
    result_text: str = ""
    failure_code: str = ""
    failure_message: str = ""
    question_id: str = ""
    question_text: str = ""


@dataclass(frozen=True)
class Planned:
    kind: Kind
    key: str
    text: str
    question_id: str | None = None


def _clip(text: str, limit: int = MAX_TEXT_BYTES - 1024) -> str:
    raw = text.encode()
    return text if len(raw) <= limit else raw[:limit].decode(errors="ignore") + "…"


def failure_key(task_id: str) -> str:
    """The idempotency key of a task's failure report (see ``plan_notification``)."""
    return f"{task_id}:failed"


class FailureClaim(StrEnum):
    """What the scheduler's claim of a failure report found (``ClaimUnreportedFailure``)."""

    REPORTED = "reported"  # someone has it: the task stays failed
    STOPPED = "stopped"  # a pending report was stopped before delivery
    SUPPRESSED = "suppressed"  # no report yet; the event will make none

    @property
    def claimed(self) -> bool:
        return self != FailureClaim.REPORTED


def was_reported(state: State, consumed_at: int | None, handled: bool) -> bool:
    """Whether a report reached someone: delivered (webhook/chat), consumed by polling, or handled."""
    return state == State.DELIVERED or consumed_at is not None or handled


def plan_notification(fact: TaskFact) -> Planned | None:
    """The notification one task event calls for, or None.

    The key makes it exactly one per ending (per task and ending state) and per
    question (per question id), whatever replays the event.
    """
    if fact.event_type == "task.question" and fact.question_id:
        text = question_text(fact.title, fact.question_text, fact.question_id)
        return Planned(Kind.TASK_QUESTION, f"{fact.task_id}:question:{fact.question_id}", text, fact.question_id)
    if fact.event_type != "task.state_changed" or fact.state not in ENDING_KINDS:
        return None
    kind = ENDING_KINDS[fact.state]
    if kind == Kind.TASK_COMPLETED:
        text = f'Task "{fact.title}" completed.' + (f"\n\n{fact.result_text}" if fact.result_text else "")
    elif kind == Kind.TASK_FAILED:
        text = f'Task "{fact.title}" failed ({fact.failure_code or "unknown"}): {fact.failure_message}'
    elif kind == Kind.TASK_CANCELLED:
        text = f'Task "{fact.title}" was cancelled.'
    else:
        text = (
            f'Task "{fact.title}" was stopped but its processes could not be proven gone '
            f"({fact.failure_code or 'CLEANUP_UNCONFIRMED'}); retry the cleanup."
        )
    return Planned(kind, f"{fact.task_id}:{fact.state}", _clip(text))


# --- delivery schedule ---------------------------------------------------------


@dataclass(frozen=True)
class Backoff:
    initial_ms: int = 5_000
    max_ms: int = 300_000


def next_attempt_at(created_at: int, attempts: Sequence[Attempt], backoff: Backoff) -> int | None:
    """When the next delivery attempt is due, from the stored attempts alone (None: no more).

    No attempt yet: due at creation. After the n-th consecutive failure:
    initial × 2^(n-1), capped, after that attempt — and never before a
    Retry-After the receiver asked for.
    """
    if any(a.outcome == Outcome.DELIVERED for a in attempts):
        return None
    if not attempts:
        return created_at
    last = attempts[-1]
    failures = len(attempts)
    delay = min(backoff.max_ms, backoff.initial_ms * 2 ** min(failures - 1, 40))
    if last.retry_after_ms is not None:
        delay = max(delay, last.retry_after_ms)
    return last.at + delay


def parse_retry_after(header: str | None, now_ms: int) -> int | None:
    """Retry-After in ms: delta-seconds or an HTTP date; None when absent or unreadable."""
    if not header:
        return None
    value = header.strip()
    if value.isdigit():
        return int(value) * 1000
    from email.utils import parsedate_to_datetime

    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0, int(when.timestamp() * 1000) - now_ms)


def attempt_outcome(status: int | None, error: str | None, retry_after: str | None, now_ms: int) -> Attempt:
    """One attempt's record: 2xx delivers; 429/503 keep the receiver's Retry-After."""
    if status is not None and 200 <= status < 300:
        return Attempt(at=now_ms, outcome=Outcome.DELIVERED, http_status=status)
    wait = parse_retry_after(retry_after, now_ms) if status in (429, 503) else None
    return Attempt(
        at=now_ms,
        outcome=Outcome.FAILED,
        http_status=status,
        error=(error or f"HTTP {status}")[:500],
        retry_after_ms=wait,
    )


# --- response snapshots ---------------------------------------------------------


def apply_snapshot(current: Response | None, new: Response) -> Response:
    """A snapshot replaces the previous one; nothing follows a final one."""
    if current is None:
        return new
    if current.final:
        raise ResponseFinal("RESPONSE_FINAL", f"response {current.response_id} is final; publish a new responseId")
    return current.model_copy(
        update={
            "text": new.text,
            "final": new.final,
            "updated_at": new.updated_at,
            "completed_at": new.updated_at if new.final else None,
        }
    )


# --- report replies --------------------------------------------------------------

# Task states in which work is still going on (backing a "continues").
BACKING_STATES = frozenset({"queued", "running", "waiting_input", "recovering"})


@dataclass(frozen=True)
class SessionTask:
    state: str
    created_at: int


def is_unbacked_promise(follow_up: FollowUp, tasks: Iterable[SessionTask], turn_started_at: int) -> bool:
    """A reply that says work continues while nothing of the conversation is going on.

    Backed by any task queued, running, waiting for an answer or recovering, or
    by a task created in this turn (at or after ``turn_started_at``).
    """
    if follow_up != FollowUp.CONTINUES:
        return False
    return not any(t.state in BACKING_STATES or t.created_at >= turn_started_at for t in tasks)


# --- questions and contextual reminders ---------------------------------------

# A reminder needs this many user messages since the question (or its last reminder).
REMINDER_MESSAGES = 3
# Cooldown multipliers of question_reminder_ms: first, second, then every later reminder.
REMINDER_COOLDOWNS = (1, 3, 6)
SNOOZE_MS = 3_600_000


class QuestionState(StrEnum):
    OPEN = "open"
    ANSWERED = "answered"  # the task moved on (it left waiting_input)
    REPLACED = "replaced"
    CLOSED = "closed"  # the task ended


@dataclass(frozen=True)
class QuestionReminders:
    """What the reminder rule needs of one question; stored with it."""

    asked_at: int
    state: QuestionState = QuestionState.OPEN
    messages_since: int = 0
    reminders_sent: int = 0
    last_reminded_at: int | None = None
    snoozed_until: int | None = None
    muted: bool = False


def reminder_cooldown_ms(reminders_sent: int, base_ms: int) -> int:
    """1×, 3×, then 6× the base for the first, second and later reminders."""
    return REMINDER_COOLDOWNS[min(reminders_sent, len(REMINDER_COOLDOWNS) - 1)] * base_ms


def reminder_due(q: QuestionReminders, now_ms: int, base_ms: int) -> bool:
    """Due after at least 3 user messages since the question (or its last reminder)
    and the cooldown since then; never for an answered, replaced, muted or snoozed one.
    Only evaluated when a user message arrives: nothing recurring is scheduled."""
    if q.state != QuestionState.OPEN or q.muted:
        return False
    if q.snoozed_until is not None and now_ms < q.snoozed_until:
        return False
    if q.messages_since < REMINDER_MESSAGES:
        return False
    since = q.last_reminded_at if q.last_reminded_at is not None else q.asked_at
    return now_ms - since >= reminder_cooldown_ms(q.reminders_sent, base_ms)


def after_user_message(q: QuestionReminders, now_ms: int, base_ms: int) -> tuple[QuestionReminders, bool]:
    """Count one user message; returns the new state and whether a reminder goes out now."""
    if q.state != QuestionState.OPEN:
        return q, False
    counted = replace(q, messages_since=q.messages_since + 1)
    if not reminder_due(counted, now_ms, base_ms):
        return counted, False
    return replace(counted, messages_since=0, reminders_sent=q.reminders_sent + 1, last_reminded_at=now_ms), True


def snooze(q: QuestionReminders, now_ms: int, snooze_ms: int = SNOOZE_MS) -> QuestionReminders:
    return replace(q, snoozed_until=now_ms + snooze_ms)


def mute(q: QuestionReminders) -> QuestionReminders:
    return replace(q, muted=True)


def how_to_answer(question_id: str) -> str:
    return f"Answer with: /task_question {question_id} answer <text>\n(or /task_question {question_id} snooze | mute)"


def question_text(title: str, question: str, question_id: str, replaces: str | None = None) -> str:
    head = f'Task "{title}" asks: {question}'
    if replaces:
        head += f"\n(This replaces question {replaces}, which no longer takes an answer.)"
    return _clip(f"{head}\n\nquestionId: {question_id}\n{how_to_answer(question_id)}")


def reminder_text(title: str, question: str, question_id: str, reminders_sent: int) -> str:
    return _clip(
        f'Reminder ({reminders_sent}): task "{title}" still waits for an answer: {question}\n\n'
        f"questionId: {question_id}\n{how_to_answer(question_id)}"
    )


# Task states in which an open question stays open (paused keeps it, seed 000).
QUESTION_KEEPING_STATES = frozenset({"waiting_input", "paused", "recovering", "queued"})


def question_fate(task_state: str) -> QuestionState | None:
    """What a task state change does to the task's open question (None: nothing)."""
    if task_state in QUESTION_KEEPING_STATES:
        return None
    if task_state in ("running",):
        return QuestionState.ANSWERED
    return QuestionState.CLOSED
