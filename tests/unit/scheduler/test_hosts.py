"""Several scheduler hosts: the lease and HOST_LOST rules (pure), and the store's claims,
sweeps and cross-host stop requests on real SQLite and PostgreSQL (issue 11 item 3)."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import psycopg
import pytest
import sqlalchemy as sa

from libs import proctree
from libs.db import Database, libpq_url
from libs.grpc_client import ClientSecurity, aio_channel, error_info
from libs.grpc_server import ServerSecurity, start_server
from libs.ids import time_ordered_id
from libs.internal_auth import CallerAuth
from libs.settings import WorkerProfile
from services.scheduler import domain
from services.scheduler.domain import Attempt, Cancellation, FailureCode, PendingOutcome, State, Task
from services.scheduler.engine import Engine
from services.scheduler.events import EventHub
from services.scheduler.hosts import EventRelay, HostLease, default_host_id, scheduler_pg_settings
from services.scheduler.servicer import SchedulerServicer, WorkerServicer
from services.scheduler.store import MIGRATIONS, NotOwner, SchedulerStore, SecondReplica
from services.scheduler.worker_api import WorkerSockets, start_worker_server
from taskgate.scheduler.v1 import scheduler_pb2 as pb
from taskgate.scheduler.v1 import scheduler_pb2_grpc
from tests.support.postgres import fresh_database
from tests.support.procs import free_port
from tests.unit.scheduler.test_engine import FakeClock, Harness, make_settings

NOW = 1_800_000_000_000
# Real caller authentication on the in-process scheduler: the operator and one other identity.
SECRETS = {"operator": "operator-secret", "gateway": "gateway-secret"}
SERVER_SECURITY = ServerSecurity(auth=CallerAuth.from_secrets(SECRETS))


def caller(identity: str) -> ClientSecurity:
    return ClientSecurity(identity=identity, secret=SECRETS[identity])


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


def test_a_silent_host_takes_back_its_live_tasks_where_they_were_but_not_a_stop_in_flight() -> None:
    running = new_task(state=State.RUNNING, owner="h1")
    domain.mark_host_lost(running, "h1", NOW)
    assert domain.host_lost_here(running, "h1") and not domain.host_lost_here(running, "h2")
    assert not domain.take_back_live(running, "h2", NOW + 1), "only its own host takes it back"
    assert domain.take_back_live(running, "h1", NOW + 1)
    assert running.state == State.RUNNING and running.failure is None and running.pending_outcome is None
    domain.check_transition(State.NEEDS_RECONCILIATION, State.RUNNING)
    waiting = new_task(state=State.WAITING_INPUT, owner="h1")
    waiting.pending_question = domain.PendingQuestion(question_id="q1", text="which?", revision=1)
    domain.mark_host_lost(waiting, "h1", NOW)
    assert domain.take_back_live(waiting, "h1", NOW + 1) and waiting.state == State.WAITING_INPUT
    stopping = new_task(state=State.CANCEL_REQUESTED, owner="h1")
    stopping.cancellation = Cancellation(requested_at=NOW, cause="user_canceled")
    domain.mark_host_lost(stopping, "h1", NOW)
    assert not domain.take_back_live(stopping, "h1", NOW + 1), "the stopper settles it"
    unconfirmed = new_task(state=State.NEEDS_RECONCILIATION, owner="h1")
    unconfirmed.failure = domain.Failure(code=FailureCode.CLEANUP_UNCONFIRMED, message="pid 4242")
    assert not domain.take_back_live(unconfirmed, "h1", NOW + 1)


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


async def claims_skip_and_stop_at_the_limit(db: Database) -> None:
    mine, other = SchedulerStore(db, "a"), SchedulerStore(db, "b")
    tasks = [(await mine.create_task(new_task(i)))[0] for i in range(6)]
    ids = [t.task_id for t in tasks]
    # The two oldest are this host's launches under way (still queued): passed over, not claimed.
    assert await mine.claim_queued(2, ids[:2] + ["f" * 32], any_owner=False) == ids[2:4]
    assert await other.claim_queued(5, (), any_owner=False) == [ids[0], ids[1], ids[4], ids[5]], "a's are a's"
    # One host (SQLite): an earlier host id's claims are taken too, oldest first.
    assert await mine.claim_queued(3, [ids[0]], any_owner=True) == ids[1:4]
    owners = {t.task_id: t.owner_host for t in await mine.tasks_in_states([State.QUEUED])}
    assert [owners[i] for i in ids] == ["b", "a", "a", "a", "b", "b"]
    # Each change of owner is a new version of the task's document, and its column says the same.
    claimed = [await mine.get_task(i) for i in ids]
    assert [t.version - created.version for t, created in zip(claimed, tasks, strict=True)] == [1, 2, 1, 1, 1, 1]
    with db.engine.connect() as conn:
        columns = {
            row.task_id: row.owner_host for row in conn.execute(sa.text("SELECT task_id, owner_host FROM tasks"))
        }
    assert [columns[i] for i in ids] == ["b", "a", "a", "a", "b", "b"]


async def test_a_claim_passes_over_the_tasks_it_is_told_to_skip_and_stops_at_its_limit(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 's.db'}", MIGRATIONS)
    db.migrate()
    try:
        await claims_skip_and_stop_at_the_limit(db)
    finally:
        db.close()


# --- PostgreSQL: claims, sweeps, stop requests ------------------------------------------


@pytest.fixture
async def pg_db(postgres_url: str) -> AsyncIterator[Database]:
    db = Database(fresh_database(postgres_url, "hosts"), MIGRATIONS)
    db.migrate()
    yield db
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
async def test_the_event_relay_reads_only_ids_until_someone_here_listens_then_only_other_hosts_events(
    pg_db: Database,
) -> None:
    here, there = SchedulerStore(pg_db, "here"), SchedulerStore(pg_db, "there")
    rt = SimpleNamespace(store=here, hub=EventHub(), clock=FakeClock(), host_id="here")
    relay = EventRelay(rt, gap_wait_ms=10_000)  # type: ignore[arg-type]
    whole_reads: list[int] = []
    events_after = here.events_after

    async def counted(*args: Any, **kw: Any) -> Any:
        whole_reads.append(args[0])
        return await events_after(*args, **kw)

    here.events_after = counted  # type: ignore[method-assign]
    t1, t2, t3, t4 = (new_task(i) for i in range(1, 5))
    cursor = await here.last_event_id()
    await there.create_task(t1)
    await here.create_task(t2)
    cursor, gaps = await relay.relay_once(cursor, {})
    assert cursor == await here.last_event_id() and gaps == {}, "its place kept"
    assert whole_reads == [], "no one here to tell: ids alone"

    with rt.hub.subscribe(lambda _t: True) as sub:
        await there.create_task(t3)
        await here.create_task(t4)
        cursor, _ = await relay.relay_once(cursor, {})
        published = [sub.queue.get_nowait().task.task_id for _ in range(sub.queue.qsize())]
    assert published == [t3.task_id], "only the other host's: its own were published at commit"
    assert cursor == await here.last_event_id() and len(whole_reads) == 1
    ids, events = await events_after(0, (), 100, skip_origin="here")
    assert len(ids) == 4 and [e.task.task_id for e in events] == [t1.task_id, t3.task_id]


@pytest.mark.postgres
async def test_a_watcher_that_subscribes_during_an_ids_only_read_gets_the_events_it_read(pg_db: Database) -> None:
    """The relay saw no subscriber and read ids alone; one subscribed meanwhile, possibly after
    its snapshot was read and before those events: the relay reads them again, whole."""
    here, there = SchedulerStore(pg_db, "here"), SchedulerStore(pg_db, "there")
    rt = SimpleNamespace(store=here, hub=EventHub(), clock=FakeClock(), host_id="here")
    relay = EventRelay(rt, gap_wait_ms=10_000)  # type: ignore[arg-type]
    cursor = await here.last_event_id()
    elsewhere = await there.create_task(new_task(1))
    ids_after = here.event_ids_after
    with contextlib.ExitStack() as stack:

        async def subscribing(sequence: int, limit: int, recheck: Iterable[int] = ()) -> list[int]:
            ids = await ids_after(sequence, limit, recheck)
            if not rt.hub.subscriber_count:
                stack.enter_context(rt.hub.subscribe(lambda _t: True))
            return ids

        here.event_ids_after = subscribing  # type: ignore[method-assign]
        await relay.relay_once(cursor, {})
        (sub,) = rt.hub._subscriptions
        assert [sub.queue.get_nowait().task.task_id for _ in range(sub.queue.qsize())] == [elsewhere[0].task_id]


@pytest.mark.postgres
async def test_a_claim_on_postgresql_passes_over_the_tasks_it_is_told_to_skip(pg_db: Database) -> None:
    await claims_skip_and_stop_at_the_limit(pg_db)


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
        failure = after[t.task_id].failure
        assert failure is not None and failure.code == FailureCode.HOST_LOST
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


# --- the operator's way out: a lost host that never returns ---------------------------------


def test_resolving_a_gone_host_applies_the_kept_outcome_as_the_operators_word() -> None:
    running = new_task(state=State.RUNNING, owner="h1")
    domain.mark_host_lost(running, "h1", NOW)
    assert domain.resolve_host_gone(running, "h1", NOW + 1)
    assert running.state == State.QUEUED and running.restart_resume is not None and running.restart_resume.pending
    assert running.failure is not None and running.failure.code == FailureCode.HOST_LOST
    assert "operator confirmed" in running.failure.message
    cancelling = new_task(state=State.CANCEL_REQUESTED, owner="h1")
    cancelling.cancellation = Cancellation(requested_at=NOW, cause="user_canceled")
    domain.mark_host_lost(cancelling, "h1", NOW)
    assert domain.resolve_host_gone(cancelling, "h1", NOW + 1)
    assert cancelling.state == State.CANCELLED and cancelling.cancellation is not None
    assert cancelling.cancellation.cleanup == domain.HOST_GONE_CLEANUP, "not 'confirmed': nothing was proven"
    pausing = new_task(state=State.CANCEL_REQUESTED, owner="h1")
    pausing.cancellation = Cancellation(requested_at=NOW, cause=domain.PAUSE_CAUSE)
    domain.mark_host_lost(pausing, "h1", NOW)
    assert domain.resolve_host_gone(pausing, "h1", NOW + 1) and pausing.state == State.PAUSED
    assert not domain.resolve_host_gone(pausing, "h1", NOW + 2), "once"
    # An unproven cleanup there too: its survivors went with the host (only it could look again).
    unproven = new_task(state=State.RUNNING, owner="h1")
    domain.mark_unconfirmed(unproven, domain.interrupted_outcome(), "still there", NOW)
    assert domain.resolve_host_gone(unproven, "h1", NOW + 1) and unproven.state == State.QUEUED
    assert unproven.failure is not None and unproven.failure.code == FailureCode.HOST_LOST
    assert "operator confirmed" in unproven.failure.message
    # Another host's task, and a row waiting without a recorded reason, are left.
    other = new_task(state=State.RUNNING, owner="h2")
    domain.mark_host_lost(other, "h2", NOW)
    reasonless = new_task(state=State.NEEDS_RECONCILIATION, owner="h1")
    assert not domain.resolve_host_gone(other, "h1", NOW) and not domain.resolve_host_gone(reasonless, "h1", NOW)


def test_a_host_is_resolvable_only_when_not_live_not_this_replica_and_known() -> None:
    lapsed = domain.HostSummary("h1", lease_expires_at=NOW - 1, needs_reconciliation=1)
    domain.check_resolvable("h1", "me", lapsed, NOW)
    with pytest.raises(domain.InvalidArgument):
        domain.check_resolvable("me", "me", lapsed, NOW)
    with pytest.raises(domain.HostLive, match="lease"):
        domain.check_resolvable("h1", "me", domain.HostSummary("h1", lease_expires_at=NOW), NOW)
    with pytest.raises(domain.HostLive, match="process"):
        domain.check_resolvable("h1", "me", domain.HostSummary("h1", lease_expires_at=NOW - 1, connected=True), NOW)
    with pytest.raises(domain.HostNotFound):
        domain.check_resolvable("h1", "me", None, NOW)
    with pytest.raises(domain.InvalidArgument):
        domain.check_resolvable("", "me", lapsed, NOW)
    with pytest.raises(domain.errors.FailedPrecondition) as single:  # SQLite: every task is the one replica's own
        domain.check_resolvable("h1", "me", lapsed, NOW, multi_host=False)
    assert single.value.reason == "SINGLE_HOST"
    hosts = [domain.HostSummary(f"h{i}") for i in (3, 1, 2)]
    page, token = domain.page_hosts(hosts, 2, "")
    assert [h.host_id for h in page] == ["h1", "h2"] and token == "h2"
    assert [h.host_id for h in domain.page_hosts(hosts, 2, token)[0]] == ["h3"]


def behave_task(i: int) -> Task:
    task = new_task(i)
    task.profile, task.instructions = "behave", "[]"
    return task


async def launched(store: SchedulerStore, task: Task, host: str) -> None:
    """As its host left it: claimed, its attempt committed, running."""
    assert task.task_id in await store.claim_queued(50, (), any_owner=False)
    await store.save_launching_attempt(attempt_of(task, host))
    await store.update_task(
        task.task_id, lambda t: domain.start_running(t, NOW, NOW, None, None), "task.state_changed", NOW
    )


async def start_replica(tmp_path: Path, pg_db: Database, host_id: str) -> Harness:
    """A live replica on the PostgreSQL database, serving SchedulerService in-process (its
    loops not started: the test drives them)."""
    settings = make_settings(tmp_path, f"127.0.0.1:{free_port()}", {"quick": WorkerProfile(command=["true"])})
    clock = FakeClock()
    clock.now = NOW
    engine = Engine(settings, SchedulerStore(pg_db, host_id), clock=clock)
    sockets = WorkerSockets("", engine.worker_uids())
    engine.worker_addr = sockets.addr_for

    def register(server: object) -> None:
        scheduler_pb2_grpc.add_SchedulerServiceServicer_to_server(SchedulerServicer(engine), server)

    host = await start_server(settings.scheduler_addr, [register], [], security=SERVER_SECURITY)
    worker_server = await start_worker_server(
        lambda server: scheduler_pb2_grpc.add_WorkerServiceServicer_to_server(WorkerServicer(engine), server), sockets
    )
    await engine.start(run_loops=False)
    return Harness(engine, clock, host, pg_db, worker_server, sockets)


@pytest.fixture
async def survivor(tmp_path: Path, pg_db: Database) -> AsyncIterator[Harness]:
    h = await start_replica(tmp_path, pg_db, "survivor")
    yield h
    await h.close(db=False)


@pytest.mark.postgres
async def test_a_lost_hosts_tasks_resolve_to_their_kept_outcome_and_run_once_on_the_survivor(
    pg_db: Database, survivor: Harness
) -> None:
    lost = SchedulerStore(pg_db, "lost")
    await lost.register_host("boot", NOW - 60_000, 1_000, only_one=False)
    running, cancelling, claimed, unproven = [(await lost.create_task(behave_task(i)))[0] for i in range(4)]
    for task in (running, cancelling, unproven):
        await launched(lost, task, "lost")
    assert claimed.task_id in await lost.claim_queued(50, (), any_owner=False)
    cancel = Cancellation(requested_at=NOW, cause="user_canceled")
    await lost.update_task(
        cancelling.task_id, lambda t: domain.request_cancel(t, cancel, NOW), "task.state_changed", NOW
    )
    # A user's cancel whose stop the lost host could not prove: only that host could look again.
    await lost.update_task(unproven.task_id, lambda t: domain.request_cancel(t, cancel, NOW), "task.state_changed", NOW)
    await lost.update_task(
        unproven.task_id,
        lambda t: t if domain.mark_unconfirmed(t, PendingOutcome(state=State.CANCELLED), "pid 4242", NOW) else None,
        "task.state_changed",
        NOW,
    )
    with pytest.raises(domain.InvalidTransition, match="owned by scheduler host lost; retry its cleanup there"):
        await survivor.engine.retry_cleanup(unproven.task_id)  # its advice: resolve the host
    store = survivor.engine.store
    await store.sweep_lost(running.task_id, "lost", NOW, NOW)  # swept already; the rest is not yet

    (listed,) = [h for h in await survivor.engine.list_hosts() if h.host_id == "lost"]
    assert not listed.lease_live(NOW) and not listed.connected
    assert (listed.queued, listed.active, listed.needs_reconciliation, listed.host_lost) == (1, 1, 2, 1)
    assert listed.resolvable == 2, "the HOST_LOST task and the unproven cancel: what a resolve settles"

    done = await survivor.engine.resolve_lost_host("lost")
    assert {t.task_id for t in done.resolved} == {running.task_id, cancelling.task_id, unproven.task_id}
    assert done.left == 0 and done.forgotten
    after = {t.task_id: t for t in await store.tasks_in_states(list(State))}
    requeued = after[running.task_id]
    assert requeued.state == State.QUEUED and requeued.owner_host is None
    assert requeued.failure is not None and requeued.failure.code == FailureCode.HOST_LOST
    assert "operator confirmed" in requeued.failure.message
    ended = after[cancelling.task_id]
    assert ended.state == State.CANCELLED and ended.cancellation is not None
    assert ended.cancellation.cleanup == domain.HOST_GONE_CLEANUP
    assert after[claimed.task_id].state == State.QUEUED and after[claimed.task_id].owner_host is None
    settled = after[unproven.task_id]  # CLEANUP_UNCONFIRMED: its survivors went with the host
    assert settled.state == State.CANCELLED and settled.cancellation is not None
    assert settled.cancellation.cleanup == domain.HOST_GONE_CLEANUP
    (unproven_attempt,) = await store.attempts_of(unproven.task_id)
    assert unproven_attempt.state == "ended"
    (old_attempt,) = await store.attempts_of(running.task_id)
    assert old_attempt.state == "ended" and old_attempt.outcome == domain.HOST_GONE_CLEANUP
    # One event per settled task, written by the resolving replica.
    _, events = await store.events_after(0, (), 500)
    resolved = {running.task_id, cancelling.task_id, unproven.task_id}
    resolved_events = [
        e
        for e in events
        if e.task.task_id in resolved and e.origin == "survivor" and e.task.state != State.NEEDS_RECONCILIATION
    ]
    assert sorted(e.task.task_id for e in resolved_events) == sorted(resolved)
    assert {e.task.state for e in resolved_events} == {State.QUEUED, State.CANCELLED}
    with pg_db.engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT host_id FROM scheduler_hosts")).all()
    assert [r.host_id for r in rows] == ["survivor"], "the lost host's row is dropped"

    with pytest.raises(domain.HostNotFound, match="already resolved"):  # no task names it any more
        await survivor.engine.resolve_lost_host("lost")

    # The re-queued task (and the released claim) run here, each exactly once.
    assert await survivor.engine.dispatch_once() == 2
    for task_id in (running.task_id, claimed.task_id):
        assert (await survivor.wait(task_id, [State.COMPLETED])).state == State.COMPLETED
    assert await survivor.engine.dispatch_once() == 0
    attempts = await store.attempts_of(running.task_id)
    assert [a.host_id for a in attempts] == ["lost", "survivor"]


@pytest.mark.postgres
async def test_resolving_is_refused_for_a_live_host_this_replica_and_an_unknown_id_over_grpc(
    pg_db: Database, survivor: Harness
) -> None:
    from services.scheduler.hosts import Listener

    live = SchedulerStore(pg_db, "live")
    await live.register_host("boot", NOW, 60_000, only_one=False)
    task, _ = await live.create_task(behave_task(0))
    await launched(live, task, "live")
    held = SchedulerStore(pg_db, "held")  # lease lapsed, but its process is connected
    await held.register_host("boot", NOW - 60_000, 1_000, only_one=False)
    listener = Listener(SimpleNamespace(host_id="held"), pg_db.url)  # type: ignore[arg-type]
    await listener.connect()
    try:
        async with aio_channel(survivor.engine.settings.scheduler_addr, caller("operator")) as channel:
            stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)
            listed = {h.host_id: h for h in (await stub.ListHosts(pb.ListHostsRequest(), timeout=10)).hosts}
            assert listed["survivor"].serving and listed["live"].lease_live and listed["live"].active_tasks == 1
            assert listed["held"].connected and not listed["held"].lease_live
            for host_id, code, reason in (
                ("survivor", grpc.StatusCode.INVALID_ARGUMENT, "OWN_HOST"),
                ("live", grpc.StatusCode.FAILED_PRECONDITION, "HOST_LIVE"),
                ("held", grpc.StatusCode.FAILED_PRECONDITION, "HOST_LIVE"),
                ("nobody", grpc.StatusCode.NOT_FOUND, "HOST_NOT_FOUND"),
                ("", grpc.StatusCode.INVALID_ARGUMENT, "INVALID_HOST_ID"),
            ):
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub.ResolveLostHost(pb.ResolveLostHostRequest(host_id=host_id), timeout=10)
                assert refused.value.code() == code, host_id
                info = error_info(refused.value)
                assert info is not None and info.reason == reason, host_id
        assert (await survivor.engine.store.get_task(task.task_id)).state == State.RUNNING, "untouched"
        # Another identity is refused these RPCs by the interceptor.
        async with aio_channel(survivor.engine.settings.scheduler_addr, caller("gateway")) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as denied:
                await scheduler_pb2_grpc.SchedulerServiceStub(channel).ListHosts(pb.ListHostsRequest(), timeout=10)
            assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
    finally:
        await listener.close()


@pytest.mark.postgres
async def test_a_launch_swept_host_lost_before_it_ran_keeps_its_worker_and_ends_by_its_exit(
    pg_db: Database, survivor: Harness
) -> None:
    """This host's lease lapsed while it launched a task (a stall), and another replica swept the
    task HOST_LOST between the worker's release and `running`. The worker is this host's and
    already runs: the launch goes on, and the task ends by the worker's exit, once — before, the
    refused `running` failed it WORKER_LAUNCH_FAILED although its worker had run."""
    engine, store = survivor.engine, survivor.engine.store
    other = SchedulerStore(pg_db, "other")
    task = await survivor.create("quick")
    real_update = store.update_task

    async def swept_first(task_id: str, change: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(change, "__name__", "") == "to_running":  # the launch's step after the release
            swept, event = await other.sweep_lost(task_id, "survivor", NOW, NOW + 10**9)
            assert event is not None and swept.state == State.NEEDS_RECONCILIATION
        return await real_update(task_id, change, *args, **kwargs)

    store.update_task = swept_first  # type: ignore[method-assign]
    try:
        assert await engine.dispatch_once() == 1
    finally:
        store.update_task = real_update  # type: ignore[method-assign]
    (attempt,) = await store.attempts_of(task.task_id)
    assert attempt.pid is not None and attempt.host_id == "survivor"
    deadline = time.monotonic() + 15
    while task.task_id in engine.runtime.live:  # the worker's exit is recorded on its attempt
        assert time.monotonic() < deadline, "the worker did not exit"
        await asyncio.sleep(0.02)
    held = await store.get_task(task.task_id)
    assert held.state == State.NEEDS_RECONCILIATION, "only its own host settles a HOST_LOST task"
    assert await engine.recovery.reconcile_host_lost() == 1
    done = await store.get_task(task.task_id)
    assert done.state == State.COMPLETED, done
    (attempt,) = await store.attempts_of(task.task_id)
    assert attempt.state == "ended" and attempt.outcome == "exited" and attempt.exit_code == 0
    _, events = await store.events_after(0, (), 500)
    assert State.FAILED not in {e.task.state for e in events if e.task.task_id == task.task_id}


async def test_the_lease_is_renewed_while_a_sweep_is_slow() -> None:
    """A sweep takes a transaction per task of the lost host (and reconciling one may wait a
    stop's grace): the renewal does not wait for it, or this live host would itself look lost
    to the other replicas past its lease and grace."""
    renewals: list[int] = []
    sweep_began, sweep_may_end = asyncio.Event(), asyncio.Event()
    clock = FakeClock()

    async def renew_lease(until: int) -> int:
        renewals.append(until)
        return until

    async def lost_hosts(cutoff: int) -> list[str]:
        return ["gone"]

    async def tasks_held_by(host: str) -> list[str]:
        return ["t1"]

    async def sweep_lost(task_id: str, host: str, now: int, cutoff: int) -> tuple[Task, None]:
        sweep_began.set()
        await sweep_may_end.wait()
        return new_task(), None

    store = SimpleNamespace(
        renew_lease=renew_lease, lost_hosts=lost_hosts, tasks_held_by=tasks_held_by, sweep_lost=sweep_lost
    )
    rt = SimpleNamespace(
        closing=False,
        multi_host=True,
        host_id="me",
        clock=clock,
        store=store,
        tasks_cfg=SimpleNamespace(lease_ms=300, host_lost_grace_ms=0),
        published=lambda stored, task: None,
        wake=asyncio.Event(),
    )
    lease = HostLease(rt)  # type: ignore[arg-type]
    loop = asyncio.create_task(lease.loop())
    try:
        await asyncio.wait_for(sweep_began.wait(), 10)
        before = len(renewals)
        deadline = time.monotonic() + 10  # renewed every 100 ms: three renewals, generously bounded
        while len(renewals) < before + 3:
            assert time.monotonic() < deadline, f"{len(renewals) - before} renewal(s) while the sweep ran"
            await asyncio.sleep(0.05)
        assert not sweep_may_end.is_set()
    finally:
        sweep_may_end.set()
        rt.closing = True
        loop.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loop


@pytest.mark.postgres
async def test_a_running_task_swept_while_its_host_was_only_silent_runs_on_there(
    pg_db: Database, survivor: Harness
) -> None:
    """Another replica swept this live host's running task HOST_LOST (its lease lapsed in a
    stall). Its worker is this process's child, alive: the next reconciliation takes the task
    back to running — the same attempt and process, nothing re-run — and a cancel then stops it."""
    engine, store = survivor.engine, survivor.engine.store
    task = await survivor.create("sleeper")
    assert await engine.dispatch_once() == 1
    await survivor.wait(task.task_id, [State.RUNNING])
    (attempt,) = await store.attempts_of(task.task_id)
    swept, event = await SchedulerStore(pg_db, "other").sweep_lost(task.task_id, "survivor", NOW, NOW + 10**9)
    assert event is not None and swept.state == State.NEEDS_RECONCILIATION
    engine.runtime.lease_held_until = 0  # woken, but its lease not renewed yet: the next sweep would win
    assert await engine.recovery.reconcile_host_lost() == 0
    assert (await store.get_task(task.task_id)).state == State.NEEDS_RECONCILIATION
    await engine.lease.renew_once()
    assert await engine.recovery.reconcile_host_lost() == 1
    back = await store.get_task(task.task_id)
    assert back.state == State.RUNNING and back.failure is None and back.owner_host == "survivor"
    (same,) = await store.attempts_of(task.task_id)
    assert same.attempt_id == attempt.attempt_id and same.pid == attempt.pid and same.state == "running"
    assert attempt.pid is not None and proctree.identity_matches(attempt.pid, attempt.pid_start_time or -1)
    assert await engine.recovery.reconcile_host_lost() == 0, "nothing left to take back"
    await engine.cancel(task.task_id, wait_s=5)
    assert (await survivor.wait(task.task_id, [State.CANCELLED])).state == State.CANCELLED


@pytest.mark.postgres
async def test_a_sweep_gives_up_on_a_lock_a_frozen_host_holds_then_sweeps_once_it_is_released(
    pg_db: Database,
) -> None:
    """A host frozen in the middle of its renewal holds its lease row: the sweep (which reads
    that row FOR SHARE) gives up after its lock timeout instead of hanging, and the next one,
    after the lock is gone, sweeps the task."""
    frozen_host = SchedulerStore(pg_db, "frozen")
    await frozen_host.register_host("boot", NOW - 60_000, 1_000, only_one=False)
    task = (await frozen_host.create_task(behave_task(0)))[0]
    await launched(frozen_host, task, "frozen")
    sweeper = SchedulerStore(pg_db, "sweeper")
    with psycopg.connect(libpq_url(pg_db.url)) as frozen:
        frozen.execute("SELECT 1 FROM scheduler_hosts WHERE host_id = 'frozen' FOR UPDATE")
        began = time.monotonic()
        with pytest.raises(sa.exc.OperationalError, match="lock timeout"):
            await asyncio.wait_for(sweeper.sweep_lost(task.task_id, "frozen", NOW, NOW + 10**9, 300), 30)
        assert time.monotonic() - began < 20, "it waited past its lock timeout"
        assert (await sweeper.get_task(task.task_id)).state == State.RUNNING, "nothing half-written"
        frozen.rollback()
    swept, event = await sweeper.sweep_lost(task.task_id, "frozen", NOW, NOW + 10**9, 300)
    assert event is not None and swept.state == State.NEEDS_RECONCILIATION


@pytest.mark.postgres
async def test_postgresql_ends_a_scheduler_session_left_idle_in_a_transaction(pg_db: Database) -> None:
    """The scheduler's sessions carry idle_in_transaction_session_timeout (never below 10 s, at
    least its lease): a session frozen inside a transaction loses it, and the row locks it held
    go to whoever waits for them."""
    assert scheduler_pg_settings(1_500) == {"idle_in_transaction_session_timeout": "10000"}
    assert scheduler_pg_settings(15_000) == {"idle_in_transaction_session_timeout": "15000"}
    quick = Database(pg_db.url, pg_settings={"idle_in_transaction_session_timeout": "500"})
    try:
        with quick.engine.connect() as conn:
            shown = conn.execute(sa.text("SHOW idle_in_transaction_session_timeout")).scalar()
            assert shown == "500ms"
            conn.execute(sa.text("SELECT 1 FROM scheduler_hosts FOR UPDATE"))  # begun, then frozen
            await SchedulerStore(pg_db, "holder").register_host("boot", NOW, 1_000, only_one=False)
            with psycopg.connect(libpq_url(pg_db.url)) as waiter:
                waiter.execute("SET lock_timeout = 20000")
                began = time.monotonic()
                waiter.execute("SELECT 1 FROM scheduler_hosts FOR UPDATE")  # granted once the server ends it
                assert time.monotonic() - began < 20
    finally:
        quick.close()
