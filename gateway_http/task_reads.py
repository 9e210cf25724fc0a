"""GetTask for the gateway's REST calls, concurrent reads of one task shared.

A task page's clients GET the task when an event says its detail moved, all at about the
same moment, and each GetTask cost the scheduler about 0.95 ms of CPU (a one-row read is
mostly gRPC's own per-call work). Here at most one GetTask per task is in flight; the
requests for that task that arrive meanwhile share the next one, made as soon as it ends.

Every caller still gets a read that began after its own request arrived — never one already
under way, which might predate a change the caller has just heard about — so the answer is as
fresh as with a call of its own. Each caller keeps its deadline; a failed read fails each of
its callers with the same code. Callers share the reply object: they must not change it.
"""

from __future__ import annotations

import asyncio

import grpc

from gateway_http.errors import copy_rpc_error, deadline_exceeded
from libs.grpc_client import REQUEST_ID_KEY
from taskgate.scheduler.v1 import scheduler_pb2 as pb
from taskgate.scheduler.v1 import scheduler_pb2_grpc as pb_grpc


class _Read:
    """One GetTask of a task and the callers waiting for it."""

    def __init__(self, request_id: str, timeout_s: float) -> None:
        self.answer: asyncio.Future[pb.GetTaskResponse] = asyncio.get_running_loop().create_future()
        self.request_id = request_id  # the first caller's, for the scheduler's log line
        self.timeout_s = timeout_s
        self.waiting = 0


class SharedTaskReads:
    def __init__(self, scheduler: pb_grpc.SchedulerServiceStub) -> None:
        self.scheduler = scheduler
        self._running: dict[str, _Read] = {}  # the read in flight, per task
        self._next: dict[str, _Read] = {}  # the read the callers that came during it will share

    async def get(self, task_id: str, request_id: str, timeout_s: float) -> pb.GetTaskResponse:
        """What ``GetTask(task_id)`` answers, from a read that began after this call."""
        read = self._next.get(task_id)
        if read is None:
            read = _Read(request_id, timeout_s)
            if task_id in self._running:
                self._next[task_id] = read
            else:
                self._start(task_id, read)
        read.timeout_s = max(read.timeout_s, timeout_s)
        read.waiting += 1
        try:
            # shield: a caller that stops waiting leaves the read to the others.
            async with asyncio.timeout(timeout_s):
                return await asyncio.shield(read.answer)
        except TimeoutError:
            raise deadline_exceeded() from None
        except grpc.aio.AioRpcError as exc:
            raise copy_rpc_error(exc) from None
        finally:
            read.waiting -= 1

    def _start(self, task_id: str, read: _Read) -> None:
        self._running[task_id] = read
        call = self.scheduler.GetTask(
            pb.GetTaskRequest(task_id=task_id), timeout=read.timeout_s, metadata=((REQUEST_ID_KEY, read.request_id),)
        )
        asyncio.ensure_future(call).add_done_callback(lambda done: self._finished(task_id, read, done))

    def _finished(self, task_id: str, read: _Read, done: asyncio.Future[pb.GetTaskResponse]) -> None:
        del self._running[task_id]
        following = self._next.pop(task_id, None)
        if following is not None:
            if following.waiting:
                self._start(task_id, following)
            else:  # its callers all left before it began: nothing to read
                following.answer.cancel()
        if done.cancelled():
            read.answer.set_exception(
                grpc.aio.AioRpcError(grpc.StatusCode.CANCELLED, grpc.aio.Metadata(), grpc.aio.Metadata(), "cancelled")
            )
        elif (error := done.exception()) is not None:
            read.answer.set_exception(error)
        else:
            read.answer.set_result(done.result())
        if not read.waiting:
            read.answer.exception()  # nobody waits any more: an error is marked seen (else asyncio logs it lost)
