"""Worker processes: launch held in a new session, stop with identity checks, prove exit.

What "stopped" means here: no live process remains in the worker's process
group, in the attempt's cgroup (cgroup mode), among its recorded descendants
(pid + kernel start time, also those that left the group with ``setsid``), and
no orphan re-parented to the scheduler (the child subreaper) that may be the
attempt's. taskgate signals the attempt's own group, its cgroup and its recorded
descendants whose identity still matches — never any other pid.

Launch: the worker starts as a tiny trampoline that waits on a pipe before it
execs the command (``taskgate-hold``, a C program without a C library, or the same
steps in ``sh``: ``choose_hold``). While it waits, the scheduler puts it into the
attempt's cgroup and records its identity; only then is it released. If the
scheduler dies first, the pipe closes and the trampoline exits without running
anything. The worker token travels through an inherited pipe (read once by the
SDK), never through the environment (``/proc/<pid>/environ``).
"""

from __future__ import annotations

import asyncio
import contextlib
import grp
import os
import pwd
import resource
import shutil
import signal
import stat as file_mode
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import structlog

from libs import proctree
from libs.settings import WorkerProfile
from services.scheduler import cgroups, worker_log
from services.scheduler.domain import Attempt, ProcessIdentity
from services.scheduler.spawner import STAGE_WORKSPACE, TOKEN_FD, SpawnHelper, SpawnHelperGone, SpawnRequestTooLarge

log = structlog.get_logger("scheduler")

POLL_S = 0.02
TOKEN_FD_ENV = "TASKGATE_WORKER_TOKEN_FD"
# Exit status of a trampoline whose launch was abandoned (nothing was exec'd).
ABANDONED = 111
# $0 names the trampoline in `ps`; stdin is the hold pipe until the exec; the
# shell's own PWD stays out of the worker's allow-listed environment.
TRAMPOLINE = f'read -r go && [ "$go" = go ] || exit {ABANDONED}; unset PWD; exec "$@" </dev/null'
SH_HOLD: tuple[str, ...] = ("/bin/sh", "-c", TRAMPOLINE, "taskgate-launch")
# The same steps compiled (hold/taskgate-hold.c, built by `make`): the shell's start-up — the
# dynamic loader and glibc's CPU probing — cost the machine ~0.7 ms per task on a VM that
# traps CPUID, the compiled hold ~0.1 ms.
HOLD_PROGRAM = Path(__file__).resolve().parent / "hold" / "taskgate-hold"
# Switches to the profile's user, then execs the trampoline. It runs in the fresh,
# single-threaded process of an exec, never between fork and exec in the scheduler:
# asking `subprocess` for user=/group=/extra_groups= makes CPython fork() (not
# vfork()) the multi-threaded scheduler, and gRPC's atfork handlers then run in the
# child before its exec, where they crash it (SIGSEGV) or hang it — and a hung child
# blocks its spawn inside Popen for good. -I -S: nothing is imported from the workspace
# (the cwd) or the environment while still root.
SWITCH_USER = (
    "import os, sys\n"
    "uid, gid = int(sys.argv[1]), int(sys.argv[2])\n"
    "try:\n"
    "    if os.geteuid() == 0:\n"
    "        os.setgroups([])\n"
    "    os.setresgid(gid, gid, gid)\n"
    "    os.setresuid(uid, uid, uid)\n"
    "    os.execv(sys.argv[3], sys.argv[3:])\n"
    "except OSError as exc:\n"
    "    sys.stderr.write(f'taskgate-launch: cannot run as uid {uid} gid {gid}: {exc}\\n')\n"
    f"    os._exit({ABANDONED})\n"
)


class LaunchFailed(OSError):
    """The held worker is gone before its release: nothing of the command ran."""


@dataclass(frozen=True)
class RunAs:
    uid: int
    gid: int
    home: str


def resolve_profiles(profiles: Mapping[str, WorkerProfile]) -> tuple[dict[str, RunAs | None], dict[str, str]]:
    """Who each profile's workers run as, and why a profile cannot be launched here (said at start-up)."""
    run_as: dict[str, RunAs | None] = {}
    cannot: dict[str, str] = {}
    for name, profile in profiles.items():
        try:
            run_as[name] = resolve_user(profile.user, profile.group)
        except KeyError as exc:
            cannot[name] = f"unknown user or group {exc.args[0]}"
            log.error("worker_user_unknown", profile=name, detail=cannot[name])
            continue
        wanted = run_as[name]
        if wanted is not None and os.geteuid() != 0 and wanted.uid != os.geteuid():
            cannot[name] = "the scheduler does not run as root, so it cannot switch users"
            log.error("worker_user_switch_impossible", profile=name, user=profile.user, uid=os.geteuid())
    return run_as, cannot


def resolve_user(user: str | None, group: str | None) -> RunAs | None:
    """The uid/gid of a profile's ``user``/``group``; KeyError names an unknown one."""
    if user is None and group is None:
        return None
    entry = pwd.getpwnam(user) if user is not None else pwd.getpwuid(os.getuid())
    gid = grp.getgrnam(group).gr_gid if group is not None else entry.pw_gid
    return RunAs(uid=entry.pw_uid, gid=gid, home=entry.pw_dir)


# The exit waits of workers whose launch failed (kept referenced until they end).
_abandoned: set[asyncio.Future[int]] = set()


class WorkerProcess:
    """A spawned worker whose exit is awaited through a pidfd on the event loop.

    No thread per child (asyncio's default child watcher on 3.11 keeps one blocked
    in ``waitpid`` per process). Only the leader's own pid is waited for; the
    subreaper reaps re-parented orphans by pid, never a leader.
    """

    def __init__(self, pid: int, pidfd: int | None = None, popen: subprocess.Popen[Any] | None = None) -> None:
        """``pidfd``: one already open on ``pid`` (taken over), else one is opened here;
        ``popen``: the ``subprocess`` object that spawned it, if any (kept: a collected Popen
        would reap the pid behind our back)."""
        self._popen = popen
        self.pid = pid
        self.returncode: int | None = None
        # Opened at once: the pid is still ours. The trampoline is held, and one that already
        # died (say it could not switch users) is a zombie nobody reaps: the subreaper leaves
        # the children of a launch's fork window alone (``Ownership.reap``).
        self._pidfd = pidfd if pidfd is not None else os.pidfd_open(self.pid)
        self._done: asyncio.Future[int] | None = None
        # The attempt this process leads (set by the launcher): its group is marked held just
        # before the reap, the last moment the exited leader keeps the group id from reuse.
        self.attempt: Attempt | None = None

    def duplicate_pidfd(self) -> int:
        """A pidfd of the caller's own on this process (close-on-exec) to keep past its exit:
        this one is closed once the exit has been seen. Only before anything awaits the exit."""
        if self._pidfd < 0:
            raise RuntimeError("the process's exit was already awaited; its pidfd is closed")
        return os.dup(self._pidfd)

    def abandon(self) -> None:
        """Its launch failed, so nobody awaits it: reap it once it exits, as asyncio's watcher did.

        Never left to the collected Popen: ``subprocess`` would reap its pid at some later
        spawn, when the pid may already be another worker's.
        """
        if self._done is None:
            self._done = asyncio.ensure_future(self._wait())
            _abandoned.add(self._done)
            self._done.add_done_callback(_abandoned.discard)

    async def wait(self) -> int:
        """The exit status (negative: the signal), once the process has ended."""
        if self._done is None:
            self._done = asyncio.ensure_future(self._wait())
        return await asyncio.shield(self._done)

    async def _wait(self) -> int:
        loop = asyncio.get_running_loop()
        readable: asyncio.Future[None] = loop.create_future()

        def ready() -> None:
            if not readable.done():
                readable.set_result(None)

        loop.add_reader(self._pidfd, ready)
        try:
            await readable
        finally:
            loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = -1  # never dup'd again: the number may be another file's by then
        # Marked before the reap, so a look racing it never finds the leader gone unmarked:
        # until this process reaps it, the exited leader (a zombie) holds its group id.
        held_before = self.attempt.group_held_ticks if self.attempt is not None else None
        if self.attempt is not None:
            mark_group_held(self.attempt, proctree.boot_ticks())
        code = 255
        try:
            while True:
                # The pidfd is readable once the process has exited, so this returns at once.
                pid, status = os.waitpid(self.pid, os.WNOHANG)  # noqa: ASYNC222 (WNOHANG)
                if pid:
                    code = os.waitstatus_to_exitcode(status)
                    break
                await asyncio.sleep(POLL_S)
        except ChildProcessError:  # reaped by someone else: the status is lost
            log.warning("worker_exit_status_lost", pid=self.pid)
            if self.attempt is not None:  # and when its group id was freed is unknown: no mark
                self.attempt.group_held_ticks = held_before
        self.returncode = code
        if self._popen is not None:
            self._popen.returncode = code
        return code


@dataclass
class Launched:
    process: WorkerProcess
    pid: int
    pgid: int
    start_time: int | None
    go_fd: int | None
    by: str = "scheduler"  # what spawned it: "helper" (taskgate-spawn) or "scheduler" (a thread here)

    def release(self) -> None:
        """Let the held trampoline exec the worker."""
        if self.go_fd is not None:
            try:
                os.write(self.go_fd, b"go\n")
            finally:
                self.abandon()

    def abandon(self) -> None:
        """Close the hold pipe: a trampoline not yet released exits without exec'ing."""
        if self.go_fd is not None:
            os.close(self.go_fd)
            self.go_fd = None


@dataclass(frozen=True)
class Hold:
    """What a worker is spawned under until its release: the command's prefix and its name."""

    prefix: tuple[str, ...]
    kind: str  # "compiled" or "sh"
    fallback_reason: str = ""


def unsafe_program(program: Path, other_users: bool) -> str:
    """Why ``program`` must not hold workers ("" when it may). Every worker runs it, so only
    root or this service's user may be able to replace it: the file and each folder above it
    belong to one of them and nobody else can write to them (a sticky folder such as /tmp
    excepted: others cannot rename what is ours in it). With ``other_users`` (a profile's
    ``user`` execs it after switching) every user must also be able to reach and run it."""
    try:
        st = os.lstat(program)
        if not file_mode.S_ISREG(st.st_mode):
            return f"{program}: not a regular file"
        for path in (program, *program.parents):
            info = st if path == program else os.lstat(path)
            if info.st_uid not in (0, os.geteuid()):
                return f"{path} belongs to uid {info.st_uid}"
            if info.st_mode & 0o022 and not (path != program and info.st_mode & file_mode.S_ISVTX):
                return f"{path} is writable by its group or others"
            if other_users and path != program and not info.st_mode & 0o001:
                return f"{path}: other users cannot reach what is in it (a profile's user must run the hold)"
    except OSError as exc:
        return f"{program}: {exc.strerror or exc}"
    runnable_by = 0o111 if other_users else 0o100
    if st.st_mode & runnable_by != runnable_by:
        return f"{program}: not executable by {'every user' if other_users else 'its owner'}"
    return ""


def _probe(program: Path) -> str:
    """Run ``program`` once, released, with a shell command: "" when it worked."""
    try:
        done = subprocess.run(
            [str(program), "/bin/sh", "-c", "exit 7"], input=b"go\n", capture_output=True, timeout=10, env={}
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{program}: {exc}"
    if done.returncode != 7:
        return f"{program}: a trial run ended {done.returncode}: {done.stderr[:200]!r}"
    return ""


def choose_hold(mode: str, program: Path = HOLD_PROGRAM, other_users: bool = False) -> Hold:
    """(Blocking: one trial run.) ``[tasks] worker_hold``: "compiled" (the program or an error),
    "sh" (the shell), "auto" (the program where it is built, safe and runs, else the shell).
    ``other_users``: some profile runs its workers as a user other than the scheduler's."""
    if mode == "sh":
        return Hold(SH_HOLD, "sh")
    why = unsafe_program(program, other_users) or _probe(program)
    if not why:
        return Hold((str(program),), "compiled")
    if mode == "compiled":
        raise RuntimeError(f"worker_hold = compiled, but {why} (run `make hold`)")
    return Hold(SH_HOLD, "sh", why)


def resolve_command(command: Sequence[str]) -> list[str]:
    """'python' as the first word means the project's own interpreter."""
    argv = list(command)
    if argv[0] == "python":
        argv[0] = sys.executable
    return argv


# (command, PATH) -> where ``shutil.which`` found it: a profile's command is looked up on
# every launch, and a walk along PATH is a few stats per folder.
_found: dict[tuple[str, str | None], str] = {}


def _executable(argv0: str, path_env: str | None) -> bool:
    """Whether the command can be found (a cached find is checked again with one syscall)."""
    key = (argv0, path_env)
    known = _found.get(key)
    if known is not None and os.access(known, os.X_OK):
        return True
    found = shutil.which(argv0, path=path_env)
    if found is None:
        _found.pop(key, None)
        return False
    _found[key] = found
    return True


def _make_workspace(cwd: Path, run_as: RunAs | None) -> None:
    cwd.mkdir(parents=True, exist_ok=True)
    if run_as is not None:
        os.chown(cwd, run_as.uid, run_as.gid)  # a fresh workspace belongs to the worker's user


def _require_executable(argv0: str, path_env: str | None) -> None:
    # The shell would only say "not found" after the release; fail the launch now instead.
    if not _executable(argv0, path_env):
        raise FileNotFoundError(2, "no such executable", argv0)


def _token_pipe(token: str) -> int:
    """The read end of a pipe holding ``token`` (the write end closed: the worker reads it once)."""
    tok_r, tok_w = os.pipe()
    try:
        os.write(tok_w, token.encode())  # far below the pipe's capacity: never blocks
    except BaseException:
        os.close(tok_r)
        raise
    finally:
        os.close(tok_w)
    return tok_r


def _prepare(cwd: Path, log_path: Path, argv0: str, path_env: str | None, run_as: RunAs | None) -> BinaryIO:
    _require_executable(argv0, path_env)
    if not cwd.exists():
        _make_workspace(cwd, run_as)
    return os.fdopen(worker_log.open_for_worker(log_path), "ab")


async def launch(
    command: Sequence[str],
    cwd: Path,
    env: Mapping[str, str],
    log_path: Path,
    token: str,
    *,
    run_as: RunAs | None = None,
    cgroup: Path | None = None,
    cgroup_v1: bool = False,
    on_spawn: Callable[[int], None] | None = None,
    hold: Hold | None = None,
    spawner: SpawnHelper | None = None,
) -> Launched:
    """Spawn the worker held before exec, in ``cgroup`` when given; ``release()`` runs it.
    ``hold`` is what holds it (``choose_hold``; the shell when not given).

    With a running ``spawner`` the spawn helper starts it (``spawner``: no thread, none of
    its steps in this process). Else, or when the helper is gone, the blocking steps (log
    file, fork/exec, moving into the cgroup, reading the kernel start time) run here in one
    hop to a thread. ``on_spawn(pid)`` is called as soon as the pid is known.
    """
    argv = resolve_command(command)
    held = [*(hold.prefix if hold is not None else SH_HOLD), *argv]
    if spawner is not None and spawner.alive:
        # The helper's child switches users itself (no interpreter started per launch).
        go_r, go_w = os.pipe()
        try:
            launched = await _spawn_by_helper(
                spawner, held, argv[0], cwd, env, log_path, token, go_r, go_w, run_as, cgroup, cgroup_v1, on_spawn
            )
            return await _check_held(launched)
        except (SpawnHelperGone, SpawnRequestTooLarge) as exc:
            # A helper that died mid-request may have started a child on this hold pipe: it is
            # closed (that child exits unreleased) and this spawn gets a pipe of its own.
            os.close(go_w)
            log.warning("worker_spawned_by_scheduler", reason=str(exc))
        finally:
            os.close(go_r)
    if run_as is not None:
        # Never user=/group= here: see SWITCH_USER (the spawn must stay a vfork).
        held = [sys.executable, "-I", "-S", "-c", SWITCH_USER, str(run_as.uid), str(run_as.gid), *held]
    go_r, go_w = os.pipe()
    try:
        process, start_time = await asyncio.to_thread(
            _spawn_held, held, argv[0], cwd, env, log_path, token, go_r, run_as, cgroup, on_spawn
        )
    except _SpawnedButUnplaced as exc:
        os.close(go_w)  # the held trampoline exits without exec'ing anything
        exc.process.abandon()
        raise exc.error from None
    except BaseException:
        os.close(go_w)
        raise
    finally:
        os.close(go_r)
    launched = Launched(process=process, pid=process.pid, pgid=process.pid, start_time=start_time, go_fd=go_w)
    return await _check_held(launched)


async def _check_held(launched: Launched) -> Launched:
    """The launched worker, unless it died while held: then the launch fails (and it is reaped)."""
    process = launched.process
    try:
        if launched.start_time is None:
            # Died while held (it could not switch users, or was killed): fail the launch now,
            # rather than at the release with a broken pipe.
            status: object = "unknown"
            with contextlib.suppress(TimeoutError):  # dead already: its pidfd is readable at once
                async with asyncio.timeout(5):
                    status = await process.wait()
            raise LaunchFailed(f"the held worker exited before its release (status {status})")
    except BaseException:
        launched.abandon()
        process.abandon()
        raise
    return launched


async def _spawn_by_helper(
    spawner: SpawnHelper,
    held: list[str],
    argv0: str,
    cwd: Path,
    env: Mapping[str, str],
    log_path: Path,
    token: str,
    go_r: int,
    go_w: int,
    run_as: RunAs | None,
    cgroup: Path | None,
    cgroup_v1: bool,
    on_spawn: Callable[[int], None] | None,
) -> Launched:
    """The held worker, started by the spawn helper (``go_w`` is closed if it cannot be)."""
    try:
        _require_executable(argv0, env.get("PATH"))
        worker_env = {**env, TOKEN_FD_ENV: str(TOKEN_FD)}
        for attempt in range(2):
            tok_r = _token_pipe(token)
            try:
                # The services run with umask 077 (private files); a worker gets the usual one.
                spawned = await spawner.spawn(
                    held,
                    cwd,
                    worker_env,
                    log_path,
                    go_r,
                    tok_r,
                    cgroup,
                    cgroup_v1,
                    0o022,
                    (run_as.uid, run_as.gid) if run_as is not None else None,
                )
                break
            except FileNotFoundError as exc:
                # A workspace not made yet (rare: asked of the disk only then, off the loop).
                if attempt or getattr(exc, "spawn_step", None) != STAGE_WORKSPACE:
                    raise
                await asyncio.to_thread(_make_workspace, cwd, run_as)
            finally:
                os.close(tok_r)
    except (SpawnHelperGone, SpawnRequestTooLarge):
        raise  # the caller closes the hold pipe and spawns it itself
    except BaseException:
        os.close(go_w)
        raise
    if on_spawn is not None:
        on_spawn(spawned.pid)
    process = WorkerProcess(spawned.pid, spawned.pidfd)
    return Launched(
        process=process, pid=spawned.pid, pgid=spawned.pid, start_time=spawned.start_time, go_fd=go_w, by="helper"
    )


class _SpawnedButUnplaced(Exception):
    """The worker was spawned but could not be put in its cgroup (its process goes with it)."""

    def __init__(self, process: WorkerProcess, error: BaseException) -> None:
        super().__init__(repr(error))
        self.process = process
        self.error = error


def _spawn_held(
    held: list[str],
    argv0: str,
    cwd: Path,
    env: Mapping[str, str],
    log_path: Path,
    token: str,
    go_r: int,
    run_as: RunAs | None,
    cgroup: Path | None,
    on_spawn: Callable[[int], None] | None = None,
) -> tuple[WorkerProcess, int | None]:
    """(Blocking.) The held trampoline, in its cgroup, with its kernel start time (None: it died)."""
    log_file = _prepare(cwd, log_path, argv0, env.get("PATH"), run_as)
    if cgroup is not None:
        cgroup.mkdir(parents=True, exist_ok=True)  # the folder itself may have been cleaned up meanwhile
    tok_r = _token_pipe(token)
    try:
        with log_file:
            # Never user=/group=/extra_groups=/preexec_fn= here: CPython would fork() instead
            # of vfork().
            popen = subprocess.Popen(
                held,
                cwd=str(cwd),
                env={**env, TOKEN_FD_ENV: str(tok_r)},
                stdin=go_r,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # own session, so its own process group
                pass_fds=(tok_r,),
                umask=0o022,  # the services run with umask 077 (private files); a worker gets the usual one
            )
    finally:
        os.close(tok_r)
    if on_spawn is not None:
        on_spawn(popen.pid)
    process = WorkerProcess(popen.pid, popen=popen)
    if cgroup is not None:
        try:
            cgroups.add(cgroup, process.pid)  # created with the log folder, before the fork
        except BaseException as exc:
            raise _SpawnedButUnplaced(process, exc) from exc
    # Held, so it is alive and this is the worker's identity (exec keeps it).
    return process, proctree.start_time_of(process.pid)


@dataclass
class TreeStatus:
    group: list[proctree.ProcStat] = field(default_factory=list)
    escaped: list[proctree.ProcStat] = field(default_factory=list)
    # Live members of the attempt's cgroup (cgroup mode).
    in_cgroup: list[int] = field(default_factory=list)
    # Orphans re-parented to the scheduler that may be this attempt's but cannot
    # be attributed to it alone: never signalled, and the stop stays unproven.
    unattributed: list[proctree.ProcStat] = field(default_factory=list)
    # Why the group cannot be signalled (identity mismatch, legacy record), if so.
    unsignallable: str = ""
    # A container worker: why the engine does not prove its container stopped, if so.
    container: str = ""

    @property
    def gone(self) -> bool:
        return (
            not self.group and not self.escaped and not self.in_cgroup and not self.unattributed and not self.container
        )

    def describe(self) -> str:
        parts = []
        if self.group:
            parts.append(f"{len(self.group)} process(es) still in group: " + ", ".join(str(p.pid) for p in self.group))
        if self.escaped:
            parts.append(
                "recorded descendant(s) outside the group still alive: "
                + ", ".join(f"pid {p.pid} (start {p.start_time})" for p in self.escaped)
            )
        if self.in_cgroup:
            parts.append("process(es) still in the attempt's cgroup: " + ", ".join(str(p) for p in self.in_cgroup))
        if self.unattributed:
            parts.append(
                "orphan(s) that may be this attempt's but cannot be attributed to it, not signalled: "
                + ", ".join(f"pid {p.pid} (start {p.start_time})" for p in self.unattributed)
            )
        if self.unsignallable:
            parts.append(self.unsignallable)
        if self.container:
            parts.append(self.container)
        return "; ".join(parts) or "no process remains"


def _roots(attempt: Attempt, table: dict[int, proctree.ProcStat]) -> list[int]:
    """The attempt's processes whose identity still matches: its leader and recorded descendants."""
    roots = []
    if attempt.pid is not None and attempt.pid_start_time is not None:
        leader = table.get(attempt.pid)
        if leader is not None and leader.alive and leader.start_time == attempt.pid_start_time:
            roots.append(attempt.pid)
    for d in attempt.descendants:
        stat = table.get(d.pid)
        if stat is not None and stat.alive and stat.start_time == d.start_time:
            roots.append(d.pid)
    return roots


def _record(attempt: Attempt, stats: Sequence[proctree.ProcStat]) -> bool:
    known = {(d.pid, d.start_time) for d in attempt.descendants}
    added = False
    for stat in stats:
        if (stat.pid, stat.start_time) not in known and stat.pid != attempt.pid:
            attempt.descendants.append(ProcessIdentity(pid=stat.pid, start_time=stat.start_time))
            known.add((stat.pid, stat.start_time))
            added = True
    return added


def record_descendants(attempt: Attempt, table: dict[int, proctree.ProcStat]) -> bool:
    """Add the live descendants of the attempt's processes to its record; True if any were new.

    Descendants of recorded descendants count too, so a daemon that a recorded
    process (or an orphan attributed to the attempt) forks is recorded as well.
    """
    _mark_if_leader_seen(attempt, table)
    roots = _roots(attempt, table)
    if not roots:  # an exited worker with nothing recorded: no pass over the whole table
        return False
    children = proctree.children_map(table)
    found: list[proctree.ProcStat] = []
    for root in roots:
        found.extend(proctree.live_descendants(table, root, children))
    return _record(attempt, found)


def cgroup_folders_of(pid: int) -> set[str]:
    """Every folder name on the process's cgroup paths (v2 and the v1 hierarchies)."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            return {part for line in f for part in line.rstrip("\n").split(":", 2)[-1].split("/") if part}
    except OSError:
        return set()


def attribute_orphans(
    table: dict[int, proctree.ProcStat], owned: Sequence[Attempt], orphans: Sequence[proctree.ProcStat]
) -> list[proctree.ProcStat]:
    """Record each orphan on the one attempt it can belong to; return those that fit several.

    An orphan re-parented to the scheduler descends from one of its attempts. In
    cgroup mode its cgroup names the attempt. Otherwise only attempts whose leader
    started before it can be its origin: with exactly one, it is that attempt's.
    """
    recorded = {(d.pid, d.start_time) for a in owned for d in a.descendants}
    unattributed = []
    for orphan in orphans:
        if (orphan.pid, orphan.start_time) in recorded:
            continue
        folders = cgroup_folders_of(orphan.pid)
        by_cgroup = [a for a in owned if a.cgroup and Path(a.cgroup).name in folders]
        candidates = by_cgroup or [
            a for a in owned if a.pid_start_time is not None and a.pid_start_time <= orphan.start_time
        ]
        if len(candidates) == 1:
            _record(candidates[0], [orphan, *proctree.live_descendants(table, orphan.pid)])
        elif candidates:
            unattributed.append(orphan)
    return unattributed


def mark_group_held(attempt: Attempt, ticks: int) -> None:
    """Record that the attempt's group id was still its own at ``ticks`` (boot clock)."""
    attempt.group_held_ticks = max(ticks, attempt.group_held_ticks or 0)


def _mark_if_leader_seen(attempt: Attempt, table: dict[int, proctree.ProcStat]) -> None:
    """A table showing the attempt's own leader (alive or its zombie) marks the group held
    when the read began (in memory; saved with the attempt's next write)."""
    read_from = getattr(table, "read_from", None)
    leader = table.get(attempt.pid) if attempt.pid is not None else None
    if read_from is not None and leader is not None and leader.start_time == attempt.pid_start_time:
        mark_group_held(attempt, read_from)


def _unproven_group(attempt: Attempt, members: Sequence[proctree.ProcStat]) -> str:
    """With the leader gone: why these live members of the attempt's group id may not be its
    own ("" when they provably are).

    Every attempt's leader starts its own session, so the attempt's group lives in a session
    of the same id: a member in another session belongs to a group someone else made with
    that id (a process may join a group of its own session at any time, so its start time
    proves nothing). A member in that session got its session id at its fork (a process can
    start a session, never join one) and has held the id since it started: the kernel frees a
    pid only once no process has it as pid, group or session id. So if the oldest member
    started while the id was provably the attempt's (the last moment its leader was seen or
    reaped, or its start), or one member is a recorded descendant, they are all the attempt's;
    otherwise the attempt's group may have died out and the id been reused by another program's
    session, whose members all started later.
    """
    if any(m.sid != attempt.pgid for m in members):
        return (
            f"the group's leader (pid {attempt.pid}) is gone and group {attempt.pgid} has members in another "
            "session: another program's group with a reused id"
        )
    held = max(attempt.group_held_ticks or 0, attempt.pid_start_time or 0)
    recorded = {(d.pid, d.start_time) for d in attempt.descendants}
    if min(m.start_time for m in members) <= held or any((m.pid, m.start_time) in recorded for m in members):
        return ""
    return (
        f"the group's leader (pid {attempt.pid}) is gone and no live member of group {attempt.pgid} "
        "started while it was provably the attempt's or is a recorded descendant: the group id may "
        "have been reused"
    )


# Descriptors a live worker keeps open in the scheduler: the pidfd its exit is awaited on and
# the one kept on it as its group's leader (``Ownership.keep_group``).
FDS_PER_WORKER = 2
# Everything else: databases, gRPC, the worker sockets, and a launch's log file and pipes.
FDS_BESIDES_WORKERS = 256


def open_files_for(max_running: int) -> tuple[int, int]:
    """Raise this process's open-files limit to what ``max_running`` workers need — to the hard
    limit, as far as the kernel allows (a soft limit of 1,024 is common, and 1,024 workers keep
    twice that open); the limit in force and the need. The workers inherit the raised limit,
    which any process may set itself up to the same hard limit."""
    needed = FDS_PER_WORKER * max_running + FDS_BESIDES_WORKERS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else max(soft, needed, 1 << 20)
    if soft < wanted:
        for limit in (wanted, needed):  # the hard limit may exceed the kernel's nr_open
            if soft < limit:
                with contextlib.suppress(ValueError, OSError):
                    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
                    soft = limit
                    break
    return soft, needed


# Signals an attempt's group through the pidfd kept on its leader (``Ownership.signal_group``):
# ``proctree.signal_led_group``'s answer, or None when no pidfd is kept for the attempt.
GroupSignal = Callable[[Attempt, int], bool | None]


def tree_status(
    attempt: Attempt,
    table: dict[int, proctree.ProcStat],
    unattributed: Sequence[proctree.ProcStat] = (),
    group_signal: GroupSignal | None = None,
) -> TreeStatus:
    """What of the attempt still lives in ``table``. ``group_signal``: asked (signal 0) about a
    group whose leader is gone, it says for certain whether the attempt's group still has
    members, where the table alone can only say when they are provably the attempt's."""
    status = TreeStatus()
    if attempt.cgroup:
        status.in_cgroup = [
            pid for pid in cgroups.members(Path(attempt.cgroup)) if (stat := table.get(pid)) is not None and stat.alive
        ]
    if attempt.pgid is None:
        return status
    leader = table.get(attempt.pid) if attempt.pid is not None else None
    if attempt.pid_start_time is None:
        status.group = proctree.live_group_members(table, attempt.pgid)
        if status.group:
            status.unsignallable = "legacy record without a start time: a live group is never signalled"
        return status
    if leader is not None and leader.start_time != attempt.pid_start_time:
        # The pid was reused (by a live process or a zombie alike), so its group, if any, is
        # another program's: the kernel frees a pid only once no process has it as its group
        # id either, so nothing of the attempt's group can be left.
        status.unsignallable = f"pid {attempt.pid} now belongs to another process (start time differs)"
    else:
        # Members of our group all started after the leader did.
        status.group = [
            p for p in proctree.live_group_members(table, attempt.pgid) if p.start_time >= attempt.pid_start_time
        ]
        if leader is None and status.group:
            # The kernel knows whose group these are while the leader's pidfd is kept: a group
            # that still has members holds its number, so they are the attempt's; one with none
            # left never regains any, so those of the number now are another program's.
            kept = group_signal(attempt, 0) if group_signal is not None else None
            if kept is False:
                status.group = []
            elif kept is None:
                status.unsignallable = _unproven_group(attempt, status.group)
    for d in attempt.descendants:
        stat = table.get(d.pid)
        if stat is not None and stat.alive and stat.start_time == d.start_time and stat.pgid != attempt.pgid:
            status.escaped.append(stat)
    status.unattributed = [o for o in unattributed if o.start_time >= attempt.pid_start_time]
    return status


def signal_group(
    attempt: Attempt, status: TreeStatus, sig: signal.Signals, group_signal: GroupSignal | None = None
) -> None:
    """Signal what is provably the attempt's: its group, its recorded descendants, its cgroup.
    ``group_signal``: signals a group whose leader is gone at once, through the leader's pidfd."""
    if attempt.cgroup and status.in_cgroup:
        cgroups.signal_all(Path(attempt.cgroup), sig)
    # Each by identity (proctree.signal_identified): a pid freed and reused since the read
    # is not hit.
    for stat in status.escaped:
        # Recorded as the attempt's: signalled while it is still that process.
        proctree.signal_identified(stat.pid, stat.start_time, sig)
    if status.unsignallable or not status.group or attempt.pgid is None:
        return
    leader_alive = any(p.pid == attempt.pid for p in status.group)
    if (
        leader_alive
        and attempt.pid is not None
        and attempt.pid_start_time is not None
        and proctree.signal_identified(attempt.pid, attempt.pid_start_time, sig, group=True)
    ):
        return
    # The leader is gone (or went just now). Through its kept pidfd the whole group at once,
    # members forked since the read too; else the members the read showed, one by one.
    if group_signal is not None and group_signal(attempt, sig) is not None:
        return
    for member in status.group:
        proctree.signal_identified(member.pid, member.start_time, sig)


# Given a table, the orphans that may be the attempt's but fit several attempts
# (recording those that fit one); None when the scheduler is not a subreaper.
OrphanCheck = Callable[[dict[int, proctree.ProcStat]], list[proctree.ProcStat]]


@dataclass
class StopContext:
    table_reader: Callable[[], dict[int, proctree.ProcStat]] = proctree.process_table
    orphan_check: OrphanCheck | None = None
    cgroup_kill: bool = True  # the cgroup offers cgroup.kill (else freeze + SIGKILL)
    group_signal: GroupSignal | None = None  # through the leader's kept pidfd (this incarnation's)
    # With ``orphan_check``: whether this process has a live child that is not a known worker
    # leader — a possible orphan, which only a table read can attribute (True when unknown).
    strays: Callable[[], bool] | None = None


# The most files ``kernel_proof`` reads for one exit's recorded descendants (and ``strays`` for
# unknown children): it runs on the event loop, and a worker decides how many processes it forks.
KERNEL_PROOF_MAX_READS = 32


def kernel_proof(attempt: Attempt, ctx: StopContext, remove_empty_cgroup: bool = False) -> TreeStatus | None:
    """Proof that nothing of an attempt whose leader has exited is left, from what the kernel
    says without a process-table read — or None when only ``look`` can tell. The stopper calls
    it on the event loop, so it is a few system calls that never wait and whose number the
    worker cannot raise: a pidfd signal 0, at most ``KERNEL_PROOF_MAX_READS`` recorded
    descendants' stat files, one ``cgroup.events`` read (no walk below), the children list
    (``strays``, itself bounded) and one ``rmdir`` (no retry, no walk): ≈ 60 µs, ≈ 0.2 ms with
    a cgroup. Anything more — many descendants, a cgroup below the attempt's, an ``rmdir``
    refused — is left to ``look`` on its thread.

    Everything a table read would find of the attempt is, with the leader gone: a member of its
    group; a recorded descendant; a process in its cgroup; or an unrecorded one that left both
    (a new session, and a cgroup it could write to) — whose topmost surviving ancestor outside
    them is then an orphan re-parented to this subreaper. So the attempt is gone when the
    leader's kept pidfd says its group has no member (a group that emptied never regains one),
    no recorded descendant is alive, its cgroup is empty, and this process has no child but
    known leaders. Each of the first three answers "none" permanently or for that process's
    ancestors; the children are read last. ``remove_empty_cgroup``: as ``look``'s (a cgroup
    that cannot be removed sends the proof to ``look``)."""
    if attempt.pid_start_time is None or attempt.pgid is None or ctx.group_signal is None:
        return None  # a legacy record, or an earlier incarnation's attempt: no pidfd kept
    if ctx.group_signal(attempt, 0) is not False:
        return None  # members left (``look`` tells whose), or a kernel before Linux 6.9
    if len(attempt.descendants) > KERNEL_PROOF_MAX_READS:
        return None  # a worker that forked that many gets its proof from the table, off the loop
    if any(proctree.identity_matches(d.pid, d.start_time) for d in attempt.descendants):
        return None
    cgroup = attempt.cgroup or None
    if cgroup is not None and not cgroups.known_empty(cgroup):
        return None
    if ctx.orphan_check is not None and (ctx.strays is None or ctx.strays()):
        return None
    if remove_empty_cgroup and cgroup is not None and not cgroups.remove_at_once(cgroup):
        return None
    return TreeStatus()


def look(
    attempt: Attempt,
    ctx: StopContext,
    table: dict[int, proctree.ProcStat] | None = None,
    remove_empty_cgroup: bool = False,
) -> TreeStatus:
    """One pass (blocking; run it in a thread): record what is new, then say what still lives.

    ``table``: a process table read after the moment in question (else one is read here).
    ``remove_empty_cgroup``: when nothing lives, the attempt's cgroup is removed too.
    """
    if table is None:
        table = ctx.table_reader()
    record_descendants(attempt, table)
    unattributed = ctx.orphan_check(table) if ctx.orphan_check is not None else []
    record_descendants(attempt, table)
    status = tree_status(attempt, table, unattributed, ctx.group_signal)
    if remove_empty_cgroup and status.gone and attempt.cgroup:
        cgroups.remove(Path(attempt.cgroup))
    return status


async def _wait_gone(attempt: Attempt, timeout_s: float, ctx: StopContext) -> TreeStatus:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        status = await asyncio.to_thread(look, attempt, ctx)
        if status.gone or loop.time() >= deadline:
            return status
        await asyncio.sleep(POLL_S)


def _kill(attempt: Attempt, status: TreeStatus, ctx: StopContext) -> None:
    if attempt.cgroup:
        cgroups.kill(Path(attempt.cgroup), ctx.cgroup_kill)
    signal_group(attempt, status, signal.SIGKILL, ctx.group_signal)


async def stop_tree(
    attempt: Attempt,
    grace_s: float,
    confirm_s: float,
    table_reader: Callable[[], dict[int, proctree.ProcStat]] = proctree.process_table,
    ctx: StopContext | None = None,
) -> TreeStatus:
    """SIGTERM the attempt's processes, SIGKILL after the grace, then look for proof that all is gone.

    Returns the final status: ``gone`` is the proof. Records descendants first
    (on ``attempt``) so a child that left the group is still found and stopped.
    An empty cgroup is removed.
    """
    ctx = ctx or StopContext(table_reader=table_reader)
    status = await asyncio.to_thread(look, attempt, ctx)
    if not status.gone:
        await asyncio.to_thread(signal_group, attempt, status, signal.SIGTERM, ctx.group_signal)
        status = await _wait_gone(attempt, grace_s, ctx)
        if not status.gone:
            await asyncio.to_thread(_kill, attempt, status, ctx)
            status = await _wait_gone(attempt, confirm_s, ctx)
    if status.gone and attempt.cgroup:
        await asyncio.to_thread(cgroups.remove, Path(attempt.cgroup))
    return status
