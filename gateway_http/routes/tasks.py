"""Task endpoints: /api/v1/agents/{agentId}/sessions/{sessionId}/tasks..."""

from __future__ import annotations

import json
from typing import Annotated

import grpc
from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse

from gateway_http import safemode
from gateway_http.auth import Caller, SessionCaller, stream_access_check
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
    WorkerLog,
)
from gateway_http.sse import BoundedEventStream
from gateway_http.task_stream import TaskStreams
from gateway_http.task_watch import TaskWatch
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
    reply = await _backends(request).get_task(task_id, request.state.request_id)
    if reply.task.agent_id != caller.agent_id or reply.task.session_id != caller.session_id:
        raise ApiError(403, "TASK_ACCESS_DENIED", "the task does not belong to this session")
    return reply.task


def create_task_request(caller: Caller, body: CreateTaskBody, safemode_cleared: bool) -> pb.CreateTaskRequest:
    """The scheduler's request for a REST create (also built by ``hot_routes``)."""
    return pb.CreateTaskRequest(
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
        safemode_cleared=safemode_cleared,
    )


def created_response(reply: pb.CreateTaskResponse) -> JSONResponse:
    return JSONResponse({"task": task_json(reply.task)}, status_code=201)


def list_tasks_request(caller: Caller, page: int, page_size: int, include_finished: bool) -> pb.ListTasksRequest:
    return pb.ListTasksRequest(
        agent_id=caller.agent_id,
        session_id=caller.session_id,
        page=page,
        page_size=page_size,
        include_finished=include_finished,
    )


def task_page_response(reply: pb.ListTasksResponse) -> JSONResponse:
    return JSONResponse(
        {"page": reply.page, "pages": reply.pages, "total": reply.total, "tasks": [task_json(t) for t in reply.tasks]}
    )


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
    reply = await backends.create_task(create_task_request(caller, body, cleared), request.state.request_id)
    return created_response(reply)


@router.get("/tasks", response_model=TaskPage)
async def list_tasks(
    request: Request, caller: SessionCaller, page: PageQuery = 0, page_size: PageSizeQuery = 10, all: AllQuery = False
) -> JSONResponse:
    """The session's tasks, newest first; finished ones only with ``all=true``; previews bounded."""
    backends = _backends(request)
    reply = await backends.scheduler.ListTasks(
        list_tasks_request(caller, page, page_size, all), timeout=backends.timeout_s, metadata=request_metadata(request)
    )
    return task_page_response(reply)


@router.get("/tasks/events", response_class=BoundedEventStream, status_code=200)
async def task_events(request: Request, caller: SessionCaller) -> BoundedEventStream:
    """Server-Sent Events: the session's active tasks first (``event: task.snapshot``), then every
    task event after commit (``task.state_changed``, ``task.progress``, ``task.tool``,
    ``task.execution``, ``task.question``).

    Each frame's ``data`` is ``{"task": {...}}``, a **slim** snapshot: ``taskId``, ``title``,
    ``state``, ``progress`` (``text`` cut to 200 characters, ``updatedAt``), ``pendingQuestion``
    (``questionId``, ``revision``), ``failure`` (``code``), ``revision``, ``version`` and ``updatedAt``;
    never the instructions, result, attempts or telemetry: GET the task for its detail (e.g. when
    ``version`` moved; ``GET .../tasks/{taskId}/events`` follows one task in full). An event that
    changes nothing shown here but ``version`` (a telemetry observation) is not sent. The response
    starts once the stream is live, so every later change reaches the client. A client that
    reads too slowly gets ``event: error`` ``STREAM_TOO_SLOW`` and is disconnected; on reconnect
    it starts again from fresh snapshots. Heartbeat comments keep the connection open.
    """
    settings: Settings = request.app.state.settings
    streams: TaskStreams = request.app.state.task_streams
    heartbeat_s = settings.notifier.sse_heartbeat_ms / 1000
    # Joined before answering: the response's headers mean "subscribed".
    subscription = await streams.open(caller.agent_id, caller.session_id)
    recheck_s = min(heartbeat_s, 5.0)
    # One recheck per key and session and interval, however many streams it has open.
    still_allowed = streams.shared_check(
        request.headers.get("authorization", ""),
        caller.agent_id,
        caller.session_id,
        stream_access_check(request, caller),
        recheck_s,
    )
    return BoundedEventStream(
        subscription,
        buffer_frames=settings.notifier.sse_client_buffer,
        heartbeat_s=heartbeat_s,
        still_allowed=still_allowed,
        recheck_s=recheck_s,
    )


@router.get("/tasks/{taskId}", response_model=TaskEnvelope, responses=responses(404))
async def get_task(request: Request, caller: SessionCaller, taskId: TaskIdPath) -> JSONResponse:
    """The full snapshot, with the whole retained result."""
    return JSONResponse({"task": task_json(await owned_task(request, caller, taskId))})


@router.get("/tasks/{taskId}/events", response_class=BoundedEventStream, status_code=200, responses=responses(404))
async def task_detail_events(request: Request, caller: SessionCaller, taskId: TaskIdPath) -> BoundedEventStream:
    """Server-Sent Events of one task, for a page that shows it: its current snapshot first
    (``event: task.snapshot``), then every event of the task after commit (``task.state_changed``,
    ``task.progress``, ``task.tool``, ``task.execution``, ``task.question``).

    Each frame's ``data`` is ``{"task": {...}}``, the **full** snapshot as ``GET .../tasks/{taskId}``
    gives it (telemetry in ``execution``, ``activity.lastTool``, the question's text, the result),
    except ``attempts``, which events do not carry: GET the task when its state changes. Once the
    task has finished its snapshot is the last frame and the stream ends. The response starts once
    the stream is live; an unknown task is 404, another session's 403. A client that reads too
    slowly is disconnected; on reconnect it starts again from a fresh snapshot. Heartbeat comments
    keep the connection open.
    """
    settings: Settings = request.app.state.settings
    heartbeat_s = settings.notifier.sse_heartbeat_ms / 1000
    # One upstream stream per client: a task page is opened by the few people following that task.
    watch = await TaskWatch.open(
        _backends(request).scheduler, taskId, caller.agent_id, caller.session_id, request_metadata(request)
    )
    return BoundedEventStream(
        watch,
        buffer_frames=settings.notifier.sse_client_buffer,
        heartbeat_s=heartbeat_s,
        still_allowed=stream_access_check(request, caller),
        recheck_s=min(heartbeat_s, 5.0),
    )


# The scheduler's bound (services.scheduler.worker_log.MAX_TAIL_BYTES): a page, not a download.
MAX_LOG_TAIL_BYTES = 65536
TailBytesQuery = Annotated[
    int, Query(ge=1, le=MAX_LOG_TAIL_BYTES, description="bytes from the end of the log, at most 64 KiB")
]
AttemptQuery = Annotated[int | None, Query(ge=1, le=1_000_000, description="the attempt's number; default: the latest")]


@router.get("/tasks/{taskId}/log", response_model=WorkerLog, responses=responses(404))
async def worker_log(
    request: Request,
    caller: SessionCaller,
    taskId: TaskIdPath,
    tailBytes: TailBytesQuery = 16384,
    attempt: AttemptQuery = None,
) -> JSONResponse:
    """The tail of the worker's log (its stdout and stderr) for the latest attempt, or the one named."""
    await owned_task(request, caller, taskId)
    backends = _backends(request)
    reply = await backends.scheduler.GetWorkerLog(
        pb.GetWorkerLogRequest(task_id=taskId, attempt_number=attempt or 0, tail_bytes=tailBytes),
        timeout=backends.timeout_s,
        metadata=request_metadata(request),
    )
    body: dict[str, object] = {
        "taskId": taskId,
        "sizeBytes": reply.size_bytes,
        "truncated": reply.truncated,
        "expired": reply.expired,
        "text": reply.content.decode("utf-8", errors="replace"),
    }
    if reply.attempt_number:
        body["attempt"] = reply.attempt_number
    return JSONResponse(body)


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
