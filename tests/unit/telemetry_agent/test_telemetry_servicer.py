"""The servicer on an in-process server, observing real subprocesses."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time

import grpc
import psutil
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from libs import proctree
from services.telemetry_agent.domain import Figures
from services.telemetry_agent.procread import ProcfsReader
from taskgate.telemetry.v1 import telemetry_pb2 as pb
from tests.unit.telemetry_agent.conftest import (
    BURN,
    PARENT,
    SLEEP,
    WRITE_TO_PIPE,
    AgentFactory,
    Procs,
)


def _ms(stamp: object) -> int:
    return stamp.ToMilliseconds()  # type: ignore[attr-defined, no-any-return]


async def test_a_cpu_burning_worker_shows_rising_user_ticks(make_agent: AgentFactory, procs: Procs) -> None:
    client = await make_agent()
    stream = await client.stream()
    burner = procs.start(BURN)
    await client.watch("burn", burner)
    first = await stream.until(lambda o: o.task_id == "burn")
    assert first.available and first.HasField("cpu_user_ticks")
    assert [(p.pid, p.start_time) for p in first.processes] == [(burner.pid, burner.start_time)]
    assert first.root.pid == burner.pid and first.root.start_time == burner.start_time
    later = await stream.until(
        lambda o: o.task_id == "burn" and o.cpu_user_ticks >= first.cpu_user_ticks + 10, timeout=15
    )
    assert later.HasField("last_activity_time")
    assert _ms(later.last_activity_time) == _ms(later.observe_time)


async def test_a_worker_writing_to_a_pipe_shows_rising_write_counts(make_agent: AgentFactory, procs: Procs) -> None:
    read_end, write_end = os.pipe()
    try:
        writer = procs.start(WRITE_TO_PIPE, stdout=write_end)
        client = await make_agent()
        stream = await client.stream()
        await client.watch("pipe", writer)
        first = await stream.until(lambda o: o.task_id == "pipe")
        later = await stream.until(
            lambda o: o.task_id == "pipe" and o.io_write_count >= first.io_write_count + 5, timeout=15
        )
        assert later.io_write_bytes >= first.io_write_bytes + 5
        assert later.HasField("last_activity_time")
    finally:
        os.close(read_end)
        os.close(write_end)


async def test_a_sleeping_worker_shows_no_activity(make_agent: AgentFactory, procs: Procs) -> None:
    sleeper = procs.start(SLEEP)
    client = await make_agent(interval_s=0.1)
    stream = await client.stream()
    await client.watch("sleep", sleeper)
    await stream.until(lambda o: o.task_id == "sleep" and len(stream.of("sleep")) >= 6, timeout=15)
    observations = stream.of("sleep")
    assert all(o.available and not o.ended for o in observations)
    assert (
        len(
            {
                (
                    o.cpu_user_ticks,
                    o.cpu_system_ticks,
                    o.io_read_count,
                    o.io_write_count,
                    o.io_read_bytes,
                    o.io_write_bytes,
                )
                for o in observations
            }
        )
        == 1
    )
    assert not any(o.HasField("last_activity_time") for o in observations)
    assert len({_ms(o.observe_time) for o in observations}) == len(observations)


async def test_a_child_appears_in_the_members_and_leaves_when_it_exits(make_agent: AgentFactory, procs: Procs) -> None:
    parent = procs.start(PARENT, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    client = await make_agent()
    stream = await client.stream()
    await client.watch("tree", parent)
    await stream.until(lambda o: o.task_id == "tree")
    child_pid = int(await asyncio.to_thread(parent.command, "spawn"))
    with_child = await stream.until(lambda o: o.task_id == "tree" and len(o.processes) == 2)
    assert [p.pid for p in with_child.processes] == [parent.pid, child_pid]
    assert with_child.processes[1].start_time == proctree.start_time_of(child_pid)
    assert with_child.HasField("last_activity_time")  # the child's own start-up reads and CPU

    assert await asyncio.to_thread(parent.command, "stop") == "stopped"
    index = len(stream.items)
    gone = await stream.until(lambda o: o.task_id == "tree" and len(o.processes) == 1, after=index)
    assert [p.pid for p in gone.processes] == [parent.pid]
    assert gone.cpu_user_ticks >= with_child.cpu_user_ticks  # sums never go backwards
    assert gone.io_read_bytes >= with_child.io_read_bytes


async def test_a_live_pid_with_another_start_time_is_never_reported(make_agent: AgentFactory, procs: Procs) -> None:
    other = procs.start(SLEEP)
    client = await make_agent(interval_s=5.0)
    stream = await client.stream()
    await client.watch("reused", pid=other.pid, start_time=other.start_time - 1)
    obs = await stream.until(lambda o: o.task_id == "reused", timeout=3)  # at once, not at the 5 s tick
    assert obs.ended and not obs.available and obs.reason == "IDENTITY_MISMATCH"
    assert not obs.HasField("cpu_user_ticks") and list(obs.processes) == []
    listed = await client.stub.ListWatches(pb.ListWatchesRequest(), timeout=5)
    assert list(listed.watches) == []


async def test_an_unreadable_process_is_unavailable_with_a_reason(make_agent: AgentFactory, procs: Procs) -> None:
    class DenyingReader(ProcfsReader):
        def read(self, pid: int, start_time: int) -> Figures:
            raise psutil.AccessDenied(pid)

    sleeper = procs.start(SLEEP)
    client = await make_agent(reader=DenyingReader())
    stream = await client.stream()
    await client.watch("denied", sleeper)
    for _ in range(2):
        obs = await stream.until(lambda o: o.task_id == "denied", after=len(stream.of("denied")))
        assert not obs.available and obs.reason == "ACCESS_DENIED" and not obs.ended
        assert str(sleeper.pid) in obs.reason_detail
        assert not obs.HasField("cpu_user_ticks") and not obs.HasField("io_write_count")
        assert [p.pid for p in obs.processes] == [sleeper.pid]


async def test_a_tree_ending_is_observed_at_once(make_agent: AgentFactory, procs: Procs) -> None:
    sleeper = procs.start(SLEEP)
    client = await make_agent(interval_s=5.0)
    stream = await client.stream()
    await client.watch("end", sleeper)
    baseline = await stream.until(lambda o: o.task_id == "end", timeout=3)
    assert not baseline.ended
    started = time.monotonic()
    sleeper.popen.kill()  # left a zombie: this test process does not reap it yet
    ended = await stream.until(lambda o: o.task_id == "end" and o.ended, timeout=3)
    assert time.monotonic() - started < 3  # well before the next 5 s tick
    assert ended.available and list(ended.processes) == []
    assert ended.cpu_user_ticks == baseline.cpu_user_ticks
    listed = await client.stub.ListWatches(pb.ListWatchesRequest(), timeout=5)
    assert list(listed.watches) == []


async def test_a_tree_ending_without_exit_notification_is_seen_at_the_next_tick(
    make_agent: AgentFactory, procs: Procs
) -> None:
    sleeper = procs.start(SLEEP)
    client = await make_agent(interval_s=0.2, pidfd_opener=None)
    stream = await client.stream()
    await client.watch("end2", sleeper)
    await stream.until(lambda o: o.task_id == "end2")
    sleeper.popen.kill()
    sleeper.popen.wait()
    assert (await stream.until(lambda o: o.task_id == "end2" and o.ended)).ended


async def test_watch_is_idempotent_unwatch_too_and_list_pages(make_agent: AgentFactory, procs: Procs) -> None:
    sleepers = [procs.start(SLEEP) for _ in range(3)]
    client = await make_agent(interval_s=5.0)
    stream = await client.stream()
    for i, s in enumerate(sleepers):
        await client.watch(f"t{i}", s)
    await client.watch("t0", sleepers[0])  # the same again: OK, and nothing changes
    assert await client.agent.watch("t0", sleepers[0].pid, sleepers[0].start_time) is False
    await stream.until(lambda o: o.task_id == "t2")

    page = await client.stub.ListWatches(pb.ListWatchesRequest(page_size=2), timeout=5)
    assert [w.task_id for w in page.watches] == ["t0", "t1"] and page.next_page_token
    assert page.watches[0].pid == sleepers[0].pid
    assert page.watches[0].pid_start_time == sleepers[0].start_time
    assert page.watches[0].HasField("create_time")
    rest = await client.stub.ListWatches(pb.ListWatchesRequest(page_size=2, page_token=page.next_page_token), timeout=5)
    assert [w.task_id for w in rest.watches] == ["t2"] and not rest.next_page_token

    await client.stub.Unwatch(pb.UnwatchRequest(task_id="t1"), timeout=5)
    await client.stub.Unwatch(pb.UnwatchRequest(task_id="t1"), timeout=5)
    await client.stub.Unwatch(pb.UnwatchRequest(task_id="never-watched"), timeout=5)
    listed = await client.stub.ListWatches(pb.ListWatchesRequest(), timeout=5)
    assert [w.task_id for w in listed.watches] == ["t0", "t2"]

    # A new root for the same task (a new attempt) replaces the watch.
    await client.watch("t0", sleepers[1])
    replaced = await stream.until(lambda o: o.task_id == "t0" and o.root.pid == sleepers[1].pid)
    assert not replaced.ended


@pytest.mark.parametrize(
    ("request_", "reason"),
    [
        (pb.WatchRequest(task_id="", pid=100, pid_start_time=5), "INVALID_TASK_ID"),
        (pb.WatchRequest(task_id="t", pid=0, pid_start_time=5), "INVALID_PID"),
        (pb.WatchRequest(task_id="t", pid=100, pid_start_time=0), "INVALID_PID_START_TIME"),
    ],
)
async def test_invalid_watches_are_invalid_argument(
    make_agent: AgentFactory, request_: pb.WatchRequest, reason: str
) -> None:
    client = await make_agent()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await client.stub.Watch(request_, timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    status = rpc_status.from_call(info.value)
    assert status is not None
    detail = error_details_pb2.ErrorInfo()
    status.details[0].Unpack(detail)
    assert detail.reason == reason


async def test_bad_unwatch_and_list_requests_are_invalid_argument(make_agent: AgentFactory) -> None:
    client = await make_agent()
    for call in (
        client.stub.Unwatch(pb.UnwatchRequest(task_id=""), timeout=5),
        client.stub.ListWatches(pb.ListWatchesRequest(page_size=5000), timeout=5),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_many_subscribers_and_latest_on_connect(make_agent: AgentFactory, procs: Procs) -> None:
    sleeper = procs.start(SLEEP)
    client = await make_agent(interval_s=0.1)
    a, b = await client.stream(), await client.stream()
    await client.watch("fan", sleeper)
    await a.until(lambda o: o.task_id == "fan" and len(a.of("fan")) >= 3)
    await b.until(lambda o: o.task_id == "fan" and len(b.of("fan")) >= 3)
    late = await client.stream(include_latest=True)
    first = await late.until(lambda o: True, timeout=5)
    assert first.task_id == "fan"
    assert client.agent.subscribers() == 3
    await a.stop()
    await late.until(lambda o: True, after=1)
    deadline = time.monotonic() + 5
    while client.agent.subscribers() != 2:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)


async def test_a_stream_that_falls_behind_is_ended_with_resource_exhausted(
    make_agent: AgentFactory, procs: Procs
) -> None:
    sleepers = [procs.start(SLEEP) for _ in range(3)]
    client = await make_agent(interval_s=0.05, subscriber_backlog=2)
    call = client.stub.StreamObservations(pb.StreamObservationsRequest())
    await call.initial_metadata()
    for i, s in enumerate(sleepers):
        await client.watch(f"s{i}", s)
    # Never reading: the transport buffers some, then the agent's backlog overflows.
    deadline = time.monotonic() + 20
    while client.agent.subscribers() != 0:
        assert time.monotonic() < deadline, "slow subscriber was not dropped"
        await asyncio.sleep(0.05)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in call:
            pass
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_after_a_restart_the_watch_list_is_empty_and_a_new_stream_works(
    make_agent: AgentFactory, procs: Procs
) -> None:
    sleeper = procs.start(SLEEP)
    first = await make_agent()
    await first.watch("again", sleeper)
    stream = await first.stream()
    await stream.until(lambda o: o.task_id == "again")
    await first.agent.stop()  # the stream ends cleanly, the scheduler reconnects
    await stream.closed(timeout=5)
    assert stream.error is None
    second = await make_agent()  # a fresh agent: nothing is persisted
    listed = await second.stub.ListWatches(pb.ListWatchesRequest(), timeout=5)
    assert list(listed.watches) == []
    stream2 = await second.stream()
    await second.watch("again", sleeper)  # the scheduler re-registers
    obs = await stream2.until(lambda o: o.task_id == "again")
    assert obs.available and obs.root.pid == sleeper.pid


async def test_batch_mode_delivers_each_sample_in_one_response(make_agent: AgentFactory, procs: Procs) -> None:
    sleepers = [procs.start(SLEEP) for _ in range(4)]
    client = await make_agent(interval_s=0.1)
    plain = await client.stream()
    batched = await client.stream(batch=True)
    for i, s in enumerate(sleepers):
        await client.watch(f"b{i}", s)
    await batched.until(lambda o: len(batched.of("b0")) >= 3 and 4 in batched.batches[1:])
    assert not plain.batches  # one observation per response without batch
    # A full tick is one response holding every watched task, in task order.
    full = batched.batches.index(4, 1)
    offset = sum(batched.batches[:full])
    assert [o.task_id for o in batched.items[offset : offset + 4]] == ["b0", "b1", "b2", "b3"]
    await plain.until(lambda o: o.task_id == "b3")
