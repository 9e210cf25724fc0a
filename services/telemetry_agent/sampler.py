"""Sampling watched process trees: membership, identity fences, sums and activity.

One call of ``Sampler.sample`` reads the process table ONCE (one parent map for
every watched tree) and then each member's figures through a ``Reader``. It
runs in the agent's worker thread, never on the event loop; it holds per-tree
state between calls and is not thread-safe (one caller at a time).

Rules (summed up in README.md and the proto's comments):

* **Membership**: the root, while its kernel start time equals the registered
  one and it has not exited, plus its live descendants by the parent map of the
  same table snapshot. A process re-parented outside (to init or a subreaper
  outside the tree) is no longer claimed. Zombies are not members.
* **Figures** of a member are *inclusive*: its own CPU ticks (utime/stime) plus
  those of the children it reaped (cutime/cstime), and /proc/<pid>/io, which
  the kernel already defines that way (a reaped child's I/O is folded into its
  parent). So short-lived children that come and go between two samples still
  count once their parent reaps them.
* **Sums** are accumulated from per-member deltas: the first (baseline) sample
  sets them to the sum of the members' figures; later samples add each
  member's increase since the sample before, and a new member's whole figures
  (it was forked since). A member that exits keeps what it contributed, so the
  sums never go backwards. When a member is reaped, the kernel adds its final
  figures to its parent, which would count its last-seen figures twice and
  look like activity: its last-seen figures are kept as a *credit* against its
  nearest remaining ancestor and absorbed from that ancestor's increases in the
  same and the next sample (then the credit lapses: a parent that ignores
  SIGCHLD never folds anything in). What remains is the unseen work the child
  did between the last sample and its exit.
* **Activity**: ``last_activity_at`` becomes the observation time of a sample in
  which the sums moved since the previous sample; the baseline sample never
  sets it (we do not know when the counters it finds moved). A member
  disappearing moves nothing.
* **Unavailable**: if any member cannot be read (permission denied), or lives in
  another pid namespace than the agent, or the host is not Linux, the
  observation says available=false with a reason and carries no figures;
  nothing else changes, so the next readable sample counts what happened
  meanwhile.
* **End**: when the root has exited, is gone, or its pid now belongs to another
  process, the tree has ended: one observation with ended=true (carrying the
  sums as of the last readable sample, no members) and the state is dropped.
  If that happens at the very first sample, nothing was ever read: the
  observation is unavailable with IDENTITY_MISMATCH or PROCESS_NOT_FOUND.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import psutil

from libs import proctree
from libs.proctree import ProcStat
from services.telemetry_agent.domain import (
    ACCESS_DENIED,
    IDENTITY_MISMATCH,
    NOT_LINUX,
    OTHER_PID_NAMESPACE,
    PROCESS_NOT_FOUND,
    ZERO,
    Figures,
    Member,
    Observation,
    Watch,
)

# A credit created in sample n is absorbed in samples n and n + 1.
CREDIT_SAMPLES = 2

_GONE = (psutil.NoSuchProcess, FileNotFoundError, ProcessLookupError)
_DENIED = (psutil.AccessDenied, PermissionError)


class Reader(Protocol):
    """Reads one process. Raises psutil.NoSuchProcess when (pid, start_time) is no
    longer that process, psutil.AccessDenied (or PermissionError) when it may not."""

    def read(self, pid: int, start_time: int) -> Figures: ...

    def pid_namespace(self, pid: int) -> int | None:
        """An id of the process's pid namespace; None when the host has no such notion."""
        ...


TableSource = Callable[[], dict[int, ProcStat]]
Clock = Callable[[], int]


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class _Credit:
    figures: Figures
    last_sample: int  # the tree's sample number after which it lapses


@dataclass
class _Record:
    member: Member
    parent: Member | None
    last: Figures
    credits: list[_Credit] = field(default_factory=list)

    def held(self) -> Figures:
        total = ZERO
        for credit in self.credits:
            total = total + credit.figures
        return total


@dataclass
class _Tree:
    watch: Watch
    samples: int = 0
    records: dict[Member, _Record] = field(default_factory=dict)
    totals: Figures | None = None  # None until the baseline sample
    last_activity_at: int | None = None
    available: bool = False
    reason: str | None = None
    reason_detail: str | None = None


@dataclass(frozen=True)
class _Unavailable:
    reason: str
    detail: str


class Sampler:
    def __init__(
        self,
        reader: Reader,
        *,
        table_source: TableSource = proctree.process_table,
        clock: Clock = wall_ms,
        linux: bool | None = None,
        own_pid_namespace: int | None = None,
    ) -> None:
        self._reader = reader
        self._table_source = table_source
        self._clock = clock
        self._linux = sys.platform.startswith("linux") if linux is None else linux
        self._own_ns = own_pid_namespace
        if self._own_ns is None and self._linux:
            try:
                self._own_ns = reader.pid_namespace(os.getpid())
            except Exception:  # noqa: BLE001 - no namespace check then
                self._own_ns = None
        self._trees: dict[Watch, _Tree] = {}

    def tracked(self) -> int:
        return len(self._trees)

    def sample(self, targets: Sequence[Watch], keep: Collection[Watch] | None = None) -> list[Observation]:
        """Sample ``targets`` from one process-table snapshot.

        ``keep`` (when given) is every watch still registered: state of the others
        is dropped. State of watches not in ``targets`` is otherwise untouched.
        """
        if keep is not None:
            keep_set = set(keep)
            for stale in [w for w in self._trees if w not in keep_set]:
                del self._trees[stale]
        if not targets:
            return []
        now = self._clock()
        if not self._linux:
            return [
                Observation(
                    task_id=w.task_id,
                    root=w.root,
                    observed_at=now,
                    available=False,
                    reason=NOT_LINUX,
                    reason_detail=f"process figures are read on Linux only, not on {sys.platform}",
                )
                for w in targets
            ]
        table = self._table_source()
        children = proctree.children_map(table)
        return [self._sample_tree(w, table, children, now) for w in targets]

    # -- one tree ---------------------------------------------------------------------------------

    def _sample_tree(
        self, watch: Watch, table: dict[int, ProcStat], children: dict[int, list[int]], now: int
    ) -> Observation:
        tree = self._trees.get(watch)
        if tree is None:
            tree = self._trees[watch] = _Tree(watch)
        root_stat = table.get(watch.pid)
        if root_stat is None or root_stat.start_time != watch.start_time or not root_stat.alive:
            return self._end(tree, now, root_stat)

        stats = [root_stat, *proctree.live_descendants(table, watch.pid, children)]
        readings: dict[Member, Figures] = {}
        parents: dict[Member, Member | None] = {}
        gone: set[Member] = set()
        for stat in stats:
            member = Member(stat.pid, stat.start_time)
            try:
                if member not in tree.records:
                    ns = self._reader.pid_namespace(stat.pid)
                    if ns is not None and self._own_ns is not None and ns != self._own_ns:
                        return self._unavailable(
                            tree,
                            now,
                            stats,
                            _Unavailable(
                                OTHER_PID_NAMESPACE,
                                f"pid {stat.pid} lives in another pid namespace (a container?) than the agent",
                            ),
                        )
                readings[member] = self._reader.read(stat.pid, stat.start_time)
            except _GONE:
                gone.add(member)
                continue
            except _DENIED:
                return self._unavailable(
                    tree,
                    now,
                    stats,
                    _Unavailable(ACCESS_DENIED, f"permission denied reading the figures of pid {stat.pid}"),
                )
            parent = table.get(stat.ppid)
            parents[member] = Member(parent.pid, parent.start_time) if parent and member != watch.root else None
        if watch.root in gone:
            # Exited between the table snapshot and the read.
            return self._end(tree, now, None)
        return self._account(tree, now, table, readings, parents, gone)

    def _account(
        self,
        tree: _Tree,
        now: int,
        table: Mapping[int, ProcStat],
        readings: dict[Member, Figures],
        parents: dict[Member, Member | None],
        gone: set[Member],
    ) -> Observation:
        tree.samples += 1
        n = tree.samples
        baseline = tree.totals is None

        # Members seen before and not read now: reaped, a zombie still, or moved out of the tree.
        reaped: list[_Record] = []
        for member, record in list(tree.records.items()):
            if member in readings:
                continue
            stat = table.get(member.pid)
            same = stat is not None and stat.start_time == member.start_time
            if member in gone or not same:
                reaped.append(record)
            elif stat is not None and stat.alive:
                del tree.records[member]  # alive outside the tree: not claimed, nothing folds in
            # Otherwise a zombie (exited, not reaped yet): kept until it is, so its fold can be credited.
        reaped_by_member = {r.member: r for r in reaped}
        for record in reaped:
            del tree.records[record.member]
        for record in reaped:
            amount = record.last + record.held()
            heir = self._nearest_remaining(record, tree.records, reaped_by_member)
            if heir is not None and amount.any():
                heir.credits.append(_Credit(amount, n + CREDIT_SAMPLES - 1))

        moved = ZERO
        for member, figures in readings.items():
            known = tree.records.get(member)
            if known is None:
                # Forked since the last sample: all its figures are new (none at the baseline).
                known = tree.records[member] = _Record(member, parents.get(member), figures)
                delta = figures if not baseline else ZERO
            else:
                # Most members of most trees do not move between samples: skip the arithmetic.
                delta = ZERO if figures == known.last else figures.minus(known.last)
                known.last = figures
                known.parent = parents.get(member)
            if known.credits:
                delta = self._absorb(known, delta, n)
            if delta is not ZERO:
                moved = moved + delta

        if baseline:
            total = ZERO
            for figures in readings.values():
                total = total + figures
            tree.totals = total
        else:
            assert tree.totals is not None
            if moved.any():
                tree.totals = tree.totals + moved
                tree.last_activity_at = now
        tree.available, tree.reason, tree.reason_detail = True, None, None
        return Observation(
            task_id=tree.watch.task_id,
            root=tree.watch.root,
            observed_at=now,
            available=True,
            figures=tree.totals,
            members=_ordered(tree.watch.root, readings),
            last_activity_at=tree.last_activity_at,
        )

    @staticmethod
    def _nearest_remaining(
        record: _Record, records: dict[Member, _Record], reaped: dict[Member, _Record]
    ) -> _Record | None:
        """The tracked ancestor the reaped ``record`` was folded into, if any.

        ``records`` holds the members read in this sample and the zombies. An
        ancestor reaped in the same sample is walked past (its own reaper received
        both folds); an ancestor that left the tree alive ends the walk: whatever
        it folds in is not ours.
        """
        parent = record.parent
        while parent is not None:
            heir = records.get(parent)
            if heir is not None:
                return heir
            up = reaped.get(parent)
            if up is None:
                return None
            parent = up.parent
        return None

    @staticmethod
    def _absorb(record: _Record, delta: Figures, n: int) -> Figures:
        kept: list[_Credit] = []
        for credit in record.credits:
            used = credit.figures.cap(delta)
            delta = delta.minus(used)
            remaining = credit.figures.minus(used)
            if remaining.any() and credit.last_sample > n:
                kept.append(_Credit(remaining, credit.last_sample))
        record.credits = kept
        return delta

    # -- outcomes without accounting --------------------------------------------------------------

    def _unavailable(self, tree: _Tree, now: int, stats: list[ProcStat], why: _Unavailable) -> Observation:
        tree.available, tree.reason, tree.reason_detail = False, why.reason, why.detail
        members = tuple(Member(s.pid, s.start_time) for s in stats)
        return Observation(
            task_id=tree.watch.task_id,
            root=tree.watch.root,
            observed_at=now,
            available=False,
            reason=why.reason,
            reason_detail=why.detail,
            members=(members[0], *sorted(members[1:])),
            last_activity_at=tree.last_activity_at,
        )

    def _end(self, tree: _Tree, now: int, root_stat: ProcStat | None) -> Observation:
        del self._trees[tree.watch]
        watch = tree.watch
        if tree.samples == 0 and not tree.reason:
            if root_stat is not None and root_stat.start_time != watch.start_time:
                reason = IDENTITY_MISMATCH
                detail = (
                    f"pid {watch.pid} started at tick {root_stat.start_time}, not at "
                    f"{watch.start_time}: another process"
                )
            else:
                reason = PROCESS_NOT_FOUND
                detail = f"pid {watch.pid} had exited before its first sample"
            return Observation(
                task_id=watch.task_id,
                root=watch.root,
                observed_at=now,
                available=False,
                reason=reason,
                reason_detail=detail,
                ended=True,
            )
        if not tree.available:
            return Observation(
                task_id=watch.task_id,
                root=watch.root,
                observed_at=now,
                available=False,
                reason=tree.reason,
                reason_detail=tree.reason_detail,
                last_activity_at=tree.last_activity_at,
                ended=True,
            )
        return Observation(
            task_id=watch.task_id,
            root=watch.root,
            observed_at=now,
            available=True,
            figures=tree.totals,
            last_activity_at=tree.last_activity_at,
            ended=True,
        )


def _ordered(root: Member, members: Collection[Member]) -> tuple[Member, ...]:
    return (root, *sorted(m for m in members if m != root))
