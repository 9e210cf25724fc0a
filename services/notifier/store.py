"""Notifier persistence: notifications and their delivery attempts, conversation
messages, response snapshots, the retained activity frames, conversation events and
the cursor into the scheduler's event log.

Every change is one transaction; a notification, its history message, its activity
frame and the event-log cursor are written together.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Connection,
    and_,
    bindparam,
    delete,
    func,
    insert,
    or_,
    text,
    tuple_,
    update,
)
from sqlmodel import Field, Session, SQLModel, col, select

from libs.db import Database, Migration, lock_key
from libs.direct import Direct, OnConnection
from services.notifier import domain
from services.notifier.domain import (
    Attempt,
    Backoff,
    ConversationEvent,
    FollowUp,
    Kind,
    Message,
    Notification,
    Outcome,
    QuestionReminders,
    QuestionState,
    Response,
    State,
)

MIGRATIONS = [
    Migration(
        1,
        "notification outbox",
        [
            "CREATE TABLE notifications ("
            " notification_id VARCHAR(32) PRIMARY KEY, agent_id VARCHAR(128) NOT NULL,"
            " session_id VARCHAR(128) NOT NULL, kind VARCHAR(32) NOT NULL, task_id VARCHAR(128),"
            " body TEXT NOT NULL, handled BOOLEAN NOT NULL, created_at BIGINT NOT NULL,"
            " request_id VARCHAR(128), attempt_count INTEGER NOT NULL)",
            "CREATE INDEX ix_notifications_conversation ON notifications (agent_id, session_id, created_at)",
            "CREATE UNIQUE INDEX ux_notifications_request ON notifications (agent_id, session_id, request_id)",
        ],
    ),
    Migration(
        2,
        "delivery, conversations, responses, activity, event-log cursor",
        [
            "ALTER TABLE notifications ADD COLUMN question_id VARCHAR(32)",
            "ALTER TABLE notifications ADD COLUMN state VARCHAR(16) NOT NULL DEFAULT 'pending'",
            "ALTER TABLE notifications ADD COLUMN channel VARCHAR(128)",
            "ALTER TABLE notifications ADD COLUMN next_attempt_at BIGINT",
            "ALTER TABLE notifications ADD COLUMN delivered_at BIGINT",
            "ALTER TABLE notifications ADD COLUMN consumed_at BIGINT",
            # Foundation rows: handled ones were delivered; the others are due now.
            "UPDATE notifications SET state = 'delivered', delivered_at = created_at WHERE handled",
            "UPDATE notifications SET next_attempt_at = created_at WHERE NOT handled",
            "CREATE INDEX ix_notifications_due ON notifications (state, next_attempt_at)",
            "CREATE TABLE delivery_attempts ("
            " id {ID_PK}, notification_id VARCHAR(32) NOT NULL REFERENCES notifications(notification_id),"
            " at BIGINT NOT NULL, outcome VARCHAR(16) NOT NULL, http_status INTEGER, error TEXT,"
            " retry_after_ms BIGINT)",
            "CREATE INDEX ix_delivery_attempts_notification ON delivery_attempts (notification_id, id)",
            "CREATE TABLE messages ("
            " message_id VARCHAR(32) PRIMARY KEY, agent_id VARCHAR(128) NOT NULL,"
            " session_id VARCHAR(128) NOT NULL, role VARCHAR(16) NOT NULL, text TEXT NOT NULL,"
            " response_id VARCHAR(128), notification_id VARCHAR(32), follow_up VARCHAR(16),"
            " created_at BIGINT NOT NULL, completed_at BIGINT, sort_at BIGINT NOT NULL)",
            "CREATE INDEX ix_messages_history ON messages (agent_id, session_id, sort_at, message_id)",
            "CREATE UNIQUE INDEX ux_messages_response ON messages (agent_id, session_id, response_id)",
            "CREATE TABLE responses ("
            " agent_id VARCHAR(128) NOT NULL, session_id VARCHAR(128) NOT NULL,"
            " response_id VARCHAR(128) NOT NULL, text TEXT NOT NULL, final BOOLEAN NOT NULL,"
            " created_at BIGINT NOT NULL, updated_at BIGINT NOT NULL, completed_at BIGINT,"
            " last_seq BIGINT NOT NULL, PRIMARY KEY (agent_id, session_id, response_id))",
            "CREATE INDEX ix_responses_open ON responses (agent_id, session_id, final)",
            "CREATE TABLE activity ("
            " seq {ID_PK}, agent_id VARCHAR(128) NOT NULL, session_id VARCHAR(128) NOT NULL,"
            " at BIGINT NOT NULL, frame TEXT NOT NULL)",
            "CREATE INDEX ix_activity_conversation ON activity (agent_id, session_id, seq)",
            "CREATE INDEX ix_activity_at ON activity (at)",
            "CREATE TABLE conversation_events ("
            " id {ID_PK}, agent_id VARCHAR(128) NOT NULL, session_id VARCHAR(128) NOT NULL,"
            " kind VARCHAR(64) NOT NULL, at BIGINT NOT NULL, data TEXT NOT NULL)",
            "CREATE INDEX ix_conversation_events ON conversation_events (agent_id, session_id, id)",
            "CREATE TABLE follow_cursors (name VARCHAR(64) PRIMARY KEY, sequence BIGINT NOT NULL)",
        ],
    ),
    Migration(
        3,
        "task questions with their reminder state and preferences",
        [
            # Named apart from the pending-registry's `questions` (one SQLModel metadata per process).
            "CREATE TABLE question_reminders ("
            " question_id VARCHAR(32) PRIMARY KEY, agent_id VARCHAR(128) NOT NULL,"
            " session_id VARCHAR(128) NOT NULL, task_id VARCHAR(128) NOT NULL, title TEXT NOT NULL,"
            " text TEXT NOT NULL, state VARCHAR(16) NOT NULL, asked_at BIGINT NOT NULL,"
            " messages_since INTEGER NOT NULL, reminders_sent INTEGER NOT NULL,"
            " last_reminded_at BIGINT, snoozed_until BIGINT, muted BOOLEAN NOT NULL)",
            "CREATE INDEX ix_question_reminders_open ON question_reminders (agent_id, session_id, state)",
            "CREATE INDEX ix_question_reminders_task ON question_reminders (task_id, state)",
        ],
    ),
    Migration(
        4,
        "failure reports claimed by the scheduler's legacy adoption",
        # One row per scheduler event whose failure report must never be made (the task
        # was resumed instead); the event-log follower checks it before creating one.
        [
            "CREATE TABLE claimed_failures ("
            " sequence BIGINT PRIMARY KEY, task_id VARCHAR(128) NOT NULL, at BIGINT NOT NULL)"
        ],
    ),
    Migration(
        5,
        "conversation retention finds old messages and events by their time",
        [
            "CREATE INDEX ix_messages_sort_at ON messages (sort_at)",
            "CREATE INDEX ix_conversation_events_at ON conversation_events (at)",
        ],
    ),
    Migration(
        6,
        "conversation retention finds old settled questions by when they were asked",
        ["CREATE INDEX ix_question_reminders_asked ON question_reminders (asked_at)"],
    ),
]


class NotificationRow(SQLModel, table=True):
    __tablename__ = "notifications"
    notification_id: str = Field(primary_key=True)
    agent_id: str
    session_id: str
    kind: str
    task_id: str | None = None
    body: str
    handled: bool = False
    created_at: int = Field(sa_type=BigInteger)
    request_id: str | None = None
    attempt_count: int = 0
    question_id: str | None = None
    state: str = State.PENDING.value
    channel: str | None = None
    next_attempt_at: int | None = Field(default=None, sa_type=BigInteger)
    delivered_at: int | None = Field(default=None, sa_type=BigInteger)
    consumed_at: int | None = Field(default=None, sa_type=BigInteger)


class AttemptRow(SQLModel, table=True):
    __tablename__ = "delivery_attempts"
    id: int | None = Field(default=None, primary_key=True, sa_type=BigInteger)
    notification_id: str
    at: int = Field(sa_type=BigInteger)
    outcome: str
    http_status: int | None = None
    error: str | None = None
    retry_after_ms: int | None = Field(default=None, sa_type=BigInteger)


class MessageRow(SQLModel, table=True):
    __tablename__ = "messages"
    message_id: str = Field(primary_key=True)
    agent_id: str
    session_id: str
    role: str
    text: str
    response_id: str | None = None
    notification_id: str | None = None
    follow_up: str | None = None
    created_at: int = Field(sa_type=BigInteger)
    completed_at: int | None = Field(default=None, sa_type=BigInteger)
    # Completion time when there is one: an earlier acknowledgement stays before its later answer.
    sort_at: int = Field(sa_type=BigInteger)


class ResponseRow(SQLModel, table=True):
    __tablename__ = "responses"
    agent_id: str = Field(primary_key=True)
    session_id: str = Field(primary_key=True)
    response_id: str = Field(primary_key=True)
    text: str
    final: bool
    created_at: int = Field(sa_type=BigInteger)
    updated_at: int = Field(sa_type=BigInteger)
    completed_at: int | None = Field(default=None, sa_type=BigInteger)
    last_seq: int = Field(sa_type=BigInteger)


class ActivityRow(SQLModel, table=True):
    __tablename__ = "activity"
    seq: int | None = Field(default=None, primary_key=True, sa_type=BigInteger)
    agent_id: str
    session_id: str
    at: int = Field(sa_type=BigInteger)
    frame: str


class EventRow(SQLModel, table=True):
    __tablename__ = "conversation_events"
    id: int | None = Field(default=None, primary_key=True, sa_type=BigInteger)
    agent_id: str
    session_id: str
    kind: str
    at: int = Field(sa_type=BigInteger)
    data: str


class ReminderRow(SQLModel, table=True):
    __tablename__ = "question_reminders"
    question_id: str = Field(primary_key=True)
    agent_id: str
    session_id: str
    task_id: str
    title: str
    text: str
    state: str
    asked_at: int = Field(sa_type=BigInteger)
    messages_since: int = 0
    reminders_sent: int = 0
    last_reminded_at: int | None = Field(default=None, sa_type=BigInteger)
    snoozed_until: int | None = Field(default=None, sa_type=BigInteger)
    muted: bool = False

    def reminders(self) -> QuestionReminders:
        return QuestionReminders(
            asked_at=self.asked_at,
            state=QuestionState(self.state),
            messages_since=self.messages_since,
            reminders_sent=self.reminders_sent,
            last_reminded_at=self.last_reminded_at,
            snoozed_until=self.snoozed_until,
            muted=self.muted,
        )

    def apply(self, q: QuestionReminders) -> None:
        self.state = q.state.value
        self.messages_since = q.messages_since
        self.reminders_sent = q.reminders_sent
        self.last_reminded_at = q.last_reminded_at
        self.snoozed_until = q.snoozed_until
        self.muted = q.muted


@dataclass(frozen=True)
class QuestionFact:
    """A question as the event log reported it."""

    question_id: str
    agent_id: str
    session_id: str
    task_id: str
    title: str
    text: str
    asked_at: int


@dataclass(frozen=True)
class QuestionView:
    question_id: str
    task_id: str
    state: QuestionState
    snoozed_until: int | None
    muted: bool
    reminders_sent: int


def _question_view(row: ReminderRow) -> QuestionView:
    return QuestionView(
        row.question_id, row.task_id, QuestionState(row.state), row.snoozed_until, row.muted, row.reminders_sent
    )


class ClaimedFailureRow(SQLModel, table=True):
    __tablename__ = "claimed_failures"
    sequence: int = Field(primary_key=True, sa_type=BigInteger)
    task_id: str
    at: int = Field(sa_type=BigInteger)


class CursorRow(SQLModel, table=True):
    __tablename__ = "follow_cursors"
    name: str = Field(primary_key=True)
    sequence: int = Field(sa_type=BigInteger)


@dataclass(frozen=True)
class Frame:
    """One activity frame: a response snapshot or a notification, with its sequence."""

    seq: int
    agent_id: str
    session_id: str
    snapshot: Response | None = None
    notification: Notification | None = None

    def to_json(self) -> str:
        if self.snapshot is not None:
            return json.dumps({"snapshot": self.snapshot.model_dump(mode="json")})
        assert self.notification is not None
        return json.dumps({"notification": self.notification.model_dump(mode="json", exclude={"attempts"})})

    @classmethod
    def from_row(cls, row: ActivityRow) -> Frame:
        doc = json.loads(row.frame)
        snapshot = Response.model_validate(doc["snapshot"]) if "snapshot" in doc else None
        notification = Notification.model_validate(doc["notification"]) if "notification" in doc else None
        return cls(row.seq or 0, row.agent_id, row.session_id, snapshot, notification)


def _conversation(model: Any, agent_id: str, session_id: str) -> list[ColumnElement[bool]]:
    return [col(model.agent_id) == agent_id, col(model.session_id) == session_id]


def _kind(value: str) -> Kind:
    try:
        return Kind(value)
    except ValueError:
        return Kind.TASK_REPORT


def _attempts(s: Session, notification_ids: list[str]) -> dict[str, list[Attempt]]:
    found: dict[str, list[Attempt]] = {n: [] for n in notification_ids}
    if not notification_ids:
        return found
    rows = s.exec(
        select(AttemptRow).where(col(AttemptRow.notification_id).in_(notification_ids)).order_by(col(AttemptRow.id))
    ).all()
    for r in rows:
        found[r.notification_id].append(
            Attempt(
                at=r.at,
                outcome=Outcome(r.outcome),
                http_status=r.http_status,
                error=r.error,
                retry_after_ms=r.retry_after_ms,
            )
        )
    return found


def _notification(row: NotificationRow, attempts: list[Attempt]) -> Notification:
    return Notification(
        notification_id=row.notification_id,
        agent_id=row.agent_id,
        session_id=row.session_id,
        kind=_kind(row.kind),
        task_id=row.task_id,
        question_id=row.question_id,
        text=row.body,
        created_at=row.created_at,
        state=State(row.state),
        channel=row.channel,
        key=row.request_id,
        next_attempt_at=row.next_attempt_at if row.state == State.PENDING.value else None,
        delivered_at=row.delivered_at,
        attempts=attempts,
    )


def _message(row: MessageRow) -> Message:
    return Message(
        **{
            **row.model_dump(exclude={"sort_at"}),
            "follow_up": FollowUp(row.follow_up) if row.follow_up else None,
        }
    )


def _response(row: ResponseRow) -> Response:
    return Response(**row.model_dump(exclude={"last_seq"}))


def _add_frame(s: Session, frame: Frame, at: int, keep: int) -> Frame:
    # One writer per conversation at a time (PostgreSQL): its frames' sequences then commit in
    # order, so resuming after a Last-Event-ID never skips a frame that committed late.
    lock_key(s, f"activity:{frame.agent_id}:{frame.session_id}")
    row = ActivityRow(agent_id=frame.agent_id, session_id=frame.session_id, at=at, frame=frame.to_json())
    s.add(row)
    s.flush()
    # Keep the newest `keep` frames of the conversation (Last-Event-ID resume window).
    cutoff = s.exec(
        select(ActivityRow.seq)
        .where(*_conversation(ActivityRow, frame.agent_id, frame.session_id))
        .order_by(col(ActivityRow.seq).desc())
        .offset(keep)
        .limit(1)
    ).first()
    if cutoff is not None:
        s.exec(  # type: ignore[call-overload]
            delete(ActivityRow).where(
                *_conversation(ActivityRow, frame.agent_id, frame.session_id), col(ActivityRow.seq) <= cutoff
            )
        )
    return Frame(row.seq or 0, frame.agent_id, frame.session_id, frame.snapshot, frame.notification)


def _page(
    s: Session, model: Any, where: list[ColumnElement[bool]], order: list[Any], page: int, size: int
) -> tuple[domain.Page, list[Any]]:
    total = s.exec(select(func.count()).select_from(model).where(*where)).one()
    shown = domain.clamp_page(page, size, total)
    rows = s.exec(select(model).where(*where).order_by(*order).offset(shown.page * size).limit(size)).all()
    return shown, list(rows)


@dataclass(frozen=True)
class LogEvent:
    """One event of the scheduler's log, as the follower prepared it for the store."""

    sequence: int
    notification: Notification | None = None
    message_id: str = ""  # the notification's history message
    question: QuestionFact | None = None  # a question was asked
    task_state: tuple[str, str] | None = None  # (task id, state) of a state change


_T = SQLModel.metadata.tables
_NOTIFICATIONS, _MESSAGES, _ACTIVITY = _T["notifications"], _T["messages"], _T["activity"]
_QUESTIONS, _CLAIMED = _T["question_reminders"], _T["claimed_failures"]

# The event-log path's statements, built once: building them per event cost as much as running them.
# The statements of every batch run on the driver's cursor (libs.direct): SQLAlchemy's
# execution path cost more than SQLite's work for these small writes. The rare ones (a
# question asked, a replay) stay SQLAlchemy statements.
_ADVANCE_CURSOR = Direct(
    text(
        # SQLite and PostgreSQL alike; an older sequence re-read never moves the cursor back.
        "INSERT INTO follow_cursors (name, sequence) VALUES (:name, :sequence)"
        " ON CONFLICT (name) DO UPDATE SET sequence = excluded.sequence"
        " WHERE follow_cursors.sequence < excluded.sequence"
    )
)
_OPEN_QUESTIONS_OF_TASK = (
    select(_QUESTIONS.c.question_id)
    .where(_QUESTIONS.c.task_id == bindparam("of_task"), _QUESTIONS.c.state == QuestionState.OPEN.value)
    .order_by(_QUESTIONS.c.asked_at, _QUESTIONS.c.question_id)
)
_QUESTION_KNOWN = select(_QUESTIONS.c.question_id).where(_QUESTIONS.c.question_id == bindparam("question_id"))
_REPLACE_QUESTIONS = (
    update(_QUESTIONS)
    .where(_QUESTIONS.c.question_id.in_(bindparam("question_ids", expanding=True)))
    .values(state=QuestionState.REPLACED.value)
)
_INSERT_QUESTION = insert(_QUESTIONS)
_SETTLE_QUESTIONS_OF_TASK = Direct(
    update(_QUESTIONS)
    .where(_QUESTIONS.c.task_id == bindparam("of_task"), _QUESTIONS.c.state == QuestionState.OPEN.value)
    .values(state=bindparam("fate"))
)
_FAILURE_CLAIMED = Direct(
    select(_CLAIMED.c.sequence).where(_CLAIMED.c.sequence == bindparam("sequence")), returns=["sequence"]
)
_NOTIFICATIONS_WITH_KEYS = select(
    _NOTIFICATIONS.c.notification_id, _NOTIFICATIONS.c.agent_id, _NOTIFICATIONS.c.session_id
).where(_NOTIFICATIONS.c.request_id.in_(bindparam("keys", expanding=True)))
_INSERT_NOTIFICATIONS = Direct(insert(_NOTIFICATIONS), keys=[c.name for c in _NOTIFICATIONS.c])
_INSERT_MESSAGES = Direct(insert(_MESSAGES), keys=[c.name for c in _MESSAGES.c])
# One frame at a time: its sequence comes back, and a driver's executemany returns no rows.
_INSERT_FRAME = Direct(
    insert(_ACTIVITY).returning(_ACTIVITY.c.seq), keys=["agent_id", "session_id", "at", "frame"], returns=["seq"]
)
# Keep the newest `keep` frames of the conversation (the Last-Event-ID resume window).
_TRIM_ACTIVITY = Direct(
    text(
        "DELETE FROM activity WHERE agent_id = :agent_id AND session_id = :session_id AND seq <= ("
        "SELECT seq FROM activity WHERE agent_id = :agent_id AND session_id = :session_id"
        " ORDER BY seq DESC LIMIT 1 OFFSET :keep)"
    )
)


def _advisory_locks(conn: Connection, keys: set[str]) -> None:
    """PostgreSQL: ``lock_key`` for many keys in one round trip, in one order for every caller."""
    if keys and conn.dialect.name == "postgresql":
        conn.execute(
            text("SELECT count(pg_advisory_xact_lock(hashtext(k))) FROM unnest(CAST(:keys AS text[])) AS k"),
            {"keys": sorted(keys)},
        )


class LogBatch:
    """One transaction's worth of event-log events, on a bare connection (no ORM session).

    The follower's hot path: a few prebuilt statements per batch rather than an ORM
    unit of work per event. State changes settle their task's open questions with one
    executemany UPDATE per run of events between questions (an indexed no-op for the
    many tasks that never asked; no rows are read), notification keys are checked
    once, rows are inserted with executemany, and each conversation's activity is
    trimmed once.
    """

    def __init__(self, conn: Connection, keep_frames: int) -> None:
        self.conn = conn
        self.tx = OnConnection(conn)
        self.keep_frames = keep_frames
        self.settle: list[dict[str, str]] = []  # state changes' question updates not yet run, in order

    def apply(self, cursor_name: str, events: Sequence[LogEvent]) -> list[tuple[Notification | None, Frame | None]]:
        if not events:
            return []
        _ADVANCE_CURSOR.execute(self.tx, {"name": cursor_name, "sequence": max(e.sequence for e in events)})
        notes: list[Notification | None] = []
        for e in events:
            note = e.notification
            if e.question is not None:
                note = self._track_question(e.question, note)
            if e.task_state is not None:
                fate = domain.question_fate(e.task_state[1])
                if fate is not None:  # e.g. queued keeps the question: nothing to do
                    self.settle.append({"of_task": e.task_state[0], "fate": fate.value})
            if note is not None and note.kind == Kind.TASK_FAILED and self._failure_claimed(e.sequence):
                note = None  # the scheduler resumed the task instead: this failure is never reported
            notes.append(note)
        self._settle_questions()
        return self._insert_notifications(events, notes)

    def _settle_questions(self) -> None:
        """Answer or close the open questions of the state changes so far (most tasks have none)."""
        if self.settle:
            _SETTLE_QUESTIONS_OF_TASK.executemany(self.tx, self.settle)
            self.settle = []

    def _track_question(self, q: QuestionFact, n: Notification | None) -> Notification | None:
        self._settle_questions()  # earlier events first: the questions they settled are not replaced
        if self.conn.execute(_QUESTION_KNOWN, {"question_id": q.question_id}).first() is not None:
            return n  # a replayed event: the notification's key makes it a no-op too
        open_ids = self.conn.execute(_OPEN_QUESTIONS_OF_TASK, {"of_task": q.task_id}).scalars().all()
        replaced = [qid for qid in open_ids if qid != q.question_id]
        if replaced:
            self.conn.execute(_REPLACE_QUESTIONS, {"question_ids": replaced})
        self.conn.execute(
            _INSERT_QUESTION,
            {
                "question_id": q.question_id,
                "agent_id": q.agent_id,
                "session_id": q.session_id,
                "task_id": q.task_id,
                "title": q.title,
                "text": q.text,
                "state": QuestionState.OPEN.value,
                "asked_at": q.asked_at,
                "messages_since": 0,
                "reminders_sent": 0,
                "muted": False,
            },
        )
        if n is not None and replaced:
            text = domain.question_text(q.title, q.text, q.question_id, replaces=replaced[-1])
            n = n.model_copy(update={"text": text})
        return n

    def _failure_claimed(self, sequence: int) -> bool:
        return bool(_FAILURE_CLAIMED.rows(self.tx, {"sequence": sequence}))

    def _existing(self, notes: list[Notification | None]) -> dict[tuple[str, str, str], Notification]:
        """The stored notifications with the batch's keys (replays), locked per key on PostgreSQL."""
        keyed = [n for n in notes if n is not None and n.key]
        if not keyed:
            return {}
        # Two enqueues with one key (PostgreSQL, several threads) wait for each other.
        _advisory_locks(self.conn, {f"notification:{n.agent_id}:{n.session_id}:{n.key}" for n in keyed})
        wanted = {(n.agent_id, n.session_id, n.key or "") for n in keyed}
        conversations = {(agent_id, session_id) for agent_id, session_id, _ in wanted}
        found = [
            nid
            for nid, agent_id, session_id in self.conn.execute(
                _NOTIFICATIONS_WITH_KEYS, {"keys": sorted({key for _, _, key in wanted})}
            )
            if (agent_id, session_id) in conversations
        ]
        if not found:
            return {}
        with Session(bind=self.conn) as s:  # replays only: the rows as the ORM reads them elsewhere
            rows = s.exec(select(NotificationRow).where(col(NotificationRow.notification_id).in_(found))).all()
            attempts = _attempts(s, [r.notification_id for r in rows])
        return {
            (r.agent_id, r.session_id, r.request_id or ""): _notification(r, attempts[r.notification_id])
            for r in rows
            if (r.agent_id, r.session_id, r.request_id or "") in wanted
        }

    def _insert_notifications(
        self, events: Sequence[LogEvent], notes: list[Notification | None]
    ) -> list[tuple[Notification | None, Frame | None]]:
        existing = self._existing(notes)
        results: list[tuple[Notification | None, Frame | None]] = []
        made: list[tuple[int, Notification, str]] = []  # (index in results, new notification, message id)
        for e, note in zip(events, notes, strict=True):
            if note is None:
                results.append((None, None))
                continue
            key = (note.agent_id, note.session_id, note.key or "")
            if note.key and key in existing:
                results.append((existing[key], None))
                continue
            if note.channel is None:
                # No operator channel: the conversation (history + activity stream) is the delivery.
                note = note.model_copy(
                    update={"state": State.DELIVERED, "delivered_at": note.created_at, "next_attempt_at": None}
                )
            else:
                note = note.model_copy(update={"next_attempt_at": note.created_at})
            if note.key:
                existing[key] = note  # the same key again later in this batch is a replay
            made.append((len(results), note, e.message_id))
            results.append((note, None))
        if not made:
            return results
        _INSERT_NOTIFICATIONS.executemany(self.tx, [_notification_values(n) for _, n, _ in made])
        _INSERT_MESSAGES.executemany(self.tx, [_message_values(n, mid) for _, n, mid in made])
        frames = self._add_frames([n for _, n, _ in made])
        for (index, n, _), frame in zip(made, frames, strict=True):
            results[index] = (n, frame)
        return results

    def _add_frames(self, notes: list[Notification]) -> list[Frame]:
        """Each notification's activity frame, in order; then each conversation trimmed once."""
        conversations = sorted({(n.agent_id, n.session_id) for n in notes})
        # One writer per conversation at a time (PostgreSQL): its frames' sequences then commit in
        # order, so resuming after a Last-Event-ID never skips a frame that committed late.
        _advisory_locks(self.conn, {f"activity:{a}:{sess}" for a, sess in conversations})
        frames = [Frame(0, n.agent_id, n.session_id, notification=n) for n in notes]
        rows = [
            {"agent_id": f.agent_id, "session_id": f.session_id, "at": n.created_at, "frame": f.to_json()}
            for f, n in zip(frames, notes, strict=True)
        ]
        seqs = [_INSERT_FRAME.rows(self.tx, row)[0].seq for row in rows]
        for agent_id, session_id in conversations:
            _TRIM_ACTIVITY.execute(self.tx, {"agent_id": agent_id, "session_id": session_id, "keep": self.keep_frames})
        return [
            Frame(seq, f.agent_id, f.session_id, notification=f.notification)
            for f, seq in zip(frames, seqs, strict=True)
        ]


def _notification_values(n: Notification) -> dict[str, Any]:
    return {
        "notification_id": n.notification_id,
        "agent_id": n.agent_id,
        "session_id": n.session_id,
        "kind": n.kind.value,
        "task_id": n.task_id,
        "body": n.text,
        "handled": n.state == State.DELIVERED,
        "created_at": n.created_at,
        "request_id": n.key,
        "attempt_count": 0,
        "question_id": n.question_id,
        "state": n.state.value,
        "channel": n.channel,
        "next_attempt_at": n.next_attempt_at,
        "delivered_at": n.delivered_at,
        "consumed_at": None,
    }


def _message_values(n: Notification, message_id: str) -> dict[str, Any]:
    return {
        "message_id": message_id,
        "agent_id": n.agent_id,
        "session_id": n.session_id,
        "role": "notification",
        "text": n.text,
        "response_id": None,
        "notification_id": n.notification_id,
        "follow_up": None,
        "created_at": n.created_at,
        "completed_at": n.created_at,
        "sort_at": n.created_at,
    }


# Notification retention (``prune_notifications``, hourly): done with and made before the
# cutoff, in no order (a batch needs no sort of the whole backlog); FOR UPDATE SKIP LOCKED on
# PostgreSQL, where several notifiers' passes may meet.
PRUNE_BATCH = 100
_PRUNE_NOTIFICATIONS = (
    select(NotificationRow.notification_id)
    .where(
        col(NotificationRow.created_at) < bindparam("cutoff"),
        or_(
            col(NotificationRow.state) == State.DELIVERED.value,
            and_(col(NotificationRow.state) == State.STOPPED.value, col(NotificationRow.consumed_at).is_not(None)),
        ),
    )
    .limit(bindparam("limit"))
    .with_for_update(skip_locked=True)
)


@dataclass(frozen=True)
class NotificationsPruned:
    notifications: int
    attempts: int


# Conversation retention (``prune_conversations``): history messages by when they sort (their
# completion, else their creation) and conversation events by when they happened, through
# their indexes (migration 5), in no order.
_PRUNE_MESSAGES = (
    select(MessageRow.message_id, MessageRow.agent_id, MessageRow.session_id, MessageRow.response_id)
    .where(col(MessageRow.sort_at) < bindparam("cutoff"))
    .limit(bindparam("limit"))
    .with_for_update(skip_locked=True)
)
_PRUNE_EVENTS = (
    select(EventRow.id)
    .where(col(EventRow.at) < bindparam("cutoff"))
    .limit(bindparam("limit"))
    .with_for_update(skip_locked=True)
)
# Questions settled (answered, replaced, closed) and asked before the cutoff: their reminders
# are over. An open one stays whatever its age: its reminders still come.
_PRUNE_REMINDERS = (
    select(ReminderRow.question_id)
    .where(col(ReminderRow.asked_at) < bindparam("cutoff"), col(ReminderRow.state) != QuestionState.OPEN.value)
    .limit(bindparam("limit"))
    .with_for_update(skip_locked=True)
)


@dataclass(frozen=True)
class ConversationsPruned:
    messages: int
    responses: int
    events: int
    reminders: int = 0


class NotifierStore:
    def __init__(self, db: Database, retention_frames: int = 1000) -> None:
        self.db = db
        self.retention_frames = retention_frames

    # --- notifications ---------------------------------------------------------

    def _insert_notification(self, s: Session, n: Notification, message_id: str) -> tuple[Notification, Frame | None]:
        if n.key:
            # Two enqueues with one key (PostgreSQL, several threads) wait for each other.
            lock_key(s, f"notification:{n.agent_id}:{n.session_id}:{n.key}")
            existing = s.exec(
                select(NotificationRow).where(
                    *_conversation(NotificationRow, n.agent_id, n.session_id), NotificationRow.request_id == n.key
                )
            ).first()
            if existing is not None:
                return _notification(existing, _attempts(s, [existing.notification_id])[existing.notification_id]), None
        if n.channel is None:
            # No operator channel: the conversation (history + activity stream) is the delivery.
            n = n.model_copy(update={"state": State.DELIVERED, "delivered_at": n.created_at, "next_attempt_at": None})
        else:
            n = n.model_copy(update={"next_attempt_at": n.created_at})
        s.add(
            NotificationRow(
                notification_id=n.notification_id,
                agent_id=n.agent_id,
                session_id=n.session_id,
                kind=n.kind.value,
                task_id=n.task_id,
                body=n.text,
                handled=n.state == State.DELIVERED,
                created_at=n.created_at,
                request_id=n.key,
                question_id=n.question_id,
                state=n.state.value,
                channel=n.channel,
                next_attempt_at=n.next_attempt_at,
                delivered_at=n.delivered_at,
            )
        )
        s.add(
            MessageRow(
                message_id=message_id,
                agent_id=n.agent_id,
                session_id=n.session_id,
                role="notification",
                text=n.text,
                notification_id=n.notification_id,
                created_at=n.created_at,
                completed_at=n.created_at,
                sort_at=n.created_at,
            )
        )
        s.flush()
        frame = _add_frame(s, Frame(0, n.agent_id, n.session_id, notification=n), n.created_at, self.retention_frames)
        return n, frame

    async def enqueue(self, n: Notification, message_id: str) -> tuple[Notification, Frame | None]:
        """Insert once per key, with its history message and activity frame."""
        return await self.db.run(lambda s: self._insert_notification(s, n, message_id))

    async def record_log_event(
        self,
        cursor_name: str,
        sequence: int,
        n: Notification | None,
        message_id: str,
        question: QuestionFact | None = None,
        task_state: tuple[str, str] | None = None,
    ) -> tuple[Notification | None, Frame | None]:
        """One event of the log (see ``record_log_events``)."""
        event = LogEvent(sequence, n, message_id, question, task_state)
        return (await self.record_log_events(cursor_name, [event]))[0]

    async def record_log_events(
        self, cursor_name: str, events: Sequence[LogEvent]
    ) -> list[tuple[Notification | None, Frame | None]]:
        """Apply a batch of the event log in one transaction: each event's question facts,
        task-state effects and notification, in order, and the cursor advanced to the last.

        A failure anywhere commits nothing (the cursor stays, the batch is read again);
        a replayed event is a no-op (its question id and its notification's key exist).
        Returns, per event, its notification (the existing one on a replay) and its new
        frame (None on a replay), in the events' order.
        """
        return await self.db.run_connection(
            lambda conn: LogBatch(conn, self.retention_frames).apply(cursor_name, events)
        )

    # --- questions and reminders -------------------------------------------------

    def _user_message_reminders(self, s: Session, message: Message, base_ms: int, make: Any) -> list[Frame]:
        """Count the message for each open question of the conversation; remind those now due."""
        rows = s.exec(
            select(ReminderRow)
            .where(
                *_conversation(ReminderRow, message.agent_id, message.session_id),
                col(ReminderRow.state) == QuestionState.OPEN.value,
            )
            .order_by(col(ReminderRow.asked_at))
            .with_for_update()
        ).all()
        frames: list[Frame] = []
        for row in rows:
            updated, due = domain.after_user_message(row.reminders(), message.created_at, base_ms)
            row.apply(updated)
            s.add(row)
            if due:
                reminder: Notification = make(row, updated.reminders_sent)
                _, frame = self._insert_notification(s, reminder, reminder.notification_id)
                if frame is not None:
                    frames.append(frame)
        return frames

    async def set_question_preference(
        self, agent_id: str, session_id: str, question_id: str, action: str, now_ms: int, snooze_ms: int
    ) -> QuestionView:
        """Snooze (defer reminders) or mute (silence) one question of the conversation."""

        def work(s: Session) -> QuestionView:
            row = s.exec(select(ReminderRow).where(ReminderRow.question_id == question_id).with_for_update()).first()
            if row is None or row.agent_id != agent_id or row.session_id != session_id:
                raise domain.NotFound("QUESTION_NOT_FOUND", f"no question {question_id} in this session")
            if row.state != QuestionState.OPEN.value:
                raise domain.QuestionClosed("QUESTION_CLOSED", f"question {question_id} is {row.state}")
            q = row.reminders()
            row.apply(domain.snooze(q, now_ms, snooze_ms) if action == "snooze" else domain.mute(q))
            s.add(row)
            return _question_view(row)

        return await self.db.run(work)

    async def get_question(self, question_id: str) -> QuestionView | None:
        def work(s: Session) -> QuestionView | None:
            row = s.get(ReminderRow, question_id)
            return _question_view(row) if row else None

        return await self.db.run(work)

    async def cursor(self, name: str) -> int:
        def work(s: Session) -> int:
            row = s.get(CursorRow, name)
            return row.sequence if row else 0

        return await self.db.run(work)

    async def list_notifications(
        self, agent_id: str, session_id: str, state: State | None, page: int, size: int
    ) -> tuple[domain.Page, list[Notification]]:
        def work(s: Session) -> tuple[domain.Page, list[Notification]]:
            where = _conversation(NotificationRow, agent_id, session_id)
            if state is not None:
                where.append(col(NotificationRow.state) == state.value)
            order = [col(NotificationRow.created_at), col(NotificationRow.notification_id)]
            shown, rows = _page(s, NotificationRow, where, order, page, size)
            attempts = _attempts(s, [r.notification_id for r in rows])
            return shown, [_notification(r, attempts[r.notification_id]) for r in rows]

        return await self.db.run(work)

    def _get(
        self, s: Session, agent_id: str, session_id: str, notification_id: str, for_update: bool = False
    ) -> NotificationRow:
        query = select(NotificationRow).where(NotificationRow.notification_id == notification_id)
        row = s.exec(query.with_for_update() if for_update else query).first()
        if row is None or row.agent_id != agent_id or row.session_id != session_id:
            raise domain.NotFound("NOTIFICATION_NOT_FOUND", f"no notification {notification_id} in this session")
        return row

    async def get_notification(self, agent_id: str, session_id: str, notification_id: str) -> Notification:
        def work(s: Session) -> Notification:
            row = self._get(s, agent_id, session_id, notification_id)
            return _notification(row, _attempts(s, [notification_id])[notification_id])

        return await self.db.run(work)

    async def stop(self, agent_id: str, session_id: str, notification_id: str) -> Notification:
        """Pending → stopped (never retried); delivered or stopped ones stay as they are."""

        def work(s: Session) -> Notification:
            # Locked: a delivery attempt finishing meanwhile is not overwritten.
            row = self._get(s, agent_id, session_id, notification_id, for_update=True)
            if row.state == State.PENDING.value:
                row.state = State.STOPPED.value
                row.next_attempt_at = None
                s.add(row)
            return _notification(row, _attempts(s, [notification_id])[notification_id])

        return await self.db.run(work)

    async def claim_unreported_failure(
        self, agent_id: str, session_id: str, task_id: str, sequence: int, now: int
    ) -> domain.FailureClaim:
        """Claim a task failure's report for the scheduler's legacy adoption, in one transaction.

        Reported (delivered, consumed or handled) → not claimed. A pending or stopped report is
        stopped, marked handled and consumed (so no later turn picks it up) and its key freed
        (a later failure of the resumed task is
        reported anew). Either way, and when no report exists yet, the event is recorded as
        claimed, so the follower never makes one from it: the answer is the same on a retry.
        """

        def work(s: Session) -> domain.FailureClaim:
            key = domain.failure_key(task_id)
            row = s.exec(
                select(NotificationRow)
                .where(*_conversation(NotificationRow, agent_id, session_id), NotificationRow.request_id == key)
                .with_for_update()  # a delivery attempt finishing meanwhile is not overwritten
            ).first()
            if row is not None and domain.was_reported(State(row.state), row.consumed_at, row.handled):
                return domain.FailureClaim.REPORTED
            outcome = domain.FailureClaim.SUPPRESSED
            if row is not None:
                row.state, row.handled, row.next_attempt_at = State.STOPPED.value, True, None
                row.consumed_at = now  # nor is it handed to the agent as a pending update on its next turn
                row.request_id = f"{key}:adopted:{sequence}"
                s.add(row)
                outcome = domain.FailureClaim.STOPPED
            if s.get(ClaimedFailureRow, sequence) is None:
                s.add(ClaimedFailureRow(sequence=sequence, task_id=task_id, at=now))
            return outcome

        return await self.db.run(work)

    # --- delivery ----------------------------------------------------------------

    async def due_conversations(self, now: int, limit: int, busy: set[tuple[str, str]]) -> list[tuple[str, str]]:
        """Conversations with a notification due now, most overdue first.

        Busy conversations are left out before the limit applies, so they never
        take the place of others.
        """

        def work(s: Session) -> list[tuple[str, str]]:
            due = func.min(NotificationRow.next_attempt_at)
            rows = s.exec(
                select(NotificationRow.agent_id, NotificationRow.session_id, due)
                .where(
                    col(NotificationRow.state) == State.PENDING.value,
                    col(NotificationRow.next_attempt_at) <= now,
                )
                .group_by(col(NotificationRow.agent_id), col(NotificationRow.session_id))
                .order_by(due)
                .limit(limit + len(busy))
            ).all()
            return [(a, sess) for a, sess, _ in rows if (a, sess) not in busy][:limit]

        return await self.db.run(work)

    async def next_due_at(self) -> int | None:
        def work(s: Session) -> int | None:
            return s.exec(
                select(func.min(NotificationRow.next_attempt_at)).where(
                    col(NotificationRow.state) == State.PENDING.value
                )
            ).one()

        return await self.db.run(work)

    async def due_in(self, agent_id: str, session_id: str, now: int) -> Notification | None:
        """The conversation's oldest notification due now."""

        def work(s: Session) -> Notification | None:
            row = s.exec(
                select(NotificationRow)
                .where(
                    *_conversation(NotificationRow, agent_id, session_id),
                    col(NotificationRow.state) == State.PENDING.value,
                    col(NotificationRow.next_attempt_at) <= now,
                )
                .order_by(col(NotificationRow.created_at), col(NotificationRow.notification_id))
                .limit(1)
            ).first()
            if row is None:
                return None
            return _notification(row, _attempts(s, [row.notification_id])[row.notification_id])

        return await self.db.run(work)

    async def record_attempt(self, notification_id: str, attempt: Attempt, backoff: Backoff) -> Notification:
        """Store one attempt; the next due time is derived from all stored attempts."""

        def work(s: Session) -> Notification:
            row = s.exec(
                select(NotificationRow).where(NotificationRow.notification_id == notification_id).with_for_update()
            ).one()
            s.add(
                AttemptRow(
                    notification_id=notification_id,
                    at=attempt.at,
                    outcome=attempt.outcome.value,
                    http_status=attempt.http_status,
                    error=attempt.error,
                    retry_after_ms=attempt.retry_after_ms,
                )
            )
            s.flush()
            attempts = _attempts(s, [notification_id])[notification_id]
            row.attempt_count = len(attempts)
            if attempt.outcome == Outcome.DELIVERED:
                row.state = State.DELIVERED.value
                row.handled = True
                row.delivered_at = attempt.at
                row.next_attempt_at = None
            elif row.state == State.PENDING.value:
                row.next_attempt_at = domain.next_attempt_at(row.created_at, attempts, backoff)
            s.add(row)
            return _notification(row, attempts)

        return await self.db.run(work)

    # --- responses and activity ------------------------------------------------

    async def publish(self, snapshot: Response) -> tuple[Response, Frame]:
        """Replace the response's snapshot; a final one becomes a history message. One transaction."""

        def work(s: Session) -> tuple[Response, Frame]:
            # Concurrent publishes of one response (PostgreSQL) apply one after the other.
            lock_key(s, f"response:{snapshot.agent_id}:{snapshot.session_id}:{snapshot.response_id}")
            row = s.get(ResponseRow, (snapshot.agent_id, snapshot.session_id, snapshot.response_id))
            current = _response(row) if row else None
            if row is not None and current is not None:
                snapshot_created = snapshot.model_copy(update={"created_at": current.created_at})
            else:
                snapshot_created = snapshot
            updated = domain.apply_snapshot(current, snapshot_created)
            if updated.final and updated.completed_at is None:
                updated = updated.model_copy(update={"completed_at": updated.updated_at})
            frame = _add_frame(
                s,
                Frame(0, updated.agent_id, updated.session_id, snapshot=updated),
                updated.updated_at,
                self.retention_frames,
            )
            if row is None:
                row = ResponseRow(**updated.model_dump(), last_seq=frame.seq)
            else:
                row.text, row.final = updated.text, updated.final
                row.updated_at, row.completed_at, row.last_seq = updated.updated_at, updated.completed_at, frame.seq
            s.add(row)
            if updated.final:
                s.add(
                    MessageRow(
                        message_id=f"r{frame.seq:031d}",
                        agent_id=updated.agent_id,
                        session_id=updated.session_id,
                        role="assistant",
                        text=updated.text,
                        response_id=updated.response_id,
                        created_at=updated.created_at,
                        completed_at=updated.completed_at,
                        sort_at=updated.completed_at or updated.updated_at,
                    )
                )
            return updated, frame

        return await self.db.run(work)

    async def open_responses(self, agent_id: str, session_id: str) -> list[Frame]:
        """The conversation's in-progress responses, as frames with their latest sequence."""

        def work(s: Session) -> list[Frame]:
            rows = s.exec(
                select(ResponseRow)
                .where(*_conversation(ResponseRow, agent_id, session_id), col(ResponseRow.final).is_(False))
                .order_by(col(ResponseRow.last_seq))
            ).all()
            return [Frame(r.last_seq, agent_id, session_id, snapshot=_response(r)) for r in rows]

        return await self.db.run(work)

    async def frames_after(self, agent_id: str, session_id: str, after: int, limit: int = 10_000) -> list[Frame] | None:
        """Every retained frame after ``after``; None when frame ``after`` is no longer retained."""

        def work(s: Session) -> list[Frame] | None:
            where = _conversation(ActivityRow, agent_id, session_id)
            if s.exec(select(ActivityRow.seq).where(*where, col(ActivityRow.seq) == after)).first() is None:
                return None
            rows = s.exec(
                select(ActivityRow)
                .where(*where, col(ActivityRow.seq) > after)
                .order_by(col(ActivityRow.seq))
                .limit(limit)
            ).all()
            return [Frame.from_row(r) for r in rows]

        return await self.db.run(work)

    async def prune_notifications(self, cutoff: int, limit: int = PRUNE_BATCH) -> NotificationsPruned:
        """Delete up to ``limit`` notifications made before ``cutoff`` (ms) that are done with —
        delivered, or stopped and taken up by a user message (a stopped one not yet taken up
        is the conversation's next pending update) — with their delivery attempts, in one
        transaction. The conversation's messages stay, under their own retention
        (``prune_conversations``; their ``notificationId`` then names a
        notification that is gone)."""

        def work(s: Session) -> NotificationsPruned:
            conn = s.connection()
            ids = [r[0] for r in conn.execute(_PRUNE_NOTIFICATIONS, {"cutoff": cutoff, "limit": limit})]
            if not ids:
                return NotificationsPruned(0, 0)
            attempts = conn.execute(delete(AttemptRow).where(col(AttemptRow.notification_id).in_(ids))).rowcount
            notes = conn.execute(delete(NotificationRow).where(col(NotificationRow.notification_id).in_(ids))).rowcount
            return NotificationsPruned(notes, attempts)

        return await self.db.run(work)

    async def prune_conversations(self, cutoff: int, limit: int = PRUNE_BATCH) -> ConversationsPruned:
        """Delete up to ``limit`` history messages, conversation events and settled questions'
        reminder rows each from before ``cutoff`` (ms), with the final response snapshots those
        messages came from, in one transaction. A response still streaming has no message yet
        and stays, as does a question still open; so do the notifications (their own
        retention) and the activity frames (theirs)."""

        def work(s: Session) -> ConversationsPruned:
            conn = s.connection()
            params = {"cutoff": cutoff, "limit": limit}
            messages = conn.execute(_PRUNE_MESSAGES, params).all()
            event_ids = [r.id for r in conn.execute(_PRUNE_EVENTS, params)]
            question_ids = [r.question_id for r in conn.execute(_PRUNE_REMINDERS, params)]
            responses = 0
            if messages:
                conn.execute(delete(MessageRow).where(col(MessageRow.message_id).in_([m.message_id for m in messages])))
                answered = [(m.agent_id, m.session_id, m.response_id) for m in messages if m.response_id]
                if answered:
                    responses = conn.execute(
                        delete(ResponseRow).where(
                            col(ResponseRow.final).is_(True),
                            tuple_(
                                col(ResponseRow.agent_id), col(ResponseRow.session_id), col(ResponseRow.response_id)
                            ).in_(answered),
                        )
                    ).rowcount
            if event_ids:
                conn.execute(delete(EventRow).where(col(EventRow.id).in_(event_ids)))
            if question_ids:
                conn.execute(delete(ReminderRow).where(col(ReminderRow.question_id).in_(question_ids)))
            return ConversationsPruned(len(messages), int(responses or 0), len(event_ids), len(question_ids))

        return await self.db.run(work)

    async def prune_activity(self, older_than: int) -> int:
        """Delete the frames made before ``older_than`` (ms) — all but the newest frame of all:
        SQLite hands the highest sequence out again once its row is gone, and a sequence must
        never come back (a resuming client's Last-Event-ID would point into other frames, and a
        final response's history message is named after its frame: the next one would collide
        and its publish fail)."""

        def work(s: Session) -> int:
            newest = select(func.max(ActivityRow.seq)).scalar_subquery()
            result = s.exec(  # type: ignore[call-overload]
                delete(ActivityRow).where(col(ActivityRow.at) < older_than, col(ActivityRow.seq) < newest)
            )
            return int(result.rowcount or 0)

        return await self.db.run(work)

    # --- messages and conversation events --------------------------------------

    async def list_messages(
        self, agent_id: str, session_id: str, page: int, size: int
    ) -> tuple[domain.Page, list[Message]]:
        def work(s: Session) -> tuple[domain.Page, list[Message]]:
            where = _conversation(MessageRow, agent_id, session_id)
            shown, rows = _page(s, MessageRow, where, [col(MessageRow.sort_at), col(MessageRow.message_id)], page, size)
            return shown, [_message(r) for r in rows]

        return await self.db.run(work)

    async def add_user_message(
        self, message: Message, reminder_base_ms: int = 600_000, make_reminder: Any = None
    ) -> tuple[Message, list[Notification], list[Frame]]:
        """Record a user message; the stopped, not yet consumed notifications are this turn's pending updates.

        In the same transaction the message counts toward each open question's
        reminder, and the reminders it makes due are created (their frames returned).
        """

        def work(s: Session) -> tuple[Message, list[Notification], list[Frame]]:
            s.add(MessageRow(**message.model_dump(exclude={"follow_up"}), sort_at=message.created_at))
            rows = s.exec(
                select(NotificationRow)
                .where(
                    *_conversation(NotificationRow, message.agent_id, message.session_id),
                    col(NotificationRow.state) == State.STOPPED.value,
                    col(NotificationRow.consumed_at).is_(None),
                )
                .order_by(col(NotificationRow.created_at))
            ).all()
            attempts = _attempts(s, [r.notification_id for r in rows])
            updates = [_notification(r, attempts[r.notification_id]) for r in rows]
            for r in rows:
                r.consumed_at = message.created_at
                s.add(r)
            frames = self._user_message_reminders(s, message, reminder_base_ms, make_reminder) if make_reminder else []
            return message, updates, frames

        return await self.db.run(work)

    async def add_reply(
        self, message: Message, snapshot: Response, event: ConversationEvent | None
    ) -> tuple[Message, Frame]:
        """The report reply: a history message, its final snapshot frame and maybe an event, together."""

        def work(s: Session) -> tuple[Message, Frame]:
            self._get(s, message.agent_id, message.session_id, message.notification_id or "")
            frame = _add_frame(
                s,
                Frame(0, message.agent_id, message.session_id, snapshot=snapshot),
                message.created_at,
                self.retention_frames,
            )
            s.add(
                MessageRow(
                    **message.model_dump(exclude={"follow_up"}),
                    follow_up=message.follow_up.value if message.follow_up else None,
                    sort_at=message.completed_at or message.created_at,
                )
            )
            if event is not None:
                s.add(
                    EventRow(
                        agent_id=message.agent_id,
                        session_id=message.session_id,
                        kind=event.kind,
                        at=event.at,
                        data=json.dumps(event.data),
                    )
                )
            return message, frame

        return await self.db.run(work)

    async def list_events(
        self, agent_id: str, session_id: str, page: int, size: int
    ) -> tuple[domain.Page, list[ConversationEvent]]:
        def work(s: Session) -> tuple[domain.Page, list[ConversationEvent]]:
            where = _conversation(EventRow, agent_id, session_id)
            shown, rows = _page(s, EventRow, where, [col(EventRow.id)], page, size)
            return shown, [ConversationEvent(kind=r.kind, at=r.at, data=json.loads(r.data)) for r in rows]

        return await self.db.run(work)
