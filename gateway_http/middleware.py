"""The outermost ASGI layer: request ids, one log line per request, and one error shape.

It wraps the whole FastAPI stack (see ``app.GatewayApp``), so it also sees the answers
produced below the app's exception handlers — Starlette's body-size limit answers a
declared oversize body with a plain-text 413 of its own — and gives every 4xx/5xx the
``{error, message}`` JSON body.
"""

from __future__ import annotations

import json
import os
import re
import time
from http import HTTPStatus

import structlog
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway_http.errors import status_reason
from gateway_http.metrics import HTTP_DURATION
from libs.metrics import Children

log = structlog.get_logger("http")

REQUEST_ID_HEADER = "x-request-id"
_REQUEST_ID_RAW = REQUEST_ID_HEADER.encode()
# A client's request id is used only when it is this safe to log and pass on; else a new one is made.
CLIENT_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")


def request_id_for(scope: Scope) -> str:
    # The raw header list, not a Headers object: this runs on every request.
    for name, value in scope["headers"]:
        if name == _REQUEST_ID_RAW:
            offered = value.decode("latin-1")
            if CLIENT_REQUEST_ID.fullmatch(offered):
                return offered
            break
    return os.urandom(16).hex()  # as random as uuid4().hex, without building a UUID


# Per (method, route template, status): the routes are finite, so this stays small.
_DURATIONS = Children(HTTP_DURATION)


def _observe(scope: Scope, status: int, start: float) -> None:
    # The route's template, not the path: ids in paths would make a series per task.
    route = scope.get("route")
    template = getattr(route, "path", None) or "unmatched"
    _DURATIONS(scope.get("method", ""), template, str(status)).observe(time.perf_counter() - start)


class RequestContextMiddleware:
    def __init__(self, app: ASGIApp, max_body_bytes: int | None = None) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = request_id_for(scope)
        request_id_raw = request_id.encode("latin-1")
        scope.setdefault("state", {})["request_id"] = request_id
        structlog.contextvars.bind_contextvars(request_id=request_id)
        start = time.perf_counter()
        status = 500
        started = False
        replaced = False

        async def send_shaped(message: Message) -> None:
            nonlocal status, started, replaced
            if message["type"] == "http.response.start":
                started = True
                status = message["status"]
                _observe(scope, status, start)
                raw = [h for h in message.get("headers", ()) if h[0] != _REQUEST_ID_RAW]
                raw.append((_REQUEST_ID_RAW, request_id_raw))
                if status >= 400:
                    headers = MutableHeaders(raw=raw)
                    if not headers.get("content-type", "").startswith("application/json"):
                        replaced = True
                        await self._send_error(send, status, headers)
                        return
                message["headers"] = raw
            elif replaced:
                return  # the original body of a replaced error answer
            await send(message)

        try:
            await self.app(scope, receive, send_shaped)
        except Exception as exc:  # noqa: BLE001 - the answer below is all the client gets
            # ServerErrorMiddleware has answered 500 already and re-raises for the server's log.
            log.error("http_unhandled_error", method=scope.get("method"), path=scope.get("path"), exc_info=exc)
            if not started:
                await self._send_error(send, 500, MutableHeaders({REQUEST_ID_HEADER: request_id}))
                status = 500
                _observe(scope, status, start)
        finally:
            self._log(scope, status, start)
            structlog.contextvars.unbind_contextvars("request_id")

    async def _send_error(self, send: Send, status: int, headers: MutableHeaders) -> None:
        if status == 413 and self.max_body_bytes is not None:
            message = f"request body exceeds {self.max_body_bytes} bytes"
        else:
            try:
                message = HTTPStatus(status).phrase
            except ValueError:
                message = "error"
        body = json.dumps({"error": status_reason(status), "message": message}).encode()
        headers["content-type"] = "application/json"
        headers["content-length"] = str(len(body))
        await send({"type": "http.response.start", "status": status, "headers": headers.raw})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    @staticmethod
    def _log(scope: Scope, status: int, start: float) -> None:
        if scope.get("path") == "/healthz" and status == 200:
            return
        log.info(
            "http_request",
            method=scope.get("method"),
            path=scope.get("path"),
            status=status,
            duration_ms=round((time.perf_counter() - start) * 1000, 2),
        )
