"""The notifier's side of legacy adoption (issue 10 item 2): a task failure's report is
claimed for the scheduler only if no one received it, and a claimed one is never made or sent."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from libs.db import Database
from services.notifier.domain import Attempt, Backoff, FailureClaim, Kind, Message, Notification, Outcome, State
from services.notifier.store import MIGRATIONS, NotifierStore
from tests.support.postgres import fresh_database

TASK = "t" * 32


@pytest.fixture(params=["sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[NotifierStore]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'n.db'}"
    else:
        url = fresh_database(request.getfixturevalue("postgres_url"), "failure_claims")
    db = Database(url, MIGRATIONS)
    db.migrate()
    yield NotifierStore(db)
    db.close()


def failure(nid: str, kind: Kind = Kind.TASK_FAILED, at: int = 1_000) -> Notification:
    state = "failed" if kind == Kind.TASK_FAILED else "completed"
    return Notification(
        notification_id=nid * 32,
        agent_id="a",
        session_id="s",
        kind=kind,
        task_id=TASK,
        text=state,
        created_at=at,
        channel="hook",
        key=f"{TASK}:{state}",
    )


async def test_a_failure_not_yet_seen_is_suppressed_and_its_event_makes_no_report(store: NotifierStore) -> None:
    claim = await store.claim_unreported_failure("a", "s", TASK, 7, now=2_000)
    assert claim == FailureClaim.SUPPRESSED and claim.claimed
    # Asked again (the scheduler retried after a crash): the same answer.
    assert (await store.claim_unreported_failure("a", "s", TASK, 7, now=2_001)).claimed
    made, frame = await store.record_log_event("scheduler", 7, failure("1"), "m" * 32)
    assert made is None and frame is None
    assert await store.cursor("scheduler") == 7, "the cursor still moves past the claimed event"
    # The resumed task fails again later (a new event): that failure is reported.
    again, _ = await store.record_log_event("scheduler", 12, failure("2"), "n" * 32)
    assert again is not None and again.kind == Kind.TASK_FAILED and again.state == State.PENDING


async def test_a_pending_report_is_stopped_consumed_and_its_key_freed(store: NotifierStore) -> None:
    pending, _ = await store.record_log_event("scheduler", 7, failure("1"), "m" * 32)
    assert pending is not None
    await store.record_attempt(
        pending.notification_id, Attempt(at=1_100, outcome=Outcome.FAILED, http_status=503), Backoff()
    )
    claim = await store.claim_unreported_failure("a", "s", TASK, 7, now=2_000)
    assert claim == FailureClaim.STOPPED and claim.claimed
    stopped = await store.get_notification("a", "s", pending.notification_id)
    assert stopped.state == State.STOPPED and stopped.next_attempt_at is None
    assert await store.due_conversations(10**12, 10, set()) == [], "never sent again"
    _, updates, _ = await store.add_user_message(
        Message(message_id="u" * 32, agent_id="a", session_id="s", role="user", text="hi", created_at=2_100)
    )
    assert updates == [], "nor handed to the agent on its next turn"
    assert (await store.claim_unreported_failure("a", "s", TASK, 7, now=2_001)).claimed, "idempotent"
    later, _ = await store.record_log_event("scheduler", 12, failure("2"), "n" * 32)
    assert later is not None and later.notification_id == "2" * 32, "a later failure is a new report"


@pytest.mark.parametrize("how", ["delivered", "consumed"])
async def test_a_report_someone_received_is_not_claimed(store: NotifierStore, how: str) -> None:
    made, _ = await store.record_log_event("scheduler", 7, failure("1"), "m" * 32)
    assert made is not None
    if how == "delivered":
        await store.record_attempt(made.notification_id, Attempt(at=1_100, outcome=Outcome.DELIVERED), Backoff())
    else:  # stopped, then handed to the agent as a pending update on its next turn
        await store.stop("a", "s", made.notification_id)
        await store.add_user_message(
            Message(message_id="u" * 32, agent_id="a", session_id="s", role="user", text="hi", created_at=1_200)
        )
    claim = await store.claim_unreported_failure("a", "s", TASK, 7, now=2_000)
    assert claim == FailureClaim.REPORTED and not claim.claimed
    kept = await store.get_notification("a", "s", made.notification_id)
    assert kept.notification_id == made.notification_id and kept.task_id == TASK
