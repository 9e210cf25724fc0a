"""The kernel's share of each step of a launch and an exit, one step at a time.

Run: .venv/bin/python bench/bench_launch_kernel.py [N]
N (500) times each, in this thread, in a temporary folder (the data directory's file system
when TMPDIR points there): creating an attempt's log file, a cgroup mkdir, a held spawn
(the hold the scheduler would choose), the `cgroup.procs` write, reading the start time, the
release, the wait, an exit's proof by the kernel (the group asked through a pidfd kept on the
leader, the cgroup's events, the main thread's children), a process-table read, the cgroup rmdir.
Prints this thread's user and system CPU and the wall time per step. On ext4 without a journal, a
file create skips every inode freed in the last minutes (`recently_deleted`), so the log file's
figure depends on what was deleted.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from libs import proctree  # noqa: E402
from services.scheduler import cgroups, processes  # noqa: E402


def thread_cpu() -> tuple[float, float]:
    used = resource.getrusage(resource.RUSAGE_THREAD)
    return used.ru_utime, used.ru_stime


def timed(name: str, n: int, step: Callable[[int], object]) -> None:
    (user0, system0), began = thread_cpu(), time.perf_counter()
    for i in range(n):
        step(i)
    (user1, system1), wall = thread_cpu(), time.perf_counter() - began
    print(
        f"  {name:26} user {1000 * (user1 - user0) / n:6.3f} ms  system {1000 * (system1 - system0) / n:6.3f} ms"
        f"  wall {1000 * wall / n:6.3f} ms"
    )


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 500
    try:
        cg = cgroups.Cgroups.detect("taskgate-bench-kernel", (2,))
    except cgroups.CgroupUnavailable as exc:
        sys.exit(f"needs a writable cgroup v2 hierarchy: {exc}")
    hold = processes.choose_hold("auto")
    print(f"N={n} per step, this thread's CPU per step (workers held by {hold.kind}):")
    with tempfile.TemporaryDirectory() as tmp:
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
        timed("create the log file", n, lambda i: os.close(os.open(f"{tmp}/t{i}.attempt-1.log", flags, 0o600)))
        paths = [cg.path_for(f"{i:032x}") for i in range(n)]
        timed("cgroup mkdir", n, lambda i: paths[i].mkdir())
        held: list[tuple[subprocess.Popen[bytes], int]] = []

        def spawn(i: int) -> None:
            go_r, go_w = os.pipe()
            held.append((subprocess.Popen([*hold.prefix, "/bin/true"], stdin=go_r, start_new_session=True), go_w))
            os.close(go_r)

        def release(i: int) -> None:
            os.write(held[i][1], b"go\n")
            os.close(held[i][1])

        timed("spawn, held (vfork + exec)", n, spawn)
        timed("cgroup.procs write", n, lambda i: cgroups.add(paths[i], held[i][0].pid))
        timed("read the start time", n, lambda i: proctree.start_time_of(held[i][0].pid))
        timed("release", n, release)
        pidfds = [os.pidfd_open(p.pid) for p, _ in held]  # kept on each leader, as the scheduler does
        timed("wait", n, lambda i: held[i][0].wait())
        # An exit's proof by the kernel (processes.kernel_proof) against the table read it spares.
        timed("group signal 0 (pidfd)", n, lambda i: proctree.signal_led_group(pidfds[i], 0))
        timed("cgroup.events read", n, lambda i: cgroups.members(paths[i]))
        timed("main thread's children", n, lambda i: proctree.orphan_parent_children())
        for fd in pidfds:
            os.close(fd)
        timed("process-table read", max(1, n // 10), lambda i: proctree.process_table())
        timed("cgroup rmdir", n, lambda i: cgroups.remove(paths[i]))
    cg.close()


if __name__ == "__main__":
    main()
