"""The worker API's own listener: Unix sockets that serve ``WorkerService`` and nothing else.

Workers get only this address (never the scheduler's or another service's). One
socket per worker uid, each in a 0700 directory owned by that uid, under a root
folder that others may traverse but not list (0711): a worker running as
``nobody`` reaches its socket, and no other unprivileged user reaches any.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

import grpc

from libs.grpc_server import ServiceInterceptor
from libs.startup import FolderLock, hold_folder

SOCKET_NAME = "worker.sock"


class WorkerSockets:
    def __init__(self, configured_dir: str, uids: Iterable[int]) -> None:
        self._lock: FolderLock | None = None
        if configured_dir:
            self.root = Path(configured_dir).resolve()
            self.root.mkdir(parents=True, exist_ok=True)
            self._owned_root = False
            # A second scheduler on this folder would unlink our sockets and take our workers'
            # calls: FolderInUse instead.
            self._lock = hold_folder(self.root, "scheduler", "the worker socket folder", "TASKGATE_WORKER_SOCKET_DIR")
        else:
            self.root = Path(tempfile.mkdtemp(prefix="taskgate-workers-"))
            self._owned_root = True
        os.chmod(self.root, 0o711)
        self.uids = sorted({os.getuid(), *uids})
        self._addrs: dict[int | None, str] = {}
        for uid in self.uids:
            folder = self.root / str(uid)
            folder.mkdir(mode=0o700, exist_ok=True)
            os.chmod(folder, 0o700)
            if uid != os.getuid():
                os.chown(folder, uid, -1)
            (folder / SOCKET_NAME).unlink(missing_ok=True)  # a stale socket of an earlier run

    def path_for(self, uid: int | None) -> Path:
        return self.root / str(os.getuid() if uid is None else uid) / SOCKET_NAME

    def addr_for(self, uid: int | None) -> str:
        """The socket's gRPC address (one per uid, made once: every launch asks)."""
        addr = self._addrs.get(uid)
        if addr is None:
            addr = self._addrs[uid] = f"unix:{self.path_for(uid)}"
        return addr

    def hand_over(self) -> None:
        """Once listening: each socket belongs to its uid, mode 0600."""
        for uid in self.uids:
            path = self.path_for(uid)
            os.chmod(path, 0o600)
            if uid != os.getuid():
                os.chown(path, uid, -1)

    def close(self) -> None:
        for uid in self.uids:
            self.path_for(uid).unlink(missing_ok=True)
        if self._owned_root:
            shutil.rmtree(self.root, ignore_errors=True)
        if self._lock is not None:
            self._lock.release()


async def start_worker_server(register: Callable[[grpc.aio.Server], None], sockets: WorkerSockets) -> grpc.aio.Server:
    """A grpc.aio server with the worker servicer only (no health, no reflection)."""
    server = grpc.aio.server(
        # No caller credential here: every call carries its attempt's worker token, checked by the servicer.
        interceptors=[ServiceInterceptor(auth=None)],
        options=[("grpc.max_receive_message_length", 4 * 1024 * 1024)],
    )
    register(server)
    for uid in sockets.uids:
        if server.add_insecure_port(sockets.addr_for(uid)) == 0:
            raise RuntimeError(f"cannot listen on {sockets.addr_for(uid)}")
    await server.start()
    sockets.hand_over()
    return server
