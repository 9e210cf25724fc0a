"""The event-log follower mode: the durable task event history, read from a cursor.

Served from the ``task_events`` table (sequence = its id), so a follower that was
away (the notifier) resumes from its stored cursor; the hub only wakes the reader.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from services.scheduler import domain
from services.scheduler.events import TaskEvent
from services.scheduler.runtime import Runtime

# How long a log follower looks again for an id skipped in the event log.
LOG_GAP_WAIT_MS = 10_000
# How long a busy follower lets events gather before it reads them. Each read costs a
# transaction, a thread hop and a response whatever it finds: at 5 ms a busy scheduler
# (≈200 tasks/s) read 6.5 events per read, at 20 ms 22 — a quarter of the reads, for
# at most 20 ms more before the notifier sees an event (its reader is a human).
BUSY_COALESCE_S = 0.02


class LogFollower:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    async def follow_batches(self, since: int, types: set[str], batch: int = 500) -> AsyncIterator[list[TaskEvent]]:
        """Every stored task event after ``since``, oldest first, then new ones as they commit,
        one read of the log at a time: the wanted events each read found (never empty), so a
        caller can send them on together.

        Ids skipped on the way (a PostgreSQL transaction that took its id earlier but
        commits later) are looked for again for ``LOG_GAP_WAIT_MS``.
        """
        if since < 0:
            raise domain.InvalidArgument("INVALID_CURSOR", "since_sequence must be 0 or more")
        rt = self.rt
        cursor = since
        gaps: dict[int, int] = {}  # skipped id -> when first skipped
        while True:
            with rt.hub.subscribe(lambda _t: True) as sub:
                while not sub.overflowed:
                    now = rt.clock.now_ms()
                    gaps = {i: at for i, at in gaps.items() if now - at < LOG_GAP_WAIT_MS}
                    ids, events = await rt.store.events_after(cursor, types, batch, gaps)
                    fresh = [i for i in ids if i > cursor]
                    if fresh and cursor > 0:
                        expected = set(range(cursor + 1, fresh[-1] + 1))
                        for missing in expected - set(fresh):
                            gaps.setdefault(missing, now)
                    for i in ids:
                        gaps.pop(i, None)
                    if events:
                        yield [TaskEvent(stored.id, stored.type, stored.at, stored.task) for stored in events]
                    if fresh:
                        cursor = fresh[-1]
                    if len(ids) >= batch:
                        continue
                    try:
                        async with asyncio.timeout(0.5 if gaps else 5.0):
                            await sub.queue.get()
                    except TimeoutError:
                        pass
                    else:
                        if fresh:
                            # Busy (this read found events): let the next few commit first, so
                            # one read serves a burst instead of one read per event. A lone
                            # event after a quiet spell is read at once.
                            await asyncio.sleep(BUSY_COALESCE_S)
                    while not sub.queue.empty():
                        sub.queue.get_nowait()
