"""Target discovery: the gateway-managed targets an agent may dispatch to."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from gateway_http import safemode
from gateway_http.auth import KeyDep
from gateway_http.errors import ApiError, responses
from gateway_http.schemas import AgentIdPath, TargetList
from libs.settings import Settings

router = APIRouter(prefix="/api/v1/agents/{agentId}", tags=["targets"], responses=responses(400, 401, 403, 500, 503))


@router.get("/targets", response_model=TargetList)
async def list_targets(request: Request, agentId: AgentIdPath, key: KeyDep) -> JSONResponse:  # noqa: N803
    """Every configured target, except safemode ones without a live grant and a local assignment
    for this agent (those are not discoverable)."""
    if agentId not in key.agents:
        raise ApiError(403, "AGENT_ACCESS_DENIED", "this API key has no access to the agent")
    settings: Settings = request.app.state.settings
    db = request.app.state.store.db
    found = []
    for name, target in sorted(settings.targets.items()):
        if target.safemode and not await safemode.is_cleared(db, agentId, name):
            continue
        entry = {"name": name, "adapter": target.adapter, "safemode": target.safemode}
        if target.display_name:
            entry["displayName"] = target.display_name
        found.append(entry)
    return JSONResponse({"targets": found})
