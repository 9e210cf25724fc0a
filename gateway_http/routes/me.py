"""GET /api/v1/me: who the API key is, and the agents and sessions it can open."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from gateway_http.auth import KeyDep
from gateway_http.errors import responses
from gateway_http.schemas import Me
from gateway_http.store import GatewayStore
from libs.settings import Settings

router = APIRouter(tags=["sessions"])


@router.get("/api/v1/me", response_model=Me, responses=responses(401, 429, 500, 503))
async def me(request: Request, key: KeyDep) -> JSONResponse:
    """The key's principal, its allowed tools and, per agent it may use, the sessions its principal
    is a member of: what a dashboard offers to open. Sign-in checks a key with this call."""
    store: GatewayStore = request.app.state.store
    settings: Settings = request.app.state.settings
    sessions: dict[str, list[str]] = {agent: [] for agent in key.agents}
    for agent, session in await store.sessions_of(key.principal):
        if agent in sessions:
            sessions[agent].append(session)
    body: dict[str, object] = {
        "principal": key.principal,
        "agents": [
            {
                "agentId": agent,
                "orchestrationEnabled": settings.agent(agent).orchestration_enabled,
                "sessions": names,
            }
            for agent, names in sessions.items()
        ],
    }
    if key.allow_tools is not None:
        body["allowTools"] = list(key.allow_tools)
    return JSONResponse(body)
