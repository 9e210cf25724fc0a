"""Where a gateway-managed task's target reports the outcome of a request.

``POST /api/v1/dispatch/{requestId}/outcome`` with ``{"status": "acknowledged" | "question" | "answered" |
"failed", "text"?, "error"?}``, signed like webhooks (``X-Taskgate-Signature: sha256=<hex
HMAC-SHA256 of the body with the target's secret>``). No API key: the signature is the
credential, and the scheduler (which knows the request's target) checks it. An unknown request
and a bad signature get the same 401. Internal to targets: not in /openapi.json.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from gateway_http.backends import Backends, request_metadata
from gateway_http.convert import STATE_NAMES
from gateway_http.errors import ApiError
from taskgate.scheduler.v1 import scheduler_pb2 as pb

router = APIRouter(include_in_schema=False)
MAX_OUTCOME_BYTES = 300 * 1024


@router.post("/api/v1/dispatch/{requestId}/outcome")
async def record_outcome(request: Request, requestId: str) -> JSONResponse:  # noqa: N803 - the path's name
    body = await request.body()
    if len(body) > MAX_OUTCOME_BYTES:
        raise ApiError(413, "PAYLOAD_TOO_LARGE", "the outcome is too large")
    backends: Backends = request.app.state.backends
    reply = await backends.scheduler.RecordDispatchOutcome(
        pb.RecordDispatchOutcomeRequest(
            request_id=requestId, body=body, signature=request.headers.get("x-taskgate-signature", "")
        ),
        timeout=backends.timeout_s,
        metadata=request_metadata(request),
    )
    return JSONResponse({"task": {"taskId": reply.task_id, "state": STATE_NAMES.get(reply.state, "unknown")}})
