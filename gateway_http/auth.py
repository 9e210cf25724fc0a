"""Request authorization: the API key, access to the agent, membership of the session."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from gateway_http.errors import ApiError
from gateway_http.schemas import AgentIdPath, SessionIdPath
from gateway_http.sse import frame
from gateway_http.store import ApiKey, GatewayStore
from libs.settings import Settings

MAX_KEY_CHARS = 200
# Declares the bearer scheme in /openapi.json; the checks (and their 401 shape) are ours.
BEARER = HTTPBearer(auto_error=False, scheme_name="apiKey", description="Authorization: Bearer <API key>")


@dataclass(frozen=True)
class Caller:
    key: ApiKey
    agent_id: str
    session_id: str

    def require_tool(self, tool: str) -> None:
        if not self.key.allows_tool(tool):
            raise ApiError(403, "TOOL_ACCESS_DENIED", f"this API key may not use {tool}")


async def api_key(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Security(BEARER)]
) -> ApiKey:
    secret = credentials.credentials.strip() if credentials is not None else ""
    if not secret:
        raise ApiError(401, "UNAUTHENTICATED", "send 'Authorization: Bearer <api key>'")
    store: GatewayStore = request.app.state.store
    key = await store.authenticate(secret) if len(secret) <= MAX_KEY_CHARS else None
    if key is None:
        raise ApiError(401, "UNAUTHENTICATED", "unknown or revoked API key")
    return key


KeyDep = Annotated[ApiKey, Depends(api_key)]


async def require_member(request: Request, key: ApiKey, agent_id: str, session_id: str) -> None:
    if agent_id not in key.agents:
        raise ApiError(403, "AGENT_ACCESS_DENIED", "this API key has no access to the agent")
    store: GatewayStore = request.app.state.store
    if not await store.member(agent_id, session_id, key.principal):
        raise ApiError(403, "NOT_A_MEMBER", "the key's principal is not a member of this session")


async def session_caller(request: Request, agentId: AgentIdPath, sessionId: SessionIdPath, key: KeyDep) -> Caller:
    await require_member(request, key, agentId, sessionId)
    settings: Settings = request.app.state.settings
    if not settings.agent(agentId).orchestration_enabled:
        raise ApiError(409, "ORCHESTRATION_DISABLED", "orchestration is disabled for this agent")
    return Caller(key=key, agent_id=agentId, session_id=sessionId)


SessionCaller = Annotated[Caller, Depends(session_caller)]


def key_agent(key: ApiKey, requested: str | None) -> str:
    """The agent a path without one means: the one named, else the key's only agent."""
    if requested is not None:
        if requested not in key.agents:
            raise ApiError(403, "AGENT_ACCESS_DENIED", "this API key has no access to the agent")
        return requested
    if len(key.agents) == 1:
        return key.agents[0]
    if not key.agents:
        raise ApiError(403, "AGENT_ACCESS_DENIED", "this API key has access to no agent")
    raise ApiError(400, "AGENT_AMBIGUOUS", "this API key has access to several agents: name one with ?agentId=")


def stream_access_check(request: Request, caller: Caller) -> Callable[[], Awaitable[bytes | None]]:
    """For a long-lived stream: None while the caller may still read it, else its final frame.
    A revoked key or a removed membership ends the stream."""
    store: GatewayStore = request.app.state.store
    secret = request.headers.get("authorization", "").partition(" ")[2].strip()[:MAX_KEY_CHARS]

    async def still_allowed() -> bytes | None:
        key = await store.authenticate(secret)
        if key is None:
            return frame(json.dumps({"error": "UNAUTHENTICATED", "message": "the API key was revoked"}), "error")
        if caller.agent_id not in key.agents or not await store.member(
            caller.agent_id, caller.session_id, key.principal
        ):
            return frame(json.dumps({"error": "NOT_A_MEMBER", "message": "access to this session ended"}), "error")
        return None

    return still_allowed
