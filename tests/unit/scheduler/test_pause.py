"""Pause and resume as pure rules: a proven pause keeps the question and the resume
information without using an automatic resume; only a paused task resumes."""

from __future__ import annotations

from services.scheduler import domain
from services.scheduler.domain import Cancellation, PendingQuestion, Progress, RestartResume, State
from tests.unit.scheduler.test_domain import T0, make_task


def test_a_proven_pause_keeps_the_question_and_sets_up_the_resume() -> None:
    question = PendingQuestion(question_id="c" * 32, text="Which DB?", revision=1)
    task = make_task(
        State.CANCEL_REQUESTED,
        pending_question=question,
        progress=Progress(text="half way", updated_at=T0),
        restart_resume=RestartResume(count=2, revision=1, pending=False, last_progress="old"),
        cancellation=Cancellation(requested_at=T0, cause=domain.PAUSE_CAUSE),
    )
    outcome = domain.stop_outcome("pause", task, "paused")
    assert domain.settle(task, outcome, T0 + 5)
    assert task.state == State.PAUSED and not task.terminal and task.ended_at is None
    assert task.pending_question == question
    assert task.restart_resume == RestartResume(count=2, revision=1, pending=True, last_progress="half way")
    domain.check_transition(State.CANCEL_REQUESTED, State.PAUSED)


def test_only_a_paused_task_resumes_and_loses_its_pause_record() -> None:
    task = domain.pause(make_task(State.QUEUED), T0)
    task.cancellation = Cancellation(requested_at=T0, cause=domain.PAUSE_CAUSE)
    assert domain.resume(task, T0 + 1) is task and task.state == State.QUEUED and task.cancellation is None
    assert domain.resume(make_task(State.RUNNING), T0) is None
    assert domain.pause_is_noop(domain.pause(make_task(State.QUEUED), T0))
    assert domain.pause_is_noop(make_task(State.COMPLETED, ended_at=T0))


def test_a_pause_in_flight_at_a_crash_still_pauses_and_a_paused_task_can_be_cancelled() -> None:
    task = make_task(State.RECOVERING, cancellation=Cancellation(requested_at=T0, cause=domain.PAUSE_CAUSE))
    assert domain.recovery_outcome(task).state == State.PAUSED
    domain.check_transition(State.PAUSED, State.CANCELLED)
    domain.check_transition(State.PAUSED, State.QUEUED)
    paused = make_task(State.PAUSED)
    assert domain.closes_questions(
        paused.model_copy(deep=True),
        domain.cancel_at_once(paused, Cancellation(requested_at=T0, cause="user_canceled"), T0),
    )
