"""Detached daemons: a cancel is `cancelled` only when nothing of the attempt remains.

The engine runs in this process (the test process becomes the child subreaper)
with real workers, in both proof modes this machine supports, on SQLite and on
PostgreSQL. The outcome must be `cancelled` with the daemon really gone, or
`needs_reconciliation` naming its pid — never `cancelled` while it lives.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from libs import proctree
from libs.db import Database
from libs.settings import WorkerProfile
from services.scheduler import cgroups, processes
from services.scheduler.domain import Attempt, FailureCode, ProcessIdentity, State, Task
from services.scheduler.ownership import Ownership
from services.scheduler.store import MIGRATIONS
from tests.support.postgres import fresh_database
from tests.unit.scheduler.test_engine import Harness, group_alive, running, start_harness

DAEMONS = {
    # setsid: the daemon leaves the worker's session and group, its parent exits at once.
    "setsid-daemon": WorkerProfile(command=["sh", "-c", "setsid sh -c 'sleep 31 &'; sleep 300"]),
    # A double fork without setsid: the daemon stays in the group but loses its parent.
    "double-fork": WorkerProfile(command=["sh", "-c", "(sleep 31 &); sleep 300"]),
}


def cgroups_available(versions: tuple[int, ...] = (2,)) -> bool:
    try:
        cgroups.Cgroups.detect("taskgate-probe", versions).close()
    except cgroups.CgroupUnavailable:
        return False
    return True


MODES = [
    pytest.param("cgroup", marks=pytest.mark.skipif(not cgroups_available(), reason="no usable cgroup v2 here")),
    pytest.param(
        "cgroup_v1", marks=pytest.mark.skipif(not cgroups_available((1,)), reason="no usable v1 freezer here")
    ),
    "subreaper",
]


def daemons_after(start_time: int) -> list[proctree.ProcStat]:
    """Live `sleep 31` processes started at or after ``start_time`` (the workers' daemons)."""
    found = []
    for stat in proctree.process_table().values():
        if not stat.alive or stat.start_time < start_time:
            continue
        try:
            cmdline = Path(f"/proc/{stat.pid}/cmdline").read_bytes()
        except OSError:
            continue
        if cmdline == b"sleep\x0031\x00":
            found.append(stat)
    return found


async def wait_daemon(h: Harness, task: Task) -> tuple[int, proctree.ProcStat]:
    _, attempts = await h.engine.get_task(task.task_id)
    leader_start = attempts[-1].pid_start_time or 0
    deadline = time.monotonic() + 10
    while True:
        found = [d for d in daemons_after(leader_start) if d.ppid != attempts[-1].pid]
        # The daemon has lost its parent: re-parented to this process (the subreaper).
        if found and found[0].ppid == os.getpid():
            return leader_start, found[0]
        assert time.monotonic() < deadline, "the daemon did not detach"
        time.sleep(0.02)


def kill_quietly(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Database:
    if request.param == "sqlite":
        return Database(f"sqlite:///{tmp_path / 'scheduler.db'}", MIGRATIONS)
    return Database(fresh_database(request.getfixturevalue("postgres_url"), "proof"), MIGRATIONS)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("profile", sorted(DAEMONS))
async def test_a_detached_daemon_is_stopped_before_cancelled(
    tmp_path: Path, database: Database, mode: str, profile: str
) -> None:
    h = await start_harness(tmp_path, db=database, workers=DAEMONS, proof_mode=mode)
    daemon = None
    try:
        assert (h.engine.ownership.cgroups is not None) == mode.startswith("cgroup") and h.engine.ownership.subreaper
        if h.engine.ownership.cgroups is not None:
            assert h.engine.ownership.cgroups.version == (1 if mode == "cgroup_v1" else 2)
        task = await running(h, profile)
        _, daemon = await wait_daemon(h, task)
        done = await h.engine.cancel(task.task_id, wait_s=10)
        done = await h.wait(task.task_id, [State.CANCELLED, State.NEEDS_RECONCILIATION])
        alive = proctree.identity_matches(daemon.pid, daemon.start_time)
        if done.state == State.CANCELLED:
            assert not alive, "cancelled while the daemon lives"
        else:
            assert done.failure is not None and str(daemon.pid) in done.failure.message
        # One attempt alone: the daemon is attributable, so it is really stopped.
        assert done.state == State.CANCELLED and done.cancellation and done.cancellation.cleanup == "confirmed"
        _, attempts = await h.engine.get_task(task.task_id)
        assert (daemon.pid, daemon.start_time) in {(d.pid, d.start_time) for d in attempts[-1].descendants}
        if mode.startswith("cgroup"):
            assert attempts[-1].cgroup and not Path(attempts[-1].cgroup).exists(), "the empty cgroup is removed"
    finally:
        if daemon is not None and proctree.identity_matches(daemon.pid, daemon.start_time):
            kill_quietly(daemon.pid)
        await h.close()


async def test_an_orphan_that_fits_two_attempts_is_never_signalled_and_named(tmp_path: Path) -> None:
    """Subreaper-only mode cannot tell whose orphan it is when two attempts could have made it."""
    h = await start_harness(tmp_path, workers=DAEMONS, proof_mode="subreaper")
    daemon = None
    try:
        first = await running(h, "sleeper")
        second = await running(h, "setsid-daemon")
        _, daemon = await wait_daemon(h, second)
        # Its parent exited before anything recorded it (the supervisor runs hourly here).
        done = await h.engine.cancel(second.task_id, wait_s=10)
        done = await h.wait(second.task_id, [State.CANCELLED, State.NEEDS_RECONCILIATION])
        assert done.state == State.NEEDS_RECONCILIATION
        assert done.failure and done.failure.code == "CLEANUP_UNCONFIRMED" and str(daemon.pid) in done.failure.message
        assert proctree.identity_matches(daemon.pid, daemon.start_time), "an unattributable pid is never signalled"
        kill_quietly(daemon.pid)
        deadline = time.monotonic() + 10
        while proctree.identity_matches(daemon.pid, daemon.start_time):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        settled = await h.engine.retry_cleanup(second.task_id)
        assert settled.state == State.CANCELLED
        assert (await h.engine.store.get_task(first.task_id)).state == State.RUNNING
    finally:
        if daemon is not None:
            kill_quietly(daemon.pid)
        await h.close()


async def test_zombies_of_reparented_orphans_are_reaped_and_leaders_left_to_asyncio(tmp_path: Path) -> None:
    h = await start_harness(tmp_path, workers=DAEMONS, proof_mode="subreaper")
    try:
        task = await running(h, "double-fork")
        _, daemon = await wait_daemon(h, task)
        await h.engine.supervise_once()  # attributes the orphan to the one attempt it can be from
        _, attempts = await h.engine.get_task(task.task_id)
        assert daemon.pid in [d.pid for d in attempts[-1].descendants]
        os.kill(daemon.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while (stat := proctree.read_stat(daemon.pid)) is not None and stat.start_time == daemon.start_time:
            await h.engine.supervise_once()
            assert time.monotonic() < deadline, "the zombie was not reaped"
        leader = attempts[-1].pid or -1
        assert proctree.identity_matches(leader, attempts[-1].pid_start_time or -1), "the leader is untouched"
        done = await h.engine.cancel(task.task_id, wait_s=10)
        assert done.state == State.CANCELLED
        _, attempts = await h.engine.get_task(task.task_id)
        assert attempts[-1].signal == signal.SIGTERM, "asyncio still got the leader's own exit status"
    finally:
        await h.close()


async def test_a_child_still_being_launched_is_never_taken_for_an_orphan(tmp_path: Path) -> None:
    h = await start_harness(tmp_path, proof_mode="subreaper")
    child = None
    try:
        task = await running(h, "sleeper")
        # A launch has forked (its pid is not known yet): its child must not become this attempt's.
        h.engine.ownership._forking["f" * 32] = proctree.boot_ticks() - 1
        child = subprocess.Popen(["sleep", "30"])
        pending = h.engine.ownership.orphan_check(proctree.process_table())
        assert child.pid in [p.pid for p in pending]
        attempt = next(a for a in h.engine.ownership.owned.values() if a.task_id == task.task_id)
        assert child.pid not in [d.pid for d in attempt.descendants]
        child.kill()
        child.wait()
        del h.engine.ownership._forking["f" * 32]
        assert (await h.engine.cancel(task.task_id, wait_s=10)).state == State.CANCELLED
    finally:
        if child is not None:
            child.kill()
            child.wait()
        await h.close()


async def test_a_leader_that_dies_in_its_fork_window_is_left_to_asyncio_never_reaped() -> None:
    """A supervisor pass between a launch's fork and ``forked()`` must not reap the new child.

    Its pid is not a known leader yet; reaping it would steal asyncio's exit status and
    free the pid for reuse while the launch still reads the worker's identity.
    """
    own = Ownership(proctree.process_table, lambda: set(), reap_unknown=True)
    own.subreaper = True  # as in the real scheduler, where every unknown child is an orphan
    attempt = Attempt(attempt_id="f" * 32, task_id="t" * 32, number=1, boot_id="b", token_hash="h")
    await own.forking(attempt)
    child = subprocess.Popen(["true"])  # forked in the window, dies before its pid is recorded
    try:
        deadline = time.monotonic() + 10
        while (stat := proctree.read_stat(child.pid)) is not None and stat.alive:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert stat is not None, "a zombie until someone waits for it"
        own.look_after({child.pid: stat})  # the supervisor's pass, limited to this child
        assert proctree.read_stat(child.pid) is not None, "reaped in the fork window"
        own.forked(attempt)
        own.look_after({child.pid: stat})  # once the window closed, an unknown zombie child is reaped
        assert proctree.read_stat(child.pid) is None
    finally:
        child.wait()
        own.drop(attempt)


def test_a_child_whose_fork_returned_is_a_leader_at_once_not_an_orphan() -> None:
    """The spawning thread says the pid as soon as the fork returns (``Ownership.spawned``):
    from then on the new child is neither pending nor anyone's orphan, nor reaped."""
    own = Ownership(proctree.process_table, lambda: set(), reap_unknown=True)
    own.subreaper = True
    attempt = Attempt(attempt_id="f" * 32, task_id="t" * 32, number=1, boot_id="b", token_hash="h")
    own.owned[attempt.attempt_id] = attempt
    own._forking[attempt.attempt_id] = proctree.boot_ticks() - 1
    child = subprocess.Popen(["sleep", "30"])
    try:
        table = proctree.process_table()
        assert child.pid in [p.pid for p in own.orphan_check(table)], "in the fork window: pending"
        own.spawned(attempt.attempt_id, child.pid)
        assert child.pid not in [p.pid for p in own.orphan_check(proctree.process_table())]
        child.kill()
        deadline = time.monotonic() + 10
        while (stat := proctree.read_stat(child.pid)) is not None and stat.alive:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        own.reap(proctree.process_table())
        assert proctree.read_stat(child.pid) is not None, "a spawned leader's zombie is its launch's to reap"
        own.forked(attempt)
        assert own._forking == {} and own._spawned == {}
    finally:
        child.kill()
        child.wait()


async def test_an_exit_during_another_launchs_fork_window_is_proven_at_the_next_reads_without_a_stop(
    tmp_path: Path,
) -> None:
    h = await start_harness(tmp_path, proof_mode="subreaper")
    child = None
    stops: list[str] = []
    try:
        task = await running(h, "sleeper")
        stopper = h.engine.stopper
        original = stopper.stop_tree

        async def recording_stop_tree(attempt: Attempt) -> object:
            stops.append(attempt.task_id)
            return await original(attempt)

        stopper.stop_tree = recording_stop_tree  # type: ignore[method-assign,assignment]
        # Another launch has forked and its pid is not known yet; its child started after our leader.
        h.engine.ownership._forking["f" * 32] = proctree.boot_ticks() - 1
        child = subprocess.Popen(["sleep", "30"])
        _, attempts = await h.engine.get_task(task.task_id)
        scans = h.engine.runtime.scans
        reads = scans.reads
        os.kill(attempts[-1].pid or -1, signal.SIGKILL)  # the worker's own end
        deadline = time.monotonic() + 10
        while scans.reads < reads + 2:  # the exit looked, and found the child of the fork in flight
            assert time.monotonic() < deadline
            await asyncio.sleep(0.002)
        assert (await h.engine.store.get_task(task.task_id)).state == State.RUNNING, "not proven yet"
        h.engine.ownership.spawned("f" * 32, child.pid)  # that launch's fork returned
        done = await h.wait(task.task_id, [State.FAILED])
        assert done.failure is not None and done.failure.code == FailureCode.WORKER_KILLED
        assert stops == [], "nothing to signal: proven at the next shared reads, not by a stop"
    finally:
        h.engine.ownership._forking.pop("f" * 32, None)
        h.engine.ownership._spawned.pop("f" * 32, None)
        if child is not None:
            child.kill()
            child.wait()
        await h.close()


def test_the_live_leaders_read_from_the_scans_thread_survives_the_loop_changing_them() -> None:
    """The leaders come from the loop's live attempts, read from a thread: a change meanwhile
    ("dictionary changed size during iteration") is read again, never a failed exit proof."""
    calls: list[int] = []

    def leaders() -> set[int]:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("dictionary changed size during iteration")
        return {12345}

    own = Ownership(proctree.process_table, leaders, reap_unknown=False)
    assert own._leader_pids() == {12345} and len(calls) == 2


# The leader exits at once; what it leaves in its group ignores SIGTERM and re-forks itself
# every 10 ms, each generation exiting as the next starts: by the end of a stop's grace every
# live member is younger than the leader's reap.
HOPPER = WorkerProfile(command=["sh", "-c", "trap '' TERM; hop() { sleep 0.01; hop & exit 0; }; hop & exit 0"])


async def test_leftovers_that_keep_reforking_in_the_group_are_stopped_through_the_kept_pidfd(tmp_path: Path) -> None:
    """Subreaper-only mode, another attempt running: the leftovers fit both attempts as orphans,
    and once SIGTERM's grace is over each is younger than anything that ties the group id to this
    attempt — the process table alone cannot prove them its own, so before the pidfd was kept the
    SIGKILL never went out and they ran on after the task ended. Through the pidfd kept on the
    leader the kernel proves and stops the whole group at once; the pidfd is closed once the
    attempt is proven gone."""
    h = await start_harness(tmp_path, workers={"hopper": HOPPER}, proof_mode="subreaper")
    pgid = None
    try:
        other = await running(h, "sleeper")
        task = await h.create("hopper")
        assert await h.engine.dispatch_once() == 1
        done = await h.wait(task.task_id, [State.COMPLETED, State.FAILED])
        _, attempts = await h.engine.get_task(task.task_id)
        pgid = attempts[-1].pgid
        assert pgid is not None
        assert done.state == State.COMPLETED
        for _ in range(10):  # generations 50 ms apart: none may show for longer than one
            assert not group_alive(pgid), "the worker's leftovers run on after its task ended"
            await asyncio.sleep(0.03)
        ownership = h.engine.ownership
        assert attempts[-1].attempt_id not in ownership.owned, "the attempt was not proven gone"
        assert attempts[-1].attempt_id not in ownership._group_fds, "its pidfd was kept after the proof"
        _, running_attempts = await h.engine.get_task(other.task_id)
        assert running_attempts[-1].attempt_id in ownership._group_fds, "a live attempt's pidfd is kept"
    finally:
        if pgid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
        await h.close()


async def test_no_pidfd_outlives_its_attempt(tmp_path: Path) -> None:
    """Every launch keeps one pidfd on its leader; tasks that end, are cancelled, or fail their
    launch after the spawn leave none open, and the engine's shutdown closes the rest."""
    h = await start_harness(tmp_path, proof_mode="subreaper")
    closed = False
    try:
        before = len(os.listdir("/proc/self/fd"))
        ended = [await running(h, "sleeper") for _ in range(3)]
        assert len(h.engine.ownership._group_fds) == 3
        assert len(os.listdir("/proc/self/fd")) > before
        for task in ended:
            done = await h.engine.cancel(task.task_id, wait_s=10)
            assert done.state == State.CANCELLED
        assert h.engine.ownership._group_fds == {}
        live = await running(h, "sleeper")
        assert list(h.engine.ownership._group_fds) == [(await h.engine.get_task(live.task_id))[1][-1].attempt_id]
        await h.close()
        closed = True
        assert h.engine.ownership._group_fds == {}
    finally:
        if not closed:
            await h.close()


def test_dropping_an_attempt_kills_what_of_its_group_a_process_table_read_missed() -> None:
    """``drop`` is the conclusion that nothing of the attempt lives. A process-table read is no
    snapshot (a member that forks and exits while the read walks /proc can leave none of its
    generations in it), so the group gets a last SIGKILL through the kept pidfd — here a member
    the conclusion overlooked, after its leader was reaped."""
    own = Ownership(proctree.process_table, lambda: set(), reap_unknown=False)
    leader = subprocess.Popen(
        ["sh", "-c", "sleep 60 & echo $!; exit 0"], start_new_session=True, stdout=subprocess.PIPE
    )
    attempt = Attempt(
        attempt_id="d" * 32, task_id="t" * 32, number=1, boot_id="b", token_hash="h", pid=leader.pid, pgid=leader.pid
    )
    own.owned[attempt.attempt_id] = attempt
    own.keep_group(attempt, os.pidfd_open(leader.pid))
    assert leader.stdout is not None
    member = int(leader.stdout.readline())
    leader.wait()
    try:
        assert proctree.read_stat(member) is not None and proctree.read_stat(member).alive  # type: ignore[union-attr]
        own.drop(attempt)
        deadline = time.monotonic() + 5
        while (stat := proctree.read_stat(member)) is not None and stat.alive:
            assert time.monotonic() < deadline, "the overlooked member lives on after the drop"
            time.sleep(0.01)
        assert own._group_fds == {} and attempt.attempt_id not in own.owned
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(member, signal.SIGKILL)


# --- The kernel's proof of an exited attempt (processes.kernel_proof): no process-table read ---

LEAVES_A_SETSID_DAEMON = WorkerProfile(command=["sh", "-c", "setsid sh -c 'sleep 31 &'; exit 0"])


@pytest.mark.parametrize("mode", MODES)
async def test_a_daemon_left_by_a_worker_that_exits_is_stopped_before_its_task_ends(tmp_path: Path, mode: str) -> None:
    """The worker exits at once, leaving a daemon in a session of its own: its group is empty
    and nothing recorded it, so the kernel's proof must not conclude — the cgroup holds it (cgroup
    modes) or it is an orphan of this subreaper (subreaper mode) — and the table read that follows
    finds and stops it before the task completes."""
    from services.scheduler.metrics import EXIT_PROOFS

    h = await start_harness(tmp_path, workers={"leaves-daemon": LEAVES_A_SETSID_DAEMON}, proof_mode=mode)
    began = proctree.boot_ticks() - 1
    by_table = EXIT_PROOFS.labels(by="table")._value.get()
    try:
        task = await h.create("leaves-daemon")
        assert await h.engine.dispatch_once() == 1
        done = await h.wait(task.task_id, [State.COMPLETED, State.FAILED, State.NEEDS_RECONCILIATION])
        assert done.state == State.COMPLETED
        assert daemons_after(began) == [], "the task completed while its worker's daemon lives"
        assert EXIT_PROOFS.labels(by="table")._value.get() == by_table + 1, "a table read looked for what was left"
        _, attempts = await h.engine.get_task(task.task_id)
        assert attempts[-1].attempt_id not in h.engine.ownership.owned
    finally:
        for daemon in daemons_after(began):
            kill_quietly(daemon.pid)
        await h.close()


needs_kernel_answers = pytest.mark.skipif(
    not proctree.kernel_answers_exits(),
    reason="this kernel lists no children in /proc or cannot signal a group through a pidfd (before 6.9)",
)


def _held_attempt(command: list[str], own: Ownership, cgroup: Path | None = None) -> tuple[Attempt, subprocess.Popen]:  # type: ignore[type-arg]
    """A leader in its own session (in ``cgroup`` from its start), its pidfd kept as the engine
    keeps it, and the attempt that records it."""
    leader = subprocess.Popen(
        command,
        start_new_session=True,
        stdout=subprocess.PIPE,
        preexec_fn=(lambda: (cgroup / "cgroup.procs").write_text("0")) if cgroup else None,  # noqa: PLW1509
    )
    stat = proctree.read_stat(leader.pid)
    assert stat is not None
    attempt = Attempt(
        attempt_id=f"{leader.pid:032x}",
        task_id="t" * 32,
        number=1,
        boot_id="b",
        token_hash="h",
        pid=leader.pid,
        pgid=leader.pid,
        pid_start_time=stat.start_time,
        cgroup=str(cgroup) if cgroup else None,
    )
    own.owned[attempt.attempt_id] = attempt
    own.keep_group(attempt, os.pidfd_open(leader.pid))
    return attempt, leader


def wait_own_session(pid: int) -> None:
    """Until ``pid`` has left its parent's group for a session of its own (``setsid``)."""
    deadline = time.monotonic() + 5
    while (stat := proctree.read_stat(pid)) is None or stat.sid != pid:
        assert stat is not None and time.monotonic() < deadline, "it never started its own session"
        time.sleep(0.01)


def _context(own: Ownership, strays: bool = False) -> processes.StopContext:
    ctx = own.stop_context()
    ctx.orphan_check = own.orphan_check  # as with a subreaper
    ctx.strays = lambda: strays
    return ctx


@needs_kernel_answers
def test_the_kernel_proves_an_attempt_gone_when_its_group_is_empty_and_nothing_else_is_left() -> None:
    own = Ownership(proctree.process_table, lambda: set(), reap_unknown=False)
    attempt, leader = _held_attempt(["true"], own)
    leader.wait()
    status = processes.kernel_proof(attempt, _context(own))
    assert status is not None and status.gone
    # Each of these leaves the proof to a table read.
    assert processes.kernel_proof(attempt, _context(own, strays=True)) is None, "a child that may be an orphan"
    assert processes.kernel_proof(attempt.model_copy(update={"pid_start_time": None}), _context(own)) is None
    own.drop(attempt)
    assert processes.kernel_proof(attempt, _context(own)) is None, "no pidfd kept: the kernel cannot say"


@needs_kernel_answers
def test_the_kernel_proof_leaves_a_live_group_member_or_recorded_descendant_to_the_table() -> None:
    own = Ownership(proctree.process_table, lambda: set(), reap_unknown=False)
    attempt, leader = _held_attempt(["sh", "-c", "sleep 60 & echo $!; setsid sleep 60 & echo $!; exit 0"], own)
    assert leader.stdout is not None
    member, escaped = int(leader.stdout.readline()), int(leader.stdout.readline())
    leader.wait()
    wait_own_session(escaped)
    try:
        assert processes.kernel_proof(attempt, _context(own)) is None, "a member is left in the group"
        os.kill(member, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while processes.kernel_proof(attempt, _context(own)) is None:
            assert time.monotonic() < deadline, "the group emptied but the kernel never said so"
            time.sleep(0.01)
        stat = proctree.read_stat(escaped)
        assert stat is not None and stat.alive
        attempt.descendants.append(ProcessIdentity(pid=escaped, start_time=stat.start_time))
        assert processes.kernel_proof(attempt, _context(own)) is None, "a recorded descendant is alive"
    finally:
        for pid in (member, escaped):
            kill_quietly(pid)


@pytest.mark.skipif(not cgroups_available(), reason="no usable cgroup v2 here")
@needs_kernel_answers
def test_the_kernel_proof_reads_the_cgroup_and_removes_it_once_empty() -> None:
    groups = cgroups.Cgroups.detect("taskgate-kernel-proof", (2,))
    own = Ownership(proctree.process_table, lambda: set(), reap_unknown=False)
    cgroup = groups.create("k" * 32)
    try:
        # A daemon in a session of its own, still in the attempt's cgroup.
        attempt, leader = _held_attempt(["sh", "-c", "setsid sleep 60 & echo $!; exit 0"], own, cgroup)
        assert leader.stdout is not None
        daemon = int(leader.stdout.readline())
        leader.wait()
        wait_own_session(daemon)
        assert processes.kernel_proof(attempt, _context(own)) is None, "the cgroup has a member"
        assert processes.kernel_proof(attempt, _context(own), remove_empty_cgroup=True) is None
        assert cgroup.exists(), "a cgroup with a member is not removed"
        kill_quietly(daemon)
        deadline = time.monotonic() + 5
        while (status := processes.kernel_proof(attempt, _context(own), remove_empty_cgroup=True)) is None:
            assert time.monotonic() < deadline, "the cgroup emptied but the proof never came"
            time.sleep(0.01)
        assert status.gone and not cgroup.exists(), "the empty cgroup is removed with the proof"
    finally:
        cgroups.kill(cgroup, groups.has_kill) if cgroup.exists() else None
        cgroups.remove(cgroup)
        groups.close()


@needs_kernel_answers
def test_strays_are_the_live_children_that_are_no_known_leader() -> None:
    before = proctree.orphan_parent_children()  # whatever else this test process has started
    leaders: set[int] = set()
    own = Ownership(proctree.process_table, lambda: before | leaders, reap_unknown=False)
    assert not own.strays()
    child = subprocess.Popen(["sleep", "60"])
    try:
        assert own.strays(), "a child that is not a leader may be an orphan"
        leaders.add(child.pid)
        assert not own.strays()
        leaders.clear()
        child.kill()
        deadline = time.monotonic() + 5
        while (stat := proctree.read_stat(child.pid)) is not None and stat.alive:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert child.pid in proctree.orphan_parent_children(), "a zombie until reaped"
        assert not own.strays(), "a dead child is nobody's process"
    finally:
        child.kill()
        child.wait()


@contextlib.contextmanager
def _a_child_in_a_launching_cgroup(name: str) -> Iterator[tuple[Ownership, Path, str]]:
    """An ownership in cgroup mode (cgroups under ``name``) and a child of this process alone
    in the cgroup of attempt ``launching``: (the ownership, that cgroup, ``launching``)."""
    groups = cgroups.Cgroups.detect(name, (2,))
    before = proctree.orphan_parent_children()
    own = Ownership(proctree.process_table, lambda: before, reap_unknown=False)
    own.cgroups = groups
    launching = "l" * 32
    cgroup = groups.create(launching)
    child = subprocess.Popen(["sleep", "60"], preexec_fn=lambda: (cgroup / "cgroup.procs").write_text("0"))  # noqa: PLW1509
    try:
        yield own, cgroup, launching
    finally:
        child.kill()
        child.wait()
        cgroups.remove(cgroup)
        groups.close()


@pytest.mark.skipif(not cgroups_available(), reason="no usable cgroup v2 here")
@needs_kernel_answers
def test_a_worker_being_launched_in_its_attempts_cgroup_is_no_stray() -> None:
    """Under load a launch's worker is nearly always a child not recorded yet. Born and held alone
    in its launching attempt's cgroup, it is not counted against another attempt's proof. The same
    child in another cgroup, or not alone in its own, or in the cgroup of a launch that has said
    its pid already, is."""
    with _a_child_in_a_launching_cgroup("taskgate-strays") as (own, cgroup, launching):
        assert own.strays(), "not launching: a child nobody knows"
        own._forking[launching] = proctree.boot_ticks() - 1
        assert not own.strays(), "the launching attempt's own worker"
        assert own.kernel_may_prove()
        # A held worker is alone in its cgroup: a second process there is not taken for it.
        second = subprocess.Popen(["sleep", "60"], preexec_fn=lambda: (cgroup / "cgroup.procs").write_text("0"))  # noqa: PLW1509
        try:
            assert own.strays(), "two processes in a launching cgroup: either may be an orphan"
        finally:
            second.kill()
            second.wait()
        assert not own.strays()
        # A process in a cgroup below the launching one is no held worker (one is born in the
        # launching cgroup itself): a child of ours there counts.
        inner = cgroup / "inner"
        inner.mkdir()
        nested = subprocess.Popen(["sleep", "60"], preexec_fn=lambda: (inner / "cgroup.procs").write_text("0"))  # noqa: PLW1509
        try:
            assert own.strays(), "a child in a cgroup below the launching one"
        finally:
            nested.kill()
            nested.wait()
            deadline = time.monotonic() + 10
            while True:  # the cgroup empties as the exit completes
                try:
                    inner.rmdir()
                    break
                except OSError:
                    assert time.monotonic() < deadline, "the cgroup below never emptied"
                    time.sleep(0.01)
        assert not own.strays()
        own._forking["o" * 32] = own._forking.pop(launching)
        assert own.strays(), "another launch's cgroup does not hold it"
        # A launch that has said its worker's pid: that pid is a leader; anything else alone in
        # its cgroup is not taken for the worker.
        del own._forking["o" * 32]
        own._spawned[launching] = 1
        assert own.strays(), "a launch whose pid is said holds no unknown child"


@pytest.mark.skipif(not cgroups_available(), reason="no usable cgroup v2 here")
@needs_kernel_answers
def test_held_workers_are_looked_for_oldest_launch_first_and_no_further(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under load ten launches or so wait for the spawn helper at once; every exit asks whether
    an unknown child is a held worker. The oldest launch's cgroup holds it, and once it is found
    the other launches' cgroups are not read."""
    read: list[str] = []
    real_own_members = cgroups.own_members

    def counted(path: Path | str) -> list[int] | None:
        read.append(str(path))
        return real_own_members(path)

    monkeypatch.setattr(cgroups, "own_members", counted)
    with _a_child_in_a_launching_cgroup("taskgate-strays-order") as (own, cgroup, launching):
        own._forking[launching] = proctree.boot_ticks() - 1
        for n in range(9):  # later launches, their cgroups not made yet
            own._forking[f"{n}" * 32] = proctree.boot_ticks() - 1
        assert not own.strays(), "the oldest launch's held worker"
        assert read == [str(cgroup)], "one read: the later launches' cgroups are not asked"
        read.clear()
        # The held one found in a later launch's cgroup: every launch before it is asked.
        own._forking = {a: t for a, t in own._forking.items() if a != launching} | {launching: 0}
        assert not own.strays()
        assert len(read) == 10 and read[-1] == str(cgroup)
        # Behind more launches than the proof reads on the loop, it is not looked for: the
        # child may be an orphan, and the table look decides.
        read.clear()
        own._forking = {f"{n:032x}": 0 for n in range(processes.KERNEL_PROOF_MAX_READS)} | {launching: 0}
        assert own.strays(), "not found within the bound: counted"
        assert len(read) == processes.KERNEL_PROOF_MAX_READS


def test_in_subreaper_mode_the_kernel_is_not_asked_while_a_launch_is_unrecorded() -> None:
    own = Ownership(proctree.process_table, lambda: set(), reap_unknown=False)
    assert own.kernel_may_prove()
    own._forking["f" * 32] = proctree.boot_ticks() - 1
    assert not own.kernel_may_prove()
    own.spawned("f" * 32, 12345)
    assert not own.kernel_may_prove()
    own.forked(Attempt(attempt_id="f" * 32, task_id="t" * 32, number=1, boot_id="b", token_hash="h"))
    assert own.kernel_may_prove()


def test_read_all_reads_past_one_buffer_and_stops_at_a_short_read(tmp_path: Path) -> None:
    big = bytes(range(256)) * 1000  # 256,000 bytes: four reads of 64 KiB and a short one
    (tmp_path / "big").write_bytes(big)
    assert proctree.read_all(str(tmp_path / "big")) == big
    (tmp_path / "empty").write_bytes(b"")
    assert proctree.read_all(str(tmp_path / "empty")) == b""
    assert proctree.read_all("/proc/self/stat").startswith(f"{os.getpid()} ".encode())
    with pytest.raises(FileNotFoundError):
        proctree.read_all(str(tmp_path / "missing"))


# --- What the kernel proof reads is bounded: it runs on the scheduler's event loop, and the
# worker decides how many processes and cgroups it makes. Past the bound the table look decides.


@needs_kernel_answers
def test_the_kernel_proof_leaves_more_recorded_descendants_than_its_bound_to_the_table() -> None:
    own = Ownership(proctree.process_table, lambda: set(), reap_unknown=False)
    attempt, leader = _held_attempt(["true"], own)
    leader.wait()
    gone = [ProcessIdentity(pid=2**22 + i, start_time=1) for i in range(processes.KERNEL_PROOF_MAX_READS + 1)]
    within = attempt.model_copy(update={"descendants": gone[:-1]})
    status = processes.kernel_proof(within, _context(own))
    assert status is not None and status.gone, "all recorded descendants read and found gone"
    over = attempt.model_copy(update={"descendants": gone})
    assert processes.kernel_proof(over, _context(own)) is None, "one more: not read on the loop"


@pytest.mark.skipif(not cgroups_available(), reason="no usable cgroup v2 here")
@needs_kernel_answers
def test_the_kernel_proof_neither_walks_nor_retries_a_cgroup_with_one_below_it() -> None:
    """A worker may make cgroups below its attempt's (as many as it likes): the proof reads the
    attempt's `cgroup.events` once and tries one `rmdir`; the walk and the retries are `look`'s."""
    groups = cgroups.Cgroups.detect("taskgate-kernel-proof", (2,))
    own = Ownership(proctree.process_table, lambda: set(), reap_unknown=False)
    cgroup = groups.create("n" * 32)
    below = cgroup / "made-by-the-worker"
    try:
        attempt, leader = _held_attempt(["true"], own, cgroup)
        leader.wait()
        below.mkdir()
        assert processes.kernel_proof(attempt, _context(own), remove_empty_cgroup=True) is None
        assert below.exists() and cgroup.exists(), "nothing below removed on the loop"
        status = processes.look(attempt, _context(own), remove_empty_cgroup=True)
        assert status.gone and not cgroup.exists(), "the table look removes both, off the loop"
    finally:
        cgroups.remove(cgroup)
        groups.close()


@needs_kernel_answers
def test_more_unknown_children_than_the_bound_count_as_strays_unread() -> None:
    before = proctree.orphan_parent_children()
    own = Ownership(proctree.process_table, lambda: before, reap_unknown=False)
    children = [subprocess.Popen(["true"]) for _ in range(processes.KERNEL_PROOF_MAX_READS + 1)]
    try:
        deadline = time.monotonic() + 10
        while any((s := proctree.read_stat(c.pid)) is not None and s.alive for c in children):
            assert time.monotonic() < deadline, "the children never exited"
            time.sleep(0.01)
        assert own.strays(), "that many children are not read one by one: they may be orphans"
        children.pop().wait()  # one zombie fewer: within the bound, each is read and found dead
        assert not own.strays(), "zombies within the bound are nobody's processes"
    finally:
        for child in children:
            child.wait()
