"""Request authorization: the API key, access to the agent, membership of the session."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from gateway_http.errors import ApiError
from gateway_http.store import ApiKey, GatewayStore
from libs.ids import ID_PATTERN
from libs.settings import Settings

MAX_KEY_CHARS = 200


@dataclass(frozen=True)
class Caller:
    key: ApiKey
    agent_id: str
    session_id: str

    def require_tool(self, tool: str) -> None:
        if not self.key.allows_tool(tool):
            raise ApiError(403, "TOOL_ACCESS_DENIED", f"this API key may not use {tool}")


async def api_key(request: Request) -> ApiKey:
    header = request.headers.get("authorization", "")
    scheme, _, secret = header.partition(" ")
    secret = secret.strip()
    if scheme.lower() != "bearer" or not secret:
        raise ApiError(401, "UNAUTHENTICATED", "send 'Authorization: Bearer <api key>'")
    store: GatewayStore = request.app.state.store
    key = await store.authenticate(secret) if len(secret) <= MAX_KEY_CHARS else None
    if key is None:
        raise ApiError(401, "UNAUTHENTICATED", "unknown or revoked API key")
    return key


def check_id(kind: str, value: str) -> str:
    if not ID_PATTERN.match(value):
        raise ApiError(400, "INVALID_ID", f"{kind} must be 1-128 characters of letters, digits, '.', '_', ':' or '-'")
    return value


async def session_caller(
    request: Request, agentId: str, sessionId: str, key: Annotated[ApiKey, Depends(api_key)]
) -> Caller:
    check_id("agentId", agentId)
    check_id("sessionId", sessionId)
    if agentId not in key.agents:
        raise ApiError(403, "AGENT_ACCESS_DENIED", "this API key has no access to the agent")
    store: GatewayStore = request.app.state.store
    if not await store.member(agentId, sessionId, key.principal):
        raise ApiError(403, "NOT_A_MEMBER", "the key's principal is not a member of this session")
    settings: Settings = request.app.state.settings
    if not settings.agent(agentId).orchestration_enabled:
        raise ApiError(409, "ORCHESTRATION_DISABLED", "orchestration is disabled for this agent")
    return Caller(key=key, agent_id=agentId, session_id=sessionId)


SessionCaller = Annotated[Caller, Depends(session_caller)]
