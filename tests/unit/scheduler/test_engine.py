"""The engine with real worker processes, a real in-process gRPC server and an injected clock.

Timers are driven by advancing the fake clock and calling ``supervise_once``: no
test waits for a timeout to pass in real time.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from libs import proctree
from libs.db import Database
from libs.grpc_server import NO_CALLER_AUTH, ServiceHost, start_server
from libs.settings import Settings, TaskSettings, WorkerProfile
from services.scheduler.cron_store import MIGRATIONS
from services.scheduler.domain import NewTask, State, Task, TaskNotFound
from services.scheduler.engine import Engine
from services.scheduler.servicer import SchedulerServicer, WorkerServicer
from services.scheduler.store import SchedulerStore
from services.scheduler.worker_api import WorkerSockets, start_worker_server
from taskgate.scheduler.v1 import scheduler_pb2_grpc
from tests.support.procs import free_port
from tests.support.stack import BEHAVE


class FakeClock:
    def __init__(self) -> None:
        self.now = int(time.time() * 1000)

    def now_ms(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


@dataclass
class Harness:
    engine: Engine
    clock: FakeClock
    host: ServiceHost
    db: Database
    worker_server: grpc.aio.Server
    sockets: WorkerSockets

    async def close(self, db: bool = True) -> None:
        await self.engine.shutdown()
        await self.worker_server.stop(0)
        await self.host.server.stop(0)
        self.sockets.close()
        if db:
            self.db.close()

    async def create(self, profile: str, steps: list[object] | None = None, title: str = "t") -> Task:
        return await self.engine.create_task(
            NewTask(
                agent_id="agent-1",
                session_id="cli-1",
                title=title,
                instructions=json.dumps(steps or []),
                profile=profile,
                request_id=None,
                harness=None,
                harness_model=None,
            )
        )

    async def wait(self, task_id: str, states: Iterable[State], timeout_s: float = 15.0) -> Task:
        wanted = set(states)
        deadline = time.monotonic() + timeout_s
        while True:
            task = await self.engine.store.get_task(task_id)
            if task.state in wanted:
                return task
            assert time.monotonic() < deadline, f"task stayed {task.state}, wanted {wanted}"
            await asyncio.sleep(0.02)


def make_settings(
    tmp_path: Path, addr: str, workers: dict[str, WorkerProfile] | None = None, **tasks: object
) -> Settings:
    # Validated by TaskSettings itself (a test may pass any of its fields).
    values: dict[str, Any] = {
        "cancel_grace_ms": 300,
        "cleanup_confirm_ms": 1000,
        "max_running": 4,
        "supervisor_interval_ms": 3_600_000,
        **tasks,
    }
    task_settings = TaskSettings(**values)
    return Settings(
        data_dir=tmp_path,
        scheduler_addr=addr,
        tasks=task_settings,
        workers={
            "sleeper": WorkerProfile(command=["sleep", "300"]),
            "behave": WorkerProfile(command=["python", str(BEHAVE)], uses_sdk=True),
            **(workers or {}),
        },
    )


async def start_harness(
    tmp_path: Path,
    db: Database | None = None,
    workers: dict[str, WorkerProfile] | None = None,
    boot_id: str | None = None,
    **tasks: object,
) -> Harness:
    port = free_port()
    settings = make_settings(tmp_path, f"127.0.0.1:{port}", workers, **tasks)
    db = db or Database(f"sqlite:///{tmp_path / 'scheduler.db'}", MIGRATIONS)
    db.migrate()
    clock = FakeClock()
    engine = Engine(settings, SchedulerStore(db), clock=clock, boot_id=boot_id)
    sockets = WorkerSockets("", engine.worker_uids())
    engine.worker_addr = sockets.addr_for

    def register(server: object) -> None:
        scheduler_pb2_grpc.add_SchedulerServiceServicer_to_server(SchedulerServicer(engine), server)

    host = await start_server(settings.scheduler_addr, [register], [], security=NO_CALLER_AUTH)
    worker_server = await start_worker_server(
        lambda server: scheduler_pb2_grpc.add_WorkerServiceServicer_to_server(WorkerServicer(engine), server), sockets
    )
    await engine.start(run_loops=False)
    return Harness(engine, clock, host, db, worker_server, sockets)


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[Harness]:
    h = await start_harness(tmp_path)
    yield h
    await h.close()


def group_alive(pgid: int) -> bool:
    return bool(proctree.live_group_members(proctree.process_table(), pgid))


async def running(h: Harness, profile: str, steps: list[object] | None = None) -> Task:
    task = await h.create(profile, steps)
    assert await h.engine.dispatch_once() >= 1
    return await h.wait(task.task_id, [State.RUNNING])


async def test_quiet_worker_gets_an_inspection_and_keeps_running(harness: Harness) -> None:
    task = await running(harness, "sleeper")
    harness.clock.advance(300_000)
    await harness.engine.supervise_once()
    task = await harness.engine.store.get_task(task.task_id)
    assert task.state == State.RUNNING and task.inspection is not None
    _, attempts = await harness.engine.get_task(task.task_id)
    assert group_alive(attempts[-1].pgid or -1)


async def test_no_progress_for_the_stale_limit_stops_the_tree(tmp_path: Path) -> None:
    h = await start_harness(tmp_path, progress_stale_limit_ms=60_000)
    try:
        task = await running(h, "sleeper")
        h.clock.advance(59_999)
        await h.engine.supervise_once()
        assert (await h.engine.store.get_task(task.task_id)).state == State.RUNNING
        h.clock.advance(1)
        await h.engine.supervise_once()
        done = await h.wait(task.task_id, [State.FAILED])
        assert done.failure and done.failure.code == "PROGRESS_STALLED"
        _, attempts = await h.engine.get_task(task.task_id)
        assert not group_alive(attempts[-1].pgid or -1)
    finally:
        await h.close()


async def test_max_duration_is_enforced(tmp_path: Path) -> None:
    h = await start_harness(tmp_path, max_duration_ms=10_000, progress_stale_limit_ms=0)
    try:
        task = await running(h, "sleeper")
        h.clock.advance(10_000)
        await h.engine.supervise_once()
        done = await h.wait(task.task_id, [State.FAILED])
        assert done.failure and done.failure.code == "MAX_DURATION_EXCEEDED"
        assert done.ended_at is not None
    finally:
        await h.close()


async def test_background_result_is_accepted_after_the_grace(tmp_path: Path) -> None:
    h = await start_harness(tmp_path, background_grace_ms=900_000)
    try:
        task = await running(
            h, "behave", [{"result": {"text": "all done", "unresolved_background": True}}, {"sleep": 300}]
        )
        deadline = time.monotonic() + 15
        while (await h.engine.store.get_task(task.task_id)).result is None:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        h.clock.advance(899_999)
        await h.engine.supervise_once()
        assert (await h.engine.store.get_task(task.task_id)).state == State.RUNNING
        h.clock.advance(1)
        await h.engine.supervise_once()
        done = await h.wait(task.task_id, [State.COMPLETED])
        assert done.result and done.result.text == "all done" and done.result.unresolved_background
    finally:
        await h.close()


async def test_max_running_bounds_concurrent_workers(tmp_path: Path) -> None:
    h = await start_harness(tmp_path, max_running=2)
    try:
        tasks = [await h.create("sleeper", title=f"t{i}") for i in range(3)]
        await h.engine.dispatch_once()
        states = [(await h.engine.store.get_task(t.task_id)).state for t in tasks]
        assert states == [State.RUNNING, State.RUNNING, State.QUEUED]
        cancelled = await h.engine.cancel(tasks[0].task_id, wait_s=5)
        assert cancelled.state == State.CANCELLED
        await h.engine.dispatch_once()
        await h.wait(tasks[2].task_id, [State.RUNNING])
    finally:
        await h.close()


async def test_graceful_shutdown_requeues_for_resumption(tmp_path: Path) -> None:
    h = await start_harness(tmp_path)
    task = await running(h, "sleeper")
    _, attempts = await h.engine.get_task(task.task_id)
    await h.engine.shutdown()
    stored = await h.engine.store.get_task(task.task_id)
    await h.close()
    assert stored.state == State.QUEUED
    assert stored.failure and stored.failure.code == "GATEWAY_SHUTDOWN"
    assert stored.restart_resume and stored.restart_resume.count == 1 and stored.restart_resume.pending
    assert not group_alive(attempts[-1].pgid or -1)


async def test_restart_recovery_stops_the_old_worker_and_resumes(tmp_path: Path) -> None:
    first = await start_harness(tmp_path)
    task = await running(first, "behave", [{"progress": "step one done"}, {"sleep": 300}])
    deadline = time.monotonic() + 15
    while (await first.engine.store.get_task(task.task_id)).progress is None:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    _, attempts = await first.engine.get_task(task.task_id)
    old_pgid = attempts[-1].pgid or -1
    # A crash: the first incarnation vanishes without shutting down its workers.
    for pending in list(first.engine.runtime.background):
        pending.cancel()
    await first.host.server.stop(0)
    await first.worker_server.stop(0)
    first.sockets.close()
    assert group_alive(old_pgid)

    second = await start_harness(tmp_path, db=first.db)
    try:
        assert not group_alive(old_pgid), "recovery must stop the earlier incarnation's worker"
        requeued = await second.engine.store.get_task(task.task_id)
        assert requeued.state == State.QUEUED
        assert requeued.restart_resume and requeued.restart_resume.last_progress == "step one done"
        await second.engine.dispatch_once()
        resumed = await second.wait(task.task_id, [State.RUNNING])
        assert resumed.restart_resume and not resumed.restart_resume.pending and resumed.failure is None
        _, attempts = await second.engine.get_task(task.task_id)
        assert len(attempts) == 2 and attempts[1].boot_id == second.engine.boot_id
    finally:
        await second.close()


async def test_finished_tasks_past_the_retention_are_deleted_with_their_attempts(tmp_path: Path) -> None:
    """The engine's retention pass on tasks its workers ran: a task that never asked leaves no
    question to close, so it goes once it has been finished for the retention; what is newer stays."""
    day = 86_400_000
    h = await start_harness(tmp_path, finished_task_retention_ms=30 * day)
    try:
        old = await running(h, "behave", [{"result": {"text": "done"}}])
        await h.wait(old.task_id, [State.COMPLETED])
        assert len((await h.engine.get_task(old.task_id))[1]) == 1
        h.clock.advance(30 * day)
        recent = await h.create("behave")  # created now: within the retention, and the log's newest event

        assert (await h.engine.history_retention.prune_once(h.clock.now_ms())).tasks == 0  # not yet 30 days
        h.clock.advance(1)
        pruned = await h.engine.history_retention.prune_once(h.clock.now_ms())

        assert (pruned.tasks, pruned.attempts) == (1, 1) and pruned.events >= 3  # created, running, completed
        with pytest.raises(TaskNotFound):
            await h.engine.get_task(old.task_id)
        assert (await h.engine.store.get_task(recent.task_id)).state == State.QUEUED
    finally:
        await h.close()
