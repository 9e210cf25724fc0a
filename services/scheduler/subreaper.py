"""The scheduler as child subreaper: orphaned worker descendants stay visible.

With ``PR_SET_CHILD_SUBREAPER`` a process that loses its parent (a double fork,
with or without ``setsid``) is re-parented to the scheduler instead of init, so
it can still be found and attributed to an attempt. Such orphans become the
scheduler's zombies when they exit; ``reap`` collects them one pid at a time and
never touches the worker leaders, whose exit status belongs to their
``processes.WorkerProcess`` (a pidfd, then ``waitpid`` of that one pid).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Collection

from libs import proctree

PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return bool(libc.prctl(option, value, 0, 0, 0) == 0)
    except OSError:
        return False


def become() -> bool:
    """Make this process the subreaper of its descendants; False where Linux refuses."""
    return _prctl(PR_SET_CHILD_SUBREAPER, 1)


def resign() -> None:
    _prctl(PR_SET_CHILD_SUBREAPER, 0)


def orphans(table: dict[int, proctree.ProcStat], leaders: Collection[int]) -> list[proctree.ProcStat]:
    """Live processes re-parented to this one: our children that are not worker leaders."""
    me = os.getpid()
    return [s for s in table.values() if s.ppid == me and s.alive and s.pid not in leaders]


def reap(table: dict[int, proctree.ProcStat], reapable: Collection[tuple[int, int]]) -> list[int]:
    """Collect zombie children whose identity (pid, start time) is in ``reapable``.

    ``reapable`` holds only processes known to be re-parented descendants (never
    a leader, never a child some other code of this process waits for), so no
    exit status is stolen. A zombie keeps its pid, so the pid cannot be reused
    between reading the table and ``waitpid``.
    """
    me = os.getpid()
    reaped = []
    for stat in table.values():
        if stat.ppid == me and not stat.alive and (stat.pid, stat.start_time) in reapable:
            try:
                pid, _ = os.waitpid(stat.pid, os.WNOHANG)
            except ChildProcessError:
                continue
            if pid:
                reaped.append(pid)
    return reaped
