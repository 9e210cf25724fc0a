"""Small helpers the benchmarks share: percentiles, a process's resident memory, a py-spy
profile of a process, and what the machine was like while a figure was taken (its disk, a file
create's cost, how busy its CPUs were)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` by nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


class Profile:
    """py-spy sampling a process at 200 Hz from ``start`` to ``stop``: raw stacks when ``out``
    ends in .txt, else a flame graph; with ``out`` None, nothing."""

    def __init__(self, spy: asyncio.subprocess.Process | None) -> None:
        self._spy = spy

    @classmethod
    async def start(cls, pid: int, out: str | None) -> Profile:
        if not out:
            return cls(None)
        spy = await asyncio.create_subprocess_exec(
            str(Path(sys.executable).parent / "py-spy"),
            *("record", "-o", out, "-p", str(pid), "--nonblocking", "-r", "200"),
            *(["--format", "raw"] if out.endswith(".txt") else []),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        await asyncio.sleep(1.0)  # attached before the work starts
        return cls(spy)

    async def stop(self) -> None:
        """Stop sampling; the profile is written once py-spy has exited."""
        if self._spy is not None:
            self._spy.send_signal(signal.SIGINT)
            await self._spy.wait()
            self._spy = None


def rss_mib(pid: int) -> float:
    """Resident memory of ``pid`` in MiB (NaN when /proc does not say)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def data_disk(path: Path) -> str:
    """The file system under ``path``, as a benchmark's figures need it said: its type, its
    device, and on ext4 whether it has a journal. Without one, ext4 makes every file create
    step over the inodes freed in the last minute — five more while their inode table is not
    yet written back (``recently_deleted``) — which puts a cost on each attempt's log file
    that a journaled disk does not have (``create_cost_us`` measures it)."""
    target = str(Path(path).resolve())
    best: tuple[str, str, str] | None = None  # (mount point, type, source)
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        mount_point = fields[4].replace("\\040", " ")
        fs_type, source = fields[fields.index("-") + 1 : fields.index("-") + 3]
        inside = target == mount_point or target.startswith(mount_point.rstrip("/") + "/")
        if inside and (best is None or len(mount_point) >= len(best[0])):
            best = (mount_point, fs_type, source)
    if best is None:
        return "unknown file system"
    mount_point, fs_type, source = best
    said = f"{fs_type} on {source} (mounted at {mount_point})"
    if fs_type == "ext4":
        journal = Path("/sys/fs/ext4") / Path(source).name / "journal_task"
        try:
            has_journal = journal.read_text().strip() != "<none>"
        except OSError:
            return said
        said += ", with a journal" if has_journal else ", without a journal (creates pay the recently-deleted scan)"
    return said


def create_cost_us(folder: Path, n: int = 128) -> float:
    """µs of wall time per file create in ``folder`` now, over ``n`` new empty files (0600).

    On ext4 without a journal this moves with what was deleted on the disk in the last minutes:
    ~35 µs on this VM's disk when nothing was, ~1 ms for minutes after a few thousand deletes
    (a test suite's temporary folders, a benchmark's last round) — every worker launch creates
    its log file, so a throughput figure says little without it. The files are left in place:
    deleting them would charge the next creates. Wall time, not system CPU: a create is one
    system call, and the kernel's CPU accounting is too coarse for a few milliseconds."""
    folder.mkdir(parents=True, exist_ok=True)
    taken = len(os.listdir(folder))  # a second probe in the same folder makes new files too
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
    began = time.perf_counter()
    for i in range(taken, taken + n):
        os.close(os.open(folder / f"probe-{i}", flags, 0o600))
    return (time.perf_counter() - began) * 1e6 / n


@dataclass(frozen=True)
class CpuTimes:
    """The machine's CPU time so far, in clock ticks summed over its CPUs (``/proc/stat``)."""

    busy: int  # user, nice, system, irq, softirq, steal
    idle: int  # idle and iowait

    @classmethod
    def parse(cls, stat: str) -> CpuTimes:
        fields = [int(v) for v in stat.splitlines()[0].split()[1:]]
        fields += [0] * (8 - len(fields))
        user, nice, system, idle, iowait, irq, softirq, steal = fields[:8]
        # guest and guest_nice (fields 9, 10) are already counted in user and nice.
        return cls(busy=user + nice + system + irq + softirq + steal, idle=idle + iowait)

    @classmethod
    def now(cls) -> CpuTimes:
        return cls.parse(Path("/proc/stat").read_text())

    def busy_share_since(self, earlier: CpuTimes) -> float:
        """The share (0..1) of the machine's CPU time that was busy between ``earlier`` and this."""
        busy, idle = self.busy - earlier.busy, self.idle - earlier.idle
        return busy / (busy + idle) if busy + idle > 0 else 0.0


# The scheduler's group-commit counters, by the name its figures use.
GROUP_COMMIT_COUNTERS = {
    "taskgate_group_commit_batches_total": "transactions",
    "taskgate_group_commit_reruns_total": "reruns",
}


def store_counters(families: Iterable[Any]) -> tuple[dict[str, tuple[float, float]], dict[str, float]]:
    """From a scheduler's metric families (a ``/metrics`` page parsed, or an in-process
    registry's ``collect()``): its store units by store call, (units run, database-thread CPU s);
    and its group commit's ``transactions`` and ``reruns`` so far (with ``exit_proofs:kernel`` and
    ``exit_proofs:table``, the exits proven each way, and ``batches:<loop|thread>:<count|sum>``,
    the batches committed on the event loop or the database thread and their wall seconds)."""
    units: dict[str, list[float]] = {}
    group: dict[str, float] = {}
    for family in families:
        for sample in family.samples:
            if sample.name in GROUP_COMMIT_COUNTERS:
                group[GROUP_COMMIT_COUNTERS[sample.name]] = sample.value
            if sample.name == "taskgate_exit_proofs_total":  # how exits were proven: kernel | table
                group[f"exit_proofs:{sample.labels['by']}"] = sample.value
            if sample.name in ("taskgate_group_commit_batch_seconds_count", "taskgate_group_commit_batch_seconds_sum"):
                # batches by where they committed (loop | thread): how many, and their wall seconds
                group[f"batches:{sample.labels['on']}:{sample.name.rsplit('_', 1)[1]}"] = sample.value
            which = {"taskgate_store_units_total": 0, "taskgate_store_unit_cpu_seconds_total": 1}.get(sample.name)
            if which is not None:
                units.setdefault(sample.labels["unit"], [0.0, 0.0])[which] = sample.value
    return {unit: (count, cpu) for unit, (count, cpu) in units.items()}, group


def launch_steps(families: Iterable[Any]) -> dict[str, tuple[float, float]]:
    """From a scheduler's metric families: ``taskgate_task_launch_step_seconds`` so far, (count,
    seconds) per step."""
    steps: dict[str, list[float]] = {}
    for family in families:
        for sample in family.samples:
            which = {
                "taskgate_task_launch_step_seconds_count": 0,
                "taskgate_task_launch_step_seconds_sum": 1,
            }.get(sample.name)
            if which is not None:
                steps.setdefault(sample.labels["step"], [0.0, 0.0])[which] = sample.value
    return {step: (count, seconds) for step, (count, seconds) in steps.items()}


def launch_step_means_ms(
    before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]
) -> dict[str, float]:
    """The mean wall ms of each launch step between two reads (steps no launch finished: absent)."""
    means = {}
    for step, (count, seconds) in after.items():
        count0, seconds0 = before.get(step, (0.0, 0.0))
        if count > count0:
            means[step] = 1000 * (seconds - seconds0) / (count - count0)
    return means


def cpu_fields(stat: Path) -> tuple[float, float, float, float]:
    """(user, system, waited-for children's user, their system) in seconds from a ``stat`` file
    of /proc (a process's or one of its threads')."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick, int(fields[13]) / tick, int(fields[14]) / tick


def cpu_seconds(pid: int) -> float:
    """User + system CPU a process has used so far (from /proc/<pid>/stat)."""
    user, system, _, _ = cpu_fields(Path(f"/proc/{pid}/stat"))
    return user + system


def postgres_cpu_seconds(port: int) -> float:
    """User + system CPU so far of a PostgreSQL cluster's processes now alive: its postmaster
    (the ``postgres`` process started with ``-p <port>``) and every process it started. A
    backend that exited since an earlier reading takes its CPU with it: read it while the
    clients keep their connections (pooled services do)."""
    procs: dict[int, tuple[int, str]] = {}  # pid -> (parent pid, command line)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile
            continue
        procs[int(entry.name)] = (int(stat.rsplit(")", 1)[1].split()[1]), cmdline)
    masters = {pid for pid, (_, cmd) in procs.items() if "postgres" in cmd and f"-p {port} " in f"{cmd} "}
    total = 0.0
    for pid, (parent, _) in procs.items():
        if pid in masters or parent in masters:
            try:
                total += cpu_seconds(pid)
            except OSError:
                pass
    return total


def children_cpu_seconds(pid: int) -> float:
    """CPU of the process's children it has waited for (the scheduler's: its workers)."""
    _, _, user, system = cpu_fields(Path(f"/proc/{pid}/stat"))
    return user + system


def own_cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system
