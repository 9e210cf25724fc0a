"""Small helpers the benchmarks share: percentiles and a process's resident memory."""

from __future__ import annotations

from pathlib import Path


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
