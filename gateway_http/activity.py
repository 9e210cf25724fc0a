"""One notifier activity stream per conversation, shared by all of this gateway's SSE clients.

Each live frame is encoded to SSE bytes once and handed to every client of the
conversation; a client's own start (its in-progress snapshots, or the frames after
its Last-Event-ID) comes from ``ReplayActivity``, read after it joined the shared
stream so nothing falls between the two. Per client the gateway keeps only
references to shared frames, in a buffer bounded by ``sse_client_buffer``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import structlog

from gateway_http.metrics import SSE_DROPPED, SSE_SUBSCRIBERS
from gateway_http.sse import frame
from taskgate.notifier.v1 import notifier_pb2 as pb
from taskgate.notifier.v1 import notifier_pb2_grpc as pb_grpc

log = structlog.get_logger("activity")

Conversation = tuple[str, str]
READY_TIMEOUT_S = 10.0
NotificationJson = Callable[[pb.Notification, bool], dict[str, Any]]


@dataclass(frozen=True)
class Encoded:
    seq: int
    response_id: str | None  # None: a notification frame
    data: bytes


END = Encoded(-1, None, b"")


def encode(item: pb.StreamActivityResponse, notification_json: NotificationJson) -> Encoded:
    if item.HasField("notification"):
        data = json.dumps(notification_json(item.notification, False))
        return Encoded(item.sequence, None, frame(data, "notification", str(item.sequence)))
    s = item.snapshot
    data = json.dumps({"responseId": s.response_id, "text": s.text, "final": s.final})
    return Encoded(item.sequence, s.response_id, frame(data, None, str(item.sequence)))


def error_frame(error: str, message: str) -> Encoded:
    return Encoded(-1, None, frame(json.dumps({"error": error, "message": message}), "error"))


@dataclass(eq=False)
class Client:
    queue: asyncio.Queue[Encoded] = field(default_factory=lambda: asyncio.Queue(maxsize=1024))


@dataclass(eq=False)
class Feed:
    clients: set[Client] = field(default_factory=set)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


class ActivityFanout:
    def __init__(self, stub: pb_grpc.NotifierServiceStub, notification_json: NotificationJson) -> None:
        self.stub = stub
        self.notification_json = notification_json
        self.feeds: dict[Conversation, Feed] = {}

    async def _run(self, key: Conversation, feed: Feed) -> None:
        call = self.stub.StreamActivity(pb.StreamActivityRequest(agent_id=key[0], session_id=key[1], live_only=True))
        ending = END
        try:
            async for item in call:
                if not item.HasField("snapshot") and not item.HasField("notification"):
                    feed.ready.set()
                    continue
                encoded = encode(item, self.notification_json)
                for client in list(feed.clients):
                    try:
                        client.queue.put_nowait(encoded)
                    except asyncio.QueueFull:
                        # Its SSE writer drains this queue at once, so this is a stuck client: end it.
                        feed.clients.discard(client)
                        SSE_DROPPED.labels("activity").inc()
                        while not client.queue.empty():
                            client.queue.get_nowait()
                        client.queue.put_nowait(error_frame("STREAM_TOO_SLOW", "reconnect with Last-Event-ID"))
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                ending = error_frame(exc.code().name, exc.details() or "")
        finally:
            call.cancel()
            if self.feeds.get(key) is feed:
                del self.feeds[key]
            for client in feed.clients:
                while not client.queue.empty():
                    client.queue.get_nowait()
                client.queue.put_nowait(ending)

    async def join(self, agent_id: str, session_id: str) -> tuple[Feed, Client] | None:
        """Joined once the shared stream is live at the notifier; None when it could not start."""
        key = (agent_id, session_id)
        feed = self.feeds.get(key)
        if feed is None:
            feed = self.feeds[key] = Feed()
            feed.task = asyncio.create_task(self._run(key, feed), name=f"activity-{agent_id}/{session_id}")
        client = Client()
        feed.clients.add(client)
        assert feed.task is not None
        ready = asyncio.ensure_future(feed.ready.wait())
        try:
            await asyncio.wait([ready, feed.task], timeout=READY_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ready.cancel()
        if not feed.ready.is_set() or feed.task.done():
            self.leave(key, feed, client)
            return None
        return feed, client

    def leave(self, key: Conversation, feed: Feed, client: Client) -> None:
        feed.clients.discard(client)
        if not feed.clients and feed.task is not None:
            # The last client left: close the shared stream; the next client opens a new one.
            if self.feeds.get(key) is feed:
                del self.feeds[key]
            feed.task.cancel()

    async def stream(self, agent_id: str, session_id: str, after: int | None) -> AsyncIterator[bytes]:
        """One client's frames: its replay, then the shared live frames (duplicates skipped)."""
        key = (agent_id, session_id)
        joined = await self.join(agent_id, session_id)
        if joined is None:
            yield error_frame("UNAVAILABLE", "the activity stream is not available; try again").data
            return
        feed, client = joined
        SSE_SUBSCRIBERS.labels("activity").inc()
        try:
            request = pb.ReplayActivityRequest(agent_id=agent_id, session_id=session_id)
            if after is not None:
                request.after_sequence = after
            replay = await self.stub.ReplayActivity(request, timeout=READY_TIMEOUT_S)
            sent: dict[str, int] = {}
            notifications: set[int] = set()
            for item in replay.frames:
                encoded = encode(item, self.notification_json)
                if encoded.response_id is not None:
                    sent[encoded.response_id] = encoded.seq
                else:
                    notifications.add(encoded.seq)
                yield encoded.data
            while True:
                encoded = await client.queue.get()
                if encoded.seq < 0:
                    if encoded.data:
                        yield encoded.data
                    return
                if encoded.response_id is not None:
                    if sent.get(encoded.response_id, -1) >= encoded.seq:
                        continue
                    sent[encoded.response_id] = encoded.seq
                elif encoded.seq in notifications:
                    continue
                yield encoded.data
        except grpc.aio.AioRpcError as exc:
            yield error_frame(exc.code().name, exc.details() or "").data
        finally:
            SSE_SUBSCRIBERS.labels("activity").dec()
            self.leave(key, feed, client)

    async def close(self) -> None:
        tasks = [f.task for f in self.feeds.values() if f.task is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
