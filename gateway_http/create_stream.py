"""The gateway's create batches sent over one StreamCreateTasks stream to the scheduler.

Why a stream: on a busy scheduler a new gRPC call waits several turns of its event loop before
its handler runs (accepting the call, starting its task, reading its message): ≈ 13 ms of an
18 ms CreateTasks call under the throughput benchmark, where the handler itself took 4. A batch
written on an open stream is one message read. It also costs both sides less CPU than a call
(docs/performance.md).

``CreateStream`` is a drop-in for ``stub.CreateTasks`` (``CreateBatches`` sends through it): a
batch gets the same answer, and fails the same way — a batch refused whole with its status, a
broken stream with the stream's error (UNAVAILABLE when the scheduler went away, also when the
connection broke under the batch's own write: as for a call cut off mid-flight, its creates may
or may not have been made), its deadline with
DEADLINE_EXCEEDED. The stream opens on first use and again after one broke. A scheduler without
the method (UNIMPLEMENTED: an older one, mid-upgrade) gets CreateTasks calls from then on.

The channel's credential interceptors cover unary and server-streaming calls only (grpc.aio's
interceptors for a bidirectional call put every write through a queue and a task of their own),
so the stream is opened with the credential metadata itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Sequence

import grpc

from gateway_http.create_batches import item_error
from gateway_http.errors import copy_rpc_error, deadline_exceeded
from libs.log import get_logger
from taskgate.scheduler.v1 import scheduler_pb2 as pb
from taskgate.scheduler.v1 import scheduler_pb2_grpc as pb_grpc

log = get_logger("gateway_http.create_stream")

Metadata = Sequence[tuple[str, str]]


class _Stream:
    """One StreamCreateTasks call, the batches waiting for their answers, and its reader."""

    def __init__(self, call: grpc.aio.StreamStreamCall) -> None:
        self.call = call
        self.waiting: dict[int, asyncio.Future[pb.StreamCreateTasksResponse]] = {}
        self.writing = asyncio.Lock()  # one write at a time on a call
        self.broken: grpc.aio.AioRpcError | None = None
        self.reader = asyncio.create_task(self._read(), name="create-stream-reader")

    async def _read(self) -> None:
        try:
            async for response in self.call:
                answer = self.waiting.pop(response.batch_id, None)
                if answer is not None and not answer.done():
                    answer.set_result(response)
            error = _unavailable("the scheduler ended the create stream")
        except grpc.aio.AioRpcError as exc:
            error = exc
        except Exception as exc:  # noqa: BLE001 - e.g. an answer that does not parse
            error = _unavailable(f"the create stream failed: {exc!r}")
        self._break(error)

    def _break(self, error: grpc.aio.AioRpcError) -> None:
        """Every batch still waiting fails with ``error``; nothing more is sent here."""
        self.broken = error
        waiting, self.waiting = self.waiting, {}
        for answer in waiting.values():
            if not answer.done():
                answer.set_exception(copy_rpc_error(error))

    def expect(self, batch_id: int) -> asyncio.Future[pb.StreamCreateTasksResponse]:
        """The future ``batch_id``'s answer goes to (its error, should the stream break first)."""
        answer: asyncio.Future[pb.StreamCreateTasksResponse] = asyncio.get_running_loop().create_future()
        if self.broken is not None:
            answer.set_exception(copy_rpc_error(self.broken))
        else:
            self.waiting[batch_id] = answer
        return answer

    async def write(self, batch_id: int, items: Sequence[pb.CreateTasksItem]) -> None:
        """Send one batch. Never cancel this: grpc.aio cancels the whole call when a write is
        cancelled, and with it every batch waiting on this stream."""
        async with self.writing:
            if self.broken is not None:
                return  # its answer has the stream's error already
            try:
                await self.call.write(pb.StreamCreateTasksRequest(batch_id=batch_id, items=items))
            except asyncio.InvalidStateError:  # the call ended meanwhile: its reader fails the batch
                pass
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in _BROKEN_UNDER_A_WRITE:
                    raise  # the call's own refusal (UNIMPLEMENTED, UNAUTHENTICATED, ...): as a call's
                # The connection broke under the write (grpc says INTERNAL: "Stream removed"): the
                # stream is done, and this batch's creates may or may not have been made, as for
                # a call cut off mid-flight — UNAVAILABLE (503), which a client retries.
                self._break(_unavailable(f"the create stream broke while sending a batch: {exc.details()}"))
                self.call.cancel()

    async def close(self, grace_s: float = 2.0) -> None:
        """Half-close: the scheduler answers what it was sent and ends the stream (cancelled
        after ``grace_s``); a batch still waiting then fails."""
        if self.broken is None and not self.writing.locked():  # (a write held by flow control: cancel)
            with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
                await self.call.done_writing()
            await asyncio.wait([self.reader], timeout=grace_s)
        self.call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.reader
        self._break(_unavailable("the gateway is closing"))


class CreateStream:
    """``stub.CreateTasks(request, timeout=..., metadata=...)`` over one StreamCreateTasks stream."""

    def __init__(self, scheduler: pb_grpc.SchedulerServiceStub, credential: Metadata) -> None:
        self.scheduler = scheduler
        self.credential = tuple(credential)
        self._stream: _Stream | None = None
        self._ids = itertools.count(1)
        self.unary = False  # the scheduler has no StreamCreateTasks: CreateTasks calls
        self.opened = 0  # streams opened (for tests)

    async def __call__(
        self,
        request: pb.CreateTasksRequest,
        timeout: float,  # noqa: ASYNC109 - the signature of stub.CreateTasks, which this stands in for
        metadata: Metadata = (),
    ) -> pb.CreateTasksResponse:
        if not self.unary:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            stream = self._current()
            batch_id = next(self._ids)
            answer = stream.expect(batch_id)
            try:
                await stream.write(batch_id, request.items)  # outside the deadline: see ``write``
                async with asyncio.timeout_at(deadline):
                    response = await answer
            except TimeoutError:
                raise deadline_exceeded() from None
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                    raise
                self.unary = True
                log.warning("create_stream_unimplemented", detail="the scheduler predates StreamCreateTasks")
            else:
                if response.error_status:
                    raise item_error(response.error_status)
                return pb.CreateTasksResponse(outcomes=response.outcomes)
            finally:
                stream.waiting.pop(batch_id, None)
                if not answer.done():
                    answer.cancel()
                elif not answer.cancelled():
                    answer.exception()  # raised from the write instead: retrieved, not reported at exit
        reply: pb.CreateTasksResponse = await self.scheduler.CreateTasks(request, timeout=timeout, metadata=metadata)
        return reply

    def _current(self) -> _Stream:
        stream = self._stream
        if stream is None or stream.broken is not None:
            stream = self._stream = _Stream(self.scheduler.StreamCreateTasks(metadata=self.credential))
            self.opened += 1
        return stream

    async def close(self) -> None:
        if self._stream is not None:
            await self._stream.close()
            self._stream = None


# A write's error that means the stream broke (not the call refused): the transport's.
_BROKEN_UNDER_A_WRITE = frozenset({grpc.StatusCode.INTERNAL, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN})


def _unavailable(details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), details)
