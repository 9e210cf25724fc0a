"""Several scheduler hosts: the lease and HOST_LOST rules (pure), and the store's claims,
sweeps and cross-host stop requests on real SQLite and PostgreSQL (issue 11 item 3)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from libs.db import Database
from libs.ids import time_ordered_id
from services.scheduler import domain
from services.scheduler.domain import Attempt, Cancellation, FailureCode, State, Task
from services.scheduler.hosts import default_host_id
from services.scheduler.store import MIGRATIONS, NotOwner, SchedulerStore, SecondReplica
from tests.support.postgres import fresh_database

NOW = 1_800_000_000_000


def new_task(i: int = 0, state: State = State.QUEUED, owner: str | None = None) -> Task:
    return Task(
        task_id=time_ordered_id(NOW + i),
        agent_id="agent-1",
        session_id="cli-hosts",
        title=f"t{i}",
        instructions="",
        profile="default-worker",
        state=state,
        created_at=NOW + i,
        updated_at=NOW + i,
        owner_host=owner,
    )


def attempt_of(task: Task, host: str, state: str = "launching") -> Attempt:
    return Attempt(
        attempt_id=uuid.uuid4().hex,
        task_id=task.task_id,
        number=1,
        boot_id="b",
        token_hash=uuid.uuid4().hex,
        state=state,
        host_id=host,
    )


# --- rules ---------------------------------------------------------------------


def test_a_lost_hosts_running_task_waits_for_reconciliation_with_its_resume_kept() -> None:
    task = new_task(state=State.RUNNING, owner="h1")
    assert domain.mark_host_lost(task, "h1", NOW)
    assert task.state == State.NEEDS_RECONCILIATION and task.failure is not None
    assert task.failure.code == FailureCode.HOST_LOST and task.failure.retryable
    assert task.pending_outcome is not None and task.pending_outcome.state == State.QUEUED


def test_a_cancel_in_flight_on_a_lost_host_still_cancels_and_other_hosts_tasks_are_left() -> None:
    task = new_task(state=State.CANCEL_REQUESTED, owner="h1")
    task.cancellation = Cancellation(requested_at=NOW, cause="user_canceled")
    assert not domain.mark_host_lost(task, "h2", NOW)
    assert domain.mark_host_lost(task, "h1", NOW)
    assert task.pending_outcome is not None and task.pending_outcome.state == State.CANCELLED
    assert task.cancellation is not None and task.cancellation.cleanup == "unconfirmed"
    done = new_task(state=State.COMPLETED, owner="h1")
    assert not domain.mark_host_lost(done, "h1", NOW)


def test_a_returning_host_settles_a_worker_that_exited_by_itself_by_its_exit() -> None:
    task = new_task(state=State.RUNNING, owner="h1")
    domain.mark_host_lost(task, "h1", NOW)
    ended = attempt_of(task, "h1", state="ended")
    ended.exit_code, ended.outcome = 0, "exited"
    assert domain.host_lost_outcome(task, ended).state == State.COMPLETED
    unknown = attempt_of(task, "h1", state="running")
    assert domain.host_lost_outcome(task, unknown).state == State.QUEUED  # kept: resumed once proven gone


def test_a_requeued_task_is_released_to_any_host() -> None:
    before, after = new_task(state=State.RUNNING, owner="h1"), new_task(state=State.QUEUED, owner="h1")
    domain.release_when_requeued(before, after)
    assert after.owner_host is None
    stays = new_task(state=State.PAUSED, owner="h1")
    domain.release_when_requeued(before, stays)
    assert stays.owner_host == "h1"


def test_the_default_host_id_is_stable_and_differs_by_data_dir(tmp_path: Path) -> None:
    a = default_host_id("box", tmp_path / "a")
    assert a == default_host_id("box", tmp_path / "a") and a.startswith("box-")
    assert a != default_host_id("box", tmp_path / "b")


# --- SQLite: one replica -----------------------------------------------------------


async def test_sqlite_refuses_a_second_live_replica(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 's.db'}", MIGRATIONS)
    db.migrate()
    try:
        await SchedulerStore(db, "h1").register_host("boot1", NOW, 10_000, only_one=True)
        with pytest.raises(SecondReplica, match="PostgreSQL"):
            await SchedulerStore(db, "h2").register_host("boot2", NOW + 5_000, 10_000, only_one=True)
        # Once the first one's lease ran out (it is gone), a new host id may take over.
        await SchedulerStore(db, "h2").register_host("boot2", NOW + 10_001, 10_000, only_one=True)
    finally:
        db.close()


# --- PostgreSQL: claims, sweeps, stop requests ------------------------------------------


@pytest.fixture
async def pg_db(postgres_url: str) -> Database:
    db = Database(fresh_database(postgres_url, "hosts"), MIGRATIONS)
    db.migrate()
    yield db  # type: ignore[misc]
    db.close()


@pytest.mark.postgres
async def test_replicas_claiming_at_once_take_disjoint_tasks(pg_db: Database) -> None:
    a, b = SchedulerStore(pg_db, "a"), SchedulerStore(pg_db, "b")
    for i in range(50):
        await a.create_task(new_task(i))
    got_a, got_b = await asyncio.gather(
        a.claim_queued(20, (), any_owner=False), b.claim_queued(20, (), any_owner=False)
    )
    assert len(got_a) == 20 and len(got_b) == 20 and not set(got_a) & set(got_b)
    rest = await b.claim_queued(50, (), any_owner=False)
    assert len(rest) == 10 + 20, "its own claims again, plus the unclaimed ten; never a's"
    assert not set(rest) & set(got_a)
    owners = {t.task_id: t.owner_host for t in await a.tasks_in_states([State.QUEUED])}
    assert {owners[t] for t in got_a} == {"a"}


@pytest.mark.postgres
async def test_a_launch_is_refused_once_the_task_is_no_longer_this_hosts(pg_db: Database) -> None:
    a, b = SchedulerStore(pg_db, "a"), SchedulerStore(pg_db, "b")
    task, _ = await a.create_task(new_task())
    assert await b.claim_queued(1, (), any_owner=False) == [task.task_id]
    with pytest.raises(NotOwner):
        await a.save_launching_attempt(attempt_of(task, "a"))
    await b.save_launching_attempt(attempt_of(task, "b"))


@pytest.mark.postgres
async def test_a_sweep_marks_a_lost_hosts_tasks_and_releases_what_it_never_launched(pg_db: Database) -> None:
    lost, survivor = SchedulerStore(pg_db, "lost"), SchedulerStore(pg_db, "survivor")
    await lost.register_host("boot", NOW - 60_000, 1_000, only_one=False)
    running, _ = await lost.create_task(new_task(0))
    claimed, _ = await lost.create_task(new_task(1))
    launching, _ = await lost.create_task(new_task(2))
    await lost.claim_queued(3, (), any_owner=False)
    await lost.save_launching_attempt(attempt_of(running, "lost"))
    await lost.update_task(
        running.task_id, lambda t: domain.start_running(t, NOW, NOW, None, None), "task.state_changed", NOW
    )
    await lost.save_launching_attempt(attempt_of(launching, "lost"))
    assert await survivor.lost_hosts(NOW) == ["lost"]
    assert set(await survivor.tasks_held_by("lost")) == {running.task_id, claimed.task_id, launching.task_id}
    for t in (running, claimed, launching):
        await survivor.sweep_lost(t.task_id, "lost", NOW, NOW)
    after = {t.task_id: t for t in await survivor.tasks_in_states(list(State))}
    for t in (running, launching):  # a worker may live there: never re-run elsewhere
        assert after[t.task_id].state == State.NEEDS_RECONCILIATION
        assert after[t.task_id].failure is not None and after[t.task_id].failure.code == FailureCode.HOST_LOST
        assert after[t.task_id].owner_host == "lost"
    assert after[claimed.task_id].state == State.QUEUED and after[claimed.task_id].owner_host is None
    assert await survivor.claim_queued(5, (), any_owner=False) == [claimed.task_id]


@pytest.mark.postgres
async def test_a_sweep_yields_to_a_lease_renewed_meanwhile(pg_db: Database) -> None:
    host, survivor = SchedulerStore(pg_db, "h"), SchedulerStore(pg_db, "s")
    await host.register_host("boot", NOW - 60_000, 1_000, only_one=False)
    task, _ = await host.create_task(new_task())
    await host.claim_queued(1, (), any_owner=False)
    await host.save_launching_attempt(attempt_of(task, "h"))
    await host.renew_lease(NOW + 10_000)  # back before the sweep ran
    _, stored = await survivor.sweep_lost(task.task_id, "h", NOW, NOW)
    assert stored is None and (await survivor.get_task(task.task_id)).state == State.QUEUED


@pytest.mark.postgres
async def test_a_stop_asked_on_another_host_is_recorded_for_the_owner(pg_db: Database) -> None:
    owner, other = SchedulerStore(pg_db, "owner"), SchedulerStore(pg_db, "other")
    idle, _ = await owner.create_task(new_task(0))
    busy, _ = await owner.create_task(new_task(1))
    await owner.claim_queued(2, (), any_owner=False)
    await owner.save_launching_attempt(attempt_of(busy, "owner"))
    cancel = Cancellation(requested_at=NOW, cause="user_canceled")
    done, stored = await other.request_stop_elsewhere(idle.task_id, cancel, False, NOW)
    assert done.state == State.CANCELLED and stored is not None, "nothing ran: cancelled at once"
    asked, stored = await other.request_stop_elsewhere(busy.task_id, cancel, False, NOW)
    assert asked.state == State.CANCEL_REQUESTED and stored is not None, "its owner stops it"
    assert domain.requested_stop(asked) == "cancel"
    again, stored = await other.request_stop_elsewhere(busy.task_id, cancel, False, NOW)
    assert stored is None and again.state == State.CANCEL_REQUESTED
    assert [t.task_id for t in await owner.tasks_in_states([State.CANCEL_REQUESTED], owner="owner")] == [busy.task_id]


@pytest.mark.postgres
async def test_a_second_live_process_with_the_same_host_id_is_refused(pg_db: Database) -> None:
    from types import SimpleNamespace

    from services.scheduler.hosts import HostIdInUse, Listener

    first = Listener(SimpleNamespace(host_id="same"), pg_db.url)  # type: ignore[arg-type]
    second = Listener(SimpleNamespace(host_id="same"), pg_db.url)  # type: ignore[arg-type]
    other = Listener(SimpleNamespace(host_id="other"), pg_db.url)  # type: ignore[arg-type]
    await first.connect()
    try:
        with pytest.raises(HostIdInUse):
            await second.connect()
        await other.connect()
        await first.close()  # the process is gone (its connection closed): the id is free again
        # The server ends the closed connection's backend (and its lock) a moment later.
        deadline = asyncio.get_running_loop().time() + 30
        while True:
            try:
                await second.connect()
                break
            except HostIdInUse:
                assert asyncio.get_running_loop().time() < deadline, "the lock outlived its connection"
                await asyncio.sleep(0.05)
    finally:
        for listener in (first, second, other):
            await listener.close()
