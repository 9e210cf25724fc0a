"""``python -m libs.healthcheck HOST:PORT``: exit 0 when the gRPC service there is SERVING.

For container healthchecks: it speaks TLS when the settings turn TLS on, and needs
no caller credential (health checking is open to anyone who can connect).
"""

from __future__ import annotations

import os
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from libs.grpc_client import tls_client_material
from libs.settings import SettingsError, load_settings


def check(addr: str, timeout_s: float = 2.0) -> bool:
    root, key, chain = tls_client_material(load_settings(os.environ))
    if root is None:
        channel = grpc.insecure_channel(addr)
    else:
        credentials = grpc.ssl_channel_credentials(root_certificates=root, private_key=key, certificate_chain=chain)
        channel = grpc.secure_channel(addr, credentials)
    with channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout_s)
        except grpc.RpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: python -m libs.healthcheck HOST:PORT", file=sys.stderr)
        return 2
    try:
        return 0 if check(sys.argv[1]) else 1
    except SettingsError as exc:
        print(exc, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
