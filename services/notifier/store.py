"""Notifier persistence: the notification outbox."""

from __future__ import annotations

from sqlalchemy import BigInteger
from sqlmodel import Field, Session, SQLModel, col, select

from libs.db import Database, Migration
from services.notifier.domain import Kind, Notification

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


def _to_domain(row: NotificationRow) -> Notification:
    return Notification(**{**row.model_dump(), "kind": Kind(row.kind)})


class NotifierStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def enqueue(self, n: Notification) -> Notification:
        def work(s: Session) -> Notification:
            if n.request_id:
                existing = s.exec(
                    select(NotificationRow).where(
                        NotificationRow.agent_id == n.agent_id,
                        NotificationRow.session_id == n.session_id,
                        NotificationRow.request_id == n.request_id,
                    )
                ).first()
                if existing is not None:
                    return _to_domain(existing)
            s.add(NotificationRow(**{**n.model_dump(), "kind": n.kind.value}))
            return n

        return await self.db.run(work)

    async def list_for(self, agent_id: str, session_id: str, offset: int, limit: int) -> list[Notification]:
        def work(s: Session) -> list[Notification]:
            rows = s.exec(
                select(NotificationRow)
                .where(NotificationRow.agent_id == agent_id, NotificationRow.session_id == session_id)
                .order_by(col(NotificationRow.created_at), col(NotificationRow.notification_id))
                .offset(offset)
                .limit(limit)
            ).all()
            return [_to_domain(r) for r in rows]

        return await self.db.run(work)
