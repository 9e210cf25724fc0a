"""REST creates sent to the scheduler in batches: one batch for the creates that arrived while
the batch before was in flight (one at a time, more beside a slow one). A batch goes as a CreateTasks call, or —
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
# One batch in flight at a time: the creates that arrive meanwhile go together in the next, and
# the larger the batch the less both ends spend per create (two in flight cost the scheduler
# ≈ 7 % more CPU per task under the throughput benchmark: smaller batches, and a second answer
# waiting for the first one's write; docs/performance.md). But a slow batch — a create that
# makes a Git worktree, a slow disk — must not hold every create behind it: once each batch in
# flight has been out SLOW_BATCH_S, the next one goes beside them, up to MAX_IN_FLIGHT at once.
SLOW_BATCH_S = 0.05
MAX_IN_FLIGHT = 4
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
        slow_batch_s: float = SLOW_BATCH_S,
    ) -> None:
        self.scheduler = scheduler
        self.send: SendBatch = send if send is not None else scheduler.CreateTasks
        self.max_batch = max_batch
        self.max_bytes = max_bytes
        self.max_in_flight = max_in_flight
        self.slow_batch_s = slow_batch_s
        self._waiting: list[_Create] = []
        self._senders: set[asyncio.Task[None]] = set()
        # Senders running, counted here rather than by their tasks' done callbacks (a turn late).
        self._sending = 0
        self._out: list[float] = []  # when each batch in flight left (the loop's clock)
        self._recheck: asyncio.TimerHandle | None = None
        self.calls = 0  # CreateTasks calls made (for tests and benchmarks)

    async def create(self, request: pb.CreateTaskRequest, request_id: str, timeout_s: float) -> pb.CreateTaskResponse:
        """What ``CreateTask(request, timeout=timeout_s)`` answers, sent in the next batch."""
        answer: asyncio.Future[pb.CreateTaskResponse] = asyncio.get_running_loop().create_future()
        self._waiting.append(_Create(request, request_id, time.monotonic() + timeout_s, answer))
        self._kick()
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

    def _kick(self) -> None:
        """Creates are waiting: start a sender when none runs — or beside the running ones when
        each of their batches has been out ``slow_batch_s`` (else look again then). A running
        sender with no batch out yet takes what waits."""
        if not self._waiting:
            return
        if self._sending == 0:
            self._start_sender()
            return
        if self._sending >= self.max_in_flight or not self._out:
            return
        loop = asyncio.get_running_loop()
        slow_at = max(self._out) + self.slow_batch_s
        recheck = self._recheck
        if loop.time() >= slow_at:
            if recheck is not None:
                recheck.cancel()
                self._recheck = None
            self._start_sender()
        elif recheck is None or recheck.when() > slow_at:  # (the youngest batch came back: sooner)
            if recheck is not None:
                recheck.cancel()
            self._recheck = loop.call_at(slow_at, self._look_again)

    def _look_again(self) -> None:
        self._recheck = None
        self._kick()

    def _start_sender(self) -> None:
        self._sending += 1
        sender = asyncio.create_task(self._send(), name="create-batches")
        self._senders.add(sender)
        sender.add_done_callback(self._senders.discard)

    async def _send(self) -> None:
        """Send batches while creates wait; a sender started beside a slow batch stops after its
        own (the first one left takes what waits)."""
        try:
            while self._waiting:
                batch = self._next_batch()
                if batch:
                    left = asyncio.get_running_loop().time()
                    self._out.append(left)
                    try:
                        await self._send_batch(batch)
                    finally:
                        self._out.remove(left)
                    if self._sending > 1:
                        return
        finally:
            self._sending -= 1
            self._kick()  # creates that came meanwhile, when the sender left is still slow

    async def _send_batch(self, batch: list[_Create]) -> None:
        """One batch sent, and each of its creates answered or failed."""
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
            return
        if len(reply.outcomes) != len(batch):
            _fail(batch, RuntimeError(f"CreateTasks answered {len(reply.outcomes)} outcomes for {len(batch)}"))
            return
        for c, outcome in zip(batch, reply.outcomes, strict=True):
            if c.answer.done():
                continue
            if outcome.WhichOneof("outcome") == "task":
                c.answer.set_result(pb.CreateTaskResponse(task=outcome.task))
            else:
                c.answer.set_exception(item_error(outcome.error_status))
