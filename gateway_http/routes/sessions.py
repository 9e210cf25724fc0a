"""GET /v1/session/{sessionId}/task: the session's pending task, resumable after a pause."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request

from gateway_http.auth import api_key, check_id
from gateway_http.backends import request_metadata
from gateway_http.convert import iso
from gateway_http.errors import ApiError
from gateway_http.store import ApiKey, GatewayStore
from taskgate.pending.v1 import pending_pb2 as pb

router = APIRouter(tags=["sessions"])
KINDS = {pb.ENTRY_KIND_CONFIRM: "confirm", pb.ENTRY_KIND_ASK: "ask", pb.ENTRY_KIND_SECRET: "secret"}


@router.get("/v1/session/{sessionId}/task")
async def session_task(request: Request, sessionId: str, key: Annotated[ApiKey, Depends(api_key)]) -> dict[str, Any]:
    check_id("sessionId", sessionId)
    store: GatewayStore = request.app.state.store
    # The session has no agent in this path: a membership through any of the key's agents counts.
    if not any([await store.member(agent, sessionId, key.principal) for agent in key.agents]):
        raise ApiError(403, "NOT_A_MEMBER", "the key's principal is not a member of this session")
    backends = request.app.state.backends
    reply = await backends.pending.GetSessionTask(
        pb.GetSessionTaskRequest(session_id=sessionId),
        timeout=backends.timeout_s,
        metadata=request_metadata(request),
    )
    snap = reply.snapshot
    return {
        "task": {
            "sessionId": snap.session_id,
            "entryId": snap.entry_id,
            "origin": snap.origin,
            "kind": KINDS.get(snap.kind, "ask"),
            "payload": snap.payload,
            "createdAt": iso(snap.create_time),
            "toolResults": [
                {
                    "toolCallId": r.tool_call_id,
                    "name": r.name,
                    "arguments": r.arguments,
                    "output": r.output,
                    "argumentsTruncated": r.arguments_truncated,
                    "outputTruncated": r.output_truncated,
                }
                for r in snap.tool_results
            ],
        }
    }
