"""A Server-Sent Events response with a bounded buffer per client.

FastAPI's native SSE (``fastapi.sse``) writes straight from the generator, so a
client that stops reading blocks its generator with no way to notice, and its
keep-alive interval is a module constant. Here a pump reads the source into a
bounded queue while a writer sends to the client: when the queue fills, the
client is disconnected (it may reconnect with Last-Event-ID) and its memory is
released; other clients are never waited for. A fan-out source
(``task_stream.Subscription``) hands over its own bounded queue instead, filled by
the shared feed. Frames that queued up go out in one write; a heartbeat timer per
client keeps an idle stream open. Frames are encoded with
``fastapi.sse.format_sse_event``.

A source that can take over its connection (``task_stream.Subscription``, served by
uvicorn: ``sse_wire``) has its queued frames sent, then the shared feed writes to the
connection itself; the response keeps only the heartbeat, the access recheck and the
end of the body.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol, runtime_checkable

import structlog
from fastapi.sse import format_sse_event
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from gateway_http.sse_wire import Connection, connection_of

log = structlog.get_logger("sse")

HEARTBEAT = b": heartbeat\n\n"
# Frames a writer sends in one go when several have queued up (one write, one wake-up).
MAX_FRAMES_PER_WRITE = 64


@runtime_checkable
class TakesOver(Protocol):
    """A source whose frames its feed can write to the connection itself (``task_stream.Subscription``)."""

    @property
    def queue(self) -> asyncio.Queue[bytes | None]: ...  # frames before the take-over; None ends

    @property
    def sent_at(self) -> float: ...  # loop time of the last write to the connection

    def take_over(self, transport: asyncio.Transport) -> asyncio.Event | None: ...

    def write(self, data: bytes) -> None: ...

    def end(self, last: bytes | None) -> None: ...

    async def aclose(self) -> None: ...


def frame(data_json: str, event: str | None = None, event_id: str | None = None) -> bytes:
    return format_sse_event(data_str=data_json, event=event, id=event_id)


class BoundedEventStream(Response):
    media_type = "text/event-stream"

    def __init__(
        self,
        source: AsyncIterator[bytes],
        *,
        buffer_frames: int,
        heartbeat_s: float,
        still_allowed: Callable[[], Awaitable[bytes | None]],
        recheck_s: float,
    ) -> None:
        super().__init__(
            content=None,
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
            media_type=self.media_type,
        )
        del self.headers["content-length"]  # a stream, not an empty body
        self.source = source
        self.buffer_frames = buffer_frames
        self.heartbeat_s = heartbeat_s
        # None while the caller may still read the stream; else the final frame to send.
        self.still_allowed = still_allowed
        self.recheck_s = recheck_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        connection = connection_of(scope) if isinstance(self.source, TakesOver) else None
        if connection is not None and isinstance(self.source, TakesOver):
            await self._taken_over(self.source, receive, send, connection)
            return
        overflow = asyncio.Event()
        # A fan-out source (``task_stream.Subscription``) hands over its own bounded queue,
        # filled by the shared feed (which ends a client that lets it fill): no pump between.
        queue: asyncio.Queue[bytes | None] | None = getattr(self.source, "queue", None)
        if queue is None:
            queue = asyncio.Queue(maxsize=self.buffer_frames)
        own_queue = queue

        async def pump() -> None:
            try:
                async for chunk in self.source:
                    try:
                        own_queue.put_nowait(chunk)
                    except asyncio.QueueFull:
                        overflow.set()
                        return
            finally:
                with contextlib.suppress(asyncio.QueueFull):
                    own_queue.put_nowait(None)

        last_sent = time.monotonic()

        async def heartbeat() -> None:
            # One timer per client instead of a timeout on every read.
            while True:
                await asyncio.sleep(self.heartbeat_s - (time.monotonic() - last_sent))
                if time.monotonic() - last_sent >= self.heartbeat_s:
                    with contextlib.suppress(asyncio.QueueFull):
                        own_queue.put_nowait(HEARTBEAT)

        async def write() -> None:
            nonlocal last_sent
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            checked = time.monotonic()
            ended = False
            while not ended:
                # Whatever has queued up goes out in one write.
                parts = [await own_queue.get()]
                while parts[-1] is not None and not own_queue.empty() and len(parts) < MAX_FRAMES_PER_WRITE:
                    parts.append(own_queue.get_nowait())
                ended = parts[-1] is None
                body = b"".join(p for p in parts if p is not None)
                if body:
                    await send({"type": "http.response.body", "body": body, "more_body": True})
                    last_sent = time.monotonic()
                if not ended and time.monotonic() - checked >= self.recheck_s:
                    checked = time.monotonic()
                    goodbye = await self.still_allowed()
                    if goodbye is not None:
                        await send({"type": "http.response.body", "body": goodbye, "more_body": True})
                        break
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        async def disconnected() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass

        helpers = [asyncio.create_task(heartbeat())]
        if own_queue is not getattr(self.source, "queue", None):
            helpers.append(asyncio.create_task(pump()))
        writing = asyncio.create_task(write())
        watching = [asyncio.create_task(disconnected()), asyncio.create_task(overflow.wait())]
        try:
            await asyncio.wait([writing, *watching], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (*helpers, writing, *watching):
                task.cancel()
            try:
                await asyncio.gather(*helpers, writing, *watching, return_exceptions=True)
            finally:  # even when this is cancelled again meanwhile: the source is left either way
                with contextlib.suppress(Exception):
                    await self.source.aclose()  # type: ignore[attr-defined]
        if overflow.is_set():
            # Returning without completing the response makes the server close the connection.
            log.warning("sse_client_too_slow", path=scope.get("path"), buffer_frames=self.buffer_frames)

    async def _taken_over(self, source: TakesOver, receive: Receive, send: Send, connection: Connection) -> None:
        """The queued frames through ``send``, then the source's feed writes to the connection itself."""
        queue = source.queue
        loop = asyncio.get_running_loop()

        async def write() -> None:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            checked = loop.time()
            while True:
                parts: list[bytes | None] = []
                while not queue.empty() and len(parts) < MAX_FRAMES_PER_WRITE and (not parts or parts[-1] is not None):
                    parts.append(queue.get_nowait())
                if not parts:
                    # Nothing queued and no await since the check: the feed's next frame goes direct.
                    done = source.take_over(connection.transport) if connection.chunked() else None
                    if done is not None:
                        break
                    parts = [await queue.get()]  # not taken over (the client is gone): until its disconnect
                body = b"".join(p for p in parts if p is not None)
                if body:
                    await send({"type": "http.response.body", "body": body, "more_body": True})
                if parts[-1] is None:
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                    return
            while not done.is_set():
                # Awake for the next heartbeat or access recheck only; the feed writes the events.
                # An idle stream wakes once per heartbeat (1,000 of them: no timer storm).
                wake = source.sent_at + self.heartbeat_s
                if source.sent_at > checked:
                    wake = min(wake, checked + self.recheck_s)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout_at(wake):
                        await done.wait()
                if done.is_set():
                    break
                now = loop.time()
                if now - source.sent_at >= self.heartbeat_s:
                    source.write(HEARTBEAT)
                # As before: rechecked when something was sent (a heartbeat at least) since the last check.
                if now - checked >= self.recheck_s and source.sent_at > checked:
                    checked = now
                    goodbye = await self.still_allowed()
                    if goodbye is not None:
                        source.end(goodbye)
            try:
                # uvicorn writes the last chunk; a client too slow to take even that is dropped.
                async with asyncio.timeout(self.heartbeat_s):
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
            except TimeoutError:
                connection.transport.abort()
                await asyncio.sleep(0)  # its connection_lost runs: the server sees the client gone

        async def disconnected() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass

        writing = asyncio.create_task(write())
        watching = asyncio.create_task(disconnected())
        try:
            await asyncio.wait([writing, watching], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (writing, watching):
                task.cancel()
            try:
                await asyncio.gather(writing, watching, return_exceptions=True)
            finally:  # even when this is cancelled again meanwhile: the feed is left either way
                with contextlib.suppress(Exception):
                    await source.aclose()
        if writing.done() and not writing.cancelled() and (failure := writing.exception()) is not None:
            log.error("sse_writer_failed", exc_info=failure)
