"""gRPC servicers of the scheduler: translate requests, call the engine, translate back."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import grpc
import structlog
from google.rpc import code_pb2

from libs.errors import DomainError, InvalidArgument, Unavailable
from libs.grpc_server import REQUEST_ID_PATTERN, status_proto, unexpected_status_proto
from libs.worker_sdk import TOKEN_METADATA_KEY
from services.scheduler import convert, domain
from services.scheduler.domain import USER_CANCELED, NewTask, Task
from services.scheduler.eager import start_eagerly
from services.scheduler.engine import Engine
from services.scheduler.events import TaskEvent
from services.scheduler.metrics import STREAM_BATCH_SECONDS
from services.scheduler.questions import max_wait_s
from taskgate.scheduler.v1 import scheduler_pb2 as pb
from taskgate.scheduler.v1 import scheduler_pb2_grpc as pb_grpc

# How long CancelTask waits for a cooperative worker before answering cancel_requested.
CANCEL_ANSWER_WAIT_S = 1.0
# Initial metadata of a WatchTasks call (session or task): the watch is subscribed.
WATCH_LIVE_KEY = "x-taskgate-watch-live"
EVENT_TYPE_FROM_PB = {v: k for k, v in convert.EVENT_TYPE_TO_PB.items()}
# The most creates one CreateTasks call carries.
MAX_BATCH_CREATES = 256
# Batches of one StreamCreateTasks stream answered at once (the gateway keeps one or a few in flight).
MAX_STREAM_BATCHES = 8


def _check_batch(items: Sequence[pb.CreateTasksItem]) -> None:
    """A batch of creates is refused whole when empty, too large, or a call_id is malformed."""
    if not 1 <= len(items) <= MAX_BATCH_CREATES:
        raise InvalidArgument("BATCH_SIZE", f"send 1 to {MAX_BATCH_CREATES} creates in one call", field="items")
    for item in items:
        if item.call_id and not REQUEST_ID_PATTERN.fullmatch(item.call_id):
            raise InvalidArgument("INVALID_CALL_ID", "a call_id is 1 to 64 of A-Z a-z 0-9 . _ : -", field="call_id")


log = structlog.get_logger("scheduler")


def new_task(request: pb.CreateTaskRequest) -> NewTask:
    return NewTask(
        agent_id=request.agent_id,
        session_id=request.session_id,
        title=request.title,
        instructions=request.instructions,
        profile=request.profile,
        request_id=request.request_id or None,
        harness=request.harness or None,
        harness_model=request.harness_model or None,
        continue_task_id=request.continue_task_id or None,
        skill_name=request.skill.name if request.HasField("skill") else None,
        skill_args_json=(request.skill.args_json or "{}") if request.HasField("skill") else None,
        target=convert.target_from_pb(request.target, request.safemode_cleared) if request.HasField("target") else None,
    )


def _no_room_held() -> None:
    pass


class SchedulerServicer(pb_grpc.SchedulerServiceServicer):
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        # The tasks reading StreamCreateTasks streams, and whether the scheduler is stopping
        # (``end_create_streams``): a stream is open as long as its gateway is, so a stopping
        # server would otherwise wait out its whole grace for each.
        self._create_readers: set[asyncio.Task[Any]] = set()
        self._ending_create_streams = False

    def _now(self) -> int:
        return self.engine.clock.now_ms()

    async def CreateTask(
        self, request: pb.CreateTaskRequest, context: grpc.aio.ServicerContext
    ) -> pb.CreateTaskResponse:
        task = await self.engine.create_task(new_task(request))
        return pb.CreateTaskResponse(task=convert.task_to_pb(task, self._now()))

    async def CreateTasks(
        self, request: pb.CreateTasksRequest, context: grpc.aio.ServicerContext
    ) -> pb.CreateTasksResponse:
        _check_batch(request.items)
        return pb.CreateTasksResponse(outcomes=await self._create_batch(request.items))

    async def StreamCreateTasks(
        self, requests: AsyncIterator[pb.StreamCreateTasksRequest], context: grpc.aio.ServicerContext
    ) -> None:
        """Each batch read is answered once its creates committed, while the next ones are read
        (at most ``MAX_STREAM_BATCHES`` at once: beyond, flow control holds the sender back)."""
        if self._ending_create_streams:
            raise Unavailable("SCHEDULER_STOPPING", "the scheduler is stopping")
        answering: set[asyncio.Future[None]] = set()
        room = self._stream_room()
        writing = asyncio.Lock()

        async def answer(batch: pb.StreamCreateTasksRequest, leave_room: Callable[[], None]) -> None:
            began = time.perf_counter()
            try:
                if batch.items and batch.items[0].call_id:  # the batch's log lines: its first create's id
                    structlog.contextvars.bind_contextvars(request_id=batch.items[0].call_id)
                response = pb.StreamCreateTasksResponse(batch_id=batch.batch_id)
                try:
                    _check_batch(batch.items)
                except DomainError as exc:
                    response.error_status = status_proto(exc).SerializeToString()
                    log.warning("create_batch_refused", reason=exc.reason, creates=len(batch.items))
                    outcome = "refused"
                else:
                    try:
                        response.outcomes.extend(await self._create_batch(batch.items))
                        outcome = "ok"
                    except Exception as exc:  # noqa: BLE001 - a fault, not a refusal: still answered
                        code, status = unexpected_status_proto(exc)
                        log.error("create_batch_failed", code=code, creates=len(batch.items), exc_info=exc)
                        response.error_status = status.SerializeToString()
                        outcome = "failed"
                async with writing:
                    await context.write(response)
                # What a CreateTasks call's own log line and duration would say, per batch.
                elapsed = time.perf_counter() - began
                STREAM_BATCH_SECONDS.labels(outcome=outcome).observe(elapsed)
                log.info(
                    "create_batch", outcome=outcome, creates=len(batch.items), duration_ms=round(elapsed * 1000, 2)
                )
            finally:
                leave_room()

        def start(batch: pb.StreamCreateTasksRequest, leave_room: Callable[[], None]) -> None:
            # Eagerly: admitted, committed and its answer's write begun in this turn when
            # nothing makes it wait (a turn of a busy loop is a create's latency).
            task = start_eagerly(answer(batch, leave_room), name="stream-create-batch")
            answering.add(task)
            task.add_done_callback(answering.discard)

        reader = asyncio.current_task()
        assert reader is not None
        self._create_readers.add(reader)
        waiting_for_room: pb.StreamCreateTasksRequest | None = None
        try:
            try:
                async for batch in requests:
                    waiting_for_room = batch
                    await room.acquire()
                    waiting_for_room = None
                    start(batch, room.release)
            except asyncio.CancelledError:
                if not self._ending_create_streams:
                    raise
                reader.uncancel()  # the scheduler is stopping: read no more, answer what was read
                if waiting_for_room is not None:  # read while the others were answered: this one too
                    start(waiting_for_room, _no_room_held)
            await asyncio.gather(*answering)  # the caller is done sending, or we are: answer what it sent
        finally:
            self._create_readers.discard(reader)
            for task in answering:
                task.cancel()

    def _stream_room(self) -> asyncio.Semaphore:
        """How many batches one create stream answers at once (a seam for tests)."""
        return asyncio.Semaphore(MAX_STREAM_BATCHES)

    async def end_create_streams(self, grace_s: float) -> None:
        """(Stopping.) Every StreamCreateTasks stream stops reading, answers the batches it read
        and ends (OK: its gateway opens a new one — on another scheduler, or UNAVAILABLE until
        this one is back); new ones are refused UNAVAILABLE. Waits up to ``grace_s``."""
        self._ending_create_streams = True
        readers = set(self._create_readers)
        for reader in readers:
            reader.cancel()
        if readers:
            await asyncio.wait(readers, timeout=grace_s)

    async def _create_batch(self, items: Sequence[pb.CreateTasksItem]) -> list[pb.CreateTaskOutcome]:
        """Each create of a checked batch: its task, or the status CreateTask would have failed with."""
        outcomes: list[pb.CreateTaskOutcome | None] = [None] * len(items)
        wanted: list[int] = []
        requests: list[tuple[NewTask, str]] = []
        for i, item in enumerate(items):
            try:
                requests.append((new_task(item.request), item.call_id))
            except Exception as exc:  # noqa: BLE001 - this create's refusal, as CreateTask's
                outcomes[i] = self._failed(item, exc)
                continue
            wanted.append(i)
        for i, answer in zip(wanted, await self.engine.create_batch(requests), strict=True):
            outcomes[i] = self._failed(items[i], answer) if isinstance(answer, Exception) else self._done(answer)
        return [outcome for outcome in outcomes if outcome is not None]

    def _done(self, task: Task) -> pb.CreateTaskOutcome:
        return pb.CreateTaskOutcome(task=convert.task_to_pb(task, self._now()))

    def _failed(self, item: pb.CreateTasksItem, exc: Exception) -> pb.CreateTaskOutcome:
        """A create's error as the status CreateTask would have failed with (logged with the
        create's own request id)."""
        with structlog.contextvars.bound_contextvars(**({"request_id": item.call_id} if item.call_id else {})):
            if isinstance(exc, DomainError):
                status = status_proto(exc)
                log.warning("create_failed", code=code_pb2.Code.Name(status.code), reason=exc.reason)
            else:  # as the interceptor maps it for a unary call
                code, status = unexpected_status_proto(exc)
                if code == "INTERNAL":
                    log.error("create_failed", code=code, exc_info=exc)
                else:
                    log.warning("create_failed", code=code, error=type(exc).__name__)
        return pb.CreateTaskOutcome(error_status=status.SerializeToString())

    async def GetTask(self, request: pb.GetTaskRequest, context: grpc.aio.ServicerContext) -> pb.GetTaskResponse:
        task, attempts, tree = await self.engine.task_detail(request.task_id)
        return pb.GetTaskResponse(task=convert.task_to_pb(task, self._now(), attempts, tree=tree))

    async def ListTasks(self, request: pb.ListTasksRequest, context: grpc.aio.ServicerContext) -> pb.ListTasksResponse:
        page = await self.engine.list_tasks(
            request.agent_id, request.session_id, request.page, request.page_size, request.include_finished
        )
        limit = request.preview_chars or domain.DEFAULT_PREVIEW_CHARS
        now = self._now()
        return pb.ListTasksResponse(
            page=page.page,
            pages=page.pages,
            total=page.total,
            tasks=[convert.task_to_pb(t, now, preview_chars=limit) for t in page.tasks],
        )

    async def CancelTask(
        self, request: pb.CancelTaskRequest, context: grpc.aio.ServicerContext
    ) -> pb.CancelTaskResponse:
        task = await self.engine.cancel(
            request.task_id,
            request.cause or USER_CANCELED,
            request.replaced_by_task_id or None,
            wait_s=CANCEL_ANSWER_WAIT_S,
        )
        return pb.CancelTaskResponse(task=convert.task_to_pb(task, self._now()))

    async def PauseTask(self, request: pb.PauseTaskRequest, context: grpc.aio.ServicerContext) -> pb.PauseTaskResponse:
        if request.wait_ms < 0:
            raise domain.InvalidArgument("INVALID_WAIT", "wait_ms must be 0 or more", field="wait_ms")
        wait_s = min(request.wait_ms, 60_000) / 1000 if request.wait_ms else CANCEL_ANSWER_WAIT_S
        task = await self.engine.pause(request.task_id, wait_s=wait_s)
        return pb.PauseTaskResponse(task=convert.task_to_pb(task, self._now()))

    async def ResumeTask(
        self, request: pb.ResumeTaskRequest, context: grpc.aio.ServicerContext
    ) -> pb.ResumeTaskResponse:
        task = await self.engine.resume(request.task_id)
        return pb.ResumeTaskResponse(task=convert.task_to_pb(task, self._now()))

    async def RetryCleanup(
        self, request: pb.RetryCleanupRequest, context: grpc.aio.ServicerContext
    ) -> pb.RetryCleanupResponse:
        task = await self.engine.retry_cleanup(request.task_id)
        return pb.RetryCleanupResponse(task=convert.task_to_pb(task, self._now()))

    async def ListHosts(self, request: pb.ListHostsRequest, context: grpc.aio.ServicerContext) -> pb.ListHostsResponse:
        hosts, next_token = domain.page_hosts(await self.engine.list_hosts(), request.page_size, request.page_token)
        now, own = self._now(), self.engine.runtime.host_id
        return pb.ListHostsResponse(hosts=[convert.host_to_pb(h, now, own) for h in hosts], next_page_token=next_token)

    async def ResolveLostHost(
        self, request: pb.ResolveLostHostRequest, context: grpc.aio.ServicerContext
    ) -> pb.ResolveLostHostResponse:
        done = await self.engine.resolve_lost_host(request.host_id)
        now = self._now()
        return pb.ResolveLostHostResponse(
            host_id=done.host_id,
            resolved_tasks=[convert.task_to_pb(t, now) for t in done.resolved],
            left_tasks=done.left,
            host_forgotten=done.forgotten,
            message=done.message,
        )

    async def GetWorkerLog(
        self, request: pb.GetWorkerLogRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetWorkerLogResponse:
        tail = await self.engine.worker_log(request.task_id, request.attempt_number, request.tail_bytes)
        return pb.GetWorkerLogResponse(
            attempt_number=tail.attempt_number,
            content=tail.content,
            size_bytes=tail.size_bytes,
            truncated=tail.truncated,
            expired=tail.expired,
        )

    async def RecordDispatchOutcome(
        self, request: pb.RecordDispatchOutcomeRequest, context: grpc.aio.ServicerContext
    ) -> pb.RecordDispatchOutcomeResponse:
        task = await self.engine.record_dispatch_outcome(request.request_id, request.body, request.signature)
        return pb.RecordDispatchOutcomeResponse(task_id=task.task_id, state=convert.STATE_TO_PB[task.state])

    async def WatchTasks(
        self, request: pb.WatchTasksRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.WatchTasksResponse]:
        if request.HasField("since_sequence") or request.all_sessions:
            if not request.HasField("since_sequence"):
                raise domain.InvalidArgument("INVALID_WATCH", "all_sessions follows the log: set since_sequence")
            if request.task_id or (request.all_sessions and (request.agent_id or request.session_id)):
                raise domain.InvalidArgument("INVALID_WATCH", "name a session or all_sessions, not both")
            types = {EVENT_TYPE_FROM_PB[t] for t in request.event_types if t in EVENT_TYPE_FROM_PB}
            batches = self.engine.follow_log_batches(request.since_sequence, types)
            if not request.all_sessions:
                batches = _session_batches(batches, request.agent_id, request.session_id)
            if request.batch:
                async for found in batches:
                    for reply in batch_replies(found, self._now()):
                        yield reply
                return
            events = _one_by_one(batches)
        elif request.batch:
            raise domain.InvalidArgument("INVALID_WATCH", "batch is for the log: set since_sequence")
        elif request.task_id:
            if request.session_id or request.agent_id:
                raise domain.InvalidArgument("INVALID_WATCH", "name either a task or a session, not both")
            events = self.engine.watch_task(request.task_id, on_live=lambda: _send_live(context))
        else:
            events = self.engine.watch_session(
                request.agent_id, request.session_id, on_live=lambda: _send_live(context)
            )
        async for event in events:
            yield pb.WatchTasksResponse(
                sequence=event.sequence,
                type=convert.EVENT_TYPE_TO_PB[event.type],
                event_time=convert.ts(event.at),
                task=convert.task_to_pb(event.task, self._now()),
            )


# A batched WatchTasksResponse stays below this (gRPC's default receive limit is 4 MiB);
# a read that would exceed it goes out as several responses.
WATCH_BATCH_MAX_BYTES = 1024 * 1024
# What a repeated entry adds beyond its own size: its tag and length prefix (at most).
_ENTRY_OVERHEAD = 6


def batch_replies(
    events: Sequence[TaskEvent], now: int, max_bytes: int = WATCH_BATCH_MAX_BYTES
) -> list[pb.WatchTasksResponse]:
    """``events`` (one read of the log) as batched responses: one, unless it would be larger
    than ``max_bytes``; then split between events, in order. An event larger than the
    bound on its own goes alone (it is never cut)."""
    reply = pb.WatchTasksResponse()
    entries = reply.events
    for event in events:
        convert.fill_event(entries.add(), event.sequence, event.type, event.at, event.task, now)
    if reply.ByteSize() <= max_bytes:  # the usual case: one size check, no copies
        return [reply]
    replies: list[pb.WatchTasksResponse] = []
    current = pb.WatchTasksResponse()
    size = 0
    for entry in reply.events:
        n = entry.ByteSize() + _ENTRY_OVERHEAD
        if current.events and size + n > max_bytes:
            replies.append(current)
            current = pb.WatchTasksResponse()
            size = 0
        current.events.add().CopyFrom(entry)
        size += n
    replies.append(current)
    return replies


async def _one_by_one(batches: AsyncIterator[list[TaskEvent]]) -> AsyncIterator[TaskEvent]:
    async for events in batches:
        for event in events:
            yield event


async def _session_batches(
    batches: AsyncIterator[list[TaskEvent]], agent_id: str, session_id: str
) -> AsyncIterator[list[TaskEvent]]:
    domain.validate_id("agentId", agent_id)
    domain.validate_id("sessionId", session_id)
    async for events in batches:
        mine = [e for e in events if e.task.agent_id == agent_id and e.task.session_id == session_id]
        if mine:
            yield mine


async def _send_live(context: grpc.aio.ServicerContext) -> None:
    """The call's initial metadata, sent once the watch is subscribed: the client's
    ``initial_metadata()`` returns then, so it knows no later change is missed."""
    await context.send_initial_metadata(((WATCH_LIVE_KEY, "1"),))


class WorkerServicer(pb_grpc.WorkerServiceServicer):
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @staticmethod
    def _token(context: grpc.aio.ServicerContext) -> str:
        for key, value in context.invocation_metadata() or ():
            if key == TOKEN_METADATA_KEY:
                return str(value)
        return ""

    async def GetAssignment(
        self, request: pb.GetAssignmentRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetAssignmentResponse:
        task, attempt = await self.engine.assignment(self._token(context))
        resume = task.restart_resume
        reply = pb.GetAssignmentResponse(
            task_id=task.task_id,
            attempt_id=attempt.attempt_id,
            title=task.title,
            instructions=task.instructions,
            resume=bool(resume and resume.count > 0 and attempt.number > 1),
            last_progress=(resume.last_progress or "") if resume else "",
        )
        if task.skill is not None:
            # Only here, to the task's own worker: the skill's body.
            reply.instructions = await self.engine.skill_instructions(task)
            reply.skill_name = task.skill.name
            reply.skill_args_json = json.dumps(task.skill.args, sort_keys=True)
        return reply

    async def ReportProgress(
        self, request: pb.ReportProgressRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReportProgressResponse:
        await self.engine.report_progress(self._token(context), request.text)
        return pb.ReportProgressResponse()

    async def ReportTool(
        self, request: pb.ReportToolRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReportToolResponse:
        status = convert.TOOL_STATUS_FROM_PB.get(request.status, "")
        exit_code = request.exit_code if request.HasField("exit_code") else None
        await self.engine.report_tool(self._token(context), request.name, status, exit_code)
        return pb.ReportToolResponse()

    async def ReportTouched(
        self, request: pb.ReportTouchedRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReportTouchedResponse:
        await self.engine.report_touched(self._token(context), list(request.paths))
        return pb.ReportTouchedResponse()

    async def ReportUsage(
        self, request: pb.ReportUsageRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReportUsageResponse:
        await self.engine.report_usage(self._token(context), convert.usage_from_pb(request), request.delta)
        return pb.ReportUsageResponse()

    async def ReportResult(
        self, request: pb.ReportResultRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReportResultResponse:
        await self.engine.report_result(self._token(context), request.text, request.unresolved_background)
        return pb.ReportResultResponse()

    async def AskQuestion(
        self, request: pb.AskQuestionRequest, context: grpc.aio.ServicerContext
    ) -> pb.AskQuestionResponse:
        question = await self.engine.ask_question(self._token(context), request.text)
        return pb.AskQuestionResponse(question_id=question.question_id, revision=question.revision)

    async def AwaitAnswer(
        self, request: pb.AwaitAnswerRequest, context: grpc.aio.ServicerContext
    ) -> pb.AwaitAnswerResponse:
        wait_s = max_wait_s(request.max_wait)
        answer = await self.engine.await_answer(self._token(context), request.question_id, wait_s)
        return pb.AwaitAnswerResponse(answered=answer is not None, answer=answer or "")

    async def SpawnTask(self, request: pb.SpawnTaskRequest, context: grpc.aio.ServicerContext) -> pb.SpawnTaskResponse:
        child = await self.engine.spawn_subtask(
            self._token(context), request.title, request.instructions, request.profile, request.request_id
        )
        return pb.SpawnTaskResponse(task_id=child.task_id, state=convert.STATE_TO_PB[child.state])

    async def WaitSubtask(
        self, request: pb.WaitSubtaskRequest, context: grpc.aio.ServicerContext
    ) -> pb.WaitSubtaskResponse:
        child = await self.engine.wait_subtask(self._token(context), request.task_id, max_wait_s(request.max_wait))
        return pb.WaitSubtaskResponse(
            task_id=child.task_id,
            state=convert.STATE_TO_PB[child.state],
            finished=child.terminal,
            result_text=child.result.text if child.result and child.terminal else "",
            failure_code=child.failure.code if child.failure and child.terminal else "",
        )

    async def CancelSubtask(
        self, request: pb.CancelSubtaskRequest, context: grpc.aio.ServicerContext
    ) -> pb.CancelSubtaskResponse:
        child = await self.engine.cancel_subtask(self._token(context), request.task_id)
        return pb.CancelSubtaskResponse(task_id=child.task_id, state=convert.STATE_TO_PB[child.state])
