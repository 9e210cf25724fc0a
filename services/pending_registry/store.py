"""Pending-registry persistence: pending entries, pending snapshots and task questions.

Every state change is one transaction. Answers to pending entries (which may be
secrets) are never written; answers to task questions are, before anyone is told.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from sqlalchemy import BigInteger, bindparam, column, delete, func, insert, table
from sqlalchemy import select as sa_select
from sqlalchemy.exc import IntegrityError
from sqlmodel import Field, Session, SQLModel, col, select

from libs.db import Database, Migration, lock_key
from services.pending_registry import domain
from services.pending_registry.domain import (
    LEGACY_AGENT,
    AnswerAttempt,
    Entry,
    EntryKind,
    NewQuestion,
    Question,
    QuestionState,
    Snapshot,
    ToolResult,
)

T = TypeVar("T")

MIGRATIONS = [
    Migration(
        1,
        "pending entries, pending snapshots, task questions",
        [
            "CREATE TABLE pending_entries ("
            " entry_id VARCHAR(32) PRIMARY KEY, session_id VARCHAR(128) NOT NULL,"
            " origin VARCHAR(16) NOT NULL, kind VARCHAR(16) NOT NULL, payload TEXT NOT NULL,"
            " created_at BIGINT NOT NULL, claimed_by VARCHAR(128), claimed_at BIGINT)",
            "CREATE INDEX ix_pending_entries_session ON pending_entries (session_id)",
            "CREATE TABLE pending_snapshots ("
            " session_id VARCHAR(128) PRIMARY KEY, entry_id VARCHAR(32) NOT NULL,"
            " origin VARCHAR(16) NOT NULL, kind VARCHAR(16) NOT NULL, payload TEXT NOT NULL,"
            " tool_results TEXT NOT NULL, created_at BIGINT NOT NULL)",
            "CREATE TABLE questions ("
            " question_id VARCHAR(32) PRIMARY KEY, task_id VARCHAR(32) NOT NULL,"
            " session_id VARCHAR(128) NOT NULL, request_id VARCHAR(128), revision INTEGER NOT NULL,"
            " state VARCHAR(16) NOT NULL, text TEXT NOT NULL, asked_at BIGINT NOT NULL,"
            " answer TEXT, answered_by VARCHAR(128), answered_at BIGINT, closed_at BIGINT)",
            "CREATE UNIQUE INDEX ux_questions_revision ON questions (task_id, revision)",
            "CREATE UNIQUE INDEX ux_questions_request ON questions (task_id, request_id)",
            "CREATE INDEX ix_questions_state ON questions (task_id, state)",
        ],
    ),
    # Snapshots keyed by agent and session (two agents may share a session id). The table
    # is rebuilt with the new key; rows from before keep reading with agent_id '' (the
    # session's snapshot, whichever agent asks) until the session's next ask replaces them.
    Migration(
        2,
        "pending snapshots and entries per agent",
        [
            "ALTER TABLE pending_entries ADD COLUMN agent_id VARCHAR(128) NOT NULL DEFAULT ''",
            "CREATE TABLE pending_snapshots_v2 ("
            " agent_id VARCHAR(128) NOT NULL, session_id VARCHAR(128) NOT NULL, entry_id VARCHAR(32) NOT NULL,"
            " origin VARCHAR(16) NOT NULL, kind VARCHAR(16) NOT NULL, payload TEXT NOT NULL,"
            " tool_results TEXT NOT NULL, created_at BIGINT NOT NULL, PRIMARY KEY (agent_id, session_id))",
            "INSERT INTO pending_snapshots_v2"
            " (agent_id, session_id, entry_id, origin, kind, payload, tool_results, created_at)"
            " SELECT '', session_id, entry_id, origin, kind, payload, tool_results, created_at FROM pending_snapshots",
            "DROP TABLE pending_snapshots",
            "ALTER TABLE pending_snapshots_v2 RENAME TO pending_snapshots",
            "CREATE INDEX ix_pending_snapshots_session ON pending_snapshots (session_id)",
        ],
    ),
    # The tasks whose questions the scheduler closed because the task ended for good
    # (CancelQuestions): what question retention may delete once that is long enough ago.
    Migration(
        3,
        "ended tasks, for question retention",
        [
            "CREATE TABLE closed_tasks (task_id VARCHAR(32) PRIMARY KEY, closed_at BIGINT NOT NULL)",
            "CREATE INDEX ix_closed_tasks_at ON closed_tasks (closed_at)",
        ],
    ),
]


class EntryRow(SQLModel, table=True):
    __tablename__ = "pending_entries"
    entry_id: str = Field(primary_key=True)
    session_id: str
    origin: str
    kind: str
    payload: str
    created_at: int = Field(sa_type=BigInteger)
    claimed_by: str | None = None
    claimed_at: int | None = Field(default=None, sa_type=BigInteger)
    agent_id: str = ""


class SnapshotRow(SQLModel, table=True):
    __tablename__ = "pending_snapshots"
    agent_id: str = Field(primary_key=True)
    session_id: str = Field(primary_key=True)
    entry_id: str
    origin: str
    kind: str
    payload: str
    tool_results: str
    created_at: int = Field(sa_type=BigInteger)


class QuestionRow(SQLModel, table=True):
    __tablename__ = "questions"
    question_id: str = Field(primary_key=True)
    task_id: str
    session_id: str
    request_id: str | None = None
    revision: int
    state: str
    text: str
    asked_at: int = Field(sa_type=BigInteger)
    answer: str | None = None
    answered_by: str | None = None
    answered_at: int | None = Field(default=None, sa_type=BigInteger)
    closed_at: int | None = Field(default=None, sa_type=BigInteger)


# Hot-path statements, built once: Core on the tables, no ORM bookkeeping per call.
_ENTRIES = EntryRow.__table__  # type: ignore[attr-defined]
_SNAPSHOTS = SnapshotRow.__table__  # type: ignore[attr-defined]
_INSERT_ENTRY = _ENTRIES.insert()
_CLAIM_ENTRY = (
    _ENTRIES.update()
    .where(_ENTRIES.c.entry_id == bindparam("id"), _ENTRIES.c.claimed_by.is_(None))
    .values(claimed_by=bindparam("picker"), claimed_at=bindparam("at"))
)
_RELEASE_CLAIM = (
    _ENTRIES.update()
    .where(_ENTRIES.c.entry_id == bindparam("id"), _ENTRIES.c.claimed_by == bindparam("picker"))
    .values(claimed_by=None, claimed_at=None)
)
_DELETE_ENTRY = _ENTRIES.delete().where(_ENTRIES.c.entry_id == bindparam("id"))
_INSERT_SNAPSHOT = _SNAPSHOTS.insert()
_DELETE_SESSION_SNAPSHOT = _SNAPSHOTS.delete().where(
    _SNAPSHOTS.c.agent_id == bindparam("agent_id"), _SNAPSHOTS.c.session_id == bindparam("session_id")
)
_DELETE_ENTRY_SNAPSHOT = _SNAPSHOTS.delete().where(_SNAPSHOTS.c.entry_id == bindparam("id"))
_CLOSED = table("closed_tasks", column("task_id"), column("closed_at"))
_QUESTIONS = QuestionRow.__table__  # type: ignore[attr-defined]
_CLOSED_KNOWN = sa_select(_CLOSED.c.task_id).where(_CLOSED.c.task_id == bindparam("task_id"))
_MARK_CLOSED = insert(_CLOSED)
# The oldest ended tasks first, through ix_closed_tasks_at.
_CLOSED_BEFORE = (
    sa_select(_CLOSED.c.task_id)
    .where(_CLOSED.c.closed_at < bindparam("cutoff"))
    .order_by(_CLOSED.c.closed_at)
    .limit(bindparam("limit"))
)
_DELETE_QUESTIONS_OF = delete(_QUESTIONS).where(_QUESTIONS.c.task_id.in_(bindparam("task_ids", expanding=True)))
_DELETE_CLOSED = delete(_CLOSED).where(_CLOSED.c.task_id.in_(bindparam("task_ids", expanding=True)))


@dataclass(frozen=True)
class QuestionsPruned:
    """What one retention batch deleted: ended tasks' markers and their questions."""

    tasks: int
    questions: int


# --- row <-> domain -----------------------------------------------------------


def _snapshot_from_row(row: SnapshotRow) -> Snapshot:
    results = tuple(ToolResult(**r) for r in json.loads(row.tool_results))
    return Snapshot(
        agent_id=row.agent_id,
        session_id=row.session_id,
        entry_id=row.entry_id,
        origin=row.origin,
        kind=EntryKind(row.kind),
        payload=row.payload,
        tool_results=results,
        created_at=row.created_at,
    )


def _snapshot_values(s: Snapshot) -> dict[str, object]:
    results = [
        {
            "tool_call_id": r.tool_call_id,
            "name": r.name,
            "arguments": r.arguments,
            "output": r.output,
            "arguments_truncated": r.arguments_truncated,
            "output_truncated": r.output_truncated,
        }
        for r in s.tool_results
    ]
    return {
        "agent_id": s.agent_id,
        "session_id": s.session_id,
        "entry_id": s.entry_id,
        "origin": s.origin,
        "kind": s.kind.value,
        "payload": s.payload,
        "tool_results": json.dumps(results, ensure_ascii=False),
        "created_at": s.created_at,
    }


def _question_from_row(row: QuestionRow) -> Question:
    return Question(
        question_id=row.question_id,
        task_id=row.task_id,
        session_id=row.session_id,
        text=row.text,
        revision=row.revision,
        state=QuestionState(row.state),
        asked_at=row.asked_at,
        answer=row.answer,
        answered_by=row.answered_by,
        answered_at=row.answered_at,
        closed_at=row.closed_at,
        request_id=row.request_id,
    )


def _write_question(s: Session, q: Question, row: QuestionRow | None = None) -> None:
    if row is None:
        row = QuestionRow(
            question_id=q.question_id,
            task_id=q.task_id,
            session_id=q.session_id,
            request_id=q.request_id,
            revision=q.revision,
            state=q.state.value,
            text=q.text,
            asked_at=q.asked_at,
        )
    row.state = q.state.value
    row.answer = q.answer
    row.answered_by = q.answered_by
    row.answered_at = q.answered_at
    row.closed_at = q.closed_at
    s.add(row)


class PendingStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    # --- pending entries ------------------------------------------------------

    async def insert_entry(self, entry: Entry, snapshot: Snapshot | None) -> None:
        """The entry and (replacing the session's earlier one) its snapshot, in one transaction."""

        def work(s: Session) -> None:
            conn = s.connection()
            conn.execute(
                _INSERT_ENTRY,
                {
                    "entry_id": entry.entry_id,
                    "session_id": entry.session_id,
                    "origin": entry.origin,
                    "kind": entry.kind.value,
                    "payload": entry.payload,
                    "created_at": entry.created_at,
                    "agent_id": entry.agent_id,
                },
            )
            if snapshot is not None:
                conn.execute(
                    _DELETE_SESSION_SNAPSHOT, {"agent_id": snapshot.agent_id, "session_id": snapshot.session_id}
                )
                conn.execute(_INSERT_SNAPSHOT, _snapshot_values(snapshot))

        await self.db.run(work)

    async def claim_entry(self, entry_id: str, picker: str, at: int) -> bool:
        """Record a claim; False when the entry is gone or someone else holds it."""

        def work(s: Session) -> bool:
            result = s.connection().execute(_CLAIM_ENTRY, {"id": entry_id, "picker": picker, "at": at})
            return bool(result.rowcount)

        return await self.db.run(work)

    async def release_claim(self, entry_id: str, picker: str) -> None:
        def work(s: Session) -> None:
            s.connection().execute(_RELEASE_CLAIM, {"id": entry_id, "picker": picker})

        await self.db.run(work)

    async def delete_entry(self, entry_id: str, drop_snapshot: bool) -> None:
        """Remove an entry; with ``drop_snapshot`` also the snapshot it wrote (if still the session's)."""

        def work(s: Session) -> None:
            conn = s.connection()
            conn.execute(_DELETE_ENTRY, {"id": entry_id})
            if drop_snapshot:
                conn.execute(_DELETE_ENTRY_SNAPSHOT, {"id": entry_id})

        await self.db.run(work)

    async def delete_session(self, session_id: str, agent_id: str | None = None) -> bool:
        """Delete a session's entries and snapshots — with ``agent_id`` only that agent's
        (and a snapshot from before snapshots were kept per agent); whether anything was there."""

        def work(s: Session) -> bool:
            entries = delete(EntryRow).where(col(EntryRow.session_id) == session_id)
            snapshots = delete(SnapshotRow).where(col(SnapshotRow.session_id) == session_id)
            if agent_id is not None:
                entries = entries.where(col(EntryRow.agent_id).in_((agent_id, LEGACY_AGENT)))
                snapshots = snapshots.where(col(SnapshotRow.agent_id).in_((agent_id, LEGACY_AGENT)))
            deleted_entries = s.exec(entries).rowcount
            deleted_snapshots = s.exec(snapshots).rowcount
            return bool(deleted_entries or deleted_snapshots)

        return await self.db.run(work)

    async def delete_all_entries(self) -> int:
        """Entries whose producers are gone (an earlier incarnation's); snapshots stay."""

        def work(s: Session) -> int:
            return int(s.exec(delete(EntryRow)).rowcount or 0)

        return await self.db.run(work)

    async def count_entries(self) -> int:
        def work(s: Session) -> int:
            return int(s.exec(select(func.count()).select_from(EntryRow)).one())

        return await self.db.run(work)

    async def get_snapshot(self, agent_id: str, session_id: str) -> Snapshot | None:
        """The agent's snapshot of the session, else the session's from before snapshots were kept per agent."""

        def work(s: Session) -> Snapshot | None:
            row = s.get(SnapshotRow, (agent_id, session_id)) or s.get(SnapshotRow, (LEGACY_AGENT, session_id))
            return _snapshot_from_row(row) if row else None

        return await self.db.run(work)

    # --- task questions ---------------------------------------------------------

    async def ask_question(self, new: NewQuestion, now: int) -> tuple[Question, Question | None, bool]:
        """Create the task's next question: (question, the one it replaced, created now?).

        With a request id already used for this task, the earlier question is
        returned unchanged. Asks of one task are serialized (an advisory lock on
        PostgreSQL); the unique (task_id, revision) index is the backstop.
        """

        def work(s: Session) -> tuple[Question, Question | None, bool]:
            lock_key(s, f"question:{new.task_id}")
            if new.request_id is not None:
                existing = s.exec(
                    select(QuestionRow).where(
                        QuestionRow.task_id == new.task_id, QuestionRow.request_id == new.request_id
                    )
                ).first()
                if existing is not None:
                    return _question_from_row(existing), None, False
            latest = s.exec(
                select(QuestionRow)
                .where(QuestionRow.task_id == new.task_id)
                .order_by(col(QuestionRow.revision).desc())
                .limit(1)
                .with_for_update()
            ).first()
            previous = _question_from_row(latest) if latest else None
            question, replaced = domain.ask_question(new, previous, now)
            if replaced is not None and latest is not None:
                _write_question(s, replaced, latest)
            _write_question(s, question)
            s.flush()
            return question, replaced, True

        return await self._retry_on_conflict(work)

    async def get_question(self, question_id: str) -> Question | None:
        def work(s: Session) -> Question | None:
            row = s.get(QuestionRow, question_id)
            return _question_from_row(row) if row else None

        return await self.db.run(work)

    async def answer_question(self, attempt: AnswerAttempt, now: int) -> tuple[Question, bool]:
        """Apply the domain's answer rules to the locked row; (question, answered now?)."""

        def work(s: Session) -> tuple[Question, bool]:
            row = s.exec(
                select(QuestionRow).where(QuestionRow.question_id == attempt.question_id).with_for_update()
            ).first()
            if row is None:
                raise domain.question_not_found(attempt.question_id)
            question, changed = domain.answer_question(_question_from_row(row), attempt, now)
            if changed:
                _write_question(s, question, row)
            return question, changed

        return await self.db.run(work)

    async def cancel_questions(self, task_id: str, now: int) -> list[Question]:
        """Cancel the task's open questions: the scheduler says the task ended for good. The
        task is marked closed (first time only), in the same transaction: question retention
        counts from then."""

        def work(s: Session) -> list[Question]:
            rows = s.exec(
                select(QuestionRow)
                .where(QuestionRow.task_id == task_id, QuestionRow.state == QuestionState.OPEN.value)
                .with_for_update()
            ).all()
            cancelled = []
            for row in rows:
                question = domain.cancel_question(_question_from_row(row), now)
                _write_question(s, question, row)
                cancelled.append(question)
            conn = s.connection()
            if conn.execute(_CLOSED_KNOWN, {"task_id": task_id}).first() is None:
                conn.execute(_MARK_CLOSED, {"task_id": task_id, "closed_at": now})
            return cancelled

        return await self._retry_on_conflict(work)  # a concurrent close's marker came first

    async def prune_closed(self, cutoff: int, limit: int) -> QuestionsPruned:
        """One batch of question retention: up to ``limit`` tasks closed before ``cutoff`` (ms),
        oldest first, lose their questions and their marker, in one transaction."""

        def work(s: Session) -> QuestionsPruned:
            conn = s.connection()
            task_ids = list(conn.execute(_CLOSED_BEFORE, {"cutoff": cutoff, "limit": limit}).scalars())
            if not task_ids:
                return QuestionsPruned(0, 0)
            questions = conn.execute(_DELETE_QUESTIONS_OF, {"task_ids": task_ids}).rowcount
            conn.execute(_DELETE_CLOSED, {"task_ids": task_ids})
            return QuestionsPruned(len(task_ids), questions)

        return await self.db.run(work)

    async def _retry_on_conflict(self, work: Callable[[Session], T], attempts: int = 5) -> T:
        for attempt in range(attempts):
            try:
                return await self.db.run(work)
            except IntegrityError:
                if attempt == attempts - 1:
                    raise
        raise AssertionError("unreachable")
