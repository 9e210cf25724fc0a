"""GET /v1/session/{sessionId}/task: the session's pending task, resumable after a pause.

The path names no agent, so the agent is the API key's (or ``?agentId=`` when the key
has several); pending snapshots are kept per agent and session.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from gateway_http.auth import KeyDep, key_agent, require_member
from gateway_http.backends import request_metadata
from gateway_http.convert import iso
from gateway_http.errors import responses
from gateway_http.schemas import AgentIdQuery, SessionIdPath, SessionTaskEnvelope
from taskgate.pending.v1 import pending_pb2 as pb

router = APIRouter(tags=["sessions"])
KINDS = {pb.ENTRY_KIND_CONFIRM: "confirm", pb.ENTRY_KIND_ASK: "ask", pb.ENTRY_KIND_SECRET: "secret"}


@router.get(
    "/v1/session/{sessionId}/task",
    response_model=SessionTaskEnvelope,
    responses=responses(400, 401, 403, 404, 429, 500, 503, 504),
)
async def session_task(
    request: Request, sessionId: SessionIdPath, key: KeyDep, agentId: AgentIdQuery = None
) -> JSONResponse:
    """The session's pending snapshot: an ask from a non-``cli-`` origin, resumable after a pause; 404 when none."""
    agent = key_agent(key, agentId)
    await require_member(request, key, agent, sessionId)
    backends = request.app.state.backends
    reply = await backends.pending.GetSessionTask(
        pb.GetSessionTaskRequest(agent_id=agent, session_id=sessionId),
        timeout=backends.timeout_s,
        metadata=request_metadata(request),
    )
    snap = reply.snapshot
    return JSONResponse(
        {
            "task": {
                # A snapshot stored before they were kept per agent has none: it is the session's.
                "agentId": snap.agent_id or agent,
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
    )
