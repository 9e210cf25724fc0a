"""The spawn helper (``taskgate-spawn``): held workers started for the scheduler, as its children.

A worker the helper starts must be indistinguishable from one the scheduler spawns itself: the
scheduler's child, leading its own session, held until released, with exactly the hold pipe,
its log and the token pipe, its identity read while held, born in its cgroup. A helper that
dies never loses a launch (the scheduler spawns the worker itself), and a cancelled launch
leaves nothing running or unreaped.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import shutil
import signal
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from libs import proctree
from services.scheduler import cgroups, processes, spawner
from tests.unit.scheduler.test_processes import can_switch_to_nobody

CAN_BUILD = platform.system() == "Linux" and shutil.which("cc") is not None
BUILT = spawner.SPAWN_PROGRAM.is_file()
pytestmark = pytest.mark.skipif(not BUILT, reason="no C compiler: `make hold` built no spawn helper here")
ENV = {"PATH": "/usr/bin:/bin"}


def test_make_built_the_spawn_helper_wherever_it_can() -> None:
    if not CAN_BUILD:
        pytest.skip("no C compiler: the scheduler spawns workers itself")
    assert BUILT, "run `make hold` (make test and make run do)"


@pytest.fixture(params=["clone3", "clone"])
async def helper(request: pytest.FixtureRequest) -> AsyncIterator[spawner.SpawnHelper]:
    started = spawner.SpawnHelper.start(legacy_clone=request.param == "clone")
    try:
        yield started
    finally:
        await started.close()


def hold() -> processes.Hold:
    return processes.choose_hold("auto")


async def no_children_but(helper: spawner.SpawnHelper, within_s: float = 4.0) -> bool:
    """Whether, within ``within_s``, this process has no child started since the helper but the
    helper itself (none left running or unreaped; what earlier tests of this process left is
    not this test's)."""
    stat = proctree.read_stat(helper.pid)
    assert stat is not None
    for _ in range(int(within_s / 0.02)):
        table = proctree.process_table().values()
        if not [s for s in table if s.ppid == os.getpid() and s.pid != helper.pid and s.start_time >= stat.start_time]:
            return True
        await asyncio.sleep(0.02)
    return False


async def reaped(helper: spawner.SpawnHelper, within_s: float = 4.0) -> bool:
    """Whether the (dead) helper itself is reaped within ``within_s``."""
    for _ in range(int(within_s / 0.02)):
        if helper.reaped:
            return True
        await asyncio.sleep(0.02)
    return False


async def test_a_worker_is_the_schedulers_held_child_with_only_its_own_descriptors(
    helper: spawner.SpawnHelper, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    script = (
        f"touch {marker}; ls /proc/self/fd | sort -n | tr '\\n' ' '; echo; cat <&3; echo; "
        'echo "fd=$TASKGATE_WORKER_TOKEN_FD umask=$(umask) cwd=$(pwd)"; echo oops >&2'
    )
    log = tmp_path / "logs" / "workers" / "t.attempt-1.log"  # its folders do not exist yet
    launched = await processes.launch(
        ["sh", "-c", script], tmp_path, ENV, log, "the-token", hold=hold(), spawner=helper
    )
    stat = proctree.read_stat(launched.pid)
    assert stat is not None
    assert stat.ppid == os.getpid(), "the worker is the scheduler's child, not the helper's"
    assert launched.pgid == launched.pid and os.getpgid(launched.pid) == launched.pid == os.getsid(launched.pid)
    assert launched.start_time == stat.start_time, "its identity is read while it is held"
    assert not marker.exists(), "held: nothing of the command ran before the release"
    launched.release()
    assert await launched.process.wait() == 0
    lines = log.read_text().splitlines()
    # The listing shows ls's own descriptor for /proc/self/fd (4) besides 0-3: nothing else.
    assert lines[0].split() == ["0", "1", "2", "3", "4"], lines
    assert lines[1] == "the-token"
    assert lines[2] == f"fd=3 umask=0022 cwd={tmp_path}"
    assert lines[3] == "oops"
    assert oct(log.stat().st_mode & 0o777) == "0o600" and oct(log.parent.stat().st_mode & 0o777) == "0o700"


async def test_an_abandoned_launch_runs_nothing(helper: spawner.SpawnHelper, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    launched = await processes.launch(["touch", str(marker)], tmp_path, ENV, tmp_path / "w.log", "t", spawner=helper)
    launched.abandon()
    assert await launched.process.wait() == processes.ABANDONED
    assert not marker.exists()


async def test_each_of_many_concurrent_launches_gets_its_own_answer(
    helper: spawner.SpawnHelper, tmp_path: Path
) -> None:
    launches = await asyncio.gather(
        *(
            processes.launch(["sh", "-c", f"exit {i}"], tmp_path, ENV, tmp_path / f"{i}.log", "t", spawner=helper)
            for i in range(40)
        )
    )
    assert len({la.pid for la in launches}) == 40
    for la in launches:
        assert la.start_time == proctree.start_time_of(la.pid)
        la.release()
    assert [await la.process.wait() for la in launches] == list(range(40))


def cgroup_v2() -> cgroups.Cgroups | None:
    try:
        return cgroups.Cgroups.detect(f"taskgate-spawn-test-{os.getpid()}", (2,))
    except cgroups.CgroupUnavailable:
        return None


async def test_a_worker_is_born_in_its_cgroup(helper: spawner.SpawnHelper, tmp_path: Path) -> None:
    found = cgroup_v2()
    if found is None:
        pytest.skip("no usable cgroup v2 here")
    path = found.path_for("attempt-1")  # made by the helper
    try:
        launched = await processes.launch(["true"], tmp_path, ENV, tmp_path / "w.log", "t", cgroup=path, spawner=helper)
        assert cgroups.members(path) == [launched.pid], "in its cgroup while still held"
        launched.release()
        assert await launched.process.wait() == 0
    finally:
        cgroups.remove(path)
        found.close()


async def test_a_failed_step_fails_the_launch_and_leaves_no_child(helper: spawner.SpawnHelper, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(OSError, match="log file"):  # its folder would have to be a file
        await processes.launch(["true"], tmp_path, ENV, tmp_path / "file" / "w.log", "t", spawner=helper)
    with pytest.raises(FileNotFoundError, match="no such executable"):
        await processes.launch(["no-such-command-here"], tmp_path, ENV, tmp_path / "w.log", "t", spawner=helper)
    with pytest.raises(ValueError, match="null byte"):
        await processes.launch(["true", "a\0b"], tmp_path, ENV, tmp_path / "w.log", "t", spawner=helper)
    missing_workspace = tmp_path / "gone"
    launched = await processes.launch(["true"], missing_workspace, ENV, tmp_path / "w.log", "t", spawner=helper)
    assert missing_workspace.is_dir(), "a missing workspace is made, as without the helper"
    launched.release()
    assert await launched.process.wait() == 0
    assert helper.alive
    assert await no_children_but(helper), "a failed spawn's child is reaped"


async def test_an_exec_failure_of_the_held_program_is_said_and_its_child_reaped(
    helper: spawner.SpawnHelper, tmp_path: Path
) -> None:
    missing = processes.Hold((str(tmp_path / "no-hold"),), "compiled")
    with pytest.raises(FileNotFoundError, match=r"\(exec\)"):
        await processes.launch(["true"], tmp_path, ENV, tmp_path / "w.log", "t", hold=missing, spawner=helper)
    assert await no_children_but(helper), "the failed child is reaped (in the background)"


async def test_a_killed_helper_loses_no_launch(tmp_path: Path) -> None:
    helper = spawner.SpawnHelper.start()
    try:
        first = await processes.launch(["true"], tmp_path, ENV, tmp_path / "1.log", "t", spawner=helper)
        os.kill(helper.pid, signal.SIGKILL)
        # Whether the next launch finds it gone at once or only when it sends: the worker starts.
        second = await processes.launch(["sh", "-c", "exit 3"], tmp_path, ENV, tmp_path / "2.log", "t", spawner=helper)
        assert not helper.alive
        assert proctree.read_stat(second.pid).ppid == os.getpid()  # type: ignore[union-attr]
        for launched, code in ((first, 0), (second, 3)):
            launched.release()
            assert await launched.process.wait() == code
        assert await reaped(helper), "the dead helper itself is reaped"
    finally:
        await helper.close()


async def test_a_launch_cancelled_while_the_helper_answers_leaves_nothing_running(tmp_path: Path) -> None:
    helper = spawner.SpawnHelper.start()
    marker = tmp_path / "ran"
    try:
        launch = asyncio.ensure_future(
            processes.launch(["touch", str(marker)], tmp_path, ENV, tmp_path / "w.log", "t", spawner=helper)
        )
        await asyncio.sleep(0)  # sent, not yet answered
        launch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await launch
        for _ in range(500):  # its answer (the child it started) still comes
            if not helper.unanswered:
                break
            await asyncio.sleep(0.01)
        assert helper.unanswered == 0
        assert await no_children_but(helper), "the cancelled launch's child was left"
        assert not marker.exists()
        assert helper.alive, "a cancelled request is not the helper's failure"
    finally:
        await helper.close()


async def test_closing_the_helper_ends_it() -> None:
    helper = spawner.SpawnHelper.start()
    await helper.close()
    assert helper.reaped and proctree.read_stat(helper.pid) is None


async def test_closing_the_helper_with_launches_given_up_leaves_no_child(tmp_path: Path) -> None:
    """The scheduler stopping right after its launches were cancelled: the helper answers what it
    had read before it exits, and each child it started is reaped, none left a zombie."""
    helper = spawner.SpawnHelper.start()
    began = proctree.read_stat(helper.pid)
    assert began is not None
    launches = [
        asyncio.ensure_future(processes.launch(["true"], tmp_path, ENV, tmp_path / f"{i}.log", "t", spawner=helper))
        for i in range(10)
    ]
    await asyncio.sleep(0)
    assert helper.unanswered == 10, "all sent"
    for launch in launches:
        launch.cancel()
    await asyncio.gather(*launches, return_exceptions=True)
    await helper.close()
    for _ in range(200):
        table = proctree.process_table().values()
        left = [s for s in table if s.ppid == os.getpid() and s.start_time >= began.start_time]
        if not left:
            break
        await asyncio.sleep(0.02)
    assert left == [], "every child of a cancelled launch was reaped"


SCHEDULER = """
import asyncio, sys
from pathlib import Path
from services.scheduler import processes, spawner

async def main() -> None:
    marker, log = sys.argv[1], Path(sys.argv[2])
    helper = spawner.SpawnHelper.start()
    held = await processes.launch(["touch", marker], log.parent, {"PATH": "/usr/bin:/bin"}, log, "t", spawner=helper)
    print(held.pid, helper.pid, flush=True)
    await asyncio.sleep(3600)  # never releases it: SIGKILLed first

asyncio.run(main())
"""


def test_a_scheduler_killed_while_its_worker_is_held_leaves_neither_worker_nor_helper(tmp_path: Path) -> None:
    """SIGKILL the scheduler mid-launch: the hold pipe closes, so the held worker exits without
    running its command, and the helper's socket closes, so the helper exits too."""
    import subprocess
    import sys
    import time

    from tests.support.procs import REPO

    marker = tmp_path / "ran"
    scheduler = subprocess.Popen(
        [sys.executable, "-c", SCHEDULER, str(marker), str(tmp_path / "w.log")],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert scheduler.stdout is not None
        worker, helper = (int(word) for word in scheduler.stdout.readline().split())
        for pid in (worker, helper):
            stat = proctree.read_stat(pid)
            assert stat is not None and stat.alive and stat.ppid == scheduler.pid
    finally:
        scheduler.kill()
        scheduler.wait()
    deadline = time.monotonic() + 10
    for pid in (worker, helper):
        while (stat := proctree.read_stat(pid)) is not None and stat.alive:
            assert time.monotonic() < deadline, f"{pid} outlived its scheduler"
            time.sleep(0.01)
    assert not marker.exists(), "the command ran although nobody released it"


@pytest.mark.parametrize("mode", ["auto", "helper", "scheduler"])
async def test_the_engine_spawns_as_worker_spawn_says(tmp_path: Path, mode: str) -> None:
    from libs.settings import WorkerProfile
    from services.scheduler.domain import State
    from tests.unit.scheduler.test_engine import start_harness

    h = await start_harness(tmp_path, workers={"w": WorkerProfile(command=["sh", "-c", "exit 0"])}, worker_spawn=mode)
    try:
        helpers = list(h.engine.runtime.spawners)
        assert len(helpers) == (0 if mode == "scheduler" else 2), "[tasks] spawn_helpers = 2 by default"
        for helper in helpers:
            assert helper.alive and proctree.read_stat(helper.pid).ppid == os.getpid()  # type: ignore[union-attr]
            assert helper.pid in h.engine.runtime.leader_pids(), "never taken for a worker's orphan"
        task = await h.create("w")
        assert await h.engine.dispatch_once() == 1
        assert (await h.wait(task.task_id, [State.COMPLETED])).state == State.COMPLETED
    finally:
        await h.close()
    assert all(helper.reaped for helper in helpers), "the engine's shutdown ends its helpers"


async def test_worker_spawn_helper_refuses_to_start_without_the_program(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.unit.scheduler.test_engine import start_harness

    monkeypatch.setattr(spawner, "SPAWN_PROGRAM", tmp_path / "taskgate-spawn")
    with pytest.raises(RuntimeError, match="worker_spawn = helper, but .*No such file.*make hold"):
        await start_harness(tmp_path, worker_spawn="helper")
    (tmp_path / "auto").mkdir()
    h = await start_harness(tmp_path / "auto", worker_spawn="auto")  # auto: the scheduler spawns
    try:
        assert h.engine.runtime.spawners == []
    finally:
        await h.close()


async def test_a_stuck_helper_is_killed_and_its_launch_spawned_by_the_scheduler(tmp_path: Path) -> None:
    helper = spawner.SpawnHelper.start()
    helper.answer_timeout_s = 0.5
    marker = tmp_path / "ran"
    try:
        os.kill(helper.pid, signal.SIGSTOP)  # it reads no request and answers none
        launched = await asyncio.wait_for(
            processes.launch(["touch", str(marker)], tmp_path, ENV, tmp_path / "w.log", "t", spawner=helper), 20
        )
        assert not helper.alive
        launched.release()
        assert await launched.process.wait() == 0
        assert marker.exists()
        assert await reaped(helper), "the stuck helper was killed and reaped"
    finally:
        await helper.close()


@pytest.mark.skipif(not can_switch_to_nobody(), reason="needs root and the user nobody")
async def test_a_worker_of_another_user_is_switched_by_the_helpers_child_without_an_interpreter(
    helper: spawner.SpawnHelper, tmp_path: Path
) -> None:
    import pwd

    entry = pwd.getpwnam("nobody")
    run_as = processes.RunAs(uid=entry.pw_uid, gid=entry.pw_gid, home=entry.pw_dir)
    workspace = tmp_path / "ws"  # made by the launch, for the worker's user
    held_by = processes.choose_hold("auto", other_users=True)
    log = tmp_path / "w.log"
    launched = await processes.launch(
        ["sh", "-c", "id -u; id -G; touch mine"], workspace, ENV, log, "t", run_as=run_as, hold=held_by, spawner=helper
    )
    status = Path(f"/proc/{launched.pid}/status").read_text()
    uids = next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1:]
    assert uids == [str(entry.pw_uid)] * 4, "already the profile's user while held"
    # The hold itself, not a Python interpreter switching users first (10-20 ms of CPU a launch).
    assert os.readlink(f"/proc/{launched.pid}/exe") == os.path.realpath(held_by.prefix[0])
    launched.release()
    assert await launched.process.wait() == 0, log.read_text()
    uid, groups = log.read_text().split("\n")[:2]
    assert uid == str(entry.pw_uid) and groups.split() == [str(entry.pw_gid)], "no supplementary groups"
    assert (workspace / "mine").stat().st_uid == entry.pw_uid
    assert workspace.stat().st_uid == entry.pw_uid, "a fresh workspace belongs to the worker's user"


def helper_as_nobody() -> spawner.SpawnHelper:
    """A helper running as the user nobody (as the helper of a scheduler that is not root)."""
    import pwd
    import socket
    import subprocess

    nobody = pwd.getpwnam("nobody")
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    process = subprocess.Popen(
        [str(spawner.SPAWN_PROGRAM), str(theirs.fileno())], pass_fds=(theirs.fileno(),), user=nobody.pw_uid, env={}
    )
    theirs.close()
    ours.setblocking(False)
    return spawner.SpawnHelper(process, ours)


@pytest.fixture
def open_folder() -> Iterator[Path]:
    """A folder the user nobody may write to (its workers' logs)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp).chmod(0o777)
        yield Path(tmp)


@pytest.mark.skipif(not can_switch_to_nobody(), reason="needs root and the user nobody")
async def test_a_user_switch_the_helper_may_not_make_fails_the_launch(open_folder: Path) -> None:
    """A helper without the right to switch users (here: one running as nobody, asked for root)
    fails the launch with the step named, and leaves no child behind."""
    helper = helper_as_nobody()
    try:
        root = processes.RunAs(uid=0, gid=0, home="/root")
        with pytest.raises(PermissionError, match="switching to the profile's user"):
            await processes.launch(["true"], open_folder, ENV, open_folder / "w.log", "t", run_as=root, spawner=helper)
        assert helper.alive
        assert await no_children_but(helper)
    finally:
        await helper.close()


@pytest.mark.skipif(not can_switch_to_nobody(), reason="needs root and the user nobody")
async def test_the_helper_cannot_be_traced_by_its_own_user_but_its_workers_can(open_folder: Path) -> None:
    """Not dumpable: a worker of the helper's own user can neither trace it nor take its socket
    (the kernel then gives its /proc entries to root); a worker, once exec'd, is as usual."""
    import pwd

    nobody = pwd.getpwnam("nobody")
    helper = helper_as_nobody()
    try:
        launched = await processes.launch(["true"], open_folder, ENV, open_folder / "w.log", "t", spawner=helper)
        assert os.stat(f"/proc/{helper.pid}/fd").st_uid == 0, "the helper is not dumpable"
        assert os.stat(f"/proc/{launched.pid}/fd").st_uid == nobody.pw_uid, "its worker is"
        launched.release()
        assert await launched.process.wait() == 0
    finally:
        await helper.close()


def spawns_by(by: str) -> float:
    """``taskgate_worker_spawns_total{by}`` so far (the registry is the process's)."""
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value("taskgate_worker_spawns_total", {"by": by}) or 0.0


async def test_a_helper_that_died_is_started_anew_once_reaped(tmp_path: Path) -> None:
    from libs.settings import WorkerProfile
    from services.scheduler.domain import State
    from tests.unit.scheduler.test_engine import start_harness

    h = await start_harness(tmp_path, workers={"w": WorkerProfile(command=["sh", "-c", "exit 0"])}, spawn_helpers=1)
    rt = h.engine.runtime
    try:
        (first,) = rt.spawners
        by_helper, by_scheduler = spawns_by("helper"), spawns_by("scheduler")
        task = await h.create("w")
        assert await h.engine.dispatch_once() == 1
        assert (await h.wait(task.task_id, [State.COMPLETED])).state == State.COMPLETED
        assert (spawns_by("helper"), spawns_by("scheduler")) == (by_helper + 1, by_scheduler)
        os.kill(first.pid, signal.SIGKILL)
        for _ in range(200):  # its socket's end is seen, then it is reaped
            if first.reaped:
                break
            await asyncio.sleep(0.02)
        assert not first.alive and first.reaped
        # Within the restart interval the scheduler spawns itself; after it, a new helper does.
        assert rt.live_spawner() is not None, "the first restart is not delayed"
        (second,) = rt.spawners
        assert second is not first and second.alive
        # The dead helper is no leader any more — unless the new one was given its pid again
        # (pids wrap at 32,768 here, and a busy suite goes round in minutes: seen once).
        assert second.pid in rt.leader_pids()
        assert first.pid not in rt.leader_pids() or first.pid == second.pid
        task = await h.create("w")
        assert await h.engine.dispatch_once() == 1
        assert (await h.wait(task.task_id, [State.COMPLETED])).state == State.COMPLETED
        assert second.unanswered == 0 and second.alive
        os.kill(second.pid, signal.SIGKILL)
        assert await reaped(second)
        assert rt.live_spawner() is None, "a second death within the interval: the scheduler spawns"
        task = await h.create("w")
        assert await h.engine.dispatch_once() == 1
        assert (await h.wait(task.task_id, [State.COMPLETED])).state == State.COMPLETED
        assert (spawns_by("helper"), spawns_by("scheduler")) == (by_helper + 2, by_scheduler + 1)
    finally:
        await h.close()


async def test_a_launch_cancelled_before_its_request_could_be_sent_leaves_nothing_waiting(tmp_path: Path) -> None:
    """The socket full (a helper that reads nothing): the request waits to be sent; cancelled
    then, it was never sent and nothing waits for its answer."""
    import socket
    import subprocess

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ours.setblocking(False)
    with contextlib.suppress(BlockingIOError):
        while True:  # fill it: nobody reads the other end
            ours.send(b"x" * 1024)
    silent = subprocess.Popen(["sleep", "60"])
    helper = spawner.SpawnHelper(silent, ours)
    r, w = os.pipe()
    try:
        send = asyncio.ensure_future(helper.spawn(["/bin/true"], tmp_path, ENV, tmp_path / "w.log", r, r))
        await asyncio.sleep(0.05)
        assert not send.done() and helper.unanswered == 1, "waiting to be sent"
        send.cancel()
        await asyncio.gather(send, return_exceptions=True)
        assert helper.unanswered == 0, "the cancelled, unsent request waits for nothing"
    finally:
        silent.kill()
        silent.wait()
        ours.close()
        theirs.close()
        os.close(r)
        os.close(w)


@dataclass
class _FakeHelper:
    pid: int
    unanswered: int = 0
    alive: bool = True
    reaped: bool = False
    program: Path = spawner.SPAWN_PROGRAM


async def test_a_launch_goes_to_the_live_helper_with_the_fewest_waiting(tmp_path: Path) -> None:
    """Each helper serves one spawn at a time: a launch goes where the fewest wait. A dead one is
    passed over until it can be started anew (reaped, and not within the restart interval)."""
    from tests.unit.scheduler.test_engine import start_harness

    h = await start_harness(tmp_path, worker_spawn="scheduler")
    rt = h.engine.runtime
    try:
        first, second = _FakeHelper(101, unanswered=3), _FakeHelper(102, unanswered=1)
        rt.spawners = [first, second]  # type: ignore[list-item]
        assert rt.live_spawner() is second
        second.unanswered = 5
        assert rt.live_spawner() is first
        assert rt.leader_pids() >= {101, 102}, "neither is ever taken for an orphan"
        first.alive = False  # dead, not reaped yet: never restarted while it may still be around
        assert rt.live_spawner() is second
        assert 101 in rt.leader_pids()
        first.reaped = True
        rt._spawner_restart_at = time.monotonic() + 60  # another restarted a moment ago
        assert rt.live_spawner() is second and rt.spawners[0] is first
        assert 101 not in rt.leader_pids()
        second.alive, second.reaped = False, True
        assert rt.live_spawner() is None, "none live, none to restart: the scheduler spawns"
        rt._spawner_restart_at = 0.0
        fresh = rt.live_spawner()  # the first dead slot is started anew; the other waits its turn
        assert fresh is not None and fresh.alive and rt.spawners[0] is fresh and rt.spawners[1] is second
        assert fresh.pid in rt.leader_pids()
        await fresh.close()  # type: ignore[union-attr]
    finally:
        rt.spawners = []
        await h.close()
