"""The gateway's creates in batches: gathered while a call is in flight, each answered (or failed)
as its own CreateTask call would have been."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from gateway_http.create_batches import CreateBatches
from gateway_http.errors import from_rpc_error
from taskgate.scheduler.v1 import scheduler_pb2 as pb
from tests.support.scheduler_rpc import served_scheduler
from tests.support.waiting import until


def create(title: str, **fields: object) -> pb.CreateTaskRequest:
    return pb.CreateTaskRequest(agent_id="a", session_id="s", title=title, **fields)  # type: ignore[arg-type]


@dataclass
class HeldScheduler:
    """Answers each CreateTasks call once ``release`` is set; records the titles of every call."""

    release: asyncio.Event = field(default_factory=asyncio.Event)
    calls: list[list[str]] = field(default_factory=list)
    call_ids: list[list[str]] = field(default_factory=list)
    fail: grpc.aio.AioRpcError | None = None

    async def CreateTasks(self, request: pb.CreateTasksRequest, **kwargs: Any) -> pb.CreateTasksResponse:
        self.calls.append([item.request.title for item in request.items])
        self.call_ids.append([item.call_id for item in request.items])
        await self.release.wait()
        if self.fail is not None:
            raise self.fail
        return pb.CreateTasksResponse(
            outcomes=[pb.CreateTaskOutcome(task=pb.Task(task_id=f"id-{i.request.title}")) for i in request.items]
        )


async def test_creates_arriving_during_a_call_go_together_in_the_next() -> None:
    held = HeldScheduler()
    batches = CreateBatches(held, max_in_flight=1)  # type: ignore[arg-type]
    first = asyncio.create_task(batches.create(create("a"), "r-a", 30))
    await until(lambda: held.calls)  # a lone create leaves at once, alone
    later = [asyncio.create_task(batches.create(create(t), f"r-{t}", 30)) for t in "bcd"]
    await asyncio.sleep(0.01)
    assert held.calls == [["a"]], "nothing leaves while a call is in flight"
    held.release.set()
    replies = await asyncio.gather(first, *later)
    assert [r.task.task_id for r in replies] == ["id-a", "id-b", "id-c", "id-d"]
    assert held.calls == [["a"], ["b", "c", "d"]]
    assert held.call_ids == [["r-a"], ["r-b", "r-c", "r-d"]]


async def test_one_batch_goes_at_a_time_while_the_one_in_flight_is_not_slow() -> None:
    held = HeldScheduler()
    batches = CreateBatches(held, slow_batch_s=30)  # type: ignore[arg-type]
    first = asyncio.create_task(batches.create(create("a"), "r-a", 60))
    await until(lambda: held.calls)
    later = [asyncio.create_task(batches.create(create(t), f"r-{t}", 60)) for t in "bcd"]
    await asyncio.sleep(0.05)
    assert held.calls == [["a"]], "nothing goes beside a batch out for less than slow_batch_s"
    held.release.set()
    await asyncio.gather(first, *later)
    assert held.calls == [["a"], ["b", "c", "d"]]


@dataclass
class StampedScheduler(HeldScheduler):
    """A HeldScheduler that also notes when each call arrived (the loop's clock)."""

    sent_at: list[float] = field(default_factory=list)

    async def CreateTasks(self, request: pb.CreateTasksRequest, **kwargs: Any) -> pb.CreateTasksResponse:
        self.sent_at.append(asyncio.get_running_loop().time())
        return await super().CreateTasks(request, **kwargs)


async def test_a_slow_batch_does_not_hold_the_creates_behind_it() -> None:
    """A batch out for slow_batch_s (a create making a Git worktree, say) has the next one go
    beside it, once — not one per create — and no earlier."""
    held = StampedScheduler()
    batches = CreateBatches(held, slow_batch_s=0.2)  # type: ignore[arg-type]
    first = asyncio.create_task(batches.create(create("a"), "r-a", 60))
    await until(lambda: held.calls)
    later = [asyncio.create_task(batches.create(create(t), f"r-{t}", 60)) for t in "bc"]
    await until(lambda: len(held.calls) == 2)
    assert held.sent_at[1] - held.sent_at[0] >= 0.2 - 0.001, "the second batch went before the first was slow"
    assert held.calls == [["a"], ["b", "c"]]
    held.release.set()
    assert [r.task.task_id for r in await asyncio.gather(first, *later)] == ["id-a", "id-b", "id-c"]


async def test_batches_beside_slow_ones_stop_at_max_in_flight_and_the_rest_go_after() -> None:
    held = HeldScheduler()
    batches = CreateBatches(held, max_in_flight=2, slow_batch_s=0)  # type: ignore[arg-type]
    first = asyncio.create_task(batches.create(create("a"), "r-a", 60))
    await until(lambda: len(held.calls) == 1)
    second = asyncio.create_task(batches.create(create("b"), "r-b", 60))
    await until(lambda: len(held.calls) == 2)
    later = [asyncio.create_task(batches.create(create(t), f"r-{t}", 60)) for t in "cde"]
    await asyncio.sleep(0.05)
    assert held.calls == [["a"], ["b"]], "at most max_in_flight batches out"
    held.release.set()
    await asyncio.gather(first, second, *later)
    assert sorted(sum(held.calls[2:], [])) == ["c", "d", "e"]


@dataclass
class OneByOneScheduler:
    """Holds each call until its own gate opens; records the titles of every call."""

    gates: list[asyncio.Event] = field(default_factory=list)
    calls: list[list[str]] = field(default_factory=list)

    async def CreateTasks(self, request: pb.CreateTasksRequest, **kwargs: Any) -> pb.CreateTasksResponse:
        self.calls.append([item.request.title for item in request.items])
        gate = asyncio.Event()
        self.gates.append(gate)
        await gate.wait()
        return pb.CreateTasksResponse(
            outcomes=[pb.CreateTaskOutcome(task=pb.Task(task_id=f"id-{i.request.title}")) for i in request.items]
        )


async def test_creates_waiting_when_the_batch_beside_a_slow_one_returns_go_at_once() -> None:
    """The batch sent beside a slow one comes back while the slow one is still out: what waits
    meanwhile goes straight away (the slow one still holds nothing), and every create is answered."""
    held = OneByOneScheduler()
    batches = CreateBatches(held, slow_batch_s=1.0)  # type: ignore[arg-type]
    loop = asyncio.get_running_loop()
    slow = asyncio.create_task(batches.create(create("slow"), "r-s", 60))
    await until(lambda: len(held.calls) == 1)
    beside = asyncio.create_task(batches.create(create("b"), "r-b", 60))
    await until(lambda: len(held.calls) == 2)
    beside_left = loop.time()
    waiting = asyncio.create_task(batches.create(create("c"), "r-c", 60))  # "b" is young: "c" waits
    await asyncio.sleep(0.05)
    assert len(held.calls) == 2
    held.gates[1].set()  # "b" answered; "slow" still out, and slow
    assert (await beside).task.task_id == "id-b"
    await until(lambda: len(held.calls) == 3)
    assert loop.time() - beside_left < 1.0, "c waited for b to turn slow, though b had come back"
    assert held.calls == [["slow"], ["b"], ["c"]]
    held.gates[2].set()
    assert (await waiting).task.task_id == "id-c"
    assert not slow.done()
    held.gates[0].set()
    assert (await slow).task.task_id == "id-slow"


async def test_a_create_whose_caller_left_before_its_batch_is_not_sent() -> None:
    held = HeldScheduler()
    batches = CreateBatches(held, max_in_flight=1)  # type: ignore[arg-type]
    first = asyncio.create_task(batches.create(create("a"), "r-a", 30))
    await until(lambda: held.calls)
    gone = asyncio.create_task(batches.create(create("gone"), "r-g", 30))
    kept = asyncio.create_task(batches.create(create("kept"), "r-k", 30))
    await asyncio.sleep(0.01)
    gone.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await gone
    held.release.set()
    await asyncio.gather(first, kept)
    assert held.calls == [["a"], ["kept"]]


async def test_a_failed_call_fails_each_of_its_creates_with_its_code() -> None:
    held = HeldScheduler(
        fail=grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "down")
    )
    held.release.set()
    batches = CreateBatches(held)  # type: ignore[arg-type]
    outcomes = await asyncio.gather(*(batches.create(create(t), t, 30) for t in "abc"), return_exceptions=True)
    assert all(isinstance(o, grpc.aio.AioRpcError) and o.code() == grpc.StatusCode.UNAVAILABLE for o in outcomes)
    assert len({id(o) for o in outcomes}) == 3, "each waiting create gets its own exception"
    assert from_rpc_error(outcomes[0]).status == 503  # type: ignore[arg-type]


async def test_a_create_not_answered_within_its_timeout_is_a_deadline_exceeded() -> None:
    held = HeldScheduler()  # never released
    batches = CreateBatches(held)  # type: ignore[arg-type]
    with pytest.raises(grpc.aio.AioRpcError) as late:
        await batches.create(create("a"), "r", 0.2)
    assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert from_rpc_error(late.value).status == 504


async def test_each_create_is_answered_and_refused_as_its_create_task_call_would_be(tmp_path: Path) -> None:
    async with served_scheduler(tmp_path) as (_, stub):
        batches = CreateBatches(stub)
        good, bad = create("fine", profile="w"), create("bad", profile="nope")
        # Named before it is unpacked: mypy cannot type an awaited gather's (Any | BaseException)
        # results unpacked in one statement ("Cannot determine type").
        outcomes = await asyncio.gather(
            batches.create(good, "r-1", 10), batches.create(bad, "r-2", 10), return_exceptions=True
        )
        answered, refused = outcomes
        assert isinstance(answered, pb.CreateTaskResponse) and answered.task.title == "fine"
        assert answered.task.state == pb.TASK_STATE_QUEUED
        assert isinstance(refused, grpc.aio.AioRpcError)
        with pytest.raises(grpc.aio.AioRpcError) as unary:
            await stub.CreateTask(bad)
        assert refused.code() == unary.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        # The REST answer is built from the error alone: the same error, the same answer.
        assert vars(from_rpc_error(refused)) == vars(from_rpc_error(unary.value))
        assert from_rpc_error(refused).error == "UNKNOWN_PROFILE"


async def test_a_batch_stays_within_its_byte_bound_but_a_large_create_still_goes_alone() -> None:
    held = HeldScheduler()
    batches = CreateBatches(held, max_bytes=250_000, max_in_flight=1)  # type: ignore[arg-type]
    first = asyncio.create_task(batches.create(create("a"), "r-a", 30))
    await until(lambda: held.calls)
    big = "x" * 100_000
    later = [
        asyncio.create_task(batches.create(create(t, instructions=big if t != "huge" else big * 3), t, 30))
        for t in ("b", "c", "d", "huge", "e")
    ]
    await asyncio.sleep(0.01)
    held.release.set()
    await asyncio.gather(first, *later)
    assert held.calls == [["a"], ["b", "c"], ["d"], ["huge"], ["e"]]
