"""What holds a spawned worker until its release: the compiled ``taskgate-hold`` and the shell.

The compiled hold (services/scheduler/hold/taskgate-hold.c) must do exactly what the shell
trampoline does — the same exit status and the same output for every case below —, and the
scheduler must only ever run a copy nobody else can replace.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.scheduler import processes
from services.scheduler.domain import State

BUILT = processes.HOLD_PROGRAM.is_file()
CAN_BUILD = platform.system() == "Linux" and platform.machine() == "x86_64" and shutil.which("cc") is not None
needs_build = pytest.mark.skipif(
    not BUILT and not CAN_BUILD, reason="no C compiler for x86-64 Linux: `make hold` builds nothing here"
)


def holds() -> list[processes.Hold]:
    return [processes.Hold(processes.SH_HOLD, "sh"), processes.Hold((str(processes.HOLD_PROGRAM),), "compiled")]


def test_make_built_the_compiled_hold_wherever_it_can() -> None:
    """`make test` builds it first; a machine that can build it must not silently run the shell."""
    if not CAN_BUILD:
        pytest.skip("no C compiler for x86-64 Linux: the scheduler holds workers with /bin/sh")
    assert BUILT, "run `make hold` (make test and make run do)"
    released = subprocess.run(
        [str(processes.HOLD_PROGRAM), "/bin/sh", "-c", "exit 7"], input=b"go\n", capture_output=True, timeout=30
    )
    assert released.returncode == 7, released.stderr
    assert processes.choose_hold("auto").kind == "compiled"
    # With workers of other users, a clone they cannot reach (under /root, say) keeps the shell.
    hold = processes.choose_hold("auto", other_users=True)
    assert hold.kind == "compiled" or "cannot reach" in hold.fallback_reason, hold.fallback_reason


@pytest.fixture
def scripts(tmp_path: Path) -> Path:
    folder = tmp_path / "d"
    folder.mkdir()
    (folder / "noshebang").write_text('echo script-ran "$@"\n')
    (folder / "noshebang").chmod(0o755)
    (folder / "noexec").write_text("x")
    (folder / "noexec").chmod(0o644)
    return tmp_path


ENV = {"PATH": "/usr/bin:/bin", "PWD": "/somewhere", "X": "1"}
CASES = [
    pytest.param(b"go\n", ["echo", "hi", "there"], ENV, id="released"),
    pytest.param(b"", ["echo", "hi"], ENV, id="pipe-closed-before-the-release"),
    pytest.param(b"gx\n", ["echo", "hi"], ENV, id="another-word"),
    pytest.param(b"g", ["echo", "hi"], ENV, id="half-a-word-then-closed"),
    pytest.param(b"go\nmore", ["sh", "-c", "cat; echo done"], ENV, id="stdin-is-dev-null-after-the-release"),
    pytest.param(b"go\n", ["no-such-command-x"], ENV, id="not-found-127"),
    pytest.param(b"go\n", ["/nonexistent/x"], ENV, id="path-not-found-127"),
    pytest.param(b"go\n", ["./d/noexec"], ENV, id="not-executable-126"),
    pytest.param(b"go\n", ["noexec"], {"PATH": "d"}, id="not-executable-on-path-126"),
    pytest.param(b"go\n", ["d/noshebang", "a", "b"], ENV, id="script-without-shebang-runs-in-sh"),
    pytest.param(b"go\n", ["noshebang", "a"], {"PATH": "/nonexistent:d", "PWD": "/x"}, id="relative-path-element"),
    pytest.param(b"go\n", ["env"], ENV, id="the-environment-without-PWD"),
    pytest.param(b"go\n", ["readlink", "/proc/self/fd/0"], ENV, id="stdin-is-dev-null"),
    pytest.param(b"go\n", ["sh", "-c", 'echo "$PATH"'], {"PWD": "/x"}, id="no-PATH-means-the-shell-default"),
]


@needs_build
@pytest.mark.parametrize(("given", "command", "env"), CASES)
def test_the_compiled_hold_does_what_the_shell_trampoline_does(
    scripts: Path, given: bytes, command: list[str], env: dict[str, str]
) -> None:
    results = []
    for hold in holds():
        done = subprocess.run(
            [*hold.prefix, *command], input=given, capture_output=True, env=env, cwd=scripts, timeout=30
        )
        # The shell passes its exported variables on in an order of its own.
        results.append(
            (done.returncode, b"".join(sorted(done.stdout.splitlines(True))) if command == ["env"] else done.stdout)
        )
    (sh_status, sh_out), (compiled_status, compiled_out) = results
    assert compiled_status == sh_status and compiled_out == sh_out
    if command == ["env"]:
        assert compiled_out == b"PATH=/usr/bin:/bin\nX=1\n"
    if given != b"go\n" and given != b"go\nmore":
        assert sh_status == processes.ABANDONED and sh_out == b"", "nothing ran"


@needs_build
@pytest.mark.parametrize("kind", ["sh", "compiled"])
async def test_a_held_launch_runs_nothing_unless_released_whatever_holds_it(tmp_path: Path, kind: str) -> None:
    hold = {h.kind: h for h in holds()}[kind]
    marker = tmp_path / "ran"
    env = {"PATH": os.environ["PATH"]}
    command = ["sh", "-c", f"touch {marker}; cat /proc/self/fd/$TASKGATE_WORKER_TOKEN_FD > {tmp_path / 'token'}"]
    held = await processes.launch(command, tmp_path, env, tmp_path / "abandoned.log", "tok", hold=hold)
    assert held.start_time is not None
    held.abandon()  # as when the scheduler dies before the release
    assert await held.process.wait() == processes.ABANDONED and not marker.exists()

    released = await processes.launch(command, tmp_path, env, tmp_path / "released.log", "tok", hold=hold)
    # The spawn returns once the old image is gone; the new one's argv shows a moment later.
    for _ in range(250):
        with open(f"/proc/{released.pid}/cmdline", "rb") as cmdline:
            argv = cmdline.read().split(b"\0")
        if argv[0]:
            break
        await asyncio.sleep(0.02)
    assert argv[0] == hold.prefix[0].encode(), "held by the hold asked for"
    released.release()
    assert await released.process.wait() == 0 and marker.exists()
    assert (tmp_path / "token").read_text() == "tok", "the token arrives through its pipe"


@needs_build
@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("id") or "nobody" not in {p.pw_name for p in pwd.getpwall()},
    reason="needs root and the user nobody",
)
async def test_a_worker_of_another_user_is_held_by_the_compiled_hold_after_the_switch(tmp_path: Path) -> None:
    usable = processes.choose_hold("auto", other_users=True)
    if usable.kind != "compiled":
        pytest.skip(f"the compiled hold is not usable by other users here: {usable.fallback_reason}")
    entry = pwd.getpwnam("nobody")
    run_as = processes.RunAs(uid=entry.pw_uid, gid=entry.pw_gid, home=entry.pw_dir)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    os.chown(workspace, entry.pw_uid, entry.pw_gid)
    hold = processes.choose_hold("compiled", other_users=True)
    held = await processes.launch(
        ["id", "-u"], workspace, {"PATH": os.environ["PATH"]}, tmp_path / "l.log", "t", run_as=run_as, hold=hold
    )
    held.release()
    assert await held.process.wait() == 0, (tmp_path / "l.log").read_text()
    assert (tmp_path / "l.log").read_text().strip() == str(entry.pw_uid)


def test_sh_is_used_when_asked() -> None:
    assert processes.choose_hold("sh") == processes.Hold(processes.SH_HOLD, "sh")


def test_a_missing_program_means_the_shell_or_with_compiled_a_refusal(tmp_path: Path) -> None:
    missing = tmp_path / "taskgate-hold"
    hold = processes.choose_hold("auto", missing)
    assert hold.kind == "sh" and hold.prefix == processes.SH_HOLD and "No such file" in hold.fallback_reason
    with pytest.raises(RuntimeError, match="worker_hold = compiled, but .*make hold"):
        processes.choose_hold("compiled", missing)


@pytest.fixture
def reachable() -> Iterator[Path]:
    """A folder every user can reach (pytest's tmp_path sits in a private one)."""
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp).chmod(0o755)
        yield Path(tmp)


@needs_build
def test_only_a_copy_nobody_else_can_replace_or_that_runs_is_used(reachable: Path) -> None:
    folder = reachable / "bin"
    folder.mkdir()
    folder.chmod(0o755)
    copy = folder / "taskgate-hold"
    shutil.copy(processes.HOLD_PROGRAM, copy)
    copy.chmod(0o755)
    assert processes.choose_hold("auto", copy) == processes.Hold((str(copy),), "compiled")

    copy.chmod(0o775)  # its group could replace what every worker runs
    assert "writable by its group or others" in processes.choose_hold("auto", copy).fallback_reason
    copy.chmod(0o755)
    folder.chmod(0o777)  # anyone could swap the file
    assert "writable by its group or others" in processes.choose_hold("auto", copy).fallback_reason
    folder.chmod(0o700)  # a profile's user could not reach it; workers of the scheduler's own user can
    assert "other users cannot reach" in processes.choose_hold("auto", copy, other_users=True).fallback_reason
    assert processes.choose_hold("auto", copy).kind == "compiled"
    folder.chmod(0o755)
    copy.chmod(0o700)
    assert "not executable by every user" in processes.choose_hold("auto", copy, other_users=True).fallback_reason
    assert processes.choose_hold("auto", copy).kind == "compiled"
    copy.chmod(0o644)
    assert "not executable by its owner" in processes.choose_hold("auto", copy).fallback_reason
    copy.chmod(0o755)

    impostor = folder / "impostor"  # safe to run, but not a hold: its trial run fails
    shutil.copy("/bin/false", impostor)
    impostor.chmod(0o755)
    hold = processes.choose_hold("auto", impostor)
    assert hold.kind == "sh" and "trial run ended 1" in hold.fallback_reason
    link = folder / "link"
    link.symlink_to(copy)
    assert "not a regular file" in processes.choose_hold("auto", link).fallback_reason


@pytest.mark.parametrize(("user", "other_users"), [(None, False), ("nobody", True)])
async def test_the_engine_asks_for_a_hold_other_users_can_run_only_when_a_profile_needs_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, user: str | None, other_users: bool
) -> None:
    from libs.settings import WorkerProfile
    from tests.unit.scheduler.test_engine import start_harness

    if user is not None and (os.geteuid() != 0 or user not in {p.pw_name for p in pwd.getpwall()}):
        pytest.skip("needs root and the user nobody")
    asked: list[tuple[str, bool]] = []
    real = processes.choose_hold

    def spy(mode: str, program: Path = processes.HOLD_PROGRAM, other_users: bool = False) -> processes.Hold:
        asked.append((mode, other_users))
        return real(mode, program, other_users)

    monkeypatch.setattr(processes, "choose_hold", spy)
    h = await start_harness(tmp_path, workers={"w": WorkerProfile(command=["true"], user=user)})
    try:
        assert asked == [("auto", other_users)]
        hold = h.engine.runtime.hold
        assert hold.kind == ("compiled" if BUILT else "sh") or hold.fallback_reason, "a fallback says why"
        task = await h.create("w")
        assert await h.engine.dispatch_once() == 1
        assert (await h.wait(task.task_id, [State.COMPLETED])).state == State.COMPLETED
    finally:
        await h.close()


SPAWNER = """
import asyncio, json, sys
from pathlib import Path
from services.scheduler import processes

async def main() -> None:
    prefix, marker, log = json.loads(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    hold = processes.Hold(tuple(prefix), "under test")
    held = await processes.launch(["touch", marker], log.parent, {"PATH": "/usr/bin:/bin"}, log, "t", hold=hold)
    print(held.pid, flush=True)
    await asyncio.sleep(3600)  # never releases it: SIGKILLed first

asyncio.run(main())
"""


@needs_build
@pytest.mark.parametrize("kind", ["sh", "compiled"])
def test_a_scheduler_killed_while_its_worker_is_held_lets_nothing_of_the_worker_run(tmp_path: Path, kind: str) -> None:
    """SIGKILL the spawning process mid-launch: the hold pipe closes and the held worker exits
    without exec'ing its command (nothing is left running that no scheduler knows of)."""
    from libs import proctree
    from tests.support.procs import REPO

    hold = {h.kind: h for h in holds()}[kind]
    marker = tmp_path / "ran"
    spawner = subprocess.Popen(
        [sys.executable, "-c", SPAWNER, json.dumps(hold.prefix), str(marker), str(tmp_path / "w.log")],
        cwd=REPO,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert spawner.stdout is not None
        pid = int(spawner.stdout.readline())
        held = proctree.read_stat(pid)
        assert held is not None and held.alive, "held, waiting for its release"
    finally:
        spawner.kill()
        spawner.wait()
    deadline = time.monotonic() + 10
    while (stat := proctree.read_stat(pid)) is not None and stat.alive:
        assert time.monotonic() < deadline, "the held worker outlived its scheduler"
        time.sleep(0.01)
    assert not marker.exists(), "the command ran although nobody released it"
