"""What the telemetry agent talks about: watches, figures, observations; their rules.

Free of grpc and psutil. Times are wall-clock milliseconds since the epoch;
process start times are kernel clock ticks since boot (/proc/<pid>/stat field 22).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from libs import errors

# Why an observation has no figures (ExecutionObservation.reason).
NOT_LINUX = "NOT_LINUX"
ACCESS_DENIED = "ACCESS_DENIED"
OTHER_PID_NAMESPACE = "OTHER_PID_NAMESPACE"
IDENTITY_MISMATCH = "IDENTITY_MISMATCH"
PROCESS_NOT_FOUND = "PROCESS_NOT_FOUND"

MAX_TASK_ID_CHARS = 128
_TASK_ID = re.compile(rf"[A-Za-z0-9._:-]{{1,{MAX_TASK_ID_CHARS}}}")
# Linux caps pid_max at 2**22.
MAX_PID = 1 << 22
MAX_WATCHES = 10_000
DEFAULT_PAGE_SIZE = 1000
MAX_PAGE_SIZE = 1000


class InvalidArgument(errors.InvalidArgument):
    pass


class ResourceExhausted(errors.ResourceExhausted):
    pass


@dataclass(frozen=True, order=True)
class Member:
    """One process, named by pid and kernel start time (its identity)."""

    pid: int
    start_time: int


@dataclass(frozen=True)
class Watch:
    task_id: str
    pid: int
    start_time: int

    @property
    def root(self) -> Member:
        return Member(self.pid, self.start_time)


@dataclass(frozen=True)
class WatchEntry:
    watch: Watch
    created_at: int


@dataclass(frozen=True, slots=True)
class Figures:
    """Cumulative counters of one process or a sum over a tree.

    CPU in clock ticks; I/O as /proc/<pid>/io syscr, syscw, rchar, wchar.
    """

    cpu_user_ticks: int = 0
    cpu_system_ticks: int = 0
    read_count: int = 0
    write_count: int = 0
    read_bytes: int = 0
    write_bytes: int = 0

    def _values(self) -> tuple[int, int, int, int, int, int]:
        return (
            self.cpu_user_ticks,
            self.cpu_system_ticks,
            self.read_count,
            self.write_count,
            self.read_bytes,
            self.write_bytes,
        )

    def __add__(self, other: Figures) -> Figures:
        return Figures(*(a + b for a, b in zip(self._values(), other._values(), strict=True)))

    def minus(self, other: Figures) -> Figures:
        """Counter by counter, never below zero."""
        return Figures(*(max(0, a - b) for a, b in zip(self._values(), other._values(), strict=True)))

    def cap(self, other: Figures) -> Figures:
        """Counter by counter, the smaller of the two."""
        return Figures(*(min(a, b) for a, b in zip(self._values(), other._values(), strict=True)))

    def any(self) -> bool:
        return any(self._values())


ZERO = Figures()


@dataclass(frozen=True)
class Observation:
    task_id: str
    root: Member
    observed_at: int
    available: bool
    # Set only when available is False.
    reason: str | None = None
    reason_detail: str | None = None
    # Set only when available is True.
    figures: Figures | None = None
    # Live members, the root first; empty once ended.
    members: tuple[Member, ...] = ()
    last_activity_at: int | None = None
    ended: bool = False

    def is_of(self, watch: Watch) -> bool:
        return self.task_id == watch.task_id and self.root == watch.root


def validate_task_id(task_id: str) -> str:
    if not _TASK_ID.fullmatch(task_id):
        raise InvalidArgument(
            "INVALID_TASK_ID",
            f"task_id must be 1-{MAX_TASK_ID_CHARS} characters of A-Z a-z 0-9 . _ : -",
            field="task_id",
        )
    return task_id


def validate_watch(task_id: str, pid: int, start_time: int) -> Watch:
    validate_task_id(task_id)
    if not 2 <= pid <= MAX_PID:
        # pid 1 is init: its "tree" is every process of the host.
        raise InvalidArgument("INVALID_PID", f"pid must be 2-{MAX_PID}", field="pid")
    if start_time <= 0:
        raise InvalidArgument(
            "INVALID_PID_START_TIME",
            "pid_start_time (clock ticks since boot, /proc/<pid>/stat field 22) is required",
            field="pid_start_time",
        )
    return Watch(task_id, pid, start_time)


@dataclass(frozen=True)
class PageRequest:
    size: int
    after_task_id: str | None


def validate_page(page_size: int, page_token: str) -> PageRequest:
    if page_size < 0 or page_size > MAX_PAGE_SIZE:
        raise InvalidArgument("INVALID_PAGE_SIZE", f"page_size must be 0-{MAX_PAGE_SIZE}", field="page_size")
    after = None
    if page_token:
        # The token is the last task id of the previous page.
        if not _TASK_ID.fullmatch(page_token):
            raise InvalidArgument("INVALID_PAGE_TOKEN", "page_token is not one this service issued", field="page_token")
        after = page_token
    return PageRequest(page_size or DEFAULT_PAGE_SIZE, after)


def page_of(entries: list[WatchEntry], req: PageRequest) -> tuple[list[WatchEntry], str]:
    ordered = sorted(entries, key=lambda e: e.watch.task_id)
    if req.after_task_id is not None:
        ordered = [e for e in ordered if e.watch.task_id > req.after_task_id]
    page = ordered[: req.size]
    next_token = page[-1].watch.task_id if len(ordered) > req.size else ""
    return page, next_token
