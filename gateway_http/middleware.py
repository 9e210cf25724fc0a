"""ASGI middleware: request ids, one log line per request, and a bound on body size."""

from __future__ import annotations

import time
import uuid
from typing import Any

import structlog
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway_http.errors import error_response

log = structlog.get_logger("http")


class _TooLarge(Exception):
    pass


class RequestContextMiddleware:
    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        request_id = headers.get("x-request-id", "")[:64] or uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        structlog.contextvars.bind_contextvars(request_id=request_id)
        start = time.perf_counter()
        status_holder: dict[str, Any] = {"status": 500}
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            response = error_response(413, "PAYLOAD_TOO_LARGE", f"request body exceeds {self.max_body_bytes} bytes")
            await response(scope, receive, send)
            self._log(scope, 413, start)
            return
        received = 0

        async def bounded_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    raise _TooLarge
            return message

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                status_holder["status"] = message["status"]
                message.setdefault("headers", []).append((b"x-request-id", request_id.encode()))
            await send(message)

        try:
            await self.app(scope, bounded_receive, send_with_id)
        except _TooLarge:
            response = error_response(413, "PAYLOAD_TOO_LARGE", f"request body exceeds {self.max_body_bytes} bytes")
            await response(scope, receive, send)
            status_holder["status"] = 413
        finally:
            self._log(scope, status_holder["status"], start)
            structlog.contextvars.unbind_contextvars("request_id")

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
