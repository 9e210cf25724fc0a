"""Persistence on SQLite and on a throwaway PostgreSQL cluster: same code, same behaviour."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import inspect, text

from gateway_http import safemode  # noqa: F401 - registers the safemode table models
from gateway_http.convert import task_json
from gateway_http.store import MIGRATIONS as GATEWAY_MIGRATIONS
from gateway_http.store import GatewayStore
from libs.db import Database, Migration, migrate
from services.notifier.domain import Kind, Notification
from services.notifier.store import MIGRATIONS as NOTIFIER_MIGRATIONS
from services.notifier.store import NotifierStore
from services.scheduler.convert import task_to_pb
from services.scheduler.domain import Attempt, InvalidTransition, State, Task
from services.scheduler.store import MIGRATIONS as SCHEDULER_MIGRATIONS
from services.scheduler.store import SchedulerStore, TaskRow
from taskgate.scheduler.v1 import scheduler_pb2 as pb


def make_task(task_id: str, state: State = State.QUEUED, created_at: int = 1000, **kw: Any) -> Task:
    return Task(
        task_id=task_id,
        agent_id="a",
        session_id="s",
        title="t",
        instructions="i",
        profile="p",
        state=state,
        created_at=created_at,
        updated_at=created_at,
        **kw,
    )


def test_migrations_are_applied_once(db_url: str) -> None:
    db = Database(db_url, SCHEDULER_MIGRATIONS)
    try:
        assert db.migrate() == [1, 2, 3, 4, 5]
        assert db.migrate() == []
        tables = set(inspect(db.engine).get_table_names())
        assert {"tasks", "attempts", "task_events", "question_closes", "scheduler_hosts", "schema_migrations"} <= tables
    finally:
        db.close()


def test_a_failing_migration_leaves_nothing_half_written(db_url: str) -> None:
    db = Database(db_url)
    try:
        good = Migration(1, "good", ["CREATE TABLE good_one (a INTEGER)"])
        bad = Migration(2, "bad", ["CREATE TABLE half_done (a INTEGER)", "CREATE TABLE broken ("])
        migrate(db.engine, [good])
        with pytest.raises(Exception):  # noqa: B017 - the dialects raise different errors
            migrate(db.engine, [good, bad])
        tables = set(inspect(db.engine).get_table_names())
        assert "good_one" in tables and "half_done" not in tables
        with db.engine.connect() as conn:
            assert [r[0] for r in conn.execute(text("SELECT version FROM schema_migrations"))] == [1]
    finally:
        db.close()


async def test_create_is_idempotent_per_request_id(scheduler_db: Database) -> None:
    store = SchedulerStore(scheduler_db)
    first, event = await store.create_task(make_task("1" * 32, request_id="r1"))
    again, none = await store.create_task(make_task("2" * 32, request_id="r1"))
    assert event is not None and none is None and again.task_id == first.task_id


async def test_creates_stored_together_are_each_answered_as_create_task_would(scheduler_db: Database) -> None:
    """``create_tasks``: one group commit; each answer in order — a new task with its event, the
    earlier task for a request id already used (within the batch too), and a create that cannot
    be stored (its id taken) as its own error while the others are stored."""
    store = SchedulerStore(scheduler_db)
    await store.create_task(make_task("1" * 32, request_id="old"))
    transactions = store.group.transactions
    answers = await store.create_tasks(
        [
            make_task("2" * 32, request_id="new"),
            make_task("3" * 32, request_id="old"),
            make_task("1" * 32),  # the id is taken
            make_task("4" * 32, request_id="new"),
        ]
    )
    new, repeat, taken, repeat_in_batch = answers
    assert isinstance(new, tuple) and new[0].task_id == "2" * 32 and new[1] is not None
    assert isinstance(repeat, tuple) and repeat[0].task_id == "1" * 32 and repeat[1] is None
    assert isinstance(taken, Exception)
    assert isinstance(repeat_in_batch, tuple) and repeat_in_batch[0].task_id == "2" * 32 and repeat_in_batch[1] is None
    # One committed batch (run again isolated once the taken id failed; that create's own retry,
    # failing again, commits nothing).
    assert store.group.transactions - transactions == 1
    stored = await store.find_tasks(["2" * 32, "3" * 32, "4" * 32])
    assert set(stored) == {"2" * 32}


async def test_a_transition_appends_an_event_and_an_invalid_one_writes_nothing(scheduler_db: Database) -> None:
    store = SchedulerStore(scheduler_db)
    await store.create_task(make_task("1" * 32))

    def to_running(t: Task) -> Task:
        t.state = State.RUNNING
        return t

    task, event = await store.update_task("1" * 32, to_running, "task.state_changed", 2000)
    assert task.state == State.RUNNING and event is not None and event.type == "task.state_changed"

    def to_queued_with_junk(t: Task) -> Task:
        t.state = State.COMPLETED
        t.title = "changed"
        return t

    await store.update_task("1" * 32, lambda t: t.model_copy(update={"state": State.COMPLETED}), None, 3000)
    with pytest.raises(InvalidTransition):
        await store.update_task(
            "1" * 32, lambda t: t.model_copy(update={"state": State.RUNNING, "title": "x"}), "task.state_changed", 4000
        )
    stored = await store.get_task("1" * 32)
    assert stored.state == State.COMPLETED and stored.title == "t"
    with scheduler_db.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM task_events")).scalar() == 2


async def test_listing_pages_newest_first_and_hides_finished(scheduler_db: Database) -> None:
    store = SchedulerStore(scheduler_db)
    for i in range(5):
        state = State.COMPLETED if i == 0 else State.QUEUED
        await store.create_task(make_task(f"{i:032x}", state=state, created_at=1000 + i))
    total, tasks = await store.list_tasks("a", "s", False, 0, 3, lambda total: 0)
    assert total == 4 and [t.task_id for t in tasks] == [f"{i:032x}" for i in (4, 3, 2)]
    total, tasks = await store.list_tasks("a", "s", True, 1, 3, lambda total: 1)
    assert total == 5 and [t.task_id for t in tasks] == [f"{i:032x}" for i in (1, 0)]


async def test_the_default_list_pages_the_unfinished_tasks_among_a_long_history(scheduler_db: Database) -> None:
    store = SchedulerStore(scheduler_db)
    # Unfinished tasks older than most of the finished ones, and two with one created_at (task id breaks ties).
    for i in range(30):
        state = State.RUNNING if i in (2, 5, 6, 20) else State.COMPLETED
        await store.create_task(make_task(f"{i:032x}", state=state, created_at=1000 + (5 if i == 6 else i)))
    total, tasks = await store.list_tasks("a", "s", False, 0, 3, lambda total: 0)
    assert total == 4 and [t.task_id for t in tasks] == [f"{i:032x}" for i in (20, 6, 5)]
    total, tasks = await store.list_tasks("a", "s", False, 1, 3, lambda total: 1)
    assert total == 4 and [t.task_id for t in tasks] == [f"{2:032x}"]
    assert await store.list_tasks("a", "other", False, 0, 3, lambda total: 0) == (0, [])


async def test_attempts_are_saved_and_updated(scheduler_db: Database) -> None:
    store = SchedulerStore(scheduler_db)
    await store.create_task(make_task("1" * 32))
    attempt = Attempt(attempt_id="a" * 32, task_id="1" * 32, number=1, boot_id="b", token_hash="h" * 64)
    await store.save_attempt(attempt)
    attempt.pid = 42
    await store.save_attempt(attempt)
    stored = await store.attempts_of("1" * 32)
    assert [(a.attempt_id, a.pid) for a in stored] == [("a" * 32, 42)]


async def test_a_launch_begins_with_the_claimed_task_and_its_earlier_attempts_in_order(scheduler_db: Database) -> None:
    store = SchedulerStore(scheduler_db, "h1")
    await store.create_task(make_task("1" * 32))
    for number in (2, 1):  # saved out of order: read back by number
        await store.save_attempt(
            Attempt(
                attempt_id=str(number) * 32, task_id="1" * 32, number=number, boot_id="b", token_hash=f"{number}" * 64
            )
        )
    seen: list[tuple[Task, list[Attempt]]] = []

    def plan(task: Task, previous: list[Attempt]) -> Attempt:
        seen.append((task, previous))
        return Attempt(
            attempt_id="3" * 32, task_id=task.task_id, number=len(previous) + 1, boot_id="b", token_hash="3" * 64
        )

    assert await store.begin_launch("1" * 32, plan) is None, "not claimed by this host yet: no launch"
    assert await store.claim_queued(1, (), any_owner=False) == ["1" * 32]
    begun = await store.begin_launch("1" * 32, plan)
    assert begun is not None
    task, previous, attempt = begun
    assert task.owner_host == "h1" and [a.number for a in previous] == [1, 2]
    assert attempt is not None and attempt.number == 3
    assert [a.number for a in await store.attempts_of("1" * 32)] == [1, 2, 3]
    assert await store.begin_launch("f" * 32, plan) is None  # no such task
    assert len(seen) == 1


async def test_a_task_s_detail_reads_its_attempts_and_its_tree_level_by_level(scheduler_db: Database) -> None:
    store = SchedulerStore(scheduler_db)
    root, a, b, a1, a1x = ("1" * 32, "2" * 32, "3" * 32, "4" * 32, "5" * 32)
    await store.create_task(make_task(root))
    await store.save_attempt(Attempt(attempt_id="a" * 32, task_id=root, number=1, boot_id="b", token_hash="h" * 64))
    # b is created before a: each level comes oldest first, whatever the ids say.
    await store.create_task(make_task(b, created_at=1001, parent_task_id=root, root_task_id=root, depth=1))
    await store.create_task(make_task(a, created_at=1002, parent_task_id=root, root_task_id=root, depth=1))
    await store.create_task(make_task(a1, created_at=1003, parent_task_id=a, root_task_id=root, depth=2))
    await store.create_task(make_task(a1x, created_at=1004, parent_task_id=a1, root_task_id=root, depth=3))

    task, attempts, levels = await store.task_detail(root, depth=5)
    assert task.task_id == root and [x.number for x in attempts] == [1]
    assert [[t.task_id for t in level] for level in levels] == [[b, a], [a1], [a1x]]
    # At most depth + 1 levels below the task: the last one is never read.
    _, _, levels = await store.task_detail(root, depth=1)
    assert [[t.task_id for t in level] for level in levels] == [[b, a], [a1]]
    # A leaf has no levels; an unknown task is TASK_NOT_FOUND.
    assert (await store.task_detail(a1x, depth=5))[2] == []
    with pytest.raises(Exception, match="no task"):
        await store.task_detail("6" * 32, depth=5)


async def test_a_row_written_by_an_older_version_still_reads(scheduler_db: Database) -> None:
    old_doc = {
        "task_id": "9" * 32,
        "agent_id": "a",
        "session_id": "s",
        "title": "old",
        "instructions": "",
        "profile": "default-worker",
        "state": "failed",
        "created_at": 1,
        "updated_at": 2,
    }
    with scheduler_db.session() as s, s.begin():
        s.add(
            TaskRow(
                task_id="9" * 32,
                agent_id="a",
                session_id="s",
                state="failed",
                created_at=1,
                updated_at=2,
                doc=json.dumps(old_doc),
            )
        )
    task = await SchedulerStore(scheduler_db).get_task("9" * 32)
    assert task.title == "old" and task.recent_tools == [] and task.restart_resume is None
    # Written before gateway-managed tasks, continuation, skills and trees: a plain worker task.
    assert task.execution_type == "worker" and not task.gateway_managed and task.gateway_target is None
    assert task.parent_task_id is None and task.skill is None and task.continued_by_task_id is None
    snapshot = task_to_pb(task, 3)
    assert snapshot.execution_type == pb.EXECUTION_TYPE_WORKER and not snapshot.HasField("gateway_target")
    assert task_json(snapshot)["executionType"] == "worker" and "gatewayTarget" not in task_json(snapshot)


def test_gateway_keys_are_stored_hashed_and_revocable(db_url: str) -> None:
    db = Database(db_url, GATEWAY_MIGRATIONS)
    db.migrate()
    try:
        with db.session() as s, s.begin():
            key, secret = GatewayStore.create_key(s, "alice", ["agent-1"], None)
        with db.engine.connect() as conn:
            stored = conn.execute(text("SELECT key_hash, display_prefix FROM api_keys")).one()
        assert secret not in stored[0] and stored[0] != secret and secret.startswith(stored[1])
        with db.session() as s, s.begin():
            found = GatewayStore.find_key(s, secret)
            assert found is not None and found.agents == ("agent-1",) and found.allows_tool("task_cancel")
            assert GatewayStore.find_key(s, secret + "x") is None
            assert GatewayStore.add_member(s, "agent-1", "cli-1", "alice")
            assert not GatewayStore.add_member(s, "agent-1", "cli-1", "alice")
            assert GatewayStore.revoke_key(s, key.key_id)
        with db.session() as s, s.begin():
            assert GatewayStore.find_key(s, secret) is None
            assert GatewayStore.is_member(s, "agent-1", "cli-1", "alice")
    finally:
        db.close()


async def test_notifications_enqueue_once_per_key(db_url: str) -> None:
    db = Database(db_url, NOTIFIER_MIGRATIONS)
    db.migrate()
    try:
        store = NotifierStore(db)
        n = Notification(
            notification_id="1" * 32,
            agent_id="a",
            session_id="s",
            kind=Kind.TASK_COMPLETED,
            text="done",
            created_at=1,
            key="task-1:completed",
        )
        await store.enqueue(n, "m" * 32)
        again, frame = await store.enqueue(n.model_copy(update={"notification_id": "2" * 32}), "n" * 32)
        assert again.notification_id == "1" * 32 and frame is None
        _, listed = await store.list_notifications("a", "s", None, 0, 10)
        assert [x.notification_id for x in listed] == ["1" * 32]
    finally:
        db.close()


@pytest.mark.parametrize(
    ("migrations", "models"),
    [
        (SCHEDULER_MIGRATIONS, ["tasks", "attempts", "task_events"]),
        (GATEWAY_MIGRATIONS, ["api_keys", "memberships", "safemode_grants", "safemode_assignments"]),
        (
            NOTIFIER_MIGRATIONS,
            ["notifications", "delivery_attempts", "messages", "responses", "activity", "conversation_events"],
        ),
    ],
)
def test_table_models_match_the_migrated_schema(db_url: str, migrations: list[Migration], models: list[str]) -> None:
    from sqlmodel import SQLModel

    db = Database(db_url, migrations)
    db.migrate()
    try:
        inspector = inspect(db.engine)
        for table in models:
            migrated = {c["name"] for c in inspector.get_columns(table)}
            modelled = {c.name for c in SQLModel.metadata.tables[table].columns}
            assert migrated == modelled, table
    finally:
        db.close()


def _add_path(path: str) -> Callable[[Task], Task]:
    """A change that adds ``path`` to the task's observed paths (each change visible in the result)."""

    def change(t: Task) -> Task:
        t.observed_paths = [*t.observed_paths, path]
        return t

    return change


async def test_concurrent_changes_of_one_task_are_not_lost(scheduler_db: Database) -> None:
    import asyncio

    store = SchedulerStore(scheduler_db)
    await store.create_task(make_task("1" * 32))

    await asyncio.gather(*(store.update_task("1" * 32, _add_path(f"p{i}"), None, 1) for i in range(40)))
    stored = await store.get_task("1" * 32)
    assert sorted(stored.observed_paths) == sorted(f"p{i}" for i in range(40))


async def test_concurrent_creates_with_one_request_id_make_one_task(scheduler_db: Database) -> None:
    import asyncio

    store = SchedulerStore(scheduler_db)
    results = await asyncio.gather(*(store.create_task(make_task(f"{i:032x}", request_id="same")) for i in range(8)))
    assert len({task.task_id for task, _ in results}) == 1
    assert sum(1 for _, event in results if event is not None) == 1


async def test_a_create_that_loses_the_request_id_race_returns_the_winners_task(
    db_url: str, scheduler_db: Database
) -> None:
    """Another replica's create with the same request id is in flight (inserted, not committed):
    on PostgreSQL this create's insert waits on the unique index and then fails; it must return
    the winner's task, not the driver's unique-violation error."""
    import asyncio

    from sqlalchemy import text

    from services.scheduler.group_commit import Tx
    from services.scheduler.store import _write_task

    store = SchedulerStore(scheduler_db)
    other = Database(db_url, SCHEDULER_MIGRATIONS)
    try:
        with other.engine.connect() as conn:
            held = conn.begin()
            _write_task(Tx(conn), make_task("a" * 32, request_id="raced"), new=True)
            create = asyncio.create_task(store.create_task(make_task("b" * 32, request_id="raced")))
            if other.engine.dialect.name == "postgresql":
                # Until this create's insert waits on the winner's index entry (SQLite's writers
                # wait for the lock before they read, so there it sees the winner's row instead).
                with other.engine.connect() as probe:
                    for _ in range(200):
                        waiting = probe.execute(
                            text(
                                "SELECT count(*) FROM pg_stat_activity"
                                " WHERE datname = current_database() AND wait_event_type = 'Lock'"
                            )
                        ).scalar_one()
                        if waiting:
                            break
                        await asyncio.sleep(0.05)
                    assert waiting, "the create never reached the unique index"
            held.commit()
        async with asyncio.timeout(30):
            task, event = await create
        assert task.task_id == "a" * 32 and event is None
    finally:
        other.close()


async def test_a_group_commit_keeps_each_change_whole_and_a_refused_one_out(scheduler_db: Database) -> None:
    import asyncio

    store = SchedulerStore(scheduler_db)
    ids = [f"{i:032x}" for i in range(1, 31)]
    for task_id in ids:
        await store.create_task(make_task(task_id))
    before = store.group.transactions

    def to(state: State) -> Callable[[Task], Task]:
        def change(t: Task) -> Task:
            t.state = state
            return t

        return change

    # 29 valid transitions and one refused one (queued -> completed), all at once.
    results = await asyncio.gather(
        *(
            store.update_task(t, to(State.COMPLETED if t == ids[7] else State.RUNNING), "task.state_changed", 5)
            for t in ids
        ),
        store.update_task("f" * 32, to(State.RUNNING), "task.state_changed", 5),  # no such task
        return_exceptions=True,
    )
    assert isinstance(results[7], InvalidTransition)
    assert type(results[-1]).__name__ == "TaskNotFound"
    assert all(isinstance(r, tuple) and r[1] is not None for i, r in enumerate(results[:-1]) if i != 7)
    # Shared transactions: fewer commits than changes.
    assert store.group.transactions - before < len(ids)
    for i, task_id in enumerate(ids):
        task, attempts = await store.task_with_attempts(task_id)
        assert task.state == (State.QUEUED if i == 7 else State.RUNNING)
    with scheduler_db.engine.connect() as conn:
        per_task: dict[str, int] = dict(
            conn.execute(text("SELECT task_id, COUNT(*) FROM task_events GROUP BY task_id")).all()
        )
    # The refused change left no event behind; every other task has its creation and its start.
    assert per_task[ids[7]] == 1
    assert all(per_task[t] == 2 for t in ids if t != ids[7])


async def test_a_session_s_unfinished_tasks_are_read_through_the_session_state_index(scheduler_db: Database) -> None:
    store = SchedulerStore(scheduler_db)
    for i in range(6):
        state = State.COMPLETED if i % 3 == 0 else State.QUEUED
        await store.create_task(make_task(f"{i:032x}", state=state, created_at=1000 + i))
    other = make_task("e" * 32)
    other.session_id = "elsewhere"
    await store.create_task(other)
    live = [s for s in State if s not in {State.COMPLETED, State.FAILED, State.CANCELLED}]
    tasks = await store.tasks_in_states(live, session=("a", "s"))
    assert [t.task_id for t in tasks] == [f"{i:032x}" for i in (1, 2, 4, 5)]
    if scheduler_db.engine.dialect.name == "sqlite":
        from services.scheduler.store import UNFINISHED

        marks = ",".join("?" * len(UNFINISHED))
        with scheduler_db.engine.connect() as conn:
            plan = conn.exec_driver_sql(
                "EXPLAIN QUERY PLAN SELECT count(*) FROM tasks WHERE agent_id = ? AND session_id = ?"
                f" AND state IN ({marks})",
                ("a", "s", *UNFINISHED),
            ).all()
        assert "ix_tasks_session_state" in " ".join(str(row) for row in plan)


async def test_a_change_after_the_server_dropped_its_connections_still_commits(db_url: str) -> None:
    """PostgreSQL restarts (here: every backend of the database terminated) must not cost the
    next change: the pool's pre-ping replaces a dead connection before any work is done on it."""
    import psycopg

    db = Database(db_url, SCHEDULER_MIGRATIONS)
    db.migrate()
    store = SchedulerStore(db)
    try:
        await store.create_task(make_task("t1"))
        if db_url.startswith("postgresql"):
            name = db_url.rsplit("/", 1)[1]
            with psycopg.connect(db_url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as admin:
                killed = admin.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                    " WHERE datname = %s AND pid <> pg_backend_pid()",
                    (name,),
                ).fetchone()
                assert killed is not None and killed[0] >= 1, "the store held a connection to drop"
                # pg_terminate_backend only signals: wait until the backends are gone, or the
                # next change's pre-ping may still find one alive that dies right after it.
                deadline = time.monotonic() + 30
                while admin.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (name,)).fetchone() != (
                    0,
                ):
                    assert time.monotonic() < deadline, "the backends outlived pg_terminate_backend"
                    time.sleep(0.01)
        task, stored = await store.create_task(make_task("t2"))
        assert stored is not None and (await store.get_task("t2")).task_id == "t2"
    finally:
        db.close()


async def test_the_event_log_gives_each_event_its_own_task_as_recorded(scheduler_db: Database) -> None:
    """A read that holds several events of one task (a burst: created, asked, running, done)
    parses the task once, yet every event keeps the state and question it recorded, and the
    read with gaps to look at again (another statement) returns the same events."""
    from services.scheduler.domain import PendingQuestion

    store = SchedulerStore(scheduler_db)
    other, _ = await store.create_task(make_task("2" * 32))
    await store.create_task(make_task("1" * 32))

    def change(state: State, question: PendingQuestion | None) -> Callable[[Task], Task]:
        def apply(t: Task) -> Task:
            t.state, t.pending_question = state, question
            return t

        return apply

    asked = PendingQuestion(question_id="q1", text="which branch?", revision=1)
    await store.update_task("1" * 32, change(State.RUNNING, None), "task.state_changed", 2000)
    await store.update_task("1" * 32, change(State.WAITING_INPUT, asked), "task.question", 3000)
    await store.update_task("1" * 32, change(State.RUNNING, None), "task.state_changed", 4000)
    await store.update_task("1" * 32, change(State.COMPLETED, None), "task.state_changed", 5000)

    ids, events = await store.events_after(0, (), 500)
    assert ids == sorted(ids) and len(ids) == 6
    mine = [e for e in events if e.task.task_id == "1" * 32]
    assert [(e.type, e.task.state) for e in mine] == [
        ("task.state_changed", State.QUEUED),
        ("task.state_changed", State.RUNNING),
        ("task.question", State.WAITING_INPUT),
        ("task.state_changed", State.RUNNING),
        ("task.state_changed", State.COMPLETED),
    ]
    assert mine[2].task.pending_question == asked, "the question as asked, though it is gone now"
    assert all(e.task.pending_question is None for i, e in enumerate(mine) if i != 2)
    assert len({id(e.task) for e in mine}) == len(mine), "each event its own task object"
    assert all(e.task.version == 4 for e in mine), "the task as it is now"
    assert [e.task.task_id for e in events if e.task.task_id != "1" * 32] == [other.task_id]

    # Only the wanted types; every id read is still returned (gaps are judged from them).
    ids_q, questions = await store.events_after(0, {"task.question"}, 500)
    assert ids_q == ids and [e.type for e in questions] == ["task.question"]
    # After a cursor, with ids to look at again: the other statement, the same events.
    ids_r, again = await store.events_after(ids[3], (), 500, recheck=[ids[1]])
    assert ids_r == [ids[1], *ids[4:]]
    assert [(e.id, e.type, e.task.state, e.task.pending_question) for e in again] == [
        (e.id, e.type, e.task.state, e.task.pending_question) for e in events if e.id in ids_r
    ]
    # A limit cuts the read.
    ids_l, _ = await store.events_after(0, (), 2)
    assert ids_l == ids[:2]


async def test_an_ending_change_says_whether_it_left_the_question_closer_work(scheduler_db: Database) -> None:
    """The closer is woken (``Runtime.published``) only by a change that committed a
    question-close row: a task known never to have asked ends without one. What it knows is in
    the task's row (``may_have_asked``), so another store on the database — a replica, this
    scheduler after a restart — knows it as well."""
    store = SchedulerStore(scheduler_db)
    await store.create_task(make_task("1" * 32, state=State.RUNNING, may_have_asked=False))
    await store.create_task(make_task("2" * 32, state=State.RUNNING, may_have_asked=False))
    asking = await store.get_task("2" * 32)
    marked = await store.mark_may_have_asked(asking, 4000)
    assert marked.may_have_asked and marked.updated_at == asking.updated_at, "an internal mark, not a change shown"
    store = SchedulerStore(scheduler_db)  # the task ends elsewhere: nothing carried over in memory

    def done(t: Task) -> Task:
        t.state = State.COMPLETED
        return t

    _, quiet = await store.update_task("1" * 32, done, "task.state_changed", 5000)
    _, asked = await store.update_task("2" * 32, done, "task.state_changed", 5000)
    assert quiet is not None and not quiet.closes_questions
    assert asked is not None and asked.closes_questions and asked.previous == State.RUNNING
    assert await store.due_question_closes(5000) == [("2" * 32, 0)]


async def test_a_unit_that_fails_after_writing_rolls_back_alone_in_a_shared_transaction(
    scheduler_db: Database,
) -> None:
    """Units that share one transaction (and one trip to the database thread) each commit
    whole: one that wrote and then failed leaves nothing, the others all commit."""
    import asyncio

    from prometheus_client import REGISTRY

    from services.scheduler.group_commit import Tx
    from services.scheduler.store import _write_task

    def counted(name: str) -> float:
        return REGISTRY.get_sample_value(name) or 0.0

    store = SchedulerStore(scheduler_db)
    ids = [f"{i:032x}" for i in range(1, 9)]
    for task_id in ids:
        await store.create_task(make_task(task_id))
    before = store.group.transactions
    batches, reruns = counted("taskgate_group_commit_batches_total"), counted("taskgate_group_commit_reruns_total")

    def retitle(task_id: str, fail: bool) -> Callable[[Tx], str]:
        def unit(tx: Tx) -> str:
            task = make_task(task_id)
            task.title = "renamed"
            _write_task(tx, task)
            if fail:
                raise RuntimeError("refused after writing")
            return task_id

        return unit

    results = await asyncio.gather(
        *(store.group.run(retitle(t, fail=i == 3)) for i, t in enumerate(ids)), return_exceptions=True
    )
    assert store.group.transactions - before == 1, "one transaction for the whole burst"
    # The burst ran without savepoints first, then again with each unit isolated.
    assert store.group.reruns == 1
    assert counted("taskgate_group_commit_batches_total") == batches + 1
    assert counted("taskgate_group_commit_reruns_total") == reruns + store.group.reruns
    assert isinstance(results[3], RuntimeError)
    assert [r for i, r in enumerate(results) if i != 3] == [t for i, t in enumerate(ids) if i != 3]
    titles = {t: (await store.get_task(t)).title for t in ids}
    assert titles == {t: ("t" if i == 3 else "renamed") for i, t in enumerate(ids)}


async def test_the_next_batch_commits_while_the_event_loop_is_busy(scheduler_db: Database) -> None:
    """Units queued while a batch commits go in the next transaction straight away, on the
    database thread: the event loop does not have to take the first batch's outcomes and hand
    the next batch over (under load that round trip stretched every cycle of the database).
    The loop is blocked here until the second unit has run, so this fails if the loop is needed.
    (On SQLite a batch may commit on the loop itself while the thread is idle: that path is
    tests/unit/scheduler/test_group_commit_on_loop.py; here the batches go to the thread.)"""
    import asyncio
    import threading

    from services.scheduler.group_commit import GroupCommit

    group = GroupCommit(scheduler_db, on_loop=False)
    first_runs, go_on, second_ran = threading.Event(), threading.Event(), threading.Event()

    def first(tx: object) -> str:
        first_runs.set()
        assert go_on.wait(10)
        return "first"

    def second(tx: object) -> str:
        second_ran.set()
        return "second"

    one = asyncio.ensure_future(group.run(first))
    assert await asyncio.to_thread(first_runs.wait, 10)
    two = asyncio.ensure_future(group.run(second))
    await asyncio.sleep(0)  # queued behind the batch on the database thread
    go_on.set()
    # The event loop is blocked from here on: nothing of it runs until the wait ends.
    assert second_ran.wait(10), "the second batch waited for the event loop"
    assert await one == "first" and await two == "second"
    assert group.transactions == 2


async def test_other_database_work_goes_between_the_group_commits_batches(scheduler_db: Database) -> None:
    """A steady stream of units does not starve the other work of the database's threads
    (log reads, lone transactions): what was queued meanwhile runs before the next batch."""
    import asyncio
    import threading

    from services.scheduler.group_commit import GroupCommit

    group = GroupCommit(scheduler_db, on_loop=False)
    order: list[str] = []
    first_runs, go_on = threading.Event(), threading.Event()

    def first(tx: object) -> None:
        first_runs.set()
        assert go_on.wait(10)
        order.append("first batch")

    one = asyncio.ensure_future(group.run(first))
    assert await asyncio.to_thread(first_runs.wait, 10)
    two = asyncio.ensure_future(group.run(lambda tx: order.append("next batch")))
    await asyncio.sleep(0)
    read = asyncio.ensure_future(scheduler_db.threads.run(lambda: order.append("a read")))
    await asyncio.sleep(0)
    go_on.set()
    await asyncio.gather(one, two, read)
    if scheduler_db.threads.workers == 1:  # SQLite: one thread, so the order is the rule's alone
        assert order == ["first batch", "a read", "next batch"]
    else:  # PostgreSQL: the read has threads of its own; the batches keep their order
        assert sorted(order) == ["a read", "first batch", "next batch"]
        assert order.index("first batch") < order.index("next batch")


async def test_units_queued_when_the_database_is_closed_fail_instead_of_waiting(scheduler_db: Database) -> None:
    import asyncio

    from services.scheduler.group_commit import GroupCommit

    group = GroupCommit(scheduler_db)
    assert await group.run(lambda tx: "before") == "before"
    scheduler_db.threads.close()
    with pytest.raises(RuntimeError, match="closed"):
        await asyncio.wait_for(group.run(lambda tx: "after"), 10)


async def test_the_database_threads_cpu_is_counted_by_store_call(scheduler_db: Database) -> None:
    """Each unit a store call runs counts once under its call's name, with the database
    thread's CPU inside it; a refused change counts too (it ran)."""
    from prometheus_client import REGISTRY

    def sample(name: str, unit: str) -> float:
        return REGISTRY.get_sample_value(name, {"unit": unit}) or 0.0

    def counts(unit: str) -> tuple[float, float]:
        return sample("taskgate_store_units_total", unit), sample("taskgate_store_unit_cpu_seconds_total", unit)

    store = SchedulerStore(scheduler_db)
    created, updated = counts("create_task"), counts("update_task")
    for i in range(1, 6):
        await store.create_task(make_task(f"{i:032x}"))

    def to_running(t: Task) -> Task:
        t.state = State.RUNNING
        return t

    def to_completed(t: Task) -> Task:
        t.state = State.COMPLETED
        return t

    await store.update_task(f"{1:032x}", to_running, "task.state_changed", 2000)
    await store.update_task(f"{1:032x}", to_completed, "task.state_changed", 3000)
    with pytest.raises(InvalidTransition):
        await store.update_task(f"{1:032x}", to_running, "task.state_changed", 4000)
    after_create, after_update = counts("create_task"), counts("update_task")
    assert after_create[0] == created[0] + 5 and after_create[1] > created[1]
    assert after_update[0] == updated[0] + 3 and after_update[1] > updated[1]


def test_a_units_name_is_the_store_call_it_comes_from() -> None:
    import functools

    from services.scheduler.group_commit import LockingUnit, unit_name

    class Store:
        def update_task(self) -> Callable[[object], None]:
            def work(tx: object) -> None:
                return None

            return work

        def save_attempt(self) -> Callable[[object], None]:
            return lambda tx: None

        def _claim(self, tx: object, limit: int) -> None:
            return None

    store = Store()
    assert unit_name(store.update_task()) == "update_task"
    assert unit_name(store.save_attempt()) == "save_attempt"
    assert unit_name(functools.partial(store._claim, limit=3)) == "_claim"
    assert unit_name(LockingUnit(store.update_task(), "t" * 32)) == "update_task"  # a unit that says its lock


class _Recorder:
    """A driver connection that records the SQL it is given (the group commit's mechanism alone)."""

    def __init__(self) -> None:
        self.sql: list[str] = []

    def execute(self, sql: str, *_: object) -> None:
        self.sql.append(sql)


class _RecordingConn:
    def __init__(self) -> None:
        self.connection = type("C", (), {"driver_connection": _Recorder()})()

    @property
    def sql(self) -> list[str]:
        return self.connection.driver_connection.sql  # type: ignore[no-any-return]


def _recorded_unit(name: str, fail: bool = False) -> Callable[[object], str]:
    """A unit that sends ``name`` as its statement (and then fails, with ``fail``)."""

    def run(tx: object) -> str:
        tx.driver.execute(name)  # type: ignore[attr-defined]
        if fail:
            raise ValueError(name)
        return name

    return run


def test_an_optimistic_batch_takes_no_savepoint_and_a_failing_unit_sends_it_round_again() -> None:
    """The mechanism alone, on a recording driver: isolated units each get a savepoint (one
    that fails is rolled back to it); optimistic units get none, and one failing unit makes the
    whole run give up, to be run again isolated."""
    from services.scheduler.group_commit import _Isolate, _run_units

    unit, Conn = _recorded_unit, _RecordingConn
    conn = Conn()
    outcomes = _run_units(conn, units=[unit("a"), unit("b")], isolate=False)  # type: ignore[arg-type]
    assert outcomes == [(True, "a"), (True, "b")] and conn.connection.driver_connection.sql == ["a", "b"]

    conn = Conn()
    with pytest.raises(_Isolate):
        _run_units(conn, units=[unit("a"), unit("b", fail=True), unit("c")], isolate=False)  # type: ignore[arg-type]
    assert conn.connection.driver_connection.sql == ["a", "b"]  # c never ran: the run was given up

    conn = Conn()
    outcomes = _run_units(conn, units=[unit("a"), unit("b", fail=True), unit("c")], isolate=True)  # type: ignore[arg-type]
    assert [ok for ok, _ in outcomes] == [True, False, True]
    assert conn.connection.driver_connection.sql == [
        "SAVEPOINT unit", "a", "RELEASE SAVEPOINT unit",
        "SAVEPOINT unit", "b", "ROLLBACK TO SAVEPOINT unit", "RELEASE SAVEPOINT unit",
        "SAVEPOINT unit", "c", "RELEASE SAVEPOINT unit",
    ]  # fmt: skip


def test_a_batchs_units_can_be_prepared_together_in_its_optimistic_run_only() -> None:
    """``before_units`` (the store's batch lock on PostgreSQL) runs once before a batch of
    several units, with them, in the optimistic run; a failure of its own sends the batch round
    again isolated, where it does not run (each unit then locks its own row)."""
    from services.scheduler.group_commit import LockingUnit, Tx, _Isolate, _run_units

    unit, Conn = _recorded_unit, _RecordingConn
    prepared: list[list[str]] = []

    def prepare(tx: Tx, units: list[Callable[[Tx], object]]) -> None:
        tx.driver.execute("LOCK")
        prepared.append([u.task_id for u in units if isinstance(u, LockingUnit)])

    units = [LockingUnit(unit("a"), "t1"), unit("b"), LockingUnit(unit("c"), "t2")]
    conn = Conn()
    assert _run_units(conn, units=units, isolate=False, before_units=prepare) == [  # type: ignore[arg-type]
        (True, "a"), (True, "b"), (True, "c"),
    ]  # fmt: skip
    assert conn.connection.driver_connection.sql == ["LOCK", "a", "b", "c"] and prepared == [["t1", "t2"]]

    conn = Conn()
    _run_units(conn, units=units, isolate=True, before_units=prepare)  # type: ignore[arg-type]
    assert "LOCK" not in conn.connection.driver_connection.sql, "not in the isolated run"
    conn = Conn()
    _run_units(conn, units=units[:1], isolate=False, before_units=prepare)  # type: ignore[arg-type]
    assert conn.connection.driver_connection.sql == ["a"], "a lone unit locks its own row"

    def fails(tx: Tx, units: list[Callable[[Tx], object]]) -> None:
        raise RuntimeError("deadlock detected")

    conn = Conn()
    with pytest.raises(_Isolate):
        _run_units(conn, units=units, isolate=False, before_units=fails)  # type: ignore[arg-type]
    assert conn.connection.driver_connection.sql == [], "no unit ran in the given-up run"


async def test_a_batchs_task_locks_are_one_round_trip_on_postgresql(
    scheduler_db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Twenty changes of twenty tasks at once: on PostgreSQL their rows are locked and read by
    one statement for the batch, not one each; on SQLite (a lock there costs a few µs, and the
    database is the transaction's alone) each unit reads its own."""
    import asyncio

    from services.scheduler import store as store_module

    store = SchedulerStore(scheduler_db)
    ids = [f"{i:032x}" for i in range(1, 21)]
    for task_id in ids:
        await store.create_task(make_task(task_id))
    counts = {"batch": 0, "single": 0}

    def counting(direct: object, key: str) -> None:
        real = direct.rows  # type: ignore[attr-defined]

        def rows(tx: object, params: dict[str, object]) -> list[object]:
            counts[key] += 1
            return real(tx, params)  # type: ignore[no-any-return]

        monkeypatch.setattr(direct, "rows", rows)

    counting(store_module._PG_LOCK_BATCH, "batch")
    counting(store_module._SELECT_TASK_FOR_UPDATE, "single")

    await asyncio.gather(*(store.update_task(t, _add_path("p"), None, 1) for t in ids))
    if store.postgres:
        assert counts == {"batch": 1, "single": 0}
    else:
        assert counts == {"batch": 0, "single": 20}
    for task_id in ids:
        task = await store.get_task(task_id)
        assert task.observed_paths == ["p"] and task.version == 1


async def test_a_row_a_batch_locked_is_read_again_after_another_unit_wrote_it(scheduler_db: Database) -> None:
    """The batch's lock reads every row before any unit runs; a unit that runs after another
    one wrote its task's row or attempts (a claim making it this host's, an attempt saved)
    must see that write, not the row as the lock read it."""
    import asyncio

    store = SchedulerStore(scheduler_db, "h1")
    await store.create_task(make_task("1" * 32))
    await store.create_task(make_task("2" * 32))

    # One batch: the claim (no lock of its own) rewrites both rows, then two locking units.
    claimed, first, second = await asyncio.gather(
        store.claim_queued(2, (), any_owner=False),
        store.update_task("1" * 32, _add_path("p"), None, 1),
        store.update_task("2" * 32, _add_path("q"), None, 1),
    )
    assert sorted(claimed) == ["1" * 32, "2" * 32]
    for task_id, path in (("1" * 32, "p"), ("2" * 32, "q")):
        task = await store.get_task(task_id)
        assert task.owner_host == "h1", "the claim's write was not lost to a stale row"
        assert task.observed_paths == [path] and task.version == 2

    # One batch: an attempt saved, then a launch that plans from the task's earlier attempts.
    seen: list[list[int]] = []

    def plan(task: Task, previous: list[Attempt]) -> Attempt:
        seen.append([a.number for a in previous])
        return Attempt(
            attempt_id="9" * 32, task_id=task.task_id, number=len(previous) + 1, boot_id="b", token_hash="9" * 64
        )

    saved = Attempt(attempt_id="8" * 32, task_id="1" * 32, number=1, boot_id="b", token_hash="8" * 64)
    _, begun, _ = await asyncio.gather(
        store.save_attempt(saved),
        store.begin_launch("1" * 32, plan),
        store.update_task("2" * 32, _add_path("r"), None, 1),
    )
    assert begun is not None and seen == [[1]], "the launch saw the attempt saved before it"
    assert [a.number for a in await store.attempts_of("1" * 32)] == [1, 2]


async def test_a_transactions_notifications_all_reach_a_listener_once_it_commits(postgres_url: str) -> None:
    """PostgreSQL: what a batch queued for the other replicas (a task queued for anyone, events
    in the log) is sent by one statement before the commit, every payload once, and delivered
    only when the transaction commits."""
    import asyncio

    import psycopg

    from libs.db import libpq_url
    from services.scheduler.store import NOTIFY_CHANNEL
    from tests.support.postgres import fresh_database

    url = fresh_database(postgres_url, "notify")
    db = Database(url, SCHEDULER_MIGRATIONS)
    db.migrate()
    try:
        store = SchedulerStore(db, "h1")
        with psycopg.connect(libpq_url(url), autocommit=True) as listener:
            listener.execute(f"LISTEN {NOTIFY_CHANNEL}")
            before = store.group.transactions
            await asyncio.gather(*(store.create_task(make_task(f"{i:032x}")) for i in range(1, 6)))
            batches = store.group.transactions - before
            got = [n.payload for n in listener.notifies(timeout=1.0)]
            # Each transaction: each payload once, however many of its units queued it.
            assert sorted(got) == sorted(["events:h1", "queued"] * batches) and 1 <= batches < 5
    finally:
        db.close()
