"""Group commit: the store's units of work from many tasks, committed together.

Each unit commits whole or not at all inside one shared transaction: a unit that
fails (an unknown task, a refused transition) rolls back alone and its caller gets
the error; the others commit. Callers are answered only after the commit, so an
event is published after its change is durable, as before. Nothing waits on a
timer: while one batch is on the database thread the next one gathers, so a lone
change commits at once and a burst shares one transaction. The database thread drains
the queue itself, batch after batch (``GroupCommit._drain``): the event loop only queues
units and takes outcomes, and is not a step between two commits.

On SQLite (``Database.embedded``) a batch commits on the event loop itself when the
database's thread is idle (``GroupCommit._drain_here``): its statements never wait for a
server, and with that thread idle nothing else in the process holds the database, so
nothing waits for SQLite's lock either. What that saves is the hand-over to the thread
and back — two wake-ups and the GIL passed twice, whose wait is up to the interpreter's
switch interval while the other thread runs Python (in ten alternating pairs of the
throughput benchmark: ≈ 7 % of the scheduler's CPU per ``/bin/true`` task, and created→ended
p50 56–88 against 84–100 ms; docs/performance.md).
Work already on the thread (a read, a retention pass) sends the batch after it, there.
A burst's next batch waits for the loop's other callbacks first. Another process writing
the same file would make the loop wait for SQLite's lock (up to its busy timeout): none of
taskgate's does while the scheduler runs (``taskgate admin databases compact`` refuses).

Savepoints are not free: on PostgreSQL each costs a round trip (two per unit, about a third
of a busy batch's time there), and on SQLite writes inside one keep a sub-journal for its
rollback (the savepoints and that cost ≈ 0.25 ms of CPU per task, ≈ 12 % of the store's path,
``bench/bench_store.py``). So a batch first runs optimistically, without them: when a unit
fails, the whole transaction is rolled back and the batch runs again, each unit in its own
savepoint. A unit may therefore run more than once; units are functions of what they read,
with no effect outside their transaction (what they return is taken from the run that
committed). Units seldom fail (an unknown task, a refused transition: races).

A unit that starts by locking one task's row can say which (``LockingUnit``): before an
optimistic batch of several runs, ``before_units`` may lock all their rows at once (the store
does on PostgreSQL, where each lock is a round trip of its own; ``SchedulerStore._lock_batch``).
Should that fail, the batch runs again isolated, without it.

Units get a ``Tx`` — the transaction's Core connection — not an ORM session: the
store's statements are all Core, and a session (its begin, connection lookup and
commit) cost more per transaction than a hot unit's statements. Savepoints are
plain SQL on the driver's connection for the same reason (SQLAlchemy's nested
transactions cost ~90 µs a unit).
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from sqlalchemy import Connection

from libs.db import Database
from libs.direct import OnConnection
from libs.metrics import Children
from services.scheduler.metrics import (
    BATCH_RERUNS,
    BATCH_SECONDS,
    BATCHES,
    STORE_UNIT_CPU,
    STORE_UNITS,
)

T = TypeVar("T")


class Tx(OnConnection):
    """One transaction as a unit of work sees it: its connection, the driver's (looked up once:
    SQLAlchemy's pool proxies cost a few µs a statement), and what its units leave for
    ``before_commit``."""

    __slots__ = ("info",)

    def __init__(self, conn: Connection) -> None:
        super().__init__(conn)
        self.info: dict[str, Any] = {}

    def connection(self) -> Connection:
        return self.conn


Unit = Callable[[Tx], Any]


class LockingUnit(Generic[T]):
    """A unit whose first statement locks the row of task ``task_id``: a batch's ``before_units``
    may lock the rows of all its units in one statement before they run."""

    __slots__ = ("func", "task_id")

    def __init__(self, func: Callable[[Tx], T], task_id: str) -> None:
        self.func = func
        self.task_id = task_id

    def __call__(self, tx: Tx) -> T:
        return self.func(tx)


_unit_counts = Children(STORE_UNITS)
_unit_cpu = Children(STORE_UNIT_CPU)
_unit_names: dict[str, str] = {}


def unit_name(unit: Unit) -> str:
    """The store call a unit comes from: ``SchedulerStore.update_task.<locals>.work`` -> ``update_task``."""
    target = unit.func if isinstance(unit, (functools.partial, LockingUnit)) else unit
    qualname = getattr(target, "__qualname__", type(target).__name__)
    name = _unit_names.get(qualname)
    if name is None:
        words = [w for w in qualname.split(".") if not w.startswith("<")]  # no <locals>, <lambda>
        if len(words) > 1 and words[-1] == "work":  # the store's own name for its units
            words.pop()
        name = _unit_names[qualname] = words[-1] if words else qualname
    return name


def _run_unit(unit: Unit, tx: Tx) -> Any:
    """``unit(tx)``, with the database thread's CPU inside it counted by its name."""
    began = time.thread_time()
    try:
        return unit(tx)
    finally:
        name = unit_name(unit)
        _unit_counts(name).inc()
        _unit_cpu(name).inc(time.thread_time() - began)


# A unit's outcome as ``run_all`` returns it: (True, its result) or (False, its error).
Outcome = tuple[bool, Any]


class _Answer(Protocol):
    """Where a unit's outcome goes: its caller's future (``run``), or its slot (``run_all``)."""

    def done(self) -> bool: ...
    def get_loop(self) -> asyncio.AbstractEventLoop: ...
    def set_result(self, value: Any) -> None: ...
    def set_exception(self, error: BaseException) -> None: ...


class _Outcomes:
    """The outcomes of one ``run_all``: its future is resolved when the last one is in."""

    __slots__ = ("future", "values", "missing")

    def __init__(self, loop: asyncio.AbstractEventLoop, count: int) -> None:
        self.future: asyncio.Future[list[Outcome]] = loop.create_future()
        self.values: list[Outcome] = [(False, None)] * count
        self.missing = count

    def put(self, index: int, outcome: Outcome) -> None:
        self.values[index] = outcome
        self.missing -= 1
        if self.missing == 0 and not self.future.done():
            self.future.set_result(self.values)


class _Slot:
    """One unit's place in a ``run_all``'s outcomes (answered on the callers' loop, as a future)."""

    __slots__ = ("outcomes", "index")

    def __init__(self, outcomes: _Outcomes, index: int) -> None:
        self.outcomes = outcomes
        self.index = index

    def done(self) -> bool:
        return self.outcomes.future.done()  # its caller stopped waiting

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self.outcomes.future.get_loop()

    def set_result(self, value: Any) -> None:
        self.outcomes.put(self.index, (True, value))

    def set_exception(self, error: BaseException) -> None:
        self.outcomes.put(self.index, (False, error))


MAX_UNITS = 128  # one transaction stays short even under a burst
_SECONDS_ON_LOOP = BATCH_SECONDS.labels(on="loop")
_SECONDS_ON_THREAD = BATCH_SECONDS.labels(on="thread")


class GroupCommit:
    def __init__(
        self,
        db: Database,
        max_units: int = MAX_UNITS,
        before_commit: Callable[[Tx], None] | None = None,
        optimistic: bool = True,
        on_loop: bool | None = None,
        before_units: Callable[[Tx, list[Unit]], None] | None = None,
    ) -> None:
        self.db = db
        # Batches may commit on the event loop while the database's thread is idle (see the
        # module's doc); None: when the database is embedded (SQLite).
        self.on_loop = db.embedded if on_loop is None else on_loop
        self._loop: asyncio.AbstractEventLoop | None = None  # the callers' (``on_loop``: where drains go back)
        # Batches run without savepoints first (see the module's doc); False: always isolated.
        self.optimistic = optimistic
        # Runs last in every batch's transaction (the store sends its NOTIFYs there).
        self.before_commit = before_commit
        # Runs first in a transaction of several units, with them (the store locks their rows).
        self.before_units = before_units
        self.max_units = max_units
        # Units waiting for a transaction, shared with the database thread that drains them.
        self._queue: list[tuple[Unit, _Answer]] = []
        self._lock = threading.Lock()
        self._draining = False  # a drain is queued or running on a database thread
        self.transactions = 0  # committed batches (for tests and benchmarks)
        self.reruns = 0  # optimistic batches run again with each unit isolated (a unit failed)

    async def run(self, unit: Callable[[Tx], T]) -> T:
        """Run ``unit`` in the next group transaction; its result once that committed."""
        loop = self._loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._enqueue(loop, [(unit, future)])
        # A caller that stops waiting cancels only its future: the unit is queued and runs
        # all the same (its outcome is not handed to a cancelled future), as with a shield.
        return await future

    async def run_all(self, units: list[Callable[[Tx], Any]]) -> list[Outcome]:
        """Run ``units`` as ``run`` would, each on its own (one failing fails only itself), and
        return every outcome — (True, result) or (False, error) — in order once all committed.

        The caller wakes once, when the last outcome is in: awaiting each unit's ``run`` in a
        task of its own costs a turn of the loop to start the tasks and two more to gather them,
        and under load each turn waits behind everything else the loop has due. On SQLite with
        nothing queued and the database's thread idle, the units commit here and now, without
        a turn at all (``_commit_here_now``); else they join the next batch.
        """
        if not units:
            return []
        loop = self._loop = asyncio.get_running_loop()
        outcomes = _Outcomes(loop, len(units))
        entries: list[tuple[Unit, _Answer]] = [(unit, _Slot(outcomes, i)) for i, unit in enumerate(units)]
        if self._commit_here_now(entries):
            return outcomes.future.result()
        self._enqueue(loop, entries)
        return await outcomes.future

    def _commit_here_now(self, entries: list[tuple[Unit, _Answer]]) -> bool:
        """(On the loop.) Commit ``entries`` right here when nothing is queued or committing and
        the database's thread is idle (SQLite): a caller that brings a batch of its own gains
        nothing from waiting a turn for others to join it, and under load a turn is milliseconds.
        False (nothing done) otherwise."""
        if not self.on_loop or len(entries) > self.max_units:
            return False
        with self._lock:
            if self._draining or not self.db.threads.idle():
                return False
            self._draining = True
        self._commit_here(entries)
        return True

    def _enqueue(self, loop: asyncio.AbstractEventLoop, entries: list[tuple[Unit, _Answer]]) -> None:
        with self._lock:
            self._queue.extend(entries)
            start, self._draining = not self._draining, True
        if start:
            # After the callbacks already due: the units a burst queues in this turn of the
            # loop go in the first transaction together.
            loop.call_soon(self._drain_here if self.on_loop else self._start_drain)

    async def alone(self, unit: Callable[[Tx], T]) -> T:
        """Run ``unit`` in a transaction of its own (it must see only what has committed)."""
        return await self.db.run_connection(lambda conn: _run_alone(conn, unit, self.before_commit))

    def _drain_here(self) -> None:
        """(On the event loop.) Commit the next batch here, unless the database's thread has
        work: then the drain goes there, after it. Another batch waiting comes back to the
        loop after the callbacks due meanwhile (a burst does not hold the loop batch after batch)."""
        if not self.db.threads.idle():
            self._start_drain()
            return
        batch = self._take_batch()
        if not batch:  # nothing queued after all: no empty transaction
            return
        self._commit_here(batch)

    def _commit_here(self, batch: list[tuple[Unit, _Answer]]) -> None:
        """(On the loop, this drain's.) Commit ``batch`` here; units queued meanwhile come back
        to the loop after the callbacks due (a burst does not hold the loop batch after batch)."""
        try:
            self._commit(batch, here=True)
        except BaseException as exc:
            self._fail_queued(exc)
            raise
        if not self._drain_ends_if_nothing_queued():
            asyncio.get_running_loop().call_soon(self._drain_here)

    def _drain_ends_if_nothing_queued(self) -> bool:
        """True, and the drain over (the next unit queued starts one), when nothing is queued."""
        with self._lock:
            if self._queue:
                return False
            self._draining = False
            return True

    def _take_batch(self) -> list[tuple[Unit, _Answer]]:
        """The next batch off the queue; none left (empty) ends the drain."""
        with self._lock:
            batch, self._queue = self._queue[: self.max_units], self._queue[self.max_units :]
            if not batch:
                self._draining = False
            return batch

    def _start_drain(self) -> None:
        try:
            self.db.threads.submit(self._drain)
        except BaseException as exc:  # the database is closed: nothing queued will run
            self._fail_queued(exc)

    def _drain(self) -> Callable[[], None] | None:
        """(On a database thread.) Commit batch after batch while units are queued.

        The next batch starts as soon as the last one committed, on this thread: the event
        loop does not have to take the outcomes and hand the next batch over first, so a busy
        loop no longer stretches the time between two commits (under load that round trip was
        about a third of the database's cycle). Other work queued for the database threads
        (reads, lone transactions) goes first between batches. With ``on_loop``, the drain
        goes back to the loop after the batch it came for (the thread had work then; it may
        be idle now) — once this work no longer counts as the thread's (what it returns).
        """
        try:
            while batch := self._take_batch():
                self._commit(batch)
                if self.on_loop and self._loop is not None:
                    return None if self._drain_ends_if_nothing_queued() else self._back_to_loop
                if self.db.threads.others_waiting():
                    self.db.threads.submit(self._drain)  # its turn again after theirs (it stops if none is left)
                    return None
            return None
        except BaseException as exc:
            self._fail_queued(exc)
            raise

    def _back_to_loop(self) -> None:
        """(On the database thread, its drain done.) The next batch is the loop's to commit."""
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(self._drain_here)
        except RuntimeError:  # the loop closed: nobody waits there, but what is queued still commits
            self._start_drain()

    def _commit(self, batch: list[tuple[Unit, _Answer]], here: bool = False) -> None:
        """(On a database thread, or ``here`` on the callers' loop.) One batch in one transaction;
        each outcome handed to its caller."""
        hand_over = _settle if here else _hand_over
        began = time.perf_counter()
        try:
            outcomes = self._transact(batch)
        except _Failed as failed:  # a lone unit's own error, rolled back
            hand_over([(batch[0][1], False, failed.error)])
            return
        except BaseException as exc:  # the commit itself failed: no unit of the batch happened
            error = exc if isinstance(exc, Exception) else RuntimeError(repr(exc))
            hand_over([(future, False, error) for _, future in batch])
            if not isinstance(exc, Exception):
                raise
            return
        finally:
            (_SECONDS_ON_LOOP if here else _SECONDS_ON_THREAD).observe(time.perf_counter() - began)
        self.transactions += 1
        BATCHES.inc()
        hand_over([(future, ok, value) for (_, future), (ok, value) in zip(batch, outcomes, strict=True)])

    def _transact(self, batch: list[tuple[Unit, _Answer]]) -> list[tuple[bool, Any]]:
        """The batch's transaction: optimistic first, then (a unit failed) each unit isolated."""
        units = [unit for unit, _ in batch]
        run = functools.partial(
            _run_units, units=units, before_commit=self.before_commit, before_units=self.before_units
        )
        try:
            return self.db.transaction(functools.partial(run, isolate=not self.optimistic))
        except _Isolate:  # a unit failed in the optimistic run: nothing of it committed
            self.reruns += 1
            BATCH_RERUNS.inc()
            return self.db.transaction(functools.partial(run, isolate=True))

    def _fail_queued(self, exc: BaseException) -> None:
        """Nothing will drain the queue (the database closed, or the drain itself broke): every
        waiting caller gets the error rather than waiting for ever."""
        with self._lock:
            queued, self._queue = self._queue, []
            self._draining = False
        error = exc if isinstance(exc, Exception) else RuntimeError(repr(exc))
        _hand_over([(future, False, error) for _, future in queued])


def _hand_over(outcomes: list[tuple[_Answer, bool, Any]]) -> None:
    """Settle callers' futures from a database thread: one wake-up of each loop per batch."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Answer, bool, Any]]] = {}
    for outcome in outcomes:
        by_loop.setdefault(outcome[0].get_loop(), []).append(outcome)
    for loop, theirs in by_loop.items():
        try:
            loop.call_soon_threadsafe(_settle, theirs)
        except RuntimeError:  # that loop closed meanwhile: nobody is waiting there
            pass


def _settle(outcomes: list[tuple[_Answer, bool, Any]]) -> None:
    for future, ok, value in outcomes:
        if future.done():  # its caller stopped waiting
            continue
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)


def _run_alone(conn: Connection, unit: Callable[[Tx], T], before_commit: Callable[[Tx], None] | None) -> T:
    tx = Tx(conn)
    result = _run_unit(unit, tx)
    if before_commit is not None:
        before_commit(tx)
    return result


def _run_units(
    conn: Connection,
    *,
    units: list[Unit],
    before_commit: Callable[[Tx], None] | None = None,
    isolate: bool = True,
    before_units: Callable[[Tx, list[Unit]], None] | None = None,
) -> list[tuple[bool, Any]]:
    tx = Tx(conn)
    if before_units is not None and len(units) > 1 and not isolate:
        # Only in the optimistic run: should it fail (a deadlock, say), the batch runs again
        # isolated, without it, and the error is the one unit's whose lock it was.
        try:
            before_units(tx, units)
        except Exception as exc:
            raise _Isolate() from exc
    if len(units) == 1:  # nothing to isolate from: no savepoint
        try:
            outcomes = [(True, _run_unit(units[0], tx))]
        except Exception as exc:
            # The caller sees the error; the transaction still rolls back (nothing else is in it).
            raise _Failed(exc) from exc
    elif not isolate:
        outcomes = []
        for unit in units:
            try:
                outcomes.append((True, _run_unit(unit, tx)))
            except Exception as exc:
                raise _Isolate() from exc  # the transaction rolls back; the batch runs again, isolated
    else:
        driver = tx.driver
        outcomes = []
        for unit in units:
            driver.execute("SAVEPOINT unit")
            notified = set(tx.info.get("notify", ()))
            try:
                value = _run_unit(unit, tx)
            except Exception as exc:
                driver.execute("ROLLBACK TO SAVEPOINT unit")
                driver.execute("RELEASE SAVEPOINT unit")
                tx.info["notify"] = notified  # the rolled-back unit's NOTIFYs are not sent
                outcomes.append((False, exc))
            else:
                driver.execute("RELEASE SAVEPOINT unit")
                outcomes.append((True, value))
    if before_commit is not None:
        before_commit(tx)
    return outcomes


class _Failed(Exception):
    """A lone unit's own error (the transaction rolled back), unwrapped for its caller."""

    def __init__(self, error: Exception) -> None:
        super().__init__(repr(error))
        self.error = error


class _Isolate(Exception):
    """A unit of an optimistic batch failed: run the batch again with each unit in a savepoint."""
