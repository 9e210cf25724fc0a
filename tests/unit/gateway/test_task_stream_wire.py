"""The task stream once its response has taken the connection over: the feed writes each
frame to the client's transport itself (``gateway_http.sse_wire``). Served by a real
uvicorn (httptools) on loopback, read over a raw socket; the bound on a stuck client with
a transport whose buffer never drains; the access recheck shared by the streams of a key."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route

from gateway_http import task_stream
from gateway_http.sse import BoundedEventStream, frame
from gateway_http.sse_wire import chunk, expose_connection
from gateway_http.task_stream import FANOUT_SLICE, TaskStreams
from taskgate.scheduler.v1 import scheduler_pb2 as pb
from tests.unit.gateway.test_task_stream import FakeScheduler, event, settle


class Reader:
    """An SSE client on a raw socket that decodes the chunked body itself."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.pending = b""
        self.ended = False

    @classmethod
    async def open(cls, port: int) -> Reader:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /events HTTP/1.1\r\nHost: t\r\nAccept: text/event-stream\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in head.lower(), head
        return cls(reader, writer)

    async def next(self) -> tuple[str, str]:
        """The next frame: (event name or ``comment``, data)."""
        while b"\n\n" not in self.pending:
            size = int((await asyncio.wait_for(self.reader.readuntil(b"\r\n"), 5)).strip(), 16)
            if size == 0:
                self.ended = True
                raise EOFError
            self.pending += (await self.reader.readexactly(size + 2))[:-2]
        one, _, self.pending = self.pending.partition(b"\n\n")
        if one.startswith(b":"):
            return "comment", one.decode()
        fields = dict(line.split(": ", 1) for line in one.decode().splitlines())
        return fields.get("event", ""), fields["data"]

    def close(self) -> None:
        self.writer.close()


@pytest.fixture
async def served() -> AsyncIterator[tuple[int, TaskStreams, FakeScheduler, dict[str, bytes | None]]]:
    scheduler = FakeScheduler()
    streams = TaskStreams(scheduler, buffer_frames=16)  # type: ignore[arg-type]
    access: dict[str, bytes | None] = {"goodbye": None}

    async def still_allowed() -> bytes | None:
        return access["goodbye"]

    async def events(request: Request) -> BoundedEventStream:
        return BoundedEventStream(
            await streams.open("a", "s"),
            buffer_frames=16,
            heartbeat_s=0.3,
            still_allowed=still_allowed,
            recheck_s=0.1,
        )

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    app = expose_connection(Starlette(routes=[Route("/events", events)]))
    server = uvicorn.Server(uvicorn.Config(app, http="httptools", lifespan="off", log_config=None))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield sock.getsockname()[1], streams, scheduler, access
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 10)
        await streams.close()


async def test_the_feed_writes_to_the_connection_after_the_snapshots_with_heartbeats_and_the_end(
    served: tuple[int, TaskStreams, FakeScheduler, dict[str, bytes | None]],
) -> None:
    port, streams, scheduler, access = served
    first = await Reader.open(port)
    call = scheduler.calls[0]
    call.events.put_nowait(event("t1", pb.TASK_STATE_QUEUED, 1))
    assert (await first.next())[0] == "task.state_changed"
    (feed,) = streams.feeds.values()
    assert all(c.transport is not None for c in feed.clients), "the connection was taken over"

    second = await Reader.open(port)  # a joiner: the snapshot through its response, then direct
    name, data = await second.next()
    assert (name, json.loads(data)["task"]["state"]) == ("task.snapshot", "queued")
    call.events.put_nowait(event("t1", pb.TASK_STATE_RUNNING, 2))
    for reader in (first, second):
        name, data = await reader.next()
        assert (name, json.loads(data)["task"]["state"]) == ("task.state_changed", "running")
    assert len(feed.clients) == 2 and all(c.transport is not None for c in feed.clients)

    # Idle: the response writes the heartbeat itself.
    for reader in (first, second):
        assert (await reader.next())[0] == "comment"

    # Access ends: the last frame, then the end of the chunked body; the shared watch closes.
    access["goodbye"] = frame(json.dumps({"error": "NOT_A_MEMBER", "message": "gone"}), "error")
    for reader in (first, second):
        name, data = await reader.next()
        while name == "comment":
            name, data = await reader.next()
        assert (name, json.loads(data)["error"]) == ("error", "NOT_A_MEMBER")
        with pytest.raises(EOFError):
            await reader.next()
        reader.close()
    for _ in range(500):  # up to 10 s: generous on a loaded machine
        if call.cancelled and not streams.feeds:
            break
        await asyncio.sleep(0.02)
    assert call.cancelled and streams.feeds == {}


async def test_a_client_gone_leaves_the_feed_and_the_others_keep_their_frames(
    served: tuple[int, TaskStreams, FakeScheduler, dict[str, bytes | None]],
) -> None:
    port, streams, scheduler, _ = served
    staying, leaving = await Reader.open(port), await Reader.open(port)
    call = scheduler.calls[0]
    (feed,) = streams.feeds.values()
    leaving.close()
    for _ in range(500):  # up to 10 s: generous on a loaded machine
        if len(feed.clients) == 1:
            break
        await asyncio.sleep(0.02)
    assert len(feed.clients) == 1
    for i in range(5):
        call.events.put_nowait(event("t1", pb.TASK_STATE_RUNNING, i + 1, progress=pb.Progress(text=str(i))))
    got = [json.loads((await staying.next())[1])["task"]["progress"]["text"] for _ in range(5)]
    assert got == ["0", "1", "2", "3", "4"]
    staying.close()


class StuckTransport(asyncio.Transport):
    """A connection whose peer never reads: everything written stays in its buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []
        self.closing = False

    def write(self, data: Any) -> None:
        self.written.append(bytes(data))

    def get_write_buffer_size(self) -> int:
        return sum(map(len, self.written))

    def is_closing(self) -> bool:
        return self.closing


class DrainedTransport(StuckTransport):
    def get_write_buffer_size(self) -> int:
        return 0  # the kernel took it all


async def test_a_client_whose_connection_does_not_drain_is_ended_and_the_others_are_not_held_back() -> None:
    scheduler = FakeScheduler()
    streams = TaskStreams(scheduler, buffer_frames=4)  # type: ignore[arg-type]
    slow, fast = await streams.open("a", "s"), await streams.open("a", "s")
    stuck, drained = StuckTransport(), DrainedTransport()
    slow_done, fast_done = slow.take_over(stuck), fast.take_over(drained)
    assert slow_done is not None and fast_done is not None
    call = scheduler.calls[0]
    for i in range(10):
        call.events.put_nowait(event("t1", pb.TASK_STATE_RUNNING, i + 1, progress=pb.Progress(text=str(i))))
        await settle()  # one at a time: one write each
    assert len(drained.written) == 10 and all(w.endswith(b"\r\n") for w in drained.written)
    size, _, rest = drained.written[3].partition(b"\r\n")
    payload = rest.removesuffix(b"\r\n")
    assert int(size, 16) == len(payload) and payload.endswith(b"id: 4\n\n"), "each frame is one HTTP chunk"
    assert chunk(payload) == drained.written[3]
    # The stuck one: the first write, then 4 more into a buffer that never drains, then its end.
    assert len(stuck.written) == 1 + 4 + 1 and b"STREAM_TOO_SLOW" in stuck.written[-1]
    assert slow_done.is_set() and not fast_done.is_set()
    (feed,) = streams.feeds.values()
    assert feed.clients == {fast.client}
    await slow.aclose()
    await fast.aclose()
    await streams.close()


async def test_the_streams_of_one_key_share_their_access_recheck() -> None:
    streams = TaskStreams(FakeScheduler(), buffer_frames=4)  # type: ignore[arg-type]
    calls: list[str] = []

    def check_of(name: str, answer: bytes | None = None) -> Any:
        async def check() -> bytes | None:
            calls.append(name)
            await asyncio.sleep(0.01)
            return answer

        return check

    shared = [streams.shared_check("Bearer k1", "a", "s", check_of("k1"), ttl_s=0.2) for _ in range(3)]
    other = streams.shared_check("Bearer k2", "a", "s", check_of("k2", b"bye"), ttl_s=0.2)
    assert await asyncio.gather(*(s() for s in shared), other()) == [None, None, None, b"bye"]
    assert sorted(calls) == ["k1", "k2"], "one check per key and session, however many streams"
    await asyncio.sleep(0.25)
    await shared[1]()
    assert calls.count("k1") == 2, "checked again once the interval has passed"


async def test_events_that_arrive_during_a_fan_out_go_out_together_in_one_write_per_client() -> None:
    scheduler = FakeScheduler()
    streams = TaskStreams(scheduler, buffer_frames=64)  # type: ignore[arg-type]
    wired, queued = await streams.open("a", "s"), await streams.open("a", "s")
    transport = DrainedTransport()
    assert wired.take_over(transport) is not None
    call = scheduler.calls[0]
    for i in range(10):  # all read before the feed's next turn
        call.events.put_nowait(event("t1", pb.TASK_STATE_RUNNING, i + 1, progress=pb.Progress(text=str(i))))
    await settle()
    await settle()
    (written,) = transport.written
    assert [line for line in written.split(b"\n") if line.startswith(b"id: ")] == [
        f"id: {i + 1}".encode() for i in range(10)
    ], "every frame, in order, in one write"
    # A client still on its queue gets them as ten frames (its bound counts frames).
    got = [await anext(queued) for _ in range(10)]
    assert [g.split(b"id: ")[1].split(b"\n")[0] for g in got] == [str(i + 1).encode() for i in range(10)]
    await wired.aclose()
    await queued.aclose()
    await streams.close()


async def test_a_real_client_that_stops_reading_is_ended_once_its_connection_backs_up(
    served: tuple[int, TaskStreams, FakeScheduler, dict[str, bytes | None]],
) -> None:
    port, streams, scheduler, _ = served
    stuck = socket.socket()
    stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stuck.connect(("127.0.0.1", port))
    stuck.sendall(b"GET /events HTTP/1.1\r\nHost: t\r\nAccept: text/event-stream\r\n\r\n")
    reading = await Reader.open(port)
    (feed,) = streams.feeds.values()
    for _ in range(500):  # up to 10 s: generous on a loaded machine
        if len(feed.clients) == 2 and all(c.transport is not None for c in feed.clients):
            break
        await asyncio.sleep(0.02)
    for client in feed.clients:
        # Small kernel buffers on the gateway's side too, so a peer that stops reading backs up soon.
        assert client.transport is not None
        client.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    call = scheduler.calls[0]
    sent = 0
    while len(feed.clients) == 2 and sent < 2000:
        text = f"{sent:05d}" + "x" * 190
        call.events.put_nowait(event("t1", pb.TASK_STATE_RUNNING, sent + 1, progress=pb.Progress(text=text)))
        sent += 1
        got = json.loads((await reading.next())[1])["task"]["progress"]["text"]
        assert got == text, "the reading client is not held back"
    assert len(feed.clients) == 1, f"the stuck client still joined after {sent} frames"

    def read_to_the_end() -> bytes:
        stuck.settimeout(10)
        body = b""
        while not body.endswith(b"0\r\n\r\n"):
            body += stuck.recv(65536)
        return body

    # Reading at last: the frames that were buffered, then the error frame and the end of the body.
    body = await asyncio.to_thread(read_to_the_end)
    assert b"event: error" in body and b"STREAM_TOO_SLOW" in body.rpartition(b"event: error")[2]
    stuck.close()
    reading.close()


class HookedTransport(DrainedTransport):
    """Drains at once; ``hook`` runs after the write that brings ``writes[0]`` to ``at``."""

    def __init__(self, writes: list[int], at: int, hook: Any) -> None:
        super().__init__()
        self.writes, self.at, self.hook = writes, at, hook

    def write(self, data: Any) -> None:
        super().write(data)
        self.writes[0] += 1
        if self.writes[0] == self.at:
            self.hook()


async def test_an_event_that_arrives_during_a_fan_out_joins_it_at_the_next_slice() -> None:
    # 120 clients: the first event goes out in slices of FANOUT_SLICE. The second arrives while
    # the first slice is written: the clients of the later slices get both in one write, those
    # of the first slice get the second in one more pass, and a client that joins meanwhile gets
    # its snapshot and then the second event, once.
    scheduler = FakeScheduler()
    streams = TaskStreams(scheduler, buffer_frames=64)  # type: ignore[arg-type]
    n = 120
    subs = [await streams.open("a", "s") for _ in range(n)]
    call = scheduler.calls[0]
    writes = [0]
    joined: list[Any] = []

    def second_event() -> None:
        call.events.put_nowait(event("t1", pb.TASK_STATE_RUNNING, 2, progress=pb.Progress(text="1")))
        joined.append(asyncio.ensure_future(streams.open("a", "s")))

    transports = [HookedTransport(writes, 10, second_event) for _ in range(n)]
    for sub, transport in zip(subs, transports, strict=True):
        assert sub.take_over(transport) is not None
    call.events.put_nowait(event("t1", pb.TASK_STATE_RUNNING, 1, progress=pb.Progress(text="0")))
    for _ in range(200):
        if all(b"id: 2\n" in b"".join(t.written) for t in transports):
            break
        await asyncio.sleep(0)
    for t in transports:
        ids = [line for line in b"".join(t.written).split(b"\n") if line.startswith(b"id: ")]
        assert ids == [b"id: 1", b"id: 2"], "each client gets both frames, in order, once"
    together = [t for t in transports if len(t.written) == 1]
    assert len(together) == n - FANOUT_SLICE, "the later slices get both events in one write"
    assert all(len(t.written) == 2 for t in transports if t not in together)

    joiner = await joined[0]
    first_frame, second_frame = parse_frame(await anext(joiner)), parse_frame(await anext(joiner))
    assert first_frame == ("task.snapshot", "0") and second_frame == ("task.state_changed", "1")
    assert joiner.queue.empty(), "nothing twice"
    (feed,) = streams.feeds.values()
    assert feed.log == [] and all(c.next == feed.end for c in feed.clients), "the log is spent"
    for sub in [*subs, joiner]:
        await sub.aclose()
    await streams.close()


class CountingTransport(DrainedTransport):
    """Drains at once; each write records ``count()`` at that moment."""

    def __init__(self, seen: list[int], count: Any) -> None:
        super().__init__()
        self.seen, self.count = seen, count

    def write(self, data: Any) -> None:
        super().write(data)
        self.seen.append(self.count())


async def test_between_slices_the_fan_out_pauses_and_ready_work_runs_all_its_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With a bare yield between slices, a REST call got one step per slice: a cancel (a dozen
    turns of its own) waited behind a dozen slices of writes. The fan-out sleeps between slices
    instead, so work that is ready runs every step it can before the next slice."""
    monkeypatch.setattr(task_stream, "FANOUT_PAUSE_S", 0.3)  # long enough for a loaded machine
    scheduler = FakeScheduler()
    streams = TaskStreams(scheduler, buffer_frames=64)  # type: ignore[arg-type]
    n = 2 * FANOUT_SLICE
    subs = [await streams.open("a", "s") for _ in range(n)]
    steps = [0]
    started: list[asyncio.Future[None]] = []

    async def rest_call() -> None:  # a dozen turns of its own
        for _ in range(12):
            await asyncio.sleep(0)
            steps[0] += 1

    def count() -> int:
        if len(seen) == FANOUT_SLICE - 1:  # this is the first slice's last write
            started.append(asyncio.ensure_future(rest_call()))
        return steps[0]

    seen: list[int] = []
    transports = [CountingTransport(seen, count) for _ in range(n)]
    for sub, transport in zip(subs, transports, strict=True):
        assert sub.take_over(transport) is not None
    scheduler.calls[0].events.put_nowait(event("t1", pb.TASK_STATE_RUNNING, 1, progress=pb.Progress(text="0")))
    async with asyncio.timeout(10):
        while len(seen) < n:
            await asyncio.sleep(0.01)
    assert seen[:FANOUT_SLICE] == [0] * FANOUT_SLICE
    assert seen[FANOUT_SLICE:] == [12] * FANOUT_SLICE, "the call ran to its end before the second slice"
    await started[0]
    for sub in subs:
        await sub.aclose()
    await streams.close()


def parse_frame(raw: bytes) -> tuple[str, str]:
    """(event name, the task's progress text) of one SSE frame."""
    fields = dict(line.split(": ", 1) for line in raw.decode().strip().splitlines())
    return fields["event"], json.loads(fields["data"])["task"]["progress"]["text"]
