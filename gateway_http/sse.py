"""A Server-Sent Events response with a bounded buffer per client.

FastAPI's native SSE (``fastapi.sse``) writes straight from the generator, so a
client that stops reading blocks its generator with no way to notice, and its
keep-alive interval is a module constant. Here a pump reads the source into a
bounded queue while a writer sends to the client: when the queue fills, the
client is disconnected (it may reconnect with Last-Event-ID) and its memory is
released; other clients are never waited for. Frames are encoded with
``fastapi.sse.format_sse_event``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import structlog
from fastapi.sse import format_sse_event
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

log = structlog.get_logger("sse")

HEARTBEAT = b": heartbeat\n\n"


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
        queue: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=self.buffer_frames)
        overflow = asyncio.Event()

        async def pump() -> None:
            try:
                async for chunk in self.source:
                    try:
                        queue.put_nowait(chunk)
                    except asyncio.QueueFull:
                        overflow.set()
                        return
            finally:
                with contextlib.suppress(asyncio.QueueFull):
                    queue.put_nowait(None)

        async def write() -> None:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            checked = time.monotonic()
            while True:
                try:
                    chunk = await asyncio.wait_for(queue.get(), timeout=self.heartbeat_s)
                except TimeoutError:
                    chunk = HEARTBEAT
                if chunk is None:
                    break
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                if time.monotonic() - checked >= self.recheck_s:
                    checked = time.monotonic()
                    goodbye = await self.still_allowed()
                    if goodbye is not None:
                        await send({"type": "http.response.body", "body": goodbye, "more_body": True})
                        break
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        async def disconnected() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass

        pumping = asyncio.create_task(pump())
        writing = asyncio.create_task(write())
        watching = [asyncio.create_task(disconnected()), asyncio.create_task(overflow.wait())]
        try:
            await asyncio.wait([writing, *watching], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (pumping, writing, *watching):
                task.cancel()
            await asyncio.gather(pumping, writing, *watching, return_exceptions=True)
            with contextlib.suppress(Exception):
                await self.source.aclose()  # type: ignore[attr-defined]
        if overflow.is_set():
            # Returning without completing the response makes the server close the connection.
            log.warning("sse_client_too_slow", path=scope.get("path"), buffer_frames=self.buffer_frames)
