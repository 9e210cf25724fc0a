"""What every process does first: stop signals, settings (or a clear exit), logging, its database."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import gc
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path

from libs.db import Database
from libs.internal_auth import SecretsMissing, load_caller_auth
from libs.log import configure_logging, get_logger
from libs.settings import Settings, SettingsError, load_settings
from libs.thread_names import name_loop_threads


def boot(service: str, environ: Mapping[str, str], one_per_data_dir: bool = False) -> Settings:
    """Validated settings with logging configured; exits naming each bad setting otherwise.
    ``one_per_data_dir``: exits as well while another process of ``service`` runs on the same
    data directory (see ``hold_data_dir``)."""
    try:
        settings = load_settings(environ)
        # Every process calls or serves internal gRPC: without the caller secrets it cannot start.
        load_caller_auth(settings.secrets_path, settings.configured_secrets())
    except (SettingsError, SecretsMissing) as exc:
        sys.exit(f"{service}: {exc}")
    configure_logging(service, settings.log_level, settings.log_format)
    secure_data_dir(settings.data_dir)
    if one_per_data_dir:
        try:
            hold_data_dir(settings.data_dir, service)
        except FolderInUse as exc:
            get_logger(service).error("data_dir_in_use", error=str(exc))
            sys.exit(f"{service}: {exc}")
        except OSError as exc:  # e.g. a read-only data directory, or the lock file is a symlink
            sys.exit(f"{service}: cannot lock the data directory: {exc}")  # the error names the file
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # a synchronous caller: no loop threads to name
        pass
    else:
        name_loop_threads(service)
    return settings


class FolderInUse(Exception):
    """Another live process of the service holds the folder (``holder``: its pid as its lock
    file says, or "unknown")."""

    def __init__(self, message: str, holder: str) -> None:
        super().__init__(message)
        self.holder = holder


class FolderLock:
    """An exclusive ``flock`` on ``<folder>/<name>.lock``, held until ``release`` or the
    process's death."""

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


# The data-directory locks taken at boot: held for the life of the process.
_HELD: list[FolderLock] = []


def hold_data_dir(data_dir: Path, service: str) -> None:
    """Take ``<data dir>/<service>.lock`` for the life of this process, or raise FolderInUse
    naming the holder's pid. Two schedulers on one data directory would both take its workers,
    cgroups and SQLite tasks for their own (on any database: recovery stops what it finds); two
    notifiers would deliver each report twice; two pending registries would split the live
    picks."""
    _HELD.append(hold_folder(data_dir, service))


def hold_folder(
    folder: Path, name: str, what: str = "the data directory", setting: str = "TASKGATE_DATA_DIR"
) -> FolderLock:
    """Take ``<folder>/<name>.lock`` (an exclusive ``flock``), or raise FolderInUse naming the
    holder's pid, ``what`` the folder is and the ``setting`` that gives each process its own.
    The kernel drops the lock when the process dies, however (SIGKILL too), so a restart never
    waits on a stale file; the descriptor is close-on-exec, so no worker keeps it, and a lock
    file planted as a symlink is refused (O_NOFOLLOW) rather than followed."""
    path = folder / f"{name}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise FolderInUse(
            f"another {name} process (pid {holder}) runs on {what} {folder}; give each one its own {setting}",
            holder,
        ) from None
    except BaseException:
        os.close(fd)
        raise
    # The pid is for the message above; the lock, not the file's content, says who holds it.
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return FolderLock(fd)


def secure_data_dir(data_dir: Path) -> None:
    """Only this uid may read or write what a service keeps: the data directory is
    0700, and everything the process creates from now on (databases, their WAL
    files, logs) is private (umask 077). Files of an older version are tightened too.
    """
    os.umask(0o077)
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(data_dir, 0o700)
    for path in data_dir.iterdir():
        try:
            if path.is_file() and not path.is_symlink():
                os.chmod(path, 0o600)
            elif path.is_dir() and not path.is_symlink():
                os.chmod(path, 0o700)
        except FileNotFoundError:
            pass  # another service's file that just went away (a WAL checkpoint)


# The youngest generation is collected after this many net allocations of container objects
# (CPython's default: 700). A service's bursts (a batch of rows, a gRPC message's conversion)
# crossed 700 about 190 times per 1,000 tasks in the scheduler; at 10,000 a couple of times.
YOUNG_GENERATION_THRESHOLD = 10_000


def settle_heap() -> None:
    """Once a service has started: leave what start-up built out of garbage collection.

    The modules, settings and servers a process builds at start-up live until it exits,
    yet each full collection walked all of them (≈ 90,000 objects, 40-60 ms with the
    event loop stopped, two or three times per 1,000 tasks in the scheduler). After
    ``gc.freeze()`` a collection walks only what was made since; garbage made at
    start-up is collected first so it is not kept for good. Measured in the scheduler
    over an N=1000 throughput run: 165 ms of collections before, 71 ms with the freeze,
    6 ms with the freeze and the higher threshold below.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_GENERATION_THRESHOLD, 20, 20)


async def migrate(db: Database) -> None:
    """Apply the service's pending migrations (off the event loop) and say so."""
    applied = await asyncio.to_thread(db.migrate)
    get_logger("db").info(
        "database_ready", url=db.engine.url.render_as_string(hide_password=True), migrations_applied=applied
    )


class StopSignal:
    """SIGTERM/SIGINT, handled from a process's first moment.

    Installed before settings, migrations and recovery, so a stop that arrives
    during start-up is not the default (abrupt) death: start-up finishes its
    current step and the process shuts down gracefully instead of serving.
    """

    def __init__(self) -> None:
        self._event = asyncio.Event()

    @classmethod
    def install(cls) -> StopSignal:
        stop = cls()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop._received, sig)
        return stop

    def _received(self, sig: signal.Signals) -> None:
        first = not self._event.is_set()
        self._event.set()  # before logging: a stop must work even when stdout is gone (EPIPE)
        if first:
            with contextlib.suppress(OSError):
                get_logger("startup").info("stop_signal_received", signal=sig.name)

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    async def wait(self) -> None:
        await self._event.wait()
