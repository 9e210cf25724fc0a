"""The gRPC server bootstrap every service shares.

grpc.aio server with health checking, reflection, one interceptor that binds a
request id into the log context, writes one canonical log line per RPC and maps
``DomainError`` to a status with ``ErrorInfo``, and graceful shutdown on
SIGTERM/SIGINT.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import grpc
import structlog
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection
from grpc_status import rpc_status

from libs import internal_auth
from libs.db import storage_full
from libs.errors import DomainError, Unavailable
from libs.grpc_client import REQUEST_ID_KEY
from libs.internal_auth import CallerAuth
from libs.metrics import RPC_DURATION, Children, MetricsEndpoint
from libs.settings import Settings
from libs.startup import StopSignal, settle_heap

log = structlog.get_logger("grpc")

ERROR_DOMAIN = "taskgate.dev"
# Request ids from callers are kept only when they look like one (they end up in logs).
REQUEST_ID_PATTERN = re.compile(r"[A-Za-z0-9._:-]{1,64}")

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


def status_proto(error: DomainError) -> status_pb2.Status:
    """The google.rpc.Status a DomainError fails a call with: its code, message and ErrorInfo."""
    code = _KIND_TO_CODE.get(error.kind, grpc.StatusCode.INTERNAL)
    info = error_details_pb2.ErrorInfo(reason=error.reason, domain=ERROR_DOMAIN, metadata=error.metadata)
    detail = any_pb2.Any()
    detail.Pack(info)
    return status_pb2.Status(code=code.value[0], message=error.message, details=[detail])


def status_for(error: DomainError) -> grpc.Status:
    return rpc_status.to_status(status_proto(error))


# A full disk under the database is the operator's to fix, and the call can be retried after:
# UNAVAILABLE with a reason that says so, instead of an opaque INTERNAL.
_STORAGE_FULL = Unavailable("STORAGE_FULL", "the service's database storage is full; free space, then retry")


def unexpected_status_proto(exc: BaseException) -> tuple[str, status_pb2.Status]:
    """The code name and status for an error no handler expected: INTERNAL, or STORAGE_FULL."""
    if storage_full(exc):
        return "UNAVAILABLE", status_proto(_STORAGE_FULL)
    return "INTERNAL", status_pb2.Status(code=code_pb2.INTERNAL, message="internal error")


def _unexpected_status(exc: BaseException) -> tuple[str, grpc.Status]:
    code, status = unexpected_status_proto(exc)
    return code, rpc_status.to_status(status)


def _ended_code(context: grpc.aio.ServicerContext) -> str:
    """The code of a call the servicer aborted (its abort code), or that the client cancelled."""
    code = context.code()
    return code.name if isinstance(code, grpc.StatusCode) else "CANCELLED"


def _refusal(handler: grpc.RpcMethodHandler, code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same kind as ``handler`` that only refuses the call."""

    async def refuse(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(code, message)

    if handler.stream_stream:

        async def refuse_both_ways(requests: Any, context: grpc.aio.ServicerContext) -> None:
            await context.abort(code, message)

        return grpc.stream_stream_rpc_method_handler(
            refuse_both_ways,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
    if handler.unary_stream:

        async def refuse_stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            await context.abort(code, message)
            yield  # pragma: no cover - makes this an async generator

        return grpc.unary_stream_rpc_method_handler(
            refuse_stream,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
    return grpc.unary_unary_rpc_method_handler(
        refuse,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


class ServiceInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Caller authentication, request ids, one log line per RPC, DomainError -> status.

    ``auth`` None means the server authenticates nobody at this layer: only for
    servicer tests and the worker listener, whose calls carry a worker token.
    """

    def __init__(self, auth: CallerAuth | None) -> None:
        self._auth = auth
        # Per (method, code). Bounded: only registered methods reach it, and few codes.
        self._durations = Children(RPC_DURATION)
        # The tasks serving open streams, and whether the service is stopping (``end_streams``).
        self._streams: set[asyncio.Task[Any]] = set()
        self._ending_streams = False

    def end_streams(self) -> set[asyncio.Task[Any]]:
        """(Stopping.) Every open stream ends UNAVAILABLE ("the service is stopping") instead of
        holding the server's grace to its end and then being cancelled (with a traceback): a
        watch stays open as long as its client, and every client here reconnects on an error —
        to this service once it is back. Returns the streams' tasks, to wait for."""
        self._ending_streams = True
        streams = set(self._streams)
        for task in streams:
            task.cancel()
        return streams

    def open_streams(self) -> set[asyncio.Task[Any]]:
        return set(self._streams)

    def _stream_started(self) -> asyncio.Task[Any]:
        task = asyncio.current_task()
        assert task is not None
        self._streams.add(task)
        return task

    def _observe(self, method: str, code: str, seconds: float) -> None:
        self._durations(method, code).observe(seconds)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or internal_auth.exempt(details.method):
            return handler
        method = details.method
        received = time.perf_counter()
        # The two keys we need, last one wins (as a dict of the metadata would): no dict per call.
        request_id: Any = ""
        authorization: Any = None
        for key, value in details.invocation_metadata or ():
            if key == REQUEST_ID_KEY:
                request_id = value
            elif key == internal_auth.AUTHORIZATION_KEY:
                authorization = value
        request_id = str(request_id or "")
        if not REQUEST_ID_PATTERN.fullmatch(request_id):
            request_id = uuid.uuid4().hex
        caller = "-"
        if self._auth is not None:
            identity = self._auth.identify(authorization)
            if identity is None:
                log.warning("rpc_unauthenticated", rpc=method, request_id=request_id)
                self._observe(method, "UNAUTHENTICATED", time.perf_counter() - received)
                return _refusal(handler, grpc.StatusCode.UNAUTHENTICATED, "a valid caller credential is required")
            if not internal_auth.allowed(identity, method):
                log.warning("rpc_permission_denied", rpc=method, caller=identity, request_id=request_id)
                self._observe(method, "PERMISSION_DENIED", time.perf_counter() - received)
                return _refusal(handler, grpc.StatusCode.PERMISSION_DENIED, f"{identity} may not call {method}")
            caller = identity

        def bind() -> float:
            structlog.contextvars.bind_contextvars(request_id=request_id, rpc=method, caller=caller)
            return time.perf_counter()

        def done(start: float, code: str, error: BaseException | None = None) -> None:
            elapsed = time.perf_counter() - start
            self._observe(method, code, elapsed)
            elapsed_ms = round(elapsed * 1000, 2)
            if code == "INTERNAL" and error is not None:
                log.error("rpc_failed", code=code, duration_ms=elapsed_ms, exc_info=error)
            elif error is not None:
                log.warning("rpc_failed", code=code, duration_ms=elapsed_ms, error=type(error).__name__)
            else:
                log.info("rpc", code=code, duration_ms=elapsed_ms)
            structlog.contextvars.unbind_contextvars("request_id", "rpc", "caller")

        async def fail(start: float, context: grpc.aio.ServicerContext, exc: Exception) -> None:
            """A handler's error, counted and logged, as the call's status (always raises)."""
            if isinstance(exc, DomainError):
                done(start, _KIND_TO_CODE.get(exc.kind, grpc.StatusCode.INTERNAL).name)
                await context.abort_with_status(status_for(exc))
            elif isinstance(exc, NotImplementedError):
                # The generated base servicer's answer for an RPC a later issue fills in.
                done(start, "UNIMPLEMENTED")
                await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{method} is not implemented yet")
            else:  # mapped to INTERNAL (or STORAGE_FULL), logged
                code, status = _unexpected_status(exc)
                done(start, code, exc)
                await context.abort_with_status(status)

        async def cancelled(start: float, task: asyncio.Task[Any], context: grpc.aio.ServicerContext) -> None:
            """A stream cancelled: by ``end_streams`` it ends UNAVAILABLE (this raises); by its
            client (or the server's grace) it is counted, and the caller re-raises."""
            if self._ending_streams:
                done(start, "UNAVAILABLE")
                task.uncancel()
                await context.abort(grpc.StatusCode.UNAVAILABLE, "the service is stopping; reconnect")
            done(start, _ended_code(context))

        if handler.unary_unary:
            behavior = handler.unary_unary

            async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
                start = bind()
                try:
                    response = await behavior(request, context)
                except (grpc.aio.AbortError, asyncio.CancelledError):
                    done(start, _ended_code(context))
                    raise
                except Exception as exc:  # noqa: BLE001 - its status, below
                    await fail(start, context, exc)
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
                task = self._stream_started()
                try:
                    async for item in stream_behavior(request, context):
                        yield item
                except asyncio.CancelledError:
                    await cancelled(start, task, context)
                    raise
                except (grpc.aio.AbortError, GeneratorExit):
                    done(start, _ended_code(context))
                    raise
                except Exception as exc:  # noqa: BLE001 - its status, below
                    await fail(start, context, exc)
                else:
                    done(start, "OK")
                finally:
                    self._streams.discard(task)

            return grpc.unary_stream_rpc_method_handler(
                stream,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.stream_stream:
            # Bidirectional handlers here read and write through the context (a coroutine, not a
            # generator): one log line and one duration for the whole stream.
            both_ways_behavior = handler.stream_stream

            async def both_ways(requests: Any, context: grpc.aio.ServicerContext) -> None:
                start = bind()
                task = self._stream_started()
                try:
                    await both_ways_behavior(requests, context)
                except asyncio.CancelledError:
                    await cancelled(start, task, context)
                    raise
                except grpc.aio.AbortError:
                    done(start, _ended_code(context))
                    raise
                except Exception as exc:  # noqa: BLE001 - its status, below
                    await fail(start, context, exc)
                else:
                    done(start, "OK")
                finally:
                    self._streams.discard(task)

            return grpc.stream_stream_rpc_method_handler(
                both_ways,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler


Registrar = Callable[[grpc.aio.Server], None]

# At a stop, how long the streams still open get to end their own way (a service's on_stopping
# may have closed what they follow: the telemetry agent's observation streams end OK) before
# the rest are ended UNAVAILABLE.
STREAMS_SETTLE_S = 0.5


def server_keepalive_options(keepalive_ms: int) -> list[tuple[str, int]]:
    """The server half of ``libs.grpc_client.client_keepalive_options``: accept the
    clients' pings (at up to twice their rate, also on a quiet stream) and ping
    idle clients too, so a dead peer is noticed."""
    return [
        ("grpc.keepalive_time_ms", keepalive_ms),
        ("grpc.keepalive_timeout_ms", max(keepalive_ms // 2, 1_000)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", keepalive_ms // 2),
        ("grpc.http2.min_ping_interval_without_data_ms", keepalive_ms // 2),
        ("grpc.http2.max_pings_without_data", 0),
    ]


@dataclass(frozen=True)
class ServerSecurity:
    """Who may call (``auth``), TLS material, keep-alive — from settings in production."""

    auth: CallerAuth | None
    certificate_chain: bytes | None = None
    private_key: bytes | None = None
    client_ca: bytes | None = None  # set: clients must present a certificate it signed
    keepalive_ms: int = 30_000

    @classmethod
    def from_settings(cls, settings: Settings) -> ServerSecurity:
        auth = internal_auth.load_caller_auth(settings.secrets_path, settings.configured_secrets())
        tls = settings.tls_cert_file is not None and settings.tls_key_file is not None
        return cls(
            auth=auth,
            certificate_chain=settings.tls_cert_file.read_bytes() if tls and settings.tls_cert_file else None,
            private_key=settings.tls_key_file.read_bytes() if tls and settings.tls_key_file else None,
            client_ca=(
                settings.tls_ca_file.read_bytes() if tls and settings.tls_client_auth and settings.tls_ca_file else None
            ),
            keepalive_ms=settings.grpc_keepalive_ms,
        )

    def __repr__(self) -> str:
        return f"ServerSecurity(auth={self.auth is not None}, tls={self.certificate_chain is not None})"


# Servicer tests (their calls come from the test itself) and the worker listener
# (each call carries a worker token the servicer checks) authenticate no caller here.
NO_CALLER_AUTH = ServerSecurity(auth=None)


class ServiceHost:
    """A started gRPC server with health and reflection; stop() is graceful."""

    def __init__(
        self,
        server: grpc.aio.Server,
        health: health_aio.HealthServicer,
        port: int,
        names: list[str],
        interceptor: ServiceInterceptor | None = None,
    ) -> None:
        self.server = server
        self.health = health
        self.port = port
        self.names = names
        self.interceptor = interceptor

    async def end_streams(self, grace: float, settle: float = STREAMS_SETTLE_S) -> None:
        """The streams still open ``settle`` seconds from now end UNAVAILABLE
        (``ServiceInterceptor.end_streams``); waits up to ``grace`` for them. Streams the
        service is ending itself (its ``on_stopping`` closed what they follow) end their own
        way meanwhile."""
        if self.interceptor is None:
            return
        interceptor = self.interceptor
        if interceptor.open_streams():
            await asyncio.wait(interceptor.open_streams(), timeout=settle)
        streams = interceptor.end_streams()
        if streams:
            await asyncio.wait(streams, timeout=grace)

    async def set_serving(self) -> None:
        for name in ["", *self.names]:
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    async def stop(self, grace: float = 5.0) -> None:
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)


class ListenFailed(RuntimeError):
    """The server's address could not be bound."""


async def start_server(
    addr: str,
    registrars: Iterable[Registrar],
    service_names: Iterable[str],
    *,
    security: ServerSecurity,
    ready: bool = True,
) -> ServiceHost:
    """Start serving; health says NOT_SERVING until ``set_serving`` unless ``ready``."""
    interceptor = ServiceInterceptor(security.auth)
    server = grpc.aio.server(
        interceptors=[interceptor],
        options=[
            # Without this, a second server on the same port binds silently.
            ("grpc.so_reuseport", 0),
            ("grpc.max_receive_message_length", 4 * 1024 * 1024),
            *server_keepalive_options(security.keepalive_ms),
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
    try:
        if security.certificate_chain is not None and security.private_key is not None:
            credentials = grpc.ssl_server_credentials(
                [(security.private_key, security.certificate_chain)],
                root_certificates=security.client_ca,
                require_client_auth=security.client_ca is not None,
            )
            port = server.add_secure_port(addr, credentials)
        else:
            port = server.add_insecure_port(addr)
    except RuntimeError:  # grpcio raises "Failed to bind" where older versions returned 0
        port = 0
    if port == 0:
        raise ListenFailed(f"cannot listen on {addr} (in use, or not an address of this host)")
    await server.start()
    host = ServiceHost(server, health, port, names, interceptor)
    for name in ["", *names]:
        await health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    if ready:
        await host.set_serving()
    return host


async def serve(
    *,
    addr: str,
    settings: Settings,
    stop: StopSignal,
    registrars: Iterable[Registrar],
    service_names: Iterable[str],
    on_started: Callable[[], Awaitable[None]] | None = None,
    on_stopping: Callable[[], Awaitable[None]] | None = None,
    grace: float = 5.0,
    metrics_port: int = 0,
    process: bool = False,
) -> None:
    """Run a service until SIGTERM/SIGINT, then shut it down gracefully.

    Health says SERVING only once ``on_started`` (recovery and the like) is done;
    a stop signal that arrived during start-up is honoured right after it.
    ``metrics_port`` (0 = none) serves Prometheus metrics on ``settings.metrics_host``.
    ``process``: this service is the whole process (its ``__main__``), so once started its
    heap is settled (``libs.startup.settle_heap``); an in-process server in a test is not.
    """
    # A port that cannot be had ends the process with one line, not a traceback.
    try:
        metrics = MetricsEndpoint.start(settings.metrics_host, metrics_port)
    except OSError as exc:
        raise SystemExit(
            f"cannot serve metrics on {settings.metrics_host}:{metrics_port}: {exc.strerror or exc}"
        ) from None
    try:
        await _serve(addr, settings, stop, registrars, service_names, on_started, on_stopping, grace, process)
    except ListenFailed as exc:
        raise SystemExit(str(exc)) from None
    finally:
        if metrics is not None:
            await metrics.stop()


async def _serve(
    addr: str,
    settings: Settings,
    stop: StopSignal,
    registrars: Iterable[Registrar],
    service_names: Iterable[str],
    on_started: Callable[[], Awaitable[None]] | None,
    on_stopping: Callable[[], Awaitable[None]] | None,
    grace: float,
    process: bool,
) -> None:
    host = await start_server(
        addr, registrars, service_names, security=ServerSecurity.from_settings(settings), ready=False
    )
    log.info("listening", addr=addr, port=host.port, tls=settings.tls_cert_file is not None)
    if on_started and not stop.requested:
        await on_started()
    if process:
        settle_heap()
    if not stop.requested:
        await host.set_serving()
        log.info("serving", addr=addr, port=host.port)
        await stop.wait()
    await host.health.enter_graceful_shutdown()
    if on_stopping:
        await on_stopping()
    # Streams (watches, feeds) stay open as long as their clients: end them rather than wait.
    await host.end_streams(grace)
    await host.server.stop(grace)
    log.info("stopped")
