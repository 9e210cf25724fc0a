"""One scheduler WatchTasks stream per session, shared by all of this gateway's task-stream clients.

Without it every SSE client held its own WatchTasks stream, and the scheduler encoded
and sent each event once per client on the same event loop that serves cancels and
launches. Here the gateway holds one upstream stream per watched session: each event
is made slim and encoded to SSE bytes once, kept as the task's latest snapshot while
the task is active, and handed to every local client of the session.

A client that joins gets the feed's current snapshot of each active task, then the
live events: both are taken in one step on the event loop, so nothing falls between
them. The feed is live once the scheduler has subscribed (it sends the call's initial
metadata then), so a client that has its response headers sees every later change.
Each client has a bounded queue; a client that lets it fill is ended with an error
frame (it may reconnect and start again from fresh snapshots); nobody else waits.

Once a client's response has started and sent what was queued for it, the response
hands its connection over (``Subscription.take_over``, see ``sse_wire``): from then on the
feed writes each event, encoded as an HTTP chunk once, straight to the client's
transport, and the bound is the frames waiting in the transport's buffer (written while
it was not empty). The fan-out pauses every ``FANOUT_SLICE`` clients for ``FANOUT_PAUSE_S``:
a sleep, not a bare yield, so the loop waits in its poll and the process gives up the CPU.
With a bare yield every turn of a REST call's own (a cancel takes a dozen) came after one
more slice of writes, and the writes took the CPU from the scheduler stopping the worker: with
1,000 clients a cancel took 1.8-2.3x its idle time; with the pause 1.4-1.5x, and the frames
reach the clients sooner at p99 (22-27 ms against 36-68: the first client is no longer
behind another fan-out's writes), for 3 us of gateway CPU per frame sent against 4.5
(``bench/bench_sse_scale.py``; docs/performance.md, "A fan-out that pauses").

Each client keeps its place in the feed's log of frames (``Client.next``). Events that
arrive while a fan-out is under way join the log at the next slice: the clients still to
be written get them in the same write, and those already written get them in one more
pass. So a change that follows another within a fan-out's time (a task's ``running`` a
few ms after its ``queued``) waits one slice, not the rest of the fan-out and then a whole
new one; and it costs the clients after the slice no write of its own.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import grpc
import structlog

from gateway_http.convert import slim_task_json
from gateway_http.metrics import SSE_DROPPED, SSE_SUBSCRIBERS, TASK_WATCHES
from gateway_http.sse import frame
from gateway_http.sse_wire import chunk as http_chunk
from taskgate.scheduler.v1 import scheduler_pb2 as pb
from taskgate.scheduler.v1 import scheduler_pb2_grpc as pb_grpc

log = structlog.get_logger("task_stream")

Session = tuple[str, str]
READY_TIMEOUT_S = 10.0
FANOUT_SLICE = 100
FANOUT_PAUSE_S = 0.0003
INBOX_EVENTS = 1024
FINISHED = frozenset({pb.TASK_STATE_COMPLETED, pb.TASK_STATE_FAILED, pb.TASK_STATE_CANCELLED})
EVENT_NAMES = {
    pb.TASK_EVENT_TYPE_SNAPSHOT: "task.snapshot",
    pb.TASK_EVENT_TYPE_STATE_CHANGED: "task.state_changed",
    pb.TASK_EVENT_TYPE_PROGRESS: "task.progress",
    pb.TASK_EVENT_TYPE_TOOL: "task.tool",
    pb.TASK_EVENT_TYPE_EXECUTION: "task.execution",
    pb.TASK_EVENT_TYPE_QUESTION: "task.question",
}


def error_frame(error: str, message: str) -> bytes:
    return frame(json.dumps({"error": error, "message": message}), "error")


@dataclass(eq=False)
class Client:
    queue: asyncio.Queue[bytes | None]
    # Set once its response has taken over the connection: frames go straight to it.
    transport: asyncio.Transport | None = None
    done: asyncio.Event | None = None  # with a transport: set when the stream has ended
    ended: bool = False
    backlog: int = 0  # frames written while the transport's buffer was not empty
    sent_at: float = 0.0  # loop time of the last write to the transport
    next: int = 0  # the index in its feed's log of the first frame not yet sent to it


@dataclass(frozen=True)
class Latest:
    data: str  # the encoded frame data
    shows: str  # what a client is shown of it (the slim snapshot without its version)


@dataclass(eq=False)
class Feed:
    clients: set[Client] = field(default_factory=set)
    # task id -> its latest slim snapshot, for the active tasks only.
    active: dict[str, Latest] = field(default_factory=dict)
    live: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    # The frames of the fan-out under way, each with its HTTP chunk: (frame, chunk). The
    # first has index ``base``; a client has been sent those before its ``next``.
    log: list[tuple[bytes, bytes]] = field(default_factory=list)
    base: int = 0

    @property
    def end(self) -> int:
        """The index the next frame will have: a client at ``end`` has been sent everything."""
        return self.base + len(self.log)


class TaskStreams:
    """The gateway's shared task watches, one per session with at least one client."""

    def __init__(self, stub: pb_grpc.SchedulerServiceStub, buffer_frames: int) -> None:
        self.stub = stub
        self.buffer_frames = buffer_frames
        self.feeds: dict[Session, Feed] = {}
        # (credential digest, agent, session) -> (loop time it was started, the access check).
        self._checks: dict[tuple[str, str, str], tuple[float, asyncio.Future[bytes | None]]] = {}

    async def _run(self, key: Session, feed: Feed) -> None:
        call = self.stub.WatchTasks(pb.WatchTasksRequest(agent_id=key[0], session_id=key[1]))
        TASK_WATCHES.inc()
        ending: bytes | None = None
        # Events read wait here until the feed takes them into its log (between a fan-out's
        # slices, or when it is idle). Bounded, so a fan-out that cannot keep up holds the
        # upstream call back (gRPC flow control).
        inbox: asyncio.Queue[pb.WatchTasksResponse | None] = asyncio.Queue()
        room = asyncio.Event()

        async def receive() -> None:
            try:
                async for event in call:
                    inbox.put_nowait(event)
                    if inbox.qsize() >= INBOX_EVENTS:
                        room.clear()
                        await room.wait()
            finally:
                inbox.put_nowait(None)  # the end, after every event

        ended = False

        def take(event: pb.WatchTasksResponse | None) -> None:
            nonlocal ended
            if event is None:
                ended = True
            elif (data := self._apply(feed, event)) is not None:
                feed.log.append((data, http_chunk(data)))

        def absorb() -> None:
            """The events read meanwhile, into the log (the fan-out calls it between slices),
            up to ``INBOX_EVENTS`` in the log: beyond that the inbox, then gRPC, holds them."""
            while not ended and not inbox.empty() and len(feed.log) < INBOX_EVENTS:
                take(inbox.get_nowait())
            if inbox.qsize() < INBOX_EVENTS:
                room.set()

        receiving: asyncio.Task[None] | None = None
        try:
            # The scheduler sends the initial metadata once it has subscribed.
            await call.initial_metadata()
            feed.live.set()
            receiving = asyncio.create_task(receive())
            while not ended:
                take(await inbox.get())
                absorb()
                if feed.log:
                    await self._fan_out(feed, absorb)
            await receiving  # the upstream call ended: its error, if any, is raised here
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                ending = error_frame(exc.code().name, exc.details() or "")
        finally:
            # Everything that must happen before the await below: a cancel arriving during that
            # await would skip the rest, and an upstream call not cancelled stays open.
            TASK_WATCHES.dec()
            call.cancel()
            if self.feeds.get(key) is feed:
                del self.feeds[key]
            for client in feed.clients:
                self._end(client, ending)
            if receiving is not None:
                receiving.cancel()
                await asyncio.gather(receiving, return_exceptions=True)

    @staticmethod
    def _apply(feed: Feed, event: pb.WatchTasksResponse) -> bytes | None:
        """The event's frame, with the feed's snapshots brought up to date; None if nothing shown changed."""
        task = event.task
        slim = slim_task_json(task)
        data = json.dumps({"task": slim})
        if task.state in FINISHED:
            feed.active.pop(task.task_id, None)
        else:
            # Every committed change raises the version, a telemetry observation too:
            # what a client is shown is the rest. A joiner still gets the newest version.
            shows = json.dumps({k: v for k, v in slim.items() if k != "version"})
            before = feed.active.get(task.task_id)
            feed.active[task.task_id] = Latest(data, shows)
            if before is not None and before.shows == shows:
                return None  # nothing a slim event shows has changed (e.g. a telemetry observation)
        return frame(data, EVENT_NAMES.get(event.type, "task.event"), str(event.sequence))

    async def _fan_out(self, feed: Feed, absorb: Callable[[], None]) -> None:
        """Every client of the feed sent every frame of its log, in passes of slices. Between
        slices, and after each pass, ``absorb`` adds the events that arrived meanwhile."""
        loop = asyncio.get_running_loop()
        while behind := [c for c in feed.clients if c.next < feed.end]:
            for start in range(0, len(behind), FANOUT_SLICE):
                if start:
                    # Let the control path (a REST cancel, a create) and the other processes
                    # run between slices (see the module's docstring for why a sleep).
                    await asyncio.sleep(FANOUT_PAUSE_S)
                    absorb()
                now, end = loop.time(), feed.end
                # Most clients of a slice stand at the same place: one joined write for them all.
                wires: dict[int, bytes] = {}
                for client in behind[start : start + FANOUT_SLICE]:
                    if client.transport is not None:
                        if client.next not in wires:
                            wires[client.next] = b"".join(w for _, w in feed.log[client.next - feed.base :])
                        self._write(feed, client, wires[client.next], end - client.next, now)
                    else:
                        for data, _ in feed.log[client.next - feed.base :]:
                            if not self._offer(feed, client, data):
                                break
                    client.next = end
            # What every client has been sent is spent (the log stays as long as one pass).
            low = min((c.next for c in feed.clients), default=feed.end)
            del feed.log[: low - feed.base]
            feed.base = low
            await asyncio.sleep(0)
            absorb()
        # Nobody is behind (no await since the check): the log is spent.
        feed.base, feed.log = feed.end, []

    def _write(self, feed: Feed, client: Client, wire: bytes, frames: int, now: float) -> None:
        transport = client.transport
        assert transport is not None
        if client.ended or transport.is_closing():
            return  # gone: its response leaves the feed
        if transport.get_write_buffer_size():
            # The socket's buffer is full and frames wait in ours: the same bound as a queue.
            client.backlog += frames
            if client.backlog > self.buffer_frames:
                self._too_slow(feed, client)
                return
        else:
            client.backlog = 0
        transport.write(wire)
        client.sent_at = now

    def _too_slow(self, feed: Feed, client: Client) -> None:
        feed.clients.discard(client)
        SSE_DROPPED.labels("tasks").inc()
        log.warning("task_stream_client_too_slow", buffer_frames=self.buffer_frames)
        self._end(client, error_frame("STREAM_TOO_SLOW", "reconnect to start again from fresh snapshots"))

    def _offer(self, feed: Feed, client: Client, chunk: bytes) -> bool:
        """False if the client has been ended (now or before)."""
        if client not in feed.clients:
            return False
        try:
            client.queue.put_nowait(chunk)
        except asyncio.QueueFull:
            # Its writer drains the queue as fast as the client reads: this one is stuck. End it.
            self._too_slow(feed, client)
            return False
        return True

    @staticmethod
    def _end(client: Client, last: bytes | None) -> None:
        if client.transport is not None:
            # Its response finishes the body once ``done`` is set; the last frame goes first.
            if not client.ended:
                client.ended = True
                if last is not None and not client.transport.is_closing():
                    client.transport.write(http_chunk(last))
                assert client.done is not None
                client.done.set()
            return
        while not client.queue.empty():
            client.queue.get_nowait()
        if last is not None:
            client.queue.put_nowait(last)
        client.queue.put_nowait(None)

    async def join(self, agent_id: str, session_id: str) -> tuple[Feed, Client] | None:
        """Joined to the live feed, with the active tasks' snapshots queued; None if it could not start."""
        key = (agent_id, session_id)
        feed = self.feeds.get(key)
        if feed is None:
            feed = self.feeds[key] = Feed()
            feed.task = asyncio.create_task(self._run(key, feed), name=f"task-watch-{agent_id}/{session_id}")
        task = feed.task
        assert task is not None
        if not feed.live.is_set():
            live = asyncio.ensure_future(feed.live.wait())
            try:
                await asyncio.wait([live, task], timeout=READY_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
            finally:
                live.cancel()
        if not feed.live.is_set() or task.done():
            if not feed.clients and not task.done():
                self._close(key, feed)
            return None
        # One step (no await): the snapshots so far, then every later event. The snapshots
        # include what the log of a fan-out under way holds: the client starts at its end.
        client = Client(asyncio.Queue(maxsize=max(self.buffer_frames, len(feed.active) + 1)), next=feed.end)
        for latest in feed.active.values():
            client.queue.put_nowait(frame(latest.data, "task.snapshot", "0"))
        feed.clients.add(client)
        return feed, client

    def leave(self, key: Session, feed: Feed, client: Client) -> None:
        feed.clients.discard(client)
        if not feed.clients:
            self._close(key, feed)

    def _close(self, key: Session, feed: Feed) -> None:
        # The last client left: close the shared stream; the next client opens a new one. Once:
        # clients ended together each leave with the feed empty, and the watch is cancelled by
        # the first (it is gone from ``feeds`` then, or its own end removed it).
        if self.feeds.get(key) is not feed:
            return
        del self.feeds[key]
        if feed.task is not None:
            feed.task.cancel()

    async def open(self, agent_id: str, session_id: str) -> Subscription:
        """A client's frames, joined to the live feed already (so its response may start)."""
        key = (agent_id, session_id)
        joined = await self.join(agent_id, session_id)
        if joined is None:
            return Subscription(self, key, None, None)
        return Subscription(self, key, *joined)

    def shared_check(
        self,
        credential: str,
        agent_id: str,
        session_id: str,
        check: Callable[[], Awaitable[bytes | None]],
        ttl_s: float,
    ) -> Callable[[], Awaitable[bytes | None]]:
        """``check``, shared by every stream of the same credential and session for ``ttl_s``:
        1,000 streams of one key recheck its access once, not 1,000 times per interval."""
        key = (hashlib.sha256(credential.encode()).hexdigest(), agent_id, session_id)

        async def shared() -> bytes | None:
            loop = asyncio.get_running_loop()
            now = loop.time()
            held = self._checks.get(key)
            failed = held is not None and held[1].done() and (held[1].cancelled() or held[1].exception() is not None)
            if held is None or failed or now - held[0] >= ttl_s:
                for stale in [k for k, (at, _) in self._checks.items() if now - at >= ttl_s]:
                    del self._checks[stale]
                held = self._checks[key] = (now, asyncio.ensure_future(check()))
            # Shielded: one stream that ends while the check runs must not cancel it for the others.
            return await asyncio.shield(held[1])

        return shared

    async def close(self) -> None:
        tasks = [f.task for f in self.feeds.values() if f.task is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class Subscription:
    """One client's frames: the active tasks' snapshots, then the session's events.

    An async iterator whose ``aclose`` leaves the feed even when iteration never began
    (a client gone before its response started).
    """

    def __init__(self, streams: TaskStreams, key: Session, feed: Feed | None, client: Client | None) -> None:
        self.streams = streams
        self.key = key
        self.feed = feed
        self.client = client
        self.closed = False
        if client is not None:
            SSE_SUBSCRIBERS.labels("tasks").inc()

    @property
    def queue(self) -> asyncio.Queue[bytes | None]:
        """The client's bounded queue, read by its SSE writer directly (no pump in between)."""
        if self.client is None:
            self.client = Client(asyncio.Queue())
            self.client.queue.put_nowait(error_frame("UNAVAILABLE", "the task stream is not available; try again"))
            self.client.queue.put_nowait(None)
        return self.client.queue

    def take_over(self, transport: asyncio.Transport) -> asyncio.Event | None:
        """The feed writes this client's frames straight to ``transport`` from now on; the event
        is set when the stream has ended. None while frames are still queued (send those first)
        or when there is no feed."""
        client = self.client
        if client is None or self.feed is None or self.closed or not client.queue.empty():
            return None
        client.transport = transport
        client.done = asyncio.Event()
        client.sent_at = asyncio.get_running_loop().time()
        return client.done

    def write(self, data: bytes) -> None:
        """A frame of the client's own (a heartbeat), on a connection taken over."""
        client = self.client
        if client is not None and client.transport is not None and not client.ended:
            if not client.transport.is_closing():
                client.transport.write(http_chunk(data))
            client.sent_at = asyncio.get_running_loop().time()

    @property
    def sent_at(self) -> float:
        return self.client.sent_at if self.client is not None else 0.0

    def end(self, last: bytes | None) -> None:
        """Ends the client's stream with ``last`` (its access ended)."""
        if self.feed is not None and self.client is not None:
            self.feed.clients.discard(self.client)
            self.streams._end(self.client, last)

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> bytes:
        if self.closed:
            raise StopAsyncIteration
        if self.client is None:
            self.closed = True
            return error_frame("UNAVAILABLE", "the task stream is not available; try again")
        chunk = await self.client.queue.get()
        if chunk is None:
            await self.aclose()
            raise StopAsyncIteration
        return chunk

    async def aclose(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.client is not None:
            self.client.ended = True  # a fan-out slice under way skips it
        if self.feed is not None and self.client is not None:
            self.streams.leave(self.key, self.feed, self.client)
            SSE_SUBSCRIBERS.labels("tasks").dec()
