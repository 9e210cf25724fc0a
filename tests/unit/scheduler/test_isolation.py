"""Worker isolation: an allow-listed environment, the token out of /proc, other users.

Tests run as root here, so the sibling test runs its workers as the real
unprivileged user `nobody` (skipped where the scheduler cannot switch users).
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from libs.settings import WorkerProfile
from services.scheduler.domain import State
from services.scheduler.worker_api import WorkerSockets
from tests.support.procs import as_nobody_command
from tests.support.stack import BEHAVE
from tests.unit.scheduler.test_engine import Harness, running, start_harness

CONTRACT = {"TASKGATE_TASK_ID", "TASKGATE_ATTEMPT_ID", "TASKGATE_WORKER_ADDR", "TASKGATE_WORKER_TOKEN_FD"}
ALLOWED = {"PATH", "HOME", "LANG", "TZ", "TMPDIR"}


def has_nobody() -> bool:
    try:
        pwd.getpwnam("nobody")
    except KeyError:
        return False
    return os.geteuid() == 0


NOBODY_BEHAVE = as_nobody_command(BEHAVE)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A folder workers of another uid may write (the test's own tmp_path is root's, 0700)."""
    path = Path(tempfile.mkdtemp(prefix="tg-iso-"))
    os.chmod(path, 0o777)
    yield path
    for child in path.iterdir():
        child.unlink()
    path.rmdir()


async def wait_file(path: Path, timeout_s: float = 20) -> str:
    deadline = time.monotonic() + timeout_s
    while not path.exists() or not path.read_text():
        assert time.monotonic() < deadline, f"{path} never written"
        await asyncio.sleep(0.02)
    return path.read_text()


async def test_the_environment_is_an_allow_list_and_holds_no_token(
    tmp_path: Path, shared_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TASKGATE_SCHEDULER_DB_URL", "postgresql://secret@db/scheduler")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "do-not-leak")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    monkeypatch.setenv("KEEP_ME", "kept")
    profile = WorkerProfile(command=["python", str(BEHAVE)], uses_sdk=True, env={"FOO": "bar"}, inherit_env=["KEEP_ME"])
    h = await start_harness(tmp_path, workers={"envy": profile})
    try:
        env_file, token_file, pid_file = shared_dir / "env", shared_dir / "token", shared_dir / "pid"
        task = await running(
            h,
            "envy",
            [
                {"write_env": str(env_file)},
                {"write_token": str(token_file)},
                {"write_pid": str(pid_file)},
                {"sleep": 300},
            ],
        )
        env = json.loads(await wait_file(env_file))
        token = await wait_file(token_file)
        pid = int(await wait_file(pid_file))
        extra = {k for k in env if k not in ALLOWED | CONTRACT | {"FOO", "KEEP_ME"} and not k.startswith("LC_")}
        assert not extra, f"variables the allow-list does not name: {extra}"
        assert env["FOO"] == "bar" and env["KEEP_ME"] == "kept" and env["LC_ALL"] == "C.UTF-8"
        assert env["TASKGATE_WORKER_ADDR"].startswith("unix:")
        assert "TASKGATE_SCHEDULER_ADDR" not in env and "TASKGATE_PENDING_ADDR" not in env
        assert token and token not in Path(f"/proc/{pid}/environ").read_text(errors="replace")
        await h.engine.cancel(task.task_id, wait_s=5)
    finally:
        await h.close()


@pytest.mark.skipif(NOBODY_BEHAVE is None, reason="needs root, the user nobody and an interpreter it may run")
async def test_a_sibling_of_the_same_user_cannot_read_the_token_through_proc(tmp_path: Path, shared_dir: Path) -> None:
    assert NOBODY_BEHAVE is not None
    profile = WorkerProfile(command=NOBODY_BEHAVE, uses_sdk=True, user="nobody")
    h: Harness = await start_harness(tmp_path, workers={"as-nobody": profile})
    try:
        token_file, pid_file, spied = shared_dir / "token", shared_dir / "pid", shared_dir / "spied"
        victim = await running(
            h, "as-nobody", [{"write_token": str(token_file)}, {"write_pid": str(pid_file)}, {"sleep": 300}]
        )
        token = await wait_file(token_file)
        pid = int(await wait_file(pid_file))
        status = Path(f"/proc/{pid}/status").read_text()
        uid_line = next(line for line in status.splitlines() if line.startswith("Uid:"))
        assert uid_line.split()[1] == str(pwd.getpwnam("nobody").pw_uid), "the worker runs as nobody"
        spy = await running(h, "as-nobody", [{"spy": {"pid_file": str(pid_file), "out": str(spied)}}])
        await h.wait(spy.task_id, [State.COMPLETED])
        assert spied.exists() and token not in spied.read_text(), "the sibling read the token"
        await h.engine.cancel(victim.task_id, wait_s=5)
    finally:
        await h.close()


@pytest.mark.skipif(not has_nobody(), reason="needs root and the user nobody")
def test_each_worker_uid_gets_its_own_private_socket_folder() -> None:
    nobody = pwd.getpwnam("nobody").pw_uid
    sockets = WorkerSockets("", [nobody])
    try:
        root = os.stat(sockets.root)
        assert stat.S_IMODE(root.st_mode) == 0o711, "others may traverse, not list"
        for uid in (os.getuid(), nobody):
            folder = os.stat(sockets.path_for(uid).parent)
            assert stat.S_IMODE(folder.st_mode) == 0o700 and folder.st_uid == uid
        assert sockets.addr_for(None) == f"unix:{sockets.path_for(os.getuid())}"
    finally:
        sockets.close()
    assert not sockets.root.exists()
