"""Safemode: who may discover and dispatch to a ``[targets.NAME]`` marked ``safemode = true``.

Both a **live grant** (not revoked, not expired) for the agent and an explicit **local
assignment** of the target to the agent are needed. Only the local operator CLI changes them
(``taskgate admin safemode grant|revoke|assign|unassign``, on the gateway's own database); REST
only reads them, on every request (no cache): a revoked grant stops new dispatches at once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from sqlalchemy import BigInteger
from sqlmodel import Field, Session, SQLModel, select

from libs.db import Database


class GrantRow(SQLModel, table=True):
    __tablename__ = "safemode_grants"
    agent_id: str = Field(primary_key=True)
    target: str = Field(primary_key=True)
    granted_at: int = Field(sa_type=BigInteger)
    expires_at: int | None = Field(default=None, sa_type=BigInteger)
    revoked_at: int | None = Field(default=None, sa_type=BigInteger)


class AssignmentRow(SQLModel, table=True):
    __tablename__ = "safemode_assignments"
    agent_id: str = Field(primary_key=True)
    target: str = Field(primary_key=True)
    assigned_at: int = Field(sa_type=BigInteger)


@dataclass(frozen=True)
class Entry:
    agent_id: str
    target: str
    granted: str  # "live" | "revoked" | "expired" | "none"
    assigned: bool


def _now() -> int:
    return int(time.time() * 1000)


def grant(s: Session, agent_id: str, target: str, ttl_s: int | None, now: int | None = None) -> None:
    now = _now() if now is None else now
    row = s.get(GrantRow, (agent_id, target))
    expires = now + ttl_s * 1000 if ttl_s else None
    if row is None:
        s.add(GrantRow(agent_id=agent_id, target=target, granted_at=now, expires_at=expires))
    else:
        row.granted_at, row.expires_at, row.revoked_at = now, expires, None
        s.add(row)


def revoke(s: Session, agent_id: str, target: str) -> bool:
    row = s.get(GrantRow, (agent_id, target))
    if row is None or row.revoked_at is not None:
        return False
    row.revoked_at = _now()
    s.add(row)
    return True


def assign(s: Session, agent_id: str, target: str) -> bool:
    if s.get(AssignmentRow, (agent_id, target)) is not None:
        return False
    s.add(AssignmentRow(agent_id=agent_id, target=target, assigned_at=_now()))
    return True


def unassign(s: Session, agent_id: str, target: str) -> bool:
    row = s.get(AssignmentRow, (agent_id, target))
    if row is None:
        return False
    s.delete(row)
    return True


def _state(row: GrantRow | None, now: int) -> str:
    if row is None:
        return "none"
    if row.revoked_at is not None:
        return "revoked"
    if row.expires_at is not None and row.expires_at <= now:
        return "expired"
    return "live"


def entries(s: Session) -> list[Entry]:
    now = _now()
    grants = {(g.agent_id, g.target): g for g in s.exec(select(GrantRow)).all()}
    assigned = {(a.agent_id, a.target) for a in s.exec(select(AssignmentRow)).all()}
    keys = sorted(set(grants) | assigned)
    return [Entry(a, t, _state(grants.get((a, t)), now), (a, t) in assigned) for a, t in keys]


def cleared(s: Session, agent_id: str, target: str, now: int | None = None) -> bool:
    """A live grant and an assignment: the agent may see and dispatch to the target."""
    live = _state(s.get(GrantRow, (agent_id, target)), _now() if now is None else now) == "live"
    return live and s.get(AssignmentRow, (agent_id, target)) is not None


async def is_cleared(db: Database, agent_id: str, target: str) -> bool:
    return await db.run(lambda s: cleared(s, agent_id, target))
