"""Thread names the kernel knows, so ``top -H``, ``ps -L``, ``perf`` and ``/proc/<pid>/task/*/comm``
tell a service's threads apart (CPython before 3.14 leaves every thread named after the program).

The names: the main thread (the event loop) after the service, the database threads ``db_<n>``,
the event loop's executor threads (spawns, process-table reads, files) ``asyncio_<n>``; gRPC's
C threads name themselves. A thread a library starts without naming it (gRPC's Python poller)
keeps the name of the thread that started it.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

_PR_SET_NAME = 15  # prctl(2): name the calling thread
_NAME_BYTES = 15  # the kernel keeps 16 bytes with the NUL

_libc: ctypes.CDLL | None = None


def name_os_thread(name: str) -> None:
    """Give the calling thread ``name`` (its first 15 bytes) in the kernel; nothing off Linux."""
    global _libc
    if not sys.platform.startswith("linux"):
        return
    try:
        if _libc is None:
            _libc = ctypes.CDLL(None, use_errno=True)
        _libc.prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:_NAME_BYTES]), 0, 0, 0)
    except (OSError, AttributeError):  # no prctl here: the names are a convenience
        pass


def name_after_python_thread() -> None:
    """Give the calling thread its Python name in the kernel (an executor's initializer)."""
    name_os_thread(threading.current_thread().name)


def name_loop_threads(main_name: str) -> None:
    """The calling (main) thread is named ``main_name``; the running loop's default executor is
    replaced by the same pool asyncio would make, whose threads name themselves as they start."""
    name_os_thread(main_name)
    loop = asyncio.get_running_loop()
    workers = min(32, (os.cpu_count() or 1) + 4)  # asyncio's own default
    loop.set_default_executor(
        ThreadPoolExecutor(workers, thread_name_prefix="asyncio", initializer=name_after_python_thread)
    )
