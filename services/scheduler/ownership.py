"""What this scheduler incarnation owns on its host: the proof mode, the attempts
whose processes are not yet proven gone, and the orphans they leave behind.

Set up once at start-up (``start``): the scheduler becomes the child subreaper,
and per-attempt cgroups are used where the host allows them; the mode in force is
logged. Orphans re-parented to the scheduler are attributed to the one attempt
they can belong to (``processes.attribute_orphans``); their zombies are reaped by
pid, never a worker leader's (its ``processes.WorkerProcess`` waits for those).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path

import structlog

from libs import proctree
from services.scheduler import cgroups, helper_children, processes, subreaper
from services.scheduler.domain import Attempt

log = structlog.get_logger("scheduler")

TableReader = Callable[[], dict[int, proctree.ProcStat]]


class Ownership:
    def __init__(self, table_reader: TableReader, leaders: Callable[[], set[int]], reap_unknown: bool) -> None:
        self._table_reader = table_reader
        self._leaders = leaders  # pids of this incarnation's live worker leaders
        # True where nothing but workers is ever a child of this process (the real scheduler).
        self._reap_unknown = reap_unknown
        self.cgroups: cgroups.Cgroups | None = None
        self.subreaper = False
        # Attempts of this incarnation whose processes are not yet proven gone:
        # the candidates an orphan re-parented to the scheduler may belong to.
        self.owned: dict[str, Attempt] = {}
        self._reapable: set[tuple[int, int]] = set()
        self._forking: dict[str, int] = {}  # attempt id -> boot tick just before its fork
        # Attempt id -> pid of a spawn whose launch has not recorded it yet: said by the spawning
        # thread the moment the fork returns, so the window where a new child is neither a known
        # leader nor anyone's orphan is the fork itself, not the whole launch.
        self._spawned: dict[str, int] = {}
        # Attempt id -> a pidfd on its leader, kept while the attempt is owned: a group whose
        # leader has exited (and been reaped) is still signalled, and known empty, through it.
        self._group_fds: dict[str, int] = {}
        self._lock = threading.Lock()  # the three above are read from the scan's and stops' threads
        # The last table whose orphans were checked, and what was found (many exits share a read).
        self._checked: tuple[dict[int, proctree.ProcStat], list[proctree.ProcStat]] | None = None

    def start(self, mode: str, data_dir: Path) -> None:
        """Detect and say which proof mode is in force (cgroup + subreaper, or subreaper only)."""
        self.subreaper = subreaper.become()
        reason = ""
        if mode != "subreaper":
            # One folder per data directory: schedulers of other installations keep theirs.
            tag = hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:12]
            try:
                self.cgroups = cgroups.Cgroups.detect(f"taskgate-{tag}", (1,) if mode == "cgroup_v1" else (2, 1))
            except cgroups.CgroupUnavailable as exc:
                if mode != "auto":
                    raise RuntimeError(f"proof_mode = {mode}, but {exc}") from exc
                reason = str(exc)
        log.info(
            "proof_mode",
            mode=f"cgroup_v{self.cgroups.version}" if self.cgroups else "subreaper",
            cgroup_base=str(self.cgroups.base) if self.cgroups else None,
            subreaper=self.subreaper,
            fallback_reason=reason or None,
            requested=mode,
        )
        if not self.subreaper:
            log.warning("subreaper_unavailable", detail="orphaned worker descendants re-parent to init")

    async def sweep(self) -> None:
        """Remove empty attempt cgroups nobody needs (leftovers of an earlier incarnation)."""
        if self.cgroups is not None:
            removed = await asyncio.to_thread(self.cgroups.sweep, {a.cgroup for a in self.owned.values()})
            if removed:
                log.info("stale_cgroups_removed", count=removed)

    async def close(self) -> None:
        with self._lock:
            kept, self._group_fds = self._group_fds, {}
        for fd in kept.values():
            os.close(fd)
        if self.subreaper:
            subreaper.resign()
            self.subreaper = False
        if self.cgroups is not None:
            await self.sweep()
            await asyncio.to_thread(self.cgroups.close)

    @property
    def busy(self) -> bool:
        return bool(self.owned or self._reapable)

    def cgroup_for(self, attempt_id: str) -> str | None:
        return self.cgroups.dir_for(attempt_id) if self.cgroups else None

    async def forking(self, attempt: Attempt, create_cgroup: bool = True) -> None:
        """The attempt is about to fork: own it, and create its cgroup (unless the spawn does:
        ``processes.launch`` creates the one it is given, in the same hop to a thread)."""
        self.owned[attempt.attempt_id] = attempt
        with self._lock:
            self._forking[attempt.attempt_id] = proctree.boot_ticks() - 1
        if self.cgroups is not None and create_cgroup:
            await asyncio.to_thread(self.cgroups.create, attempt.attempt_id)

    def spawned(self, attempt_id: str, pid: int) -> None:
        """(Any thread.) The launch's fork returned ``pid``: a leader from now on, never an orphan."""
        with self._lock:
            if attempt_id in self._forking:  # else the launch is over already
                self._spawned[attempt_id] = pid
                del self._forking[attempt_id]

    def forked(self, attempt: Attempt) -> None:
        """The fork is over (its pid known, or it failed)."""
        with self._lock:
            self._forking.pop(attempt.attempt_id, None)
            self._spawned.pop(attempt.attempt_id, None)

    def keep_group(self, attempt: Attempt, pidfd: int) -> None:
        """Keep ``pidfd`` (on the attempt's leader, taken over) until the attempt is dropped."""
        with self._lock:
            earlier = self._group_fds.pop(attempt.attempt_id, None)
            self._group_fds[attempt.attempt_id] = pidfd
        if earlier is not None:
            os.close(earlier)

    def signal_group(self, attempt: Attempt, sig: int) -> bool | None:
        """(Any thread.) ``proctree.signal_led_group`` through the attempt's kept pidfd; None
        when none is kept (an earlier incarnation's attempt, or one dropped meanwhile)."""
        with self._lock:  # held across the call: a drop must not close the fd under it
            fd = self._group_fds.get(attempt.attempt_id)
            return proctree.signal_led_group(fd, sig) if fd is not None else None

    def drop(self, attempt: Attempt) -> None:
        """The attempt's tree is proven gone; its zombies (re-parented orphans) may still be reaped.

        Its group gets a last SIGKILL through the kept pidfd before that is closed: a process-table
        read is no snapshot — a member that forks and exits while the read walks ``/proc`` can be
        missed by it, its child born after the listing — and whatever of the attempt's own group
        such a read missed ends here. Nothing else can receive it (only zombies, if all is gone)."""
        with self._lock:
            fd = self._group_fds.pop(attempt.attempt_id, None)
        if fd is not None:
            try:
                if proctree.signal_led_group(fd, signal.SIGKILL):
                    log.debug("group_swept", task_id=attempt.task_id, pgid=attempt.pgid)
            finally:
                os.close(fd)
        self.forked(attempt)
        if self.owned.pop(attempt.attempt_id, None) is not None:
            self._reapable.update((d.pid, d.start_time) for d in attempt.descendants)

    def _forking_floor(self) -> int | None:
        """The earliest boot tick a launch whose pid is not known yet, or a helper command the
        scheduler awaits itself (``helper_children``), may have forked at."""
        with self._lock:
            own = min(self._forking.values(), default=None)
        floors = [f for f in (own, helper_children.floor()) if f is not None]
        return min(floors, default=None)

    def _leader_pids(self) -> set[int]:
        """Live worker leaders, with those spawned whose launch has not recorded them yet."""
        with self._lock:
            spawned = set(self._spawned.values())
        for _ in range(100):
            try:
                return self._leaders() | spawned
            except RuntimeError:  # (called from a thread) the loop changed the live attempts meanwhile
                continue
        return self._leaders() | spawned

    def orphan_check(self, table: dict[int, proctree.ProcStat]) -> list[proctree.ProcStat]:
        """Attribute orphans re-parented to the scheduler; those fitting several attempts are returned.

        Once per table: the exits that share a read (``scans.SharedScan.then``) ask again for
        the same table, and a second pass would find what the first one did (or, with a
        launch's fork over meanwhile, less: the first answer is the cautious one).
        """
        checked = self._checked
        if checked is not None and checked[0] is table:
            return list(checked[1])
        found = subreaper.orphans(table, self._leader_pids())
        # A child forked by a launch whose pid is not known yet is a leader, not an orphan:
        # what started since the earliest such fork is neither recorded nor signalled now.
        floor = self._forking_floor()
        pending = [o for o in found if floor is not None and o.start_time >= floor]
        found = [o for o in found if o not in pending]
        result = processes.attribute_orphans(table, list(self.owned.values()), found) + pending
        self._checked = (table, result)
        return list(result)

    def strays(self) -> bool:
        """(Any thread.) Whether this process has a live child that is not a worker leader it
        knows and may be an orphan of an attempt (more than ``KERNEL_PROOF_MAX_READS`` such
        children count as yes, unread): one of the children of its main thread, where
        the kernel re-parents every orphan (``proctree.orphan_parent_children``). True when the
        kernel keeps no list of them.

        A worker being launched may be such a child until its launch records the pid — under
        load there is nearly always one. In cgroup mode it is born in its launching attempt's
        cgroup (``CLONE_INTO_CGROUP``) and is held there, alone, until its launch is recorded; a
        child found alone in the cgroup of an attempt whose launch has not said its pid yet is
        not counted. (Only a worker of the scheduler's own user, which may write the delegated
        ``cgroup.procs``, could move itself into such a cgroup, and only in the instant before
        that launch's clone; the cgroup then holds it, and that attempt's end stops and proves
        it.) In subreaper mode nothing tells such a child from an orphan (``kernel_may_prove``)."""
        try:
            children = proctree.orphan_parent_children()
        except OSError:
            return True
        unknown = children - self._leader_pids()
        if not unknown:
            return False
        if len(unknown) > processes.KERNEL_PROOF_MAX_READS:
            return True  # called on the event loop: that many are not read one by one (``look`` will)
        others = self._not_held(unknown, processes.KERNEL_PROOF_MAX_READS)
        for pid in others:
            stat = proctree.read_stat(pid)
            if stat is not None and not stat.alive:
                continue  # a zombie (an orphan's, a helper command's) is no process of anyone's
            return True
        return False

    def kernel_may_prove(self) -> bool:
        """Whether an exit's proof by the kernel alone can succeed now: not in subreaper mode
        while a launch's worker is not recorded yet (it would count as a stray)."""
        return self.cgroups is not None or not (self._forking or self._spawned)

    def _not_held(self, pids: set[int], max_reads: int) -> set[int]:
        """``pids`` less the held workers among them: a process found alone in the cgroup of an
        attempt whose launch has forked and not said the pid yet is that launch's worker. One
        read of such a cgroup's own ``cgroup.procs`` (10 µs; ``cgroups.members`` with its events
        read and walk below, 37): the worker is born there, and a process in a cgroup below it is
        no held worker — not excluded, it counts as a stray if it is a child of this process.

        The launches are asked oldest first and no further once every pid is found: each spawn
        helper serves its spawns in order, so an unknown child is nearly always one of the oldest
        launches' (one per helper), and the others (under load ten or so, their cgroups mostly
        not made yet) are not read at all.
        At most ``max_reads`` cgroups are read (``max_running`` may allow hundreds of launches):
        a pid not found by then is left in, as a child that may be an orphan is."""
        if self.cgroups is None:
            return pids
        with self._lock:
            forking = list(self._forking)  # insertion order: the oldest launch first
        left = set(pids)
        for attempt_id in forking[:max_reads]:
            if not left:
                break
            members = cgroups.own_members(self.cgroups.dir_for(attempt_id))  # None: not created yet
            if members is not None and len(members) == 1:
                left.discard(members[0])
        return left

    def reap(self, table: dict[int, proctree.ProcStat]) -> None:
        known = {(d.pid, d.start_time) for a in self.owned.values() for d in a.descendants} | self._reapable
        if self._reap_unknown:
            leaders = self._leader_pids()
            # A leader still in its fork -> forked() window is not in `leaders` yet: its exit
            # status belongs to its WorkerProcess (whose pidfd it may not have yet), and reaping
            # it would free its pid for reuse while the launch still reads its identity.
            floor = self._forking_floor()
            known |= {
                (p.pid, p.start_time)
                for p in table.values()
                if p.ppid == os.getpid() and p.pid not in leaders and (floor is None or p.start_time < floor)
            }
        for pid in subreaper.reap(table, known):
            self._reapable = {r for r in self._reapable if r[0] != pid}

    def look_after(self, table: dict[int, proctree.ProcStat]) -> None:
        """One supervisor pass (blocking; run it in a thread): attribute new orphans, reap zombies."""
        if self.subreaper:
            self.orphan_check(table)
            self.reap(table)

    def stop_context(self) -> processes.StopContext:
        return processes.StopContext(
            table_reader=self._table_reader,
            orphan_check=self.orphan_check if self.subreaper else None,
            cgroup_kill=self.cgroups.has_kill if self.cgroups else False,
            group_signal=self.signal_group,
            strays=self.strays,
        )
