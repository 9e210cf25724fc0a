"""`taskgate pending listen`: a terminal front-end of the pending-registry.

It listens for entries of a session-origin prefix (so HasListener says a
terminal is there), shows each as it comes, claims it with PickNext and sends
the typed answer with Reply. Several front-ends can run side by side: each entry
is claimed by exactly one of them.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import TextIO

import grpc

from libs.grpc_client import ClientSecurity, sync_channel
from taskgate.pending.v1 import pending_pb2 as pb
from taskgate.pending.v1 import pending_pb2_grpc as pb_grpc

KINDS = {pb.ENTRY_KIND_CONFIRM: "confirm", pb.ENTRY_KIND_ASK: "ask", pb.ENTRY_KIND_SECRET: "secret"}


def listen(
    prefix: str, addr: str | None, security: ClientSecurity, out: TextIO, read_line: Callable[[str], str]
) -> int:
    """Listen as the ``frontend`` caller identity (``security``) until Ctrl+C or end of input."""
    addr = addr or os.environ.get("TASKGATE_PENDING_ADDR", "127.0.0.1:50052")
    picker = f"cli@{socket.gethostname()}:{os.getpid()}"
    with sync_channel(addr, security) as channel:
        stub = pb_grpc.PendingRegistryServiceStub(channel)
        stream = stub.Listen(pb.ListenRequest(prefix=prefix, listener_name=picker))
        try:
            for event in stream:
                if event.type == pb.LISTEN_EVENT_TYPE_SYNCED:
                    # Registered (HasListener now counts this terminal) and caught up.
                    print(
                        f"listening for pending entries with prefix {prefix!r} on {addr} (Ctrl+C to stop)",
                        file=out,
                        flush=True,
                    )
                if event.type != pb.LISTEN_EVENT_TYPE_AVAILABLE:
                    continue
                claimed = stub.PickNext(pb.PickNextRequest(prefix=prefix, picker=picker), timeout=10).entry
                if not claimed.entry_id:
                    continue  # another front-end was quicker
                kind = KINDS.get(claimed.kind, "ask")
                print(f"\n[{claimed.session_id}] {kind}: {claimed.payload}", file=out, flush=True)
                prompt = "answer (yes/no)> " if kind == "confirm" else "answer> "
                answer = read_line(prompt)
                try:
                    stub.Reply(pb.ReplyRequest(entry_id=claimed.entry_id, answer=answer), timeout=10)
                    print("  sent", file=out, flush=True)
                except grpc.RpcError as exc:
                    print(f"  not delivered: {exc.details()}", file=out, flush=True)  # e.g. the producer went away
        except (KeyboardInterrupt, EOFError) as exc:
            stream.cancel()
            print("stopped listening", file=out)
            return 130 if isinstance(exc, KeyboardInterrupt) else 0
        except grpc.RpcError as exc:
            print(f"taskgate: the pending-registry closed the stream: {exc.code().name} {exc.details()}", file=out)
            return 2
    return 0
