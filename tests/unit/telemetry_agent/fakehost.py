"""A fake process table and reader for the sampler: processes, forks, exits, reaps."""

from __future__ import annotations

from dataclasses import dataclass, field

import psutil

from libs.proctree import ProcStat
from services.telemetry_agent.domain import Figures


@dataclass
class FakeProc:
    pid: int
    ppid: int
    start_time: int
    figures: Figures = field(default_factory=Figures)
    state: str = "S"
    denied: bool = False
    ns: int = 1


class FakeHost:
    def __init__(self) -> None:
        self.procs: dict[int, FakeProc] = {}
        self.table_calls = 0
        self.reads: list[int] = []
        self.now = 1_000

    # -- the Sampler's view -----------------------------------------------------------------------

    def table(self) -> dict[int, ProcStat]:
        self.table_calls += 1
        return {
            p.pid: ProcStat(pid=p.pid, ppid=p.ppid, pgid=p.pid, sid=p.pid, state=p.state, start_time=p.start_time)
            for p in self.procs.values()
        }

    def read(self, pid: int, start_time: int) -> Figures:
        self.reads.append(pid)
        proc = self.procs.get(pid)
        if proc is None or proc.start_time != start_time or proc.state == "Z":
            raise psutil.NoSuchProcess(pid)
        if proc.denied:
            raise psutil.AccessDenied(pid)
        return proc.figures

    def pid_namespace(self, pid: int) -> int | None:
        proc = self.procs.get(pid)
        return proc.ns if proc is not None else 1

    def clock(self) -> int:
        self.now += 1_000
        return self.now

    # -- what processes do ------------------------------------------------------------------------

    def spawn(self, pid: int, ppid: int = 1, start_time: int | None = None, **figures: int) -> FakeProc:
        proc = FakeProc(pid, ppid, start_time if start_time is not None else pid * 10, Figures(**figures))
        self.procs[pid] = proc
        return proc

    def work(self, pid: int, **delta: int) -> None:
        proc = self.procs[pid]
        proc.figures = proc.figures + Figures(**delta)

    def exit(self, pid: int) -> None:
        """The process ends: a zombie until its parent reaps it; its children go to init."""
        self.procs[pid].state = "Z"
        for child in self.procs.values():
            if child.ppid == pid and child.pid != pid:
                child.ppid = 1

    def reap(self, pid: int) -> None:
        """The parent waits: the kernel folds the child's figures into the parent's."""
        child = self.procs.pop(pid)
        parent = self.procs.get(child.ppid)
        if parent is not None and parent.pid != 1:
            parent.figures = parent.figures + child.figures

    def autoreap(self, pid: int) -> None:
        """A parent that ignores SIGCHLD: the child is released and nothing folds in."""
        self.procs.pop(pid)
