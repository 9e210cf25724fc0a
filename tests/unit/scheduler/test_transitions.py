"""The transition rules the engine's collaborators apply, without processes, gRPC or a database.

Time comes from an injected clock that the test moves by hand.
"""

from __future__ import annotations

import pytest

from services.scheduler import domain
from services.scheduler.domain import (
    Cancellation,
    Failure,
    FailureCode,
    Inspection,
    PendingOutcome,
    PendingQuestion,
    Progress,
    RestartResume,
    Result,
    State,
    ToolEvent,
    Usage,
    Verdict,
)
from tests.unit.scheduler.test_domain import T0, make_task


class FakeClock:
    def __init__(self, now: int = T0) -> None:
        self.now = now

    def now_ms(self) -> int:
        return self.now

    def advance(self, ms: int) -> int:
        self.now += ms
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def test_start_running_stamps_the_first_start_once_and_clears_a_resume(clock: FakeClock) -> None:
    task = make_task(
        State.QUEUED,
        first_started_at=None,
        started_at=None,
        inspection=Inspection(reason="idle", since=T0),
        failure=Failure(code=FailureCode.GATEWAY_SHUTDOWN, message="restarted", retryable=True),
        restart_resume=RestartResume(count=1, revision=1, pending=True),
    )
    first = clock.advance(10)
    domain.start_running(task, first, first, "h", "m")
    assert task.state == State.RUNNING and task.first_started_at == first and task.started_at == first
    assert task.inspection is None and task.failure is None
    assert task.restart_resume is not None and not task.restart_resume.pending
    assert (task.harness, task.harness_model) == ("h", "m")
    again = clock.advance(500)
    domain.start_running(task, again, again, None, None)
    assert task.first_started_at == first and task.started_at == again


def test_a_failure_stays_when_the_start_is_not_a_resume(clock: FakeClock) -> None:
    failure = Failure(code="X", message="kept")
    task = make_task(State.QUEUED, failure=failure)
    domain.start_running(task, clock.now_ms(), clock.now_ms(), None, None)
    assert task.failure == failure


def test_inspection_is_marked_once_and_only_on_running_work(clock: FakeClock) -> None:
    task = make_task(State.RUNNING)
    assert domain.mark_for_inspection(task, "idle", clock.advance(1000))
    assert task.inspection == Inspection(reason="idle", since=clock.now)
    assert not domain.mark_for_inspection(task, "idle again", clock.advance(1000))
    assert task.inspection.since == T0 + 1000
    assert not domain.mark_for_inspection(make_task(State.QUEUED), "idle", clock.now)
    assert domain.mark_for_inspection(make_task(State.WAITING_INPUT), "idle", clock.now)


def test_finish_ends_once_and_respects_only_from(clock: FakeClock) -> None:
    task = make_task(State.RUNNING)
    end = clock.advance(42)
    assert domain.finish(task, State.COMPLETED, end, result=Result(text="ok"))
    assert task.state == State.COMPLETED and task.ended_at == end and task.elapsed_ms(end + 999) == 42
    assert not domain.finish(task, State.FAILED, clock.advance(1))
    assert task.state == State.COMPLETED
    cancelling = make_task(State.CANCEL_REQUESTED)
    assert not domain.finish(cancelling, State.FAILED, clock.now, only_from=(State.RUNNING, State.WAITING_INPUT))
    assert cancelling.state == State.CANCEL_REQUESTED


def test_exit_result_carries_the_reported_text_only_on_completion() -> None:
    assert domain.exit_result(State.COMPLETED, Result(text="done", unresolved_background=True)) == Result(text="done")
    assert domain.exit_result(State.COMPLETED, None) == Result(text="")
    assert domain.exit_result(State.FAILED, Result(text="done")) is None


@pytest.mark.parametrize(
    ("why", "state", "code"),
    [
        ("cancel", State.CANCELLED, None),
        ("background", State.COMPLETED, None),
        ("shutdown", State.QUEUED, FailureCode.GATEWAY_SHUTDOWN),
        ("stalled", State.FAILED, FailureCode.PROGRESS_STALLED),
        ("max_duration", State.FAILED, FailureCode.MAX_DURATION_EXCEEDED),
        ("no_first_report", State.FAILED, FailureCode.FIRST_REPORT_TIMEOUT),
    ],
)
def test_stop_outcome_by_cause(why: str, state: State, code: str | None) -> None:
    task = make_task(result=Result(text="partial", unresolved_background=True))
    outcome = domain.stop_outcome(why, task, "because")
    assert outcome.state == state
    assert (outcome.failure.code if outcome.failure else None) == code
    if why == "background":
        assert outcome.result == Result(text="partial", unresolved_background=True)


def test_every_stopping_verdict_has_a_known_cause() -> None:
    task = make_task(result=Result(text="r"))
    for verdict, why in domain.STOP_REASONS.items():
        assert verdict not in (Verdict.NONE, Verdict.INSPECT)
        domain.stop_outcome(why, task, "m")  # no KeyError


def test_settle_requeues_as_a_resume_or_ends(clock: FakeClock) -> None:
    task = make_task(State.RECOVERING, progress=Progress(text="half way", updated_at=T0))
    assert domain.settle(task, domain.interrupted_outcome(), clock.advance(5))
    assert task.state == State.QUEUED and task.failure and task.failure.code == FailureCode.GATEWAY_SHUTDOWN
    assert task.restart_resume == RestartResume(count=1, revision=1, pending=True, last_progress="half way")
    cancelled = make_task(State.CANCEL_REQUESTED, cancellation=Cancellation(requested_at=T0, cause="x"))
    assert domain.settle(cancelled, PendingOutcome(state=State.CANCELLED), clock.advance(5))
    assert cancelled.cancellation is not None
    assert cancelled.state == State.CANCELLED and cancelled.cancellation.cleanup == "confirmed"
    assert not domain.settle(cancelled, domain.interrupted_outcome(), clock.advance(5))
    assert cancelled.state == State.CANCELLED


def test_the_fourth_interruption_of_a_revision_fails_the_task(clock: FakeClock) -> None:
    task = make_task(State.RECOVERING)
    for _ in range(domain.MAX_AUTOMATIC_RESUMES):
        assert domain.settle(task, domain.interrupted_outcome(), clock.advance(1))
        assert task.state == State.QUEUED
        task.state = State.RECOVERING
    assert domain.settle(task, domain.interrupted_outcome(), clock.advance(1))
    assert task.state == State.FAILED and task.failure and task.failure.code == FailureCode.GATEWAY_SHUTDOWN_REPEATED


def test_an_unconfirmed_stop_keeps_its_outcome_for_retry(clock: FakeClock) -> None:
    task = make_task(State.CANCEL_REQUESTED, cancellation=Cancellation(requested_at=T0, cause="user_canceled"))
    outcome = PendingOutcome(state=State.CANCELLED)
    assert domain.mark_unconfirmed(task, outcome, "pid 7 survives", clock.advance(3))
    assert task.state == State.NEEDS_RECONCILIATION and task.pending_outcome == outcome
    assert task.failure and task.failure.code == FailureCode.CLEANUP_UNCONFIRMED and task.failure.retryable
    assert task.cancellation is not None
    assert "pid 7 survives" in task.failure.message and task.cancellation.cleanup == "unconfirmed"
    # Proven later: the kept outcome happens and the marks are cleared.
    assert domain.settle(task, task.pending_outcome, clock.advance(3))
    assert task.state == State.CANCELLED and task.failure is None and task.pending_outcome is None
    assert not domain.mark_unconfirmed(task, outcome, "late", clock.now)


def test_recovery_outcome_keeps_a_cancel_in_flight() -> None:
    assert domain.recovery_outcome(make_task(State.CANCEL_REQUESTED)).state == State.CANCELLED
    cancelled_before = make_task(State.RECOVERING, cancellation=Cancellation(requested_at=T0, cause="x"))
    assert domain.recovery_outcome(cancelled_before).state == State.CANCELLED
    running = domain.recovery_outcome(make_task(State.RUNNING))
    assert running.state == State.QUEUED and running.failure and running.failure.retryable


def test_cancel_rules(clock: FakeClock) -> None:
    assert domain.validate_cause("") == domain.USER_CANCELED
    with pytest.raises(domain.InvalidArgument):
        domain.validate_cause("not a cause!")
    for state in (State.COMPLETED, State.CANCEL_REQUESTED, State.NEEDS_RECONCILIATION):
        assert domain.cancel_is_noop(make_task(state))
    # A cancel while recovering is recorded, and honoured when recovery settles the task.
    recovering = make_task(State.RECOVERING)
    assert not domain.cancel_is_noop(recovering)
    cancel = Cancellation(requested_at=T0, cause=domain.USER_CANCELED)
    assert domain.record_cancel_while_recovering(recovering, cancel, T0) is recovering
    assert recovering.cancellation == cancel and recovering.state == State.RECOVERING
    assert domain.record_cancel_while_recovering(recovering, cancel, T0) is None, "recorded once"
    assert not domain.cancel_is_noop(make_task(State.QUEUED))
    cancellation = Cancellation(requested_at=clock.now, cause="paused")
    queued = domain.cancel_at_once(make_task(State.QUEUED), cancellation, clock.advance(1))
    assert queued.cancellation is not None
    assert queued.state == State.CANCELLED and queued.cancellation.cleanup == "confirmed"
    running = domain.request_cancel(make_task(State.RUNNING), cancellation, clock.advance(1))
    assert running.state == State.CANCEL_REQUESTED and running.updated_at == clock.now


def test_only_a_user_cancel_or_a_real_ending_closes_the_question() -> None:
    def cancelled(cause: str) -> domain.Task:
        return make_task(State.CANCELLED, cancellation=Cancellation(requested_at=T0, cause=cause))

    running = make_task(State.RUNNING)
    assert domain.closes_questions(running, cancelled(domain.USER_CANCELED))
    assert not domain.closes_questions(running, cancelled("paused"))
    assert domain.closes_questions(running, make_task(State.FAILED))
    assert not domain.closes_questions(running, make_task(State.RUNNING))
    assert not domain.closes_questions(make_task(State.FAILED), make_task(State.FAILED)), "only the ending change"


def test_reports_are_taken_only_while_the_task_runs() -> None:
    assert domain.accepts_reports(make_task(State.RUNNING))
    assert domain.accepts_reports(make_task(State.WAITING_INPUT))
    assert not domain.accepts_reports(make_task(State.QUEUED)), "a launch still committing holds its worker"
    assert not domain.accepts_reports(make_task(State.CANCEL_REQUESTED))
    with pytest.raises(domain.InvalidTransition):
        domain.check_reporting(make_task(State.COMPLETED))


def test_report_rules(clock: FakeClock) -> None:
    task = make_task(inspection=Inspection(reason="idle", since=T0))
    domain.apply_progress(task, domain.clamp_progress("x" * 5000), clock.advance(1))
    assert task.progress and len(task.progress.text) == domain.MAX_PROGRESS_CHARS and task.inspection is None
    for i in range(4):
        domain.apply_tool(task, ToolEvent(name=f"t{i}", status="returned", at=clock.advance(1)), keep=3)
    assert [t.name for t in task.recent_tools] == ["t1", "t2", "t3"] and task.updated_at == clock.now
    domain.apply_touched(task, ["a", "b"], keep=3)
    domain.apply_touched(task, ["b", "c", "d"], keep=3)
    assert task.observed_paths == ["b", "c", "d"]
    domain.apply_result(task, "done", True, clock.advance(1))
    assert task.result == Result(text="done", unresolved_background=True) and task.result_reported_at == clock.now
    with pytest.raises(domain.InvalidArgument):
        domain.validate_tool("", "returned")
    with pytest.raises(domain.InvalidArgument):
        domain.validate_tool("sh", "maybe")
    with pytest.raises(domain.InvalidArgument):
        domain.validate_paths(["ok", "bad\x00"])
    with pytest.raises(domain.InvalidArgument):
        domain.validate_usage(Usage(output_tokens=-1))
    with pytest.raises(domain.InvalidArgument):
        domain.validate_result("x" * (domain.MAX_RESULT_BYTES + 1))
    with pytest.raises(domain.InvalidArgument):
        domain.validate_question("   ")


def test_a_question_waits_for_input_and_its_answer_resumes(clock: FakeClock) -> None:
    task = make_task(State.RUNNING)
    question = PendingQuestion(question_id="q1", text="which?", revision=1)
    domain.wait_for_input(task, question, clock.advance(1))
    assert task.state == State.WAITING_INPUT and task.pending_question == question
    with pytest.raises(domain.WorkerDenied):
        domain.check_current_question(task, "q0")
    domain.check_current_question(task, "q1")
    assert not domain.answer_delivered(task, "q0", clock.advance(1))
    assert domain.answer_delivered(task, "q1", clock.advance(1))
    assert task.state == State.RUNNING and task.pending_question is None and task.last_activity_at == clock.now
    with pytest.raises(domain.InvalidTransition):
        domain.wait_for_input(make_task(State.QUEUED), question, clock.now)
