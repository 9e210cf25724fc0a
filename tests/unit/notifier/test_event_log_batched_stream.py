"""The notifier's follower on the batched event stream (WatchTasks ``batch``).

A response's events go into the same batch transactions as before (≤ batch_max each,
the cursor committed with the rows), in order; a follower that failed in the middle of
a response resumes from its stored cursor and applies every event exactly once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path

import pytest

from libs.db import Database
from services.notifier.activity import ActivityHub
from services.notifier.domain import Kind, Notification
from services.notifier.scheduler_link import CURSOR, EventLogFollower
from services.notifier.servicer import NotifierServicer
from services.notifier.store import MIGRATIONS, Frame, LogEvent, NotifierStore
from services.scheduler.domain import NewTask
from services.scheduler.engine import Engine
from taskgate.scheduler.v1 import scheduler_pb2 as spb
from taskgate.scheduler.v1 import scheduler_pb2_grpc as spb_grpc
from tests.support.scheduler_rpc import served_scheduler


class RecordingStore(NotifierStore):
    """Records each batch's sequences; the ``fail_at``-th batch fails once (before writing)."""

    def __init__(self, db: Database, fail_at: int | None = None) -> None:
        super().__init__(db)
        self.batches: list[list[int]] = []
        self.fail_at = fail_at

    async def record_log_events(
        self, cursor_name: str, events: Sequence[LogEvent]
    ) -> list[tuple[Notification | None, Frame | None]]:
        self.batches.append([e.sequence for e in events])
        if len(self.batches) == self.fail_at:
            raise RuntimeError("the database went away mid-stream")
        return await super().record_log_events(cursor_name, events)


def ended(sequence: int, state: int = spb.TASK_STATE_COMPLETED) -> spb.TaskEvent:
    return spb.TaskEvent(
        sequence=sequence,
        type=spb.TASK_EVENT_TYPE_STATE_CHANGED,
        task=spb.Task(task_id=f"t{sequence}", agent_id="a", session_id="s", title="Build", state=state),
    )


@pytest.fixture
def notifier_db(tmp_path: Path) -> Iterator[Database]:
    db = Database(f"sqlite:///{tmp_path / 'n.db'}", MIGRATIONS)
    db.migrate()
    yield db
    db.close()


async def kinds_by_task(store: NotifierStore, session: str = "s") -> dict[str, list[Kind]]:
    _, items = await store.list_notifications("a", session, None, 0, 100)
    found: dict[str, list[Kind]] = {}
    for n in items:
        assert n.task_id is not None  # every notification here is about a task
        found.setdefault(n.task_id, []).append(n.kind)
    return found


async def test_a_response_s_events_fill_the_batches_in_order(notifier_db: Database) -> None:
    store = RecordingStore(notifier_db)
    hub = ActivityHub()
    follower = EventLogFollower(None, NotifierServicer(store, hub), store, batch_max=2, linger_s=0)  # type: ignore[arg-type]

    async def stream() -> AsyncIterator[spb.WatchTasksResponse]:
        yield spb.WatchTasksResponse(events=[ended(1), ended(2), ended(3), ended(4, spb.TASK_STATE_RUNNING), ended(5)])
        # An unbatched response (a scheduler without batches) is still one event.
        yield spb.WatchTasksResponse(
            sequence=6, type=spb.TASK_EVENT_TYPE_STATE_CHANGED, task=ended(6, spb.TASK_STATE_FAILED).task
        )

    with hub.subscribe("a", "s") as sub:
        await asyncio.wait_for(follower.follow(stream()), 10)
        frames = [sub.queue.get_nowait() for _ in range(sub.queue.qsize())]
    assert [s for b in store.batches for s in b] == [1, 2, 3, 4, 5, 6], "every event once, in order"
    assert all(len(b) <= 2 for b in store.batches), "a large response is still cut into batch_max transactions"
    assert await store.cursor(CURSOR) == 6
    published = [f.notification.task_id for f in frames if f.notification is not None]
    assert published == ["t1", "t2", "t3", "t5", "t6"]
    assert await kinds_by_task(store) == {
        "t1": [Kind.TASK_COMPLETED],
        "t2": [Kind.TASK_COMPLETED],
        "t3": [Kind.TASK_COMPLETED],
        "t5": [Kind.TASK_COMPLETED],
        "t6": [Kind.TASK_FAILED],
    }


@pytest.fixture
async def scheduler(tmp_path: Path) -> AsyncIterator[tuple[Engine, spb_grpc.SchedulerServiceStub]]:
    async with served_scheduler(tmp_path) as served:
        yield served


async def test_a_failure_inside_a_response_resumes_from_the_cursor_exactly_once(
    scheduler: tuple[Engine, spb_grpc.SchedulerServiceStub], notifier_db: Database
) -> None:
    engine, stub = scheduler
    tasks = []
    for _ in range(4):
        task = await engine.create_task(
            NewTask(
                agent_id="a",
                session_id="s",
                title="t",
                instructions="",
                profile="w",
                request_id=None,
                harness=None,
                harness_model=None,
            )
        )
        await engine.cancel(task.task_id)  # queued: cancelled at once
        tasks.append(task.task_id)
    # 8 events (4 queued, 4 cancelled), all in the log before the follower connects: one
    # response. Batches of 3; the second fails, so the first three events are committed.
    store = RecordingStore(notifier_db, fail_at=2)
    follower = EventLogFollower(stub, NotifierServicer(store, ActivityHub()), store, batch_max=3)
    running = asyncio.create_task(follower.run())
    try:
        for _ in range(400):
            if len(store.batches) >= 4 and await store.cursor(CURSOR) == store.batches[-1][-1]:
                break
            await asyncio.sleep(0.025)
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
    first, failed, retried, last = store.batches
    assert len(first) == len(failed) == 3 and retried == failed, "reconnected from the cursor inside the response"
    sequences = first + retried + last
    assert len(sequences) == 8 and sequences == sorted(set(sequences))
    assert await store.cursor(CURSOR) == sequences[-1]
    assert await kinds_by_task(store) == {t: [Kind.TASK_CANCELLED] for t in tasks}, "each ending once"
