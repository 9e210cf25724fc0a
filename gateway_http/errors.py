"""HTTP errors: one JSON shape ``{error, message}`` and one gRPC -> HTTP mapping."""

from __future__ import annotations

import re
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

import grpc
from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from gateway_http.schemas import ErrorBody
from libs.grpc_client import error_info
from libs.log import get_logger

log = get_logger("gateway_http.errors")

GRPC_TO_HTTP = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.UNIMPLEMENTED: 501,
}
# Reasons for errors raised by the HTTP layer itself (routing, the body-size limit).
STATUS_REASONS = {
    404: "NOT_FOUND",
    405: "METHOD_NOT_ALLOWED",
    406: "NOT_ACCEPTABLE",
    413: "PAYLOAD_TOO_LARGE",
    415: "UNSUPPORTED_MEDIA_TYPE",
    500: "INTERNAL",
}
# The reason for a malformed parameter or body field, by its name; anything else is INVALID_ARGUMENT.
FIELD_REASONS = {
    "agentId": "INVALID_ID",
    "sessionId": "INVALID_ID",
    "taskId": "INVALID_ID",
    "questionId": "INVALID_ID",
    "replacedByTaskId": "INVALID_ID",
    "continueTaskId": "INVALID_ID",
    "nativeSessionId": "INVALID_ID",
    "requestId": "INVALID_ID",
    "page": "INVALID_PAGINATION",
    "page_size": "INVALID_PAGINATION",
    "all": "INVALID_PAGINATION",
}
# What each documented status means, for the OpenAPI document.
DESCRIPTIONS = {
    400: "Invalid ids, pagination, query or body (INVALID_ID, INVALID_PAGINATION, INVALID_JSON, UNKNOWN_PROFILE, …)",
    401: "Missing, unknown or revoked API key",
    403: "No access to the agent, not a member of the session, a task of another session, "
    "a stale or answered question, or a tool the key may not use",
    404: "No such task or pending snapshot",
    409: "ORCHESTRATION_DISABLED for the agent, or the request names a task that does not exist "
    "(REPLACEMENT_NOT_FOUND)",
    413: "The request body exceeds the configured bound",
    429: "A backend is out of a resource; try again later",
    500: "Internal error (nothing is leaked)",
    501: "Not built yet",
    503: "A backend service is unavailable; try again",
    504: "A backend did not answer in time",
}


def responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for a route's error answers, all ``{error, message}``."""
    return {status: {"model": ErrorBody, "description": DESCRIPTIONS[status]} for status in statuses}


class ApiError(Exception):
    def __init__(self, status: int, error: str, message: str, extra: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.error = error
        self.message = message
        self.extra = dict(extra or {})


def error_response(
    status: int,
    error: str,
    message: str,
    headers: Mapping[str, str] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> JSONResponse:
    merged = dict(headers or {})
    if status == 401:
        merged["WWW-Authenticate"] = "Bearer"
    body = {"error": error, "message": message, **(extra or {})}
    return JSONResponse(body, status_code=status, headers=merged or None)


def _error_extras(metadata: Mapping[str, str]) -> dict[str, Any]:
    """The ErrorInfo metadata a client acts on: whether to retry, what to retry with."""
    extra: dict[str, Any] = {}
    if "retryable" in metadata:
        extra["retryable"] = metadata["retryable"] == "true"
    if "continueTaskId" in metadata:
        extra["continueTaskId"] = metadata["continueTaskId"]
    return extra


def from_rpc_error(exc: grpc.aio.AioRpcError) -> ApiError:
    status = GRPC_TO_HTTP.get(exc.code(), 500)
    info = error_info(exc)
    if status == 500:
        return ApiError(500, "INTERNAL", "internal error")
    if status in (503, 504) and info is None:
        return ApiError(status, exc.code().name, "a backend service is unavailable; try again")
    extra = _error_extras(dict(info.metadata)) if info else {}
    return ApiError(status, info.reason if info else exc.code().name, exc.details() or exc.code().name, extra)


async def api_error_handler(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return error_response(exc.status, exc.error, exc.message, extra=exc.extra)


async def rpc_error_handler(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, grpc.aio.AioRpcError)
    api = from_rpc_error(exc)
    if api.status == 500:
        log.error("backend_internal_error", code=exc.code().name)
    return error_response(api.status, api.error, api.message, extra=api.extra)


async def validation_error_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    content_type = request.headers.get("content-type", "")
    if request.method == "POST" and content_type and not content_type.startswith("application/json"):
        return error_response(
            400, "INVALID_CONTENT_TYPE", "send the body as JSON with 'Content-Type: application/json'"
        )
    problems = []
    reasons = set()
    for err in exc.errors():
        if err.get("type") == "json_invalid":
            return error_response(400, "INVALID_JSON", "the request body is not valid JSON")
        loc = [str(p) for p in err.get("loc", ())]
        field = loc[-1] if len(loc) > 1 else ""
        reasons.add(FIELD_REASONS.get(field, "INVALID_ARGUMENT"))
        where = ".".join(p for p in loc if p not in ("body", "path", "query", "header"))
        problems.append(f"{where}: {err.get('msg')}" if where else str(err.get("msg")))
    reason = reasons.pop() if len(reasons) == 1 else "INVALID_ARGUMENT"
    return error_response(400, reason, "; ".join(problems) or "invalid request")


async def http_error_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    headers = dict(exc.headers or {})
    if exc.status_code == 405:
        # Starlette names the methods of the first route whose path matched; a resource
        # served by several routes (GET and POST .../tasks) allows all of theirs.
        documented = documented_methods(request)
        if documented:
            headers["Allow"] = ", ".join(documented)
    reason = STATUS_REASONS.get(exc.status_code, "HTTP_ERROR")
    return error_response(exc.status_code, reason, str(exc.detail), headers=headers)


def documented_methods(request: Request) -> list[str]:
    """The methods /openapi.json lists for the request's path (HEAD with GET), as clients read them."""
    path = request.scope.get("path", "")
    methods: set[str] = set()
    for template, operations in request.app.openapi().get("paths", {}).items():
        if re.fullmatch(re.sub(r"\\{[^/]+?\\}", "[^/]+", re.escape(template)), path):
            methods |= {method.upper() for method in operations}
    if "GET" in methods:
        methods.add("HEAD")
    return sorted(methods)


async def unhandled_error_handler(_: Request, exc: Exception) -> JSONResponse:
    # Logged with its traceback by the request middleware, which sees it re-raised.
    return error_response(500, "INTERNAL", "internal error")


def status_reason(status: int) -> str:
    """The ``error`` for a bare HTTP status (e.g. one produced below the app's handlers)."""
    if status in STATUS_REASONS:
        return STATUS_REASONS[status]
    try:
        return HTTPStatus(status).name
    except ValueError:
        return "HTTP_ERROR"


def copy_rpc_error(exc: grpc.aio.AioRpcError) -> grpc.aio.AioRpcError:
    """One exception object per waiting caller (a raised exception keeps its traceback)."""
    return grpc.aio.AioRpcError(
        exc.code(), exc.initial_metadata(), exc.trailing_metadata(), exc.details(), exc.debug_error_string()
    )


def deadline_exceeded() -> grpc.aio.AioRpcError:
    """What a call whose own deadline passed raises."""
    return grpc.aio.AioRpcError(
        grpc.StatusCode.DEADLINE_EXCEEDED, grpc.aio.Metadata(), grpc.aio.Metadata(), "Deadline Exceeded"
    )
