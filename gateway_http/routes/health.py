"""GET /healthz: whether the gateway can serve, backend by backend.

Required backends (scheduler, pending-registry, notifier) carry the API: if one is not
SERVING the answer is 503. The telemetry agent is advisory: without it tasks still run,
their snapshots only lack fresh ``execution`` figures, so it degrades the answer (200).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from gateway_http.schemas import Health

REQUIRED = ("scheduler", "pending", "notifier")
ADVISORY = ("telemetry",)

router = APIRouter(tags=["health"])


def summarize(statuses: dict[str, str]) -> tuple[int, dict[str, object]]:
    """(HTTP status, body) for the backends' health statuses."""
    required = {name: statuses.get(name, "UNKNOWN") for name in REQUIRED}
    advisory = {name: statuses.get(name, "UNKNOWN") for name in ADVISORY}
    if any(status != "SERVING" for status in required.values()):
        state, code = "unavailable", 503
    elif any(status != "SERVING" for status in advisory.values()):
        state, code = "degraded", 200
    else:
        state, code = "ok", 200
    return code, {"status": state, "required": required, "advisory": advisory}


@router.get(
    "/healthz",
    response_model=Health,
    responses={503: {"model": Health, "description": "a required backend is not SERVING"}},
)
async def healthz(request: Request) -> JSONResponse:
    code, body = summarize(await request.app.state.backends.health())
    return JSONResponse(body, status_code=code)
