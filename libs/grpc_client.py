"""Client-side helpers shared by the gateway, the scheduler and the CLI."""

from __future__ import annotations

import grpc
from google.rpc import error_details_pb2, status_pb2

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


def aio_channel(addr: str) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(
        addr,
        options=[
            ("grpc.keepalive_time_ms", 30_000),
            ("grpc.initial_reconnect_backoff_ms", 200),
            ("grpc.max_reconnect_backoff_ms", 2_000),
        ],
    )
