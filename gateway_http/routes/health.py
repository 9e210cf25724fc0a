"""GET /healthz: 200 when every backend reports SERVING, else 503."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz(request: Request) -> JSONResponse:
    backends = await request.app.state.backends.health()
    ok = all(status == "SERVING" for status in backends.values())
    return JSONResponse({"status": "ok" if ok else "unavailable", "backends": backends}, status_code=200 if ok else 503)
