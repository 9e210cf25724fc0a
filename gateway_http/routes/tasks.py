"""Task endpoints: /api/v1/agents/{agentId}/sessions/{sessionId}/tasks..."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import grpc
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from fastapi.sse import EventSourceResponse, ServerSentEvent

from gateway_http import safemode
from gateway_http.auth import SessionCaller
from gateway_http.backends import Backends, request_metadata
from gateway_http.convert import task_json
from gateway_http.errors import ApiError, responses
from gateway_http.schemas import (
    AllQuery,
    AnswerBody,
    CancelBody,
    CancelResult,
    CreateTaskBody,
    PageQuery,
    PageSizeQuery,
    TaskEnvelope,
    TaskIdPath,
    TaskPage,
)
from libs.settings import Settings
from taskgate.pending.v1 import pending_pb2 as pending_pb
from taskgate.scheduler.v1 import scheduler_pb2 as pb

# Every task route: authorization, agent settings and the backends can answer these.
COMMON_ERRORS = (400, 401, 403, 409, 429, 500, 501, 503, 504)
router = APIRouter(
    prefix="/api/v1/agents/{agentId}/sessions/{sessionId}", tags=["tasks"], responses=responses(*COMMON_ERRORS)
)


FINISHED = frozenset({pb.TASK_STATE_COMPLETED, pb.TASK_STATE_FAILED, pb.TASK_STATE_CANCELLED})


async def check_replayed_answer(
    backends: Backends, metadata: tuple[tuple[str, str], ...], task: pb.Task, question_id: str, answer: str
) -> None:
    """A finished task's question takes no answer (403 TASK_FINISHED), except the very answer it
    already has: repeating a saved answer stays idempotent."""
    try:
        reply = await backends.pending.GetQuestion(
            pending_pb.GetQuestionRequest(question_id=question_id), timeout=backends.timeout_s, metadata=metadata
        )
    except grpc.aio.AioRpcError as exc:
        if exc.code() != grpc.StatusCode.NOT_FOUND:
            raise
    else:
        q = reply.question
        if q.task_id == task.task_id and q.state == pending_pb.QUESTION_STATE_ANSWERED and q.answer == answer:
            return
    raise ApiError(403, "TASK_FINISHED", "the task has finished; its question takes no answer")


def _backends(request: Request) -> Backends:
    return request.app.state.backends  # type: ignore[no-any-return]


async def owned_task(request: Request, caller: SessionCaller, task_id: str) -> pb.Task:
    """The task, after checking it belongs to the caller's agent and session."""
    backends = _backends(request)
    reply = await backends.scheduler.GetTask(
        pb.GetTaskRequest(task_id=task_id), timeout=backends.timeout_s, metadata=request_metadata(request)
    )
    if reply.task.agent_id != caller.agent_id or reply.task.session_id != caller.session_id:
        raise ApiError(403, "TASK_ACCESS_DENIED", "the task does not belong to this session")
    return reply.task


@router.post("/tasks", status_code=201, response_model=TaskEnvelope, responses=responses(413))
async def create_task(request: Request, caller: SessionCaller, body: CreateTaskBody) -> JSONResponse:
    settings: Settings = request.app.state.settings
    # The document lists the configured profiles; refuse others here, as it says.
    if body.profile is not None and body.profile not in settings.workers:
        raise ApiError(400, "UNKNOWN_PROFILE", f"no worker profile named {body.profile!r}")
    cleared = False
    if body.target is not None:
        target = settings.targets.get(body.target.name)
        if target is not None and target.safemode:
            # Read on every create (no cache): a revoked grant stops new dispatches at once.
            if not await safemode.is_cleared(request.app.state.store.db, caller.agent_id, body.target.name):
                raise ApiError(
                    403, "SAFEMODE_NOT_GRANTED", f"target {body.target.name!r} needs a grant and an assignment"
                )
            cleared = True
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
            continue_task_id=body.continueTaskId or "",
            skill=pb.SkillInvocation(name=body.skill.name, args_json=json.dumps(body.skill.args))
            if body.skill is not None
            else None,
            target=pb.TargetRequest(
                name=body.target.name,
                native_session_id=body.target.nativeSessionId,
                display_name=body.target.displayName or "",
                options=body.target.options,
            )
            if body.target is not None
            else None,
            safemode_cleared=cleared,
        ),
        timeout=backends.timeout_s,
        metadata=request_metadata(request),
    )
    return JSONResponse({"task": task_json(reply.task)}, status_code=201)


@router.get("/tasks", response_model=TaskPage)
async def list_tasks(
    request: Request, caller: SessionCaller, page: PageQuery = 0, page_size: PageSizeQuery = 10, all: AllQuery = False
) -> JSONResponse:
    """The session's tasks, newest first; finished ones only with ``all=true``; previews bounded."""
    backends = _backends(request)
    reply = await backends.scheduler.ListTasks(
        pb.ListTasksRequest(
            agent_id=caller.agent_id,
            session_id=caller.session_id,
            page=page,
            page_size=page_size,
            include_finished=all,
        ),
        timeout=backends.timeout_s,
        metadata=request_metadata(request),
    )
    return JSONResponse(
        {"page": reply.page, "pages": reply.pages, "total": reply.total, "tasks": [task_json(t) for t in reply.tasks]}
    )


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


@router.get("/tasks/{taskId}", response_model=TaskEnvelope, responses=responses(404))
async def get_task(request: Request, caller: SessionCaller, taskId: TaskIdPath) -> JSONResponse:
    """The full snapshot, with the whole retained result."""
    return JSONResponse({"task": task_json(await owned_task(request, caller, taskId))})


@router.post("/tasks/{taskId}/cancel", response_model=CancelResult, responses=responses(404, 413))
async def cancel_task(
    request: Request, caller: SessionCaller, taskId: TaskIdPath, body: CancelBody | None = None
) -> JSONResponse:
    """``cancel_requested`` while stopping, ``cancelled`` once stopped; a finished task keeps its state."""
    caller.require_tool("task_cancel")
    await owned_task(request, caller, taskId)
    replaced_by = body.replacedByTaskId if body else None
    if replaced_by:
        if replaced_by == taskId:
            raise ApiError(400, "INVALID_ARGUMENT", "a task cannot replace itself")
        try:
            await owned_task(request, caller, replaced_by)
        except grpc.aio.AioRpcError as exc:
            # The task at the URL exists (404 would say it does not): the reference in the body is what fails.
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                raise ApiError(409, "REPLACEMENT_NOT_FOUND", "replacedByTaskId names no task") from exc
            raise
    backends = _backends(request)
    reply = await backends.scheduler.CancelTask(
        pb.CancelTaskRequest(task_id=taskId, cause="user_canceled", replaced_by_task_id=replaced_by or ""),
        timeout=backends.timeout_s,
        metadata=request_metadata(request),
    )
    snapshot = task_json(reply.task)
    return JSONResponse({"task": {"taskId": snapshot["taskId"], "state": snapshot["state"]}})


@router.post("/tasks/{taskId}/pause", response_model=TaskEnvelope, responses=responses(404))
async def pause_task(request: Request, caller: SessionCaller, taskId: TaskIdPath) -> JSONResponse:
    """Stop the worker with the same proof as a cancel and keep the task ``paused`` (not terminal),
    with its open question and pending snapshot: ``cancel_requested`` while stopping."""
    caller.require_tool("task_cancel")
    await owned_task(request, caller, taskId)
    backends = _backends(request)
    reply = await backends.scheduler.PauseTask(
        pb.PauseTaskRequest(task_id=taskId), timeout=backends.timeout_s + 5, metadata=request_metadata(request)
    )
    return JSONResponse({"task": task_json(reply.task)})


@router.post("/tasks/{taskId}/resume", response_model=TaskEnvelope, responses=responses(404))
async def resume_task(request: Request, caller: SessionCaller, taskId: TaskIdPath) -> JSONResponse:
    """Queue a paused task again: its worker starts with ``TASKGATE_RESUME=1`` and the last progress.
    A task in any other state is returned unchanged."""
    caller.require_tool("task_cancel")
    await owned_task(request, caller, taskId)
    backends = _backends(request)
    reply = await backends.scheduler.ResumeTask(
        pb.ResumeTaskRequest(task_id=taskId), timeout=backends.timeout_s, metadata=request_metadata(request)
    )
    return JSONResponse({"task": task_json(reply.task)})


@router.post("/tasks/{taskId}/retry-cleanup", response_model=TaskEnvelope, responses=responses(404))
async def retry_cleanup(request: Request, caller: SessionCaller, taskId: TaskIdPath) -> JSONResponse:
    """Look again for proof that a ``needs_reconciliation`` task's processes are gone."""
    caller.require_tool("task_cancel")
    await owned_task(request, caller, taskId)
    backends = _backends(request)
    reply = await backends.scheduler.RetryCleanup(
        pb.RetryCleanupRequest(task_id=taskId), timeout=backends.timeout_s + 30, metadata=request_metadata(request)
    )
    return JSONResponse({"task": task_json(reply.task)})


@router.post("/tasks/{taskId}/answer", response_model=TaskEnvelope, responses=responses(404, 413))
async def answer_question(
    request: Request, caller: SessionCaller, taskId: TaskIdPath, body: AnswerBody
) -> JSONResponse:
    """Store the answer durably; the task runs again once its worker has it."""
    caller.require_tool("task_answer")
    if not body.answer.strip():
        raise ApiError(400, "EMPTY_ANSWER", "answer must not be empty")
    task = await owned_task(request, caller, taskId)
    backends = _backends(request)
    if task.state in FINISHED:
        await check_replayed_answer(backends, request_metadata(request), task, body.questionId, body.answer)
        return JSONResponse({"task": task_json(task)})
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
    return JSONResponse({"task": task_json(await owned_task(request, caller, taskId))})
