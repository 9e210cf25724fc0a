"""Helper commands the scheduler runs and waits for itself (git, a container engine's CLI).

The scheduler is a child subreaper and reaps children it does not know (a worker's orphans);
a helper's exit status belongs to the code awaiting it, so while helpers run, children that
started since the earliest of them are neither reaped nor taken for orphans (``Ownership``).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from libs import proctree

_lock = threading.Lock()  # the supervisor reads the floor from a thread
_running: dict[int, int] = {}  # helper key -> boot tick just before its fork
_keys = itertools.count()


@contextmanager
def running() -> Iterator[None]:
    """Around spawning and awaiting one helper command."""
    key = next(_keys)
    with _lock:
        _running[key] = proctree.boot_ticks() - 1
    try:
        yield
    finally:
        with _lock:
            _running.pop(key, None)


def floor() -> int | None:
    """The earliest boot tick a running helper may have forked at (None: none runs)."""
    with _lock:
        return min(_running.values(), default=None)
