"""A task stream's connection, written to directly once its response has started.

With 1,000 clients of one session, each event went through 1,000 writer tasks: a queue
wake-up, then the ASGI ``send`` through every middleware's wrapper into uvicorn, tens of
microseconds per client on the loop that also serves cancels. Here the shared feed
encodes an event's HTTP chunk once and writes it to each client's transport itself.

The transport is uvicorn's (httptools protocol): ``expose_connection`` wraps the app
outermost and keeps the server's own ``send`` in the scope, whose owner (the request
cycle) holds the transport and whether the response body is chunked. The response's
start and end still go through ``send`` (so middleware sees them and uvicorn writes the
final chunk); only the frames in between go straight to the socket. Anywhere else (h11,
an in-process test client, a HEAD request) ``connection_of`` is None and the stream
keeps its per-client writer.
"""

from __future__ import annotations

import asyncio

from starlette.types import ASGIApp, Receive, Scope, Send

RAW_SEND = "taskgate.raw_send"
_HTTPTOOLS_CYCLE = "uvicorn.protocols.http.httptools_impl"


def expose_connection(app: ASGIApp) -> ASGIApp:
    """The app, with the server's own ``send`` kept in each HTTP scope (see ``connection_of``)."""

    async def exposed(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope[RAW_SEND] = send
        await app(scope, receive, send)

    return exposed


def chunk(data: bytes) -> bytes:
    """``data`` as one HTTP/1.1 chunk (the response's body is chunked: it has no length)."""
    return b"%x\r\n%b\r\n" % (len(data), data)


class Connection:
    """A response's uvicorn connection: its transport, once the response has started chunked."""

    def __init__(self, cycle: object, transport: asyncio.Transport) -> None:
        self._cycle = cycle
        self.transport = transport

    def chunked(self) -> bool:
        """True once the response has started with a chunked body (uvicorn's choice: no length)."""
        return getattr(self._cycle, "chunked_encoding", None) is True and not self.transport.is_closing()


def connection_of(scope: Scope) -> Connection | None:
    if scope.get("method") != "GET":
        return None  # a HEAD answer has no body to chunk
    cycle = getattr(scope.get(RAW_SEND), "__self__", None)
    if cycle is None or type(cycle).__module__ != _HTTPTOOLS_CYCLE:
        return None
    transport = getattr(cycle, "transport", None)
    if not isinstance(transport, asyncio.Transport):
        return None
    return Connection(cycle, transport)
