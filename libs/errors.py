"""The error family domain code raises; free of grpc so domain code stays pure.

Each service subclasses these with its own reasons; ``libs.grpc_server`` maps
them, once, to a gRPC status carrying a ``google.rpc.ErrorInfo``.
"""

from __future__ import annotations

from typing import ClassVar


class DomainError(Exception):
    kind: ClassVar[str] = "internal"

    def __init__(self, reason: str, message: str, **metadata: str) -> None:
        super().__init__(message)
        self.reason = reason  # UPPER_SNAKE, stable, for machines
        self.message = message  # for people
        self.metadata = metadata


class InvalidArgument(DomainError):
    kind = "invalid_argument"


class NotFound(DomainError):
    kind = "not_found"


class PermissionDenied(DomainError):
    kind = "permission_denied"


class Unauthenticated(DomainError):
    kind = "unauthenticated"


class FailedPrecondition(DomainError):
    kind = "failed_precondition"


class AlreadyExists(DomainError):
    kind = "already_exists"


class ResourceExhausted(DomainError):
    kind = "resource_exhausted"


class Unavailable(DomainError):
    kind = "unavailable"


class Cancelled(DomainError):
    """The operation was cancelled on purpose (e.g. the user cancelled the session)."""

    kind = "cancelled"


class Aborted(DomainError):
    kind = "aborted"
