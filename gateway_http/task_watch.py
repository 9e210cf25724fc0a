"""One task's full snapshots over SSE, for a page that shows that task (the dashboard's task page).

The session stream (``task_stream``) is shared and slim; a task page needs what it leaves
out: telemetry observations (``task.execution``), the last tool, the question's text, the
result. Here each client holds its own ``WatchTasks(task_id=...)`` stream — one task page,
one upstream stream — and every event is sent as a full ``task_json`` snapshot.

The watch is opened before the response starts: its first event (the task's current
snapshot, which also says the scheduler has subscribed) decides the answer, so an
unknown task is a 404 and another session's task a 403, never an open stream. A finished
task never changes again: its snapshot is the stream's last frame.
"""

from __future__ import annotations

import asyncio
import json

import grpc

from gateway_http.convert import task_json
from gateway_http.errors import ApiError
from gateway_http.metrics import SSE_SUBSCRIBERS
from gateway_http.sse import frame
from gateway_http.task_stream import EVENT_NAMES, FINISHED, READY_TIMEOUT_S, error_frame
from taskgate.scheduler.v1 import scheduler_pb2 as pb
from taskgate.scheduler.v1 import scheduler_pb2_grpc as pb_grpc


class TaskWatch:
    """A client's frames of one task: its snapshot, then every event after commit.

    An async iterator whose ``aclose`` cancels the upstream call even when iteration
    never began (a client gone before its response started).
    """

    def __init__(self, call: grpc.aio.UnaryStreamCall, first: pb.WatchTasksResponse) -> None:
        self.call = call
        self.events = call.__aiter__()
        self.pending: pb.WatchTasksResponse | None = first
        self.finished = False
        self.closed = False
        SSE_SUBSCRIBERS.labels("task").inc()

    @classmethod
    async def open(
        cls,
        stub: pb_grpc.SchedulerServiceStub,
        task_id: str,
        agent_id: str,
        session_id: str,
        metadata: tuple[tuple[str, str], ...],
    ) -> TaskWatch:
        """The task's watch, live; ApiError (or the backend's error) when it may not or cannot be read."""
        call = stub.WatchTasks(pb.WatchTasksRequest(task_id=task_id), metadata=metadata)
        try:
            async with asyncio.timeout(READY_TIMEOUT_S):
                first = await call.__aiter__().__anext__()
        except TimeoutError:
            call.cancel()
            raise ApiError(504, "DEADLINE_EXCEEDED", "the task's stream did not start in time; try again") from None
        except StopAsyncIteration:
            call.cancel()
            raise ApiError(503, "UNAVAILABLE", "the task stream is not available; try again") from None
        except BaseException:
            call.cancel()
            raise  # an AioRpcError is mapped by the app's handler (NOT_FOUND -> 404)
        if first.task.agent_id != agent_id or first.task.session_id != session_id:
            call.cancel()
            raise ApiError(403, "TASK_ACCESS_DENIED", "the task does not belong to this session")
        return cls(call, first)

    def __aiter__(self) -> TaskWatch:
        return self

    async def __anext__(self) -> bytes:
        if self.finished or self.closed:
            await self.aclose()
            raise StopAsyncIteration
        event = self.pending
        self.pending = None
        if event is None:
            try:
                event = await self.events.__anext__()
            except StopAsyncIteration:
                await self.aclose()
                raise
            except grpc.aio.AioRpcError as exc:
                self.finished = True
                if exc.code() == grpc.StatusCode.CANCELLED:
                    await self.aclose()
                    raise StopAsyncIteration from None
                # The client may reconnect: it starts again from a fresh snapshot.
                return error_frame(exc.code().name, exc.details() or "")
        task = event.task
        if task.state in FINISHED:
            self.finished = True  # a finished task never changes again: nothing follows this frame
        data = json.dumps({"task": task_json(task)})
        return frame(data, EVENT_NAMES.get(event.type, "task.event"), str(event.sequence))

    async def aclose(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.call.cancel()
        SSE_SUBSCRIBERS.labels("task").dec()
