"""Legacy adoption (issue 10 item 2, seed 004): a task an older version left ``failed``
``GATEWAY_SHUTDOWN`` less than ten minutes ago, whose failure no one was told of, is resumed
the way a shutdown re-queue resumes it — and only then."""

from __future__ import annotations

from pathlib import Path
from typing import NoReturn

import pytest

from services.scheduler import domain
from services.scheduler.domain import Failure, InvalidTransition, RestartResume, State, Task
from tests.unit.scheduler.test_engine import Harness, start_harness

MINUTE = 60_000


def legacy(task: Task, ended_at: int, code: str = "GATEWAY_SHUTDOWN") -> Task:
    """As an older version left it at its shutdown: failed, the failure to be reported."""
    task.state = State.FAILED
    task.failure = Failure(code=code, message="the gateway shut down")
    task.ended_at = task.updated_at = ended_at
    return task


class Notifier:
    """The notifier's answer to ClaimUnreportedFailure, scripted per task."""

    def __init__(self, answer: bool | Exception = True) -> None:
        self.answer = answer
        self.asked: list[tuple[str, int]] = []

    async def claim_unreported_failure(self, task: Task, event_sequence: int) -> bool:
        self.asked.append((task.task_id, event_sequence))
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def test_only_a_recent_gateway_shutdown_failure_with_resumes_left_is_adoptable() -> None:
    now = 100 * MINUTE
    base = Task(task_id="a" * 32, agent_id="a", session_id="s", title="t", instructions="", profile="p",
                state=State.QUEUED, created_at=0, updated_at=0)  # fmt: skip
    assert domain.legacy_shutdown_adoptable(legacy(base.model_copy(deep=True), now - 9 * MINUTE), now)
    assert not domain.legacy_shutdown_adoptable(legacy(base.model_copy(deep=True), now - 10 * MINUTE), now)
    assert not domain.legacy_shutdown_adoptable(legacy(base.model_copy(deep=True), now, "WORKER_EXITED"), now)
    capped = legacy(base.model_copy(deep=True), now)
    capped.restart_resume = RestartResume(count=3, revision=1, pending=False)
    assert not domain.legacy_shutdown_adoptable(capped, now), "the revision's three resumes are used up"

    adopted = domain.adopt_legacy_shutdown(legacy(base.model_copy(deep=True), now - MINUTE), now)
    assert adopted is not None and adopted.state == State.QUEUED and adopted.ended_at is None
    assert adopted.restart_resume == RestartResume(count=1, revision=1, pending=True, last_progress=None)
    assert adopted.failure is not None and adopted.failure.code == "GATEWAY_SHUTDOWN"
    # The one way out of a terminal state, and only with the flag.
    with pytest.raises(InvalidTransition):
        domain.check_transition(State.FAILED, State.QUEUED)
    domain.check_transition(State.FAILED, State.QUEUED, legacy_adoption=True)
    with pytest.raises(InvalidTransition):
        domain.check_transition(State.CANCELLED, State.QUEUED, legacy_adoption=True)


async def make_legacy(h: Harness, ended_ago_ms: int, code: str = "GATEWAY_SHUTDOWN") -> Task:
    task = await h.create("sleeper")
    at = h.clock.now_ms() - ended_ago_ms

    def fail(t: Task) -> Task:
        return legacy(t, at, code)

    failed, _ = await h.engine.store.update_task(task.task_id, fail, "task.state_changed", at)
    return failed


async def test_an_unreported_recent_failure_is_resumed_and_the_rest_are_left(tmp_path: Path) -> None:
    h = await start_harness(tmp_path)
    try:
        notifier = Notifier(True)
        h.engine.runtime.failure_reports = notifier
        recent = await make_legacy(h, 2 * MINUTE)
        old = await make_legacy(h, 11 * MINUTE)
        other = await make_legacy(h, MINUTE, code="WORKER_EXITED")
        assert await h.engine.adopt_legacy_failures_once() == 0
        assert [t for t, _ in notifier.asked] == [recent.task_id], "only the adoptable one is asked about"
        assert notifier.asked[0][1] > 0, "with the sequence of its failure event"
        resumed = await h.engine.store.get_task(recent.task_id)
        assert resumed.state == State.QUEUED and resumed.ended_at is None
        assert resumed.restart_resume and resumed.restart_resume.count == 1 and resumed.restart_resume.pending
        for left in (old, other):
            assert (await h.engine.store.get_task(left.task_id)).state == State.FAILED
        # Dispatched like any resumed task: its worker is told it resumes.
        assert await h.engine.dispatch_once() == 1
        running = await h.wait(recent.task_id, [State.RUNNING])
        assert running.state == State.RUNNING
        # Adopted once: a second pass finds nothing (the task is no longer failed).
        notifier.asked.clear()
        assert await h.engine.adopt_legacy_failures_once() == 0 and notifier.asked == []
    finally:
        await h.close()


async def test_a_reported_failure_stays_failed_and_an_unreachable_notifier_is_asked_again(tmp_path: Path) -> None:
    h = await start_harness(tmp_path)
    try:
        task = await make_legacy(h, MINUTE)
        h.engine.runtime.failure_reports = Notifier(ConnectionError("notifier down"))
        assert await h.engine.adopt_legacy_failures_once() == 1, "undecided: the loop asks again"
        assert (await h.engine.store.get_task(task.task_id)).state == State.FAILED
        h.engine.runtime.failure_reports = Notifier(False)  # someone was told: it stays failed
        assert await h.engine.adopt_legacy_failures_once() == 0
        stays = await h.engine.store.get_task(task.task_id)
        assert stays.state == State.FAILED and stays.restart_resume is None
    finally:
        await h.close()


async def test_a_crash_between_the_claim_and_the_requeue_is_repaired_by_the_next_start(tmp_path: Path) -> None:
    first = await start_harness(tmp_path)
    task = await make_legacy(first, MINUTE)
    first.engine.runtime.failure_reports = Notifier(True)
    store = first.engine.store
    requeue = store.update_task

    async def killed(*args: object, **kwargs: object) -> NoReturn:
        raise RuntimeError("the scheduler died before the re-queue committed")

    store.update_task = killed  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        await first.engine.adopt_legacy_failures_once()
    store.update_task = requeue  # type: ignore[method-assign]
    assert (await store.get_task(task.task_id)).state == State.FAILED, "claimed, not yet resumed"
    await first.close(db=False)

    second = await start_harness(tmp_path, db=first.db)
    try:
        # The notifier answers a repeated claim the same way (tests/unit/notifier/test_failure_claims.py).
        second.engine.runtime.failure_reports = Notifier(True)
        assert await second.engine.adopt_legacy_failures_once() == 0
        resumed = await second.engine.store.get_task(task.task_id)
        assert resumed.state == State.QUEUED and resumed.restart_resume and resumed.restart_resume.count == 1
    finally:
        await second.close()
