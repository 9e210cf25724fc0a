"""One process-table read shared by everyone who needs a fresh one at the same time.

Reading ``/proc`` costs a few milliseconds on a busy host. When many workers exit
together, each exit needs a table read *after* it happened (to prove nothing of
the attempt remains); the supervisor tick needs one too. A caller here gets a
table whose read began after its call, and all callers waiting meanwhile share
that one read.

An exit's proof (``look``) runs in the read's own hop to a thread, right after
the read (``then``): one hop per read for all the exits it serves, not one more
per exit. Most exits need no read at all: the kernel proves them alone
(``processes.kernel_proof``, called by the stopper on the event loop: a few
non-blocking system calls cost less than a hop to a thread).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from libs import proctree

Table = dict[int, proctree.ProcStat]
T = TypeVar("T")
Look = tuple[Callable[[Table], Any], asyncio.Future[Any]]
Outcome = tuple[bool, Any]


@dataclass
class _Round:
    """The callers of one read: who wants the table, and who wants a look at it."""

    table: asyncio.Future[Table]
    looks: list[Look] = field(default_factory=list)


def _outcome(call: Callable[[], Any]) -> Outcome:
    try:
        return True, call()
    except Exception as exc:  # that caller's alone
        return False, exc


def _read_and_look(
    reader: Callable[[], Table], looks: list[Look]
) -> tuple[float, Table | BaseException, list[Outcome]]:
    """(Blocking.) The read, then each look at it; a failed look is its caller's alone, a failed
    read is returned for its waiters. Also returns when the read began (the loop's clock), here
    rather than before the hop."""
    began = time.monotonic()
    try:
        table = reader()
    except Exception as exc:
        return began, exc, []
    return began, table, [_outcome(functools.partial(look, table)) for look, _ in looks]


def _settle(future: asyncio.Future[Any], ok: bool, value: Any) -> None:
    if future.done():  # its caller was cancelled
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)
        future.exception()  # a waiter that left meanwhile: not "never retrieved"


class SharedScan:
    def __init__(self, reader: Callable[[], Table], min_interval_s: float = 0.0) -> None:
        self._reader = reader
        # Reads begin at least this far apart: under a stream of exits, each read then serves
        # every exit of the interval instead of nearly one read per exit. An exit waits at
        # most this long more for its proof.
        self.min_interval_s = min_interval_s
        self._last_start = float("-inf")
        self._next: _Round | None = None  # the hop not begun yet
        self._runner: asyncio.Task[None] | None = None
        self.reads = 0  # how many reads were made (for tests and benchmarks)
        self.hops = 0  # how many hops to a thread they took (one per read, looks included)

    def _round(self) -> _Round:
        if self._next is None:
            self._next = _Round(asyncio.get_running_loop().create_future())
        if self._runner is None or self._runner.done():
            self._runner = asyncio.create_task(self._run(), name="process-table-scan")
        return self._next

    async def fresh(self) -> Table:
        """A process table read after this call began (shared with concurrent callers)."""
        return await asyncio.shield(self._round().table)

    async def then(self, look: Callable[[Table], T]) -> T:
        """``look(table)`` (blocking) in the read's own thread, on a table read after this call began."""
        result: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._round().looks.append((look, result))
        return await result

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while self._next is not None:
            wait = self._last_start + self.min_interval_s - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)  # callers arriving meanwhile share this read
            # Callers arriving from here on wait for the next read: this one may be too early for them.
            current, self._next = self._next, None
            self._last_start = loop.time()
            self.hops += 1
            began, table, outcomes = await asyncio.to_thread(_read_and_look, self._reader, current.looks)
            if isinstance(table, BaseException):  # every waiter of the read sees the failure
                for future in (current.table, *(f for _, f in current.looks)):
                    _settle(future, False, table)
                continue
            # The interval counts from the read's own start: a slow hop to the thread (a new
            # thread, a busy host) must not bring the next read closer than the interval.
            self._last_start = began
            self.reads += 1
            _settle(current.table, True, table)
            for (_, future), (ok, value) in zip(current.looks, outcomes, strict=True):
                _settle(future, ok, value)
