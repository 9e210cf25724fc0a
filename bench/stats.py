"""Small helpers the benchmarks share: percentiles and a process's resident memory."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` by nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def rss_mib(pid: int) -> float:
    """Resident memory of ``pid`` in MiB (NaN when /proc does not say)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def data_disk(path: Path) -> str:
    """The file system under ``path``, as a benchmark's figures need it said: its type, its
    device, and on ext4 whether it has a journal. Without one, ext4 makes every file create
    pass over the inodes freed in the last ~30 s (``recently_deleted``), which puts a cost on
    each attempt's log file that a journaled disk does not have."""
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


# The scheduler's group-commit counters, by the name its figures use.
GROUP_COMMIT_COUNTERS = {
    "taskgate_group_commit_batches_total": "transactions",
    "taskgate_group_commit_reruns_total": "reruns",
}


def store_counters(families: Iterable[Any]) -> tuple[dict[str, tuple[float, float]], dict[str, float]]:
    """From a scheduler's metric families (a ``/metrics`` page parsed, or an in-process
    registry's ``collect()``): its store units by store call, (units run, database-thread CPU s);
    and its group commit's ``transactions`` and ``reruns`` so far."""
    units: dict[str, list[float]] = {}
    group: dict[str, float] = {}
    for family in families:
        for sample in family.samples:
            if sample.name in GROUP_COMMIT_COUNTERS:
                group[GROUP_COMMIT_COUNTERS[sample.name]] = sample.value
            which = {"taskgate_store_units_total": 0, "taskgate_store_unit_cpu_seconds_total": 1}.get(sample.name)
            if which is not None:
                units.setdefault(sample.labels["unit"], [0.0, 0.0])[which] = sample.value
    return {unit: (count, cpu) for unit, (count, cpu) in units.items()}, group
