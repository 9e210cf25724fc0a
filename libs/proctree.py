"""Reading the Linux process table from /proc, one pass at a time.

The kernel start time of a process (``/proc/<pid>/stat`` field 22, clock ticks
since boot) is its identity fence: a pid whose start time differs from the one
recorded is another process, whatever its number.
"""

from __future__ import annotations

import errno
import os
import signal
import time
from collections import defaultdict
from typing import NamedTuple

DEAD_STATES = frozenset({"Z", "X", "x"})


class ProcStat(NamedTuple):
    # A tuple, not a dataclass: a scan builds one per process, and a frozen dataclass's
    # __init__ cost as much as parsing the line.
    pid: int
    ppid: int
    pgid: int
    sid: int
    state: str
    start_time: int

    @property
    def alive(self) -> bool:
        return self.state not in DEAD_STATES


_STAT_FLAGS = os.O_RDONLY | os.O_CLOEXEC


def _parse(pid: int, data: bytes) -> ProcStat:
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    rest = data[data.rindex(b")") + 2 :].split(None, 20)
    return ProcStat(pid, int(rest[1]), int(rest[2]), int(rest[3]), rest[0].decode(), int(rest[19]))


def _read(path: str) -> bytes | None:
    """One ``stat`` line: open, one read, close (no buffered file object around three syscalls)."""
    try:
        fd = os.open(path, _STAT_FLAGS)
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    try:
        return os.read(fd, 4096)  # the line is far shorter: one read gets it whole
    except ProcessLookupError:  # the process was reaped between the open and the read
        return None
    finally:
        os.close(fd)


def read_stat(pid: int) -> ProcStat | None:
    data = _read(f"/proc/{pid}/stat")
    return _parse(pid, data) if data else None


def start_time_of(pid: int) -> int | None:
    stat = read_stat(pid)
    return stat.start_time if stat and stat.alive else None


_CLK_TCK = os.sysconf("SC_CLK_TCK")


def boot_ticks() -> int:
    """Now, in the unit of kernel start times (clock ticks since boot)."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * _CLK_TCK)


def identity_matches(pid: int, start_time: int) -> bool:
    """True while ``pid`` is alive and is still the process started at ``start_time``."""
    return start_time_of(pid) == start_time


# pidfd_send_signal's flag for the process group the target leads (Linux 6.9).
PIDFD_SIGNAL_PROCESS_GROUP = 1 << 2


def signal_identified(pid: int, start_time: int, sig: int, group: bool = False) -> bool:
    """Signal the process started at ``start_time`` — with ``group``, the process group it
    leads —, never whatever else holds ``pid`` by then; False when it is gone or ``pid`` is
    another process's. A check followed by ``os.kill(pid)`` hits a new holder if the process
    dies and its pid is reused in between; here a pidfd is opened first and the start time
    read after it, so the pidfd is that very process, and a signal through it reaches it or
    nothing. With ``group`` the kernel signals the group of that process (not of the number)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    try:
        if not identity_matches(pid, start_time):
            return False  # gone (a zombie too), or the pid was another process's at the open
        if not group:
            signal.pidfd_send_signal(fd, sig)
            return True
        sent = signal_led_group(fd, sig)
        if sent is None:
            # A kernel before 6.9, or no member this process may signal: by number, the window
            # this closes elsewhere (a refusal is raised from here as it always was).
            os.killpg(pid, sig)
            return True
        return sent  # False: the leader died since its identity was read
    except ProcessLookupError:
        return False
    finally:
        os.close(fd)


def signal_led_group(pidfd: int, sig: int) -> bool | None:
    """Signal the process group led by the process ``pidfd`` was opened on — even after that
    leader exited and was reaped: the kernel signals the group of its struct pid, which the
    pidfd keeps, never a group that took the same number later. ``sig`` 0 only asks.

    True: the group had members (zombies count) and got the signal; False: it has none left,
    and since a group that emptied can never regain members, none of it can come back; None:
    nothing could go through it — a kernel before Linux 6.9, or no member this process may
    signal — so the caller decides as it would without the pidfd."""
    try:
        signal.pidfd_send_signal(pidfd, sig, None, PIDFD_SIGNAL_PROCESS_GROUP)
    except ProcessLookupError:
        return False
    except PermissionError:
        return None
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            return None
        raise
    return True


class ProcessTable(dict[int, ProcStat]):
    """A read of every process by pid, with the moment the read began (``boot_ticks``):
    what it shows alive was alive at some moment from then on."""

    read_from: int | None = None


def process_table() -> ProcessTable:
    table = ProcessTable()
    table.read_from = boot_ticks()
    for name in os.listdir("/proc"):
        if name.isdigit():
            data = _read(f"/proc/{name}/stat")
            if data:
                pid = int(name)
                table[pid] = _parse(pid, data)
    return table


def orphan_parent_children() -> set[int]:
    """The pids of this process's main thread's children. A subreaper's orphans are re-parented
    to its first live thread — the main thread, while it runs (``find_new_reaper`` in the
    kernel's exit.c) —, so every orphan this process has is listed here, with the children the
    main thread forked itself (those of other threads are not: none of them is an orphan).
    OSError where the kernel keeps no such list (CONFIG_PROC_CHILDREN)."""
    return {int(pid) for pid in read_all(f"/proc/self/task/{os.getpid()}/children").split()}


def read_all(path: str) -> bytes:
    """A kernel file's content (``/proc``, cgroup control files) through the bare descriptor:
    a third of ``Path.read_text``'s CPU (no file object, no decoding). OSError as ``open``'s.
    These files fill each read as far as they can, so a short read is the end: one read, not
    a second one to find it."""
    fd = os.open(path, _STAT_FLAGS)
    try:
        data = b""
        while True:
            chunk = os.read(fd, _READ_SIZE)
            data += chunk
            if len(chunk) < _READ_SIZE:
                return data
    finally:
        os.close(fd)


_READ_SIZE = 65536


def kernel_answers_exits() -> bool:
    """Whether this kernel lists a thread's children (``orphan_parent_children``) and signals a group
    through a pidfd (``signal_led_group``, Linux 6.9): what an exit's proof without a table
    read needs (``processes.kernel_proof``)."""
    try:
        orphan_parent_children()
    except OSError:
        return False
    fd = os.pidfd_open(os.getpid())
    try:
        # Signal 0 to the group this process leads: none (ESRCH) or itself; EINVAL before 6.9.
        return signal_led_group(fd, 0) is not None
    finally:
        os.close(fd)


def children_map(table: dict[int, ProcStat]) -> dict[int, list[int]]:
    children: dict[int, list[int]] = defaultdict(list)
    for stat in table.values():
        children[stat.ppid].append(stat.pid)
    return children


def live_descendants(
    table: dict[int, ProcStat], root_pid: int, children: dict[int, list[int]] | None = None
) -> list[ProcStat]:
    """Live processes below ``root_pid`` (not including it), from one table snapshot."""
    children = children if children is not None else children_map(table)
    found: list[ProcStat] = []
    stack = list(children.get(root_pid, ()))
    seen: set[int] = set()
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        stat = table.get(pid)
        if stat is None:
            continue
        if stat.alive:
            found.append(stat)
        stack.extend(children.get(pid, ()))
    return found


def live_group_members(table: dict[int, ProcStat], pgid: int) -> list[ProcStat]:
    return [s for s in table.values() if s.pgid == pgid and s.alive]
