"""Scheduler persistence: tasks, attempts and the task event history.

A task row keeps the columns queries need and the rest of the domain object as a
JSON document, so a field added later reads with its default from older rows.
Every state change is one transaction that also appends a task event.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy import BigInteger, ColumnElement, func, text
from sqlalchemy.exc import IntegrityError
from sqlmodel import Field, SQLModel

from libs.db import Database, Migration
from libs.direct import Direct
from services.scheduler.domain import (
    ACTIVE,
    RESOLVED_BY_HOST_GONE,
    TERMINAL,
    Attempt,
    Cancellation,
    FailureCode,
    HostLive,
    HostSummary,
    PendingQuestion,
    State,
    Task,
    TaskNotFound,
    check_continuable,
    check_transition,
    closes_questions,
    end_attempt_on_gone_host,
    mark_host_lost,
    release_when_requeued,
    resolve_host_gone,
    stop_elsewhere,
)
from services.scheduler.group_commit import GroupCommit, LockingUnit, Tx, Unit

# A lost-host sweep waits this long at most for a lock: a renewal racing it commits in
# milliseconds, while a host frozen mid-transaction would hold it until PostgreSQL ends that
# session (``idle_in_transaction_session_timeout``, ``hosts.scheduler_pg_settings``).
SWEEP_LOCK_TIMEOUT_MS = 2000

MIGRATIONS = [
    Migration(
        1,
        "tasks, attempts, task events",
        [
            "CREATE TABLE tasks ("
            " task_id VARCHAR(32) PRIMARY KEY, agent_id VARCHAR(128) NOT NULL,"
            " session_id VARCHAR(128) NOT NULL, state VARCHAR(32) NOT NULL,"
            " request_id VARCHAR(128), created_at BIGINT NOT NULL, updated_at BIGINT NOT NULL,"
            " doc TEXT NOT NULL)",
            "CREATE INDEX ix_tasks_session ON tasks (agent_id, session_id, created_at)",
            "CREATE INDEX ix_tasks_state ON tasks (state, created_at)",
            "CREATE UNIQUE INDEX ux_tasks_request ON tasks (agent_id, session_id, request_id)",
            "CREATE TABLE attempts ("
            " attempt_id VARCHAR(32) PRIMARY KEY,"
            " task_id VARCHAR(32) NOT NULL REFERENCES tasks(task_id),"
            " number INTEGER NOT NULL, token_hash VARCHAR(64) NOT NULL, doc TEXT NOT NULL)",
            "CREATE INDEX ix_attempts_task ON attempts (task_id, number)",
            "CREATE UNIQUE INDEX ux_attempts_token ON attempts (token_hash)",
            "CREATE TABLE task_events ("
            " id {ID_PK}, task_id VARCHAR(32) NOT NULL REFERENCES tasks(task_id),"
            " type VARCHAR(40) NOT NULL, at BIGINT NOT NULL, state VARCHAR(32) NOT NULL, doc TEXT NOT NULL)",
            "CREATE INDEX ix_task_events_task ON task_events (task_id, id)",
        ],
    ),
    Migration(
        2,
        "question-close outbox",
        [
            # One row per finished task whose questions the pending-registry has yet to close;
            # written in the task's ending transaction, deleted once the registry confirms.
            "CREATE TABLE question_closes ("
            " task_id VARCHAR(32) PRIMARY KEY REFERENCES tasks(task_id),"
            " attempts INTEGER NOT NULL, next_at BIGINT NOT NULL)",
            "CREATE INDEX ix_question_closes_next ON question_closes (next_at)",
        ],
    ),
    Migration(
        3,
        "session task list by state",
        # The default list (a session's unfinished tasks, newest first) and the watch
        # snapshot seek the session's active states instead of reading all its rows.
        ["CREATE INDEX ix_tasks_session_state ON tasks (agent_id, session_id, state, created_at)"],
    ),
    Migration(
        4,
        "scheduler hosts: task owners, host leases, event origins",
        [
            # The host that claimed a task and owns its workers (NULL: queued, unclaimed).
            "ALTER TABLE tasks ADD COLUMN owner_host VARCHAR(128)",
            "CREATE INDEX ix_tasks_owner ON tasks (owner_host, state)",
            # One lease per host, renewed on a tick: a task's lease is its owner's.
            "CREATE TABLE scheduler_hosts ("
            " host_id VARCHAR(128) PRIMARY KEY, boot_id VARCHAR(64) NOT NULL,"
            " started_at BIGINT NOT NULL, lease_expires_at BIGINT NOT NULL)",
            # Which host wrote an event: each replica republishes the others' to its watchers.
            "ALTER TABLE task_events ADD COLUMN origin VARCHAR(128)",
        ],
    ),
    Migration(
        5,
        "sub-task trees",
        [
            # A worker's sub-task points to its parent; a parent's detail and its cancel read them.
            "ALTER TABLE tasks ADD COLUMN parent_task_id VARCHAR(32)",
            "CREATE INDEX ix_tasks_parent ON tasks (parent_task_id, created_at)",
        ],
    ),
]

# The channel replicas LISTEN on; payloads: "queued", "control:<host>", "events:<host>".
NOTIFY_CHANNEL = "taskgate_scheduler"
# A live scheduler process holds an advisory lock on this plus its host id (hosts.Listener).
HOST_ID_LOCK = "taskgate.scheduler.host:"

# Every state a task can be in before it finishes: the default list and the watch
# snapshot name them (an IN list seeks the index; NOT IN would scan the session).
UNFINISHED = tuple(s.value for s in State if s not in TERMINAL)


class TaskRow(SQLModel, table=True):
    __tablename__ = "tasks"
    task_id: str = Field(primary_key=True)
    agent_id: str
    session_id: str
    state: str
    request_id: str | None = None
    created_at: int = Field(sa_type=BigInteger)
    updated_at: int = Field(sa_type=BigInteger)
    doc: str
    owner_host: str | None = None
    parent_task_id: str | None = None


class AttemptRow(SQLModel, table=True):
    __tablename__ = "attempts"
    attempt_id: str = Field(primary_key=True)
    task_id: str
    number: int
    token_hash: str
    doc: str


class TaskEventRow(SQLModel, table=True):
    __tablename__ = "task_events"
    id: int | None = Field(default=None, primary_key=True, sa_type=BigInteger)
    task_id: str
    type: str
    at: int = Field(sa_type=BigInteger)
    state: str
    doc: str
    origin: str | None = None


class SchedulerHostRow(SQLModel, table=True):
    __tablename__ = "scheduler_hosts"
    host_id: str = Field(primary_key=True)
    boot_id: str
    started_at: int = Field(sa_type=BigInteger)
    lease_expires_at: int = Field(sa_type=BigInteger)


class QuestionCloseRow(SQLModel, table=True):
    __tablename__ = "question_closes"
    task_id: str = Field(primary_key=True)
    attempts: int
    next_at: int = Field(sa_type=BigInteger)


@dataclass(frozen=True)
class StoredEvent:
    id: int
    type: str
    at: int
    task: Task
    origin: str | None = None
    # The state before the change (None: a new task, or an event read back from the log).
    previous: State | None = None
    # The change committed a question-close outbox row: the closer has work (``Runtime.published``).
    closes_questions: bool = False


class NotOwner(Exception):
    """The task is no longer this host's to launch (claimed elsewhere, cancelled, swept)."""


class SecondReplica(Exception):
    """Another scheduler replica is live on a database that allows only one (SQLite)."""


def notify(session: Tx, payload: str) -> None:
    """Queue a NOTIFY sent in this transaction (see ``SchedulerStore.send_notifications``)."""
    session.info.setdefault("notify", set()).add(payload)


def _task_as_of_event(row: Any, task: Task) -> Task:
    """The current task with the state (and question) the event recorded."""
    task.state = State(row.state)
    if '"pendingQuestion"' in row.doc:  # only a task.question event's doc holds one
        doc = json.loads(row.doc)
        if "pendingQuestion" in doc:
            task.pending_question = PendingQuestion.model_validate(doc["pendingQuestion"])
    return task


def _events_as_recorded(rows: list[Any]) -> list[StoredEvent]:
    """Events read with their task's current document (``task_doc``), each with its own
    copy of the task as of the event. A task's document is parsed once per read, however
    many of its events the read holds (a burst has created, running and completed): each
    event gets a shallow copy, whose own fields (state, question) are set from the event."""
    parsed: dict[str, Task] = {}
    events = []
    for r in rows:
        current = parsed.get(r.task_id)
        if current is None:
            current = parsed[r.task_id] = Task.model_validate_json(r.task_doc)
        events.append(StoredEvent(r.id, r.type, r.at, _task_as_of_event(r, current.model_copy()), r.origin))
    return events


def _task_from_row(row: Any) -> Task:
    return Task.model_validate_json(row.doc)


# The hot statements in SQLAlchemy Core over the same tables: no unit of work, no
# identity map, compiled once. Task and event rows are never loaded as ORM objects,
# so no unit in a group commit can see another's stale copy.
TASKS = TaskRow.__table__  # type: ignore[attr-defined]
EVENTS = TaskEventRow.__table__  # type: ignore[attr-defined]
_SELECT_TASK_SQL = sa.select(TASKS.c.doc).where(TASKS.c.task_id == sa.bindparam("task_id"))
_SELECT_TASK = Direct(_SELECT_TASK_SQL, returns=["doc"])
_SELECT_TASK_FOR_UPDATE = Direct(_SELECT_TASK_SQL.with_for_update(), returns=["doc"])
# An idempotent create's earlier task (AIP-155 request id), through ux_tasks_request.
_SELECT_BY_REQUEST = Direct(
    sa.select(TASKS.c.doc).where(
        TASKS.c.agent_id == sa.bindparam("agent_id"),
        TASKS.c.session_id == sa.bindparam("session_id"),
        TASKS.c.request_id == sa.bindparam("request_id"),
    ),
    returns=["doc"],
)
_UPDATE_TASK = Direct(
    sa.update(TASKS)
    .where(TASKS.c.task_id == sa.bindparam("k_task_id"))
    .values(
        state=sa.bindparam("state"),
        updated_at=sa.bindparam("updated_at"),
        doc=sa.bindparam("doc"),
        owner_host=sa.bindparam("owner_host"),
    )
)
HOSTS = SchedulerHostRow.__table__  # type: ignore[attr-defined]
_TASK_COLUMNS = [
    "task_id", "agent_id", "session_id", "state", "request_id", "created_at", "updated_at", "doc", "owner_host",
    "parent_task_id",
]  # fmt: skip
_INSERT_TASK = Direct(sa.insert(TASKS), keys=_TASK_COLUMNS)
_EVENT_COLUMNS = ["task_id", "type", "at", "state", "doc", "origin"]
_INSERT_EVENT = Direct(sa.insert(EVENTS).returning(EVENTS.c.id), keys=_EVENT_COLUMNS, returns=["id"])
ATTEMPTS = AttemptRow.__table__  # type: ignore[attr-defined]
QUESTION_CLOSES = QuestionCloseRow.__table__  # type: ignore[attr-defined]
_SELECT_QUESTION_CLOSE = Direct(
    sa.select(QUESTION_CLOSES.c.task_id).where(QUESTION_CLOSES.c.task_id == sa.bindparam("task_id")),
    returns=["task_id"],
)
_INSERT_QUESTION_CLOSE = Direct(sa.insert(QUESTION_CLOSES), keys=["task_id", "attempts", "next_at"])
_SELECT_ATTEMPTS = Direct(
    sa.select(ATTEMPTS.c.doc).where(ATTEMPTS.c.task_id == sa.bindparam("task_id")).order_by(ATTEMPTS.c.number),
    returns=["doc"],
)
# PostgreSQL: a task locked with its attempts' documents (by number), one round trip where
# SQLite takes two statements (each a few µs there).
_PG_TASK_WITH_ATTEMPTS = Direct(
    text(
        "SELECT t.doc, ARRAY(SELECT a.doc FROM attempts a WHERE a.task_id = t.task_id ORDER BY a.number)"
        " AS attempt_docs FROM tasks t WHERE t.task_id = :task_id FOR UPDATE OF t"
    ),
    returns=["doc", "attempt_docs"],
)
# PostgreSQL: the rows a batch's units lock, locked together in one round trip before they run
# (in id order: two batches locking some of the same rows cannot deadlock on each other).
_PG_LOCK_BATCH = Direct(
    text(
        "SELECT t.task_id, t.doc, ARRAY(SELECT a.doc FROM attempts a WHERE a.task_id = t.task_id ORDER BY a.number)"
        " AS attempt_docs FROM tasks t WHERE t.task_id = ANY(CAST(:task_ids AS text[]))"
        " ORDER BY t.task_id FOR UPDATE OF t"
    ),
    returns=["task_id", "doc", "attempt_docs"],
)
# PostgreSQL: claimed tasks made this host's, one statement for them all (the documents made in Python).
_PG_CLAIM_OWNER = Direct(
    text(
        "UPDATE tasks AS t SET owner_host = :host_id, doc = v.doc"
        " FROM unnest(CAST(:task_ids AS text[]), CAST(:docs AS text[])) AS v(task_id, doc)"
        " WHERE t.task_id = v.task_id"
    )
)
# One parent's direct sub-tasks, oldest first (``ix_tasks_parent``): a task's detail asks this of
# every task it shows, nearly always to find none.
_SELECT_CHILDREN = Direct(
    sa.select(TASKS.c.doc)
    .where(TASKS.c.parent_task_id == sa.bindparam("parent_id"))
    .order_by(TASKS.c.created_at, TASKS.c.task_id),
    returns=["doc"],
)


def _claim(*owned: ColumnElement[bool]) -> Direct:
    """Queued tasks to claim, oldest first (``ix_tasks_state``), FOR UPDATE SKIP LOCKED on
    PostgreSQL, among those ``owned`` allows. Compiled once: the dispatcher polls this on every
    wake-up and tick, and built per call SQLAlchemy's statement, cache key and result cost
    ≈ 0.4 ms of CPU more than the query itself."""
    return Direct(
        sa.select(TASKS.c.task_id, TASKS.c.doc)
        .where(TASKS.c.state == State.QUEUED.value, *owned)
        .order_by(TASKS.c.created_at, TASKS.c.task_id)
        .limit(sa.bindparam("limit"))
        .with_for_update(skip_locked=True),
        returns=["task_id", "doc"],
    )


_CLAIM_ANY = _claim()  # one host: anyone's, an earlier host id's too
_CLAIM_OWN = _claim(sa.or_(TASKS.c.owner_host.is_(None), TASKS.c.owner_host == sa.bindparam("host_id")))
# Finished tasks whose questions are due to be closed (the question closer's poll).
_DUE_QUESTION_CLOSES = Direct(
    sa.select(QUESTION_CLOSES.c.task_id, QUESTION_CLOSES.c.attempts)
    .where(QUESTION_CLOSES.c.next_at <= sa.bindparam("now"))
    .order_by(QUESTION_CLOSES.c.next_at)
    .limit(sa.bindparam("limit")),
    returns=["task_id", "attempts"],
)
_EVENT_READ_COLUMNS = ["id", "task_id", "type", "at", "state", "doc", "origin", "task_doc"]


def _events_with_tasks(after: ColumnElement[bool]) -> Any:
    """Events matching ``after`` with their task's current document, oldest first: one
    statement (the task by primary key per event) instead of a second query by task ids."""
    return (
        sa.select(
            EVENTS.c.id,
            EVENTS.c.task_id,
            EVENTS.c.type,
            EVENTS.c.at,
            EVENTS.c.state,
            EVENTS.c.doc,
            EVENTS.c.origin,
            TASKS.c.doc.label("task_doc"),
        )
        .join(TASKS, TASKS.c.task_id == EVENTS.c.task_id)
        .where(after)
        .order_by(EVENTS.c.id)
    )


# History retention (``prune_finished``, hourly: built per call, not ``Direct``, whose
# compiled form cannot expand IN lists): finished tasks before a cutoff, by the state index,
# in no order (a batch needs no sort of the whole backlog). FOR UPDATE SKIP LOCKED on
# PostgreSQL: a replica pruning at the same time takes other rows.
PRUNE_BATCH = 100  # ≈ 7 ms of the database thread on SQLite (bench/bench_history_retention.py, a fast spell)
_CHILD = TASKS.alias("child")


def _finished_before_cutoff(tasks: Any) -> ColumnElement[bool]:
    return sa.and_(tasks.c.state.in_([s.value for s in TERMINAL]), tasks.c.updated_at < sa.bindparam("cutoff"))


_PRUNE_CANDIDATES = (
    sa.select(TASKS.c.task_id)
    .where(
        TASKS.c.created_at < sa.bindparam("cutoff"),
        _finished_before_cutoff(TASKS),
        ~sa.exists().where(QUESTION_CLOSES.c.task_id == TASKS.c.task_id),
        # A sub-task that stays keeps its parent (``ix_tasks_parent``); deeper trees are
        # settled in ``prune_finished``.
        ~sa.exists().where(_CHILD.c.parent_task_id == TASKS.c.task_id, ~_finished_before_cutoff(_CHILD)),
    )
    .limit(sa.bindparam("limit"))
    .with_for_update(skip_locked=True)
)
_NEWEST_EVENT_TASK = sa.select(EVENTS.c.task_id).order_by(EVENTS.c.id.desc()).limit(1)


@dataclass(frozen=True)
class PrunedTasks:
    tasks: int
    events: int
    attempts: int
    # Candidates found and kept (a kept sub-task below, the log's newest event): the next
    # batch of the pass skips them rather than finding them again.
    kept: frozenset[str] = frozenset()


# A follower's read with no gaps to look at again: the common one, compiled once.
_EVENTS_AFTER = Direct(
    _events_with_tasks(EVENTS.c.id > sa.bindparam("sequence")).limit(sa.bindparam("limit")),
    returns=_EVENT_READ_COLUMNS,
)


def _event_ids(after: ColumnElement[bool]) -> Any:
    """The ids of the events matching ``after``, oldest first (no task documents: the index only)."""
    return sa.select(EVENTS.c.id).where(after).order_by(EVENTS.c.id)


_EVENT_IDS_AFTER = Direct(
    _event_ids(EVENTS.c.id > sa.bindparam("sequence")).limit(sa.bindparam("limit")), returns=["id"]
)


def _past_cursor(sequence: int, again: list[int]) -> ColumnElement[bool]:
    """A follower's read with gaps to look at again (an IN list of varying length, built per read)."""
    return (EVENTS.c.id > sequence) | EVENTS.c.id.in_(again)


def _task_values(task: Task, new: bool) -> dict[str, Any]:
    """A task's row: every column for an insert; for an update the ones a change may move."""
    values = {
        "task_id": task.task_id,
        "state": task.state.value,
        "updated_at": task.updated_at,
        "doc": task.model_dump_json(exclude_none=True),
        "owner_host": task.owner_host,
    }
    if new:
        values.update(
            agent_id=task.agent_id,
            session_id=task.session_id,
            request_id=task.request_id,
            created_at=task.created_at,
            parent_task_id=task.parent_task_id,
        )
    return values


def _write_task(session: Tx, task: Task, new: bool = False) -> None:
    _changed(session, task.task_id)
    values = _task_values(task, new)
    if new:
        _INSERT_TASK.execute(session, values)
    else:
        values["k_task_id"] = values.pop("task_id")
        _UPDATE_TASK.execute(session, values)
    _notify_queued(session, task)


def _notify_queued(session: Tx, task: Task) -> None:
    if task.state == State.QUEUED and task.owner_host is None:
        notify(session, "queued")  # any replica's dispatcher may take it


# The document of an event that records only a state, rendered once per state.
_STATE_EVENT_DOCS = {state: json.dumps({"state": state.value}) for state in State}


def _event_doc(task: Task, event_type: str) -> str:
    if event_type == "task.question" and task.pending_question is not None:
        # The question as asked: by the time a log follower reads the event the
        # task may have moved on (answered, replaced).
        return json.dumps({"state": task.state.value, "pendingQuestion": task.pending_question.model_dump()})
    return _STATE_EVENT_DOCS[task.state]


def _append_event(session: Tx, task: Task, event_type: str, at: int, origin: str) -> StoredEvent:
    (key,) = _INSERT_EVENT.rows(
        session,
        {
            "task_id": task.task_id,
            "type": event_type,
            "at": at,
            "state": task.state.value,
            "doc": _event_doc(task, event_type),
            "origin": origin,
        },
    )
    notify(session, f"events:{origin}")  # the other replicas' watchers follow the log
    return StoredEvent(int(key.id), event_type, at, task, origin)


def _write_with_event(
    s: Tx, task: Task, event_type: str, at: int, origin: str, new: bool = False, attempt: Attempt | None = None
) -> StoredEvent:
    """The task's row (inserted when ``new``), ``attempt``'s and the change's event, as
    ``_write_task``, ``_write_attempt`` and ``_append_event`` one after another would write
    them. On PostgreSQL in one statement (``_PG_CHANGES``): each is a round trip through psycopg,
    and three statements cost ≈ 2.5x the CPU of one that does their work."""
    if s.conn.dialect.name != "postgresql":
        _write_task(s, task, new)
        if attempt is not None:
            _write_attempt(s, attempt)
        return _append_event(s, task, event_type, at, origin)
    _changed(s, task.task_id)
    params = _task_values(task, new)
    params.update(type=event_type, at=at, ev_state=task.state.value, ev_doc=_event_doc(task, event_type), origin=origin)
    if attempt is not None:
        params.update({f"a_{k}": v for k, v in _attempt_values(attempt).items()})
    (key,) = _PG_CHANGES[new, attempt is not None].rows(s, params)
    _notify_queued(s, task)
    notify(s, f"events:{origin}")
    return StoredEvent(int(key.id), event_type, at, task, origin)


def _rows(session: Tx, stmt: Any, params: dict[str, Any] | None = None) -> list[Any]:
    if isinstance(stmt, Direct):
        return stmt.rows(session, params or {})
    return list(session.connection().execute(stmt, params or {}).all())


def _task_with_attempts(s: Tx, task_id: str) -> tuple[Task, list[Attempt]]:
    rows = _rows(s, _SELECT_TASK, {"task_id": task_id})
    if not rows:
        raise TaskNotFound("TASK_NOT_FOUND", f"no task {task_id}")
    attempts = _rows(s, _SELECT_ATTEMPTS, {"task_id": task_id})
    return _task_from_row(rows[0]), [Attempt.model_validate_json(a.doc) for a in attempts]


# Tx.info: task id -> its row as the batch's lock read it (PostgreSQL, ``_lock_batch``). Every
# statement that writes a task's row or its attempts inside a group unit must call ``_changed``
# first (today: ``_write_task``, ``_write_with_event``, ``_write_attempt`` and the claim's
# ``_PG_CLAIM_OWNER``), or a later unit of the batch reads the row as it was before that write.
_BATCH_LOCKED = "batch_locked"


def _take_batch_locked(s: Tx, task_id: str) -> Any:
    """The row (doc, attempt_docs) the batch's lock read for ``task_id`` and nothing of this
    transaction has changed since (``SchedulerStore._lock_batch``), taken once; None: read it."""
    locked = s.info.get(_BATCH_LOCKED)
    return locked.pop(task_id, None) if locked else None


def _changed(s: Tx, task_id: str) -> None:
    """``task_id``'s row or attempts were written in this transaction: a row the batch's lock
    read before is stale, and the unit that wants it reads it again."""
    locked = s.info.get(_BATCH_LOCKED)
    if locked:
        locked.pop(task_id, None)


def _locked_task_with_attempt_docs(s: Tx, task_id: str, postgres: bool) -> tuple[Task, list[str]] | None:
    """The task, locked, and its attempts' documents by number; None when there is no such task.
    PostgreSQL: one round trip (``_PG_TASK_WITH_ATTEMPTS``), none when the batch locked it;
    SQLite: two statements, a few µs each."""
    if postgres:
        row = _take_batch_locked(s, task_id)
        if row is not None:
            return _task_from_row(row), list(row.attempt_docs)
        rows = _rows(s, _PG_TASK_WITH_ATTEMPTS, {"task_id": task_id})
        return (_task_from_row(rows[0]), list(rows[0].attempt_docs)) if rows else None
    rows = _rows(s, _SELECT_TASK_FOR_UPDATE, {"task_id": task_id})
    if not rows:
        return None
    return _task_from_row(rows[0]), [r.doc for r in _rows(s, _SELECT_ATTEMPTS, {"task_id": task_id})]


def _children_of(s: Tx, parent_ids: list[str]) -> list[Task]:
    """The direct sub-tasks of ``parent_ids``, oldest first."""
    if len(parent_ids) == 1:
        rows = _rows(s, _SELECT_CHILDREN, {"parent_id": parent_ids[0]})
    else:
        rows = _rows(
            s,
            sa.select(TASKS.c.doc)
            .where(TASKS.c.parent_task_id.in_(parent_ids))
            .order_by(TASKS.c.created_at, TASKS.c.task_id),
        )
    return [_task_from_row(r) for r in rows]


def _link_continuation(s: Tx, earlier_id: str, task: Task) -> None:
    rows = _rows(s, _SELECT_TASK_FOR_UPDATE, {"task_id": earlier_id})
    if not rows:
        raise TaskNotFound("TASK_NOT_FOUND", f"no task {earlier_id}")
    earlier = _task_from_row(rows[0])
    check_continuable(earlier, task.agent_id, task.session_id)
    earlier.continued_by_task_id = task.task_id
    earlier.version += 1
    _write_task(s, earlier)  # not a state change: updatedAt stays


class SchedulerStore:
    def __init__(self, db: Database, host_id: str = "local") -> None:
        self.db = db
        # The replica this store writes for: event origins, claims, leases.
        self.host_id = host_id
        self.postgres = db.engine.dialect.name == "postgresql"
        # Every unit of work goes through one group commit: concurrent tasks' changes
        # share a transaction (each whole or not at all), committed before anyone hears.
        # PostgreSQL: a batch's task locks taken in one round trip (``_lock_batch``).
        self.group = GroupCommit(
            db, before_commit=self.send_notifications, before_units=self._lock_batch if self.postgres else None
        )
        self._run = self.group.run

    # --- tasks -------------------------------------------------------------

    async def create_task(self, task: Task, continues: str | None = None) -> tuple[Task, StoredEvent | None]:
        """Insert a new queued task, or return the earlier one with the same request id.

        ``continues``: the finished task it continues gets ``continued_by_task_id`` in the
        same transaction (refused when another task continued it first).
        """
        try:
            return await self._run(self._create_unit(task, continues))
        except IntegrityError:
            return await self._create_after_conflict(task, continues)

    async def create_tasks(self, tasks: list[Task]) -> list[tuple[Task, StoredEvent | None] | Exception]:
        """``create_task`` for each of ``tasks`` (none continues another), in the next group
        commit together; each answer in order — what ``create_task`` returns, or its error."""
        outcomes = await self.group.run_all([self._create_unit(task, None) for task in tasks])
        answers: list[tuple[Task, StoredEvent | None] | Exception] = []
        for task, (ok, value) in zip(tasks, outcomes, strict=True):
            if not ok and isinstance(value, IntegrityError):
                try:
                    value = await self._create_after_conflict(task, None)
                except Exception as exc:  # noqa: BLE001 - this create's own error, for its caller
                    value = exc
            answers.append(value)
        return answers

    async def _create_after_conflict(self, task: Task, continues: str | None) -> tuple[Task, StoredEvent | None]:
        """A concurrent create with the same request id won the unique index: the unit, run
        again, finds that task and returns it."""
        return await self._run(self._create_unit(task, continues))

    def _create_unit(self, task: Task, continues: str | None) -> Callable[[Tx], tuple[Task, StoredEvent | None]]:
        """The unit that inserts a new queued task (counted as ``create_task``'s)."""

        def create_task(s: Tx) -> tuple[Task, StoredEvent | None]:
            if task.request_id:
                existing = _rows(
                    s,
                    _SELECT_BY_REQUEST,
                    {"agent_id": task.agent_id, "session_id": task.session_id, "request_id": task.request_id},
                )
                if existing:
                    return _task_from_row(existing[0]), None
            if continues is None:
                return task, _write_with_event(s, task, "task.state_changed", task.created_at, self.host_id, new=True)
            _write_task(s, task, new=True)
            _link_continuation(s, continues, task)
            return task, _append_event(s, task, "task.state_changed", task.created_at, self.host_id)

        return create_task

    async def get_task(self, task_id: str) -> Task:
        def work(s: Tx) -> Task:
            rows = _rows(s, _SELECT_TASK, {"task_id": task_id})
            if not rows:
                raise TaskNotFound("TASK_NOT_FOUND", f"no task {task_id}")
            return _task_from_row(rows[0])

        return await self._run(work)

    async def find_task(self, task_id: str) -> Task | None:
        def work(s: Tx) -> Task | None:
            rows = _rows(s, _SELECT_TASK, {"task_id": task_id})
            return _task_from_row(rows[0]) if rows else None

        return await self._run(work)

    async def find_tasks(self, task_ids: list[str]) -> dict[str, Task]:
        """The tasks of ``task_ids`` that exist, in one query."""
        if not task_ids:
            return {}

        def work(s: Tx) -> dict[str, Task]:
            rows = _rows(s, sa.select(TASKS.c.task_id, TASKS.c.doc).where(TASKS.c.task_id.in_(task_ids)))
            return {r.task_id: _task_from_row(r) for r in rows}

        return await self._run(work)

    async def list_tasks(
        self,
        agent_id: str,
        session_id: str,
        include_finished: bool,
        page: int,
        page_size: int,
        clamp: Callable[[int], int],
    ) -> tuple[int, list[Task]]:
        """(total, tasks of the clamped page), newest first."""

        def work(s: Tx) -> tuple[int, list[Task]]:
            where: list[ColumnElement[bool]] = [TASKS.c.agent_id == agent_id, TASKS.c.session_id == session_id]
            if not include_finished:
                where.append(TASKS.c.state.in_(UNFINISHED))
            total = int(_rows(s, sa.select(func.count()).select_from(TASKS).where(*where))[0][0])
            page_index = clamp(total)
            # Without finished tasks, ordering by `created_at + 0` keeps SQLite from walking
            # ix_tasks_session (the session's whole history, newest first) to avoid a sort: it
            # seeks the few unfinished rows through ix_tasks_session_state and sorts those.
            newest = (TASKS.c.created_at + 0) if not include_finished else TASKS.c.created_at
            rows = _rows(
                s,
                sa.select(TASKS.c.doc)
                .where(*where)
                .order_by(newest.desc(), TASKS.c.task_id.desc())
                .offset(page_index * page_size)
                .limit(page_size),
            )
            return total, [_task_from_row(r) for r in rows]

        return await self._run(work)

    async def children_of(self, parent_ids: list[str]) -> list[Task]:
        """The direct sub-tasks of ``parent_ids``, oldest first (``ix_tasks_parent``)."""
        if not parent_ids:
            return []
        return await self._run(lambda s: _children_of(s, parent_ids))

    async def task_detail(self, task_id: str, depth: int) -> tuple[Task, list[Attempt], list[list[Task]]]:
        """A task, its attempts and its sub-tasks level by level (at most ``depth`` levels below
        the first), in one unit: what a task's detail shows, for one trip to the database."""

        def work(s: Tx) -> tuple[Task, list[Attempt], list[list[Task]]]:
            task, attempts = _task_with_attempts(s, task_id)
            levels: list[list[Task]] = []
            parents = [task_id]
            for _ in range(depth + 1):
                level = _children_of(s, parents)
                if not level:
                    break
                levels.append(level)
                parents = [t.task_id for t in level]
            return task, attempts, levels

        return await self._run(work)

    async def count_children(self, parent_id: str) -> int:
        def work(s: Tx) -> int:
            query = sa.select(func.count()).select_from(TASKS).where(TASKS.c.parent_task_id == parent_id)
            return int(_rows(s, query)[0][0])

        return await self._run(work)

    async def tasks_in_states(
        self,
        states: Iterable[State],
        limit: int | None = None,
        session: tuple[str, str] | None = None,
        page_size: int = 500,
        owner: str | None = None,
    ) -> list[Task]:
        """Tasks in ``states``, oldest first: ``limit`` of them, or every one (paged, no hidden cap).

        ``session`` (agent id, session id) keeps to one session's tasks (``ix_tasks_session``);
        ``owner`` to one host's (``ix_tasks_owner``).
        Pages are keyset pages on (created_at, task_id), so a large backlog is read in bounded
        queries and no row is skipped or repeated between them.
        """
        values = [s.value for s in states]
        found: list[Task] = []
        after: tuple[int, str] | None = None
        while True:
            want = page_size if limit is None else min(page_size, limit - len(found))
            if want <= 0:
                return found
            page = await self._states_page(values, after, want, session, owner)
            found.extend(page)
            if len(page) < want:
                return found
            after = (page[-1].created_at, page[-1].task_id)

    async def _states_page(
        self,
        values: list[str],
        after: tuple[int, str] | None,
        limit: int,
        session: tuple[str, str] | None,
        owner: str | None = None,
    ) -> list[Task]:
        def work(s: Tx) -> list[Task]:
            query = sa.select(TASKS.c.doc).where(TASKS.c.state.in_(values))
            if owner is not None:
                query = query.where(TASKS.c.owner_host == owner)
            if session is not None:
                query = query.where(TASKS.c.agent_id == session[0], TASKS.c.session_id == session[1])
            if after is not None:
                query = query.where(
                    sa.or_(
                        TASKS.c.created_at > after[0],
                        sa.and_(TASKS.c.created_at == after[0], TASKS.c.task_id > after[1]),
                    )
                )
            rows = _rows(s, query.order_by(TASKS.c.created_at, TASKS.c.task_id).limit(limit))
            return [_task_from_row(r) for r in rows]

        return await self._run(work)

    async def update_task(
        self,
        task_id: str,
        change: Callable[[Task], Task | None],
        event_type: str | None,
        at: int,
        attempt: Attempt | None = None,
        legacy_adoption: bool = False,
    ) -> tuple[Task, StoredEvent | None]:
        """Load, change and save a task in one transaction.

        ``change`` returns the new task (its state validated against the old one)
        or None for "nothing to do". An attempt passed along is saved in the same
        transaction.
        """

        def work(s: Tx) -> tuple[Task, StoredEvent | None]:
            # FOR UPDATE: concurrent changes of one task (a report racing the exit
            # handler) serialize on PostgreSQL instead of losing an update (locked already when
            # the batch's lock took it). SQLite already serializes writers (BEGIN IMMEDIATE).
            locked = _take_batch_locked(s, task_id)
            rows = [locked] if locked is not None else _rows(s, _SELECT_TASK_FOR_UPDATE, {"task_id": task_id})
            if not rows:
                raise TaskNotFound("TASK_NOT_FOUND", f"no task {task_id}")
            current = _task_from_row(rows[0])
            # The rules below read only `before`'s own fields (state, version, question), which
            # a shallow copy keeps whatever `change` does to the task: one parse, not two.
            before = current.model_copy()
            after = change(current)
            if after is None:
                # Nothing to do: the stored task as it is (``change`` may have touched its copy).
                return _task_from_row(rows[0]), None
            if after.state != before.state:
                check_transition(before.state, after.state, legacy_adoption)
                after.updated_at = max(after.updated_at, at)  # updatedAt moves with every state change
            release_when_requeued(before, after)
            after.version = before.version + 1
            closes = self._queue_question_close(s, before, after, at)
            if event_type:
                stored: StoredEvent | None = _write_with_event(s, after, event_type, at, self.host_id, attempt=attempt)
            else:
                _write_task(s, after)
                if attempt is not None:
                    _write_attempt(s, attempt)
                stored = None
            return after, (
                dataclasses.replace(stored, previous=before.state, closes_questions=closes) if stored else None
            )

        return await self._run(LockingUnit(work, task_id))

    async def mark_may_have_asked(self, task: Task, at: int) -> Task:
        """``task`` with ``may_have_asked`` set and committed (no event: nothing a watcher
        shows changed). Called before a question of the task is first sent to the
        pending-registry, so that whichever scheduler ends the task — another replica, or this
        one after a crash between the two — closes it there."""
        if task.may_have_asked:
            return task

        def mark(t: Task) -> Task | None:
            if t.may_have_asked:
                return None
            t.may_have_asked = True
            return t

        marked, _ = await self.update_task(task.task_id, mark, None, at)
        return marked

    def _queue_question_close(self, s: Tx, before: Task, after: Task, at: int) -> bool:
        """An ending task's question-close outbox row, in the ending transaction (once).
        True when the task has one now (the closer has work). A task that never sent a question
        to the registry (``Task.may_have_asked``) gets none: no call to the registry at its end."""
        if not (closes_questions(before, after) and before.may_have_asked):
            return False
        if not _rows(s, _SELECT_QUESTION_CLOSE, {"task_id": after.task_id}):
            _INSERT_QUESTION_CLOSE.execute(s, {"task_id": after.task_id, "attempts": 0, "next_at": at})
        return True

    async def legacy_shutdown_failures(self, since: int) -> list[tuple[Task, int]]:
        """Tasks ``failed`` ``GATEWAY_SHUTDOWN`` since ``since`` (ms), each with the event
        sequence of its failure: the candidates of start-up's legacy adoption."""

        def work(s: Tx) -> list[tuple[Task, int]]:
            rows = _rows(
                s,
                sa.select(TASKS.c.task_id, TASKS.c.doc).where(
                    TASKS.c.state == State.FAILED.value, TASKS.c.updated_at >= since
                ),
            )
            found: list[tuple[Task, int]] = []
            for row in rows:
                task = _task_from_row(row)
                if task.failure is None or task.failure.code != "GATEWAY_SHUTDOWN":
                    continue
                sequence = _rows(
                    s,
                    sa.select(func.max(EVENTS.c.id)).where(
                        EVENTS.c.task_id == task.task_id, EVENTS.c.state == State.FAILED.value
                    ),
                )[0][0]
                if sequence is not None:
                    found.append((task, int(sequence)))
            return found

        return await self._run(work)

    async def due_question_closes(self, now: int, limit: int = 100) -> list[tuple[str, int]]:
        """Finished tasks whose questions are due to be closed: (task id, attempts so far)."""

        def work(s: Tx) -> list[tuple[str, int]]:
            rows = _rows(s, _DUE_QUESTION_CLOSES, {"now": now, "limit": limit})
            return [(r.task_id, r.attempts) for r in rows]

        return await self._run(work)

    async def question_close_done(self, task_id: str) -> None:
        def work(s: Tx) -> None:
            s.connection().execute(sa.delete(QUESTION_CLOSES).where(QUESTION_CLOSES.c.task_id == task_id))

        await self._run(work)

    async def question_close_failed(self, task_id: str, attempts: int, next_at: int) -> None:
        def work(s: Tx) -> None:
            s.connection().execute(
                sa.update(QUESTION_CLOSES)
                .where(QUESTION_CLOSES.c.task_id == task_id)
                .values(attempts=attempts, next_at=next_at)
            )

        await self._run(work)

    async def events_after(
        self,
        sequence: int,
        types: Iterable[str],
        limit: int,
        recheck: Iterable[int] = (),
        skip_origin: str | None = None,
    ) -> tuple[list[int], list[StoredEvent]]:
        """Task events after ``sequence`` (and the ``recheck`` ids), oldest first.

        Returns every id read (so a follower can see gaps: on PostgreSQL a lower
        id can commit after a higher one) and the events of the wanted types,
        each with the task as it is now but the state and question the event
        recorded. Events whose origin is ``skip_origin`` count among the ids only
        (a relay of the other hosts' events has no use for its own, nor for
        parsing their tasks).
        """
        wanted = set(types)
        again = list(recheck)

        def work(s: Tx) -> tuple[list[int], list[StoredEvent]]:
            if again:
                rows = _rows(s, _events_with_tasks(_past_cursor(sequence, again)).limit(limit))
            else:
                rows = _EVENTS_AFTER.rows(s, {"sequence": sequence, "limit": limit})
            picked = [
                r for r in rows if (not wanted or r.type in wanted) and (skip_origin is None or r.origin != skip_origin)
            ]
            return [r.id for r in rows], _events_as_recorded(picked)

        # Its own transaction, never in a group: it must see only what has committed
        # (a follower acts on what it reads).
        return await self.group.alone(work)

    async def event_ids_after(self, sequence: int, limit: int, recheck: Iterable[int] = ()) -> list[int]:
        """The ids ``events_after`` would return, without the events: what a reader with no one
        to tell keeps its place (and its gaps) by, from the index alone."""
        again = list(recheck)

        def work(s: Tx) -> list[int]:
            if again:
                return [r.id for r in _rows(s, _event_ids(_past_cursor(sequence, again)).limit(limit))]
            return [r.id for r in _EVENT_IDS_AFTER.rows(s, {"sequence": sequence, "limit": limit})]

        # Its own transaction, never in a group: it must see only what has committed
        # (a follower acts on what it reads).
        return await self.group.alone(work)

    async def last_event_id(self) -> int:
        def work(s: Tx) -> int:
            return int(_rows(s, sa.select(func.coalesce(func.max(EVENTS.c.id), 0)))[0][0])

        return await self.group.alone(work)

    # --- history retention ----------------------------------------------------

    async def prune_finished(self, cutoff: int, limit: int = PRUNE_BATCH, skip: Iterable[str] = ()) -> PrunedTasks:
        """Delete up to ``limit`` tasks that finished before ``cutoff`` (ms), with their events
        and attempts, in one transaction of its own; ``skip``: candidates kept by earlier batches.

        Kept whatever their age: a task with a question still to close in the
        pending-registry (its outbox row), a task with a sub-task that is kept (no sub-task is
        left pointing at a deleted parent), and the task of the log's newest event (SQLite
        hands the highest id out again once its row is gone, and a follower whose cursor is
        past it would never read the next events).
        """

        skipped = list(skip)
        candidates = _PRUNE_CANDIDATES.where(TASKS.c.task_id.not_in(skipped)) if skipped else _PRUNE_CANDIDATES

        def work(s: Tx) -> PrunedTasks:
            # Nothing finishes before it is created: the (state, created_at) index narrows the
            # search, and updated_at (when it finished) decides.
            found = {r.task_id for r in _rows(s, candidates, {"cutoff": cutoff, "limit": limit})}
            ids = set(found)
            newest = _rows(s, _NEWEST_EVENT_TASK)
            if newest:
                ids.discard(newest[0].task_id)
            # A candidate with a sub-task that stays is kept too, and so, level by level, is
            # every candidate above it.
            while ids:
                rows = _rows(
                    s,
                    sa.select(TASKS.c.parent_task_id)
                    .where(TASKS.c.parent_task_id.in_(ids), TASKS.c.task_id.not_in(ids))
                    .distinct(),
                )
                if not rows:
                    break
                ids -= {r.parent_task_id for r in rows}
            kept = frozenset(found - ids)
            if not ids:
                return PrunedTasks(0, 0, 0, kept)
            conn = s.connection()
            events = conn.execute(sa.delete(EVENTS).where(EVENTS.c.task_id.in_(ids))).rowcount
            attempts = conn.execute(sa.delete(ATTEMPTS).where(ATTEMPTS.c.task_id.in_(ids))).rowcount
            tasks = conn.execute(sa.delete(TASKS).where(TASKS.c.task_id.in_(ids))).rowcount
            return PrunedTasks(tasks, events, attempts, kept)

        return await self.group.alone(work)

    # --- several hosts --------------------------------------------------------

    def _lock_batch(self, s: Tx, units: list[Unit]) -> None:
        """(PostgreSQL, before a batch's units run.) Lock the rows of the tasks its units lock
        first, and read them (with their attempts' documents), in one round trip: a busy batch
        holds a dozen such units, each a round trip of its own otherwise. Each unit takes its
        row from here unless something of the transaction wrote that task's row or attempts
        before it ran (``_changed``); a row not found is looked for again by its unit."""
        ids = sorted({u.task_id for u in units if isinstance(u, LockingUnit)})
        if len(ids) < 2:
            return
        s.info[_BATCH_LOCKED] = {row.task_id: row for row in _PG_LOCK_BATCH.rows(s, {"task_ids": ids})}

    def send_notifications(self, session: Tx) -> None:
        """Send the transaction's queued NOTIFYs (PostgreSQL delivers them at commit, if it commits)."""
        payloads = session.info.pop("notify", None)
        if payloads and self.postgres:
            _NOTIFY.execute(session, {"payloads": sorted(payloads)})  # all of them in one round trip

    async def claim_queued(self, limit: int, skip: Iterable[str], any_owner: bool) -> list[str]:
        """Claim up to ``limit`` queued tasks for this host, oldest first; their ids.

        PostgreSQL: ``FOR UPDATE SKIP LOCKED``, so replicas claiming at once take
        different rows without waiting on each other. ``any_owner`` (one host, SQLite)
        also takes tasks an earlier host id claimed.
        """
        skipped = set(skip)
        # The skipped ones (this host's launches under way, still queued) are read and passed
        # over here rather than excluded in SQL: one statement compiled once, whatever their number
        # (at most max_running rows more; on PostgreSQL they stay locked until this short
        # transaction commits, and another replica's SKIP LOCKED claim passes them over meanwhile).
        params: dict[str, Any] = {"limit": limit + len(skipped)}
        if not any_owner:
            params["host_id"] = self.host_id

        def work(s: Tx) -> list[str]:
            claimed: list[str] = []
            taken: list[Task] = []  # claimed from no owner or another host id: made this host's
            for row in _rows(s, _CLAIM_ANY if any_owner else _CLAIM_OWN, params):
                if row.task_id in skipped:
                    continue
                if len(claimed) == limit:
                    break
                task = _task_from_row(row)
                if task.owner_host != self.host_id:
                    task.owner_host = self.host_id
                    task.version += 1
                    taken.append(task)
                claimed.append(task.task_id)
            if taken and self.postgres:  # one round trip for all of them
                for task in taken:
                    _changed(s, task.task_id)
                docs = [task.model_dump_json(exclude_none=True) for task in taken]
                _PG_CLAIM_OWNER.execute(
                    s, {"host_id": self.host_id, "task_ids": [task.task_id for task in taken], "docs": docs}
                )
            else:
                for task in taken:
                    _write_task(s, task)  # no NOTIFY: a claimed task has an owner
            return claimed

        return await self._run(work)

    async def begin_launch(
        self, task_id: str, plan: Callable[[Task, list[Attempt]], Attempt | None]
    ) -> tuple[Task, list[Attempt], Attempt | None] | None:
        """A claimed task with its attempts and, when ``plan`` makes one, its ``launching``
        attempt committed — one transaction, taken only while the task is still queued and
        this host's (the row lock orders it against another host's cancel or a lost-host
        sweep). None: the task is gone or no longer this host's to launch."""

        def work(s: Tx) -> tuple[Task, list[Attempt], Attempt | None] | None:
            found = _locked_task_with_attempt_docs(s, task_id, self.postgres)
            if found is None:
                return None
            task, docs = found
            if task.state != State.QUEUED or task.owner_host != self.host_id:
                return None
            previous = [Attempt.model_validate_json(doc) for doc in docs]
            attempt = plan(task, previous)
            if attempt is not None:
                _write_attempt(s, attempt)
            return task, previous, attempt

        return await self._run(LockingUnit(work, task_id))

    async def save_launching_attempt(self, attempt: Attempt) -> None:
        """``begin_launch`` for an attempt made beforehand; NotOwner when the task is gone or no
        longer queued and this host's."""
        if await self.begin_launch(attempt.task_id, lambda _task, _previous: attempt) is None:
            raise NotOwner(attempt.task_id)

    async def register_host(self, boot_id: str, now: int, lease_ms: int, only_one: bool) -> None:
        """Record this host's lease; ``only_one`` (SQLite) refuses while another host's is live."""

        def work(s: Tx) -> None:
            if only_one:
                others = _rows(
                    s,
                    sa.select(HOSTS.c.host_id).where(HOSTS.c.host_id != self.host_id, HOSTS.c.lease_expires_at > now),
                )
                if others:
                    raise SecondReplica(
                        f"scheduler host {others[0].host_id} holds a live lease on this SQLite database;"
                        " several scheduler replicas need PostgreSQL"
                    )
            s.connection().execute(
                _UPSERT_HOST,
                {"host_id": self.host_id, "boot_id": boot_id, "started_at": now, "until": now + lease_ms},
            )

        await self.group.alone(work)

    async def renew_lease(self, until: int) -> int | None:
        """Extend this host's lease to ``until``; the expiry it replaced (None: the row was gone)."""

        def work(s: Tx) -> int | None:
            rows = _rows(
                s, sa.select(HOSTS.c.lease_expires_at).where(HOSTS.c.host_id == self.host_id).with_for_update()
            )
            s.connection().execute(
                sa.update(HOSTS).where(HOSTS.c.host_id == self.host_id).values(lease_expires_at=until)
            )
            return int(rows[0][0]) if rows else None

        return await self.group.alone(work)

    async def release_lease(self) -> None:
        """A clean shutdown: this host's tasks were stopped and re-queued, nothing to sweep."""
        await self.group.alone(
            lambda s: s.connection().execute(sa.delete(HOSTS).where(HOSTS.c.host_id == self.host_id))
        )

    async def release_claims(self) -> int:
        """This host's queued tasks go back to any host (a clean shutdown)."""

        def work(s: Tx) -> int:
            rows = _rows(
                s,
                sa.select(TASKS.c.doc)
                .where(TASKS.c.owner_host == self.host_id, TASKS.c.state == State.QUEUED.value)
                .with_for_update(),
            )
            for row in rows:
                task = _task_from_row(row)
                task.owner_host = None
                task.version += 1
                _write_task(s, task)
            return len(rows)

        return await self._run(work)

    async def lost_hosts(self, before: int) -> list[str]:
        """Other hosts whose lease ended before ``before``."""

        def work(s: Tx) -> list[str]:
            rows = _rows(
                s,
                sa.select(HOSTS.c.host_id).where(HOSTS.c.host_id != self.host_id, HOSTS.c.lease_expires_at < before),
            )
            return [r.host_id for r in rows]

        return await self.group.alone(work)

    async def tasks_held_by(self, host_id: str, limit: int = 500) -> list[str]:
        """Ids of tasks ``host_id`` claimed that may have a worker there (queued or active)."""
        states = [State.QUEUED.value, *(s.value for s in ACTIVE)]

        def work(s: Tx) -> list[str]:
            rows = _rows(
                s,
                sa.select(TASKS.c.task_id).where(TASKS.c.owner_host == host_id, TASKS.c.state.in_(states)).limit(limit),
            )
            return [r.task_id for r in rows]

        return await self.group.alone(work)

    async def forget_host(self, host_id: str, expired_before: int) -> None:
        """Drop a lost host's row once none of its tasks is left to sweep (it re-registers if it returns)."""

        def work(s: Tx) -> None:
            s.connection().execute(
                sa.delete(HOSTS).where(HOSTS.c.host_id == host_id, HOSTS.c.lease_expires_at < expired_before)
            )

        await self.group.alone(work)

    async def sweep_lost(
        self, task_id: str, host_id: str, now: int, expired_before: int, lock_timeout_ms: int = SWEEP_LOCK_TIMEOUT_MS
    ) -> tuple[Task, StoredEvent | None]:
        """One task of a lost host, in a transaction of its own: a queued one it never began
        launching is released to any host; anything else waits in needs_reconciliation
        (HOST_LOST). On PostgreSQL a lock held past ``lock_timeout_ms`` (a host frozen in the
        middle of a transaction) fails the sweep until the next tick rather than hang it; its
        own transaction, so the setting binds no other unit."""

        def work(s: Tx) -> tuple[Task, StoredEvent | None]:
            if self.postgres:
                s.driver.execute(f"SET LOCAL lock_timeout = {int(lock_timeout_ms)}")
            rows = _rows(s, _SELECT_TASK_FOR_UPDATE, {"task_id": task_id})
            if not rows:
                raise TaskNotFound("TASK_NOT_FOUND", f"no task {task_id}")
            task = _task_from_row(rows[0])
            if task.owner_host != host_id:
                return task, None
            # Still lost? FOR SHARE waits for (and then sees) a renewal racing this sweep, and
            # holds the next one back until this commits: that host then learns its lease lapsed.
            lease = _rows(
                s, sa.select(HOSTS.c.lease_expires_at).where(HOSTS.c.host_id == host_id).with_for_update(read=True)
            )
            if lease and int(lease[0][0]) >= expired_before:
                return task, None
            if task.state == State.QUEUED:
                attempts = [
                    Attempt.model_validate_json(r.doc) for r in _rows(s, _SELECT_ATTEMPTS, {"task_id": task_id})
                ]
                if not any(a.state == "launching" and a.host_id == host_id for a in attempts):
                    task.owner_host = None
                    task.version += 1
                    _write_task(s, task)
                    return task, None
            before_state = task.state
            if not mark_host_lost(task, host_id, now):
                return task, None
            check_transition(before_state, task.state)
            task.version += 1
            _write_task(s, task)
            return task, _append_event(s, task, "task.state_changed", now, self.host_id)

        return await self.group.alone(work)

    async def request_stop_elsewhere(
        self, task_id: str, cancellation: Cancellation, pause: bool, now: int
    ) -> tuple[Task, StoredEvent | None]:
        """A cancel or pause of a task another host owns, in one transaction.

        Nothing can run yet (queued, and its owner never began a launch): done at once.
        Otherwise the request is the task's ``cancel_requested`` state (with the cause),
        and its owner is woken (NOTIFY) to stop the worker with the usual proof. Returns
        the task unchanged (no event) when there is nothing to do here or it is now this
        host's own.
        """

        def work(s: Tx) -> tuple[Task, StoredEvent | None]:
            rows = _rows(s, _SELECT_TASK_FOR_UPDATE, {"task_id": task_id})
            if not rows:
                raise TaskNotFound("TASK_NOT_FOUND", f"no task {task_id}")
            task = _task_from_row(rows[0])
            before = task.state
            owner = task.owner_host
            if owner in (None, self.host_id):
                return task, None
            # Its owner's launch commits a `launching` row under this same row lock: absent
            # here, it has not begun and will find the task no longer queued.
            launch_begun = any(
                Attempt.model_validate_json(r.doc).state == "launching"
                for r in _rows(s, _SELECT_ATTEMPTS, {"task_id": task_id})
            )
            if not stop_elsewhere(task, cancellation, pause, launch_begun, now):
                return task, None
            if task.state == State.CANCEL_REQUESTED:
                notify(s, f"control:{owner}")
            if task.state != before:
                check_transition(before, task.state)
            task.version += 1
            _write_task(s, task)
            return task, _append_event(s, task, "task.state_changed", now, self.host_id)

        return await self._run(work)

    async def adopt_unowned(self) -> int:
        """Tasks that may have a worker but name no owner (written before hosts existed) become
        this host's, so exactly one host's recovery looks after them."""
        states = [s.value for s in (*ACTIVE, State.NEEDS_RECONCILIATION)]

        def work(s: Tx) -> int:
            rows = _rows(
                s,
                sa.select(TASKS.c.doc).where(TASKS.c.owner_host.is_(None), TASKS.c.state.in_(states)).with_for_update(),
            )
            for row in rows:
                task = _task_from_row(row)
                task.owner_host = self.host_id
                task.version += 1
                _write_task(s, task)
            return len(rows)

        return await self.group.alone(work)

    # --- lost hosts: the operator's resolution ---------------------------------

    async def host_summaries(self) -> list[HostSummary]:
        """Every host with a lease row or named as owner by an unfinished task, with its counts."""

        def work(s: Tx) -> list[HostSummary]:
            leases = {r.host_id: r for r in _rows(s, sa.select(HOSTS))}
            counts: dict[str, dict[str, int]] = {}
            rows = _rows(
                s,
                sa.select(TASKS.c.owner_host, TASKS.c.state, func.count())
                .where(TASKS.c.owner_host.is_not(None), TASKS.c.state.not_in([t.value for t in TERMINAL]))
                .group_by(TASKS.c.owner_host, TASKS.c.state),
            )
            for host, state, n in rows:
                counts.setdefault(host, {})[state] = int(n)
            # Why each parked task waits (few rows: they wait for an operator), by its failure code.
            parked: dict[str, list[str | None]] = {}
            for row in _rows(
                s,
                sa.select(TASKS.c.owner_host, TASKS.c.doc).where(
                    TASKS.c.owner_host.is_not(None), TASKS.c.state == State.NEEDS_RECONCILIATION.value
                ),
            ):
                failure = _task_from_row(row).failure
                parked.setdefault(row.owner_host, []).append(failure.code if failure is not None else None)
            connected = self._connected_hosts(s, set(leases) | set(counts))
            found = []
            for host in sorted(set(leases) | set(counts)):
                lease, by_state = leases.get(host), counts.get(host, {})
                found.append(
                    HostSummary(
                        host_id=host,
                        boot_id=lease.boot_id if lease is not None else None,
                        started_at=int(lease.started_at) if lease is not None else None,
                        lease_expires_at=int(lease.lease_expires_at) if lease is not None else None,
                        connected=host in connected,
                        queued=by_state.get(State.QUEUED.value, 0),
                        active=sum(by_state.get(a.value, 0) for a in ACTIVE),
                        needs_reconciliation=by_state.get(State.NEEDS_RECONCILIATION.value, 0),
                        host_lost=parked.get(host, []).count(FailureCode.HOST_LOST),
                        resolvable=sum(code in RESOLVED_BY_HOST_GONE for code in parked.get(host, [])),
                    )
                )
            return found

        return await self.group.alone(work)

    def _connected_hosts(self, s: Tx, hosts: set[str]) -> set[str]:
        """Hosts whose id a live process holds (its listener's advisory lock; PostgreSQL only).
        Read from pg_locks: probing with a lock of our own could turn a starting host away."""
        if not self.postgres or not hosts:
            return set()
        held = {
            (int(r[0]), int(r[1]))
            for r in _rows(
                s,
                text(
                    "SELECT classid::text::bigint, objid::text::bigint FROM pg_locks WHERE locktype = 'advisory'"
                    " AND granted AND objsubid = 1"
                    " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
                ),
            )
        }
        found = set()
        for host in hosts:
            (key,) = _rows(s, text("SELECT hashtext(:k)::bigint"), {"k": HOST_ID_LOCK + host})[0]
            if ((key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF) in held:
                found.add(host)
        return found

    def _hold_host_id(self, s: Tx, host_id: str) -> bool:
        """Take the host id's advisory lock until this transaction ends (PostgreSQL); False while
        a live process holds it. A host starting meanwhile is refused its id (HostIdInUse) until
        the resolution commits, so it never reconciles a task being resolved."""
        if not self.postgres:
            return True
        (held,) = _rows(s, text("SELECT pg_try_advisory_xact_lock(hashtext(:k))"), {"k": HOST_ID_LOCK + host_id})[0]
        return bool(held)

    async def host_lost_tasks_of(self, host_id: str, after: str = "", limit: int = 500) -> list[str]:
        """Ids of ``host_id``'s tasks waiting in needs_reconciliation (those the operator's word
        settles among them: HOST_LOST, CLEANUP_UNCONFIRMED), in id order after ``after``."""

        def work(s: Tx) -> list[str]:
            rows = _rows(
                s,
                sa.select(TASKS.c.task_id)
                .where(
                    TASKS.c.owner_host == host_id,
                    TASKS.c.state == State.NEEDS_RECONCILIATION.value,
                    TASKS.c.task_id > after,
                )
                .order_by(TASKS.c.task_id)
                .limit(limit),
            )
            return [r.task_id for r in rows]

        return await self.group.alone(work)

    async def resolve_host_gone(self, task_id: str, host_id: str, now: int) -> tuple[Task, StoredEvent | None]:
        """One task of a host the operator confirmed gone that waits for proof there (HOST_LOST,
        CLEANUP_UNCONFIRMED: ``domain.resolve_host_gone``), in its own transaction: its
        kept outcome happens (a re-queue releases it to any host), the gone host's unended
        attempts end, and an event is written. HostLive when that host renewed its lease or a
        process holds its id (the host row is read under a share lock, as a sweep does)."""

        def work(s: Tx) -> tuple[Task, StoredEvent | None]:
            rows = _rows(s, _SELECT_TASK_FOR_UPDATE, {"task_id": task_id})
            if not rows:
                raise TaskNotFound("TASK_NOT_FOUND", f"no task {task_id}")
            before = _task_from_row(rows[0])
            lease = _rows(
                s, sa.select(HOSTS.c.lease_expires_at).where(HOSTS.c.host_id == host_id).with_for_update(read=True)
            )
            if (lease and int(lease[0][0]) >= now) or not self._hold_host_id(s, host_id):
                raise HostLive("HOST_LIVE", f"scheduler host {host_id} is live again; it reconciles its own tasks")
            after = _task_from_row(rows[0])
            if not resolve_host_gone(after, host_id, now):
                return before, None
            check_transition(before.state, after.state)
            release_when_requeued(before, after)
            after.version = before.version + 1
            _write_task(s, after)
            for row in _rows(s, _SELECT_ATTEMPTS, {"task_id": task_id}):
                attempt = Attempt.model_validate_json(row.doc)
                if end_attempt_on_gone_host(attempt, host_id, now):
                    _write_attempt(s, attempt)
            closes = self._queue_question_close(s, before, after, now)
            stored = _append_event(s, after, "task.state_changed", now, self.host_id)
            return after, dataclasses.replace(stored, previous=before.state, closes_questions=closes)

        return await self.group.alone(work)

    # --- attempts ----------------------------------------------------------

    async def save_attempt(self, attempt: Attempt) -> None:
        await self._run(lambda s: _write_attempt(s, attempt))

    async def save_attempts(self, attempts: list[Attempt]) -> None:
        """Several attempts in one transaction."""

        def work(s: Tx) -> None:
            for attempt in attempts:
                _write_attempt(s, attempt)

        await self._run(work)

    async def attempts_of(self, task_id: str) -> list[Attempt]:
        def work(s: Tx) -> list[Attempt]:
            rows = _rows(s, _SELECT_ATTEMPTS, {"task_id": task_id})
            return [Attempt.model_validate_json(r.doc) for r in rows]

        return await self._run(work)

    async def launching_attempts(self) -> list[Attempt]:
        """Attempts still marked ``launching`` (of any boot): recovery checks the earlier ones."""

        def work(s: Tx) -> list[Attempt]:
            # The state lives in the JSON document; the filter is a cheap prefilter.
            rows = _rows(s, sa.select(ATTEMPTS.c.doc).where(ATTEMPTS.c.doc.contains('"state":"launching"')))
            return [a for a in (Attempt.model_validate_json(r.doc) for r in rows) if a.state == "launching"]

        return await self._run(work)

    async def task_with_attempts(self, task_id: str) -> tuple[Task, list[Attempt]]:
        return await self._run(lambda s: _task_with_attempts(s, task_id))

    async def count_by_state(self) -> dict[str, int]:
        """How many tasks are in each state (the metrics' gauge, computed on scrape)."""

        def work(s: Tx) -> dict[str, int]:
            rows = _rows(s, sa.select(TASKS.c.state, sa.func.count()).group_by(TASKS.c.state))
            return {str(r[0]): int(r[1]) for r in rows}

        return await self._run(work)


_NOTIFY = Direct(  # PostgreSQL only
    text(
        f"SELECT pg_notify('{NOTIFY_CHANNEL}', p.payload)"
        " FROM unnest(CAST(:payloads AS text[])) WITH ORDINALITY AS p(payload, n) ORDER BY p.n"
    )
)
_UPSERT_HOST = text(
    "INSERT INTO scheduler_hosts (host_id, boot_id, started_at, lease_expires_at)"
    " VALUES (:host_id, :boot_id, :started_at, :until)"
    " ON CONFLICT (host_id) DO UPDATE SET boot_id = excluded.boot_id, started_at = excluded.started_at,"
    " lease_expires_at = excluded.lease_expires_at"
)
_ATTEMPT_COLUMNS = ["attempt_id", "task_id", "number", "token_hash", "doc"]


def _attempt_upsert(prefix: str = "") -> str:
    """The attempt's row, inserted or (its document) updated; parameters named ``prefix`` + column."""
    return (
        f"INSERT INTO attempts ({', '.join(_ATTEMPT_COLUMNS)})"
        f" VALUES ({', '.join(':' + prefix + c for c in _ATTEMPT_COLUMNS)})"
        " ON CONFLICT (attempt_id) DO UPDATE SET doc = excluded.doc"
    )


_UPSERT_ATTEMPT_SQL = text(_attempt_upsert())
_UPSERT_ATTEMPT = Direct(_UPSERT_ATTEMPT_SQL)


def _pg_change(new: bool, with_attempt: bool) -> Direct:
    """PostgreSQL: a change's task row (inserted or updated), its attempt's row (inserted or
    updated) and its event, one statement (a data-modifying WITH; the event's foreign key is
    checked at the statement's end, when the new task row is there)."""
    if new:
        task = f"INSERT INTO tasks ({', '.join(_TASK_COLUMNS)}) VALUES ({', '.join(':' + c for c in _TASK_COLUMNS)})"
    else:
        task = (
            "UPDATE tasks SET state = :state, updated_at = :updated_at, doc = :doc, owner_host = :owner_host"
            " WHERE task_id = :task_id"
        )
    parts = [f"changed AS ({task})"]
    if with_attempt:
        parts.append(f"saved AS ({_attempt_upsert('a_')})")
    # The event's own state and document are named apart from the task row's.
    values = ", ".join(":" + {"state": "ev_state", "doc": "ev_doc"}.get(c, c) for c in _EVENT_COLUMNS)
    return Direct(
        text(
            f"WITH {', '.join(parts)} INSERT INTO task_events ({', '.join(_EVENT_COLUMNS)})"
            f" VALUES ({values}) RETURNING id"
        ),
        returns=["id"],
    )


_PG_CHANGES = {(new, attempt): _pg_change(new, attempt) for new in (False, True) for attempt in (False, True)}


def _attempt_values(attempt: Attempt) -> dict[str, Any]:
    return {
        "attempt_id": attempt.attempt_id,
        "task_id": attempt.task_id,
        "number": attempt.number,
        "token_hash": attempt.token_hash,
        "doc": attempt.model_dump_json(exclude_none=True),
    }


def _write_attempt(s: Tx, attempt: Attempt) -> None:
    """One statement, insert or update: the launch inserts the row, every later save updates it."""
    _changed(s, attempt.task_id)
    _UPSERT_ATTEMPT.execute(s, _attempt_values(attempt))
