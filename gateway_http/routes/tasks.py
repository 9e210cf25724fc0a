"""Task endpoints: /api/v1/agents/{agentId}/sessions/{sessionId}/tasks..."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from fastapi.sse import EventSourceResponse, ServerSentEvent
from pydantic import BaseModel, ConfigDict, Field

from gateway_http.auth import SessionCaller
from gateway_http.backends import Backends, request_metadata
from gateway_http.convert import task_json
from gateway_http.errors import ApiError
from libs.ids import UUID_HEX_PATTERN
from taskgate.pending.v1 import pending_pb2 as pending_pb
from taskgate.scheduler.v1 import scheduler_pb2 as pb

router = APIRouter(prefix="/api/v1/agents/{agentId}/sessions/{sessionId}", tags=["tasks"])


class CreateTaskBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    title: str = Field(max_length=200)
    instructions: str = Field(default="", max_length=65536)
    profile: str | None = Field(default=None, max_length=128)
    requestId: str | None = Field(default=None, max_length=128)
    harness: str | None = Field(default=None, max_length=100)
    harnessModel: str | None = Field(default=None, max_length=100)


class CancelBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    replacedByTaskId: str | None = Field(default=None, max_length=32)


class AnswerBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    questionId: str = Field(max_length=64)
    answer: str = Field(max_length=65536)


class TaskEnvelope(BaseModel):
    task: dict[str, Any]


class TaskPageBody(BaseModel):
    page: int
    pages: int
    total: int
    tasks: list[dict[str, Any]]


def _backends(request: Request) -> Backends:
    return request.app.state.backends  # type: ignore[no-any-return]


def _parse_int(name: str, raw: str | None, default: int) -> int:
    if raw is None or raw == "":
        return default
    if not raw.lstrip("-").isdigit() or len(raw) > 9:
        raise ApiError(400, "INVALID_PAGINATION", f"{name} must be an integer")
    return int(raw)


def _parse_bool(name: str, raw: str | None) -> bool:
    if raw is None or raw == "":
        return False
    lowered = raw.lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise ApiError(400, "INVALID_PAGINATION", f"{name} must be true or false")


async def owned_task(request: Request, caller: SessionCaller, task_id: str) -> pb.Task:
    """The task, after checking it belongs to the caller's agent and session."""
    if not UUID_HEX_PATTERN.match(task_id):
        raise ApiError(400, "INVALID_ID", "taskId must be 32 lowercase hex characters")
    backends = _backends(request)
    reply = await backends.scheduler.GetTask(
        pb.GetTaskRequest(task_id=task_id), timeout=backends.timeout_s, metadata=request_metadata(request)
    )
    if reply.task.agent_id != caller.agent_id or reply.task.session_id != caller.session_id:
        raise ApiError(403, "TASK_ACCESS_DENIED", "the task does not belong to this session")
    return reply.task


@router.post("/tasks", status_code=201, response_model=TaskEnvelope)
async def create_task(request: Request, caller: SessionCaller, body: CreateTaskBody) -> JSONResponse:
    backends = _backends(request)
    reply = await backends.scheduler.CreateTask(
        pb.CreateTaskRequest(
            agent_id=caller.agent_id,
            session_id=caller.session_id,
            title=body.title,
            instructions=body.instructions,
            profile=body.profile or "",
            request_id=body.requestId or "",
            harness=body.harness or "",
            harness_model=body.harnessModel or "",
        ),
        timeout=backends.timeout_s,
        metadata=request_metadata(request),
    )
    return JSONResponse({"task": task_json(reply.task)}, status_code=201)


@router.get("/tasks", response_model=TaskPageBody)
async def list_tasks(request: Request, caller: SessionCaller) -> dict[str, Any]:
    query = request.query_params
    page = _parse_int("page", query.get("page"), 0)
    page_size = _parse_int("page_size", query.get("page_size"), 10)
    if page < 0:
        raise ApiError(400, "INVALID_PAGINATION", "page must be 0 or more")
    if not 1 <= page_size <= 100:
        raise ApiError(400, "INVALID_PAGINATION", "page_size must be between 1 and 100")
    include_finished = _parse_bool("all", query.get("all"))
    backends = _backends(request)
    reply = await backends.scheduler.ListTasks(
        pb.ListTasksRequest(
            agent_id=caller.agent_id,
            session_id=caller.session_id,
            page=page,
            page_size=page_size,
            include_finished=include_finished,
        ),
        timeout=backends.timeout_s,
        metadata=request_metadata(request),
    )
    return {
        "page": reply.page,
        "pages": reply.pages,
        "total": reply.total,
        "tasks": [task_json(t) for t in reply.tasks],
    }


EVENT_NAMES = {
    pb.TASK_EVENT_TYPE_SNAPSHOT: "task.snapshot",
    pb.TASK_EVENT_TYPE_STATE_CHANGED: "task.state_changed",
    pb.TASK_EVENT_TYPE_PROGRESS: "task.progress",
    pb.TASK_EVENT_TYPE_TOOL: "task.tool",
    pb.TASK_EVENT_TYPE_EXECUTION: "task.execution",
    pb.TASK_EVENT_TYPE_QUESTION: "task.question",
}


@router.get("/tasks/events", response_class=EventSourceResponse)
async def task_events(request: Request, caller: SessionCaller) -> AsyncIterator[ServerSentEvent]:
    """Server-Sent Events: the session's active tasks first, then every task event after commit.

    Each frame's ``data`` is ``{"task": snapshot}``; ``event`` names the event. A client
    that reads too slowly falls behind the scheduler's bounded buffer and is
    disconnected; on reconnect it starts again from fresh snapshots.
    """
    stream = _backends(request).scheduler.WatchTasks(
        pb.WatchTasksRequest(agent_id=caller.agent_id, session_id=caller.session_id), metadata=request_metadata(request)
    )
    try:
        async for event in stream:
            yield ServerSentEvent(
                event=EVENT_NAMES.get(event.type, "task.event"),
                id=str(event.sequence),
                data={"task": task_json(event.task)},
            )
    except grpc.aio.AioRpcError as exc:
        if exc.code() != grpc.StatusCode.CANCELLED:
            yield ServerSentEvent(event="error", data={"error": exc.code().name, "message": exc.details() or ""})
    finally:
        stream.cancel()


@router.get("/tasks/{taskId}", response_model=TaskEnvelope)
async def get_task(request: Request, caller: SessionCaller, taskId: str) -> dict[str, Any]:
    return {"task": task_json(await owned_task(request, caller, taskId))}


@router.post("/tasks/{taskId}/cancel")
async def cancel_task(
    request: Request, caller: SessionCaller, taskId: str, body: CancelBody | None = None
) -> dict[str, Any]:
    caller.require_tool("task_cancel")
    await owned_task(request, caller, taskId)
    replaced_by = body.replacedByTaskId if body else None
    if replaced_by:
        if not UUID_HEX_PATTERN.match(replaced_by):
            raise ApiError(400, "INVALID_ID", "replacedByTaskId must be 32 lowercase hex characters")
        replacement = await owned_task(request, caller, replaced_by)
        if replacement.task_id == taskId:
            raise ApiError(400, "INVALID_ARGUMENT", "a task cannot replace itself")
    backends = _backends(request)
    reply = await backends.scheduler.CancelTask(
        pb.CancelTaskRequest(task_id=taskId, cause="user_canceled", replaced_by_task_id=replaced_by or ""),
        timeout=backends.timeout_s,
        metadata=request_metadata(request),
    )
    snapshot = task_json(reply.task)
    return {"task": {"taskId": snapshot["taskId"], "state": snapshot["state"]}}


@router.post("/tasks/{taskId}/retry-cleanup", response_model=TaskEnvelope)
async def retry_cleanup(request: Request, caller: SessionCaller, taskId: str) -> dict[str, Any]:
    caller.require_tool("task_cancel")
    await owned_task(request, caller, taskId)
    backends = _backends(request)
    reply = await backends.scheduler.RetryCleanup(
        pb.RetryCleanupRequest(task_id=taskId), timeout=backends.timeout_s + 30, metadata=request_metadata(request)
    )
    return {"task": task_json(reply.task)}


@router.post("/tasks/{taskId}/answer", response_model=TaskEnvelope)
async def answer_question(request: Request, caller: SessionCaller, taskId: str, body: AnswerBody) -> dict[str, Any]:
    """Store the answer durably; the task runs again once its worker has it."""
    caller.require_tool("task_answer")
    if not UUID_HEX_PATTERN.match(body.questionId):
        raise ApiError(400, "INVALID_ID", "questionId must be 32 lowercase hex characters")
    if not body.answer.strip():
        raise ApiError(400, "EMPTY_ANSWER", "answer must not be empty")
    await owned_task(request, caller, taskId)
    backends = _backends(request)
    try:
        await backends.pending.AnswerQuestion(
            pending_pb.AnswerQuestionRequest(
                task_id=taskId, question_id=body.questionId, answer=body.answer, answered_by=caller.key.principal
            ),
            timeout=backends.timeout_s,
            metadata=request_metadata(request),
        )
    except grpc.aio.AioRpcError as exc:
        if exc.code() == grpc.StatusCode.NOT_FOUND:
            raise ApiError(403, "QUESTION_STALE", "no such question for this task") from exc
        raise
    return {"task": task_json(await owned_task(request, caller, taskId))}
