"""What a worker's spawn costs: by the scheduler itself (a thread) and by the spawn helper.

Run: .venv/bin/python bench/bench_spawn.py [N]
Launches N held `/bin/true` workers one after another through ``processes.launch`` (the log
file, the hold, the start-time read; released at once and waited for), first spawned by this
process on a thread, then by ``taskgate-spawn`` (services/scheduler/hold, built by `make hold`)
— and, when run as root with a user `nobody`, the same for a profile with another `user`
(the scheduler's spawn then execs a `python -I -S` step that switches users; the helper's child
switches itself). Prints, per launch, the CPU of this process (the caller: the scheduler's share),
of the helper, of the spawned processes (workers, with what holds them), and launches per second;
medians of 5 rounds taken in turn.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from services.scheduler import processes, spawner  # noqa: E402

ROUNDS = 5
ENV = {"PATH": "/usr/bin:/bin"}


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def helper_cpu(helper: spawner.SpawnHelper | None) -> float:
    """The live helper's own CPU so far (not in RUSAGE_CHILDREN until it is reaped)."""
    if helper is None:
        return 0.0
    fields = Path(f"/proc/{helper.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def one_round(
    n: int, helper: spawner.SpawnHelper | None, run_as: processes.RunAs | None, hold: processes.Hold, folder: Path
) -> tuple[float, float, float, float]:
    """(caller CPU ms per launch, the helper's, workers' CPU ms per launch, launches per second)."""
    own, kids, began, helped = time.process_time(), children_cpu(), time.perf_counter(), helper_cpu(helper)
    for i in range(n):
        launched = await processes.launch(
            ["true"], folder, ENV, folder / f"{i}.log", "t", run_as=run_as, hold=hold, spawner=helper
        )
        launched.release()
        await launched.process.wait()
    wall = time.perf_counter() - began
    per = 1000 / n
    return (
        (time.process_time() - own) * per,
        (helper_cpu(helper) - helped) * per,
        (children_cpu() - kids) * per,
        n / wall,
    )


async def main(n: int) -> None:
    helper = spawner.SpawnHelper.start()
    users: list[tuple[str, processes.RunAs | None]] = [("the scheduler's user", None)]
    if os.geteuid() == 0:
        try:
            entry = pwd.getpwnam("nobody")
            users.append(("another user (nobody)", processes.RunAs(entry.pw_uid, entry.pw_gid, entry.pw_dir)))
        except KeyError:
            pass
    try:
        with tempfile.TemporaryDirectory() as tmp:
            Path(tmp).chmod(0o755)
            print(f"N={n} held /bin/true workers launched one after another, median of {ROUNDS} rounds:")
            heads = ("caller CPU ms", 14), ("helper CPU ms", 14), ("workers CPU ms", 16), ("launches/s", 12)
            print(f"  {'spawned by':<48}" + "".join(f"{head:>{width}}" for head, width in heads))
            for label, run_as in users:
                hold = processes.choose_hold("auto", other_users=run_as is not None)
                ways = [("the scheduler (a thread)", None), ("the spawn helper", helper)]
                results: dict[str, list[tuple[float, float, float, float]]] = {name: [] for name, _ in ways}
                for r in range(ROUNDS):
                    for name, way in ways:
                        folder = Path(tmp) / f"{users.index((label, run_as))}-{ways.index((name, way))}-{r}"
                        folder.mkdir()
                        if run_as is not None:
                            os.chown(folder, run_as.uid, run_as.gid)
                        results[name].append(await one_round(n, way, run_as, hold, folder))
                for name, _ in ways:
                    caller, helped, workers, rate = (statistics.median(col) for col in zip(*results[name], strict=True))
                    print(f"  {name + ', ' + label:<48}{caller:>14.3f}{helped:>14.3f}{workers:>16.3f}{rate:>12.1f}")
    finally:
        await helper.close()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 300))
