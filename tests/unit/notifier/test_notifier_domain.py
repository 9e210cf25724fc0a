"""The notifier's pure rules: schedule, Retry-After, snapshots, unbacked promises, which events notify."""

from __future__ import annotations

import pytest

from services.notifier import domain
from services.notifier.domain import (
    Attempt,
    Backoff,
    FollowUp,
    Kind,
    Outcome,
    Response,
    ResponseFinal,
    SessionTask,
    TaskFact,
)

B = Backoff(initial_ms=5_000, max_ms=300_000)


def failed(at: int, retry_after_ms: int | None = None) -> Attempt:
    return Attempt(at=at, outcome=Outcome.FAILED, http_status=500, retry_after_ms=retry_after_ms)


def test_first_attempt_is_due_at_creation() -> None:
    assert domain.next_attempt_at(1_000, [], B) == 1_000


def test_backoff_doubles_from_5s_and_caps_at_5min() -> None:
    attempts: list[Attempt] = []
    delays = []
    at = 0
    for _ in range(9):
        attempts.append(failed(at))
        due = domain.next_attempt_at(0, attempts, B)
        assert due is not None
        delays.append(due - at)
        at = due
    assert delays == [5_000, 10_000, 20_000, 40_000, 80_000, 160_000, 300_000, 300_000, 300_000]


def test_the_schedule_depends_only_on_stored_attempts() -> None:
    # A restart reads the same attempts and gets the same due time.
    attempts = [failed(10_000), failed(16_000)]
    assert domain.next_attempt_at(0, attempts, B) == domain.next_attempt_at(0, list(attempts), B) == 26_000


def test_retry_after_is_a_floor_never_shortening_the_backoff() -> None:
    assert domain.next_attempt_at(0, [failed(0, retry_after_ms=60_000)], B) == 60_000
    assert domain.next_attempt_at(0, [failed(0, retry_after_ms=1_000)], B) == 5_000


def test_delivered_means_no_next_attempt() -> None:
    assert domain.next_attempt_at(0, [failed(0), Attempt(at=5_000, outcome=Outcome.DELIVERED)], B) is None


@pytest.mark.parametrize(
    ("status", "header", "outcome", "wait"),
    [
        (200, None, Outcome.DELIVERED, None),
        (204, None, Outcome.DELIVERED, None),
        (429, "7", Outcome.FAILED, 7_000),
        (503, "2", Outcome.FAILED, 2_000),
        (500, "7", Outcome.FAILED, None),  # Retry-After only counts for 429/503
        (None, None, Outcome.FAILED, None),
    ],
)
def test_attempt_outcomes(status: int | None, header: str | None, outcome: Outcome, wait: int | None) -> None:
    a = domain.attempt_outcome(status, None if status else "timeout", header, 1_000)
    assert a.outcome == outcome and a.retry_after_ms == wait and a.at == 1_000


def test_retry_after_as_http_date() -> None:
    assert domain.parse_retry_after("Thu, 01 Jan 1970 00:00:10 GMT", 4_000) == 6_000
    assert domain.parse_retry_after("soon", 0) is None


def snap(text: str, final: bool = False, at: int = 1) -> Response:
    return Response(
        agent_id="a", session_id="s", response_id="r1", text=text, final=final, created_at=at, updated_at=at
    )


def test_snapshots_replace_and_final_closes() -> None:
    first = domain.apply_snapshot(None, snap("Hel"))
    second = domain.apply_snapshot(first, snap("Hello", at=5))
    assert second.text == "Hello" and second.created_at == 1 and not second.final
    done = domain.apply_snapshot(second, snap("Hello!", final=True, at=9))
    assert done.final and done.completed_at == 9
    with pytest.raises(ResponseFinal):
        domain.apply_snapshot(done, snap("more", at=10))


def test_text_bound() -> None:
    domain.validate_text("x" * domain.MAX_TEXT_BYTES)
    with pytest.raises(domain.InvalidArgument):
        domain.validate_text("x" * (domain.MAX_TEXT_BYTES + 1))
    with pytest.raises(domain.InvalidArgument):
        domain.validate_text("  ")


def fact(**kw: str) -> TaskFact:
    base = dict(
        event_type="task.state_changed", task_id="t1", agent_id="a", session_id="s", title="Build", state="running"
    )
    base.update(kw)
    return TaskFact(**base)


@pytest.mark.parametrize(
    ("state", "kind"),
    [
        ("completed", Kind.TASK_COMPLETED),
        ("failed", Kind.TASK_FAILED),
        ("cancelled", Kind.TASK_CANCELLED),
        ("needs_reconciliation", Kind.TASK_NEEDS_RECONCILIATION),
    ],
)
def test_each_ending_notifies_once_per_task_and_state(state: str, kind: Kind) -> None:
    planned = domain.plan_notification(fact(state=state, result_text="42", failure_code="WORKER_EXITED"))
    assert planned is not None and planned.kind == kind and planned.key == f"t1:{state}"


def test_other_events_do_not_notify() -> None:
    assert domain.plan_notification(fact(state="running")) is None
    assert domain.plan_notification(fact(state="queued")) is None
    assert domain.plan_notification(fact(event_type="task.progress", state="completed")) is None


def test_a_question_notifies_once_per_question() -> None:
    planned = domain.plan_notification(
        fact(event_type="task.question", state="waiting_input", question_id="q1", question_text="Which DB?")
    )
    assert planned is not None and planned.kind == Kind.TASK_QUESTION
    assert planned.key == "t1:question:q1" and "Which DB?" in planned.text and planned.question_id == "q1"


def test_completed_report_carries_the_result() -> None:
    planned = domain.plan_notification(fact(state="completed", result_text="all tests pass"))
    assert planned is not None and "all tests pass" in planned.text


TURN = 1_000


@pytest.mark.parametrize(
    ("follow_up", "tasks", "unbacked"),
    [
        (FollowUp.CONTINUES, [], True),
        (FollowUp.CONTINUES, [SessionTask("completed", 10)], True),
        (FollowUp.CONTINUES, [SessionTask("cancel_requested", 10)], True),
        (FollowUp.CONTINUES, [SessionTask("running", 10)], False),
        (FollowUp.CONTINUES, [SessionTask("queued", 10)], False),
        (FollowUp.CONTINUES, [SessionTask("waiting_input", 10)], False),
        (FollowUp.CONTINUES, [SessionTask("recovering", 10)], False),
        # A task created in this turn backs the promise even when it already finished.
        (FollowUp.CONTINUES, [SessionTask("completed", TURN)], False),
        (FollowUp.ASKS_USER, [], False),
        (FollowUp.NONE, [], False),
    ],
)
def test_unbacked_promise_rule(follow_up: FollowUp, tasks: list[SessionTask], unbacked: bool) -> None:
    assert domain.is_unbacked_promise(follow_up, tasks, TURN) is unbacked


def test_pages_clamp_to_the_last() -> None:
    assert domain.clamp_page(9, 10, 25) == domain.Page(page=2, pages=3, total=25)
    assert domain.clamp_page(0, 10, 0) == domain.Page(page=0, pages=1, total=0)
