"""The gRPC server bootstrap every service shares.

grpc.aio server with health checking, reflection, one interceptor that binds a
request id into the log context, writes one canonical log line per RPC and maps
``DomainError`` to a status with ``ErrorInfo``, and graceful shutdown on
SIGTERM/SIGINT.
"""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

import grpc
import structlog
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection
from grpc_status import rpc_status

from libs.errors import DomainError
from libs.grpc_client import REQUEST_ID_KEY

log = structlog.get_logger("grpc")

ERROR_DOMAIN = "taskgate.dev"
_QUIET_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")

_KIND_TO_CODE = {
    "invalid_argument": grpc.StatusCode.INVALID_ARGUMENT,
    "not_found": grpc.StatusCode.NOT_FOUND,
    "permission_denied": grpc.StatusCode.PERMISSION_DENIED,
    "unauthenticated": grpc.StatusCode.UNAUTHENTICATED,
    "failed_precondition": grpc.StatusCode.FAILED_PRECONDITION,
    "already_exists": grpc.StatusCode.ALREADY_EXISTS,
    "resource_exhausted": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "unavailable": grpc.StatusCode.UNAVAILABLE,
    "cancelled": grpc.StatusCode.CANCELLED,
    "aborted": grpc.StatusCode.ABORTED,
    "internal": grpc.StatusCode.INTERNAL,
}


def status_for(error: DomainError) -> grpc.Status:
    code = _KIND_TO_CODE.get(error.kind, grpc.StatusCode.INTERNAL)
    info = error_details_pb2.ErrorInfo(reason=error.reason, domain=ERROR_DOMAIN, metadata=error.metadata)
    detail = any_pb2.Any()
    detail.Pack(info)
    return rpc_status.to_status(status_pb2.Status(code=code.value[0], message=error.message, details=[detail]))


def _internal_status() -> grpc.Status:
    return rpc_status.to_status(status_pb2.Status(code=code_pb2.INTERNAL, message="internal error"))


class ServiceInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or details.method.startswith(_QUIET_PREFIXES):
            return handler
        method = details.method
        metadata = dict(details.invocation_metadata or ())
        request_id = str(metadata.get(REQUEST_ID_KEY) or uuid.uuid4().hex)[:64]

        def bind() -> float:
            structlog.contextvars.bind_contextvars(request_id=request_id, rpc=method)
            return time.perf_counter()

        def done(start: float, code: str, error: BaseException | None = None) -> None:
            elapsed_ms = round((time.perf_counter() - start) * 1000, 2)
            if code == "INTERNAL" and error is not None:
                log.error("rpc_failed", code=code, duration_ms=elapsed_ms, exc_info=error)
            else:
                log.info("rpc", code=code, duration_ms=elapsed_ms)
            structlog.contextvars.unbind_contextvars("request_id", "rpc")

        if handler.unary_unary:
            behavior = handler.unary_unary

            async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
                start = bind()
                try:
                    response = await behavior(request, context)
                except DomainError as exc:
                    done(start, _KIND_TO_CODE.get(exc.kind, grpc.StatusCode.INTERNAL).name)
                    await context.abort_with_status(status_for(exc))
                except (grpc.aio.AbortError, asyncio.CancelledError):
                    done(start, "ABORTED_OR_CANCELLED")
                    raise
                except NotImplementedError:
                    # The generated base servicer's answer for an RPC a later issue fills in.
                    done(start, "UNIMPLEMENTED")
                    await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{method} is not implemented yet")
                except Exception as exc:  # noqa: BLE001 - mapped to INTERNAL, logged
                    done(start, "INTERNAL", exc)
                    await context.abort_with_status(_internal_status())
                else:
                    done(start, "OK")
                    return response

            return grpc.unary_unary_rpc_method_handler(
                unary,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream:
            stream_behavior = handler.unary_stream

            async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                start = bind()
                try:
                    async for item in stream_behavior(request, context):
                        yield item
                except DomainError as exc:
                    done(start, _KIND_TO_CODE.get(exc.kind, grpc.StatusCode.INTERNAL).name)
                    await context.abort_with_status(status_for(exc))
                except (grpc.aio.AbortError, asyncio.CancelledError, GeneratorExit):
                    done(start, "ABORTED_OR_CANCELLED")
                    raise
                except NotImplementedError:
                    done(start, "UNIMPLEMENTED")
                    await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{method} is not implemented yet")
                except Exception as exc:  # noqa: BLE001
                    done(start, "INTERNAL", exc)
                    await context.abort_with_status(_internal_status())
                else:
                    done(start, "OK")

            return grpc.unary_stream_rpc_method_handler(
                stream,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler


Registrar = Callable[[grpc.aio.Server], None]


class ServiceHost:
    """A started gRPC server with health and reflection; stop() is graceful."""

    def __init__(self, server: grpc.aio.Server, health: health_aio.HealthServicer, port: int) -> None:
        self.server = server
        self.health = health
        self.port = port

    async def stop(self, grace: float = 5.0) -> None:
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)


async def start_server(addr: str, registrars: Iterable[Registrar], service_names: Iterable[str]) -> ServiceHost:
    server = grpc.aio.server(
        interceptors=[ServiceInterceptor()],
        options=[
            # Without this, a second server on the same port binds silently.
            ("grpc.so_reuseport", 0),
            ("grpc.max_receive_message_length", 4 * 1024 * 1024),
        ],
    )
    for register in registrars:
        register(server)
    health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    names = list(service_names)
    reflection.enable_server_reflection(
        [*names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME],
        server,
    )
    port = server.add_insecure_port(addr)
    if port == 0:
        raise RuntimeError(f"cannot listen on {addr}")
    await server.start()
    for name in ["", *names]:
        await health.set(name, health_pb2.HealthCheckResponse.SERVING)
    return ServiceHost(server, health, port)


async def wait_for_stop_signal() -> None:
    """Return on the first SIGTERM or SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("stop_signal_received")


async def serve(
    *,
    addr: str,
    registrars: Iterable[Registrar],
    service_names: Iterable[str],
    on_started: Callable[[], Awaitable[None]] | None = None,
    on_stopping: Callable[[], Awaitable[None]] | None = None,
    grace: float = 5.0,
) -> None:
    """Run a service until SIGTERM/SIGINT, then shut it down gracefully."""
    host = await start_server(addr, registrars, service_names)
    log.info("serving", addr=addr, port=host.port)
    if on_started:
        await on_started()
    await wait_for_stop_signal()
    await host.health.enter_graceful_shutdown()
    if on_stopping:
        await on_stopping()
    await host.server.stop(grace)
    log.info("stopped")
