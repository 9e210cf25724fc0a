"""Client-side helpers shared by the gateway, the scheduler and the CLI."""

from __future__ import annotations

import collections
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from google.rpc import error_details_pb2, status_pb2

from libs.internal_auth import AUTHORIZATION_KEY, SecretsMissing, read_secret
from libs.settings import Settings

REQUEST_ID_KEY = "x-request-id"


def error_info(exc: grpc.RpcError) -> error_details_pb2.ErrorInfo | None:
    """The ErrorInfo a taskgate service attached to a failed call, if any."""
    trailers = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    for key, value in trailers or ():
        if key == "grpc-status-details-bin":
            status = status_pb2.Status.FromString(value)
            for detail in status.details:
                if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                    info = error_details_pb2.ErrorInfo()
                    detail.Unpack(info)
                    return info
    return None


def client_keepalive_options(keepalive_ms: int) -> list[tuple[str, int]]:
    """Keep-alive of a client; ``libs.grpc_server.server_keepalive_options`` is its other half."""
    return [
        ("grpc.keepalive_time_ms", keepalive_ms),
        ("grpc.keepalive_timeout_ms", max(keepalive_ms // 2, 1_000)),
        # Keep pinging through a long quiet stream (the default stops after two pings).
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.keepalive_permit_without_calls", 1),
    ]


def tls_client_material(settings: Settings) -> tuple[bytes | None, bytes | None, bytes | None]:
    """(CA to verify servers with, client key, client certificate) — all None without TLS."""

    def read(path: Path | None) -> bytes | None:
        return path.read_bytes() if path is not None else None

    client_auth = settings.tls_client_auth
    return (
        read(settings.tls_ca_file),
        read(settings.tls_key_file) if client_auth else None,
        read(settings.tls_cert_file) if client_auth else None,
    )


@dataclass(frozen=True)
class ClientSecurity:
    """How one caller identity reaches the internal services: its secret, TLS, keep-alive."""

    identity: str
    secret: str
    root_certificates: bytes | None = None
    private_key: bytes | None = None
    certificate_chain: bytes | None = None
    keepalive_ms: int = 30_000

    @classmethod
    def for_identity(cls, settings: Settings, identity: str) -> ClientSecurity:
        secret = read_secret(identity, settings.secrets_path, settings.configured_secrets())
        if not secret:
            raise SecretsMissing(
                f"no secret for the internal caller {identity!r} in {settings.secrets_path} or "
                f"TASKGATE_SECRET_{identity.upper()}; create it with `taskgate admin secrets init`"
            )

        root, key, chain = tls_client_material(settings)
        return cls(
            identity=identity,
            secret=secret,
            root_certificates=root,
            private_key=key,
            certificate_chain=chain,
            keepalive_ms=settings.grpc_keepalive_ms,
        )

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return ((AUTHORIZATION_KEY, f"Bearer {self.secret}"),)

    def channel_credentials(self) -> grpc.ChannelCredentials | None:
        if self.root_certificates is None:
            return None
        return grpc.ssl_channel_credentials(
            root_certificates=self.root_certificates,
            private_key=self.private_key,
            certificate_chain=self.certificate_chain,
        )

    def __repr__(self) -> str:  # never show the secret
        return f"ClientSecurity(identity={self.identity!r}, tls={self.root_certificates is not None})"


def _with_credential(details: grpc.aio.ClientCallDetails, metadata: tuple[tuple[str, str], ...]) -> Any:
    merged = grpc.aio.Metadata(*(details.metadata or ()), *metadata)
    return grpc.aio.ClientCallDetails(
        details.method, details.timeout, merged, details.credentials, details.wait_for_ready
    )


# grpc.aio files each interceptor under one call kind only, hence one class per kind.
class _UnaryCredential(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._metadata = metadata

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_with_credential(details, self._metadata), request)


class _StreamCredential(grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[misc]
    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._metadata = metadata

    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_with_credential(details, self._metadata), request)


def aio_channel(addr: str, security: ClientSecurity) -> grpc.aio.Channel:
    """A channel to an internal service that presents ``security``'s identity on every call."""
    options: list[tuple[str, Any]] = [
        *client_keepalive_options(security.keepalive_ms),
        ("grpc.initial_reconnect_backoff_ms", 200),
        ("grpc.max_reconnect_backoff_ms", 2_000),
    ]
    interceptors = [_UnaryCredential(security.metadata), _StreamCredential(security.metadata)]
    credentials = security.channel_credentials()
    if credentials is None:
        return grpc.aio.insecure_channel(addr, options=options, interceptors=interceptors)
    return grpc.aio.secure_channel(addr, credentials, options=options, interceptors=interceptors)


class _SyncCallDetails(
    collections.namedtuple("_SyncCallDetails", ("method", "timeout", "metadata", "credentials", "wait_for_ready")),
    grpc.ClientCallDetails,  # type: ignore[misc]
):
    pass


class _SyncCredentialInterceptor(
    grpc.UnaryUnaryClientInterceptor,  # type: ignore[misc]
    grpc.UnaryStreamClientInterceptor,  # type: ignore[misc]
):
    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._metadata = metadata

    def _details(self, details: Any) -> _SyncCallDetails:
        return _SyncCallDetails(
            details.method,
            details.timeout,
            (*(details.metadata or ()), *self._metadata),
            details.credentials,
            details.wait_for_ready,
        )

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)


def sync_channel(addr: str, security: ClientSecurity) -> grpc.Channel:
    """The same for synchronous code (the CLI, tests)."""
    options = client_keepalive_options(security.keepalive_ms)
    credentials = security.channel_credentials()
    if credentials is None:
        channel = grpc.insecure_channel(addr, options=options)
    else:
        channel = grpc.secure_channel(addr, credentials, options=options)
    return grpc.intercept_channel(channel, _SyncCredentialInterceptor(security.metadata))
