"""The spawn helper: held workers started by ``taskgate-spawn`` (``hold/taskgate-spawn.c``).

Spawning in the scheduler itself (``subprocess`` on a thread: the log file, the fork/exec,
the move into the cgroup, the start-time read) cost it ~0.8 ms of CPU per task under load,
all of it competing for its one GIL. The helper is a small C program, a child of the
scheduler, that does those steps for it: the scheduler sends one message per worker over a
socket pair and reads one answer, on its event loop, without a thread.

What stays the same: the worker is the scheduler's own child (``clone3(CLONE_PARENT)``), so
its exit is awaited, and its orphans reaped, exactly as for a worker spawned here; it is held
before exec until released through the hold pipe; its kernel start time is read while held;
it starts in its cgroup (born there with ``CLONE_INTO_CGROUP``, never migrated); it inherits
nothing but the hold pipe, its log and the token pipe. The helper's socket is reachable by
nothing else (no path; close-on-exec here; closed before a worker's exec there).

The helper exiting (killed, say) ends no launch silently: requests under way fail with
``SpawnHelperGone`` and the caller spawns the worker itself (``processes.launch``).
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import errno
import itertools
import os
import socket
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

import structlog

log = structlog.get_logger("scheduler")

SPAWN_PROGRAM = Path(__file__).resolve().parent / "hold" / "taskgate-spawn"
# Where the worker finds its token pipe (``TASKGATE_WORKER_TOKEN_FD``).
TOKEN_FD = 3

_MAGIC = 0x74677370
_FLAG_CGROUP_V1 = 2
_FLAG_RUN_AS = 4
_REQUEST = struct.Struct("<8I")  # magic, id, flags, umask, argc, envc, uid, gid
_REPLY = struct.Struct("<IiiiQ")  # id, pid, stage, errno, start time
# What each failed step was (the reply's stage).
_STAGES = {
    1: "the request",
    2: "clone3",
    3: "setsid",
    4: "the worker's descriptors",
    5: "entering the workspace",
    6: "exec",
    7: "joining the cgroup",
    8: "a pipe",
    9: "the attempt's log file",
    10: "the attempt's cgroup",
    11: "switching to the profile's user",
}
_STAGE_REQUEST = 1
STAGE_WORKSPACE = 5  # entering the workspace (``OSError.spawn_step``)
# A request this long goes to the thread path instead (the helper reads at most 1 MiB).
MAX_REQUEST = 1 << 20
# A helper that has not answered a request in this long is stuck (say, a child's chdir into a
# hung network mount): it is killed and its requests go to the scheduler's own spawn.
ANSWER_TIMEOUT_S = 30.0


class SpawnHelperGone(Exception):
    """The helper exited, or never answered this request: the caller spawns the worker itself."""


class SpawnRequestTooLarge(Exception):
    """The command and environment do not fit one message: the caller spawns the worker itself."""


@dataclass
class Spawned:
    pid: int
    pidfd: int
    start_time: int | None  # None: the worker was gone before it was read


@dataclass
class _Reply:
    pid: int
    pidfd: int
    stage: int
    error: int
    start_time: int


def encode_request(
    request_id: int,
    argv: list[str],
    cwd: Path,
    env: dict[str, str],
    log_path: Path,
    cgroup: Path | None,
    cgroup_v1: bool,
    umask: int,
    run_as: tuple[int, int] | None = None,
) -> bytes:
    """One request's bytes (ValueError: a NUL in a string, as ``subprocess`` says). Paths are
    made absolute: the helper's working folder is whatever the scheduler's was when it started."""
    fsencode = os.fsencode
    paths = [os.path.abspath(log_path), os.path.abspath(cgroup) if cgroup else "", os.path.abspath(cwd)]
    strings = [fsencode(s) for s in (*paths, *argv)]
    strings += [fsencode(k) + b"=" + fsencode(v) for k, v in env.items()]
    for key in env:
        if "=" in key:
            raise ValueError("illegal environment variable name")
    body = b"\0".join(strings) + b"\0"
    # One NUL ends each string: any more is one inside a string (counted once, not per string).
    if body.count(b"\0") != len(strings):
        raise ValueError("embedded null byte")
    flags = (_FLAG_CGROUP_V1 if cgroup_v1 else 0) | (_FLAG_RUN_AS if run_as is not None else 0)
    uid, gid = run_as if run_as is not None else (0, 0)
    head = _REQUEST.pack(_MAGIC, request_id, flags, umask, len(argv), len(env), uid, gid)
    return head + body


class SpawnHelper:
    """The running helper and the requests waiting for its answer (one event loop)."""

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        sock: socket.socket,
        answer_timeout_s: float = ANSWER_TIMEOUT_S,
        program: Path = SPAWN_PROGRAM,
    ) -> None:
        self._process = process
        self.program = program
        self.answer_timeout_s = answer_timeout_s
        self.pid = process.pid
        self._sock = sock
        self._waiting: dict[int, asyncio.Future[_Reply]] = {}
        self._ids = itertools.count(1)
        self._reading = False
        self.alive = True  # takes requests
        self.reaped = False
        self._ended = False  # its socket ended (read to the end, or failed)
        self._closing = False
        self._answered: asyncio.Future[None] | None = None  # close() waits on it

    @classmethod
    def start(cls, program: Path = SPAWN_PROGRAM, legacy_clone: bool = False) -> SpawnHelper:
        """(Blocking, brief: one vfork/exec.) Start the helper as this process's child, with its
        socket: its workers become this process's children (``CLONE_PARENT``). ``legacy_clone``:
        clone() instead of clone3 (what it falls back to where clone3 is filtered out; for tests).
        """
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, MAX_REQUEST + 4096)
            process = subprocess.Popen(
                [str(program), str(theirs.fileno()), *(["--legacy-clone"] if legacy_clone else [])],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
                env={},  # it needs nothing of the scheduler's (its settings, its secrets)
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        return cls(process, ours, program=program)

    async def spawn(
        self,
        argv: list[str],
        cwd: Path,
        env: dict[str, str],
        log_path: Path,
        stdin_fd: int,
        token_fd: int,
        cgroup: Path | None = None,
        cgroup_v1: bool = False,
        umask: int = 0o022,
        run_as: tuple[int, int] | None = None,
    ) -> Spawned:
        """Start ``argv`` (``argv[0]`` an absolute path) held on ``stdin_fd``, as ``run_as``
        (uid, gid; no supplementary groups) when given.

        Raises OSError (errno, what failed) when the helper could not start it — nothing of
        it runs then —, SpawnHelperGone / SpawnRequestTooLarge when the caller should spawn
        it itself, ValueError for a NUL in a string.
        """
        if not self.alive:
            raise SpawnHelperGone("the spawn helper is not running")
        loop = asyncio.get_running_loop()
        if not self._reading:
            loop.add_reader(self._sock.fileno(), self._on_readable)
            self._reading = True
        request_id = next(self._ids) & 0xFFFFFFFF
        payload = encode_request(request_id, argv, cwd, env, log_path, cgroup, cgroup_v1, umask, run_as)
        if len(payload) > MAX_REQUEST:
            raise SpawnRequestTooLarge(f"{len(payload)} bytes")
        answer: asyncio.Future[_Reply] = loop.create_future()
        self._waiting[request_id] = answer
        rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [stdin_fd, token_fd]))]
        try:
            await self._send(payload, rights)
        except OSError as exc:
            self._waiting.pop(request_id, None)
            if exc.errno == errno.EMSGSIZE:
                raise SpawnRequestTooLarge(str(exc)) from exc
            self._gone(f"sending failed: {exc}")
            raise SpawnHelperGone(f"the spawn helper is gone ({exc})") from exc
        except BaseException:  # cancelled while the socket was full: never sent, never answered
            self._waiting.pop(request_id, None)
            raise
        stuck = loop.call_later(self.answer_timeout_s, self._no_answer, request_id)
        try:
            reply = await answer
        finally:
            stuck.cancel()
        if reply.stage:
            if reply.pid > 0:  # the child exited (127) at that step: reap it
                _reap_in_background(reply.pid, reply.pidfd)
            elif reply.pidfd >= 0:
                os.close(reply.pidfd)
            what = _STAGES.get(reply.stage, f"step {reply.stage}")
            if reply.stage == _STAGE_REQUEST:
                raise ValueError(f"the spawn helper refused the request ({os.strerror(reply.error)})")
            failed = OSError(reply.error, f"{os.strerror(reply.error)} ({what})")
            failed.spawn_step = reply.stage  # type: ignore[attr-defined]
            raise failed
        return Spawned(reply.pid, reply.pidfd, reply.start_time or None)

    async def _send(self, payload: bytes, rights: list[tuple[int, int, array.array[int]]]) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                self._sock.sendmsg([payload], rights)
                return
            except BlockingIOError:
                writable: asyncio.Future[None] = loop.create_future()
                loop.add_writer(self._sock.fileno(), _resolve, writable)
                try:
                    await writable
                finally:
                    loop.remove_writer(self._sock.fileno())

    def _on_readable(self) -> None:
        while True:
            try:
                data, ancillary, _flags, _addr = self._sock.recvmsg(_REPLY.size, socket.CMSG_SPACE(4))
            except BlockingIOError:
                return
            except OSError as exc:
                self._gone(f"reading failed: {exc}")
                return
            if not data:
                self._gone("it exited")
                return
            pidfd = -1
            for level, kind, value in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds = array.array("i")
                    fds.frombytes(value[: len(value) - len(value) % fds.itemsize])
                    for extra in fds[1:]:
                        os.close(extra)
                    if fds:
                        pidfd = fds[0]
            if len(data) != _REPLY.size:
                log.error("spawn_helper_bad_reply", size=len(data))
                if pidfd >= 0:
                    os.close(pidfd)
                continue
            request_id, pid, stage, error, start_time = _REPLY.unpack(data)
            answer = self._waiting.pop(request_id, None)
            if answer is None or answer.done():
                # Its launch was cancelled meanwhile (the launch closes the hold pipe, so the
                # held worker exits without running anything): only its exit is left to reap.
                if pid > 0:
                    _reap_in_background(pid, pidfd)
                elif pidfd >= 0:
                    os.close(pidfd)
                continue
            answer.set_result(_Reply(pid, pidfd, stage, error, start_time))

    def _no_answer(self, request_id: int) -> None:
        if request_id in self._waiting and self.alive:
            with contextlib.suppress(ProcessLookupError):
                self._process.kill()  # whatever it started is the scheduler's child: see processes.launch
            self._gone(f"no answer in {self.answer_timeout_s:g} s")

    def _gone(self, why: str) -> None:
        """Its socket ended or failed: nothing more is asked of it or read from it."""
        if self._ended:
            return
        self._ended = True
        self.alive = False
        if not self._closing:
            log.error("spawn_helper_gone", pid=self.pid, reason=why, waiting=len(self._waiting))
        if self._reading:
            asyncio.get_running_loop().remove_reader(self._sock.fileno())
            self._reading = False
        waiting, self._waiting = self._waiting, {}
        for answer in waiting.values():
            if not answer.done():
                answer.set_exception(SpawnHelperGone("the spawn helper exited before it answered"))
        self._sock.close()
        if self._answered is not None and not self._answered.done():
            self._answered.set_result(None)
        if not self._closing:
            self._reap_helper()

    def _reap_helper(self) -> None:
        def reaped(_: object) -> None:
            self.reaped = True

        asyncio.ensure_future(asyncio.to_thread(self._process.wait)).add_done_callback(reaped)

    @property
    def unanswered(self) -> int:
        """Requests sent and not answered yet."""
        return len(self._waiting)

    async def close(self, timeout_s: float = 5.0) -> None:
        """Stop the helper. It is asked nothing more; what it already read, it answers (the
        child of a launch given up meanwhile is reaped, never left a zombie), then it sees its
        socket end and exits."""
        if not self._ended:
            self.alive = False
            self._closing = True
            if not self._reading:
                self._gone("closed")  # never asked anything: nothing to wait for
            else:
                self._answered = asyncio.get_running_loop().create_future()
                try:
                    self._sock.shutdown(socket.SHUT_WR)
                    await asyncio.wait_for(asyncio.shield(self._answered), timeout_s)
                except (OSError, TimeoutError):
                    self._gone("closed")
        if not self.reaped:
            try:
                await asyncio.wait_for(asyncio.to_thread(self._process.wait), timeout_s)
            except TimeoutError:
                self._process.kill()
                await asyncio.to_thread(self._process.wait)
            self.reaped = True


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _reap_in_background(pid: int, pidfd: int) -> None:
    """A child the helper started whose launch will not go on: wait for its exit and reap it."""
    from services.scheduler.processes import WorkerProcess  # (processes imports this module)

    WorkerProcess(pid, pidfd).abandon()
