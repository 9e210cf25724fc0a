"""History retention on SQLite and PostgreSQL: the scheduler's finished tasks
(``SchedulerStore.prune_finished``, ``HistoryRetention``) — what goes, what stays, and that the
event log's ids never go back — and the notifier's notifications (``prune_notifications``,
``NotificationRetention``) and conversation history (``prune_conversations``,
``ConversationRetention``), and the pending-registry's questions of ended tasks
(``PendingStore.prune_closed``, ``QuestionRetention``)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from types import SimpleNamespace

import pytest
from sqlalchemy import text

from libs.clock import SystemClock
from libs.db import Database
from services.notifier.domain import Attempt as DeliveryAttempt
from services.notifier.domain import Backoff, ConversationEvent, Kind, Message, Notification, Outcome, Response
from services.notifier.retention import (
    ConversationRetention,
    ConversationsPrunedTotal,
    NotificationRetention,
    NotificationsPrunedTotal,
)
from services.notifier.store import MIGRATIONS as NOTIFIER_MIGRATIONS
from services.notifier.store import ConversationsPruned, NotificationsPruned, NotifierStore
from services.pending_registry.domain import AnswerAttempt, NewQuestion, QuestionState
from services.pending_registry.retention import QuestionRetention, QuestionsPrunedTotal
from services.pending_registry.store import MIGRATIONS as PENDING_MIGRATIONS
from services.pending_registry.store import PendingStore, QuestionsPruned
from services.scheduler.cron_domain import CronRun
from services.scheduler.cron_store import MIGRATIONS as CRON_MIGRATIONS
from services.scheduler.cron_store import CronStore
from services.scheduler.domain import Attempt, State, Task, TaskNotFound
from services.scheduler.history_retention import HistoryPruned, HistoryRetention
from services.scheduler.store import MIGRATIONS, PrunedTasks, SchedulerStore
from tests.support.procs import REPO
from tests.unit.persistence.test_stores import make_task as stored_task

CUTOFF = 5000


def tid(n: int) -> str:
    return f"{n:032x}"


def make_task(task_id: str, state: State = State.QUEUED, created_at: int = 1000, **kw: object) -> Task:
    """A task that never asked a question (its end leaves no question-close row) unless ``kw`` says."""
    return stored_task(task_id, state, created_at, **{"may_have_asked": False, **kw})


async def finish(store: SchedulerStore, task_id: str, state: State, at: int) -> None:
    def end(t: Task) -> Task:
        t.state = state
        return t

    await store.update_task(task_id, end, "task.state_changed", at)


def count(db: Database, table: str, task_id: str | None = None) -> int:
    with db.engine.connect() as conn:
        if task_id is None:
            return int(conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())
        return int(conn.execute(text(f"SELECT count(*) FROM {table} WHERE task_id = :t"), {"t": task_id}).scalar_one())


async def test_finished_tasks_older_than_the_cutoff_go_with_their_events_and_attempts(scheduler_db: Database) -> None:
    store = SchedulerStore(scheduler_db)
    # Ended before the cutoff: completed (with an attempt), failed, cancelled.
    await store.create_task(make_task(tid(1), state=State.RUNNING, created_at=1000))
    await store.save_attempt(Attempt(attempt_id="a" * 32, task_id=tid(1), number=1, boot_id="b", token_hash="h" * 64))
    await finish(store, tid(1), State.COMPLETED, 2000)
    await store.create_task(make_task(tid(2), state=State.FAILED, created_at=1500))
    await store.create_task(make_task(tid(3), state=State.CANCELLED, created_at=1600))
    # Kept: created long ago but finished after the cutoff, and tasks that have not finished.
    await store.create_task(make_task(tid(4), state=State.RUNNING, created_at=1000))
    await finish(store, tid(4), State.COMPLETED, CUTOFF + 1)
    for n, state in ((5, State.RUNNING), (6, State.NEEDS_RECONCILIATION), (7, State.PAUSED), (8, State.QUEUED)):
        await store.create_task(make_task(tid(n), state=state, created_at=1000 + n))

    pruned = await store.prune_finished(CUTOFF)

    assert pruned == PrunedTasks(tasks=3, events=4, attempts=1)
    for gone in (tid(1), tid(2), tid(3)):
        with pytest.raises(TaskNotFound):
            await store.get_task(gone)
        assert count(scheduler_db, "task_events", gone) == 0
    assert count(scheduler_db, "attempts") == 0
    kept = {t.task_id for t in (await store.find_tasks([tid(n) for n in range(1, 9)])).values()}
    assert kept == {tid(n) for n in range(4, 9)}
    assert count(scheduler_db, "task_events", tid(4)) == 2  # what stays keeps its whole history
    assert await store.prune_finished(CUTOFF) == PrunedTasks(0, 0, 0)


async def test_a_task_with_a_question_still_to_close_stays_until_it_is_closed(scheduler_db: Database) -> None:
    store = SchedulerStore(scheduler_db)
    await store.create_task(make_task(tid(1), state=State.RUNNING, created_at=1000, may_have_asked=True))
    await finish(store, tid(1), State.COMPLETED, 2000)
    await store.create_task(make_task(tid(2), created_at=9000))  # the log's newest event

    assert await store.prune_finished(CUTOFF) == PrunedTasks(0, 0, 0)
    await store.question_close_done(tid(1))
    assert (await store.prune_finished(CUTOFF)).tasks == 1


async def test_a_sub_task_that_stays_keeps_every_task_above_it(scheduler_db: Database) -> None:
    store = SchedulerStore(scheduler_db)
    root, child, grandchild = tid(1), tid(2), tid(3)
    await store.create_task(make_task(root, state=State.COMPLETED, created_at=1000))
    await store.create_task(make_task(child, state=State.COMPLETED, created_at=1001, parent_task_id=root, depth=1))
    await store.create_task(
        make_task(grandchild, state=State.RUNNING, created_at=1002, parent_task_id=child, root_task_id=root, depth=2)
    )
    # Another tree, finished throughout, goes whole.
    await store.create_task(make_task(tid(4), state=State.CANCELLED, created_at=1003))
    await store.create_task(make_task(tid(5), state=State.CANCELLED, created_at=1004, parent_task_id=tid(4), depth=1))
    await store.create_task(make_task(tid(9), created_at=9000))  # the log's newest event

    # The root was found (its child finished long ago) and kept for the grandchild below.
    assert await store.prune_finished(CUTOFF) == PrunedTasks(tasks=2, events=2, attempts=0, kept=frozenset({root}))
    assert set(await store.find_tasks([root, child, grandchild])) == {root, child, grandchild}

    await finish(store, grandchild, State.COMPLETED, 3000)
    await store.create_task(make_task(tid(10), created_at=9001))  # the newest event again
    assert (await store.prune_finished(CUTOFF)).tasks == 3
    assert await store.find_tasks([root, child, grandchild]) == {}


async def test_kept_candidates_never_hold_back_the_ones_after_them(scheduler_db: Database) -> None:
    """Trees kept for a sub-task that never ends (paused) come first in the index, as many as a
    batch holds: the pass skips them and deletes what is behind them."""
    store = SchedulerStore(scheduler_db)
    roots = [tid(n) for n in (1, 2, 3)]
    for i, root in enumerate(roots):
        child, grandchild = tid(10 + i), tid(20 + i)
        await store.create_task(make_task(root, state=State.COMPLETED, created_at=1000 + i))
        await store.create_task(make_task(child, state=State.COMPLETED, created_at=1100 + i, parent_task_id=root))
        await store.create_task(make_task(grandchild, state=State.PAUSED, created_at=1200 + i, parent_task_id=child))
    plain = [tid(30), tid(31)]
    for i, task_id in enumerate(plain):
        await store.create_task(make_task(task_id, state=State.COMPLETED, created_at=1300 + i))
    await store.create_task(make_task(tid(99), created_at=9000))  # the log's newest event
    rt = SimpleNamespace(store=store, closing=False, tasks_cfg=SimpleNamespace(finished_task_retention_ms=1000))

    pruned = await HistoryRetention(rt, batch=3).prune_once(CUTOFF + 1000)  # type: ignore[arg-type]

    assert (pruned.tasks, pruned.kept) == (2, 3)
    assert await store.find_tasks(plain) == {}
    assert set(await store.find_tasks(roots)) == set(roots)


async def test_the_newest_event_s_task_stays_so_event_ids_never_go_back(scheduler_db: Database) -> None:
    """SQLite gives the highest rowid again once its row is deleted: a follower whose cursor is
    at that id would never read the next events. The newest event's task is kept for that."""
    store = SchedulerStore(scheduler_db)
    for n in range(1, 6):
        await store.create_task(make_task(tid(n), state=State.COMPLETED, created_at=1000 + n))
    newest = await store.last_event_id()

    assert (await store.prune_finished(CUTOFF)).tasks == 4
    assert await store.last_event_id() == newest
    await store.create_task(make_task(tid(6), created_at=9000))
    read, events = await store.events_after(newest, (), 10)
    assert [e.task.task_id for e in events] == [tid(6)] and read[0] > newest


async def test_concurrent_passes_delete_each_task_once(db_url: str) -> None:
    """Two replicas pruning one database at once: each task goes once, nothing fails (SKIP
    LOCKED on PostgreSQL, one writer at a time on SQLite)."""
    dbs = [Database(db_url, MIGRATIONS) for _ in range(2)]
    dbs[0].migrate()
    try:
        stores = [SchedulerStore(db) for db in dbs]
        for n in range(1, 201):
            await stores[0].create_task(make_task(tid(n), state=State.COMPLETED, created_at=1000 + n))
        await stores[0].create_task(make_task(tid(999), created_at=9000))

        async def drain(store: SchedulerStore) -> int:
            done = 0
            while pruned := (await store.prune_finished(CUTOFF, limit=20)).tasks:
                done += pruned
            return done

        counts = await asyncio.gather(drain(stores[0]), drain(stores[1]))
        assert sum(counts) == 200
        assert count(dbs[0], "tasks") == 1 and count(dbs[0], "task_events") == 1
    finally:
        for db in dbs:
            db.close()


async def test_a_pass_deletes_batch_after_batch_at_the_configured_age(scheduler_db: Database) -> None:
    store = SchedulerStore(scheduler_db)
    day = 86_400_000
    for n in range(1, 13):
        await store.create_task(make_task(tid(n), state=State.FAILED, created_at=1000 + n))
    await store.create_task(make_task(tid(20), state=State.COMPLETED, created_at=2 * day))  # within the retention
    # The runtime's part in a pass: its store, the retention, whether it is closing.
    rt = SimpleNamespace(store=store, closing=False, tasks_cfg=SimpleNamespace(finished_task_retention_ms=2 * day))
    retention = HistoryRetention(rt, batch=5)  # type: ignore[arg-type]

    assert await retention.prune_once(3 * day) == HistoryPruned(tasks=12, events=12, attempts=0, batches=3)
    assert set(await store.find_tasks([tid(n) for n in (1, 12, 20)])) == {tid(20)}
    # A day later the last one is past the retention too, but it holds the log's newest event.
    assert (await retention.prune_once(4 * day + 1)).tasks == 0


# --- the notifier's notifications ---------------------------------------------------------


async def test_cron_runs_that_ended_before_the_cutoff_go_and_open_ones_stay(db_url: str) -> None:
    db = Database(db_url, CRON_MIGRATIONS)
    db.migrate()
    try:
        store = SchedulerStore(db)
        runs = CronStore(store)

        async def run(n: int, started_at: int, ended_at: int | None) -> None:
            made = CronRun(
                run_id=tid(n),
                cron_id="nightly",
                kind="schedule",
                started_at=started_at,
                deadline_at=started_at + 100,
                scheduled_for=started_at,
                task_ids=(tid(100 + n),),
            )
            await runs.start_run(made, make_task(tid(100 + n), created_at=started_at))
            if ended_at is not None:
                assert await runs.end_run(made.ending("completed", ended_at))

        await run(1, 1000, 1500)
        await run(2, 1100, 1600)
        await run(3, 1200, None)  # still open (its task runs on): stays whatever its age
        await run(4, 1300, CUTOFF + 1)  # ended recently

        assert await runs.prune_ended(CUTOFF, 1) == 1  # the oldest first
        assert await runs.prune_ended(CUTOFF, 100) == 1
        assert await runs.prune_ended(CUTOFF, 100) == 0
        assert [await runs.get_run(tid(n)) is not None for n in (1, 2, 3, 4)] == [False, False, True, True]
        rt = SimpleNamespace(store=store, closing=False, tasks_cfg=SimpleNamespace(finished_task_retention_ms=1))
        await run(5, 1400, 1700)
        pruned = await HistoryRetention(rt, batch=10, runs=runs).prune_once(CUTOFF + 1)  # type: ignore[arg-type]
        assert pruned.cron_runs == 1 and await runs.get_run(tid(5)) is None
    finally:
        db.close()


def note(n: int, created_at: int, channel: str | None = "hook") -> Notification:
    return Notification(
        notification_id=tid(n),
        agent_id="a",
        session_id="s",
        kind=Kind.TASK_COMPLETED,
        task_id=tid(100 + n),
        text=f"task {n} done",
        created_at=created_at,
        channel=channel,
        key=f"task-{n}:completed",
    )


async def test_notifications_done_with_go_with_their_attempts_and_the_conversation_keeps_its_messages(
    db_url: str,
) -> None:
    db = Database(db_url, NOTIFIER_MIGRATIONS)
    db.migrate()
    try:
        store = NotifierStore(db)
        backoff = Backoff(initial_ms=10, max_ms=10)
        failed, delivered = (
            DeliveryAttempt(at=1100, outcome=o, http_status=c)
            for o, c in ((Outcome.FAILED, 500), (Outcome.DELIVERED, 200))
        )
        await store.enqueue(note(1, 1000, channel=None), tid(201))  # no channel: delivered to the conversation at once
        await store.enqueue(note(2, 1000), tid(202))  # still being retried: kept
        await store.record_attempt(tid(2), failed, backoff)
        await store.enqueue(note(3, 1000), tid(203))  # delivered on its second attempt
        await store.record_attempt(tid(3), failed, backoff)
        await store.record_attempt(tid(3), delivered, backoff)
        await store.enqueue(note(4, 1000), tid(204))  # stopped: the next user message takes it up
        await store.stop("a", "s", tid(4))
        await store.enqueue(note(5, CUTOFF + 1, channel=None), tid(205))  # delivered, but recent

        assert await store.prune_notifications(CUTOFF) == NotificationsPruned(notifications=2, attempts=2)
        _, left = await store.list_notifications("a", "s", None, 0, 10)
        assert sorted(n.notification_id for n in left) == [tid(2), tid(4), tid(5)]
        assert count(db, "delivery_attempts") == 1  # the pending one's

        await store.add_user_message(
            Message(message_id=tid(300), agent_id="a", session_id="s", role="user", text="and?", created_at=2000)
        )
        assert await store.prune_notifications(CUTOFF) == NotificationsPruned(notifications=1, attempts=0)
        _, left = await store.list_notifications("a", "s", None, 0, 10)
        assert sorted(n.notification_id for n in left) == [tid(2), tid(5)]
        # The conversation's history keeps every report it showed.
        _, messages = await store.list_messages("a", "s", 0, 100)
        assert {m.notification_id for m in messages if m.role == "notification"} >= {tid(1), tid(3), tid(4)}
    finally:
        db.close()


async def test_a_notification_pass_deletes_batch_after_batch(db_url: str) -> None:
    db = Database(db_url, NOTIFIER_MIGRATIONS)
    db.migrate()
    try:
        store = NotifierStore(db)
        for n in range(1, 8):
            await store.enqueue(note(n, 1000 + n, channel=None), tid(200 + n))
        day = 86_400_000
        retention = NotificationRetention(store, retention_ms=day, clock=SystemClock(), batch=3)
        assert await retention.prune_once(day + 1003) == NotificationsPrunedTotal(
            notifications=2, attempts=0, batches=1
        )
        assert await retention.prune_once(2 * day) == NotificationsPrunedTotal(notifications=5, attempts=0, batches=2)
        assert count(db, "notifications") == 0
    finally:
        db.close()


async def test_conversation_history_older_than_the_cutoff_goes_and_a_streaming_response_stays(db_url: str) -> None:
    db = Database(db_url, NOTIFIER_MIGRATIONS)
    db.migrate()
    try:
        store = NotifierStore(db)

        def said(n: int, at: int) -> Message:
            return Message(message_id=tid(n), agent_id="a", session_id="s", role="user", text=f"m{n}", created_at=at)

        def answer(rid: str, at: int, final: bool = True) -> Response:
            return Response(
                agent_id="a", session_id="s", response_id=rid, text=rid, final=final, created_at=at, updated_at=at
            )

        await store.add_user_message(said(1, 1000))
        await store.enqueue(note(2, 1000, channel=None), tid(402))  # its history message, at once
        await store.publish(answer("old-final", 1000))  # a history message and a final snapshot
        await store.publish(answer("streaming", 1000, final=False))  # no message yet: stays whatever its age
        await store.add_reply(
            Message(
                message_id=tid(5),
                agent_id="a",
                session_id="s",
                role="assistant",
                text="re",
                notification_id=tid(2),
                created_at=1100,
            ),
            answer("reply", 1100),
            ConversationEvent(kind="task.follow_up", at=1100, data={"taskId": tid(102)}),
        )
        await store.add_user_message(said(6, CUTOFF + 1))  # recent: all of these stay
        await store.publish(answer("new-final", CUTOFF + 1))

        pruned = await store.prune_conversations(CUTOFF)
        assert pruned == ConversationsPruned(messages=4, responses=1, events=1)
        _, left = await store.list_messages("a", "s", 0, 100)
        assert [m.text for m in left] == ["m6", "new-final"]
        _, events = await store.list_events("a", "s", 0, 100)
        assert events == []
        assert [f.snapshot.response_id for f in await store.open_responses("a", "s") if f.snapshot] == ["streaming"]
        assert count(db, "responses") == 2  # the streaming one and the recent final one
        assert count(db, "notifications") == 1  # the notifications have their own retention
        assert await store.prune_conversations(CUTOFF) == ConversationsPruned(messages=0, responses=0, events=0)
    finally:
        db.close()


async def test_a_conversation_pass_deletes_batch_after_batch(db_url: str) -> None:
    db = Database(db_url, NOTIFIER_MIGRATIONS)
    db.migrate()
    try:
        store = NotifierStore(db)
        for n in range(1, 8):
            await store.add_user_message(
                Message(message_id=tid(n), agent_id="a", session_id="s", role="user", text="x", created_at=1000 + n)
            )
        day = 86_400_000
        retention = ConversationRetention(store, retention_ms=day, clock=SystemClock(), batch=3)
        assert await retention.prune_once(day + 1003) == ConversationsPrunedTotal(messages=2, batches=1)
        assert await retention.prune_once(2 * day) == ConversationsPrunedTotal(messages=5, batches=2)
        assert count(db, "messages") == 0
        assert await retention.prune_once(3 * day) == ConversationsPrunedTotal()
    finally:
        db.close()


async def test_settled_questions_reminder_rows_older_than_the_cutoff_go_and_open_ones_stay(db_url: str) -> None:
    db = Database(db_url, NOTIFIER_MIGRATIONS)
    db.migrate()
    try:
        rows = [  # (question, state, asked_at)
            (1, "answered", 1000),
            (2, "replaced", 1000),
            (3, "closed", 1000),
            (4, "open", 1000),  # still awaiting its answer: its reminders still come, whatever its age
            (5, "closed", CUTOFF + 1),  # recent
        ]
        with db.engine.begin() as conn:
            for n, state, asked_at in rows:
                conn.execute(
                    text(
                        "INSERT INTO question_reminders (question_id, agent_id, session_id, task_id, title, text,"
                        " state, asked_at, messages_since, reminders_sent, muted)"
                        " VALUES (:q, 'a', 's', :t, 'title', 'which?', :state, :at, 0, 0, false)"
                    ),
                    {"q": tid(n), "t": tid(100 + n), "state": state, "at": asked_at},
                )
        store = NotifierStore(db)
        assert await store.prune_conversations(CUTOFF) == ConversationsPruned(0, 0, 0, reminders=3)
        with db.engine.connect() as conn:
            left = sorted(conn.execute(text("SELECT question_id FROM question_reminders")).scalars())
        assert left == [tid(4), tid(5)]
        assert await store.prune_conversations(CUTOFF) == ConversationsPruned(0, 0, 0)
    finally:
        db.close()


async def asked_and_answered(store: PendingStore, task: str, at: int) -> list[str]:
    """Two revisions of ``task``'s question (the first replaced, the second answered): their ids."""
    first, _, _ = await store.ask_question(NewQuestion(task, "s", "first?"), at)
    second, _, _ = await store.ask_question(NewQuestion(task, "s", "second?"), at)
    await store.answer_question(AnswerAttempt(task, second.question_id, "yes", "alice"), at)
    return [first.question_id, second.question_id]


async def test_an_ended_tasks_questions_go_after_the_retention_and_the_others_stay(db_url: str) -> None:
    db = Database(db_url, PENDING_MIGRATIONS)
    db.migrate()
    try:
        store = PendingStore(db)
        ended = await asked_and_answered(store, tid(1), 1000)
        open_question, _, _ = await store.ask_question(NewQuestion(tid(1), "s", "third?"), 1000)
        running = await asked_and_answered(store, tid(2), 1000)  # never closed: stays whatever its age
        late = await asked_and_answered(store, tid(3), 1000)
        cancelled = await store.cancel_questions(tid(1), 2000)  # the task ended: its open one is cancelled
        assert [q.question_id for q in cancelled] == [open_question.question_id]
        await store.cancel_questions(tid(1), 4000)  # a retried close keeps the first time
        await store.cancel_questions(tid(3), CUTOFF + 1)  # ended recently

        assert await store.prune_closed(2000, 100) == QuestionsPruned(0, 0)  # closed at 2000: not before it
        assert await store.prune_closed(CUTOFF, 100) == QuestionsPruned(tasks=1, questions=3)
        for question_id in [*ended, open_question.question_id]:
            assert await store.get_question(question_id) is None
        for question_id in running + late:
            assert await store.get_question(question_id) is not None
        assert await store.prune_closed(CUTOFF, 100) == QuestionsPruned(0, 0)
        with db.engine.connect() as conn:
            assert list(conn.execute(text("SELECT task_id FROM closed_tasks")).scalars()) == [tid(3)]
        assert (await store.get_question(running[1])).state == QuestionState.ANSWERED  # type: ignore[union-attr]
    finally:
        db.close()


async def test_a_question_pass_deletes_batch_after_batch(db_url: str) -> None:
    db = Database(db_url, PENDING_MIGRATIONS)
    db.migrate()
    try:
        store = PendingStore(db)
        for n in range(1, 8):
            await asked_and_answered(store, tid(n), 1000)
            await store.cancel_questions(tid(n), 1000 + n)
        day = 86_400_000
        retention = QuestionRetention(store, retention_ms=day, clock=SystemClock(), batch=3)
        assert await retention.prune_once(day + 1003) == QuestionsPrunedTotal(tasks=2, questions=4, batches=1)
        assert await retention.prune_once(2 * day) == QuestionsPrunedTotal(tasks=5, questions=10, batches=2)
        assert count(db, "questions") == 0
        assert await retention.prune_once(3 * day) == QuestionsPrunedTotal()
    finally:
        db.close()


PRUNER = """
import asyncio, sys
from libs.db import Database
from services.scheduler.store import MIGRATIONS, SchedulerStore

async def main() -> None:
    store = SchedulerStore(Database(sys.argv[1], MIGRATIONS))
    while (await store.prune_finished(int(sys.argv[2]), 50)).tasks:
        print("batch", flush=True)

asyncio.run(main())
"""


async def test_a_pass_killed_midway_leaves_whole_tasks_and_the_next_one_finishes(db_url: str) -> None:
    """SIGKILL a process pruning back to back (no pauses): every batch is one transaction, so
    tasks went in whole batches, each one left keeps its event and attempt, and nothing points
    at a deleted task."""
    db = Database(db_url, MIGRATIONS)
    db.migrate()
    try:
        store = SchedulerStore(db)
        total = 4000
        for start in range(0, total, 500):
            chunk = range(start, start + 500)
            await asyncio.gather(
                *(store.create_task(make_task(tid(n), state=State.COMPLETED, created_at=1000 + n)) for n in chunk)
            )
            await store.save_attempts(
                [
                    Attempt(attempt_id=tid(n), task_id=tid(n), number=1, boot_id="b", token_hash=f"{n:064x}")
                    for n in chunk
                ]
            )
        await store.create_task(make_task(tid(total), created_at=9000))  # the log's newest event

        pruner = subprocess.Popen(
            [sys.executable, "-c", PRUNER, db_url, str(CUTOFF)], cwd=REPO, stdout=subprocess.PIPE, text=True
        )
        assert pruner.stdout is not None
        for _ in range(3):
            assert pruner.stdout.readline() == "batch\n"
        pruner.send_signal(signal.SIGKILL)
        pruner.wait(timeout=30)

        left = count(db, "tasks") - 1
        assert 0 < left <= total - 150 and (total - left) % 50 == 0, left
        with db.engine.connect() as conn:
            for orphans in (
                "SELECT count(*) FROM tasks t"
                " WHERE NOT EXISTS (SELECT 1 FROM task_events e WHERE e.task_id = t.task_id)",
                "SELECT count(*) FROM tasks t WHERE t.state = 'completed'"
                " AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.task_id = t.task_id)",
                "SELECT count(*) FROM task_events e"
                " WHERE NOT EXISTS (SELECT 1 FROM tasks t WHERE t.task_id = e.task_id)",
                "SELECT count(*) FROM attempts a WHERE NOT EXISTS (SELECT 1 FROM tasks t WHERE t.task_id = a.task_id)",
            ):
                assert conn.execute(text(orphans)).scalar_one() == 0, orphans
        while (await store.prune_finished(CUTOFF)).tasks:
            pass
        assert count(db, "tasks") == 1 and count(db, "attempts") == 0
    finally:
        db.close()


CONVERSATION_PRUNER = """
import asyncio, sys
from libs.db import Database
from services.notifier.store import MIGRATIONS, NotifierStore

async def main() -> None:
    store = NotifierStore(Database(sys.argv[1], MIGRATIONS))
    while (await store.prune_conversations(int(sys.argv[2]), 50)).messages:
        print("batch", flush=True)

asyncio.run(main())
"""


async def test_a_conversation_pass_killed_midway_leaves_each_answer_whole(db_url: str) -> None:
    """SIGKILL a process pruning history back to back: messages went in whole batches, and every
    final response kept has its message and every answer's message its response (both go in one
    transaction); the next pass finishes."""
    db = Database(db_url, NOTIFIER_MIGRATIONS)
    db.migrate()
    try:
        store = NotifierStore(db)
        total = 1200
        for start in range(0, total, 200):
            await asyncio.gather(
                *(
                    store.publish(
                        Response(
                            agent_id="a",
                            session_id=f"s{n % 7}",
                            response_id=f"r{n}",
                            text="answer",
                            final=True,
                            created_at=1000 + n,
                            updated_at=1000 + n,
                        )
                    )
                    for n in range(start, start + 200)
                )
            )
        pruner = subprocess.Popen(
            [sys.executable, "-c", CONVERSATION_PRUNER, db_url, str(CUTOFF)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert pruner.stdout is not None
        for _ in range(3):
            assert pruner.stdout.readline() == "batch\n"
        pruner.send_signal(signal.SIGKILL)
        pruner.wait(timeout=30)

        left = count(db, "messages")
        assert 0 < left <= total - 150 and (total - left) % 50 == 0, left
        with db.engine.connect() as conn:
            for halves in (
                "SELECT count(*) FROM responses r WHERE NOT EXISTS (SELECT 1 FROM messages m"
                " WHERE m.agent_id = r.agent_id AND m.session_id = r.session_id AND m.response_id = r.response_id)",
                "SELECT count(*) FROM messages m WHERE NOT EXISTS (SELECT 1 FROM responses r"
                " WHERE r.agent_id = m.agent_id AND r.session_id = m.session_id AND r.response_id = m.response_id)",
            ):
                assert conn.execute(text(halves)).scalar_one() == 0, halves
        while (await store.prune_conversations(CUTOFF)).messages:
            pass
        assert count(db, "messages") == 0 and count(db, "responses") == 0
    finally:
        db.close()


QUESTION_PRUNER = """
import asyncio, sys
from libs.db import Database
from services.pending_registry.store import MIGRATIONS, PendingStore

async def main() -> None:
    store = PendingStore(Database(sys.argv[1], MIGRATIONS))
    while (await store.prune_closed(int(sys.argv[2]), 50)).tasks:
        print("batch", flush=True)

asyncio.run(main())
"""


async def test_a_question_pass_killed_midway_leaves_each_task_whole(db_url: str) -> None:
    """SIGKILL a process pruning questions back to back: tasks went in whole batches, each with
    all its questions and its marker (one transaction), and the next pass finishes."""
    db = Database(db_url, PENDING_MIGRATIONS)
    db.migrate()
    try:
        store = PendingStore(db)
        total = 600
        for start in range(0, total, 200):
            await asyncio.gather(*(asked_and_answered(store, tid(n), 1000) for n in range(start, start + 200)))
            await asyncio.gather(*(store.cancel_questions(tid(n), 1000 + n) for n in range(start, start + 200)))
        pruner = subprocess.Popen(
            [sys.executable, "-c", QUESTION_PRUNER, db_url, str(CUTOFF)], cwd=REPO, stdout=subprocess.PIPE, text=True
        )
        assert pruner.stdout is not None
        for _ in range(3):
            assert pruner.stdout.readline() == "batch\n"
        pruner.send_signal(signal.SIGKILL)
        pruner.wait(timeout=30)

        left = count(db, "closed_tasks")
        assert 0 < left <= total - 150 and (total - left) % 50 == 0, left
        with db.engine.connect() as conn:
            per_task = conn.execute(text("SELECT task_id, count(*) FROM questions GROUP BY task_id")).all()
            marked = set(conn.execute(text("SELECT task_id FROM closed_tasks")).scalars())
        assert {task_id for task_id, _ in per_task} == marked  # a task's questions went with its marker
        assert {questions for _, questions in per_task} == {2}  # and all of them
        while (await store.prune_closed(CUTOFF, 100)).tasks:
            pass
        assert count(db, "questions") == 0 and count(db, "closed_tasks") == 0
    finally:
        db.close()
