"""The data directory and what the services keep in it are private to their uid."""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from libs.db import Database
from libs.startup import secure_data_dir

REPO = Path(__file__).resolve().parents[3]


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_the_data_dir_is_0700_and_its_files_0600(tmp_path: Path) -> None:
    data = tmp_path / "var"
    data.mkdir(mode=0o755)
    old = data / "gateway.db"
    old.write_text("from an older version")
    os.chmod(old, 0o644)
    previous = os.umask(0o022)
    try:
        secure_data_dir(data)
        assert mode(data) == 0o700 and mode(old) == 0o600
        db = Database(f"sqlite:///{data / 'scheduler.db'}")
        db.migrate()
        db.close()
        for path in data.iterdir():
            assert mode(path) == (0o700 if path.is_dir() else 0o600), path
        logs = data / "logs"
        logs.mkdir()
        (logs / "x.log").write_text("")
        assert mode(logs) == 0o700 and mode(logs / "x.log") == 0o600
    finally:
        os.umask(previous)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_another_uid_can_neither_list_read_nor_write_it() -> None:
    pwd.getpwnam("nobody")
    outer = Path(tempfile.mkdtemp(prefix="tg-data-"))
    os.chmod(outer, 0o755)  # only the data directory itself stands in the way
    data = outer / "var"
    previous = os.umask(0o022)
    try:
        secure_data_dir(data)
        (data / "gateway.db").write_text("keys")
        as_nobody = [
            f"ls {data}",
            f"cat {data / 'gateway.db'}",
            f"echo x > {data / 'mine.db'}",
        ]
        for command in ["test -d " + str(outer), *as_nobody]:
            result = subprocess.run(
                ["/bin/sh", "-c", command], user="nobody", capture_output=True, check=False, cwd="/"
            )
            expected_ok = command.startswith("test -d")
            assert (result.returncode == 0) == expected_ok, (command, result.stderr)
    finally:
        os.umask(previous)
        shutil.rmtree(outer)


HOLDER = """
import sys, time
from pathlib import Path
from libs.startup import hold_data_dir
hold_data_dir(Path(sys.argv[1]), sys.argv[2])
print("held", flush=True)
time.sleep(600)
"""


def test_one_process_per_service_and_data_dir_and_a_killed_holder_frees_it(tmp_path: Path) -> None:
    from libs import startup
    from libs.startup import FolderInUse, hold_data_dir

    data = tmp_path / "var"
    data.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(data), "scheduler"], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(FolderInUse, match=rf"another scheduler process \(pid {holder.pid}\) runs on"):
            hold_data_dir(data, "scheduler")
        hold_data_dir(data, "notifier")  # another service on the same directory
        other = tmp_path / "other"
        other.mkdir()
        hold_data_dir(other, "scheduler")  # the same service on another directory
    finally:
        holder.kill()  # SIGKILL: no clean-up of its own, the file stays behind
        holder.wait()
    try:
        assert (data / "scheduler.lock").exists()
        hold_data_dir(data, "scheduler")  # the kernel dropped the dead holder's lock
        assert (data / "scheduler.lock").read_text() == f"{os.getpid()}\n"
    finally:
        for lock in startup._HELD:
            lock.release()
        startup._HELD.clear()


def test_a_lock_file_planted_as_a_symlink_is_refused_and_its_target_left_alone(tmp_path: Path) -> None:
    from libs.startup import hold_data_dir

    data = tmp_path / "var"
    data.mkdir()
    target = tmp_path / "precious.db"
    target.write_text("not to be truncated")
    (data / "notifier.lock").symlink_to(target)
    with pytest.raises(OSError):
        hold_data_dir(data, "notifier")
    assert target.read_text() == "not to be truncated"
