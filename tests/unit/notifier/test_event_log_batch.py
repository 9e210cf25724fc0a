"""The scheduler event log applied in batches (issue 11 item 1): a batch commits as one
transaction (SQLite and PostgreSQL), a replay adds nothing, and events arriving while a
batch commits form the next batch, in order."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest
import sqlalchemy.exc

from libs.db import Database
from services.notifier.activity import ActivityHub
from services.notifier.domain import Kind, Notification, QuestionState
from services.notifier.scheduler_link import CURSOR, EventLogFollower
from services.notifier.servicer import NotifierServicer
from services.notifier.store import MIGRATIONS, Frame, LogEvent, NotifierStore, QuestionFact
from taskgate.scheduler.v1 import scheduler_pb2 as spb
from tests.support.postgres import fresh_database

Q1 = "1" * 32


@pytest.fixture(params=["sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[NotifierStore]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'n.db'}"
    else:
        url = fresh_database(request.getfixturevalue("postgres_url"), "event_log_batch")
    db = Database(url, MIGRATIONS)
    db.migrate()
    yield NotifierStore(db, retention_frames=100)
    db.close()


def notification(nid: str, kind: Kind, task_id: str, key: str, question_id: str | None = None) -> Notification:
    return Notification(
        notification_id=nid * 32,
        agent_id="a",
        session_id="s",
        kind=kind,
        task_id=task_id,
        question_id=question_id,
        text=kind.value,
        created_at=1_000,
        key=key,
    )


def batch(ids: str) -> list[LogEvent]:
    """t1 asks Q1, then runs again (answers it); t2 completes, and its event is read twice.

    ``ids``: one character per notification id and message id (events 1, 3 and 4).
    """
    question = QuestionFact(Q1, "a", "s", "t1", "Build", "which?", 1_000)
    return [
        LogEvent(
            1,
            notification(ids[0], Kind.TASK_QUESTION, "t1", f"t1:question:{Q1}", Q1),
            ids[1] * 32,
            question=question,
        ),
        LogEvent(2, task_state=("t1", "running")),
        LogEvent(
            3,
            notification(ids[2], Kind.TASK_COMPLETED, "t2", "t2:completed"),
            ids[3] * 32,
            task_state=("t2", "completed"),
        ),
        LogEvent(
            4,
            notification(ids[4], Kind.TASK_COMPLETED, "t2", "t2:completed"),
            ids[5] * 32,
            task_state=("t2", "completed"),
        ),
    ]


async def total(store: NotifierStore) -> int:
    page, _ = await store.list_notifications("a", "s", None, 0, 100)
    return page.total


async def test_a_failure_inside_a_batch_commits_nothing_and_a_replay_adds_nothing(store: NotifierStore) -> None:
    await store.record_log_event(CURSOR, 0, None, "")  # the cursor row exists, at 0
    broken = batch("abadef")  # event 3 reuses event 1's notification id: the insert fails
    with pytest.raises(sqlalchemy.exc.IntegrityError):
        await store.record_log_events(CURSOR, broken)
    assert await store.cursor(CURSOR) == 0, "the cursor did not move"
    assert await store.get_question(Q1) is None, "the question fact rolled back with the rest"
    assert await total(store) == 0
    assert await store.frames_after("a", "s", 0) is None, "no frame committed (none is retained)"

    stored = await store.record_log_events(CURSOR, batch("abcdef"))
    assert await store.cursor(CURSOR) == 4
    (asked, f1), (none, no_frame), (done, f3), (again, f4) = stored
    assert none is None and no_frame is None
    assert asked is not None and asked.kind == Kind.TASK_QUESTION and f1 is not None
    assert done is not None and f3 is not None and f3.seq > f1.seq, "frames in the events' order"
    assert again is not None and again.notification_id == done.notification_id and f4 is None, (
        "the same key later in the batch is a replay"
    )
    question = await store.get_question(Q1)
    assert question is not None and question.state == QuestionState.ANSWERED, "asked, then answered, in order"
    assert await total(store) == 2

    replay = await store.record_log_events(CURSOR, batch("ghijkl"))  # a restart re-reads the batch
    assert [frame for _, frame in replay] == [None] * 4
    assert [n.notification_id if n else None for n, _ in replay] == [
        asked.notification_id,
        None,
        done.notification_id,
        done.notification_id,
    ]
    assert await total(store) == 2 and await store.cursor(CURSOR) == 4
    question = await store.get_question(Q1)
    assert question is not None and question.state == QuestionState.ANSWERED, "a replayed question is not reopened"


async def test_a_question_replaced_within_a_batch_is_named_and_an_old_sequence_never_moves_the_cursor_back(
    store: NotifierStore,
) -> None:
    q2 = "2" * 32
    events = [
        LogEvent(
            5,
            notification("a", Kind.TASK_QUESTION, "t1", f"t1:question:{Q1}", Q1),
            "b" * 32,
            question=QuestionFact(Q1, "a", "s", "t1", "Build", "which?", 1_000),
        ),
        LogEvent(2, task_state=("t1", "waiting_input")),  # keeps the question; an older sequence
        LogEvent(
            6,
            notification("c", Kind.TASK_QUESTION, "t1", f"t1:question:{q2}", q2),
            "d" * 32,
            question=QuestionFact(q2, "a", "s", "t1", "Build", "and now?", 1_001),
        ),
    ]
    (_, _), (_, _), (second, _) = await store.record_log_events(CURSOR, events)
    assert second is not None and f"replaces question {Q1}" in second.text
    first = await store.get_question(Q1)
    assert first is not None and first.state == QuestionState.REPLACED
    assert await store.cursor(CURSOR) == 6
    await store.record_log_events(CURSOR, [LogEvent(3)])
    assert await store.cursor(CURSOR) == 6


# --- the follower: what is ready forms a batch; what arrives meanwhile, the next -----------


def completed(sequence: int) -> spb.WatchTasksResponse:
    return spb.WatchTasksResponse(
        sequence=sequence,
        type=spb.TASK_EVENT_TYPE_STATE_CHANGED,
        task=spb.Task(
            task_id=f"t{sequence}", agent_id="a", session_id="s", title="Build", state=spb.TASK_STATE_COMPLETED
        ),
    )


class GatedStore(NotifierStore):
    """Records each batch; the first one's commit waits until the test opens the gate."""

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self.batches: list[list[int]] = []
        self.entered = asyncio.Event()
        self.gate = asyncio.Event()

    async def record_log_events(
        self, cursor_name: str, events: Sequence[LogEvent]
    ) -> list[tuple[Notification | None, Frame | None]]:
        self.batches.append([e.sequence for e in events])
        self.entered.set()
        await self.gate.wait()
        return await super().record_log_events(cursor_name, events)


async def test_events_arriving_while_a_batch_commits_are_the_next_batch_in_order(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'n.db'}", MIGRATIONS)
    db.migrate()
    store = GatedStore(db)
    hub = ActivityHub()
    follower = EventLogFollower(None, NotifierServicer(store, hub), store, linger_s=0)  # type: ignore[arg-type]
    source: asyncio.Queue[spb.WatchTasksResponse | None] = asyncio.Queue()

    async def stream() -> AsyncIterator[spb.WatchTasksResponse]:
        while (event := await source.get()) is not None:
            yield event

    with hub.subscribe("a", "s") as sub:
        following = asyncio.create_task(follower.follow(stream()))
        source.put_nowait(completed(1))
        await asyncio.wait_for(store.entered.wait(), 10)
        for sequence in (2, 3, 4):
            source.put_nowait(completed(sequence))
        while not source.empty():  # the reader takes each off the stream and queues it in one step
            await asyncio.sleep(0)
        assert store.batches == [[1]], "the first batch is still committing"
        store.gate.set()
        source.put_nowait(None)  # the stream ends
        await asyncio.wait_for(following, 10)
        frames = [sub.queue.get_nowait() for _ in range(sub.queue.qsize())]
    assert store.batches == [[1], [2, 3, 4]]
    assert await store.cursor(CURSOR) == 4
    published = [f.notification.task_id for f in frames if f.notification is not None]
    assert published == ["t1", "t2", "t3", "t4"], "frames published after each commit, in order"
    assert [f.seq for f in frames] == sorted(f.seq for f in frames)
    db.close()


async def test_a_stream_error_is_raised_after_the_events_before_it_are_applied(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'n.db'}", MIGRATIONS)
    db.migrate()
    store = NotifierStore(db)
    follower = EventLogFollower(None, NotifierServicer(store, ActivityHub()), store, linger_s=0)  # type: ignore[arg-type]

    async def stream() -> AsyncIterator[spb.WatchTasksResponse]:
        yield completed(1)
        yield completed(2)
        raise ConnectionResetError("scheduler went away")

    with pytest.raises(ConnectionResetError):
        await follower.follow(stream())
    assert await store.cursor(CURSOR) == 2
    db.close()
