"""A lean HTTP/1.1 load generator for benchmarks, in the manner of wrk.

The system under test shares this machine's cores with the client, so every
millisecond the client spends is one the services do not get. httpx costs about
2.4 ms of CPU per request here; this client writes ready-made requests on a few
keep-alive connections (raw asyncio streams) and parses only the status line and
Content-Length, which costs a small fraction of that.

Only what the gateway's JSON answers need: no chunked bodies, no redirects, no TLS.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass
from urllib.parse import urlsplit


class LeanHttpError(RuntimeError):
    pass


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes


def build_request(
    method: str, host: str, path: str, headers: dict[str, str] | None = None, body: bytes | None = None
) -> bytes:
    """One complete request, built once and written as many times as needed."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")


class Connection:
    """One keep-alive connection; one request at a time."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    @classmethod
    async def open(cls, host: str, port: int) -> Connection:
        conn = cls(host, port)
        conn.reader, conn.writer = await asyncio.open_connection(host, port)
        return conn

    async def send(self, request: bytes) -> Answer:
        if self.reader is None or self.writer is None or self.reader.at_eof():
            # The server closes a keep-alive connection left idle (uvicorn: after 5 s).
            await self.close()
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        # "HTTP/1.1 201 Created\r\n..."
        status = int(head[9:12])
        lower = head.lower()
        at = lower.find(b"\r\ncontent-length:")
        if at < 0:
            if b"\r\ntransfer-encoding:" in lower:
                raise LeanHttpError("chunked answers are not supported")
            return Answer(status, b"")
        end = lower.index(b"\r\n", at + 2)
        length = int(lower[at + 17 : end])
        return Answer(status, await self.reader.readexactly(length) if length else b"")

    async def close(self) -> None:
        if self.writer is None:
            return
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except OSError:
            pass
        self.reader = self.writer = None


class LeanClient:
    """A fixed pool of keep-alive connections to one server."""

    def __init__(self, base_url: str, connections: int) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or parts.hostname is None:
            raise ValueError(f"only http:// URLs: {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.authority = parts.netloc
        self.size = connections
        self._idle: asyncio.Queue[Connection] = asyncio.Queue()
        self._all: list[Connection] = []

    async def __aenter__(self) -> LeanClient:
        for _ in range(self.size):
            conn = await Connection.open(self.host, self.port)
            self._all.append(conn)
            self._idle.put_nowait(conn)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.gather(*(c.close() for c in self._all))

    def request(
        self, method: str, path: str, headers: dict[str, str] | None = None, body: bytes | None = None
    ) -> bytes:
        return build_request(method, self.authority, path, headers, body)

    async def send(self, request: bytes) -> Answer:
        conn = await self._idle.get()
        try:
            return await conn.send(request)
        finally:
            self._idle.put_nowait(conn)

    async def repeat(self, request: bytes, n: int, expect: int) -> None:
        """Send ``request`` ``n`` times, one stream per connection (each keeps one in flight);
        raise on the first answer whose status is not ``expect`` (the pool is then spent: close it)."""
        counter = itertools.count()

        async def drive(conn: Connection) -> None:
            while next(counter) < n:
                answer = await conn.send(request)
                if answer.status != expect:
                    raise LeanHttpError(f"HTTP {answer.status}: {answer.body[:300]!r}")

        conns = [await self._idle.get() for _ in range(self.size)]
        try:
            async with asyncio.TaskGroup() as group:  # the first failure stops the others
                for conn in conns:
                    group.create_task(drive(conn))
        except ExceptionGroup as failed:
            raise failed.exceptions[0] from None
        finally:
            for c in conns:
                self._idle.put_nowait(c)
