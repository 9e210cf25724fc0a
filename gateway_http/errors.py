"""HTTP errors: one JSON shape ``{error, message}`` and one gRPC -> HTTP mapping."""

from __future__ import annotations

import grpc
from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from libs.grpc_client import error_info

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


class ApiError(Exception):
    def __init__(self, status: int, error: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.error = error
        self.message = message


def error_response(status: int, error: str, message: str) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse({"error": error, "message": message}, status_code=status, headers=headers)


def from_rpc_error(exc: grpc.aio.AioRpcError) -> ApiError:
    status = GRPC_TO_HTTP.get(exc.code(), 500)
    info = error_info(exc)
    if status == 500:
        return ApiError(500, "INTERNAL", "internal error")
    if status in (503, 504) and info is None:
        return ApiError(status, exc.code().name, "a backend service is unavailable; try again")
    return ApiError(status, info.reason if info else exc.code().name, exc.details() or exc.code().name)


async def api_error_handler(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return error_response(exc.status, exc.error, exc.message)


async def rpc_error_handler(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, grpc.aio.AioRpcError)
    api = from_rpc_error(exc)
    return error_response(api.status, api.error, api.message)


async def validation_error_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    content_type = request.headers.get("content-type", "")
    if request.method == "POST" and content_type and not content_type.startswith("application/json"):
        return error_response(
            400, "INVALID_CONTENT_TYPE", "send the body as JSON with 'Content-Type: application/json'"
        )
    problems = []
    for err in exc.errors():
        if err.get("type") == "json_invalid":
            return error_response(400, "INVALID_JSON", "the request body is not valid JSON")
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        problems.append(f"{where}: {err.get('msg')}" if where else str(err.get("msg")))
    return error_response(400, "INVALID_ARGUMENT", "; ".join(problems) or "invalid request")


async def http_error_handler(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    names = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED", 413: "PAYLOAD_TOO_LARGE"}
    return error_response(exc.status_code, names.get(exc.status_code, "HTTP_ERROR"), str(exc.detail))
