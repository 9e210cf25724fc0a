"""Question controls: snooze and mute a task question's reminders over REST, and the
chat commands a chat adapter forwards (``/task_question <id> answer|snooze|mute``)."""

from __future__ import annotations

from typing import Annotated, Any

import grpc
from fastapi import APIRouter, Path, Request
from pydantic import Field

from gateway_http.auth import Caller, KeyDep, SessionCaller
from gateway_http.backends import Backends, request_metadata
from gateway_http.chat import CHAT_ID_REGEX, NotACommand, parse_command
from gateway_http.convert import iso, task_json
from gateway_http.errors import ApiError, responses
from gateway_http.routes.tasks import FINISHED, check_replayed_answer, owned_task
from gateway_http.schemas import (
    ID_REGEX,
    UUID_HEX_REGEX,
    AgentIdPath,
    RequestBody,
    SessionIdPath,
    TaskIdPath,
)
from gateway_http.store import GatewayStore
from libs.settings import Settings
from taskgate.notifier.v1 import notifier_pb2 as npb
from taskgate.pending.v1 import pending_pb2 as ppb
from taskgate.scheduler.v1 import scheduler_pb2 as spb

COMMON_ERRORS = (400, 401, 403, 404, 409, 413, 429, 500, 501, 503, 504)
router = APIRouter(
    prefix="/api/v1/agents/{agentId}/sessions/{sessionId}", tags=["questions"], responses=responses(*COMMON_ERRORS)
)
Metadata = tuple[tuple[str, str], ...]
QuestionIdPath = Annotated[str, Path(pattern=UUID_HEX_REGEX, min_length=32, max_length=32, description="32 hex digits")]


def _backends(request: Request) -> Backends:
    return request.app.state.backends  # type: ignore[no-any-return]


def question_json(q: npb.QuestionReminders) -> dict[str, Any]:
    out: dict[str, Any] = {
        "questionId": q.question_id,
        "taskId": q.task_id,
        "state": q.state,
        "muted": q.muted,
        "remindersSent": q.reminders_sent,
    }
    if q.HasField("snooze_until_time"):
        out["snoozedUntil"] = iso(q.snooze_until_time)
    return out


async def set_preference(
    backends: Backends, metadata: Metadata, agent_id: str, session_id: str, question_id: str, action: str
) -> npb.QuestionReminders:
    call = backends.notifier.SnoozeQuestion if action == "snooze" else backends.notifier.MuteQuestion
    req_type = npb.SnoozeQuestionRequest if action == "snooze" else npb.MuteQuestionRequest
    try:
        reply = await call(
            req_type(agent_id=agent_id, session_id=session_id, question_id=question_id),
            timeout=backends.timeout_s,
            metadata=metadata,
        )
    except grpc.aio.AioRpcError as exc:
        if exc.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION):
            raise ApiError(403, "QUESTION_STALE", exc.details() or "not a current question of this session") from exc
        raise
    return reply.question


async def _question_of_task(request: Request, caller: Caller, task_id: str, question_id: str) -> None:
    await owned_task(request, caller, task_id)
    backends = _backends(request)
    try:
        reply = await backends.pending.GetQuestion(
            ppb.GetQuestionRequest(question_id=question_id),
            timeout=backends.timeout_s,
            metadata=request_metadata(request),
        )
    except grpc.aio.AioRpcError as exc:
        if exc.code() == grpc.StatusCode.NOT_FOUND:
            raise ApiError(403, "QUESTION_STALE", "no such question for this task") from exc
        raise
    if reply.question.task_id != task_id:
        raise ApiError(403, "QUESTION_STALE", "no such question for this task")


@router.post("/tasks/{taskId}/questions/{questionId}/snooze")
async def snooze_question(
    request: Request, caller: SessionCaller, taskId: TaskIdPath, questionId: QuestionIdPath
) -> dict[str, Any]:
    """Defer the question's reminders by one hour (``[notifier] question_snooze_ms``)."""
    caller.require_tool("task_answer")
    await _question_of_task(request, caller, taskId, questionId)
    q = await set_preference(
        _backends(request), request_metadata(request), caller.agent_id, caller.session_id, questionId, "snooze"
    )
    return {"question": question_json(q)}


@router.post("/tasks/{taskId}/questions/{questionId}/mute")
async def mute_question(
    request: Request, caller: SessionCaller, taskId: TaskIdPath, questionId: QuestionIdPath
) -> dict[str, Any]:
    """Silence the reminders of this question (a later question of the task reminds again)."""
    caller.require_tool("task_answer")
    await _question_of_task(request, caller, taskId, questionId)
    q = await set_preference(
        _backends(request), request_metadata(request), caller.agent_id, caller.session_id, questionId, "mute"
    )
    return {"question": question_json(q)}


# --- chat commands ---------------------------------------------------------------------


class ChatCommandBody(RequestBody):
    text: str = Field(max_length=65536, description="the chat message as the person wrote it")
    channel: str = Field(pattern=ID_REGEX, max_length=128, description="the [channels.NAME] the message came from")
    chatId: str = Field(pattern=CHAT_ID_REGEX, max_length=129)
    threadId: str | None = Field(default=None, pattern=CHAT_ID_REGEX, max_length=129)
    principal: str = Field(pattern=ID_REGEX, max_length=128, description="who wrote it, as a gateway principal")


@router.post("/chat/commands")
async def chat_command(
    request: Request, agentId: AgentIdPath, sessionId: SessionIdPath, key: KeyDep, body: ChatCommandBody
) -> dict[str, Any]:
    """A chat adapter forwards a person's message. Only ``/task_question <id> answer <text>``,
    ``… snooze`` and ``… mute`` act; anything else is refused (ordinary replies never answer).

    The adapter's key needs the agent and ``task_answer``; the chat (thread) must be bound
    to this session (``taskgate admin channels bind``) and the principal a member of it.
    ``reply`` says what was done; a refusal's ``message`` says why not.
    """
    if agentId not in key.agents:
        raise ApiError(403, "AGENT_ACCESS_DENIED", "this API key has no access to the agent")
    if not key.allows_tool("task_answer"):
        raise ApiError(403, "TOOL_ACCESS_DENIED", "this API key may not use task_answer")
    settings: Settings = request.app.state.settings
    if not settings.agent(agentId).orchestration_enabled:
        raise ApiError(409, "ORCHESTRATION_DISABLED", "orchestration is disabled for this agent")
    store: GatewayStore = request.app.state.store
    bound = await store.binding(body.channel, body.chatId, body.threadId or "")
    if bound != (agentId, sessionId):
        raise ApiError(403, "CHAT_NOT_BOUND", "this chat is not bound to this session")
    if not await store.member(agentId, sessionId, body.principal):
        raise ApiError(403, "NOT_A_MEMBER", f"{body.principal} is not a member of this session")
    return await run_command(
        _backends(request), request_metadata(request), agentId, sessionId, body.principal, body.text
    )


async def run_command(
    backends: Backends, metadata: Metadata, agent_id: str, session_id: str, principal: str, text: str
) -> dict[str, Any]:
    """Parse and carry out one chat command for a bound chat's member (the route and the
    Telegram adapter both call it); raises ApiError with the reason it was refused."""
    try:
        command = parse_command(text)
    except NotACommand as exc:
        raise ApiError(400, exc.reason, exc.message) from exc
    if command.action in ("snooze", "mute"):
        q = await set_preference(backends, metadata, agent_id, session_id, command.question_id, command.action)
        done = "snoozed for an hour" if command.action == "snooze" else "muted"
        return {
            "action": command.action,
            "reply": f"Reminders of question {q.question_id} {done}.",
            "question": question_json(q),
        }
    try:
        found = await backends.pending.GetQuestion(
            ppb.GetQuestionRequest(question_id=command.question_id), timeout=backends.timeout_s, metadata=metadata
        )
    except grpc.aio.AioRpcError as exc:
        if exc.code() == grpc.StatusCode.NOT_FOUND:
            raise ApiError(403, "QUESTION_STALE", "no such question") from exc
        raise
    task = await session_task(backends, metadata, agent_id, session_id, found.question.task_id)
    if task.state in FINISHED:
        await check_replayed_answer(backends, metadata, task, command.question_id, command.answer)
        return {"action": "answer", "reply": "That answer was already saved.", "task": task_json(task)}
    try:
        await backends.pending.AnswerQuestion(
            ppb.AnswerQuestionRequest(
                task_id=task.task_id, question_id=command.question_id, answer=command.answer, answered_by=principal
            ),
            timeout=backends.timeout_s,
            metadata=metadata,
        )
    except grpc.aio.AioRpcError as exc:
        if exc.code() == grpc.StatusCode.NOT_FOUND:
            raise ApiError(403, "QUESTION_STALE", "no such question for this task") from exc
        raise
    snapshot = task_json(await session_task(backends, metadata, agent_id, session_id, task.task_id))
    return {
        "action": "answer",
        "reply": f'Answer saved for task "{task.title}"; the worker gets it when it resumes.',
        "task": snapshot,
    }


async def session_task(
    backends: Backends, metadata: Metadata, agent_id: str, session_id: str, task_id: str
) -> spb.Task:
    reply = await backends.scheduler.GetTask(
        spb.GetTaskRequest(task_id=task_id), timeout=backends.timeout_s, metadata=metadata
    )
    if reply.task.agent_id != agent_id or reply.task.session_id != session_id:
        raise ApiError(403, "TASK_ACCESS_DENIED", "the task does not belong to this session")
    return reply.task
