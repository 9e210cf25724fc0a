"""The REST API's JSON shapes: request bodies, path and query parameters, response bodies.

These models are what ``/openapi.json`` publishes, so every constraint a backend
enforces on a field is stated here too (a request valid by the document is never
refused for its shape). Response models describe what ``convert`` produces; the
routes return that JSON directly and ``tests/unit/gateway`` keeps the two in step.
Absent optional fields are omitted from responses, never sent as null.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from datetime import datetime
from typing import Annotated, Literal

from fastapi import Path, Query
from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.json_schema import JsonDict, JsonValue

from gateway_http.convert import EXECUTION_TYPES, STATE_NAMES, TOOL_STATUS_NAMES

# Agent, session and request ids (libs.ids.ID_PATTERN); task and question ids are uuid4 hex.
ID_REGEX = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
UUID_HEX_REGEX = r"^[0-9a-f]{32}$"


def _not_blank_pattern() -> str:
    """A regex for "has a character str.strip() keeps", spelled out: ``\\S`` differs between
    Python, ECMA-262 and Rust (U+001C..U+001F, U+0085, U+FEFF)."""
    spaces = [c for c in range(sys.maxunicode + 1) if chr(c).isspace()]
    ranges: list[list[int]] = []
    for c in spaces:
        if ranges and ranges[-1][1] == c - 1:
            ranges[-1][1] = c
        else:
            ranges.append([c, c])
    parts = (f"\\u{lo:04x}" if lo == hi else f"\\u{lo:04x}-\\u{hi:04x}" for lo, hi in ranges)
    return f"[^{''.join(parts)}]"


# At least one character that is not white space. Documented only: the backends check it
# (str.strip) and answer with their own reasons (EMPTY_TITLE, EMPTY_ANSWER).
NOT_BLANK: JsonDict = {"pattern": _not_blank_pattern()}
MAX_PAGE = 1_000_000


def one_of(values: Iterable[str]) -> JsonDict:
    """A string field's documented values."""
    choices: list[JsonValue] = list(sorted(set(values)))
    return {"enum": choices}


TASK_STATES = one_of([*STATE_NAMES.values(), "unknown"])

AgentIdPath = Annotated[str, Path(pattern=ID_REGEX, max_length=128, description="the agent's id")]
SessionIdPath = Annotated[str, Path(pattern=ID_REGEX, max_length=128, description="the session's id")]
TaskIdPath = Annotated[str, Path(pattern=UUID_HEX_REGEX, min_length=32, max_length=32, description="32 hex digits")]
AgentIdQuery = Annotated[
    str | None,
    Query(
        pattern=ID_REGEX,
        max_length=128,
        description="the agent whose session this is; needed only when the API key has access to several agents",
    ),
]
PageQuery = Annotated[int, Query(ge=0, le=MAX_PAGE, description="zero-based; past the last page → the last page")]
PageSizeQuery = Annotated[int, Query(ge=1, le=100)]
AllQuery = Annotated[bool, Query(description="include finished tasks")]


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RequestBody(_Closed):
    @model_validator(mode="after")
    def _utf8(self) -> RequestBody:
        # JSON may carry lone surrogates ("\ud800"), which no backend can store.
        for name, value in self:
            if isinstance(value, str):
                try:
                    value.encode("utf-8")
                except UnicodeEncodeError:
                    raise ValueError(f"{name} is not valid Unicode text") from None
        return self


# --- errors ----------------------------------------------------------------------


class ErrorBody(_Closed):
    """Every 4xx and 5xx answer."""

    error: str = Field(description="an UPPER_SNAKE reason, e.g. INVALID_ID, NOT_A_MEMBER, ORCHESTRATION_DISABLED")
    message: str
    retryable: bool | None = Field(
        default=None, description="set when retrying the same request can succeed (WORKER_GIT_PROJECT_REQUIRED)"
    )
    continueTaskId: str | None = Field(default=None, description="the create's continueTaskId, echoed for the retry")


# --- request bodies ------------------------------------------------------------------


class TargetBody(RequestBody):
    name: str = Field(min_length=1, max_length=128, description="a configured [targets.NAME]")
    nativeSessionId: str = Field(pattern=ID_REGEX, max_length=128, description="the target's own session id")
    displayName: str | None = Field(default=None, max_length=200)
    options: dict[str, str] = Field(default_factory=dict, max_length=32, description="merged over the target's")


class SkillInvocation(RequestBody):
    name: str = Field(min_length=1, max_length=128, description="a configured skill")
    args: dict[str, str | int | float | bool] = Field(
        default_factory=dict, description="checked against the skill's args_schema (400 INVALID_SKILL_ARGS)"
    )


class CreateTaskBody(RequestBody):
    title: str = Field(max_length=200, json_schema_extra=NOT_BLANK, description="white space around it is dropped")
    instructions: str = Field(default="", max_length=65536, description="at most 64 KiB of UTF-8")
    profile: str | None = Field(
        default=None, max_length=128, description="a configured worker profile; default: default-worker"
    )
    requestId: str | None = Field(
        default=None, pattern=ID_REGEX, max_length=128, description="idempotency key: the same id → the same task"
    )
    harness: str | None = Field(
        default=None,
        max_length=100,
        description="routing, not a label: must be the chosen profile's harness (400 HARNESS_MISMATCH otherwise)",
    )
    harnessModel: str | None = Field(
        default=None, max_length=100, description="must be the chosen profile's model (400 HARNESS_MISMATCH)"
    )
    continueTaskId: str | None = Field(
        default=None,
        pattern=UUID_HEX_REGEX,
        min_length=32,
        max_length=32,
        description="a finished task of this session to continue, in its workspace (default profile: its profile)",
    )
    target: TargetBody | None = Field(
        default=None,
        description="a gateway-managed task: dispatched to this target, no worker (then no profile, skill, "
        "continuation or harness)",
    )
    skill: SkillInvocation | None = Field(
        default=None,
        description="create from an operator-declared skill (then no instructions; profile is the skill's)",
    )


class CancelBody(RequestBody):
    replacedByTaskId: str | None = Field(default=None, pattern=UUID_HEX_REGEX, min_length=32, max_length=32)


class AnswerBody(RequestBody):
    questionId: str = Field(pattern=UUID_HEX_REGEX, min_length=32, max_length=32)
    answer: str = Field(max_length=65536, json_schema_extra=NOT_BLANK, description="at most 64 KiB of UTF-8")


# --- the task snapshot -----------------------------------------------------------------


class ToolEvent(_Closed):
    name: str
    status: str | None = Field(default=None, json_schema_extra=one_of(TOOL_STATUS_NAMES.values()))
    at: datetime | None = None
    exitCode: int | None = None


class Activity(_Closed):
    lastActivityAt: datetime | None = None
    lastTool: ToolEvent | None = None
    recentTools: list[ToolEvent] = []


class ProcessRef(_Closed):
    pid: int
    startTime: int = Field(description="kernel start time in clock ticks (the identity fence)")


class CpuCounters(_Closed):
    userTicks: int
    systemTicks: int


class IoCounters(_Closed):
    readCount: int
    writeCount: int
    readBytes: int
    writeBytes: int


class Execution(_Closed):
    """The telemetry agent's latest observation of the worker's process tree."""

    available: bool
    reason: str | None = None
    observedAt: datetime | None = None
    lastActivityAt: datetime | None = None
    historical: bool | None = None
    cpu: CpuCounters
    io: IoCounters
    processes: list[ProcessRef]


class Progress(_Closed):
    text: str
    updatedAt: datetime | None = None


class Inspection(_Closed):
    reason: str
    since: datetime | None = None


class Timing(_Closed):
    createdAt: datetime | None = None
    firstStartedAt: datetime | None = None
    startedAt: datetime | None = None
    endedAt: datetime | None = None
    elapsedMs: int


class Cancellation(_Closed):
    requestedAt: datetime | None = None
    cause: str
    replacedByTaskId: str | None = None
    cleanup: str | None = Field(
        default=None,
        description="confirmed | unconfirmed | host_gone (the operator confirmed the worker's scheduler host"
        " gone; its stop was never proven)",
    )


class Failure(_Closed):
    code: str
    message: str
    retryable: bool
    exitCode: int | None = None


class Result(_Closed):
    text: str
    unresolvedBackground: bool | None = None


class PendingQuestion(_Closed):
    questionId: str
    text: str
    revision: int


class RestartResume(_Closed):
    count: int
    revision: int
    pending: bool
    lastProgress: str | None = None


class Workspace(_Closed):
    mode: str
    path: str


class Usage(_Closed):
    inputTokens: int | None = None
    cachedInputTokens: int | None = None
    outputTokens: int | None = None


class GatewayTarget(_Closed):
    adapter: str
    nativeSessionId: str
    displayName: str | None = None
    options: dict[str, str]


class GatewayDispatch(_Closed):
    requestId: str
    submittedAt: datetime | None = None


class TargetInfo(_Closed):
    name: str
    adapter: str
    displayName: str | None = None
    safemode: bool


class TargetList(_Closed):
    targets: list[TargetInfo]


class SkillRef(_Closed):
    """A skill task's public part: never the skill's body or its host paths."""

    name: str
    args: dict[str, str | int | float | bool]
    invocation: str | None = None


class Subagent(_Closed):
    taskId: str
    title: str
    state: str = Field(json_schema_extra=TASK_STATES)
    harness: str | None = None
    harnessModel: str | None = None


class ToolCount(_Closed):
    name: str
    count: int


class Evidence(_Closed):
    """Aggregated over a task and all its sub-tasks."""

    skills: list[str]
    subagents: list[str] = Field(description="task ids of every sub-task in the tree")
    subagentModels: list[str]
    toolCounts: list[ToolCount] = Field(description="every tool reported in the tree, by name")
    observedPaths: list[str]
    currentFilesystemVerified: bool = Field(description="always false: reported paths, not a look at the files")


class Attempt(_Closed):
    attemptId: str
    number: int
    startedAt: datetime | None = None
    endedAt: datetime | None = None
    pid: int | None = None
    pgid: int | None = None
    pidStartTime: int | None = None
    bootId: str
    harness: str | None = None
    harnessModel: str | None = None
    usage: Usage | None = None
    exitCode: int | None = None
    outcome: str | None = None
    descendants: list[ProcessRef] | None = None


class Task(_Closed):
    """A task's public snapshot."""

    taskId: str
    agentId: str
    sessionId: str
    title: str
    instructions: str
    state: str = Field(json_schema_extra=TASK_STATES)
    executionType: str = Field(json_schema_extra=one_of(EXECUTION_TYPES.values()))
    targetProfile: str
    progress: Progress | None = None
    activity: Activity | None = None
    execution: Execution | None = None
    inspection: Inspection | None = None
    timing: Timing
    cancellation: Cancellation | None = None
    failure: Failure | None = None
    result: Result | None = None
    pendingQuestion: PendingQuestion | None = None
    restartResume: RestartResume | None = None
    harness: str | None = None
    harnessModel: str | None = None
    workspace: Workspace
    observedPaths: list[str]
    currentFilesystemVerified: bool
    attempts: list[Attempt]
    updatedAt: datetime | None = Field(
        default=None, description="the latest state change or persisted tool activity, whichever is later"
    )
    gatewayTarget: GatewayTarget | None = None
    gatewayDispatch: GatewayDispatch | None = None
    continueTaskId: str | None = None
    continuedByTaskId: str | None = None
    parentTaskId: str | None = None
    skill: SkillRef | None = None
    subagents: list[Subagent] | None = Field(default=None, description="detail only: the direct sub-tasks")
    evidence: Evidence | None = Field(default=None, description="detail only, when the tree used skills or sub-tasks")
    version: int = Field(
        ge=0, description="Raised by every committed change; a stream never sends an older one after a newer one."
    )


class TaskEnvelope(_Closed):
    task: Task


class TaskPage(_Closed):
    page: int
    pages: int
    total: int
    tasks: list[Task]


class TaskStateRef(_Closed):
    taskId: str
    state: str = Field(json_schema_extra=TASK_STATES)


class CancelResult(_Closed):
    task: TaskStateRef


class WorkerLog(_Closed):
    """The tail of a worker's log: what the attempt's process wrote to stdout and stderr."""

    taskId: str
    attempt: int | None = Field(default=None, description="the attempt read; absent when the task has none yet")
    sizeBytes: int = Field(description="the whole log's size")
    truncated: bool = Field(description="the log holds more than text: only its tail is here")
    expired: bool = Field(
        description="no log because the attempt ended longer ago than the worker log retention: it was deleted"
    )
    text: str = Field(description="the tail as UTF-8 (undecodable bytes replaced)")


# --- who the key is ------------------------------------------------------------------


class MyAgent(_Closed):
    agentId: str
    orchestrationEnabled: bool
    sessions: list[str] = Field(description="sessions of this agent the key's principal is a member of")


class Me(_Closed):
    """The API key's principal, its agents and its sessions (what a dashboard offers to open)."""

    principal: str
    allowTools: list[str] | None = Field(default=None, description="absent: every tool is allowed")
    agents: list[MyAgent]


# --- the session's pending task -----------------------------------------------------


class SnapshotToolResult(_Closed):
    toolCallId: str
    name: str
    arguments: str = Field(description="at most 1 KiB of UTF-8")
    output: str = Field(description="at most 4 KiB of UTF-8")
    argumentsTruncated: bool
    outputTruncated: bool


class SessionTask(_Closed):
    agentId: str
    sessionId: str
    entryId: str
    origin: str
    kind: Literal["confirm", "ask", "secret"]
    payload: str
    createdAt: datetime | None = None
    toolResults: list[SnapshotToolResult]


class SessionTaskEnvelope(_Closed):
    task: SessionTask


# --- health ------------------------------------------------------------------------------


class Health(_Closed):
    status: Literal["ok", "degraded", "unavailable"] = Field(
        description="ok: every backend SERVING; degraded: an advisory one is not (still 200); "
        "unavailable: a required one is not (503)"
    )
    required: dict[str, str] = Field(description="backends the gateway cannot work without, and their status")
    advisory: dict[str, str] = Field(description="backends whose loss only degrades answers, and their status")
