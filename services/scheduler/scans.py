"""One process-table read shared by everyone who needs a fresh one at the same time.

Reading ``/proc`` costs a few milliseconds on a busy host. When many workers exit
together, each exit needs a table read *after* it happened (to prove nothing of
the attempt remains); the supervisor tick needs one too. A caller here gets a
table whose read began after its call, and all callers waiting meanwhile share
that one read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from libs import proctree

Table = dict[int, proctree.ProcStat]


class SharedScan:
    def __init__(self, reader: Callable[[], Table], min_interval_s: float = 0.0) -> None:
        self._reader = reader
        # Reads begin at least this far apart: under a stream of exits, each read then serves
        # every exit of the interval instead of nearly one read per exit. An exit waits at
        # most this long more for its proof.
        self.min_interval_s = min_interval_s
        self._last_start = float("-inf")
        self._next: asyncio.Future[Table] | None = None  # the read not begun yet
        self._runner: asyncio.Task[None] | None = None
        self.reads = 0  # how many reads were made (for tests and benchmarks)

    async def fresh(self) -> Table:
        """A process table read after this call began (shared with concurrent callers)."""
        if self._next is None:
            self._next = asyncio.get_running_loop().create_future()
        waiting = self._next
        if self._runner is None or self._runner.done():
            self._runner = asyncio.create_task(self._run(), name="process-table-scan")
        return await asyncio.shield(waiting)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while self._next is not None:
            wait = self._last_start + self.min_interval_s - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)  # callers arriving meanwhile share this read
            # Callers arriving from here on wait for the next read: this one may be too early for them.
            future, self._next = self._next, None
            self._last_start = loop.time()
            try:
                table = await asyncio.to_thread(self._reader)
            except Exception as exc:  # every waiter sees the failure
                if not future.done():
                    future.set_exception(exc)
                continue
            self.reads += 1
            if not future.done():
                future.set_result(table)
