"""The two hottest requests without FastAPI's per-request machinery, for the happy path only.

``POST .../sessions/{s}/tasks`` and ``GET .../sessions/{s}/tasks`` are what every client
creating and polling tasks sends. FastAPI's dependency solving, its body and parameter
plumbing and its inner middleware layers cost more CPU per call than the work itself;
here the same checks run directly: the same key and membership checks
(``GatewayStore.authenticate`` / ``member``), the same body model (``CreateTaskBody``),
the same scheduler request and answer (``routes.tasks``).

Only a request that passes every check is answered here. Anything else — no or an
unknown key, no membership, orchestration off, an unusual header, query or body, a
gateway-managed target (its safemode rule), a body over the limit — goes to the FastAPI
app untouched (its body replayed), so every refusal keeps the one shape and message
that app gives. A backend's error after the call is mapped by the same handler.
"""

from __future__ import annotations

import json
import re
from typing import Any

import grpc
from fastapi import FastAPI
from pydantic import ValidationError
from starlette.requests import Request
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway_http import errors
from gateway_http.auth import MAX_KEY_CHARS, Caller
from gateway_http.routes import tasks
from gateway_http.schemas import MAX_PAGE, CreateTaskBody
from gateway_http.store import GatewayStore
from libs.grpc_client import REQUEST_ID_KEY
from libs.settings import Settings

TEMPLATE = "/api/v1/agents/{agentId}/sessions/{sessionId}/tasks"
_ID = r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}"  # schemas.ID_REGEX, unanchored
PATH = re.compile(rf"/api/v1/agents/({_ID})/sessions/({_ID})/tasks")
_DIGITS = re.compile(r"[0-9]{1,7}")


class _Delegate(Exception):
    """Not the happy path: the FastAPI app answers (with the body read so far replayed)."""

    def __init__(self, body: bytes = b"") -> None:
        super().__init__()
        self.body = body


def _headers(scope: Scope) -> dict[bytes, bytes] | None:
    out: dict[bytes, bytes] = {}
    for name, value in scope["headers"]:
        if name in out:
            return None  # a repeated header: leave its meaning to the full app
        out[name] = value
    return out


def _query(raw: bytes) -> tuple[int, int, bool]:
    """page, page_size, all — in the plainest spelling only."""
    page, page_size, include_finished = 0, 10, False
    seen: set[str] = set()
    for pair in raw.decode("latin-1").split("&") if raw else ():
        name, eq, value = pair.partition("=")
        if not eq or name in seen:
            raise _Delegate
        seen.add(name)
        if name == "page" and _DIGITS.fullmatch(value) and int(value) <= MAX_PAGE:
            page = int(value)
        elif name == "page_size" and _DIGITS.fullmatch(value) and 1 <= int(value) <= 100:
            page_size = int(value)
        elif name == "all" and value in ("true", "false"):
            include_finished = value == "true"
        else:
            raise _Delegate
    return page, page_size, include_finished


class HotRoutes:
    def __init__(self, app: ASGIApp, gateway: FastAPI) -> None:
        self.app = app
        self.gateway = gateway
        self.routes: dict[str, BaseRoute] = {}

    def _route(self, method: str) -> BaseRoute | None:
        """The FastAPI route this request stands for: its template labels the metrics.

        Taken from the tasks router itself, not the app's route list: FastAPI includes a
        router lazily, so the app lists it as one included router until a request has
        gone through its routing (the first create was labelled "unmatched").
        """
        if not self.routes:
            for route in tasks.router.routes:
                if getattr(route, "path", None) == TEMPLATE:
                    for m in getattr(route, "methods", ()):
                        self.routes[m] = route
        return self.routes.get(method)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        method = scope.get("method")
        match = PATH.fullmatch(scope.get("path", "")) if scope["type"] == "http" else None
        if match is None or method not in ("POST", "GET"):
            await self.app(scope, receive, send)
            return
        try:
            headers = _headers(scope)
            if headers is None:
                raise _Delegate
            try:
                caller = await self._caller(headers, match.group(1), match.group(2))
            except _Delegate:
                raise
            except Exception:  # noqa: BLE001 - e.g. the database: the full app meets it again and answers as always
                raise _Delegate from None
            if method == "POST":
                request: Any = self._create(caller, await self._body(headers, receive))
            else:
                request = _query(scope.get("query_string", b""))
        except _Delegate as delegated:
            await self.app(scope, _replay(delegated.body, receive) if delegated.body else receive, send)
            return
        route = self._route(method)
        if route is not None:
            scope["route"] = route
        await self._answer(scope, receive, send, caller, request)

    async def _caller(self, headers: dict[bytes, bytes], agent_id: str, session_id: str) -> Caller:
        scheme, _, secret = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
        secret = secret.strip()
        if scheme.lower() != "bearer" or not secret or len(secret) > MAX_KEY_CHARS:
            raise _Delegate
        store: GatewayStore = self.gateway.state.store
        settings: Settings = self.gateway.state.settings
        key = await store.authenticate(secret)
        if key is None or agent_id not in key.agents or not settings.agent(agent_id).orchestration_enabled:
            raise _Delegate
        if not await store.member(agent_id, session_id, key.principal):
            raise _Delegate
        return Caller(key=key, agent_id=agent_id, session_id=session_id)

    async def _body(self, headers: dict[bytes, bytes], receive: Receive) -> bytes:
        content_type = headers.get(b"content-type", b"").split(b";", 1)[0].strip().lower()
        length = headers.get(b"content-length")
        limit = self.gateway.max_body_size
        if content_type != b"application/json" or length is None or b"transfer-encoding" in headers:
            raise _Delegate
        if not length.isdigit() or (limit is not None and int(length) > limit):
            raise _Delegate
        chunks = []
        while True:
            message = await receive()
            if message["type"] != "http.request":
                raise _Delegate  # a disconnect: the full app sees it too
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        if len(body) != int(length):
            raise _Delegate(body)  # the full app judges it, with the body as it came
        return body

    def _create(self, caller: Caller, body: bytes) -> Any:
        settings: Settings = self.gateway.state.settings
        try:
            parsed = CreateTaskBody.model_validate(json.loads(body))
        except (ValueError, ValidationError):
            raise _Delegate(body) from None
        if parsed.target is not None or (parsed.profile is not None and parsed.profile not in settings.workers):
            raise _Delegate(body)
        return tasks.create_task_request(caller, parsed, safemode_cleared=False)

    async def _answer(self, scope: Scope, receive: Receive, send: Send, caller: Caller, request: Any) -> None:
        backends = self.gateway.state.backends
        request_id = scope["state"]["request_id"]
        metadata = ((REQUEST_ID_KEY, request_id),)
        try:
            if isinstance(request, tuple):
                page, page_size, include_finished = request
                reply = await backends.scheduler.ListTasks(
                    tasks.list_tasks_request(caller, page, page_size, include_finished),
                    timeout=backends.timeout_s,
                    metadata=metadata,
                )
                response = tasks.task_page_response(reply)
            else:
                created = await backends.create_task(request, request_id)
                response = tasks.created_response(created)
        except grpc.aio.AioRpcError as exc:
            response = await errors.rpc_error_handler(Request(scope), exc)
        except Exception:
            # As FastAPI's ServerErrorMiddleware: answer 500, re-raise for the request log.
            await (await errors.unhandled_error_handler(Request(scope), RuntimeError()))(scope, receive, send)
            raise
        await response(scope, receive, send)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
