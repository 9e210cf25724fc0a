"""Reading one process's figures: the agent's only contact with the host's processes.

Two readers with one contract (``sampler.Reader``); the agent uses ``ProcfsReader``.

``ProcfsReader`` (the default) reads /proc/<pid>/io and then /proc/<pid>/stat
directly: CPU is taken from stat in clock ticks as the kernel keeps it (no
conversion), I/O from io. Reading stat *after* io is the identity fence: if the
start time in that stat is the expected one, the io read before it was of the
same process (a reused pid never gets the old start time back). About 20 µs
per process, a third of the psutil path below.

``PsutilReader`` reads the same figures inside ``psutil.Process.oneshot()``
(``cpu_times()`` + ``io_counters()``); psutil reports CPU in seconds, converted
back to clock ticks with ``os.sysconf("SC_CLK_TCK")`` (psutil divided the
kernel's tick counts by the same value, so the round trip is exact); the start
time is re-read afterwards as the fence. Kept as the portable reference the
benchmark and a test compare against.

Both report *inclusive* figures: user = utime + cutime, system = stime + cstime
(children the process reaped), and /proc/<pid>/io, which already folds reaped
children in; see ``sampler``. Nothing reads argv or the environment.
"""

from __future__ import annotations

import errno
import os
from collections import OrderedDict

import psutil

from libs import proctree
from services.telemetry_agent.domain import Figures

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
# psutil.Process objects are kept per (pid, start time) to skip their setup on
# every sample; this bounds how many.
MAX_CACHED = 8192


def ticks(seconds: float, clk_tck: int = CLK_TCK) -> int:
    return round(seconds * clk_tck)


def _io_fields(data: bytes) -> dict[bytes, int]:
    fields = {}
    for line in data.splitlines():
        name, _, value = line.partition(b": ")
        if value:
            fields[name] = int(value)
    return fields


class ProcfsReader:
    def read(self, pid: int, start_time: int) -> Figures:
        try:
            with open(f"/proc/{pid}/io", "rb") as f:
                io_data = f.read()
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat_data = f.read()
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EPERM):
                raise psutil.AccessDenied(pid) from exc
            raise psutil.NoSuchProcess(pid) from exc  # ENOENT, ESRCH: gone
        # The command name may hold spaces and parentheses: split after the last ')'.
        rest = stat_data[stat_data.rindex(b")") + 2 :].split()
        if int(rest[19]) != start_time:
            raise psutil.NoSuchProcess(pid, msg=f"pid {pid} is no longer the process started at {start_time}")
        io = _io_fields(io_data)
        return Figures(
            cpu_user_ticks=int(rest[11]) + int(rest[13]),
            cpu_system_ticks=int(rest[12]) + int(rest[14]),
            read_count=io[b"syscr"],
            write_count=io[b"syscw"],
            read_bytes=io[b"rchar"],
            write_bytes=io[b"wchar"],
        )

    def pid_namespace(self, pid: int) -> int | None:
        return pid_namespace(pid)


class PsutilReader:
    def __init__(self, clk_tck: int = CLK_TCK, max_cached: int = MAX_CACHED) -> None:
        self._clk_tck = clk_tck
        self._max_cached = max_cached
        self._procs: OrderedDict[tuple[int, int], psutil.Process] = OrderedDict()

    def read(self, pid: int, start_time: int) -> Figures:
        key = (pid, start_time)
        proc = self._procs.get(key)
        if proc is None:
            proc = psutil.Process(pid)
            self._procs[key] = proc
            if len(self._procs) > self._max_cached:
                self._procs.popitem(last=False)
        else:
            self._procs.move_to_end(key)
        try:
            with proc.oneshot():
                cpu = proc.cpu_times()
                io = proc.io_counters()
        except psutil.NoSuchProcess:
            self._procs.pop(key, None)
            raise
        if proctree.start_time_of(pid) != start_time:
            self._procs.pop(key, None)
            raise psutil.NoSuchProcess(pid, msg=f"pid {pid} is no longer the process started at {start_time}")
        tck = self._clk_tck
        return Figures(
            cpu_user_ticks=ticks(cpu.user, tck) + ticks(cpu.children_user, tck),
            cpu_system_ticks=ticks(cpu.system, tck) + ticks(cpu.children_system, tck),
            read_count=io.read_count,
            write_count=io.write_count,
            read_bytes=io.read_chars,
            write_bytes=io.write_chars,
        )

    def pid_namespace(self, pid: int) -> int | None:
        return pid_namespace(pid)


def pid_namespace(pid: int) -> int | None:
    """The inode of /proc/<pid>/ns/pid (equal inodes: the same pid namespace)."""
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino
    except FileNotFoundError as exc:
        if not os.path.exists("/proc/self/ns/pid"):
            return None  # a kernel without pid namespaces
        raise psutil.NoSuchProcess(pid) from exc
    except PermissionError as exc:
        raise psutil.AccessDenied(pid) from exc
