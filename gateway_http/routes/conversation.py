"""Conversation endpoints over the notifier: responses, messages, notifications, events,
and the activity stream (SSE)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import JSONResponse
from pydantic import Field, StrictBool

from gateway_http.activity import ActivityFanout
from gateway_http.auth import SessionCaller, stream_access_check
from gateway_http.backends import Backends, request_metadata
from gateway_http.convert import iso
from gateway_http.errors import ApiError
from gateway_http.schemas import ID_REGEX, NOT_BLANK, UUID_HEX_REGEX, PageQuery, PageSizeQuery, RequestBody
from gateway_http.sse import BoundedEventStream
from libs.settings import Settings
from taskgate.notifier.v1 import notifier_pb2 as pb

router = APIRouter(prefix="/api/v1/agents/{agentId}/sessions/{sessionId}", tags=["conversation"])

KIND_NAMES = {
    pb.NOTIFICATION_KIND_TASK_REPORT: "task_report",
    pb.NOTIFICATION_KIND_TASK_QUESTION: "task.question",
    pb.NOTIFICATION_KIND_REMINDER: "reminder",
    pb.NOTIFICATION_KIND_TASK_COMPLETED: "task.completed",
    pb.NOTIFICATION_KIND_TASK_FAILED: "task.failed",
    pb.NOTIFICATION_KIND_TASK_CANCELLED: "task.cancelled",
    pb.NOTIFICATION_KIND_TASK_NEEDS_RECONCILIATION: "task.needs_reconciliation",
}
STATES = {
    "pending": pb.NOTIFICATION_STATE_PENDING,
    "delivered": pb.NOTIFICATION_STATE_DELIVERED,
    "stopped": pb.NOTIFICATION_STATE_STOPPED,
}
STATE_NAMES = {v: k for k, v in STATES.items()}
OUTCOMES = {pb.ATTEMPT_OUTCOME_DELIVERED: "delivered", pb.ATTEMPT_OUTCOME_FAILED: "failed"}
FOLLOW_UPS = {"continues": pb.FOLLOW_UP_CONTINUES, "asks_user": pb.FOLLOW_UP_ASKS_USER, "none": pb.FOLLOW_UP_NONE}
FOLLOW_UP_NAMES = {v: k for k, v in FOLLOW_UPS.items()}


# The notifier's bound on any text (64 KiB of UTF-8); the schema can state characters only.
MAX_TEXT_CHARS = 65536
ResponseIdPath = Annotated[str, Path(pattern=ID_REGEX, max_length=128, description="the response's id")]
NotificationIdPath = Annotated[
    str, Path(pattern=UUID_HEX_REGEX, min_length=32, max_length=32, description="32 hex digits")
]
StateQuery = Annotated[Literal["pending", "delivered", "stopped"] | None, Query(description="only this state")]


class ResponseBody(RequestBody):
    text: str = Field(max_length=MAX_TEXT_CHARS, description="the whole display text so far (not a delta)")
    final: StrictBool = Field(default=False, description="true: the response is complete")


class MessageBody(RequestBody):
    text: str = Field(max_length=MAX_TEXT_CHARS, json_schema_extra=NOT_BLANK)


class ReplyBody(RequestBody):
    text: str = Field(max_length=MAX_TEXT_CHARS, json_schema_extra=NOT_BLANK)
    followUp: Literal["continues", "asks_user", "none"]


def _prune(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v not in (None, "")}


def notification_json(n: pb.Notification, with_attempts: bool = True) -> dict[str, Any]:
    out = _prune(
        {
            "notificationId": n.notification_id,
            "kind": KIND_NAMES.get(n.kind, "unknown"),
            "taskId": n.task_id,
            "questionId": n.question_id,
            "text": n.text,
            "createdAt": iso(n.create_time),
        }
    )
    if with_attempts:
        out["state"] = STATE_NAMES.get(n.state, "pending")
        out["attempts"] = [
            _prune(
                {
                    "at": iso(a.attempt_time),
                    "outcome": OUTCOMES.get(a.outcome, "failed"),
                    "httpStatus": a.http_status or None,
                    "error": a.error,
                }
            )
            for a in n.attempts
        ]
        out["nextAttemptAt"] = iso(n.next_attempt_time) if n.HasField("next_attempt_time") else None
        if n.HasField("deliver_time"):
            out["deliveredAt"] = iso(n.deliver_time)
        if n.channel:
            out["channel"] = n.channel
    return out


def message_json(m: pb.Message) -> dict[str, Any]:
    return _prune(
        {
            "messageId": m.message_id,
            "role": m.role,
            "text": m.text,
            "responseId": m.response_id,
            "notificationId": m.notification_id,
            "followUp": FOLLOW_UP_NAMES.get(m.follow_up),
            "createdAt": iso(m.create_time),
            "completedAt": iso(m.complete_time) if m.HasField("complete_time") else None,
        }
    )


def response_json(r: pb.Response) -> dict[str, Any]:
    return _prune(
        {
            "responseId": r.response_id,
            "text": r.text,
            "final": r.final,
            "createdAt": iso(r.create_time),
            "updatedAt": iso(r.update_time),
            "completedAt": iso(r.complete_time) if r.HasField("complete_time") else None,
        }
    ) | {"text": r.text, "final": r.final}


def _backends(request: Request) -> Backends:
    return request.app.state.backends  # type: ignore[no-any-return]


# --- responses -------------------------------------------------------------------


@router.put("/responses/{responseId}")
async def publish_response(
    request: Request, caller: SessionCaller, responseId: ResponseIdPath, body: ResponseBody
) -> Any:
    """Publish a snapshot of a response's display text: it replaces the previous one; final ends it."""
    backends = _backends(request)
    reply = await backends.notifier.PublishResponse(
        pb.PublishResponseRequest(
            agent_id=caller.agent_id,
            session_id=caller.session_id,
            snapshot=pb.ResponseSnapshot(response_id=responseId, text=body.text, final=body.final),
        ),
        timeout=backends.timeout_s,
        metadata=request_metadata(request),
    )
    return {"response": response_json(reply.response)}


# --- activity stream -----------------------------------------------------------------


def _last_event_id(request: Request) -> int | None:
    raw = request.headers.get("last-event-id", "").strip()
    if not raw:
        return None
    if not raw.isdigit() or len(raw) > 18:
        raise ApiError(400, "INVALID_LAST_EVENT_ID", "Last-Event-ID must be an id this stream sent")
    return int(raw)


@router.get("/activity/stream", response_class=BoundedEventStream, status_code=200)
async def activity_stream(request: Request, caller: SessionCaller) -> BoundedEventStream:
    """Server-Sent Events: the session's in-progress responses, then every snapshot and notification.

    ``data: {"responseId","text","final"}`` frames replace earlier ones of the same
    response; ``event: notification`` frames carry notifications. Every frame has an
    ``id:``; reconnect with ``Last-Event-ID`` to resume.
    """
    after = _last_event_id(request)
    settings: Settings = request.app.state.settings
    fanout: ActivityFanout = request.app.state.activity
    heartbeat_s = settings.notifier.sse_heartbeat_ms / 1000
    return BoundedEventStream(
        fanout.stream(caller.agent_id, caller.session_id, after),
        buffer_frames=settings.notifier.sse_client_buffer,
        heartbeat_s=heartbeat_s,
        still_allowed=stream_access_check(request, caller),
        recheck_s=min(heartbeat_s, 5.0),
    )


# --- messages --------------------------------------------------------------------------


@router.get("/messages")
async def list_messages(
    request: Request, caller: SessionCaller, page: PageQuery = 0, page_size: PageSizeQuery = 10
) -> dict[str, Any]:
    size = page_size
    backends = _backends(request)
    reply = await backends.notifier.ListMessages(
        pb.ListMessagesRequest(agent_id=caller.agent_id, session_id=caller.session_id, page=page, page_size=size),
        timeout=backends.timeout_s,
        metadata=request_metadata(request),
    )
    return {
        "page": reply.page,
        "pages": reply.pages,
        "total": reply.total,
        "messages": [message_json(m) for m in reply.messages],
    }


@router.post("/messages", status_code=201)
async def create_message(request: Request, caller: SessionCaller, body: MessageBody) -> JSONResponse:
    """Record a user message; stopped notifications not consumed before come back as pendingUpdates."""
    backends = _backends(request)
    reply = await backends.notifier.CreateMessage(
        pb.CreateMessageRequest(agent_id=caller.agent_id, session_id=caller.session_id, text=body.text),
        timeout=backends.timeout_s,
        metadata=request_metadata(request),
    )
    return JSONResponse(
        {
            "message": message_json(reply.message),
            "pendingUpdates": [notification_json(n) for n in reply.pending_updates],
        },
        status_code=201,
    )


# --- notifications ---------------------------------------------------------------------


@router.get("/notifications")
async def list_notifications(
    request: Request,
    caller: SessionCaller,
    page: PageQuery = 0,
    page_size: PageSizeQuery = 10,
    state: StateQuery = None,
) -> dict[str, Any]:
    size, state_name = page_size, state or ""
    backends = _backends(request)
    reply = await backends.notifier.ListNotifications(
        pb.ListNotificationsRequest(
            agent_id=caller.agent_id,
            session_id=caller.session_id,
            page=page,
            page_size=size,
            state=STATES.get(state_name, pb.NOTIFICATION_STATE_UNSPECIFIED),
        ),
        timeout=backends.timeout_s,
        metadata=request_metadata(request),
    )
    return {
        "page": reply.page,
        "pages": reply.pages,
        "total": reply.total,
        "notifications": [notification_json(n) for n in reply.notifications],
    }


@router.post("/notifications/{notificationId}/stop")
async def stop_notification(
    request: Request, caller: SessionCaller, notificationId: NotificationIdPath
) -> dict[str, Any]:
    """Stop a pending notification: it is not retried and stays for the next user turn."""
    backends = _backends(request)
    reply = await backends.notifier.StopNotification(
        pb.StopNotificationRequest(
            agent_id=caller.agent_id, session_id=caller.session_id, notification_id=notificationId
        ),
        timeout=backends.timeout_s,
        metadata=request_metadata(request),
    )
    return {"notification": notification_json(reply.notification)}


@router.post("/notifications/{notificationId}/reply", status_code=201)
async def reply_to_notification(
    request: Request, caller: SessionCaller, notificationId: NotificationIdPath, body: ReplyBody
) -> JSONResponse:
    """The report turn's reply, stored and streamed unchanged; ``followUp`` declares what it promises."""
    backends = _backends(request)
    reply = await backends.notifier.ReplyToNotification(
        pb.ReplyToNotificationRequest(
            agent_id=caller.agent_id,
            session_id=caller.session_id,
            notification_id=notificationId,
            text=body.text,
            follow_up=FOLLOW_UPS[body.followUp],
        ),
        timeout=backends.timeout_s,
        metadata=request_metadata(request),
    )
    return JSONResponse(
        {"message": message_json(reply.message), "unbackedPromise": reply.unbacked_promise}, status_code=201
    )


# --- conversation events ------------------------------------------------------------


@router.get("/events")
async def list_events(
    request: Request, caller: SessionCaller, page: PageQuery = 0, page_size: PageSizeQuery = 10
) -> dict[str, Any]:
    size = page_size
    backends = _backends(request)
    reply = await backends.notifier.ListConversationEvents(
        pb.ListConversationEventsRequest(
            agent_id=caller.agent_id, session_id=caller.session_id, page=page, page_size=size
        ),
        timeout=backends.timeout_s,
        metadata=request_metadata(request),
    )
    return {
        "page": reply.page,
        "pages": reply.pages,
        "total": reply.total,
        "events": [{"kind": e.kind, "at": iso(e.event_time), **dict(e.data)} for e in reply.events],
    }
