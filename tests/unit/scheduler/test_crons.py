"""Cron jobs: due ticks (pure), the tick claim with two engines on one PostgreSQL, how runs
end (task outcome, timeout), and the CronService over a real in-process gRPC server."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import sqlalchemy as sa

from libs.db import Database
from libs.grpc_server import NO_CALLER_AUTH, ServiceHost, start_server
from libs.settings import CronJob, Settings, SettingsError, TaskSettings, WorkerProfile, load_settings
from services.scheduler import cron_domain
from services.scheduler.cron_domain import CronRun
from services.scheduler.cron_servicer import CronServicer
from services.scheduler.cron_store import MIGRATIONS
from services.scheduler.domain import State
from services.scheduler.engine import Engine
from services.scheduler.servicer import WorkerServicer
from services.scheduler.store import SchedulerStore
from services.scheduler.worker_api import WorkerSockets, start_worker_server
from taskgate.scheduler.v1 import crons_pb2 as pb
from taskgate.scheduler.v1 import crons_pb2_grpc, scheduler_pb2_grpc
from tests.support.postgres import fresh_database
from tests.support.procs import free_port
from tests.support.stack import BEHAVE
from tests.unit.scheduler.test_engine import FakeClock

MINUTE = 60_000
# 2026-01-01T00:00:00Z: a round instant, so tick arithmetic is easy to read.
T0 = 1_767_225_600_000


# --- pure -------------------------------------------------------------------------


def test_due_ticks_are_the_schedules_ticks_in_the_window() -> None:
    ticks, skipped = cron_domain.due_ticks("*/15 * * * *", T0, T0 + 60 * MINUTE)
    assert ticks == [T0 + 15 * MINUTE, T0 + 30 * MINUTE, T0 + 45 * MINUTE, T0 + 60 * MINUTE]
    assert skipped == 0
    # The window is half-open: a tick at its start was the previous pass's.
    assert cron_domain.due_ticks("*/15 * * * *", T0 + 15 * MINUTE, T0 + 29 * MINUTE) == ([], 0)
    # A sixth field is seconds.
    assert cron_domain.due_ticks("* * * * * */20", T0, T0 + MINUTE)[0] == [T0 + 20_000, T0 + 40_000, T0 + MINUTE]


def test_a_long_gap_fires_only_the_newest_ticks() -> None:
    ticks, skipped = cron_domain.due_ticks("* * * * *", T0, T0 + 100 * MINUTE, limit=3)
    assert ticks == [T0 + 98 * MINUTE, T0 + 99 * MINUTE, T0 + 100 * MINUTE]
    assert skipped == 97


def test_a_run_ends_with_its_tasks_outcome_or_times_out() -> None:
    run = CronRun("r", "c", cron_domain.MANUAL, started_at=0, deadline_at=1000, task_ids=("a",))
    assert cron_domain.run_outcome(run, {"a": State.RUNNING}, 999) is None
    assert cron_domain.run_outcome(run, {"a": State.WAITING_INPUT}, 999) is None
    assert cron_domain.run_outcome(run, {"a": State.COMPLETED}, 5000) == "completed"
    assert cron_domain.run_outcome(run, {"a": State.FAILED}, 10) == "failed"
    assert cron_domain.run_outcome(run, {"a": State.CANCELLED}, 10) == "cancelled"
    assert cron_domain.run_outcome(run, {"a": State.NEEDS_RECONCILIATION}, 1000) == "timed_out"
    assert cron_domain.run_outcome(run, {}, 1000) == "timed_out"


def test_settings_refuse_a_bad_schedule_or_an_unknown_profile(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('[crons.nightly]\nschedule = "61 * * * *"\nagent = "a"\nsession = "s"\ntitle = "t"\n')
    with pytest.raises(SettingsError, match="not a cron schedule"):
        load_settings({"TASKGATE_CONFIG": str(config)})
    config.write_text(
        '[crons.nightly]\nschedule = "0 3 * * *"\nagent = "a"\nsession = "s"\ntitle = "t"\nprofile = "nope"\n'
    )
    with pytest.raises(SettingsError, match="not a \\[workers\\] entry"):
        load_settings({"TASKGATE_CONFIG": str(config)})
    config.write_text(
        '[workers.w]\ncommand = ["true"]\n[crons.nightly]\nschedule = "0 3 * * *"\nagent = "a"\nsession = "s"\n'
        'title = "t"\nprofile = "w"\ntimeout_ms = 5000\n'
    )
    job = load_settings({"TASKGATE_CONFIG": str(config)}).crons["nightly"]
    assert (job.schedule, job.profile, job.timeout_ms, job.enabled) == ("0 3 * * *", "w", 5000, True)


# --- engines ------------------------------------------------------------------------


@dataclass
class CronHarness:
    engine: Engine
    clock: FakeClock
    db: Database
    host: ServiceHost
    worker_server: grpc.aio.Server
    sockets: WorkerSockets

    async def close(self) -> None:
        await self.engine.shutdown()
        await self.worker_server.stop(0)
        await self.host.server.stop(0)
        self.sockets.close()

    async def wait_state(self, task_id: str, *states: State, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while (await self.engine.store.get_task(task_id)).state not in states:
            assert time.monotonic() < deadline, "the task did not finish"
            await asyncio.sleep(0.02)


def cron_settings(tmp_path: Path, crons: dict[str, CronJob]) -> Settings:
    return Settings(
        data_dir=tmp_path,
        scheduler_addr=f"127.0.0.1:{free_port()}",
        tasks=TaskSettings(cancel_grace_ms=300, cleanup_confirm_ms=1000, supervisor_interval_ms=3_600_000),
        workers={
            "behave": WorkerProfile(command=["python", str(BEHAVE)], uses_sdk=True),
            "sleeper": WorkerProfile(command=["sleep", "300"]),
        },
        crons=crons,
        cron_poll_ms=50,
    )


async def start(
    tmp_path: Path, db: Database, crons: dict[str, CronJob], clock: FakeClock, host_id: str = "local"
) -> CronHarness:
    settings = cron_settings(tmp_path, crons)
    engine = Engine(settings, SchedulerStore(db, host_id), clock=clock)
    sockets = WorkerSockets("", engine.worker_uids())
    engine.worker_addr = sockets.addr_for

    def register(server: object) -> None:
        crons_pb2_grpc.add_CronServiceServicer_to_server(CronServicer(engine.crons), server)

    host = await start_server(settings.scheduler_addr, [register], [], security=NO_CALLER_AUTH)
    worker_server = await start_worker_server(
        lambda server: scheduler_pb2_grpc.add_WorkerServiceServicer_to_server(WorkerServicer(engine), server), sockets
    )
    await engine.start(run_loops=False)
    return CronHarness(engine, clock, db, host, worker_server, sockets)


def job(profile: str = "behave", instructions: object = (), **extra: object) -> CronJob:
    return CronJob(
        schedule=str(extra.pop("schedule", "* * * * *")),
        agent="agent-1",
        session="cron-s",
        title="nightly",
        instructions=json.dumps(list(instructions)),  # type: ignore[call-overload]
        profile=profile,
        **extra,  # type: ignore[arg-type]
    )


@pytest.fixture
async def sqlite_harness(tmp_path: Path) -> AsyncIterator[CronHarness]:
    db = Database(f"sqlite:///{tmp_path / 'scheduler.db'}", MIGRATIONS)
    db.migrate()
    h = await start(
        tmp_path,
        db,
        {
            "ok": job(instructions=[{"progress": "working"}, {"result": {"text": "all done"}}]),
            "fails": job(instructions=[{"exit": 3}]),
            "slow": job(profile="sleeper", timeout_ms=500),
            "other": CronJob(schedule="0 0 * * *", agent="agent-2", session="s", title="x", profile="behave"),
        },
        FakeClock(),
    )
    yield h
    await h.close()
    db.close()


async def test_two_engines_on_one_postgresql_fire_each_tick_once(tmp_path: Path, postgres_url: str) -> None:
    url = fresh_database(postgres_url, "crons")
    dbs = [Database(url, MIGRATIONS), Database(url, MIGRATIONS)]
    dbs[0].migrate()
    clock = FakeClock()
    clock.now = T0 + 30_000
    crons = {"every-minute": job(profile="sleeper"), "off": job(profile="sleeper", enabled=False)}
    # Two replicas: each its own host id (one host id is one live process).
    a = await start(tmp_path / "a", dbs[0], crons, clock, host_id="host-a")
    b = await start(tmp_path / "b", dbs[1], crons, clock, host_id="host-b")
    try:
        fired: list[CronRun] = []
        for _ in range(6):
            clock.advance(MINUTE)
            # Both replicas look at the same due tick at the same moment.
            for started in await asyncio.gather(a.engine.crons.fire_due(), b.engine.crons.fire_due()):
                fired.extend(started)
        assert sorted(r.scheduled_for or 0 for r in fired) == [T0 + i * MINUTE for i in range(1, 7)]
        with dbs[0].engine.connect() as conn:
            runs = conn.execute(sa.text("SELECT cron_id, scheduled_for, doc FROM cron_runs")).all()
            tasks = conn.execute(sa.text("SELECT task_id FROM tasks WHERE session_id = 'cron-s'")).all()
        assert len(runs) == 6 and {r.cron_id for r in runs} == {"every-minute"}
        # One task per run, and no task without its run: the losing claims created nothing.
        run_tasks = sorted(t for r in runs for t in json.loads(r.doc)["taskIds"])
        assert run_tasks == sorted(t.task_id for t in tasks)
    finally:
        await a.close()
        await b.close()
        for db in dbs:
            db.close()


async def test_a_manual_run_ends_with_its_tasks_outcome(sqlite_harness: CronHarness) -> None:
    h = sqlite_harness
    ok = await h.engine.crons.run_now("ok")
    failed = await h.engine.crons.run_now("fails")
    assert ok.outcome is None and len(ok.task_ids) == 1
    await h.engine.dispatch_once()
    await h.wait_state(ok.task_ids[0], State.COMPLETED)
    await h.wait_state(failed.task_ids[0], State.FAILED)
    ended = {r.run_id: r for r in await h.engine.crons.settle_once()}
    assert ended[ok.run_id].outcome == "completed" and ended[ok.run_id].failure is None
    assert ended[failed.run_id].outcome == "failed"
    failure = ended[failed.run_id].failure
    assert failure is not None and failure.code == "WORKER_EXITED"
    # Ended once: a second pass (another replica's) changes nothing.
    assert await h.engine.crons.settle_once() == []
    task = await h.engine.store.get_task(ok.task_ids[0])
    assert task.result is not None and task.result.text == "all done"


async def test_past_its_timeout_a_run_ends_timed_out_and_its_task_is_cancelled(sqlite_harness: CronHarness) -> None:
    h = sqlite_harness
    run = await h.engine.crons.run_now("slow")
    await h.engine.dispatch_once()
    await h.wait_state(run.task_ids[0], State.RUNNING)
    assert await h.engine.crons.settle_once() == []  # before its deadline nothing ends
    h.clock.advance(501)
    (ended,) = await h.engine.crons.settle_once()
    assert ended.outcome == "timed_out"
    await h.wait_state(run.task_ids[0], State.CANCELLED)
    task = await h.engine.store.get_task(run.task_ids[0])
    assert task.cancellation is not None and task.cancellation.cause == "cron_timed_out"
    # The task's own ending does not rewrite the run's outcome.
    assert await h.engine.crons.settle_once() == []
    assert (await h.engine.crons.store.get_run(run.run_id)).outcome == "timed_out"  # type: ignore[union-attr]


async def test_the_cron_service_waits_for_the_outcome_and_checks_the_agent(sqlite_harness: CronHarness) -> None:
    h = sqlite_harness
    loop = asyncio.create_task(h.engine.crons.loop())
    dispatcher = asyncio.create_task(h.engine.launcher.dispatch_loop())
    try:
        async with grpc.aio.insecure_channel(h.engine.settings.scheduler_addr) as channel:
            stub = crons_pb2_grpc.CronServiceStub(channel)
            listed = await stub.ListCrons(pb.ListCronsRequest(agent_ids=["agent-1"]), timeout=5)
            assert [c.cron_id for c in listed.crons] == ["fails", "ok", "slow"]
            with pytest.raises(grpc.aio.AioRpcError) as denied:
                await stub.ListCronRuns(pb.ListCronRunsRequest(cron_id="other", agent_ids=["agent-1"]), timeout=5)
            assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
            with pytest.raises(grpc.aio.AioRpcError) as missing:
                async for _ in stub.RunCron(pb.RunCronRequest(cron_id="nope", agent_ids=["agent-1"]), timeout=5):
                    pass
            assert missing.value.code() == grpc.StatusCode.NOT_FOUND

            replies = [r async for r in stub.RunCron(pb.RunCronRequest(cron_id="ok", agent_ids=["agent-1"]))]
            assert len(replies) == 2
            assert replies[0].run.outcome == pb.CRON_RUN_OUTCOME_UNSPECIFIED and replies[0].cron.agent_id == "agent-1"
            assert replies[1].run.outcome == pb.CRON_RUN_OUTCOME_COMPLETED
            task = await h.engine.store.get_task(replies[1].run.task_ids[0])
            assert task.state == State.COMPLETED and task.result is not None  # the result came first

            history = await stub.ListCronRuns(pb.ListCronRunsRequest(cron_id="ok", agent_ids=["agent-1"]), timeout=5)
            assert history.total == 1 and history.runs[0].run_id == replies[0].run.run_id
            assert history.runs[0].kind == pb.CRON_RUN_KIND_MANUAL and history.runs[0].HasField("end_time")
    finally:
        loop.cancel()
        dispatcher.cancel()
        await asyncio.gather(loop, dispatcher, return_exceptions=True)
