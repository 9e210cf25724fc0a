"""Worker logs: where the scheduler writes an attempt's stdout and stderr, and a bounded tail of it.

Each attempt's output goes to ``<data dir>/logs/workers/<task id>.attempt-<n>.log``
(see ``launch``): one file per attempt in one folder, not a folder per task — a
folder per task cost an inode allocation (a mkdir) per launch, as much as the
file itself. The scheduler creates a log without following a symlink (a worker
cannot aim its next attempt's output at another file), 0600 in a 0700 folder.
Logs of older versions (``logs/<task id>/attempt-<n>.log``) are still read.
Readers get at most ``MAX_TAIL_BYTES`` from its end, read without following a
symlink: a worker running as the scheduler's uid can write into that folder,
and must not turn its log into a window on another file (a caller secret).
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from libs.errors import FailedPrecondition
from libs.settings import resolved_dir
from services.scheduler.domain import InvalidArgument

MAX_TAIL_BYTES = 65536
DEFAULT_TAIL_BYTES = 16384


def attempt_log_path(data_dir: Path, task_id: str, number: int) -> Path:
    return resolved_dir(data_dir) / "logs" / "workers" / f"{task_id}.attempt-{number}.log"


def legacy_attempt_log_path(data_dir: Path, task_id: str, number: int) -> Path:
    """Where versions before the one folder wrote an attempt's log."""
    return resolved_dir(data_dir) / "logs" / task_id / f"attempt-{number}.log"


def open_for_worker(path: Path) -> int:
    """(Blocking.) The attempt's log, opened for the worker's output (0600; the folder 0700 if new).

    Never through a symlink; the folder is made only when the open finds it missing, so a
    launch costs one open, not a mkdir too.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        return os.open(path, flags, 0o600)
    except FileNotFoundError:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        return os.open(path, flags, 0o600)


@dataclass(frozen=True)
class LogTail:
    attempt_number: int  # 0: the task has no attempt (no log)
    content: bytes
    size_bytes: int

    @property
    def truncated(self) -> bool:
        return self.size_bytes > len(self.content)


def validate_tail_request(attempt_number: int, tail_bytes: int) -> int:
    """The number of bytes to read (the default for 0); refuses what is out of bounds."""
    if attempt_number < 0:
        raise InvalidArgument("INVALID_ATTEMPT", "attempt_number must be 0 (latest) or more", field="attempt_number")
    if tail_bytes < 0 or tail_bytes > MAX_TAIL_BYTES:
        raise InvalidArgument(
            "INVALID_TAIL_BYTES", f"tail_bytes must be 1-{MAX_TAIL_BYTES} (0: the default)", field="tail_bytes"
        )
    return tail_bytes or DEFAULT_TAIL_BYTES


def read_tail(data_dir: Path, task_id: str, number: int, tail_bytes: int) -> LogTail:
    """The last ``tail_bytes`` of an attempt's log (blocking: call it from a thread).
    A log that does not exist (yet, or any more) reads as empty; a log that is not a
    regular file, or reached through a symlink, is refused."""
    tail = _read_tail(attempt_log_path(data_dir, task_id, number), number, tail_bytes)
    if tail is None:
        tail = _read_tail(legacy_attempt_log_path(data_dir, task_id, number), number, tail_bytes)
    return tail or LogTail(number, b"", 0)


def _read_tail(path: Path, number: int, tail_bytes: int) -> LogTail | None:
    """None: no log there."""
    nofollow = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        dir_fd = os.open(path.parent, nofollow | os.O_DIRECTORY)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _not_a_log(exc) from exc
    try:
        fd = os.open(path.name, nofollow | os.O_NONBLOCK, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _not_a_log(exc) from exc
    finally:
        os.close(dir_fd)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise FailedPrecondition("WORKER_LOG_UNREADABLE", "the worker log is not a regular file")
        start = max(0, info.st_size - tail_bytes)
        content = os.pread(fd, info.st_size - start, start)
        return LogTail(number, content, info.st_size)
    finally:
        os.close(fd)


def _not_a_log(exc: OSError) -> FailedPrecondition:
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        return FailedPrecondition("WORKER_LOG_UNREADABLE", "the worker log is a symlink; it is not followed")
    name = errno.errorcode.get(exc.errno or 0, "error")
    return FailedPrecondition("WORKER_LOG_UNREADABLE", f"the worker log cannot be read ({name})")
