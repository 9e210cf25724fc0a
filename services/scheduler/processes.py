"""Worker processes: launch in a new session, stop with identity checks, prove exit.

What "stopped" means here: no live process remains in the worker's process
group, and no recorded descendant whose kernel start time still matches is
alive. taskgate signals only its own process group (a pid is signalled only
after its identity is checked); a descendant that left the group is recorded and
checked, never signalled, and while it lives the stop is unconfirmed.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from libs import proctree
from services.scheduler.domain import Attempt, ProcessIdentity

POLL_S = 0.02


@dataclass
class Launched:
    process: asyncio.subprocess.Process
    pid: int
    pgid: int
    start_time: int | None


def resolve_command(command: Sequence[str]) -> list[str]:
    """'python' as the first word means the project's own interpreter."""
    argv = list(command)
    if argv[0] == "python":
        argv[0] = sys.executable
    return argv


def _prepare(cwd: Path, log_path: Path) -> BinaryIO:
    cwd.mkdir(parents=True, exist_ok=True)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    return open(log_path, "ab")  # noqa: SIM115 - closed by launch once the child holds it


async def launch(command: Sequence[str], cwd: Path, env: Mapping[str, str], log_path: Path) -> Launched:
    log_file = await asyncio.to_thread(_prepare, cwd, log_path)
    with log_file:
        process = await asyncio.create_subprocess_exec(
            *resolve_command(command),
            cwd=str(cwd),
            env=dict(env),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log_file,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,  # own session, so its own process group
        )
    # May be None when the process has already exited and been reaped.
    start_time = await asyncio.to_thread(proctree.start_time_of, process.pid)
    return Launched(process=process, pid=process.pid, pgid=process.pid, start_time=start_time)


@dataclass
class TreeStatus:
    group: list[proctree.ProcStat] = field(default_factory=list)
    escaped: list[proctree.ProcStat] = field(default_factory=list)
    # Why the group cannot be signalled (identity mismatch, legacy record), if so.
    unsignallable: str = ""

    @property
    def gone(self) -> bool:
        return not self.group and not self.escaped

    def describe(self) -> str:
        parts = []
        if self.group:
            parts.append(f"{len(self.group)} process(es) still in group: " + ", ".join(str(p.pid) for p in self.group))
        if self.escaped:
            parts.append(
                "recorded descendant(s) outside the group still alive: "
                + ", ".join(f"pid {p.pid} (start {p.start_time})" for p in self.escaped)
            )
        if self.unsignallable:
            parts.append(self.unsignallable)
        return "; ".join(parts) or "no process remains"


def record_descendants(attempt: Attempt, table: dict[int, proctree.ProcStat]) -> bool:
    """Add the live descendants of the attempt's leader to its record; True if any were new."""
    if attempt.pid is None or attempt.pid_start_time is None:
        return False
    leader = table.get(attempt.pid)
    if leader is None or not leader.alive or leader.start_time != attempt.pid_start_time:
        return False
    known = {(d.pid, d.start_time) for d in attempt.descendants}
    added = False
    for stat in proctree.live_descendants(table, attempt.pid):
        if (stat.pid, stat.start_time) not in known:
            attempt.descendants.append(ProcessIdentity(pid=stat.pid, start_time=stat.start_time))
            known.add((stat.pid, stat.start_time))
            added = True
    return added


def tree_status(attempt: Attempt, table: dict[int, proctree.ProcStat]) -> TreeStatus:
    status = TreeStatus()
    if attempt.pgid is None:
        return status
    leader = table.get(attempt.pid) if attempt.pid is not None else None
    if attempt.pid_start_time is None:
        status.group = proctree.live_group_members(table, attempt.pgid)
        if status.group:
            status.unsignallable = "legacy record without a start time: a live group is never signalled"
        return status
    if leader is not None and leader.alive and leader.start_time != attempt.pid_start_time:
        # The pid was reused, so its group (if any) is another program's.
        status.unsignallable = f"pid {attempt.pid} now belongs to another process (start time differs)"
    else:
        # Members of our group all started after the leader did.
        status.group = [
            p for p in proctree.live_group_members(table, attempt.pgid) if p.start_time >= attempt.pid_start_time
        ]
    for d in attempt.descendants:
        stat = table.get(d.pid)
        if stat is not None and stat.alive and stat.start_time == d.start_time and stat.pgid != attempt.pgid:
            status.escaped.append(stat)
    return status


def signal_group(attempt: Attempt, status: TreeStatus, sig: signal.Signals) -> None:
    """Signal the attempt's own group: killpg while the leader is ours, else member by member."""
    if status.unsignallable or not status.group or attempt.pgid is None:
        return
    leader_alive = any(p.pid == attempt.pid for p in status.group)
    try:
        if leader_alive and proctree.identity_matches(attempt.pid or -1, attempt.pid_start_time or -1):
            os.killpg(attempt.pgid, sig)
            return
    except ProcessLookupError:
        return
    for member in status.group:
        if proctree.identity_matches(member.pid, member.start_time):
            try:
                os.kill(member.pid, sig)
            except ProcessLookupError:
                pass


async def _wait_gone(
    attempt: Attempt, timeout_s: float, table_reader: Callable[[], dict[int, proctree.ProcStat]]
) -> TreeStatus:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        status = tree_status(attempt, await asyncio.to_thread(table_reader))
        if status.gone or loop.time() >= deadline:
            return status
        await asyncio.sleep(POLL_S)


async def stop_tree(
    attempt: Attempt,
    grace_s: float,
    confirm_s: float,
    table_reader: Callable[[], dict[int, proctree.ProcStat]] = proctree.process_table,
) -> TreeStatus:
    """SIGTERM the group, SIGKILL after the grace, then look for proof that all is gone.

    Returns the final status: ``gone`` is the proof. Records descendants first
    (on ``attempt``) so a child that left the group is still checked.
    """
    table = await asyncio.to_thread(table_reader)
    record_descendants(attempt, table)
    status = tree_status(attempt, table)
    if status.gone:
        return status
    await asyncio.to_thread(signal_group, attempt, status, signal.SIGTERM)
    status = await _wait_gone(attempt, grace_s, table_reader)
    if status.group and not status.unsignallable:
        await asyncio.to_thread(signal_group, attempt, status, signal.SIGKILL)
    if status.gone:
        return status
    return await _wait_gone(attempt, confirm_s, table_reader)
