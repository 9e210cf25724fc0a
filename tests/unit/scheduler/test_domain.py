"""Task rules without processes, gRPC or a database; times are plain numbers (the injected clock)."""

from __future__ import annotations

import pytest

from libs.settings import TaskSettings
from services.scheduler import domain
from services.scheduler.domain import (
    Attempt,
    Cancellation,
    Failure,
    NewTask,
    PageRequest,
    PendingOutcome,
    Progress,
    Result,
    State,
    Task,
    Verdict,
)

T0 = 1_000_000


def make_task(state: State = State.RUNNING, **kw: object) -> Task:
    base: dict[str, object] = dict(
        task_id="a" * 32,
        agent_id="agent",
        session_id="s",
        title="t",
        instructions="",
        profile="p",
        state=state,
        created_at=T0,
        updated_at=T0,
        first_started_at=T0,
        started_at=T0,
    )
    base.update(kw)
    return Task(**base)  # type: ignore[arg-type]


def make_attempt(**kw: object) -> Attempt:
    base: dict[str, object] = dict(
        attempt_id="b" * 32, task_id="a" * 32, number=1, boot_id="x", token_hash="h", started_at=T0
    )
    base.update(kw)
    return Attempt(**base)  # type: ignore[arg-type]


SETTINGS = TaskSettings(
    idle_timeout_ms=1000,
    progress_stale_limit_ms=5000,
    max_duration_ms=20000,
    background_grace_ms=3000,
    first_report_timeout_ms=2000,
)


@pytest.mark.parametrize("terminal", sorted(domain.TERMINAL))
@pytest.mark.parametrize("target", list(State))
def test_a_terminal_task_never_changes_state(terminal: State, target: State) -> None:
    with pytest.raises(domain.InvalidTransition):
        domain.check_transition(terminal, target)


def test_the_lifecycle_transitions_are_allowed() -> None:
    for a, b in [
        (State.QUEUED, State.RUNNING),
        (State.RUNNING, State.WAITING_INPUT),
        (State.WAITING_INPUT, State.RUNNING),
        (State.RUNNING, State.COMPLETED),
        (State.RUNNING, State.CANCEL_REQUESTED),
        (State.CANCEL_REQUESTED, State.CANCELLED),
        (State.CANCEL_REQUESTED, State.NEEDS_RECONCILIATION),
        (State.NEEDS_RECONCILIATION, State.CANCELLED),
        (State.RUNNING, State.RECOVERING),
        (State.RECOVERING, State.QUEUED),
    ]:
        domain.check_transition(a, b)
    with pytest.raises(domain.InvalidTransition):
        domain.check_transition(State.QUEUED, State.COMPLETED)


def new(**kw: object) -> NewTask:
    base: dict[str, object] = dict(
        agent_id="agent-1",
        session_id="cli-1",
        title="hello",
        instructions="x",
        profile="",
        request_id=None,
        harness=None,
        harness_model=None,
    )
    base.update(kw)
    return NewTask(**base)  # type: ignore[arg-type]


def test_new_task_defaults_the_profile_and_trims_the_title() -> None:
    req = domain.validate_new_task(new(title="  hi  "), {"default-worker"})
    assert req.profile == "default-worker" and req.title == "hi"


def test_new_task_empty_optional_fields_become_none_and_a_normal_one_stays_as_it_is() -> None:
    req = domain.validate_new_task(new(profile="default-worker", harness="", harness_model=""), {"default-worker"})
    assert (req.harness, req.harness_model) == (None, None)
    normal = new(profile="default-worker", request_id="r-1", harness="codex", harness_model="m")
    assert domain.validate_new_task(normal, {"default-worker"}) == normal
    assert domain.validate_new_task(new(title=" hi"), {"default-worker"}) == new(title="hi", profile="default-worker")


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"title": "   "}, "EMPTY_TITLE"),
        ({"title": "x" * 201}, "FIELD_TOO_LONG"),
        ({"instructions": "é" * 40000}, "FIELD_TOO_LONG"),
        ({"profile": "nope"}, "UNKNOWN_PROFILE"),
        ({"agent_id": "../etc"}, "INVALID_ID"),
        ({"session_id": ""}, "INVALID_ID"),
        ({"session_id": "s" * 129}, "INVALID_ID"),
        ({"request_id": "has space"}, "INVALID_ID"),
    ],
)
def test_bad_new_tasks_are_rejected_with_a_reason(change: dict[str, object], reason: str) -> None:
    with pytest.raises(domain.InvalidArgument) as err:
        domain.validate_new_task(new(**change), {"default-worker"})
    assert err.value.reason == reason


def test_pagination_validates_and_clamps_to_the_last_page() -> None:
    assert domain.clamp_page(PageRequest(0, 10), 0) == (0, 1)
    assert domain.clamp_page(PageRequest(7, 10), 25) == (2, 3)
    assert domain.clamp_page(PageRequest(1, 10), 25) == (1, 3)
    for page, size in [(-1, 10), (0, 101), (0, -3)]:
        with pytest.raises(domain.InvalidArgument):
            domain.validate_page(page, size)
    assert domain.validate_page(0, 0).page_size == 10


def test_clamp_utf8_never_splits_a_character() -> None:
    assert domain.clamp_utf8("aé", 2) == "a"
    assert domain.clamp_utf8("aé", 3) == "aé"
    assert domain.clamp_utf8("日本", 5) == "日"


def test_quiet_worker_is_inspected_not_stopped() -> None:
    task, attempt = make_task(), make_attempt()
    assert domain.supervise(task, attempt, SETTINGS, T0 + 999, False).verdict == Verdict.NONE
    assert domain.supervise(task, attempt, SETTINGS, T0 + 1000, False).verdict == Verdict.INSPECT
    task.inspection = domain.Inspection(reason="idle", since=T0 + 1000)
    assert domain.supervise(task, attempt, SETTINGS, T0 + 1500, False).verdict == Verdict.NONE


def test_activity_moves_the_idle_clock_but_not_the_progress_clock() -> None:
    task, attempt = make_task(), make_attempt()
    task.last_activity_at = T0 + 4500  # CPU/IO or a tool: activity, not progress
    assert domain.supervise(task, attempt, SETTINGS, T0 + 4900, False).verdict == Verdict.NONE
    assert domain.supervise(task, attempt, SETTINGS, T0 + 5000, False).verdict == Verdict.STOP_STALLED


def test_progress_resets_the_stale_timer_and_zero_disables_it() -> None:
    task, attempt = make_task(), make_attempt()
    task.progress = Progress(text="p", updated_at=T0 + 4000)
    task.inspection = domain.Inspection(reason="idle", since=T0)
    assert domain.supervise(task, attempt, SETTINGS, T0 + 8999, False).verdict == Verdict.NONE
    assert domain.supervise(task, attempt, SETTINGS, T0 + 9000, False).verdict == Verdict.STOP_STALLED
    no_stale = SETTINGS.model_copy(update={"progress_stale_limit_ms": 0})
    assert domain.supervise(task, attempt, no_stale, T0 + 19000, False).verdict == Verdict.NONE


def test_max_duration_is_a_hard_deadline_even_while_waiting_for_an_answer() -> None:
    task = make_task(State.WAITING_INPUT)
    assert domain.supervise(task, make_attempt(), SETTINGS, T0 + 19999, False).verdict == Verdict.NONE
    assert domain.supervise(task, make_attempt(), SETTINGS, T0 + 20000, False).verdict == Verdict.STOP_MAX_DURATION
    unlimited = SETTINGS.model_copy(update={"max_duration_ms": 0, "progress_stale_limit_ms": 0})
    assert domain.supervise(make_task(), make_attempt(), unlimited, T0 + 10**9, False).verdict == Verdict.INSPECT


def test_waiting_for_an_answer_is_never_a_stall() -> None:
    task = make_task(State.WAITING_INPUT)
    assert domain.supervise(task, make_attempt(), SETTINGS, T0 + 19000, False).verdict == Verdict.NONE


def test_background_result_is_accepted_after_the_grace() -> None:
    task = make_task(result=Result(text="r", unresolved_background=True), result_reported_at=T0 + 100)
    assert domain.supervise(task, make_attempt(), SETTINGS, T0 + 3099, False).verdict == Verdict.NONE
    assert domain.supervise(task, make_attempt(), SETTINGS, T0 + 3100, False).verdict == Verdict.ACCEPT_BACKGROUND


def test_an_sdk_worker_must_make_first_contact() -> None:
    task, attempt = make_task(), make_attempt()
    assert domain.supervise(task, attempt, SETTINGS, T0 + 2000, True).verdict == Verdict.STOP_NO_FIRST_REPORT
    assert domain.supervise(task, attempt, SETTINGS, T0 + 2000, False).verdict == Verdict.INSPECT
    attempt.first_contact_at = T0 + 10
    assert domain.supervise(task, attempt, SETTINGS, T0 + 2000, True).verdict == Verdict.INSPECT


def test_exit_mapping() -> None:
    assert domain.describe_exit(0) == (State.COMPLETED, None)
    state, failure = domain.describe_exit(3)
    assert state == State.FAILED and failure and failure.code == "WORKER_EXITED" and failure.exit_code == 3
    state, failure = domain.describe_exit(-9)
    assert failure and failure.code == "WORKER_KILLED" and "SIGKILL" in failure.message


def test_three_automatic_resumes_per_revision_then_failed() -> None:
    task = make_task(progress=Progress(text="halfway", updated_at=T0))
    for expected in (1, 2, 3):
        task = domain.resume_after_interruption(task, T0, "restart")
        assert task.state == State.QUEUED and task.restart_resume and task.restart_resume.count == expected
        assert task.restart_resume.last_progress == "halfway" and task.failure
        assert task.failure.code == "GATEWAY_SHUTDOWN"
        task.state = State.RUNNING
    task = domain.resume_after_interruption(task, T0, "restart")
    assert task.state == State.FAILED and task.failure and task.failure.code == "GATEWAY_SHUTDOWN_REPEATED"


def test_the_resume_cap_counts_per_revision() -> None:
    task = make_task()
    for _ in range(3):
        task = domain.resume_after_interruption(task, T0 + 5, "restart")
        assert task.state == State.QUEUED and task.updated_at == T0 + 5, "a re-queue updates updatedAt"
        task.state = State.RUNNING
    # An answer (new input) starts revision 2 with three resumes of its own.
    task = domain.new_revision(task, T0 + 6)
    assert task.restart_resume and (task.restart_resume.count, task.restart_resume.revision) == (0, 2)
    for expected in (1, 2, 3):
        task = domain.resume_after_interruption(task, T0 + 7, "restart")
        assert task.restart_resume is not None
        assert task.state == State.QUEUED and task.restart_resume.count == expected
        assert task.restart_resume.revision == 2
        task.state = State.RUNNING
    task = domain.resume_after_interruption(task, T0 + 8, "restart")
    assert task.state == State.FAILED and task.failure and task.failure.code == "GATEWAY_SHUTDOWN_REPEATED"
    assert "revision 2" in task.failure.message and task.updated_at == task.ended_at == T0 + 8


def test_a_cancel_recorded_while_recovering_wins_over_the_requeue() -> None:
    requeue = PendingOutcome(state=State.QUEUED, failure=Failure(code="GATEWAY_SHUTDOWN", message="restart"))
    task = make_task(State.RECOVERING, cancellation=Cancellation(requested_at=T0, cause="user_canceled"))
    assert domain.settle(task, requeue, T0 + 1)
    assert task.state == State.CANCELLED and task.restart_resume is None
    paused = make_task(State.RECOVERING, cancellation=Cancellation(requested_at=T0, cause=domain.PAUSE_CAUSE))
    assert domain.settle(paused, requeue, T0 + 1) and paused.state == State.PAUSED, "a pause in flight still pauses"
    plain = make_task(State.RECOVERING)
    assert domain.settle(plain, requeue, T0 + 1) and plain.state == State.QUEUED
    assert not domain.settle(make_task(State.COMPLETED), requeue, T0 + 1)


def test_a_result_reported_before_the_crash_settles_the_task() -> None:
    attempt = Attempt(attempt_id="b" * 32, task_id="a" * 32, number=1, boot_id="x", token_hash="h", started_at=T0)
    done = make_task(result=Result(text="r"), result_reported_at=T0 + 10)
    assert domain.finished_before_crash(done, attempt, tree_gone=True)
    assert not domain.finished_before_crash(done, attempt, tree_gone=False), "still running: stop and resume"
    earlier = make_task(result=Result(text="r"), result_reported_at=T0 - 10)
    assert not domain.finished_before_crash(earlier, attempt, tree_gone=True), "an earlier attempt's result"
    assert not domain.finished_before_crash(make_task(), attempt, tree_gone=True)


def test_elapsed_counts_from_first_start_and_freezes_at_the_end() -> None:
    task = make_task(first_started_at=T0, started_at=T0 + 500)
    assert task.elapsed_ms(T0 + 2000) == 2000
    task.ended_at = T0 + 3000
    assert task.elapsed_ms(T0 + 99999) == 3000
    assert make_task(first_started_at=None).elapsed_ms(T0) == 0


def test_observations_move_activity_and_clear_inspection_but_never_progress() -> None:
    task = make_task(inspection=domain.Inspection(reason="idle", since=T0 + 100))
    quiet = domain.Execution(available=True, observed_at=T0 + 200, last_activity_at=T0 + 50, cpu_user_ticks=3)
    assert domain.apply_observation(task, quiet)
    assert task.execution == quiet and task.last_activity_at == T0 + 50 and task.inspection is not None
    busy = domain.Execution(available=True, observed_at=T0 + 400, last_activity_at=T0 + 400, cpu_user_ticks=9)
    assert domain.apply_observation(task, busy)
    assert task.last_activity_at == T0 + 400 and task.inspection is None and task.progress is None
    finished = make_task(State.COMPLETED)
    assert not domain.apply_observation(finished, busy) and finished.execution is None


def test_ending_a_task_freezes_it_and_a_cancel_is_always_confirmed() -> None:
    task = make_task(
        inspection=domain.Inspection(reason="idle", since=T0),
        cancellation=domain.Cancellation(requested_at=T0, cause="user_canceled", cleanup="unconfirmed"),
        failure=domain.Failure(code="CLEANUP_UNCONFIRMED", message="x"),
    )
    ended = domain.end_task(task, State.CANCELLED, T0 + 500)
    assert ended.ended_at == T0 + 500 and ended.elapsed_ms(T0 + 9999) == 500
    assert ended.inspection is None and ended.failure is None
    assert ended.cancellation is not None and ended.cancellation.cleanup == "confirmed"
    with pytest.raises(ValueError):
        domain.end_task(make_task(), State.RUNNING, T0)
