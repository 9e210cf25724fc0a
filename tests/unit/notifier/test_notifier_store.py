"""The notifier's store on SQLite and on a throwaway PostgreSQL cluster."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import text

from libs.db import Database
from services.notifier.domain import Attempt, Backoff, Kind, Notification, Outcome, Response, ResponseFinal, State
from services.notifier.store import MIGRATIONS, NotifierStore
from tests.support.postgres import fresh_database


@pytest.fixture(params=["sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[NotifierStore]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'n.db'}"
    else:
        url = fresh_database(request.getfixturevalue("postgres_url"), "notifier_store")
    db = Database(url, MIGRATIONS)
    db.migrate()
    yield NotifierStore(db, retention_frames=3)
    db.close()


def note(nid: str, session: str = "s", at: int = 1_000, channel: str | None = "hook") -> Notification:
    return Notification(
        notification_id=nid * 32,
        agent_id="a",
        session_id=session,
        kind=Kind.TASK_FAILED,
        text="failed",
        created_at=at,
        channel=channel,
        key=f"{nid}:failed",
    )


async def test_cursor_and_notification_move_together_and_replays_are_no_ops(store: NotifierStore) -> None:
    created, frame = await store.record_log_event("c", 7, note("1"), "m" * 32)
    assert created is not None and frame is not None and created.state == State.PENDING
    again, frame2 = await store.record_log_event(
        "c", 7, note("1").model_copy(update={"notification_id": "2" * 32}), "x" * 32
    )
    assert again is not None and again.notification_id == "1" * 32 and frame2 is None
    await store.record_log_event("c", 5, None, "y" * 32)  # an older id re-read never moves the cursor back
    assert await store.cursor("c") == 7


async def test_due_conversations_skip_busy_ones_before_the_limit(store: NotifierStore) -> None:
    for i, session in enumerate(["s1", "s2", "s3"]):
        await store.enqueue(note(str(i + 1), session, at=1_000 + i), f"{i}" * 32)
    assert await store.due_conversations(5_000, 2, set()) == [("a", "s1"), ("a", "s2")]
    assert await store.due_conversations(5_000, 2, {("a", "s1")}) == [("a", "s2"), ("a", "s3")]
    assert await store.due_conversations(500, 2, set()) == []


async def test_the_next_attempt_is_derived_from_stored_attempts(store: NotifierStore) -> None:
    n, _ = await store.enqueue(note("1"), "m" * 32)
    b = Backoff(5_000, 300_000)
    after_one = await store.record_attempt(n.notification_id, Attempt(at=2_000, outcome=Outcome.FAILED), b)
    assert after_one.next_attempt_at == 7_000
    after_two = await store.record_attempt(n.notification_id, Attempt(at=7_100, outcome=Outcome.FAILED), b)
    assert after_two.next_attempt_at == 17_100
    done = await store.record_attempt(n.notification_id, Attempt(at=17_200, outcome=Outcome.DELIVERED), b)
    assert done.state == State.DELIVERED and done.next_attempt_at is None and len(done.attempts) == 3
    assert await store.due_conversations(10**12, 10, set()) == []


def response(rid: str, text_: str, final: bool = False, at: int = 1) -> Response:
    return Response(
        agent_id="a", session_id="s", response_id=rid, text=text_, final=final, created_at=at, updated_at=at
    )


async def test_snapshots_history_and_retained_frames(store: NotifierStore) -> None:
    _, f1 = await store.publish(response("r1", "a", at=1))
    await store.publish(response("r1", "ab", at=2))
    await store.publish(response("r2", "x", at=3))
    done, _ = await store.publish(response("r1", "abc", final=True, at=4))
    assert done.completed_at == 4 and done.created_at == 1
    with pytest.raises(ResponseFinal):
        await store.publish(response("r1", "abcd", at=5))
    open_ = await store.open_responses("a", "s")
    assert [f.snapshot.text for f in open_ if f.snapshot] == ["x"]
    # Three frames retained per conversation: the first is gone, so resuming from it is refused.
    assert await store.frames_after("a", "s", f1.seq) is None
    page, messages = await store.list_messages("a", "s", 0, 10)
    assert page.total == 1 and messages[0].response_id == "r1" and messages[0].completed_at == 4


async def test_frames_past_their_age_go_but_a_sequence_never_comes_back(store: NotifierStore) -> None:
    """An idle day ages out every frame; SQLite would then hand sequence 1 out again, and the
    next final response's history message (named after its frame) would collide with the first."""
    _, first = await store.publish(response("r1", "one", final=True, at=1))
    _, other = await store.publish(response("r2", "two", at=2))
    assert await store.prune_activity(10**13) == 1  # everything is old: all but the newest frame go
    assert await store.frames_after("a", "s", first.seq) is None
    _, later = await store.publish(response("r3", "three", final=True, at=3))
    assert later.seq > other.seq > first.seq
    _, messages = await store.list_messages("a", "s", 0, 10)
    assert [m.text for m in messages] == ["one", "three"]
    assert [f.seq for f in await store.frames_after("a", "s", other.seq) or []] == [later.seq]


async def test_old_outbox_rows_read_after_the_migration(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'old.db'}", MIGRATIONS[:1])
    db.migrate()
    with db.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO notifications VALUES ('" + "a" * 32 + "', 'a', 's', 'task_report', NULL, 'old', 1, 5,"
                " NULL, 0), ('" + "b" * 32 + "', 'a', 's', 'task_report', NULL, 'new', 0, 6, NULL, 0)"
            )
        )
    db.close()
    db = Database(f"sqlite:///{tmp_path / 'old.db'}", MIGRATIONS)
    assert db.migrate() == [2, 3, 4, 5, 6]
    try:
        _, items = await NotifierStore(db).list_notifications("a", "s", None, 0, 10)
        assert [(n.kind, n.state, n.next_attempt_at) for n in items] == [
            (Kind.TASK_REPORT, State.DELIVERED, None),
            (Kind.TASK_REPORT, State.PENDING, 6),
        ]
    finally:
        db.close()


async def test_concurrent_final_snapshots_close_a_response_once(store: NotifierStore) -> None:
    await store.publish(response("r1", "draft"))
    results = await asyncio.gather(
        *(store.publish(response("r1", f"final {i}", final=True, at=10 + i)) for i in range(8)),
        return_exceptions=True,
    )
    assert sum(not isinstance(r, BaseException) for r in results) == 1
    assert all(isinstance(r, ResponseFinal) for r in results if isinstance(r, BaseException))
    _, messages = await store.list_messages("a", "s", 0, 10)
    assert len(messages) == 1
