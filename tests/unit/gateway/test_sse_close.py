"""An SSE response always closes its source, even when it is cancelled again while it cleans up."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.types import Message

from gateway_http.sse import BoundedEventStream


class SlowToStopSource:
    """An event source whose read, once cancelled, takes until ``release`` to finish (as a source
    that has its own cleanup to await)."""

    def __init__(self) -> None:
        self.stopping = asyncio.Event()
        self.release = asyncio.Event()
        self.closed = False

    def __aiter__(self) -> SlowToStopSource:
        return self

    async def __anext__(self) -> bytes:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.stopping.set()
            await self.release.wait()
            raise
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        self.closed = True


async def allowed() -> bytes | None:
    return None


async def test_the_source_is_closed_even_when_the_response_is_cancelled_again_while_it_cleans_up() -> None:
    source = SlowToStopSource()
    response = BoundedEventStream(source, buffer_frames=8, heartbeat_s=30, still_allowed=allowed, recheck_s=30)
    disconnect = asyncio.Event()
    sent: list[Message] = []

    async def receive() -> dict[str, Any]:
        await disconnect.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    call = asyncio.create_task(response({"type": "http", "method": "GET"}, receive, send))
    while not sent:  # the response started: the source is being read
        await asyncio.sleep(0)
    disconnect.set()  # the client leaves: the response stops its reader, which takes a while
    await asyncio.wait_for(source.stopping.wait(), 5)
    call.cancel()  # and meanwhile the server cancels the response (shutting down, say)
    await asyncio.sleep(0)
    source.release.set()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert source.closed, "a source left open keeps its feed (and the scheduler watch behind it)"


class TakingOverSource:
    """A fan-out source (as ``task_stream.Subscription``) with one frame queued, that is never
    taken over here (the connection is not chunked): the response sends its queue itself."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.queue.put_nowait(b"data: one\n\n")
        self.sent_at = 0.0
        self.closed = False

    def __aiter__(self) -> TakingOverSource:
        return self

    async def __anext__(self) -> bytes:
        raise AssertionError("unreachable: its frames go through its queue")

    def take_over(self, transport: asyncio.Transport) -> asyncio.Event | None:
        return None

    def write(self, data: bytes) -> None:
        pass

    def end(self, last: bytes | None) -> None:
        pass

    async def aclose(self) -> None:
        self.closed = True


class NotChunked:
    transport = None

    def chunked(self) -> bool:
        return False


async def test_a_taken_over_stream_closes_its_source_even_when_cancelled_again_while_it_cleans_up() -> None:
    source = TakingOverSource()
    response = BoundedEventStream(source, buffer_frames=8, heartbeat_s=30, still_allowed=allowed, recheck_s=30)
    disconnect = asyncio.Event()
    writing = asyncio.Event()
    release = asyncio.Event()

    async def receive() -> dict[str, Any]:
        await disconnect.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        if message["type"] == "http.response.body":
            writing.set()
            try:
                await asyncio.Event().wait()  # a client that takes nothing: the write hangs
            except asyncio.CancelledError:
                await release.wait()  # and its cancellation takes a while (the server's own cleanup)
                raise

    call = asyncio.create_task(
        response._taken_over(source, receive, send, NotChunked())  # type: ignore[arg-type]
    )
    await asyncio.wait_for(writing.wait(), 5)  # the queued frame is being written
    disconnect.set()  # the client leaves: the response stops its writer, which takes a while
    for _ in range(5):
        await asyncio.sleep(0)
    call.cancel()  # and meanwhile the server cancels the response
    await asyncio.sleep(0)
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert source.closed, "a source left open keeps its place in the shared feed"
