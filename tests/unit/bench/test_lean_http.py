"""The benchmarks' lean HTTP client against a real server on loopback (uvicorn, as the gateway):
keep-alive, status and Content-Length parsing, and the errors it must not hide."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator

import pytest
import uvicorn
from starlette.types import Receive, Scope, Send

from bench.lean_http import LeanClient, LeanHttpError, build_request


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    if scope["path"] == "/chunked":  # no Content-Length: uvicorn sends it chunked
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"part", "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return
    status = 201 if scope["method"] == "POST" else 200
    if scope["path"] == "/empty":
        status, out = 204, b""
    else:
        out = json.dumps({"echo": body.decode(), "client": scope["client"][1]}).encode()
    headers = [(b"content-type", b"application/json")] + ([(b"content-length", str(len(out)).encode())] if out else [])
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": out})


@pytest.fixture
async def server() -> AsyncIterator[str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(app, log_config=None, access_log=False, lifespan="off"))
    task = asyncio.create_task(srv.serve(sockets=[sock]))
    while not srv.started:
        await asyncio.sleep(0.01)
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    await task


def test_a_request_is_built_once_with_its_length() -> None:
    raw = build_request("POST", "h:1", "/x", {"Authorization": "Bearer k"}, b'{"a":1}')
    assert raw == b'POST /x HTTP/1.1\r\nHost: h:1\r\nAuthorization: Bearer k\r\nContent-Length: 7\r\n\r\n{"a":1}'


async def test_answers_come_back_on_a_few_kept_alive_connections(server: str) -> None:
    async with LeanClient(server, 2) as client:
        post = client.request("POST", "/tasks", {"Content-Type": "application/json"}, b'{"title":"b"}')
        answers = await asyncio.gather(*(client.send(post) for _ in range(6)))
        assert {a.status for a in answers} == {201}
        assert {json.loads(a.body)["echo"] for a in answers} == {'{"title":"b"}'}
        # Two connections served all six: the client ports repeat.
        assert len({json.loads(a.body)["client"] for a in answers}) == 2
        empty = await client.send(client.request("GET", "/empty"))
        assert (empty.status, empty.body) == (204, b"")
        await client.repeat(post, 7, expect=201)


async def test_an_unexpected_status_or_a_chunked_answer_is_an_error(server: str) -> None:
    async with LeanClient(server, 1) as client:
        with pytest.raises(LeanHttpError, match="HTTP 200"):
            await client.repeat(client.request("GET", "/x"), 3, expect=201)
    async with LeanClient(server, 1) as client:
        with pytest.raises(LeanHttpError, match="chunked"):
            await client.send(client.request("GET", "/chunked"))


async def test_a_connection_the_server_closed_while_idle_is_opened_again(server: str) -> None:
    async with LeanClient(server, 1) as client:
        get = client.request("GET", "/x")
        first = json.loads((await client.send(get)).body)["client"]
        conn = client._all[0]
        assert conn.writer is not None
        conn.writer.transport.abort()  # as the server's keep-alive timeout would
        await asyncio.sleep(0.05)
        again = await client.send(get)
        assert again.status == 200 and json.loads(again.body)["client"] != first
