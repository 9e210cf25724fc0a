"""REST creates sent to the scheduler in batches: one batch for the creates that arrived while
earlier batches were in flight (at most two at once). A batch goes as a CreateTasks call, or —
the gateway's own way — as one message on its StreamCreateTasks stream
(``gateway_http.create_stream``, the same answers and errors).

A gRPC call cost both ends far more than the create inside it: on a real stack one CreateTask
per create costs the scheduler ≈ 1.3 ms and the gateway ≈ 0.4 ms of CPU, against ≈ 0.5 and
0.15 ms per create in batches of 16 (bench/bench_create_rpc.py). Nothing waits on a timer: a
lone create goes at once, alone; under load the next batch gathers while the calls in flight
are on the wire (the scheduler's group commit works the same way).

Each create keeps the contract of a CreateTask call: its own deadline (``timeout_s``), and
on failure a ``grpc.aio.AioRpcError`` with the code, message and ErrorInfo the unary call
would have carried, so the REST error mapping is the same. A create whose caller went away
before its batch left is not sent.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import grpc
from google.rpc import status_pb2

from gateway_http.errors import copy_rpc_error, deadline_exceeded
from gateway_http.metrics import CREATE_BATCH
from libs.grpc_client import REQUEST_ID_KEY
from taskgate.scheduler.v1 import scheduler_pb2 as pb
from taskgate.scheduler.v1 import scheduler_pb2_grpc as pb_grpc

# The scheduler takes up to 256 creates a call; fewer keeps one call's reply small.
MAX_BATCH = 64
# Calls in flight at once: one would batch the most, but a slow scheduler (a slow disk, say)
# would then hold every create behind one call; with two a create waits at most about one
# call's time before it goes.
MAX_IN_FLIGHT = 2
# And at most this many bytes of requests (unless one alone is larger): the reply repeats each
# task's instructions, and gRPC refuses a message over 4 MiB on either side.
MAX_BATCH_BYTES = 1024 * 1024


@dataclass
class _Create:
    request: pb.CreateTaskRequest
    request_id: str
    deadline: float  # time.monotonic()
    answer: asyncio.Future[pb.CreateTaskResponse]


def item_error(outcome_status: bytes) -> grpc.aio.AioRpcError:
    """The error a CreateTask call would have raised, from a batch item's google.rpc.Status."""
    status = status_pb2.Status.FromString(outcome_status)
    code = _CODES.get(status.code, grpc.StatusCode.UNKNOWN)
    return grpc.aio.AioRpcError(
        code,
        grpc.aio.Metadata(),
        grpc.aio.Metadata(("grpc-status-details-bin", outcome_status)),
        details=status.message,
    )


_CODES = {code.value[0]: code for code in grpc.StatusCode}


def _fail(batch: list[_Create], error: Exception) -> None:
    """Each create of the batch still waiting fails with ``error`` (a gRPC error: a copy each)."""
    for c in batch:
        if not c.answer.done():
            c.answer.set_exception(copy_rpc_error(error) if isinstance(error, grpc.aio.AioRpcError) else error)


# How a batch goes: ``stub.CreateTasks`` itself, or what stands in for it (``CreateStream``).
SendBatch = Callable[..., Awaitable[pb.CreateTasksResponse]]


class CreateBatches:
    def __init__(
        self,
        scheduler: pb_grpc.SchedulerServiceStub,
        max_batch: int = MAX_BATCH,
        max_bytes: int = MAX_BATCH_BYTES,
        max_in_flight: int = MAX_IN_FLIGHT,
        send: SendBatch | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.send: SendBatch = send if send is not None else scheduler.CreateTasks
        self.max_batch = max_batch
        self.max_bytes = max_bytes
        self.max_in_flight = max_in_flight
        self._waiting: list[_Create] = []
        self._senders: set[asyncio.Task[None]] = set()
        self.calls = 0  # CreateTasks calls made (for tests and benchmarks)

    async def create(self, request: pb.CreateTaskRequest, request_id: str, timeout_s: float) -> pb.CreateTaskResponse:
        """What ``CreateTask(request, timeout=timeout_s)`` answers, sent in the next batch."""
        answer: asyncio.Future[pb.CreateTaskResponse] = asyncio.get_running_loop().create_future()
        self._waiting.append(_Create(request, request_id, time.monotonic() + timeout_s, answer))
        if len(self._senders) < self.max_in_flight:
            sender = asyncio.create_task(self._send(), name="create-batches")
            self._senders.add(sender)
            sender.add_done_callback(self._senders.discard)
        try:
            # shield: a caller that stops waiting cancels only its own answer, never the batch.
            async with asyncio.timeout(timeout_s):
                return await asyncio.shield(answer)
        except TimeoutError:
            raise deadline_exceeded() from None
        finally:
            answer.cancel()  # not sent yet: it stays out of the batch; answered: no effect

    def _next_batch(self) -> list[_Create]:
        """The oldest waiting creates still wanted, within the count and byte bounds."""
        batch: list[_Create] = []
        size = 0
        taken = 0
        for c in self._waiting:
            if len(batch) == self.max_batch:
                break
            if not c.answer.done():
                item_bytes = c.request.ByteSize()
                if batch and size + item_bytes > self.max_bytes:
                    break
                size += item_bytes
                batch.append(c)
            taken += 1
        del self._waiting[:taken]
        return batch

    async def _send(self) -> None:
        while self._waiting:
            batch = self._next_batch()
            if not batch:
                continue
            remaining = max(c.deadline for c in batch) - time.monotonic()
            request = pb.CreateTasksRequest(
                items=[pb.CreateTasksItem(request=c.request, call_id=c.request_id) for c in batch]
            )
            self.calls += 1
            CREATE_BATCH.observe(len(batch))
            try:
                reply = await self.send(
                    request, timeout=max(remaining, 0.001), metadata=((REQUEST_ID_KEY, batch[0].request_id),)
                )
            except Exception as exc:  # noqa: BLE001 - each waiting create fails with it, none hangs
                _fail(batch, exc)
                continue
            if len(reply.outcomes) != len(batch):
                _fail(batch, RuntimeError(f"CreateTasks answered {len(reply.outcomes)} outcomes for {len(batch)}"))
                continue
            for c, outcome in zip(batch, reply.outcomes, strict=True):
                if c.answer.done():
                    continue
                if outcome.WhichOneof("outcome") == "task":
                    c.answer.set_result(pb.CreateTaskResponse(task=outcome.task))
                else:
                    c.answer.set_exception(item_error(outcome.error_status))
