"""The gateway's shared task watch (one upstream stream per session, bounded fan-out) and
the per-task watch behind a task page."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gateway_http.errors import ApiError
from gateway_http.task_stream import TaskStreams
from gateway_http.task_watch import TaskWatch
from taskgate.scheduler.v1 import scheduler_pb2 as pb


class FakeCall:
    """A WatchTasks call: live once ``initial_metadata`` returns, then the events put in."""

    def __init__(self) -> None:
        self.events: asyncio.Queue[pb.WatchTasksResponse] = asyncio.Queue()
        self.cancelled = False

    async def initial_metadata(self) -> tuple[tuple[str, str], ...]:
        return (("x-taskgate-watch-live", "1"),)

    def __aiter__(self) -> AsyncIterator[pb.WatchTasksResponse]:
        return self._events()

    async def _events(self) -> AsyncIterator[pb.WatchTasksResponse]:
        while True:
            yield await self.events.get()

    def cancel(self) -> None:
        self.cancelled = True


class FakeScheduler:
    def __init__(self) -> None:
        self.calls: list[FakeCall] = []

    def WatchTasks(self, request: pb.WatchTasksRequest, **_: Any) -> FakeCall:  # noqa: N802 - the stub's name
        self.calls.append(FakeCall())
        return self.calls[-1]


def event(task_id: str, state: int, sequence: int, **task: Any) -> pb.WatchTasksResponse:
    kind = pb.TASK_EVENT_TYPE_SNAPSHOT if sequence == 0 else pb.TASK_EVENT_TYPE_STATE_CHANGED
    return pb.WatchTasksResponse(
        sequence=sequence, type=kind, task=pb.Task(task_id=task_id, title="t", state=state, **task)
    )


def parse(chunk: bytes) -> tuple[str, dict[str, Any]]:
    fields = dict(line.split(": ", 1) for line in chunk.decode().strip().splitlines())
    return fields.get("event", ""), json.loads(fields["data"])


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_clients_of_a_session_share_one_watch_and_joiners_get_the_active_tasks() -> None:
    scheduler = FakeScheduler()
    streams = TaskStreams(scheduler, buffer_frames=16)  # type: ignore[arg-type]
    first = await streams.open("a", "s")
    call = scheduler.calls[0]
    call.events.put_nowait(event("t1", pb.TASK_STATE_RUNNING, 0, instructions="secret", result=pb.Result(text="r")))
    call.events.put_nowait(event("t2", pb.TASK_STATE_QUEUED, 5))
    call.events.put_nowait(event("t2", pb.TASK_STATE_COMPLETED, 6))
    await settle()
    second = await streams.open("a", "s")
    assert len(scheduler.calls) == 1, "one upstream stream for the session"
    got_first = [parse(await anext(first)) for _ in range(3)]
    assert [(e, d["task"]["taskId"], d["task"]["state"]) for e, d in got_first] == [
        ("task.snapshot", "t1", "running"),
        ("task.state_changed", "t2", "queued"),
        ("task.state_changed", "t2", "completed"),
    ]
    assert not {"instructions", "result"} & set(got_first[0][1]["task"]), "slim events"
    # The joiner: the active task's latest snapshot (t2 has finished), then what follows.
    assert parse(await anext(second))[1]["task"]["taskId"] == "t1"
    call.events.put_nowait(event("t1", pb.TASK_STATE_COMPLETED, 7))
    await settle()
    for client in (first, second):
        assert parse(await anext(client))[1]["task"]["state"] == "completed"
    await first.aclose()
    assert not call.cancelled
    await second.aclose()
    await settle()
    assert call.cancelled and streams.feeds == {}, "the last client gone closes the shared watch"
    await streams.close()


async def test_clients_ended_together_close_the_shared_watch_even_when_their_leaves_interleave() -> None:
    # Access ends for both clients (each is ended, then its response leaves). The second leave
    # comes while the watch is still shutting down from the first: the upstream call must be
    # cancelled all the same (a second cancel once interrupted that shutdown, and the call leaked).
    scheduler = FakeScheduler()
    streams = TaskStreams(scheduler, buffer_frames=16)  # type: ignore[arg-type]
    first, second = await streams.open("a", "s"), await streams.open("a", "s")
    call = scheduler.calls[0]
    goodbye = b"event: error\ndata: {}\n\n"
    first.end(goodbye)
    second.end(goodbye)
    await first.aclose()
    await asyncio.sleep(0)  # the watch begins its shutdown
    await second.aclose()
    await settle()
    assert call.cancelled and streams.feeds == {}, "the shared watch's upstream call was left open"
    await streams.close()


async def test_a_slow_client_is_ended_and_the_others_are_not_held_back() -> None:
    scheduler = FakeScheduler()
    streams = TaskStreams(scheduler, buffer_frames=4)  # type: ignore[arg-type]
    slow = await streams.open("a", "s")
    fast = await streams.open("a", "s")
    call = scheduler.calls[0]
    received = []

    async def read_fast() -> None:
        async for chunk in fast:
            received.append(parse(chunk)[1]["task"]["progress"]["text"])
            if len(received) == 20:
                return

    reader = asyncio.create_task(read_fast())
    for i in range(20):
        call.events.put_nowait(event("t1", pb.TASK_STATE_RUNNING, i + 1, progress=pb.Progress(text=str(i))))
        await settle()
    await asyncio.wait_for(reader, 5)
    assert received == [str(i) for i in range(20)]
    # The slow one never read: it gets an error frame and its end, not 20 frames.
    name, data = parse(await anext(slow))
    assert (name, data["error"]) == ("error", "STREAM_TOO_SLOW")
    with pytest.raises(StopAsyncIteration):
        await anext(slow)
    await slow.aclose()
    await fast.aclose()
    await streams.close()


async def test_a_client_gone_before_reading_still_leaves() -> None:
    scheduler = FakeScheduler()
    streams = TaskStreams(scheduler, buffer_frames=4)  # type: ignore[arg-type]
    subscription = await streams.open("a", "s")
    await subscription.aclose()  # never iterated: its response never started
    await settle()
    assert scheduler.calls[0].cancelled and streams.feeds == {}


async def test_a_change_a_slim_event_does_not_show_is_not_sent_but_joiners_get_the_newest_version() -> None:
    scheduler = FakeScheduler()
    streams = TaskStreams(scheduler, buffer_frames=16)  # type: ignore[arg-type]
    first = await streams.open("a", "s")
    call = scheduler.calls[0]
    call.events.put_nowait(event("t1", pb.TASK_STATE_RUNNING, 1, version=3))
    # A telemetry observation: a new version, nothing else a slim snapshot shows.
    observed = event("t1", pb.TASK_STATE_RUNNING, 2, version=4, execution=pb.Execution(available=True))
    observed.type = pb.TASK_EVENT_TYPE_EXECUTION
    call.events.put_nowait(observed)
    call.events.put_nowait(event("t1", pb.TASK_STATE_RUNNING, 3, version=5, progress=pb.Progress(text="p")))
    await settle()
    got = [parse(await anext(first)) for _ in range(2)]
    assert [(e, d["task"]["version"]) for e, d in got] == [("task.state_changed", 3), ("task.state_changed", 5)]
    call.events.put_nowait(
        observed.__class__(
            sequence=4,
            type=observed.type,
            task=pb.Task(
                task_id="t1", title="t", state=pb.TASK_STATE_RUNNING, version=6, progress=pb.Progress(text="p")
            ),
        )
    )
    await settle()
    assert first.queue.empty(), "a telemetry-only change is not sent"
    second = await streams.open("a", "s")
    assert parse(await anext(second))[1]["task"]["version"] == 6
    await first.aclose()
    await second.aclose()
    await streams.close()


async def test_a_task_watch_ends_after_the_finished_snapshot_and_closes_its_call() -> None:
    scheduler = FakeScheduler()
    call = FakeCall()
    scheduler.WatchTasks = lambda request, **_: call  # type: ignore[method-assign]
    call.events.put_nowait(event("t1", pb.TASK_STATE_RUNNING, 0, agent_id="a", session_id="s", instructions="i"))
    watch = await TaskWatch.open(scheduler, "t1", "a", "s", ())  # type: ignore[arg-type]
    first = parse(await anext(watch))
    assert first[0] == "task.snapshot" and first[1]["task"]["instructions"] == "i", "full snapshots"
    call.events.put_nowait(event("t1", pb.TASK_STATE_COMPLETED, 9, agent_id="a", session_id="s"))
    assert parse(await anext(watch))[1]["task"]["state"] == "completed"
    with pytest.raises(StopAsyncIteration):
        await anext(watch)
    assert call.cancelled
    # Another session's task: refused before any frame, its call cancelled.
    other = FakeCall()
    scheduler.WatchTasks = lambda request, **_: other  # type: ignore[method-assign]
    other.events.put_nowait(event("t2", pb.TASK_STATE_RUNNING, 0, agent_id="a", session_id="elsewhere"))
    with pytest.raises(ApiError) as refused:
        await TaskWatch.open(scheduler, "t2", "a", "s", ())  # type: ignore[arg-type]
    assert refused.value.status == 403 and other.cancelled
    # A client gone before its response started still cancels the upstream call.
    unread = FakeCall()
    scheduler.WatchTasks = lambda request, **_: unread  # type: ignore[method-assign]
    unread.events.put_nowait(event("t3", pb.TASK_STATE_RUNNING, 0, agent_id="a", session_id="s"))
    await (await TaskWatch.open(scheduler, "t3", "a", "s", ())).aclose()  # type: ignore[arg-type]
    assert unread.cancelled
