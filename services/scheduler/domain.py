"""Task rules: states, transitions, validation, pagination and supervision timers.

Pure code: no grpc, no database. Times are integer milliseconds since the epoch,
passed in by the caller (the injected clock).
"""

from __future__ import annotations

import math
import signal
from collections.abc import Container
from dataclasses import dataclass
from enum import StrEnum

from pydantic import BaseModel, Field

from libs import errors
from libs.ids import ID_PATTERN, UUID_HEX_PATTERN
from libs.settings import TaskSettings

MAX_TITLE_CHARS = 200
MAX_INSTRUCTIONS_BYTES = 64 * 1024
MAX_PROGRESS_CHARS = 4000
MAX_RESULT_BYTES = 256 * 1024
MAX_TOOL_NAME_CHARS = 200
MAX_QUESTION_BYTES = 64 * 1024
MAX_PATH_CHARS = 4096
DEFAULT_PROFILE = "default-worker"
DEFAULT_PAGE_SIZE = 10
MAX_PAGE_SIZE = 100
DEFAULT_PREVIEW_CHARS = 280


class InvalidArgument(errors.InvalidArgument):
    pass


class TaskNotFound(errors.NotFound):
    pass


class InvalidTransition(errors.FailedPrecondition):
    pass


class WorkerDenied(errors.PermissionDenied):
    pass


class State(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    WAITING_INPUT = "waiting_input"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCEL_REQUESTED = "cancel_requested"
    CANCELLED = "cancelled"
    NEEDS_RECONCILIATION = "needs_reconciliation"
    RECOVERING = "recovering"
    # The worker stopped with proof; question and pending snapshot kept; `resume` re-queues it.
    PAUSED = "paused"


TERMINAL = frozenset({State.COMPLETED, State.FAILED, State.CANCELLED})
# States in which a worker process of the task may be alive.
ACTIVE = frozenset({State.RUNNING, State.WAITING_INPUT, State.CANCEL_REQUESTED, State.RECOVERING})

_ALLOWED: dict[State, frozenset[State]] = {
    # cancel_requested / needs_reconciliation: a launch an earlier incarnation did not
    # commit `running`, whose worker may still live.
    State.QUEUED: frozenset(
        {
            State.RUNNING,
            State.CANCELLED,
            State.FAILED,
            State.CANCEL_REQUESTED,
            State.NEEDS_RECONCILIATION,
            State.PAUSED,
        }
    ),
    State.RUNNING: frozenset(
        {
            State.WAITING_INPUT,
            State.COMPLETED,
            State.FAILED,
            State.CANCEL_REQUESTED,
            State.NEEDS_RECONCILIATION,
            State.RECOVERING,
            State.QUEUED,
        }
    ),
    State.WAITING_INPUT: frozenset(
        {
            State.RUNNING,
            State.COMPLETED,
            State.FAILED,
            State.CANCEL_REQUESTED,
            State.NEEDS_RECONCILIATION,
            State.RECOVERING,
            State.QUEUED,
        }
    ),
    # cancel_requested also carries a pause while its worker is being stopped.
    State.CANCEL_REQUESTED: frozenset({State.CANCELLED, State.NEEDS_RECONCILIATION, State.RECOVERING, State.PAUSED}),
    # completed: a HOST_LOST task whose worker, its host found on return, had exited 0.
    # running / waiting_input: a HOST_LOST task whose host was only silent and holds its worker alive.
    State.NEEDS_RECONCILIATION: frozenset(
        {
            State.CANCELLED,
            State.FAILED,
            State.QUEUED,
            State.PAUSED,
            State.COMPLETED,
            State.RUNNING,
            State.WAITING_INPUT,
        }
    ),
    State.RECOVERING: frozenset(
        # completed: its worker had reported its result and exited before the crash
        {State.QUEUED, State.NEEDS_RECONCILIATION, State.FAILED, State.CANCELLED, State.COMPLETED, State.PAUSED}
    ),
    State.PAUSED: frozenset({State.QUEUED, State.CANCELLED}),
    State.COMPLETED: frozenset(),
    State.FAILED: frozenset(),
    State.CANCELLED: frozenset(),
}


def check_transition(current: State, target: State, legacy_adoption: bool = False) -> None:
    """Refuse a move the state machine does not allow.

    ``legacy_adoption``: the one way out of a terminal state — a task an older version left
    ``failed`` ``GATEWAY_SHUTDOWN`` is queued again (``adopt_legacy_shutdown``).
    """
    if legacy_adoption and (current, target) == (State.FAILED, State.QUEUED):
        return
    if target not in _ALLOWED[current]:
        raise InvalidTransition(
            "INVALID_TRANSITION",
            f"a task in state {current} cannot become {target}",
            current=current.value,
            target=target.value,
        )


class FailureCode(StrEnum):
    WORKER_EXITED = "WORKER_EXITED"
    WORKER_KILLED = "WORKER_KILLED"
    WORKER_LAUNCH_FAILED = "WORKER_LAUNCH_FAILED"
    FIRST_REPORT_TIMEOUT = "FIRST_REPORT_TIMEOUT"
    PROGRESS_STALLED = "PROGRESS_STALLED"
    MAX_DURATION_EXCEEDED = "MAX_DURATION_EXCEEDED"
    GATEWAY_SHUTDOWN = "GATEWAY_SHUTDOWN"
    GATEWAY_SHUTDOWN_REPEATED = "GATEWAY_SHUTDOWN_REPEATED"
    CLEANUP_UNCONFIRMED = "CLEANUP_UNCONFIRMED"
    # Its scheduler host stopped renewing its lease: the worker may still live there.
    HOST_LOST = "HOST_LOST"
    # Gateway-managed tasks: the target refused or could not be reached (nothing was delivered),
    # or the request may have been delivered but its outcome was lost (never retried).
    DISPATCH_FAILED = "DISPATCH_FAILED"
    DISPATCH_OUTCOME_UNKNOWN = "DISPATCH_OUTCOME_UNKNOWN"


class Progress(BaseModel):
    text: str
    updated_at: int


class ToolEvent(BaseModel):
    name: str
    status: str  # "returned" | "error"
    at: int
    exit_code: int | None = None


class Inspection(BaseModel):
    reason: str
    since: int


class Cancellation(BaseModel):
    requested_at: int
    cause: str
    replaced_by_task_id: str | None = None
    cleanup: str | None = None  # "confirmed" | "unconfirmed"


class Failure(BaseModel):
    code: str
    message: str
    retryable: bool = False
    exit_code: int | None = None


class Result(BaseModel):
    text: str
    unresolved_background: bool = False


class ProcessIdentity(BaseModel):
    pid: int
    start_time: int


class Usage(BaseModel):
    input_tokens: int | None = None
    cached_input_tokens: int | None = None
    output_tokens: int | None = None


class Attempt(BaseModel):
    attempt_id: str
    task_id: str
    number: int
    boot_id: str
    token_hash: str
    started_at: int | None = None
    ended_at: int | None = None
    pid: int | None = None
    pgid: int | None = None
    pid_start_time: int | None = None
    harness: str | None = None
    harness_model: str | None = None
    usage: Usage | None = None
    exit_code: int | None = None
    signal: int | None = None
    outcome: str | None = None
    first_contact_at: int | None = None
    descendants: list[ProcessIdentity] = Field(default_factory=list)
    # "launching" (committed before the fork, pid unknown or not yet running)
    # -> "running" -> "ended"; None on rows written before the launch protocol.
    state: str | None = None
    # The attempt's own cgroup (cgroup mode): the stop kills it, empty is proof.
    cgroup: str | None = None
    # The scheduler host that launched it (only that host can signal or prove it).
    host_id: str | None = None
    # A moment (kernel boot-clock ticks, the unit of start times) at which the attempt's
    # process group id was still its own: a process-table read that saw its leader, or the
    # scheduler's reap of the exited leader. Once the leader is gone, live members of that
    # group are the attempt's only if one of them started by then (or is a recorded
    # descendant): a later group with that id may be a reused pid's.
    group_held_ticks: int | None = None


class PendingQuestion(BaseModel):
    question_id: str
    text: str
    revision: int


class Execution(BaseModel):
    """The latest telemetry observation of the task's process tree.

    ``observed_at`` is when it was sampled; ``last_activity_at`` is when a CPU or
    I/O counter last moved. They are kept apart: sampling is not activity, and
    activity is not progress.
    """

    available: bool
    reason: str | None = None
    observed_at: int
    last_activity_at: int | None = None
    cpu_user_ticks: int | None = None
    cpu_system_ticks: int | None = None
    io_read_count: int | None = None
    io_write_count: int | None = None
    io_read_bytes: int | None = None
    io_write_bytes: int | None = None
    processes: list[ProcessIdentity] = Field(default_factory=list)


class RestartResume(BaseModel):
    count: int
    revision: int
    pending: bool
    last_progress: str | None = None


class SkillRef(BaseModel):
    """A skill task's public part: its name, validated arguments and (CLI skill) invocation.
    The skill's body and host paths are never stored on the task."""

    name: str
    args: dict[str, str | int | float | bool] = Field(default_factory=dict)
    invocation: str | None = None


WORKER = "worker"
GATEWAY_MANAGED = "gateway-managed"


class GatewayTarget(BaseModel):
    name: str
    adapter: str
    native_session_id: str
    display_name: str | None = None
    options: dict[str, str] = Field(default_factory=dict)
    # A safemode target: the creating caller (the gateway) checked the agent's grant and assignment.
    safemode_cleared: bool = False


class GatewayDispatch(BaseModel):
    request_id: str
    submitted_at: int | None = None


class PendingOutcome(BaseModel):
    """Where a stop that could not be confirmed leads once cleanup is proven."""

    state: State
    failure: Failure | None = None
    result: Result | None = None


class Task(BaseModel):
    task_id: str
    agent_id: str
    session_id: str
    title: str
    instructions: str
    profile: str
    state: State
    created_at: int
    updated_at: int
    request_id: str | None = None
    harness: str | None = None
    harness_model: str | None = None
    workspace_mode: str = "agent"
    workspace_path: str = ""
    first_started_at: int | None = None
    started_at: int | None = None
    ended_at: int | None = None
    progress: Progress | None = None
    last_activity_at: int | None = None
    last_tool: ToolEvent | None = None
    recent_tools: list[ToolEvent] = Field(default_factory=list)
    inspection: Inspection | None = None
    cancellation: Cancellation | None = None
    failure: Failure | None = None
    result: Result | None = None
    result_reported_at: int | None = None
    observed_paths: list[str] = Field(default_factory=list)
    execution: Execution | None = None
    restart_resume: RestartResume | None = None
    pending_question: PendingQuestion | None = None
    pending_outcome: PendingOutcome | None = None
    # The scheduler host that claimed it and owns its workers; None while queued
    # unclaimed (a re-queue after a proven stop releases it to any host).
    owner_host: str | None = None
    # Continuation: the finished task this one continues, and the task that continued this one.
    continue_task_id: str | None = None
    continued_by_task_id: str | None = None
    # Sub-task trees: the parent that started this task (WorkerService.SpawnTask), its depth
    # (a root task is 0) and the tree's root.
    parent_task_id: str | None = None
    root_task_id: str | None = None
    depth: int = 0
    skill: SkillRef | None = None
    # "worker" (a process) or "gateway-managed" (a request to an external agent session). A row
    # written before gateway-managed tasks existed has neither field and reads as a worker task.
    execution_type: str = WORKER
    gateway_target: GatewayTarget | None = None
    gateway_dispatch: GatewayDispatch | None = None
    # Every tool the task's workers reported, by name (exact; recent_tools keeps only the last few).
    tool_counts: dict[str, int] = Field(default_factory=dict)
    # Whether the pending-registry may hold a question of this task, so that its end must close
    # them there (``closes_questions``): False when created, set and committed before a question
    # is first sent to the registry, never cleared. Durable, so any replica or a restarted
    # scheduler that ends the task knows it; a row written before the field existed reads True.
    may_have_asked: bool = True
    # Per-task revision of the stored snapshot: +1 on every committed change (store.update_task).
    # Watchers drop an event older than what they already sent (publishes may reorder across
    # database threads), so a client never sees an older snapshot after a newer one.
    version: int = 0

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    @property
    def gateway_managed(self) -> bool:
        return self.execution_type == GATEWAY_MANAGED

    def elapsed_ms(self, now: int) -> int:
        if self.first_started_at is None:
            return 0
        end = self.ended_at if self.ended_at is not None else now
        return max(0, end - self.first_started_at)


@dataclass(frozen=True)
class NewTask:
    agent_id: str
    session_id: str
    title: str
    instructions: str
    profile: str
    request_id: str | None
    harness: str | None
    harness_model: str | None
    continue_task_id: str | None = None
    # A skill task: the skill's name and its arguments as a JSON object (validated by ``skills``).
    skill_name: str | None = None
    skill_args_json: str | None = None
    # A gateway-managed task: the [targets.NAME] and the external session it goes to.
    target: GatewayTarget | None = None


class WorkerGitProjectRequired(errors.InvalidArgument):
    """An isolated-worktree profile without a Git project: refused before anything is created."""


def check_harness(
    profile_name: str,
    profile_harness: str | None,
    profile_model: str | None,
    harness: str | None,
    harness_model: str | None,
) -> None:
    """A caller asks for a harness (or model) only by choosing a profile that runs it."""
    for field, asked, runs in (("harness", harness, profile_harness), ("harnessModel", harness_model, profile_model)):
        if asked is not None and asked != runs:
            raise InvalidArgument(
                "HARNESS_MISMATCH",
                f"profile {profile_name!r} runs {field} {runs!r}, not {asked!r}: choose a profile that has it",
                field=field,
            )


def check_continuable(earlier: Task, agent_id: str, session_id: str) -> None:
    """Only a finished task of the same session, not continued yet, is continued."""
    if earlier.agent_id != agent_id or earlier.session_id != session_id:
        raise WorkerDenied("CONTINUE_ACCESS_DENIED", "continueTaskId names a task of another session")
    if not earlier.terminal:
        raise InvalidTransition(
            "TASK_NOT_FINISHED", f"the task to continue is {earlier.state}; only a finished task is continued"
        )
    if earlier.continued_by_task_id is not None:
        raise errors.AlreadyExists(
            "ALREADY_CONTINUED",
            f"task {earlier.task_id} is already continued by {earlier.continued_by_task_id}",
            continuedByTaskId=earlier.continued_by_task_id,
        )


def validate_id(kind: str, value: str) -> str:
    if not ID_PATTERN.match(value or ""):
        raise InvalidArgument(
            "INVALID_ID",
            f"{kind} must be 1-128 characters of letters, digits, '.', '_', ':' or '-'",
            field=kind,
        )
    return value


def validate_task_id(value: str) -> str:
    if not UUID_HEX_PATTERN.match(value or ""):
        raise InvalidArgument("INVALID_ID", "taskId must be 32 lowercase hex characters", field="taskId")
    return value


def validate_new_task(req: NewTask, known_profiles: Container[str]) -> NewTask:
    validate_id("agentId", req.agent_id)
    validate_id("sessionId", req.session_id)
    title = req.title.strip()
    if not title:
        raise InvalidArgument("EMPTY_TITLE", "title must not be empty", field="title")
    if len(title) > MAX_TITLE_CHARS:
        raise InvalidArgument("FIELD_TOO_LONG", f"title is longer than {MAX_TITLE_CHARS} characters", field="title")
    if len(req.instructions.encode()) > MAX_INSTRUCTIONS_BYTES:
        raise InvalidArgument(
            "FIELD_TOO_LONG", f"instructions exceed {MAX_INSTRUCTIONS_BYTES} bytes", field="instructions"
        )
    profile = req.profile or DEFAULT_PROFILE
    if profile not in known_profiles:
        raise InvalidArgument("UNKNOWN_PROFILE", f"no worker profile named {profile!r}", field="profile")
    if req.request_id is not None and not ID_PATTERN.match(req.request_id):
        raise InvalidArgument("INVALID_ID", "requestId must be 1-128 id characters", field="requestId")
    if req.continue_task_id is not None:
        validate_task_id(req.continue_task_id)
    for name, value in (("harness", req.harness), ("harnessModel", req.harness_model)):
        if value is not None and len(value) > 100:
            raise InvalidArgument("FIELD_TOO_LONG", f"{name} is longer than 100 characters", field=name)
    if title == req.title and profile == req.profile and "" not in (req.request_id, req.harness, req.harness_model):
        return req  # already in its normal form (frozen: safe to share)
    return NewTask(
        agent_id=req.agent_id,
        session_id=req.session_id,
        title=title,
        instructions=req.instructions,
        profile=profile,
        request_id=req.request_id or None,
        harness=req.harness or None,
        harness_model=req.harness_model or None,
        continue_task_id=req.continue_task_id,
        skill_name=req.skill_name,
        skill_args_json=req.skill_args_json,
        target=req.target,
    )


@dataclass(frozen=True)
class PageRequest:
    page: int
    page_size: int


def validate_page(page: int, page_size: int) -> PageRequest:
    size = page_size or DEFAULT_PAGE_SIZE
    if page < 0:
        raise InvalidArgument("INVALID_PAGE", "page must be 0 or more", field="page")
    if not 1 <= size <= MAX_PAGE_SIZE:
        raise InvalidArgument("INVALID_PAGE_SIZE", f"page_size must be 1-{MAX_PAGE_SIZE}", field="page_size")
    return PageRequest(page, size)


def clamp_page(req: PageRequest, total: int) -> tuple[int, int]:
    """(page, pages): an out-of-range page is clamped to the last one (page 0 when empty)."""
    pages = max(1, math.ceil(total / req.page_size))
    return min(req.page, pages - 1), pages


def preview(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(0, limit - 1)] + "…"


def clamp_utf8(text: str, limit_bytes: int) -> str:
    """Cut ``text`` to at most ``limit_bytes`` of UTF-8 without splitting a character."""
    data = text.encode()
    if len(data) <= limit_bytes:
        return text
    return data[:limit_bytes].decode("utf-8", "ignore")


# --- supervision -----------------------------------------------------------


class Verdict(StrEnum):
    NONE = "none"
    INSPECT = "inspect"
    STOP_STALLED = "stop_stalled"
    STOP_MAX_DURATION = "stop_max_duration"
    STOP_NO_FIRST_REPORT = "stop_no_first_report"
    ACCEPT_BACKGROUND = "accept_background"


@dataclass(frozen=True)
class Supervision:
    verdict: Verdict
    detail: str = ""


def last_activity(task: Task) -> int | None:
    candidates = [
        task.last_activity_at,
        task.progress.updated_at if task.progress else None,
        task.last_tool.at if task.last_tool else None,
        task.started_at,
    ]
    values = [v for v in candidates if v is not None]
    return max(values) if values else None


def apply_observation(task: Task, observation: Execution) -> bool:
    """Keep the latest observation on a live task; CPU/IO movement counts as activity.

    Returns False when the task is finished (its last observation stays historical).
    """
    if task.terminal:
        return False
    task.execution = observation
    moved = observation.last_activity_at
    if moved is not None and (task.last_activity_at is None or moved > task.last_activity_at):
        task.last_activity_at = moved
        if task.inspection is not None and moved > task.inspection.since:
            task.inspection = None
    return True


def supervise(task: Task, attempt: Attempt, settings: TaskSettings, now: int, uses_sdk: bool) -> Supervision:
    """What the supervisor loop must do about one live task right now."""
    if task.state not in (State.RUNNING, State.WAITING_INPUT) or attempt.started_at is None:
        return Supervision(Verdict.NONE)
    if settings.max_duration_ms and task.first_started_at is not None:
        if now - task.first_started_at >= settings.max_duration_ms:
            return Supervision(Verdict.STOP_MAX_DURATION, f"ran longer than {settings.max_duration_ms} ms")
    if task.result is not None and task.result.unresolved_background and task.result_reported_at is not None:
        if now - task.result_reported_at >= settings.background_grace_ms:
            return Supervision(Verdict.ACCEPT_BACKGROUND)
        return Supervision(Verdict.NONE)  # a reported result is not stalled work
    if task.state == State.WAITING_INPUT:
        return Supervision(Verdict.NONE)  # waiting for a person is never a stall
    if uses_sdk and settings.first_report_timeout_ms and attempt.first_contact_at is None:
        if now - attempt.started_at >= settings.first_report_timeout_ms:
            return Supervision(
                Verdict.STOP_NO_FIRST_REPORT,
                f"no contact from the worker within {settings.first_report_timeout_ms} ms",
            )
    if settings.progress_stale_limit_ms:
        since = task.progress.updated_at if task.progress else attempt.started_at
        since = max(since, attempt.started_at)
        if now - since >= settings.progress_stale_limit_ms:
            return Supervision(Verdict.STOP_STALLED, f"no progress report for {settings.progress_stale_limit_ms} ms")
    if settings.idle_timeout_ms and task.inspection is None:
        active = last_activity(task)
        if active is not None and now - active >= settings.idle_timeout_ms:
            return Supervision(Verdict.INSPECT, f"no activity for {settings.idle_timeout_ms} ms")
    return Supervision(Verdict.NONE)


def end_task(task: Task, state: State, now: int, failure: Failure | None = None, result: Result | None = None) -> Task:
    """Move a task to a terminal state: the end time freezes elapsed, timers' marks are cleared.

    A cancelled task carries no failure and its cleanup is confirmed: only proven stops end here.
    """
    if state not in TERMINAL:
        raise ValueError(f"{state} is not a terminal state")
    task.state = state
    task.updated_at = task.ended_at = now
    task.inspection = None
    task.pending_outcome = None
    if state == State.CANCELLED:
        task.failure = None
        if task.cancellation is not None:
            task.cancellation.cleanup = "confirmed"
    if failure is not None:
        task.failure = failure
    if result is not None:
        task.result = result
    return task


MAX_AUTOMATIC_RESUMES = 3


def resume_after_interruption(task: Task, now: int, reason: str) -> Task:
    """Re-queue an interrupted task, or fail it once the revision's resumes are used up."""
    previous = task.restart_resume
    count = (previous.count if previous else 0) + 1
    revision = previous.revision if previous else 1
    last_progress = task.progress.text if task.progress else (previous.last_progress if previous else None)
    task.inspection = None
    task.pending_outcome = None
    task.updated_at = now  # a re-queue is a change like any other: lists sort and clients poll by it
    if count > MAX_AUTOMATIC_RESUMES:
        task.state = State.FAILED
        task.ended_at = now
        task.failure = Failure(
            code=FailureCode.GATEWAY_SHUTDOWN_REPEATED,
            message=f"interrupted {count} times in revision {revision}; not resumed again",
        )
        task.restart_resume = RestartResume(
            count=count - 1, revision=revision, pending=False, last_progress=last_progress
        )
        return task
    task.state = State.QUEUED
    task.failure = Failure(code=FailureCode.GATEWAY_SHUTDOWN, message=reason, retryable=True)
    task.restart_resume = RestartResume(count=count, revision=revision, pending=True, last_progress=last_progress)
    return task


# How recent a legacy GATEWAY_SHUTDOWN failure must be for start-up to adopt it (seed 004).
LEGACY_ADOPTION_WINDOW_MS = 10 * 60_000


def legacy_shutdown_adoptable(task: Task, now: int) -> bool:
    """A task an older version failed at its shutdown, recently, with resumes left in its revision.

    (The caller also needs the notifier's word that the failure was never reported.)
    """
    if task.state != State.FAILED or task.failure is None or task.failure.code != FailureCode.GATEWAY_SHUTDOWN:
        return False
    ended = task.ended_at if task.ended_at is not None else task.updated_at
    if now - ended >= LEGACY_ADOPTION_WINDOW_MS:
        return False
    used = task.restart_resume.count if task.restart_resume else 0
    return used < MAX_AUTOMATIC_RESUMES


def adopt_legacy_shutdown(task: Task, now: int) -> Task | None:
    """Resume a legacy ``failed`` ``GATEWAY_SHUTDOWN`` task the way a shutdown re-queue does."""
    if not legacy_shutdown_adoptable(task, now):
        return None
    task.ended_at = None
    return resume_after_interruption(task, now, "resumed after a shutdown by an older version")


def new_revision(task: Task, now: int) -> Task:
    """New input starts a new revision of the task, with its own three automatic resumes.

    What bumps the revision: a person's answer to the task's question, a resume after a pause,
    an edit of the instructions — each is new work the interruptions so far did not see.
    Interruptions only count within one revision; the first revision is 1.
    """
    previous = task.restart_resume
    task.restart_resume = RestartResume(
        count=0,
        revision=(previous.revision if previous else 1) + 1,
        pending=previous.pending if previous else False,  # a paused task still resumes
        last_progress=previous.last_progress if previous else None,
    )
    task.updated_at = now
    return task


def finished_before_crash(task: Task, attempt: Attempt, tree_gone: bool) -> bool:
    """Whether recovery should settle the task ``completed`` instead of running it again.

    True when the attempt reported its final result (after it started) and nothing of it was
    left running when recovery looked: the worker finished and exited, only the scheduler's
    record of its exit was lost with the crash.
    """
    return (
        tree_gone
        and task.result is not None
        and task.result_reported_at is not None
        and attempt.started_at is not None
        and task.result_reported_at >= attempt.started_at
    )


def closes_questions(before: Task, after: Task) -> bool:
    """Whether this change ends the task so that its open question must be closed.

    A finished task's question is closed, unless a cancel only paused the task (any cause but
    ``user_canceled``): a paused task may be resumed and still want its answer.
    """
    if before.terminal or not after.terminal:
        return False
    paused = after.cancellation is not None and after.cancellation.cause != USER_CANCELED
    return not (after.state == State.CANCELLED and paused)


def question_close_retry_ms(attempts: int) -> int:
    """When to try closing a finished task's questions again: doubling from 500 ms, at most 30 s."""
    return int(min(500 * 2 ** max(0, attempts - 1), 30_000))


def describe_exit(returncode: int) -> tuple[State, Failure | None]:
    """Map a worker's own exit (not one taskgate caused) to the task's end state."""
    if returncode == 0:
        return State.COMPLETED, None
    if returncode > 0:
        return State.FAILED, Failure(
            code=FailureCode.WORKER_EXITED,
            message=f"worker exited with code {returncode}",
            exit_code=returncode,
        )
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    return State.FAILED, Failure(code=FailureCode.WORKER_KILLED, message=f"worker was killed by {name}")


# --- transitions the engine applies inside one store transaction -------------
#
# Each takes the task as read in that transaction and the time from the injected
# clock; it either changes the task and returns True (the change is committed with
# an event) or returns False (nothing to do, nothing committed).

USER_CANCELED = "user_canceled"

# Why the supervisor stops an attempt, by its verdict.
STOP_REASONS: dict[Verdict, str] = {
    Verdict.STOP_STALLED: "stalled",
    Verdict.STOP_MAX_DURATION: "max_duration",
    Verdict.STOP_NO_FIRST_REPORT: "no_first_report",
    Verdict.ACCEPT_BACKGROUND: "background",
}


def start_running(task: Task, started_at: int, now: int, harness: str | None, harness_model: str | None) -> Task:
    """A launched attempt's task runs; a resumed task's interruption failure is cleared."""
    task.state = State.RUNNING
    task.first_started_at = task.first_started_at or started_at
    task.started_at = started_at
    task.updated_at = now
    task.inspection = None
    task.harness, task.harness_model = harness, harness_model
    if task.restart_resume is not None and task.restart_resume.pending:
        task.restart_resume.pending = False
        task.failure = None
    return task


def mark_for_inspection(task: Task, reason: str, now: int) -> bool:
    """Idle work is flagged for a person to look at, once; it is never a termination."""
    if task.state not in (State.RUNNING, State.WAITING_INPUT) or task.inspection is not None:
        return False
    task.inspection = Inspection(reason=reason, since=now)
    return True


def finish(
    task: Task,
    state: State,
    now: int,
    failure: Failure | None = None,
    result: Result | None = None,
    only_from: tuple[State, ...] | None = None,
) -> bool:
    """End a task unless it already ended (or is no longer in one of ``only_from``)."""
    if task.terminal or (only_from is not None and task.state not in only_from):
        return False
    end_task(task, state, now, failure=failure, result=result)
    return True


def exit_result(state: State, reported: Result | None) -> Result | None:
    """A worker that exited 0 completes with the result it reported (or an empty one)."""
    if state != State.COMPLETED:
        return None
    return Result(text=reported.text if reported else "")


def stop_outcome(why: str, task: Task, message: str) -> PendingOutcome:
    """Where a stop taskgate made leads once the tree is proven gone.

    ``why``: cancel | stalled | max_duration | no_first_report | background | shutdown.
    """
    if why == "cancel":
        return PendingOutcome(state=State.CANCELLED)
    if why == "pause":
        return PendingOutcome(state=State.PAUSED)
    if why == "background":
        text = task.result.text if task.result else ""
        return PendingOutcome(state=State.COMPLETED, result=Result(text=text, unresolved_background=True))
    if why == "shutdown":
        return PendingOutcome(
            state=State.QUEUED, failure=Failure(code=FailureCode.GATEWAY_SHUTDOWN, message=message, retryable=True)
        )
    code = {
        "stalled": FailureCode.PROGRESS_STALLED,
        "max_duration": FailureCode.MAX_DURATION_EXCEEDED,
        "no_first_report": FailureCode.FIRST_REPORT_TIMEOUT,
    }[why]
    return PendingOutcome(state=State.FAILED, failure=Failure(code=code, message=message))


def settle(task: Task, outcome: PendingOutcome, now: int) -> bool:
    """A proven stop: the pending outcome happens (a re-queue counts as a resume).

    A re-queue yields to a cancel that arrived meanwhile: a cancel (or pause) while
    ``recovering`` is recorded on the task and honoured here, once recovery ends.
    """
    if task.terminal:
        return False
    if outcome.state == State.QUEUED and task.state == State.RECOVERING and task.cancellation is not None:
        if task.cancellation.cause == PAUSE_CAUSE:
            pause(task, now)
        else:
            end_task(task, State.CANCELLED, now)
    elif outcome.state == State.QUEUED:
        assert outcome.failure is not None
        resume_after_interruption(task, now, outcome.failure.message)
    elif outcome.state == State.PAUSED:
        pause(task, now)
    else:
        end_task(task, outcome.state, now, failure=outcome.failure, result=outcome.result)
    return True


def mark_unconfirmed(task: Task, outcome: PendingOutcome, detail: str, now: int) -> bool:
    """A stop that could not be proven: the task waits in needs_reconciliation with its outcome."""
    if task.terminal:
        return False
    _await_reconciliation(
        task, outcome, FailureCode.CLEANUP_UNCONFIRMED, f"cannot confirm the worker stopped: {detail}", now
    )
    return True


def _await_reconciliation(task: Task, outcome: PendingOutcome, code: str, message: str, now: int) -> None:
    """The task waits in needs_reconciliation, keeping where it goes once its worker is proven gone."""
    task.state = State.NEEDS_RECONCILIATION
    task.updated_at = now
    task.pending_outcome = outcome
    task.failure = Failure(code=code, message=message, retryable=True)
    if task.cancellation is not None:
        task.cancellation.cleanup = "unconfirmed"


def mark_host_lost(task: Task, host_id: str, now: int) -> bool:
    """The task's host stopped renewing its lease: its worker may live on there, so the task is
    never re-run elsewhere; it waits in needs_reconciliation with what its recovery would do, for
    that host's return (or the operator). Unclaimed or settled tasks are left alone."""
    if task.owner_host != host_id or task.terminal or task.state in (State.NEEDS_RECONCILIATION, State.PAUSED):
        return False
    message = f"scheduler host {host_id} stopped renewing its lease; its worker may still run there"
    _await_reconciliation(task, recovery_outcome(task), FailureCode.HOST_LOST, message, now)
    return True


def host_lost_here(task: Task, host_id: str) -> bool:
    """Swept HOST_LOST while it was this host's: only this host may settle it (reconciliation)."""
    return (
        task.state == State.NEEDS_RECONCILIATION
        and task.owner_host == host_id
        and task.failure is not None
        and task.failure.code == FailureCode.HOST_LOST
    )


def take_back_live(task: Task, host_id: str, now: int) -> bool:
    """A HOST_LOST task whose host was only silent (a stall, not a crash) and still holds its
    worker, alive — its own child, so nothing else can have run it: back to running (or to
    waiting for its open question), so its reports and questions are taken again. A stop that
    was in flight is not undone: the stopper settles that task."""
    if not host_lost_here(task, host_id) or task.cancellation is not None:
        return False
    task.state = State.WAITING_INPUT if task.pending_question is not None else State.RUNNING
    task.pending_outcome = None
    task.failure = None
    task.updated_at = now
    return True


def host_lost_outcome(task: Task, attempt: Attempt | None) -> PendingOutcome:
    """Where a HOST_LOST task goes once its own host proved the worker gone: the worker's
    recorded exit when it ended by itself (and no stop was asked for), else what was kept."""
    if task.cancellation is None and attempt is not None and attempt.state == "ended":
        returncode = (
            attempt.exit_code
            if attempt.exit_code is not None
            else (-attempt.signal if attempt.signal is not None else None)
        )
        if returncode is not None and attempt.outcome in ("exited", "killed"):
            state, failure = describe_exit(returncode)
            return PendingOutcome(state=state, failure=failure, result=exit_result(state, task.result))
    return task.pending_outcome or interrupted_outcome()


def release_when_requeued(before: Task, after: Task) -> None:
    """A task queued again after a proven stop (or a resume) may run on any host: no owner."""
    if after.state == State.QUEUED and before.state != State.QUEUED:
        after.owner_host = None


def interrupted_outcome() -> PendingOutcome:
    """A task an earlier incarnation left running is re-queued once its worker is proven gone."""
    failure = Failure(code=FailureCode.GATEWAY_SHUTDOWN, message="the scheduler restarted", retryable=True)
    return PendingOutcome(state=State.QUEUED, failure=failure)


def recovery_outcome(task: Task) -> PendingOutcome:
    """What start-up recovery settles a left-over task to: a cancel in flight still cancels."""
    if task.cancellation is not None and task.cancellation.cause == PAUSE_CAUSE:
        return PendingOutcome(state=State.PAUSED)  # a pause in flight still pauses
    if task.state == State.CANCEL_REQUESTED or task.cancellation:
        return PendingOutcome(state=State.CANCELLED)
    return interrupted_outcome()


def start_recovering(task: Task, now: int) -> Task:
    task.state = State.RECOVERING
    task.updated_at = now
    return task


def validate_cause(cause: str) -> str:
    cause = cause or USER_CANCELED
    if not ID_PATTERN.match(cause):
        raise InvalidArgument("INVALID_CAUSE", "cause must be a short identifier", field="cause")
    return cause


def cancel_is_noop(task: Task) -> bool:
    """A finished task, or one whose stop is already under way, is returned unchanged."""
    return task.terminal or task.state in (State.CANCEL_REQUESTED, State.NEEDS_RECONCILIATION)


def record_cancel_while_recovering(task: Task, cancellation: Cancellation, now: int) -> Task | None:
    """Recovery owns a ``recovering`` task until its old worker is proven gone: the cancel (or
    pause) is recorded now and honoured when recovery settles it (``settle``)."""
    if task.state != State.RECOVERING or task.cancellation is not None:
        return None
    task.cancellation = cancellation
    task.updated_at = now
    return task


def cancel_at_once(task: Task, cancellation: Cancellation, now: int) -> Task:
    """Nothing runs (queued, never launched): nothing to prove, the task is cancelled."""
    task.cancellation = cancellation
    return end_task(task, State.CANCELLED, now)


def request_cancel(task: Task, cancellation: Cancellation, now: int) -> Task:
    task.state = State.CANCEL_REQUESTED
    task.cancellation = cancellation
    task.updated_at = now
    return task


PAUSE_CAUSE = "paused"


def stop_elsewhere(task: Task, cancellation: Cancellation, pause_it: bool, launch_begun: bool, now: int) -> bool:
    """A cancel or pause of a task another host owns (its worker is that host's to stop).

    Nothing can run yet (queued, its owner has not begun a launch): done at once. A task
    being recovered keeps the request for its recovery. Otherwise the request is the task's
    ``cancel_requested`` state with the cause, for the owner to apply with proof. False
    when there is nothing to do."""
    if cancel_is_noop(task) or (pause_it and pause_is_noop(task)):
        return False
    if task.state == State.RECOVERING:
        return record_cancel_while_recovering(task, cancellation, now) is not None
    if task.state == State.QUEUED and not launch_begun:
        if pause_it:
            pause(task, now)
        else:
            cancel_at_once(task, cancellation, now)
        return True
    request_cancel(task, cancellation, now)
    return True


def requested_stop(task: Task) -> str:
    """The stop a ``cancel_requested`` task asks its owner for: ``pause`` or ``cancel``."""
    return "pause" if task.cancellation is not None and task.cancellation.cause == PAUSE_CAUSE else "cancel"


def pause(task: Task, now: int) -> Task:
    """The worker is proven stopped: keep the question (and, in the registry, the pending
    snapshot); the next launch resumes (TASKGATE_RESUME=1, the last progress). A pause is
    asked for by a person, so it uses none of the revision's automatic resumes."""
    previous = task.restart_resume
    last_progress = task.progress.text if task.progress else (previous.last_progress if previous else None)
    task.state = State.PAUSED
    task.updated_at = now
    task.inspection = None
    task.pending_outcome = None
    task.restart_resume = RestartResume(
        count=previous.count if previous else 0,
        revision=previous.revision if previous else 1,
        pending=True,
        last_progress=last_progress,
    )
    return task


def pause_is_noop(task: Task) -> bool:
    """Finished, already paused, or a stop already under way: returned unchanged."""
    return cancel_is_noop(task) or task.state == State.PAUSED


def resume(task: Task, now: int) -> Task | None:
    """Re-queue a paused task (anything else is left as it is)."""
    if task.state != State.PAUSED:
        return None
    task.state = State.QUEUED
    task.cancellation = None
    task.updated_at = now
    return new_revision(task, now)  # a resume after a pause is new input: a new revision


# --- worker reports and questions ------------------------------------------


def accepts_reports(task: Task) -> bool:
    """Reports are taken while the task runs (a worker is released only once its `running` has
    committed, so none can report before)."""
    return task.state in (State.RUNNING, State.WAITING_INPUT)


def check_reporting(task: Task) -> None:
    if not accepts_reports(task):
        raise InvalidTransition("TASK_NOT_RUNNING", f"the task is {task.state}; report ignored")


def clamp_progress(text: str) -> str:
    return clamp_utf8(text, MAX_PROGRESS_CHARS * 4)[:MAX_PROGRESS_CHARS]


def apply_progress(task: Task, text: str, now: int) -> None:
    task.progress = Progress(text=text, updated_at=now)
    task.last_activity_at = now
    task.inspection = None


def validate_tool(name: str, status: str) -> None:
    if not name or len(name) > MAX_TOOL_NAME_CHARS:
        raise InvalidArgument("INVALID_TOOL", "tool name must be 1-200 characters", field="name")
    if status not in ("returned", "error"):
        raise InvalidArgument("INVALID_TOOL_STATUS", "status must be returned or error", field="status")


def apply_tool(task: Task, event: ToolEvent, keep: int) -> None:
    task.last_tool = event
    task.recent_tools = [*task.recent_tools, event][-keep:]
    task.tool_counts[event.name] = task.tool_counts.get(event.name, 0) + 1
    task.last_activity_at = event.at
    task.updated_at = event.at  # persisted tool activity counts as an update
    task.inspection = None


def validate_paths(paths: list[str]) -> None:
    for path in paths:
        if not path or len(path) > MAX_PATH_CHARS or "\x00" in path:
            raise InvalidArgument("INVALID_PATH", "paths must be 1-4096 characters", field="paths")


def apply_touched(task: Task, paths: list[str], keep: int) -> None:
    merged = list(dict.fromkeys([*task.observed_paths, *paths]))
    task.observed_paths = merged[-keep:]


def touched_at(task: Task, now: int) -> None:
    """Touched paths are persisted tool activity: updatedAt moves with them."""
    task.last_activity_at = now
    task.updated_at = now


def merge_usage(stored: Usage | None, reported: Usage, delta: bool) -> Usage:
    """Counters are the attempt's totals as reported (replacing the stored ones), or, when the
    worker says they are deltas, added to the stored ones. Only counters ever reported appear."""
    if not delta or stored is None:
        return reported
    summed = Usage()
    for name in ("input_tokens", "cached_input_tokens", "output_tokens"):
        old, new = getattr(stored, name), getattr(reported, name)
        setattr(summed, name, None if old is None and new is None else (old or 0) + (new or 0))
    return summed


def validate_usage(usage: Usage) -> None:
    for value in (usage.input_tokens, usage.cached_input_tokens, usage.output_tokens):
        if value is not None and value < 0:
            raise InvalidArgument("INVALID_USAGE", "token counters must be 0 or more", field="usage")


def validate_result(text: str) -> None:
    if len(text.encode()) > MAX_RESULT_BYTES:
        raise InvalidArgument("FIELD_TOO_LONG", "result exceeds 256 KiB", field="text")


def apply_result(task: Task, text: str, unresolved_background: bool, now: int) -> None:
    task.result = Result(text=text, unresolved_background=unresolved_background)
    task.result_reported_at = now
    task.last_activity_at = now


def validate_question(text: str) -> None:
    if not text.strip() or len(text.encode()) > MAX_QUESTION_BYTES:
        raise InvalidArgument("INVALID_QUESTION", "a question is 1 byte to 64 KiB of text", field="text")


def check_can_ask(task: Task) -> None:
    if task.state not in (State.RUNNING, State.WAITING_INPUT):
        raise InvalidTransition("TASK_NOT_RUNNING", f"the task is {task.state}; question refused")


def wait_for_input(task: Task, question: PendingQuestion, now: int) -> Task:
    check_can_ask(task)
    task.state = State.WAITING_INPUT
    task.pending_question = question
    task.inspection = None
    task.last_activity_at = now
    task.updated_at = now
    return task


def check_current_question(task: Task, question_id: str) -> None:
    if task.pending_question is None or task.pending_question.question_id != question_id:
        raise WorkerDenied("QUESTION_STALE", "this is not the task's current question")


def answer_delivered(task: Task, question_id: str, now: int) -> bool:
    """The worker has its answer: the question is done and a waiting task runs again."""
    if task.pending_question is None or task.pending_question.question_id != question_id:
        return False
    task.pending_question = None
    task.last_activity_at = now
    task.updated_at = now
    if task.state == State.WAITING_INPUT:
        task.state = State.RUNNING
    new_revision(task, now)  # an answer is new input: a new revision
    return True


# --- task trees ----------------------------------------------------------------


@dataclass(frozen=True)
class TreeEvidence:
    """What a task tree did: skills invoked, sub-tasks and their models, tools, paths."""

    skills: list[str]
    subagents: list[str]
    subagent_models: list[str]
    tool_counts: dict[str, int]
    observed_paths: list[str]


@dataclass(frozen=True)
class TreeView:
    """A task's direct sub-tasks and its tree's evidence (None when the tree did neither)."""

    children: list[Task]
    evidence: TreeEvidence | None


def tree_evidence(root: Task, descendants: list[Task], max_paths: int = 200) -> TreeEvidence | None:
    everyone = [root, *descendants]
    skills = list(dict.fromkeys(t.skill.name for t in everyone if t.skill is not None))
    if not descendants and not skills:
        return None
    tools: dict[str, int] = {}
    for t in everyone:
        for name, count in t.tool_counts.items():
            tools[name] = tools.get(name, 0) + count
    paths = list(dict.fromkeys(p for t in everyone for p in t.observed_paths))[:max_paths]
    models = list(dict.fromkeys(t.harness_model for t in descendants if t.harness_model))
    return TreeEvidence(
        skills=skills,
        subagents=[t.task_id for t in descendants],
        subagent_models=models,
        tool_counts=dict(sorted(tools.items())),
        observed_paths=paths,
    )


def check_spawn(parent: Task, children_so_far: int, settings: TaskSettings) -> None:
    """A worker's sub-task is bounded in depth and fan-out (INVALID_ARGUMENT beyond)."""
    if parent.depth + 1 > settings.max_subtask_depth:
        raise InvalidArgument(
            "SUBTASK_DEPTH_EXCEEDED",
            f"sub-tasks nest at most {settings.max_subtask_depth} levels deep",
            limit=str(settings.max_subtask_depth),
        )
    if children_so_far >= settings.max_subtasks_per_task:
        raise InvalidArgument(
            "SUBTASK_FANOUT_EXCEEDED",
            f"a task starts at most {settings.max_subtasks_per_task} sub-tasks",
            limit=str(settings.max_subtasks_per_task),
        )


# --- gateway-managed tasks --------------------------------------------------------

MAX_TARGET_OPTIONS = 32
MAX_OUTCOME_TEXT_BYTES = MAX_RESULT_BYTES


def validate_target_request(req: NewTask) -> GatewayTarget:
    """A gateway-managed create names a target and an external session, and nothing of a worker."""
    target = req.target
    assert target is not None
    if req.profile or req.skill_name or req.continue_task_id or req.harness or req.harness_model:
        raise InvalidArgument(
            "TARGET_EXCLUSIVE",
            "a gateway-managed task names a target instead of a profile, skill, continuation or harness",
            field="target",
        )
    validate_id("target.nativeSessionId", target.native_session_id)
    if target.display_name is not None and len(target.display_name) > MAX_TITLE_CHARS:
        raise InvalidArgument("FIELD_TOO_LONG", "target.displayName is longer than 200 characters")
    if len(target.options) > MAX_TARGET_OPTIONS or any(
        not k or len(k) > 100 or len(v) > 1000 for k, v in target.options.items()
    ):
        raise InvalidArgument(
            "INVALID_TARGET_OPTIONS", "target.options: at most 32 entries, names 1-100 and values up to 1000 characters"
        )
    return target


def dispatched(task: Task, now: int) -> Task:
    """The request was committed as sent (before the POST: a crash after it is an unknown outcome)."""
    start_running(task, now, now, None, None)
    if task.gateway_dispatch is not None:
        task.gateway_dispatch.submitted_at = now
    return task


def dispatch_outcome_unknown(detail: str) -> Failure:
    return Failure(
        code=FailureCode.DISPATCH_OUTCOME_UNKNOWN,
        message=f"the request may have reached the target, but its outcome is unknown: {detail}",
        retryable=False,
    )


def dispatch_failed(detail: str, retryable: bool) -> Failure:
    return Failure(code=FailureCode.DISPATCH_FAILED, message=detail, retryable=retryable)


def outcome_overdue(task: Task, timeout_ms: int, now: int) -> bool:
    """A dispatched request has waited ``timeout_ms`` for its outcome since it was sent or since
    the target last got an answer to its question. Waiting for a person is never overdue."""
    if not task.gateway_managed or task.state != State.RUNNING:
        return False
    sent = task.gateway_dispatch.submitted_at if task.gateway_dispatch else None
    return sent is not None and now - max(sent, task.updated_at) >= timeout_ms


# --- lost hosts: the operator's way out ---------------------------------------------

# A cancellation's cleanup when its worker was never proven stopped: the operator confirmed
# its host gone for good (not "confirmed", which is a proof this scheduler made).
HOST_GONE_CLEANUP = "host_gone"
MAX_HOSTS_PAGE = 500


class HostLive(errors.FailedPrecondition):
    pass


class HostNotFound(errors.NotFound):
    pass


@dataclass(frozen=True)
class HostSummary:
    """A scheduler host as the operator sees it: its lease row (absent once a sweep forgot it)
    and the unfinished tasks that still name it as owner."""

    host_id: str
    boot_id: str | None = None
    started_at: int | None = None
    lease_expires_at: int | None = None
    # A live process holds the host id (PostgreSQL: the listener's advisory lock).
    connected: bool = False
    queued: int = 0
    active: int = 0
    needs_reconciliation: int = 0
    host_lost: int = 0
    # Of the needs_reconciliation ones, those `hosts resolve --host-is-gone` settles
    # (RESOLVED_BY_HOST_GONE: HOST_LOST or CLEANUP_UNCONFIRMED).
    resolvable: int = 0

    def lease_live(self, now: int) -> bool:
        return self.lease_expires_at is not None and self.lease_expires_at >= now


def validate_host_id(host_id: str) -> None:
    if not host_id or len(host_id) > 128 or any(c.isspace() or not c.isprintable() for c in host_id):
        raise InvalidArgument("INVALID_HOST_ID", "host_id must be 1-128 printable characters without spaces")


def check_resolvable(
    host_id: str, own_host_id: str, summary: HostSummary | None, now: int, multi_host: bool = True
) -> None:
    """Refuse resolving a host that is this replica, that is live, or that nothing knows of.

    A live host (its lease renewed, or a process holding its id) reconciles its own tasks, with
    proof; the operator's word is only for a host that will not come back. On SQLite there is
    one replica and every task is its own (whatever host id it recorded): nothing to resolve.
    """
    validate_host_id(host_id)
    if not multi_host:
        raise errors.FailedPrecondition(
            "SINGLE_HOST",
            "this scheduler runs alone on SQLite and looks after every task itself; lost hosts exist only"
            " with several replicas on PostgreSQL",
        )
    if host_id == own_host_id:
        raise InvalidArgument(
            "OWN_HOST", f"host {host_id} is the scheduler serving this call; it reconciles its own tasks"
        )
    if summary is None:
        raise HostNotFound(
            "HOST_NOT_FOUND",
            f"no scheduler host {host_id} is known and no unfinished task names it"
            " (a mistyped id, or already resolved)",
            host_id=host_id,
        )
    if summary.lease_live(now) or summary.connected:
        raise HostLive(
            "HOST_LIVE",
            f"scheduler host {host_id} is live ("
            + ("its lease is renewed" if summary.lease_live(now) else "a process holds its host id")
            + "); it reconciles its own tasks",
            host_id=host_id,
        )


def host_gone_note(host_id: str) -> str:
    return f"the operator confirmed scheduler host {host_id} gone; its worker was never proven stopped"


# What the operator's word settles: a task parked for want of proof that only its host could give.
RESOLVED_BY_HOST_GONE = frozenset({FailureCode.HOST_LOST, FailureCode.CLEANUP_UNCONFIRMED})


def resolve_host_gone(task: Task, host_id: str, now: int) -> bool:
    """The operator confirmed the task's lost host gone for good (its workers with it): a task
    that waits there for proof — HOST_LOST, or CLEANUP_UNCONFIRMED (survivors of a stop that only
    that host can look for) — gets the outcome its own host would have given it (kept in
    ``pending_outcome``), recorded as the operator's word rather than a proven stop."""
    if (
        task.owner_host != host_id
        or task.state != State.NEEDS_RECONCILIATION
        or task.failure is None
        or task.failure.code not in RESOLVED_BY_HOST_GONE
    ):
        return False
    note = host_gone_note(host_id)
    outcome = task.pending_outcome or interrupted_outcome()
    if outcome.state == State.QUEUED:
        outcome = PendingOutcome(
            state=State.QUEUED, failure=Failure(code=FailureCode.HOST_LOST, message=note, retryable=True)
        )
    settle(task, outcome, now)
    if task.state == State.QUEUED:
        # resume_after_interruption wrote its generic code; the reader should see why.
        task.failure = Failure(code=FailureCode.HOST_LOST, message=note, retryable=True)
    elif task.failure is not None and note not in task.failure.message:
        task.failure = task.failure.model_copy(update={"message": f"{task.failure.message} ({note})"})
    if task.cancellation is not None:
        task.cancellation.cleanup = HOST_GONE_CLEANUP
    return True


def end_attempt_on_gone_host(attempt: Attempt, host_id: str, now: int) -> bool:
    """An attempt the gone host never ended: ended now, on the operator's word (a returning
    host's recovery then has nothing of it left to look for)."""
    if attempt.host_id != host_id or attempt.state == "ended":
        return False
    attempt.state = "ended"
    attempt.outcome = attempt.outcome or HOST_GONE_CLEANUP
    attempt.ended_at = attempt.ended_at or now
    return True


def page_hosts(hosts: list[HostSummary], page_size: int, page_token: str) -> tuple[list[HostSummary], str]:
    """Hosts ordered by id, after ``page_token`` (the last id of the previous page)."""
    if page_size < 0:
        raise InvalidArgument("INVALID_PAGE_SIZE", "page_size must not be negative")
    size = min(page_size or 100, MAX_HOSTS_PAGE)
    rest = sorted((h for h in hosts if h.host_id > page_token), key=lambda h: h.host_id)
    page = rest[:size]
    return page, page[-1].host_id if len(rest) > size else ""
