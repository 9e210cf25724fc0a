"""One cgroup per worker attempt: the stop kills it, an empty cgroup is the proof.

Detected at start-up, never assumed. Preferred: a writable cgroup v2 hierarchy
whose cgroups offer ``cgroup.procs``, ``cgroup.events`` and ``cgroup.kill``
(Linux 5.14+) or ``cgroup.freeze`` (then: freeze, SIGKILL each member, thaw). On
a hybrid host that is ``/sys/fs/cgroup/unified``; on a pure v2 host the
scheduler's own cgroup. Else the v1 ``freezer`` hierarchy (freeze, SIGKILL each
member, thaw; empty ``cgroup.procs`` below it is the proof). Where none is
usable, the caller falls back to subreaper-only proof and says so.

A process cannot leave its cgroup unless it may write another cgroup's
``cgroup.procs`` (root can): a worker running as its own ``user`` stays inside.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from libs import proctree

MOUNTINFO = Path("/proc/self/mountinfo")


class CgroupUnavailable(Exception):
    """Why per-attempt cgroups cannot be used on this host."""


def _mount(version: int) -> Path | None:
    try:
        lines = MOUNTINFO.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        # "<id> <parent> <maj:min> <root> <mount point> <opts> ... - <fstype> <source> <super opts>"
        left, _, right = line.partition(" - ")
        fields = right.split(" ")
        if version == 2 and fields[0] == "cgroup2":
            return Path(left.split(" ")[4])
        if version == 1 and fields[0] == "cgroup" and "freezer" in fields[-1].split(","):
            return Path(left.split(" ")[4])
    return None


def _own_path(version: int) -> str:
    """This process's cgroup in the v2 hierarchy, or in the v1 freezer hierarchy."""
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if (version == 2 and controllers == "") or (version == 1 and "freezer" in controllers.split(",")):
                return path.strip() or "/"
    except (OSError, ValueError):
        pass
    return "/"


@dataclass(frozen=True)
class Cgroups:
    """The folder under which this scheduler creates one cgroup per attempt."""

    base: Path
    has_kill: bool
    version: int = 2

    @classmethod
    def detect(cls, name: str = "taskgate", versions: tuple[int, ...] = (2, 1)) -> Cgroups:
        """The first of ``versions`` this host lets the scheduler use; says why none when none."""
        reasons = []
        for version in versions:
            try:
                return cls._detect(name, version)
            except CgroupUnavailable as exc:
                reasons.append(f"v{version}: {exc}")
        raise CgroupUnavailable("; ".join(reasons))

    @classmethod
    def _detect(cls, name: str, version: int) -> Cgroups:
        """Create (or reuse) ``<our cgroup>/<name>`` and check it offers what the proof needs."""
        mount = _mount(version)
        if mount is None:
            raise CgroupUnavailable("no cgroup v2 hierarchy" if version == 2 else "no v1 freezer hierarchy")
        parent = mount / _own_path(version).lstrip("/")
        base = parent / name
        try:
            base.mkdir(exist_ok=True)
            probe = base / f"probe-{os.getpid()}"
            probe.mkdir(exist_ok=True)
        except OSError as exc:
            raise CgroupUnavailable(f"cannot create a cgroup under {parent}: {exc.strerror}") from exc
        try:
            needed = ["cgroup.procs", "cgroup.events" if version == 2 else "freezer.state"]
            missing = [f for f in needed if not os.access(probe / f, os.W_OK if f != "cgroup.events" else os.R_OK)]
            has_kill = (probe / "cgroup.kill").exists()
            if version == 2 and not has_kill and not (probe / "cgroup.freeze").exists():
                missing.append("cgroup.kill or cgroup.freeze")
            if missing:
                raise CgroupUnavailable(f"cgroups under {base} lack {', '.join(missing)}")
        finally:
            try:
                probe.rmdir()
            except OSError:
                pass
        return cls(base=base, has_kill=has_kill, version=version)

    def close(self) -> None:
        """Remove this scheduler's folder when nothing is left in it (a survivor keeps it)."""
        try:
            self.base.rmdir()
        except OSError:
            pass

    def path_for(self, attempt_id: str) -> Path:
        return self.base / attempt_id

    def dir_for(self, attempt_id: str) -> str:
        """``path_for`` as a string: every launch and exit asks, and a pathlib join costs more
        than the read it names."""
        return f"{self.base}/{attempt_id}"

    def sweep(self, keep: set[str | None]) -> int:
        """Remove the empty attempt cgroups not in ``keep``; a populated one stays (it is proof of a survivor)."""
        removed = 0
        for path in self.base.iterdir() if self.base.exists() else ():
            if path.is_dir() and str(path) not in keep and not populated(path) and remove(path):
                removed += 1
        return removed

    def create(self, attempt_id: str) -> Path:
        path = self.path_for(attempt_id)
        path.mkdir(parents=True, exist_ok=True)  # the folder itself may have been cleaned up meanwhile
        return path


def add(path: Path, pid: int) -> None:
    """Move ``pid`` into the cgroup (the launcher holds it there before it execs anything)."""
    fd = os.open(f"{path}/cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, b"%d\n" % pid)
    finally:
        os.close(fd)


def _walk(path: Path) -> list[Path]:
    """The cgroup and every cgroup below it, deepest first (a worker as root may nest).

    ``scandir``: the entry types come with the listing; a cgroup folder holds dozens of
    control files, and a stat of each (``Path.is_dir``) cost more than the rest of an exit.
    """
    found: list[Path] = []
    try:
        with os.scandir(path) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    found.extend(_walk(Path(entry.path)))
    except OSError:
        return found
    found.append(path)
    return found


def members(path: Path) -> list[int]:
    """The processes in the cgroup and every cgroup below it."""
    if known_empty(path):  # v2: one read says so for the cgroup and all below it
        return []
    pids: list[int] = []
    for cg in _walk(path):
        pids.extend(own_members(cg) or ())
    return pids


def known_empty(path: Path | str) -> bool:
    """Whether the cgroup and everything below it provably holds no process, from one read of
    its ``cgroup.events`` (v2) — never a walk. A cgroup that does not exist holds nothing;
    one whose events file cannot be read (v1) is not known empty."""
    try:
        return b"populated 0\n" in proctree.read_all(f"{path}/cgroup.events")
    except FileNotFoundError:
        return not os.path.isdir(path)
    except OSError:
        return False


def remove_at_once(path: Path | str) -> bool:
    """One ``rmdir`` of an empty cgroup with nothing below it; True when it is gone. Never
    walks nor waits (``remove`` does both, for a cgroup below it or a brief EBUSY)."""
    try:
        os.rmdir(path)
    except FileNotFoundError:
        pass
    except OSError:
        return False
    return True


def own_members(path: Path | str) -> list[int] | None:
    """The processes in the cgroup itself (one read of its ``cgroup.procs``, none below it);
    None when there is no such cgroup (not created yet, or removed)."""
    try:
        return [int(p) for p in proctree.read_all(f"{path}/cgroup.procs").split()]
    except (OSError, ValueError):
        return None


def populated(path: Path) -> bool:
    """True while any process is in the cgroup or below it; a missing cgroup is empty."""
    if not path.exists():
        return False
    try:
        for line in (path / "cgroup.events").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "populated":
                return value.strip() == "1"
    except FileNotFoundError:
        pass  # v1: no events file; the members say it
    return bool(members(path))


# Members pinned with a pidfd at a time (a fork bomb's thousands must not exhaust descriptors).
PIN_BATCH = 64


def signal_all(path: Path, sig: signal.Signals) -> None:
    """Signal every member: they are the attempt's by being in its cgroup.

    A member read from ``cgroup.procs`` may exit and its pid be reused before the kill: each
    is pinned with a pidfd first and signalled only if a read made after the pin still lists
    its pid. A pinned process still alive then is the one listed (a live process keeps its
    pid); one that died meanwhile gets nothing (a pidfd never follows its pid to a new holder)."""
    me = os.getpid()
    listed = [pid for pid in members(path) if pid != me]
    for start in range(0, len(listed), PIN_BATCH):
        _signal_pinned(path, listed[start : start + PIN_BATCH], sig)


def _signal_pinned(path: Path, pids: list[int], sig: signal.Signals) -> None:
    pinned: list[tuple[int, int]] = []
    try:
        for pid in pids:
            try:
                pinned.append((pid, os.pidfd_open(pid)))
            except ProcessLookupError:
                pass
        if not pinned:
            return
        still = set(members(path))
        for pid, fd in pinned:
            if pid in still:
                try:
                    signal.pidfd_send_signal(fd, sig)
                except (ProcessLookupError, PermissionError):
                    pass
    finally:
        for _, fd in pinned:
            os.close(fd)


def kill(path: Path, has_kill: bool) -> None:
    """SIGKILL everything in the cgroup, forks racing the kill included."""
    if not path.exists():
        return
    if has_kill:
        try:
            (path / "cgroup.kill").write_text("1\n")
            return
        except OSError:
            pass
    # Freeze first so nothing forks between reading the members and killing them;
    # the kills take effect as they thaw.
    if (path / "cgroup.freeze").exists():
        freeze, frozen, thawed = path / "cgroup.freeze", "1", "0"
    else:
        freeze, frozen, thawed = path / "freezer.state", "FROZEN", "THAWED"
    try:
        freeze.write_text(frozen + "\n")
        for _ in range(100):  # v1 passes through FREEZING
            if freeze.name != "freezer.state" or freeze.read_text().strip() == "FROZEN":
                break
            time.sleep(0.005)
    except OSError:
        pass
    signal_all(path, signal.SIGKILL)
    try:
        freeze.write_text(thawed + "\n")
    except OSError:
        pass


def remove(path: Path) -> bool:
    """Remove an empty cgroup (and empty ones below it); True when it is gone."""
    try:
        os.rmdir(path)  # the usual case: no cgroup below it, and the last exit accounted
        return True
    except FileNotFoundError:
        return True
    except OSError:
        pass
    for cg in _walk(path):
        for _ in range(50):  # rmdir can briefly say EBUSY while the last exit is accounted
            try:
                cg.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.01)
    return not path.exists()
