"""The gateway's shared task reads: one GetTask per task in flight, and every caller answered by a
read that began after it asked."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest

from gateway_http.task_reads import SharedTaskReads
from taskgate.scheduler.v1 import scheduler_pb2 as pb
from tests.support.waiting import until


@dataclass
class HeldScheduler:
    """Each GetTask waits for its own release; its reply's version says which read it was."""

    started: list[str] = field(default_factory=list)
    releases: list[asyncio.Event] = field(default_factory=list)
    fail: grpc.aio.AioRpcError | None = None

    def GetTask(self, request: pb.GetTaskRequest, **kwargs: Any) -> Any:
        self.started.append(request.task_id)
        release = asyncio.Event()
        self.releases.append(release)
        number = len(self.started)

        async def answer() -> pb.GetTaskResponse:
            await release.wait()
            if self.fail is not None:
                raise self.fail
            return pb.GetTaskResponse(task=pb.Task(task_id=request.task_id, version=number))

        return answer()


async def test_callers_during_a_read_share_the_next_read_not_the_one_under_way() -> None:
    held = HeldScheduler()
    reads = SharedTaskReads(held)  # type: ignore[arg-type]
    first = asyncio.create_task(reads.get("t1", "r0", 30))
    await until(lambda: held.started)
    later = [asyncio.create_task(reads.get("t1", f"r{i}", 30)) for i in range(1, 6)]
    await asyncio.sleep(0.01)
    assert held.started == ["t1"], "nothing more is read while a read of the task is under way"
    held.releases[0].set()
    assert (await first).task.version == 1
    await until(lambda: len(held.started) == 2)
    held.releases[1].set()
    # The five came while read 1 was under way: they get read 2, which began after they asked.
    assert [(await t).task.version for t in later] == [2] * 5
    assert held.started == ["t1", "t1"]


async def test_reads_of_different_tasks_are_not_shared() -> None:
    held = HeldScheduler()
    reads = SharedTaskReads(held)  # type: ignore[arg-type]
    one, two = asyncio.create_task(reads.get("t1", "a", 30)), asyncio.create_task(reads.get("t2", "b", 30))
    await until(lambda: len(held.started) == 2)
    for release in held.releases:
        release.set()
    assert [(await one).task.task_id, (await two).task.task_id] == ["t1", "t2"]


async def test_a_failed_read_fails_each_of_its_callers_with_its_code() -> None:
    held = HeldScheduler()
    reads = SharedTaskReads(held)  # type: ignore[arg-type]
    first = asyncio.create_task(reads.get("t1", "r", 30))
    await until(lambda: held.started)
    sharing = [asyncio.create_task(reads.get("t1", "r", 30)) for _ in range(3)]  # the next read's callers
    await asyncio.sleep(0.01)
    held.releases[0].set()
    await first
    await until(lambda: len(held.started) == 2)
    held.fail = grpc.aio.AioRpcError(grpc.StatusCode.NOT_FOUND, grpc.aio.Metadata(), grpc.aio.Metadata(), "gone")
    held.releases[1].set()
    outcomes = await asyncio.gather(*sharing, return_exceptions=True)
    assert all(isinstance(o, grpc.aio.AioRpcError) and o.code() == grpc.StatusCode.NOT_FOUND for o in outcomes)
    assert len({id(o) for o in outcomes}) == 3, "each caller raises its own exception"
    assert held.started == ["t1", "t1"]


async def test_a_caller_past_its_deadline_gets_deadline_exceeded_and_the_others_their_answer() -> None:
    held = HeldScheduler()
    reads = SharedTaskReads(held)  # type: ignore[arg-type]
    patient = asyncio.create_task(reads.get("t1", "a", 30))
    await until(lambda: held.started)
    with pytest.raises(grpc.aio.AioRpcError) as late:
        await reads.get("t1", "b", 0.1)
    assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    held.releases[0].set()
    assert (await patient).task.version == 1


async def test_no_read_is_made_for_callers_that_all_left_before_it_began() -> None:
    held = HeldScheduler()
    reads = SharedTaskReads(held)  # type: ignore[arg-type]
    first = asyncio.create_task(reads.get("t1", "a", 30))
    await until(lambda: held.started)
    gone = asyncio.create_task(reads.get("t1", "b", 30))
    await asyncio.sleep(0.01)
    gone.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await gone
    held.releases[0].set()
    await first
    await asyncio.sleep(0.01)
    assert held.started == ["t1"]
    # And the next caller starts a read of its own at once.
    again = asyncio.create_task(reads.get("t1", "c", 30))
    await until(lambda: len(held.started) == 2)
    held.releases[1].set()
    assert (await again).task.version == 2
