"""Process-tree control on real processes: identity fences and proof of exit."""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from libs import proctree
from services.scheduler import processes
from services.scheduler.domain import Attempt, ProcessIdentity


def attempt_for(pid: int | None, start_time: int | None, pgid: int | None = None) -> Attempt:
    return Attempt(
        attempt_id="a" * 32,
        task_id="t" * 32,
        number=1,
        boot_id="b",
        token_hash="h",
        pid=pid,
        pgid=pgid if pgid is not None else pid,
        pid_start_time=start_time,
    )


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def test_start_time_is_the_kernel_value_and_identifies_the_process(sleeper: subprocess.Popen[bytes]) -> None:
    start = proctree.start_time_of(sleeper.pid)
    assert start is not None and start > 0
    assert proctree.identity_matches(sleeper.pid, start)
    assert not proctree.identity_matches(sleeper.pid, start + 1)


async def test_a_reused_pid_is_never_signalled(sleeper: subprocess.Popen[bytes]) -> None:
    start = proctree.start_time_of(sleeper.pid)
    assert start is not None
    # The record says another process once had this pid (earlier start time).
    record = attempt_for(sleeper.pid, start - 5)
    status = await processes.stop_tree(record, grace_s=0.2, confirm_s=0.2)
    assert sleeper.poll() is None, "an unrelated process was signalled"
    assert not status.group and "another process" in status.unsignallable


async def test_a_reused_pid_held_by_a_zombie_leaves_its_new_group_alone() -> None:
    """The record's pid now belongs to a zombie (another process that led its own group and
    exited, unreaped) whose child lives on in that group: the group is not the attempt's — the
    pid could only be reused once the attempt's group was gone — so nothing is signalled."""
    leader = subprocess.Popen(["sh", "-c", "sleep 60 & exit 0"], start_new_session=True)
    try:
        deadline = time.monotonic() + 5
        while True:
            table = proctree.process_table()
            members = proctree.live_group_members(table, leader.pid)
            if leader.pid in table and not table[leader.pid].alive and members:
                break
            assert time.monotonic() < deadline, "the shell did not exit leaving its child"
            time.sleep(0.01)
        (child,) = members
        start = table[leader.pid].start_time
        status = await processes.stop_tree(attempt_for(leader.pid, start - 5), grace_s=0.2, confirm_s=0.2)
        assert proctree.identity_matches(child.pid, child.start_time), "another program's process was signalled"
        assert not status.group and "another process" in status.unsignallable
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()


def group_left_by_an_exited_leader(own_session: bool = True) -> tuple[int, proctree.ProcStat]:
    """A real group whose leader exited and was reaped, one member (``sleep 60``) living on:
    (the group id, the member). The leader starts a session (as a worker's does), or only a
    group in this process's session. The caller kills the group."""
    pgid, member, _ = group_left_by_a_leader(own_session)
    return pgid, member


def group_left_by_a_leader(own_session: bool = True, keep_pidfd: bool = False) -> tuple[int, proctree.ProcStat, int]:
    """``group_left_by_an_exited_leader``, and with ``keep_pidfd`` a pidfd opened on the leader
    before its reap, as the scheduler keeps one on each leader it spawns (-1 without; the caller
    closes it)."""
    leader = subprocess.Popen(
        ["sh", "-c", "sleep 60 & exit 0"], **({"start_new_session": True} if own_session else {"process_group": 0})
    )
    fd = os.pidfd_open(leader.pid) if keep_pidfd else -1
    leader.wait()
    deadline = time.monotonic() + 5
    while not (members := proctree.live_group_members(proctree.process_table(), leader.pid)):
        assert time.monotonic() < deadline, "the shell's child did not show"
        time.sleep(0.01)
    (member,) = members
    return leader.pid, member, fd


async def test_a_group_whose_leader_is_gone_and_whose_members_all_came_later_is_never_signalled() -> None:
    """The record's pid led a group, then the whole group ended and the pid was reused by a
    new group leader that has exited too, its child living on under the same group id. A
    late look (a restart, a host back after days) finds members of that id newer than the
    attempt's leader but nothing tying them to the attempt: they are not signalled."""
    pgid, member = group_left_by_an_exited_leader()
    try:
        # The attempt's leader had this pid long before; it was last seen holding its group
        # before the member started.
        record = attempt_for(pgid, member.start_time - 50)
        record.group_held_ticks = member.start_time - 10
        status = await processes.stop_tree(record, grace_s=0.2, confirm_s=0.2)
        assert proctree.identity_matches(member.pid, member.start_time), "another program's process was signalled"
        assert not status.gone and "may have been reused" in status.unsignallable
        assert [p.pid for p in status.group] == [member.pid]
    finally:
        os.killpg(pgid, signal.SIGKILL)


async def test_a_leaderless_group_in_another_session_is_never_the_attempts() -> None:
    """Every attempt's leader starts its own session. A group with the attempt's id whose
    members are in another session was made by someone else after the pid's reuse — a process
    may join it at any time, so even a member older than the attempt's held moment proves
    nothing: nothing is signalled."""
    pgid, member = group_left_by_an_exited_leader(own_session=False)
    try:
        assert member.sid != pgid
        record = attempt_for(pgid, member.start_time - 50)
        record.group_held_ticks = member.start_time + 100  # the start-time rule alone would take it
        status = await processes.stop_tree(record, grace_s=0.2, confirm_s=0.2)
        assert proctree.identity_matches(member.pid, member.start_time), "another program's process was signalled"
        assert not status.gone and "another session" in status.unsignallable
    finally:
        os.killpg(pgid, signal.SIGKILL)


@pytest.mark.parametrize("tie", ["held after the member started", "member recorded"])
async def test_a_group_whose_leader_is_gone_is_stopped_when_a_member_is_provably_the_attempts(tie: str) -> None:
    pgid, member = group_left_by_an_exited_leader()
    try:
        record = attempt_for(pgid, member.start_time - 50)
        if tie == "member recorded":
            record.descendants.append(ProcessIdentity(pid=member.pid, start_time=member.start_time))
        else:  # its leader was reaped (or seen) after the member started: the id was the attempt's then
            record.group_held_ticks = member.start_time
        status = await processes.stop_tree(record, grace_s=0.2, confirm_s=0.2)
        assert status.gone and not status.unsignallable
        assert not proctree.identity_matches(member.pid, member.start_time)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)


async def test_a_reaped_leader_marks_its_group_held_just_before_the_reap(tmp_path: Path) -> None:
    """The worker's exit is read from its pidfd and it is reaped then: the attempt records
    that moment, so what its group left behind (started earlier) is provably the attempt's."""
    launched = await processes.launch(
        ["sh", "-c", "sleep 60 & exit 0"], tmp_path, {"PATH": os.environ["PATH"]}, tmp_path / "w.log", "tok"
    )
    record = attempt_for(launched.pid, launched.start_time)
    launched.process.attempt = record
    launched.release()
    try:
        assert await launched.process.wait() == 0
        (member,) = proctree.live_group_members(proctree.process_table(), launched.pgid)
        assert record.group_held_ticks is not None and record.group_held_ticks >= member.start_time
        status = await processes.stop_tree(record, grace_s=0.2, confirm_s=0.2)
        assert status.gone and not proctree.identity_matches(member.pid, member.start_time)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(launched.pgid, signal.SIGKILL)


async def test_a_leader_reaped_by_someone_else_leaves_no_mark(tmp_path: Path) -> None:
    """When the leader was reaped behind the waiter's back, the moment its group id was freed
    is unknown: the attempt vouches for no moment."""
    launched = await processes.launch(["true"], tmp_path, {"PATH": os.environ["PATH"]}, tmp_path / "w.log", "tok")
    record = attempt_for(launched.pid, launched.start_time)
    launched.process.attempt = record
    launched.release()
    os.waitpid(launched.pid, 0)
    assert await launched.process.wait() == 255
    assert record.group_held_ticks is None


async def test_a_legacy_record_without_start_time_is_closed_only_when_its_group_is_absent(
    sleeper: subprocess.Popen[bytes],
) -> None:
    status = await processes.stop_tree(attempt_for(sleeper.pid, None), grace_s=0.2, confirm_s=0.2)
    assert sleeper.poll() is None and not status.gone and "legacy" in status.unsignallable
    sleeper.kill()
    sleeper.wait()
    status = await processes.stop_tree(attempt_for(sleeper.pid, None), grace_s=0.2, confirm_s=0.2)
    assert status.gone


async def test_stop_tree_terminates_the_group_including_grandchildren() -> None:
    leader = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60 & wait"], start_new_session=True)
    try:
        deadline = time.monotonic() + 5
        while len(proctree.live_descendants(proctree.process_table(), leader.pid)) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        start = proctree.start_time_of(leader.pid)
        record = attempt_for(leader.pid, start)
        status = await processes.stop_tree(record, grace_s=2, confirm_s=2)
        assert status.gone
        assert len(record.descendants) == 2
        assert not proctree.live_group_members(proctree.process_table(), leader.pid)
    finally:
        if leader.poll() is None:
            os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()


async def test_sigterm_ignored_means_sigkill_after_the_grace() -> None:
    leader = subprocess.Popen(
        [
            "python3",
            "-c",
            "import signal,time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "print('ready', flush=True)\ntime.sleep(60)",
        ],
        start_new_session=True,
        stdout=subprocess.PIPE,
    )
    try:
        assert leader.stdout is not None and leader.stdout.readline() == b"ready\n"
        record = attempt_for(leader.pid, proctree.start_time_of(leader.pid))
        began = time.monotonic()
        status = await processes.stop_tree(record, grace_s=0.5, confirm_s=2)
        assert status.gone and time.monotonic() - began >= 0.5
        assert leader.wait(timeout=5) == -signal.SIGKILL
    finally:
        if leader.poll() is None:
            leader.kill()
        leader.wait()


async def test_a_recorded_descendant_outside_the_group_is_stopped_but_never_a_pid_that_changed_identity() -> None:
    escaped = subprocess.Popen(["sleep", "60"], start_new_session=True)
    stranger = subprocess.Popen(["sleep", "60"], start_new_session=True)
    leader = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        record = attempt_for(leader.pid, proctree.start_time_of(leader.pid))
        # As if recorded while it was still the leader's child (it left with setsid).
        record.descendants.append(ProcessIdentity(pid=escaped.pid, start_time=proctree.start_time_of(escaped.pid) or 0))
        # A record whose start time differs: that pid is another process now.
        record.descendants.append(
            ProcessIdentity(pid=stranger.pid, start_time=(proctree.start_time_of(stranger.pid) or 0) - 1)
        )
        status = await processes.stop_tree(record, grace_s=0.5, confirm_s=2)
        assert status.gone
        assert escaped.wait(timeout=5) == -signal.SIGTERM
        assert stranger.poll() is None, "a pid whose identity changed is never signalled"
    finally:
        for proc in (escaped, stranger, leader):
            if proc.poll() is None:
                proc.kill()
            proc.wait()


async def test_a_held_launch_runs_nothing_unless_released(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    env = {"PATH": os.environ["PATH"]}
    command = ["sh", "-c", f"touch {marker}; cat /proc/self/fd/$TASKGATE_WORKER_TOKEN_FD > {tmp_path / 'token'}"]
    held = await processes.launch(command, tmp_path, env, tmp_path / "abandoned.log", "tok")
    assert held.start_time == proctree.start_time_of(held.pid), "the identity is known while it is held"
    held.abandon()  # as when the scheduler dies before the release
    assert await held.process.wait() == processes.ABANDONED and not marker.exists()

    released = await processes.launch(command, tmp_path, env, tmp_path / "released.log", "tok")
    released.release()
    assert await released.process.wait() == 0 and marker.exists()
    assert (tmp_path / "token").read_text() == "tok", "the token arrives through its pipe"


def can_switch_to_nobody() -> bool:
    try:
        pwd.getpwnam("nobody")
    except KeyError:
        return False
    return os.geteuid() == 0


@pytest.mark.skipif(not can_switch_to_nobody(), reason="needs root and the user nobody")
async def test_held_launches_as_another_user_survive_busy_grpc_threads(tmp_path: Path) -> None:
    """The launch of a worker with its own user never forks the scheduler (regression).

    With ``user=``/``group=`` CPython forks instead of vforking, and gRPC's atfork
    handlers then ran in the child while gRPC threads were busy: about half the held
    trampolines died (SIGSEGV) before their release, or hung before their exec.
    """
    entry = pwd.getpwnam("nobody")
    run_as = processes.RunAs(uid=entry.pw_uid, gid=entry.pw_gid, home=entry.pw_dir)
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    stop = asyncio.Event()

    async def traffic() -> None:  # keeps gRPC's threads calling into the core during every spawn
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while not stop.is_set():
                await stub.Check(health_pb2.HealthCheckRequest(), timeout=10)

    callers = [asyncio.create_task(traffic()) for _ in range(4)]
    workspace = tmp_path / "ws"
    workspace.mkdir()
    os.chown(workspace, entry.pw_uid, entry.pw_gid)
    env = {"PATH": os.environ["PATH"]}
    try:
        await asyncio.sleep(0.1)
        for i in range(20):
            log_path = tmp_path / f"{i}.log"
            held = await asyncio.wait_for(
                processes.launch(["sh", "-c", "id -u; id -G"], workspace, env, log_path, "tok", run_as=run_as), 20
            )
            assert held.start_time is not None, f"launch {i}: the held worker died before its release"
            held.release()
            assert await asyncio.wait_for(held.process.wait(), 20) == 0, log_path.read_text()
            uid, groups = log_path.read_text().split("\n")[:2]
            assert uid == str(entry.pw_uid) and groups.split() == [str(entry.pw_gid)], "user and groups switched"
    finally:
        stop.set()
        await asyncio.gather(*callers, return_exceptions=True)
        await server.stop(None)


async def test_the_spawn_never_asks_subprocess_to_switch_users(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """user=/group=/extra_groups=/preexec_fn= would make CPython fork() the multi-threaded scheduler."""
    seen: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    class SpyPopen(subprocess.Popen[bytes]):  # every spawn goes through Popen, asyncio's too
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            seen.append((args, kwargs))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", SpyPopen)
    run_as = processes.RunAs(uid=os.getuid(), gid=os.getgid(), home=str(tmp_path))
    held = await processes.launch(
        ["true"], tmp_path, {"PATH": os.environ["PATH"]}, tmp_path / "l.log", "t", run_as=run_as
    )
    held.release()
    assert await held.process.wait() == 0
    assert len(seen) == 1
    args, kwargs = seen[0]
    assert not {"user", "group", "extra_groups", "preexec_fn"} & set(kwargs)
    # The switch happens after an exec instead: the spawned program is the SWITCH_USER step.
    argv = list(args[0] if args else kwargs["args"])
    assert argv[:5] == [sys.executable, "-I", "-S", "-c", processes.SWITCH_USER]


async def test_a_worker_that_dies_while_held_fails_the_launch_before_any_release(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = proctree.start_time_of
    killed: list[int] = []

    def kill_first(pid: int) -> int | None:  # the held process dies before its identity is read
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)
        deadline = time.monotonic() + 10
        while (stat := proctree.read_stat(pid)) is not None and stat.alive:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        return real(pid)

    monkeypatch.setattr(proctree, "start_time_of", kill_first)
    with pytest.raises(processes.LaunchFailed, match="exited before its release"):
        await processes.launch(["true"], tmp_path, {"PATH": os.environ["PATH"]}, tmp_path / "l.log", "t")
    assert killed


async def test_a_launch_failing_after_the_spawn_still_reaps_its_held_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from services.scheduler import cgroups

    spawned: list[int] = []

    def broken_add(cgroup: Path, pid: int) -> None:
        spawned.append(pid)
        raise OSError("cgroup.procs is not writable")

    monkeypatch.setattr(cgroups, "add", broken_add)
    with pytest.raises(OSError, match="not writable"):
        await processes.launch(
            ["true"], tmp_path, {"PATH": os.environ["PATH"]}, tmp_path / "l.log", "t", cgroup=tmp_path / "cg"
        )
    (pid,) = spawned
    deadline = time.monotonic() + 10
    while proctree.read_stat(pid) is not None:  # the abandoned trampoline exits and is reaped, not left a zombie
        assert time.monotonic() < deadline, "the held worker of a failed launch was never reaped"
        await asyncio.sleep(0.02)


def test_a_command_found_once_is_checked_again_and_a_removed_one_fails_the_launch(tmp_path: Path) -> None:
    tool = tmp_path / "bin" / "mytool"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    path = str(tool.parent)
    assert processes._executable("mytool", path) and processes._found[("mytool", path)] == str(tool)
    tool.unlink()
    assert not processes._executable("mytool", path), "the cached find is not trusted blindly"
    with pytest.raises(FileNotFoundError):
        processes._prepare(tmp_path, tmp_path / "x.log", "mytool", path, None)


NS_LAST_PID = Path("/proc/sys/kernel/ns_last_pid")
TAKE_PID_FOR_S = 20.0


# The new holder of a reused pid blocks SIGTERM, so a SIGTERM sent to it stays pending and shows
# in /proc (ShdPnd: process-directed signals): what reached it is read, not waited for.
BLOCKS_SIGTERM = (
    "import signal, sys, time; signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM}); "
    "print('ready', flush=True); time.sleep(60)"
)


def take_pid(pid: int, after_tick: int, script: str = BLOCKS_SIGTERM) -> subprocess.Popen[str] | None:
    """A new process (its own session, blocking SIGTERM) with ``pid``, freed just before: the
    next pid handed out is set to it through ``ns_last_pid``; None if another fork won it each
    time. It starts after ``after_tick`` (the freed pid's start time): a pid reused within the
    same clock tick would carry the same start time — which takes a pid-space wrap in that
    tick outside a test like this one."""
    while proctree.boot_ticks() <= after_tick + 1:
        time.sleep(0.005)
    # Tried for a time, not a count: while the rest of the suite runs on both cores, other
    # processes fork between the write and ours often enough that 50 tries once all lost.
    deadline = time.monotonic() + TAKE_PID_FOR_S
    while time.monotonic() < deadline:
        NS_LAST_PID.write_text(str(pid - 1))
        proc = subprocess.Popen(
            [sys.executable, "-c", script], start_new_session=True, stdout=subprocess.PIPE, text=True
        )
        if proc.pid == pid:
            assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
            return proc
        proc.kill()
        proc.wait()
    return None


def sigterm_pending(proc: subprocess.Popen[str]) -> bool:
    for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
        if line.startswith("ShdPnd:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    raise AssertionError("no ShdPnd line")


def assert_never_signalled(holder: subprocess.Popen[str]) -> None:
    assert holder.poll() is None and not sigterm_pending(holder), "the new holder of the pid was signalled"
    os.kill(holder.pid, signal.SIGTERM)  # the check itself can fail: a SIGTERM does show
    assert sigterm_pending(holder)


def reuse_after_first_look(monkeypatch: pytest.MonkeyPatch, victim: subprocess.Popen[bytes]) -> list[Any]:
    """From the first time the victim's identity is read on, its pid belongs to a new process:
    the victim is killed and reaped right after that read, and its pid taken (the list gets the
    new process, or the test is skipped if it cannot be had)."""
    real = proctree.start_time_of
    taken: list[Any] = []

    def start_time_of(pid: int) -> int | None:
        seen = real(pid)
        if pid == victim.pid and not taken:
            victim.kill()
            victim.wait()
            taken.append(take_pid(pid, seen or 0))
            if taken[0] is None:
                pytest.skip("another process took the freed pid each time")
        return seen

    monkeypatch.setattr(proctree, "start_time_of", start_time_of)
    return taken


needs_ns_last_pid = pytest.mark.skipif(
    not os.access(NS_LAST_PID, os.W_OK), reason="needs a writable /proc/sys/kernel/ns_last_pid (root)"
)


@needs_ns_last_pid
@pytest.mark.parametrize("as_leader", [True, False])
def test_a_pid_reused_between_the_identity_check_and_the_signal_is_not_hit(
    monkeypatch: pytest.MonkeyPatch, as_leader: bool
) -> None:
    """A real pid reuse in the window between confirming a process's identity and signalling
    it: the new holder of the pid (another program's session leader) lives on. As the
    attempt's leader, the group is signalled; as a recorded descendant outside it, the process."""
    victim = subprocess.Popen(["sleep", "60"], start_new_session=True)
    stat = proctree.read_stat(victim.pid)
    assert stat is not None
    if as_leader:
        attempt = attempt_for(victim.pid, stat.start_time)
        status = processes.TreeStatus(group=[stat])
    else:
        attempt = attempt_for(os.getpid() + 4_000_000, 1)  # a leader that is gone
        status = processes.TreeStatus(escaped=[stat])
    taken = reuse_after_first_look(monkeypatch, victim)
    try:
        processes.signal_group(attempt, status, signal.SIGTERM)
        assert taken and taken[0].pid == stat.pid, "the pid was not reused in the window"
        assert_never_signalled(taken[0])
    finally:
        for proc in (*taken, victim):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


@needs_ns_last_pid
def test_a_cgroup_member_whose_pid_is_reused_before_the_kill_is_not_hit(monkeypatch: pytest.MonkeyPatch) -> None:
    """``signal_all`` read a member, which then exits and its pid goes to a process outside the
    cgroup: that process is not signalled (a member still listed is)."""
    from services.scheduler import cgroups

    victim = subprocess.Popen(["sleep", "60"], start_new_session=True)
    member = subprocess.Popen(["sleep", "60"], start_new_session=True)
    victim_start = proctree.start_time_of(victim.pid) or 0
    in_cgroup = [victim.pid, member.pid]
    taken: list[Any] = []

    def members(path: Path) -> list[int]:
        listed = list(in_cgroup)
        if not taken:  # right after the first read: the victim exits, its pid goes to an outsider
            victim.kill()
            victim.wait()
            in_cgroup.remove(victim.pid)
            taken.append(take_pid(victim.pid, victim_start))
            if taken[0] is None:
                pytest.skip("another process took the freed pid each time")
        return listed

    monkeypatch.setattr(cgroups, "members", members)
    try:
        cgroups.signal_all(Path("/nonexistent-cgroup"), signal.SIGTERM)
        assert member.wait(timeout=5) == -signal.SIGTERM, "a listed member was not signalled"
        assert_never_signalled(taken[0])
    finally:
        for proc in (*taken, victim, member):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


def test_a_kernel_without_group_signals_through_a_pidfd_still_gets_the_group_signalled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before Linux 6.9 ``pidfd_send_signal`` refuses PIDFD_SIGNAL_PROCESS_GROUP (EINVAL): the
    leader, checked through its pidfd, has its group signalled by number as before."""
    import errno

    real = signal.pidfd_send_signal

    def without_group_flag(fd: int, sig: int, siginfo: Any = None, flags: int = 0) -> None:
        if flags:
            raise OSError(errno.EINVAL, "Invalid argument")
        real(fd, sig, siginfo, flags)

    monkeypatch.setattr(signal, "pidfd_send_signal", without_group_flag)
    leader = subprocess.Popen(["sh", "-c", "sleep 60 & wait"], start_new_session=True)
    try:
        deadline = time.monotonic() + 5
        while len(members := proctree.live_group_members(proctree.process_table(), leader.pid)) < 2:
            assert time.monotonic() < deadline, "the shell's child did not show"
            time.sleep(0.01)
        start = proctree.start_time_of(leader.pid)
        assert start is not None
        assert proctree.signal_identified(leader.pid, start, signal.SIGTERM, group=True)
        assert leader.wait(timeout=5) == -signal.SIGTERM
        child = next(m for m in members if m.pid != leader.pid)
        deadline = time.monotonic() + 5
        while proctree.identity_matches(child.pid, child.start_time):
            assert time.monotonic() < deadline, "the group's other member was not signalled"
            time.sleep(0.01)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()


def test_a_cgroup_with_more_members_than_one_pin_batch_has_every_member_signalled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from services.scheduler import cgroups

    procs = [subprocess.Popen(["sleep", "60"]) for _ in range(cgroups.PIN_BATCH + 6)]
    monkeypatch.setattr(cgroups, "members", lambda path: [p.pid for p in procs if p.poll() is None])
    try:
        cgroups.signal_all(Path("/nonexistent-cgroup"), signal.SIGTERM)
        assert [p.wait(timeout=5) for p in procs] == [-signal.SIGTERM] * len(procs)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


# A leader that forks one SIGTERM-blocking member of its session and group, says its pid, and exits.
LEAVES_A_SIGTERM_BLOCKER = (
    "import os, signal, sys, time; signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})\n"
    "if os.fork() == 0:\n"
    "    print('ready', flush=True); print(os.getpid(), flush=True); time.sleep(60)\n"
)


def pending_sigterm(pid: int) -> bool:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("ShdPnd:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    raise AssertionError("no ShdPnd line")


def through(fd: int) -> processes.StopContext:
    """A stop that signals the attempt's group through ``fd``, as ``Ownership`` does with the
    pidfd it keeps on a leader it launched."""
    return processes.StopContext(group_signal=lambda attempt, sig: proctree.signal_led_group(fd, sig))


async def test_a_leaderless_group_the_table_cannot_prove_is_stopped_through_the_leaders_kept_pidfd() -> None:
    """The leader exited and was reaped; its member started after the last moment the table
    shows the group id was the attempt's, so the table alone cannot tell it from another
    program's group that took the id. The pidfd kept on the leader can: the kernel signals the
    group of that very process, and the member is stopped for certain."""
    pgid, member, fd = group_left_by_a_leader(keep_pidfd=True)
    try:
        record = attempt_for(pgid, member.start_time - 50)
        record.group_held_ticks = member.start_time - 10
        # The table alone: unproven, nothing signalled (as before a pidfd was kept).
        alone = await processes.stop_tree(record, grace_s=0.1, confirm_s=0.1)
        assert not alone.gone and "may have been reused" in alone.unsignallable
        assert proctree.identity_matches(member.pid, member.start_time)
        status = await processes.stop_tree(record, grace_s=0.5, confirm_s=2, ctx=through(fd))
        assert status.gone and not status.unsignallable
        assert not proctree.identity_matches(member.pid, member.start_time)
    finally:
        os.close(fd)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)


@needs_ns_last_pid
async def test_a_group_id_reused_after_the_attempts_group_emptied_is_left_alone_through_the_kept_pidfd() -> None:
    """The attempt's group ended whole; its id went to another program's session leader, which
    left a member behind and exited. The table shows a leaderless group with the attempt's id,
    younger than anything it can tie to the attempt: unproven. The pidfd kept on the attempt's
    leader says its group has no member at all, so this one is another program's: nothing is
    signalled and the attempt's processes are proven gone."""
    leader = subprocess.Popen(["true"], start_new_session=True)
    fd = os.pidfd_open(leader.pid)
    taker = None
    member_pid = None
    try:
        leader_start = proctree.start_time_of(leader.pid) or 0
        leader.wait()
        held = proctree.boot_ticks()
        taker = take_pid(leader.pid, held, LEAVES_A_SIGTERM_BLOCKER)
        if taker is None:
            pytest.skip("another process took the freed pid each time")
        assert taker.stdout is not None
        member_pid = int(taker.stdout.readline())
        taker.wait()
        record = attempt_for(leader.pid, leader_start)
        record.group_held_ticks = held
        alone = await processes.stop_tree(record, grace_s=0.1, confirm_s=0.1)
        assert not alone.gone and "may have been reused" in alone.unsignallable, "the table alone cannot tell"
        status = await processes.stop_tree(record, grace_s=0.1, confirm_s=0.1, ctx=through(fd))
        assert status.gone and not status.group
        member = proctree.read_stat(member_pid)
        assert member is not None and member.alive and member.pgid == leader.pid, "another program's process was hit"
        assert not pending_sigterm(member_pid), "another program's process was signalled"
    finally:
        os.close(fd)
        if member_pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(member_pid, signal.SIGKILL)
        if taker is not None and taker.poll() is None:
            taker.kill()
            taker.wait()


async def test_a_kernel_without_group_signals_through_a_pidfd_falls_back_to_what_the_table_proves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before Linux 6.9 the kept pidfd cannot signal a group (EINVAL): nothing goes through it,
    and the members the table proves the attempt's are signalled one by one, as before."""
    import errno

    real = signal.pidfd_send_signal
    refused: list[int] = []

    def without_group_flag(fd: int, sig: int, siginfo: Any = None, flags: int = 0) -> None:
        if flags:
            refused.append(sig)
            raise OSError(errno.EINVAL, "Invalid argument")
        real(fd, sig, siginfo, flags)

    monkeypatch.setattr(signal, "pidfd_send_signal", without_group_flag)
    pgid, member, fd = group_left_by_a_leader(keep_pidfd=True)
    try:
        record = attempt_for(pgid, member.start_time - 50)
        record.group_held_ticks = member.start_time  # its leader was reaped after the member started
        status = await processes.stop_tree(record, grace_s=0.5, confirm_s=2, ctx=through(fd))
        assert refused, "the kept pidfd was not tried"
        assert status.gone and not proctree.identity_matches(member.pid, member.start_time)
    finally:
        os.close(fd)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)


def limits_after_open_files_for(soft: int, hard: int, max_running: int) -> tuple[int, int, int]:
    """In a fresh interpreter started under (soft, hard) open-files limits: what
    ``open_files_for(max_running)`` returned, and the soft limit in force after it."""
    import resource

    code = (
        "import resource, sys\n"
        "from services.scheduler.processes import open_files_for\n"
        "limit, needed = open_files_for(int(sys.argv[1]))\n"
        "print(limit, needed, resource.getrlimit(resource.RLIMIT_NOFILE)[0])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(max_running)],
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard)),
        cwd=Path(__file__).resolve().parents[3],
        capture_output=True,
        text=True,
        check=True,
    )
    limit, needed, in_force = (int(v) for v in done.stdout.split())
    return limit, needed, in_force


def test_the_scheduler_raises_its_open_files_limit_to_the_hard_limit() -> None:
    """Each live worker keeps two pidfds open in the scheduler; a common soft limit of 1,024
    would cap max_running near 400. The soft limit goes up to the hard one."""
    import resource

    hard = min(resource.getrlimit(resource.RLIMIT_NOFILE)[1], 4096)
    limit, needed, in_force = limits_after_open_files_for(256, hard, 64)
    assert needed == processes.FDS_PER_WORKER * 64 + processes.FDS_BESIDES_WORKERS
    assert limit == in_force == hard


def test_a_hard_limit_below_the_need_is_reported_not_hidden() -> None:
    limit, needed, in_force = limits_after_open_files_for(256, 300, 1024)
    assert (limit, in_force) == (300, 300) and needed > limit  # the scheduler logs open_files_limit_low


def test_a_group_this_process_may_not_signal_is_no_answer_through_the_pidfd(monkeypatch: pytest.MonkeyPatch) -> None:
    """EPERM (no member this process may signal): neither "signalled" nor "empty" — the caller
    falls back to what the process table proves, as without the pidfd."""
    import errno

    def refuses(fd: int, sig: int, siginfo: Any = None, flags: int = 0) -> None:
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(signal, "pidfd_send_signal", refuses)
    assert proctree.signal_led_group(-1, 0) is None
