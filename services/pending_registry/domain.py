"""Pending entries, pending snapshots and task questions: types and rules.

Pure code: no grpc, no database. Times are integer milliseconds since the epoch,
passed in by the caller.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from enum import StrEnum

from libs import errors
from libs.ids import ID_PATTERN, UUID_HEX_PATTERN

# The session-id prefixes the front-ends listen on.
ORIGINS = ("cli-", "chat-", "tg-", "dc-")
# The one origin whose answers go back inline to the same run: no snapshot.
INLINE_ORIGIN = "cli-"
USER_CANCELED = "user_canceled"

MAX_PAYLOAD_BYTES = 64 * 1024
MAX_ANSWER_BYTES = 64 * 1024
MAX_QUESTION_BYTES = 64 * 1024
MAX_TOOL_RESULTS = 256
MAX_TOOL_FIELD_CHARS = 256
MAX_NAME_CHARS = 128
MAX_CAUSE_CHARS = 64
# Longest a picker may wait in PickNext for an entry to arrive.
MAX_PICK_WAIT_S = 300
# Pending snapshot clamps (DESIGN §9), in bytes of UTF-8.
SNAPSHOT_OUTPUT_BYTES = 4 * 1024
SNAPSHOT_ARGUMENTS_BYTES = 1024


class InvalidArgument(errors.InvalidArgument):
    pass


class NotFound(errors.NotFound):
    pass


class PermissionDenied(errors.PermissionDenied):
    pass


class Unavailable(errors.Unavailable):
    pass


class ResourceExhausted(errors.ResourceExhausted):
    pass


def shutting_down() -> Unavailable:
    return Unavailable("REGISTRY_SHUTTING_DOWN", "the pending registry is stopping; call again")


class AskCanceled(errors.Cancelled):
    """The producer's ask was cancelled on purpose (the session was cancelled by the user)."""


class EntryKind(StrEnum):
    CONFIRM = "confirm"
    ASK = "ask"
    SECRET = "secret"


class QuestionState(StrEnum):
    OPEN = "open"
    ANSWERED = "answered"
    REPLACED = "replaced"
    CANCELLED = "cancelled"


# --- validation ---------------------------------------------------------------


def new_id() -> str:
    return uuid.uuid4().hex


def utf8_len(text: str) -> int:
    return len(text.encode("utf-8"))


def validate_id(field: str, value: str) -> str:
    if not ID_PATTERN.match(value or ""):
        raise InvalidArgument(
            "INVALID_ID",
            f"{field} must be 1-128 characters of letters, digits, '.', '_', ':' or '-'",
            field=field,
        )
    return value


def validate_uuid(field: str, value: str) -> str:
    if not UUID_HEX_PATTERN.match(value or ""):
        raise InvalidArgument("INVALID_ID", f"{field} must be 32 lowercase hex characters", field=field)
    return value


def origin_of(session_id: str) -> str:
    """The known origin prefix of a session id; anything else is refused."""
    validate_id("sessionId", session_id)
    for origin in ORIGINS:
        if session_id.startswith(origin) and len(session_id) > len(origin):
            return origin
    raise InvalidArgument(
        "SESSION_ORIGIN_UNKNOWN",
        f"sessionId must start with one of {', '.join(ORIGINS)} followed by at least one character",
        field="sessionId",
    )


def validate_origin(origin: str) -> str:
    if origin not in ORIGINS:
        raise InvalidArgument("SESSION_ORIGIN_UNKNOWN", f"origin must be one of {', '.join(ORIGINS)}", field="origin")
    return origin


def validate_prefix(prefix: str) -> str:
    """A listener/picker prefix: "" (everything) or a known origin, optionally narrowed."""
    if prefix == "":
        return prefix
    if len(prefix) > MAX_NAME_CHARS or not any(prefix.startswith(o) for o in ORIGINS):
        raise InvalidArgument(
            "INVALID_PREFIX",
            f"prefix must be empty or start with one of {', '.join(ORIGINS)}",
            field="prefix",
        )
    if len(prefix) > len(next(o for o in ORIGINS if prefix.startswith(o))):
        validate_id("prefix", prefix)
    return prefix


def validate_name(field: str, value: str, required: bool = True) -> str:
    if not value:
        if required:
            raise InvalidArgument("MISSING_FIELD", f"{field} is required", field=field)
        return value
    if len(value) > MAX_NAME_CHARS or not value.isprintable():
        raise InvalidArgument(
            "INVALID_FIELD", f"{field} must be at most {MAX_NAME_CHARS} printable characters", field=field
        )
    return value


def validate_text(field: str, value: str, max_bytes: int, allow_empty: bool = False) -> str:
    if not allow_empty and not value.strip():
        raise InvalidArgument(f"{field.upper()}_EMPTY", f"{field} must not be empty", field=field)
    if utf8_len(value) > max_bytes:
        raise InvalidArgument(
            f"{field.upper()}_TOO_LARGE", f"{field} must be at most {max_bytes} bytes of UTF-8", field=field
        )
    return value


def validate_wait(seconds: float) -> float:
    if not 0 <= seconds <= MAX_PICK_WAIT_S:
        raise InvalidArgument(
            "INVALID_WAIT", f"maxWait must be between 0 and {MAX_PICK_WAIT_S} seconds", field="maxWait"
        )
    return seconds


def validate_cause(cause: str) -> str:
    if not cause or len(cause) > MAX_CAUSE_CHARS or not cause.replace("_", "").isalnum():
        raise InvalidArgument(
            "INVALID_CAUSE",
            "cause must be 1-64 letters, digits or '_' (e.g. user_canceled, paused)",
            field="cause",
        )
    return cause


def prefix_matches(prefix: str, session_id: str) -> bool:
    return session_id.startswith(prefix)


def listener_covers_origin(prefix: str, origin: str) -> bool:
    """Whether a listener on ``prefix`` sees every session of ``origin``."""
    return origin.startswith(prefix)


# --- clamping -----------------------------------------------------------------


def clamp_utf8(text: str, max_bytes: int) -> tuple[str, bool]:
    """The longest prefix of ``text`` of at most ``max_bytes`` bytes of UTF-8 that
    does not split a character, and whether anything was cut."""
    raw = text.encode("utf-8")
    if len(raw) <= max_bytes:
        return text, False
    cut = max_bytes
    # Back up over continuation bytes (10xxxxxx) to the start of a character.
    while cut > 0 and (raw[cut] & 0xC0) == 0x80:
        cut -= 1
    return raw[:cut].decode("utf-8"), True


# --- pending entries and snapshots ---------------------------------------------


@dataclass(frozen=True)
class ToolResult:
    tool_call_id: str
    name: str
    arguments: str
    output: str
    arguments_truncated: bool = False
    output_truncated: bool = False


@dataclass(frozen=True)
class Entry:
    entry_id: str
    session_id: str
    origin: str
    kind: EntryKind
    payload: str
    created_at: int
    claimed_by: str | None = None
    claimed_at: int | None = None
    # "" when the producer named no agent (allowed for "cli-" asks only).
    agent_id: str = ""

    def claimed(self, picker: str, at: int) -> Entry:
        return replace(self, claimed_by=picker, claimed_at=at)

    def released(self) -> Entry:
        return replace(self, claimed_by=None, claimed_at=None)


@dataclass(frozen=True)
class Snapshot:
    session_id: str
    entry_id: str
    origin: str
    kind: EntryKind
    payload: str
    tool_results: tuple[ToolResult, ...]
    created_at: int
    # Snapshots are keyed by (agent_id, session_id); "" marks one stored before that
    # (LEGACY_AGENT), which belongs to the session whichever agent asks.
    agent_id: str = ""


LEGACY_AGENT = ""


class EventType(StrEnum):
    AVAILABLE = "available"
    SYNCED = "synced"
    CLAIMED = "claimed"
    REMOVED = "removed"


class RemovalReason(StrEnum):
    ANSWERED = "answered"
    WITHDRAWN = "withdrawn"
    CANCELED = "canceled"
    SHUTDOWN = "shutdown"


@dataclass(frozen=True)
class EntryEvent:
    type: EventType
    entry: Entry | None = None
    reason: RemovalReason | None = None


@dataclass(frozen=True)
class NewAsk:
    session_id: str
    kind: EntryKind | None
    payload: str
    tool_results: tuple[ToolResult, ...] = ()
    agent_id: str = ""


def clamp_tool_result(result: ToolResult) -> ToolResult:
    arguments, args_cut = clamp_utf8(result.arguments, SNAPSHOT_ARGUMENTS_BYTES)
    output, out_cut = clamp_utf8(result.output, SNAPSHOT_OUTPUT_BYTES)
    return replace(result, arguments=arguments, output=output, arguments_truncated=args_cut, output_truncated=out_cut)


def new_entry(ask: NewAsk, now: int) -> tuple[Entry, Snapshot | None]:
    """Validate an ask; the entry, and for non-cli origins the pending snapshot."""
    origin = origin_of(ask.session_id)
    if ask.agent_id:
        validate_id("agentId", ask.agent_id)
    elif origin != INLINE_ORIGIN:
        raise InvalidArgument(
            "MISSING_AGENT_ID", "agentId is required: the pending snapshot is kept per agent", field="agentId"
        )
    if ask.kind is None:
        raise InvalidArgument("INVALID_KIND", "kind must be confirm, ask or secret", field="kind")
    validate_text("payload", ask.payload, MAX_PAYLOAD_BYTES, allow_empty=True)
    if len(ask.tool_results) > MAX_TOOL_RESULTS:
        raise InvalidArgument("TOO_MANY_TOOL_RESULTS", f"at most {MAX_TOOL_RESULTS} tool results", field="toolResults")
    for result in ask.tool_results:
        if len(result.tool_call_id) > MAX_TOOL_FIELD_CHARS or len(result.name) > MAX_TOOL_FIELD_CHARS:
            raise InvalidArgument(
                "INVALID_TOOL_RESULT",
                f"tool result ids and names must be at most {MAX_TOOL_FIELD_CHARS} characters",
                field="toolResults",
            )
    entry = Entry(
        entry_id=new_id(),
        session_id=ask.session_id,
        origin=origin,
        kind=ask.kind,
        payload=ask.payload,
        created_at=now,
        agent_id=ask.agent_id,
    )
    if origin == INLINE_ORIGIN:
        return entry, None
    snapshot = Snapshot(
        session_id=ask.session_id,
        entry_id=entry.entry_id,
        origin=origin,
        kind=ask.kind,
        payload=ask.payload,
        tool_results=tuple(clamp_tool_result(r) for r in ask.tool_results),
        created_at=now,
        agent_id=ask.agent_id,
    )
    return entry, snapshot


@dataclass(frozen=True)
class PickFilter:
    prefix: str
    kinds: frozenset[EntryKind] = frozenset()
    session_id: str | None = None

    def accepts(self, entry: Entry) -> bool:
        return (
            prefix_matches(self.prefix, entry.session_id)
            and (not self.kinds or entry.kind in self.kinds)
            and (self.session_id is None or entry.session_id == self.session_id)
        )


# --- task questions -----------------------------------------------------------


@dataclass(frozen=True)
class Question:
    question_id: str
    task_id: str
    session_id: str
    text: str
    revision: int
    state: QuestionState
    asked_at: int
    answer: str | None = None
    answered_by: str | None = None
    answered_at: int | None = None
    closed_at: int | None = None
    request_id: str | None = None


@dataclass(frozen=True)
class NewQuestion:
    task_id: str
    session_id: str
    text: str
    request_id: str | None = None


def validate_new_question(q: NewQuestion) -> NewQuestion:
    validate_uuid("taskId", q.task_id)
    validate_id("sessionId", q.session_id)
    validate_text("text", q.text, MAX_QUESTION_BYTES)
    if q.request_id is not None:
        validate_id("requestId", q.request_id)
    return q


def ask_question(q: NewQuestion, previous: Question | None, now: int) -> tuple[Question, Question | None]:
    """The new question and, when the task had an open one, that one replaced."""
    revision = previous.revision + 1 if previous is not None else 1
    question = Question(
        question_id=new_id(),
        task_id=q.task_id,
        session_id=q.session_id,
        text=q.text,
        revision=revision,
        state=QuestionState.OPEN,
        asked_at=now,
        request_id=q.request_id,
    )
    replaced = None
    if previous is not None and previous.state == QuestionState.OPEN:
        replaced = replace(previous, state=QuestionState.REPLACED, closed_at=now)
    return question, replaced


@dataclass(frozen=True)
class AnswerAttempt:
    task_id: str
    question_id: str
    answer: str
    answered_by: str | None


def validate_answer_attempt(a: AnswerAttempt) -> AnswerAttempt:
    validate_uuid("taskId", a.task_id)
    validate_uuid("questionId", a.question_id)
    validate_text("answer", a.answer, MAX_ANSWER_BYTES)
    if a.answered_by:
        validate_name("answeredBy", a.answered_by)
    return a


def question_not_found(question_id: str) -> NotFound:
    return NotFound("QUESTION_NOT_FOUND", f"no question {question_id}", questionId=question_id)


def answer_question(question: Question, a: AnswerAttempt, now: int) -> tuple[Question, bool]:
    """Apply an answer: (the question afterwards, whether it was answered just now).

    Raises PermissionDenied for a question of another task, a stale (replaced or
    cancelled) question, or a different answer to an answered one.
    """
    if question.task_id != a.task_id:
        raise PermissionDenied(
            "QUESTION_STALE", "the question does not belong to this task", questionId=question.question_id
        )
    if question.state == QuestionState.ANSWERED:
        if question.answer == a.answer:
            return question, False
        raise PermissionDenied(
            "QUESTION_ALREADY_ANSWERED",
            "the question already has a different answer",
            questionId=question.question_id,
        )
    if question.state != QuestionState.OPEN:
        raise PermissionDenied(
            "QUESTION_STALE",
            f"the question is {question.state.value}; answer the task's current question",
            questionId=question.question_id,
            state=question.state.value,
        )
    answered = replace(
        question,
        state=QuestionState.ANSWERED,
        answer=a.answer,
        answered_by=a.answered_by or None,
        answered_at=now,
    )
    return answered, True


def cancel_question(question: Question, now: int) -> Question:
    return replace(question, state=QuestionState.CANCELLED, closed_at=now)
