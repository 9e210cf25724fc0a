"""The group commit on SQLite: a batch commits on the event loop itself while the database's
thread is idle, and goes to that thread when it has work (nothing on the loop ever waits for
SQLite's lock or for another thread's transaction)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import text

from libs.db import Database
from services.scheduler.group_commit import GroupCommit, Tx


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = Database(f"sqlite:///{tmp_path / 'group.db'}")
    with database.engine.begin() as conn:
        conn.execute(text("CREATE TABLE item (name TEXT PRIMARY KEY)"))
    yield database
    database.close()


def _insert(name: str, seen: list[str] | None = None):  # type: ignore[no-untyped-def]
    def unit(tx: Tx) -> str:
        if seen is not None:
            seen.append(threading.current_thread().name)
        tx.conn.execute(text("INSERT INTO item (name) VALUES (:n)"), {"n": name})
        return name

    return unit


def _names(db: Database) -> set[str]:
    with db.engine.connect() as conn:  # a connection of its own: sees only what committed
        return {row[0] for row in conn.execute(text("SELECT name FROM item"))}


def _batches_timed(on: str) -> float:
    return REGISTRY.get_sample_value("taskgate_group_commit_batch_seconds_count", {"on": on}) or 0.0


async def test_with_the_database_thread_idle_a_batch_commits_on_the_loop(db: Database) -> None:
    group = GroupCommit(db)
    assert group.on_loop, "SQLite is embedded: batches may commit on the loop"
    on_loop, on_thread = _batches_timed("loop"), _batches_timed("thread")
    seen: list[str] = []
    results = await asyncio.gather(*(group.run(_insert(f"n{i}", seen)) for i in range(5)))
    assert results == [f"n{i}" for i in range(5)]
    assert set(seen) == {threading.current_thread().name}, "every unit ran on the loop's own thread"
    assert group.transactions == 1, "the burst shared one transaction"
    assert _names(db) == {f"n{i}" for i in range(5)}, "committed before its callers were answered"
    assert (_batches_timed("loop"), _batches_timed("thread")) == (on_loop + 1, on_thread), "timed as the loop's"


async def test_a_failed_unit_on_the_loop_is_its_callers_alone(db: Database) -> None:
    group = GroupCommit(db)
    outcomes = await asyncio.gather(
        group.run(_insert("a")), group.run(_insert("a")), group.run(_insert("b")), return_exceptions=True
    )
    assert outcomes[0] == "a" and outcomes[2] == "b"
    assert isinstance(outcomes[1], Exception) and "UNIQUE" in str(outcomes[1])
    assert _names(db) == {"a", "b"} and group.reruns == 1


async def test_with_work_on_the_database_thread_the_batch_goes_there_after_it(db: Database) -> None:
    """A batch never waits on the loop for the thread's transaction (SQLite's lock): while a
    write on the thread holds the database, the loop keeps running, and the batch commits
    on the thread once that write is done."""
    group = GroupCommit(db)
    holding, release = threading.Event(), threading.Event()

    def long_write(tx: Tx) -> None:
        tx.conn.execute(text("INSERT INTO item (name) VALUES ('long')"))
        holding.set()
        assert release.wait(10)

    on_thread = _batches_timed("thread")
    busy = asyncio.ensure_future(db.run_connection(lambda conn: long_write(Tx(conn))))
    assert await asyncio.to_thread(holding.wait, 10)
    seen: list[str] = []
    queued = asyncio.ensure_future(group.run(_insert("after", seen)))
    for _ in range(20):  # the loop is free: the batch is not waiting on it for the lock
        await asyncio.sleep(0)
    assert not queued.done() and seen == []
    release.set()
    assert await queued == "after"
    await busy
    assert seen and seen[0] != threading.current_thread().name, "it ran on the database thread"
    assert _batches_timed("thread") == on_thread + 1, "timed as the thread's"
    seen.clear()
    assert await group.run(_insert("later", seen)) == "later"
    assert seen == [threading.current_thread().name], "with the thread idle again, back on the loop"
    assert _names(db) == {"long", "after", "later"}


async def test_a_burst_on_the_loop_lets_other_callbacks_run_between_its_batches(db: Database) -> None:
    group = GroupCommit(db, max_units=2)
    order: list[str] = []

    def unit(name: str):  # type: ignore[no-untyped-def]
        def work(tx: Tx) -> None:
            order.append(name)

        return work

    loop = asyncio.get_running_loop()
    runs = [asyncio.ensure_future(group.run(unit(f"u{i}"))) for i in range(6)]
    await asyncio.sleep(0)  # the first batch is due now
    loop.call_soon(order.append, "other")
    await asyncio.gather(*runs)
    assert group.transactions == 3
    assert order.index("other") < order.index("u5"), "a callback due meanwhile ran before the last batch"
    assert [o for o in order if o != "other"] == [f"u{i}" for i in range(6)]


async def test_a_closed_database_fails_the_units_instead_of_running_them_on_the_loop(db: Database) -> None:
    group = GroupCommit(db)
    assert await group.run(_insert("before")) == "before"
    db.threads.close()
    with pytest.raises(RuntimeError, match="closed"):
        await asyncio.wait_for(group.run(_insert("after")), 10)
    assert _names(db) == {"before"}


@pytest.mark.parametrize("on_loop", [True, False], ids=["on_loop", "on_thread"])
async def test_run_all_answers_each_unit_in_order_once_all_committed(db: Database, on_loop: bool) -> None:
    """Each unit succeeds or fails alone, as with ``run``; the caller gets every outcome in order,
    after the last batch committed (here three batches of at most two units)."""
    group = GroupCommit(db, on_loop=on_loop, max_units=2)
    outcomes = await group.run_all([_insert("a"), _insert("a"), _insert("b"), _insert("c"), _insert("d")])
    assert [ok for ok, _ in outcomes] == [True, False, True, True, True]
    assert [value for ok, value in outcomes if ok] == ["a", "b", "c", "d"]
    assert "UNIQUE" in str(outcomes[1][1])
    assert _names(db) == {"a", "b", "c", "d"}
    assert group.transactions == 3 and group.reruns == 1
    assert await group.run_all([]) == []


async def test_run_all_commits_at_once_or_wakes_its_caller_in_the_turn_after_the_commit(db: Database) -> None:
    """What ``run_all`` is for. With nothing queued and the database's thread idle its units
    commit before it returns, without a turn of the loop; behind a batch already due they join
    it, and the caller resumes in the turn after that commit — where a gather of ``run`` calls
    takes two more turns (each unit's future, then the gather's)."""
    group = GroupCommit(db)
    loop = asyncio.get_running_loop()
    turns = [0]

    def tick() -> None:
        turns[0] += 1
        loop.call_soon(tick)

    committed_at: list[int] = []

    def unit(tx: Tx) -> None:
        committed_at[:] = [turns[0]]

    tick()
    await asyncio.sleep(0)
    before = group.transactions
    await group.run_all([unit, unit, unit])
    assert turns[0] == committed_at[0], "committed here, no turn taken"
    assert group.transactions == before + 1

    # A unit queued first: the drain is due, and run_all's units go in its batch.
    first = asyncio.ensure_future(group.run(_insert("first")))
    await asyncio.sleep(0)  # first's unit is queued, its drain due
    await group.run_all([_insert("second"), unit])
    after_run_all = turns[0] - committed_at[0]
    assert await first == "first" and group.transactions == before + 2, "one batch for both"
    await asyncio.gather(*(group.run(unit) for _ in range(3)))
    after_gather = turns[0] - committed_at[0]
    assert after_run_all <= 1, (after_run_all, after_gather)
    assert after_gather > after_run_all, (after_run_all, after_gather)


async def test_a_run_all_whose_caller_stopped_waiting_still_commits(db: Database) -> None:
    group = GroupCommit(db)
    waiting = asyncio.ensure_future(group.run_all([_insert("a"), _insert("b")]))
    await asyncio.sleep(0)  # queued
    waiting.cancel()
    assert await group.run(_insert("c")) == "c"
    assert _names(db) == {"a", "b", "c"}
