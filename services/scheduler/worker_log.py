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
Logs not written to for ``[tasks] worker_log_retention_ms`` are deleted (``prune``):
one file per attempt would otherwise fill the disk at the rates the scheduler runs.
"""

from __future__ import annotations

import errno
import functools
import os
import re
import stat
from collections.abc import Callable, Container
from dataclasses import dataclass
from pathlib import Path

from libs.errors import FailedPrecondition
from libs.ids import UUID_HEX_PATTERN
from libs.settings import resolved_dir
from services.scheduler.domain import InvalidArgument

MAX_TAIL_BYTES = 65536
DEFAULT_TAIL_BYTES = 16384


def attempt_log_path(data_dir: Path, task_id: str, number: int) -> Path:
    return _workers_log_dir(data_dir) / f"{task_id}.attempt-{number}.log"


@functools.lru_cache(maxsize=16)
def _workers_log_dir(data_dir: Path) -> Path:
    """Where the attempts' logs go, joined once: every launch asks, and each pathlib join costs
    a few µs."""
    return resolved_dir(data_dir) / "logs" / "workers"


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
    # No log, and the attempt ended longer ago than the log retention: it was deleted.
    expired: bool = False

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


def log_expired(ended_at: int | None, retention_ms: int, now_ms: int) -> bool:
    """Whether an attempt's log is past the retention: the attempt ended (its log's last
    write) longer ago than ``retention_ms`` (0: logs are kept)."""
    return bool(retention_ms) and ended_at is not None and now_ms - ended_at > retention_ms


def read_tail(data_dir: Path, task_id: str, number: int, tail_bytes: int, expired: bool = False) -> LogTail:
    """The last ``tail_bytes`` of an attempt's log (blocking: call it from a thread).
    A log that does not exist (yet, or any more) reads as empty, ``expired`` when the
    retention has deleted it; a log that is not a regular file, or reached through a
    symlink, is refused."""
    tail = _read_tail(attempt_log_path(data_dir, task_id, number), number, tail_bytes)
    if tail is None:
        tail = _read_tail(legacy_attempt_log_path(data_dir, task_id, number), number, tail_bytes)
    return tail or LogTail(number, b"", 0, expired=expired)


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


@dataclass(frozen=True)
class Pruned:
    files: int = 0
    bytes: int = 0
    kept_live: int = 0  # old enough, but their task runs now


# The names the scheduler gives logs: <task id>.attempt-<n>.log in logs/workers, and an older
# version's logs/<task id>/attempt-<n>.log. Nothing else in those folders is touched.
_LOG_NAME = re.compile(r"(?P<task_id>.{32})\.attempt-[0-9]+\.log")
_LEGACY_NAME = re.compile(r"attempt-[0-9]+\.log")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def prune(
    data_dir: Path, older_than_s: float, live: Container[str], stop: Callable[[], bool] = lambda: False
) -> Pruned:
    """(Blocking.) Delete worker logs last written before ``older_than_s`` (epoch seconds),
    except those of a task in ``live``; an older version's per-task folders go once empty.

    A worker that can write into these folders must not aim the deletion anywhere else: every
    folder is opened without following a symlink and every name resolved in its descriptor;
    only files named as the scheduler names logs are unlinked — a regular file, or a link
    itself, never its target. ``stop`` is asked now and then (a shutdown ends a long pass)."""
    try:
        logs_fd = os.open(resolved_dir(data_dir) / "logs", _DIR_FLAGS)
    except OSError:
        return Pruned()  # no logs yet (or not a folder of ours)
    files = size = kept = 0
    try:
        for name in os.listdir(logs_fd):
            if stop():
                break
            if name == "workers":
                found = _prune_folder(logs_fd, name, older_than_s, live, _task_of, stop)
            elif UUID_HEX_PATTERN.match(name):  # a task id
                found = _prune_folder(
                    logs_fd, name, older_than_s, live, functools.partial(_legacy_task, task_id=name), stop
                )
                try:
                    os.rmdir(name, dir_fd=logs_fd)  # only once empty
                except OSError:
                    pass
            else:
                continue
            files, size, kept = files + found[0], size + found[1], kept + found[2]
    finally:
        os.close(logs_fd)
    return Pruned(files, size, kept)


def _task_of(name: str) -> str | None:
    match = _LOG_NAME.fullmatch(name)
    return match["task_id"] if match and UUID_HEX_PATTERN.match(match["task_id"]) else None


def _legacy_task(name: str, task_id: str) -> str | None:
    return task_id if _LEGACY_NAME.fullmatch(name) else None


def _prune_folder(
    parent_fd: int,
    folder: str,
    older_than_s: float,
    live: Container[str],
    task_of: Callable[[str], str | None],
    stop: Callable[[], bool],
) -> tuple[int, int, int]:
    try:
        dir_fd = os.open(folder, _DIR_FLAGS, dir_fd=parent_fd)
    except OSError:
        return 0, 0, 0  # gone, or not a folder (a symlink is not followed)
    files = size = kept = 0
    try:
        # scandir, not listdir: the names come in pages (a folder of millions is never one list).
        with os.scandir(dir_fd) as entries:
            for seen, entry in enumerate(entries):
                if seen % 1024 == 1023 and stop():
                    break
                name = entry.name
                task_id = task_of(name)
                if task_id is None:
                    continue  # not a log's name
                try:
                    info = entry.stat(follow_symlinks=False)  # fstatat in the folder's descriptor
                except OSError:
                    continue
                if not (stat.S_ISREG(info.st_mode) or stat.S_ISLNK(info.st_mode)) or info.st_mtime >= older_than_s:
                    continue
                if task_id in live:
                    kept += 1
                    continue
                try:
                    os.unlink(name, dir_fd=dir_fd)
                except OSError:  # gone meanwhile, or replaced by a folder (not a log)
                    continue
                files += 1
                size += info.st_size
    finally:
        os.close(dir_fd)
    return files, size, kept
