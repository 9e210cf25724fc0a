"""The gateway's own database: API keys (hashed) and session memberships."""

from __future__ import annotations

import hashlib
import json
import secrets
import time
import uuid
from dataclasses import dataclass

from sqlalchemy import BigInteger
from sqlmodel import Field, Session, SQLModel, col, select

from gateway_http.access_cache import ACCESS_CHANNEL, AccessCache, probe_for
from libs.db import Database, Migration

KEY_PREFIX = "tg_"

MIGRATIONS = [
    Migration(
        1,
        "api keys and memberships",
        [
            "CREATE TABLE api_keys ("
            " key_id VARCHAR(32) PRIMARY KEY, key_hash VARCHAR(64) NOT NULL UNIQUE,"
            " display_prefix VARCHAR(16) NOT NULL, principal VARCHAR(128) NOT NULL,"
            " agents TEXT NOT NULL, allow_tools TEXT, created_at BIGINT NOT NULL, revoked_at BIGINT)",
            "CREATE TABLE memberships ("
            " agent_id VARCHAR(128) NOT NULL, session_id VARCHAR(128) NOT NULL,"
            " principal VARCHAR(128) NOT NULL, created_at BIGINT NOT NULL,"
            " PRIMARY KEY (agent_id, session_id, principal))",
        ],
    ),
    Migration(
        2,
        "chat channel bindings",
        [
            # One chat (or thread of it) on a channel speaks for one session at a time.
            "CREATE TABLE channel_bindings ("
            " channel VARCHAR(128) NOT NULL, chat_id VARCHAR(128) NOT NULL, thread_id VARCHAR(128) NOT NULL,"
            " agent_id VARCHAR(128) NOT NULL, session_id VARCHAR(128) NOT NULL, created_at BIGINT NOT NULL,"
            " PRIMARY KEY (channel, chat_id, thread_id))",
            "CREATE INDEX ix_channel_bindings_session ON channel_bindings (agent_id, session_id)",
        ],
    ),
    Migration(
        3,
        "safemode grants and assignments",
        [
            # Changed only by the local operator CLI (gateway_http/safemode.py); REST only reads them.
            "CREATE TABLE safemode_grants ("
            " agent_id VARCHAR(128) NOT NULL, target VARCHAR(128) NOT NULL, granted_at BIGINT NOT NULL,"
            " expires_at BIGINT, revoked_at BIGINT, PRIMARY KEY (agent_id, target))",
            "CREATE TABLE safemode_assignments ("
            " agent_id VARCHAR(128) NOT NULL, target VARCHAR(128) NOT NULL, assigned_at BIGINT NOT NULL,"
            " PRIMARY KEY (agent_id, target))",
        ],
    ),
    Migration(
        4,
        "access change notifications (PostgreSQL)",
        [
            # Whoever changes a key or a membership (the operator CLI, plain SQL), every gateway
            # hears of it at commit and forgets what it remembered (gateway_http/access_cache.py).
            "CREATE FUNCTION taskgate_access_changed() RETURNS trigger LANGUAGE plpgsql AS"
            f" $$ BEGIN PERFORM pg_notify('{ACCESS_CHANNEL}', TG_TABLE_NAME); RETURN NULL; END $$",
            *(
                f"CREATE TRIGGER {table}_access_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON {table}"
                " FOR EACH STATEMENT EXECUTE FUNCTION taskgate_access_changed()"
                for table in ("api_keys", "memberships")
            ),
        ],
        dialects=("postgresql",),
    ),
]


class ApiKeyRow(SQLModel, table=True):
    __tablename__ = "api_keys"
    key_id: str = Field(primary_key=True)
    key_hash: str
    display_prefix: str
    principal: str
    agents: str  # JSON list of agent ids
    allow_tools: str | None = None  # JSON list; None allows every tool
    created_at: int = Field(sa_type=BigInteger)
    revoked_at: int | None = Field(default=None, sa_type=BigInteger)


class MembershipRow(SQLModel, table=True):
    __tablename__ = "memberships"
    agent_id: str = Field(primary_key=True)
    session_id: str = Field(primary_key=True)
    principal: str = Field(primary_key=True)
    created_at: int = Field(sa_type=BigInteger)


class BindingRow(SQLModel, table=True):
    __tablename__ = "channel_bindings"
    channel: str = Field(primary_key=True)
    chat_id: str = Field(primary_key=True)
    # "" when the binding is the whole chat.
    thread_id: str = Field(primary_key=True)
    agent_id: str
    session_id: str
    created_at: int = Field(sa_type=BigInteger)


@dataclass(frozen=True)
class ApiKey:
    key_id: str
    principal: str
    agents: tuple[str, ...]
    allow_tools: tuple[str, ...] | None
    display_prefix: str
    created_at: int
    revoked_at: int | None

    def allows_tool(self, tool: str) -> bool:
        return self.allow_tools is None or tool in self.allow_tools


def hash_key(key: str) -> str:
    # Keys are 256 random bits, so a fast hash is enough: there is nothing to
    # brute-force, and lookups stay a single indexed equality.
    return hashlib.sha256(key.encode()).hexdigest()


def _to_key(row: ApiKeyRow) -> ApiKey:
    tools = json.loads(row.allow_tools) if row.allow_tools is not None else None
    return ApiKey(
        key_id=row.key_id,
        principal=row.principal,
        agents=tuple(json.loads(row.agents)),
        allow_tools=tuple(tools) if tools is not None else None,
        display_prefix=row.display_prefix,
        created_at=row.created_at,
        revoked_at=row.revoked_at,
    )


def _now() -> int:
    return int(time.time() * 1000)


class GatewayStore:
    """Sync methods (for the CLI) with async wrappers on the database thread (for the app).

    The wrappers that every request calls (``authenticate``, ``member``) answer from
    ``cache`` while the database has not changed (see ``access_cache``).
    """

    def __init__(self, db: Database, cache: AccessCache[ApiKey] | None = None) -> None:
        self.db = db
        self.cache: AccessCache[ApiKey] = cache if cache is not None else AccessCache(probe_for(db.url))

    def close(self) -> None:
        self.cache.close()

    # --- keys ----------------------------------------------------------------

    @staticmethod
    def create_key(s: Session, principal: str, agents: list[str], allow_tools: list[str] | None) -> tuple[ApiKey, str]:
        secret = KEY_PREFIX + secrets.token_urlsafe(32)
        row = ApiKeyRow(
            key_id=uuid.uuid4().hex,
            key_hash=hash_key(secret),
            display_prefix=secret[:10],
            principal=principal,
            agents=json.dumps(sorted(set(agents))),
            allow_tools=json.dumps(sorted(set(allow_tools))) if allow_tools is not None else None,
            created_at=_now(),
        )
        s.add(row)
        return _to_key(row), secret

    @staticmethod
    def list_keys(s: Session) -> list[ApiKey]:
        return [_to_key(r) for r in s.exec(select(ApiKeyRow).order_by(col(ApiKeyRow.created_at))).all()]

    @staticmethod
    def revoke_key(s: Session, key_id: str) -> bool:
        row = s.get(ApiKeyRow, key_id)
        if row is None or row.revoked_at is not None:
            return False
        row.revoked_at = _now()
        s.add(row)
        return True

    @staticmethod
    def find_key(s: Session, secret: str) -> ApiKey | None:
        return GatewayStore.find_key_by_hash(s, hash_key(secret))

    @staticmethod
    def find_key_by_hash(s: Session, key_hash: str) -> ApiKey | None:
        row = s.exec(select(ApiKeyRow).where(ApiKeyRow.key_hash == key_hash)).first()
        return _to_key(row) if row is not None and row.revoked_at is None else None

    # --- memberships -----------------------------------------------------------

    @staticmethod
    def add_member(s: Session, agent_id: str, session_id: str, principal: str) -> bool:
        if s.get(MembershipRow, (agent_id, session_id, principal)) is not None:
            return False
        s.add(MembershipRow(agent_id=agent_id, session_id=session_id, principal=principal, created_at=_now()))
        return True

    @staticmethod
    def remove_member(s: Session, agent_id: str, session_id: str, principal: str) -> bool:
        row = s.get(MembershipRow, (agent_id, session_id, principal))
        if row is None:
            return False
        s.delete(row)
        return True

    @staticmethod
    def list_members(s: Session, agent_id: str | None = None) -> list[MembershipRow]:
        query = select(MembershipRow).order_by(col(MembershipRow.agent_id), col(MembershipRow.session_id))
        if agent_id:
            query = query.where(MembershipRow.agent_id == agent_id)
        return list(s.exec(query).all())

    @staticmethod
    def is_member(s: Session, agent_id: str, session_id: str, principal: str) -> bool:
        return s.get(MembershipRow, (agent_id, session_id, principal)) is not None

    # --- channel bindings ----------------------------------------------------------

    @staticmethod
    def bind_channel(s: Session, agent_id: str, session_id: str, channel: str, chat_id: str, thread_id: str) -> bool:
        """Bind a chat (thread) to a session; a rebind moves it. False when it was bound so already."""
        row = s.get(BindingRow, (channel, chat_id, thread_id))
        if row is not None and (row.agent_id, row.session_id) == (agent_id, session_id):
            return False
        if row is None:
            row = BindingRow(
                channel=channel,
                chat_id=chat_id,
                thread_id=thread_id,
                agent_id=agent_id,
                session_id=session_id,
                created_at=_now(),
            )
        else:
            row.agent_id, row.session_id, row.created_at = agent_id, session_id, _now()
        s.add(row)
        return True

    @staticmethod
    def unbind_channel(s: Session, channel: str, chat_id: str, thread_id: str) -> bool:
        row = s.get(BindingRow, (channel, chat_id, thread_id))
        if row is None:
            return False
        s.delete(row)
        return True

    @staticmethod
    def list_bindings(s: Session) -> list[BindingRow]:
        order = [col(BindingRow.channel), col(BindingRow.chat_id), col(BindingRow.thread_id)]
        return list(s.exec(select(BindingRow).order_by(*order)).all())

    @staticmethod
    def find_binding(s: Session, channel: str, chat_id: str, thread_id: str) -> tuple[str, str] | None:
        row = s.get(BindingRow, (channel, chat_id, thread_id))
        return (row.agent_id, row.session_id) if row is not None else None

    # --- async, for request handling ---------------------------------------------

    async def authenticate(self, secret: str) -> ApiKey | None:
        """The live key with this secret; None when unknown or revoked."""
        key_hash = hash_key(secret)
        ticket = self.cache.ticket()  # first: a read that follows it sees every change it saw
        if ticket is not None and (cached := self.cache.key(key_hash)) is not None:
            return cached
        key = await self.db.run(lambda s: self.find_key_by_hash(s, key_hash))
        if key is not None and ticket is not None:
            self.cache.remember_key(ticket, key_hash, key)
        return key

    async def member(self, agent_id: str, session_id: str, principal: str) -> bool:
        ticket = self.cache.ticket()
        if ticket is not None and (cached := self.cache.membership(agent_id, session_id, principal)) is not None:
            return cached
        member = await self.db.run(lambda s: self.is_member(s, agent_id, session_id, principal))
        if ticket is not None:
            self.cache.remember_membership(ticket, agent_id, session_id, principal, member)
        return member

    async def sessions_of(self, principal: str) -> list[tuple[str, str]]:
        """The (agent, session) pairs the principal is a member of, in order."""

        def work(s: Session) -> list[tuple[str, str]]:
            rows = s.exec(
                select(MembershipRow)
                .where(MembershipRow.principal == principal)
                .order_by(col(MembershipRow.agent_id), col(MembershipRow.session_id))
            ).all()
            return [(r.agent_id, r.session_id) for r in rows]

        return await self.db.run(work)

    async def binding(self, channel: str, chat_id: str, thread_id: str) -> tuple[str, str] | None:
        """The (agent, session) a chat or thread is bound to."""
        return await self.db.run(lambda s: self.find_binding(s, channel, chat_id, thread_id))

    async def chats_of(self, channel: str, agent_id: str, session_id: str) -> list[tuple[str, str]]:
        """The (chat, thread) pairs of a channel bound to the session."""

        def work(s: Session) -> list[tuple[str, str]]:
            rows = s.exec(
                select(BindingRow).where(
                    BindingRow.channel == channel, BindingRow.agent_id == agent_id, BindingRow.session_id == session_id
                )
            ).all()
            return [(r.chat_id, r.thread_id) for r in rows]

        return await self.db.run(work)
