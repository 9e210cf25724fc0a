"""The psutil reader against real processes."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil
import pytest

from libs import proctree
from services.telemetry_agent.procread import CLK_TCK, ProcfsReader, PsutilReader, ticks


@pytest.mark.parametrize("reader", [ProcfsReader(), PsutilReader()], ids=["procfs", "psutil"])
def test_figures_of_this_process_are_in_clock_ticks(reader: ProcfsReader | PsutilReader) -> None:
    me = os.getpid()
    start = proctree.start_time_of(me)
    assert start is not None
    before = reader.read(me, start)
    x = 0
    for i in range(3_000_000):
        x += i
    os.write(2, b"")  # a write syscall
    after = reader.read(me, start)
    stat = open(f"/proc/{me}/stat").read().rsplit(")", 1)[1].split()
    utime, cutime = int(stat[11]), int(stat[13])
    assert abs(after.cpu_user_ticks - (utime + cutime)) <= 2
    assert after.cpu_user_ticks > before.cpu_user_ticks
    assert after.write_count > before.write_count
    assert ticks(1.5, 100) == 150 and ticks(0.01, 100) == 1 and CLK_TCK > 0


@pytest.mark.parametrize("reader", [ProcfsReader(), PsutilReader()], ids=["procfs", "psutil"])
def test_a_wrong_start_time_is_not_read(reader: ProcfsReader | PsutilReader) -> None:
    me = os.getpid()
    start = proctree.start_time_of(me)
    assert start is not None
    with pytest.raises(psutil.NoSuchProcess):
        reader.read(me, start + 1)


@pytest.mark.parametrize("reader", [ProcfsReader(), PsutilReader()], ids=["procfs", "psutil"])
def test_a_gone_process_is_no_such_process(reader: ProcfsReader | PsutilReader) -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    start = proctree.start_time_of(child.pid) or 1
    child.wait()
    with pytest.raises(psutil.NoSuchProcess):
        reader.read(child.pid, start)


def test_both_readers_agree_on_a_quiet_process() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nprint('ready', flush=True)\ntime.sleep(60)"], stdout=subprocess.PIPE
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == b"ready\n"
        start = proctree.start_time_of(child.pid)
        assert start is not None
        assert ProcfsReader().read(child.pid, start) == PsutilReader().read(child.pid, start)
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()


def test_an_unreadable_io_file_is_access_denied(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_open = builtins.open

    def deny(path: object, *args: object, **kw: object) -> object:
        if str(path).endswith("/io"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kw)  # type: ignore[call-overload]

    monkeypatch.setattr(builtins, "open", deny)
    me = os.getpid()
    with pytest.raises(psutil.AccessDenied):
        ProcfsReader().read(me, proctree.start_time_of(me) or 1)


def test_own_pid_namespace_is_readable() -> None:
    reader = ProcfsReader()
    assert reader.pid_namespace(os.getpid()) == os.stat("/proc/self/ns/pid").st_ino
