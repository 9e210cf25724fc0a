"""Restart recovery's holes, closed (issue 10 items 1, 3, 4): a finished worker's task is settled,
not run again; a cancel while recovering is honoured; recovery and session snapshots page through
every task; an answer starts a new revision."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import uuid
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import cast

from libs.db import Database
from libs.proctree import ProcStat, identity_matches, live_group_members, process_table
from libs.settings import WorkerProfile
from services.scheduler import subreaper
from services.scheduler.domain import Failure, PendingOutcome, State, Task
from services.scheduler.events import TaskEvent
from services.scheduler.store import MIGRATIONS, SchedulerStore
from tests.unit.scheduler.test_engine import Harness, group_alive, running, start_harness


async def test_a_worker_that_reported_its_result_and_exited_before_the_crash_is_settled(tmp_path: Path) -> None:
    first = await start_harness(tmp_path)
    task = await running(first, "behave", [{"result": {"text": "all done"}}, {"sleep": 300}])
    deadline = time.monotonic() + 15
    while (await first.engine.store.get_task(task.task_id)).result is None:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    _, attempts = await first.engine.get_task(task.task_id)
    pgid = attempts[-1].pgid or -1
    # A crash, and the worker exits meanwhile (here: is killed), so no one records its exit.
    for pending in list(first.engine.runtime.background):
        pending.cancel()
    await first.host.server.stop(0)
    await first.worker_server.stop(0)
    first.sockets.close()
    os.killpg(pgid, signal.SIGKILL)
    deadline = time.monotonic() + 15
    while group_alive(pgid):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)

    second = await start_harness(tmp_path, db=first.db)
    try:
        settled = await second.engine.store.get_task(task.task_id)
        assert settled.state == State.COMPLETED and settled.result and settled.result.text == "all done"
        assert settled.restart_resume is None, "not run again"
        _, attempts = await second.engine.get_task(task.task_id)
        assert len(attempts) == 1
    finally:
        await second.close()


def _is_sleep_300(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes() == b"sleep\x00300\x00"
    except OSError:
        return False


async def _worker_dies_while_no_scheduler_runs(tmp_path: Path, record_first: bool) -> tuple[Harness, Task, ProcStat]:
    """Subreaper mode (the group is all that ties leftovers to the attempt): a worker whose child
    lives in its group; (a supervisor pass records the child;) a crash; the worker dies and is
    reaped while no scheduler runs (init would reap it). Returns the crashed incarnation, the
    task and the child."""
    workers = {"family": WorkerProfile(command=["sh", "-c", "sleep 0.2; sleep 300 & wait"])}
    first = await start_harness(tmp_path, workers=workers, proof_mode="subreaper")
    task = await running(first, "family")
    _, attempts = await first.engine.get_task(task.task_id)
    leader, pgid = attempts[-1].pid or -1, attempts[-1].pgid or -1
    deadline = time.monotonic() + 15
    while not (children := [m for m in live_group_members(process_table(), pgid) if _is_sleep_300(m.pid)]):
        assert time.monotonic() < deadline, "the worker's child did not start"
        await asyncio.sleep(0.02)
    (child,) = children
    if record_first:
        await first.engine.supervise_once()
        _, attempts = await first.engine.get_task(task.task_id)
        assert (child.pid, child.start_time) in {(d.pid, d.start_time) for d in attempts[-1].descendants}
    for pending in list(first.engine.runtime.background):
        pending.cancel()
    await first.host.server.stop(0)
    await first.worker_server.stop(0)
    first.sockets.close()
    # Not a subreaper any more, as a dead scheduler is not: the child re-parents above this
    # process (to init), never to the next incarnation, which therefore cannot attribute it.
    subreaper.resign()
    os.kill(leader, signal.SIGKILL)
    os.waitpid(leader, 0)
    return first, task, child


async def test_a_recorded_child_left_by_a_worker_that_died_during_the_downtime_is_stopped(tmp_path: Path) -> None:
    first, task, child = await _worker_dies_while_no_scheduler_runs(tmp_path, record_first=True)
    try:
        second = await start_harness(tmp_path, db=first.db, proof_mode="subreaper")
        try:
            assert not identity_matches(child.pid, child.start_time), "the recorded child is the attempt's: stopped"
            recovered = await second.engine.store.get_task(task.task_id)
            assert recovered.state == State.QUEUED and recovered.restart_resume is not None
        finally:
            await second.close()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.pid, signal.SIGKILL)


async def test_an_unrecorded_child_of_a_worker_that_died_during_the_downtime_is_named_not_signalled(
    tmp_path: Path,
) -> None:
    """Nothing ties the leaderless group to the attempt: its id may have been reused while no
    scheduler watched. Cgroup mode would find the child by its cgroup; here the task waits for
    the operator."""
    first, task, child = await _worker_dies_while_no_scheduler_runs(tmp_path, record_first=False)
    try:
        second = await start_harness(tmp_path, db=first.db, proof_mode="subreaper")
        try:
            assert identity_matches(child.pid, child.start_time), "a process not provably the attempt's was signalled"
            recovered = await second.engine.store.get_task(task.task_id)
            assert recovered.state == State.NEEDS_RECONCILIATION and recovered.failure is not None
            assert str(child.pid) in recovered.failure.message and "may have been reused" in recovered.failure.message
        finally:
            await second.close()
    finally:
        os.kill(child.pid, signal.SIGKILL)


async def test_a_cancel_while_recovering_is_honoured_when_recovery_ends(tmp_path: Path) -> None:
    h = await start_harness(tmp_path)  # no dispatch loop: the task stays queued
    try:
        task = await h.create("sleeper")

        # As an earlier incarnation left it: running, now being recovered.
        for state in (State.RUNNING, State.RECOVERING):

            def move(t: Task, to: State = state) -> Task:
                t.state = to
                return t

            await h.engine.store.update_task(task.task_id, move, "task.state_changed", 1)
        answered = await h.engine.cancel(task.task_id)
        assert answered.state == State.RECOVERING and answered.cancellation is not None
        requeue = PendingOutcome(state=State.QUEUED, failure=Failure(code="GATEWAY_SHUTDOWN", message="restart"))
        settled = await h.engine.settler.settle(task.task_id, requeue, None)
        assert settled.state == State.CANCELLED and settled.cancellation
        assert settled.cancellation.cause == "user_canceled"
    finally:
        await h.close()


async def test_tasks_in_states_pages_through_every_task_and_keeps_to_a_session(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 's.db'}", MIGRATIONS)
    db.migrate()
    store = SchedulerStore(db)
    made: list[Task] = []
    for i in range(7):
        task = Task(
            task_id=uuid.uuid4().hex,
            agent_id="a",
            session_id="mine" if i % 2 else "other",
            title=f"t{i}",
            instructions="",
            profile="p",
            state=State.QUEUED,
            created_at=1000 + i // 3,  # equal created_at: the keyset breaks ties on the id
            updated_at=1000,
        )
        made.append((await store.create_task(task))[0])
    try:
        every = await store.tasks_in_states([State.QUEUED], page_size=2)
        assert [t.task_id for t in every] == [t.task_id for t in sorted(made, key=lambda t: (t.created_at, t.task_id))]
        assert len(await store.tasks_in_states([State.QUEUED], limit=3, page_size=2)) == 3
        mine = await store.tasks_in_states([State.QUEUED], session=("a", "mine"), page_size=2)
        assert {t.session_id for t in mine} == {"mine"} and len(mine) == 3
    finally:
        db.close()


class FlakyRegistry:
    """Refuses the first ``failures`` closes (as a registry that is down), then confirms."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.closed: list[str] = []

    async def ask(self, *args: object) -> object:
        raise AssertionError("not asked here")

    async def await_answer(self, *args: object) -> object:
        raise AssertionError("not asked here")

    async def cancel_open(self, task_id: str) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise ConnectionError("the pending-registry is unavailable")
        self.closed.append(task_id)


async def test_questions_of_a_finished_task_are_closed_through_an_outbox_until_confirmed(tmp_path: Path) -> None:
    h = await start_harness(tmp_path)
    registry = FlakyRegistry(failures=2)
    h.engine.questions = registry
    try:
        ended = await h.create("sleeper")
        store = h.engine.runtime.store
        await store.mark_may_have_asked(ended, h.clock.now)  # as a question sent to the registry does
        await h.engine.cancel(ended.task_id)  # queued → cancelled (user_canceled): its questions close
        paused = await h.create("sleeper")
        await store.mark_may_have_asked(paused, h.clock.now)
        await h.engine.cancel(paused.task_id, cause="paused")  # a pause keeps them
        assert await h.engine.close_questions_once() == 0 and registry.closed == []
        assert await h.engine.close_questions_once() == 0, "not due again before the backoff"
        for _ in range(2):
            h.clock.now += 30_000
            confirmed = await h.engine.close_questions_once()
        assert confirmed == 1 and registry.closed == [ended.task_id]
        h.clock.now += 60_000
        assert await h.engine.close_questions_once() == 0, "confirmed: never sent again"
        assert await h.engine.store.due_question_closes(h.clock.now) == []
    finally:
        await h.close()


async def test_reconciliation_finds_a_running_task_of_this_boot_with_no_live_attempt(tmp_path: Path) -> None:
    h = await start_harness(tmp_path)
    try:
        task = await running(h, "sleeper")
        assert await h.engine.reconcile_once() == 0, "a live attempt is not an orphan"
        _, attempts = await h.engine.get_task(task.task_id)
        pgid = attempts[-1].pgid or -1
        # The record of the attempt is lost (as after a failed commit): nothing follows it any more.
        for pending in list(h.engine.runtime.background):
            pending.cancel()
        h.engine.runtime.forget(h.engine.runtime.live[task.task_id])
        assert await h.engine.reconcile_once() == 1
        settled = await h.engine.store.get_task(task.task_id)
        assert settled.state == State.QUEUED and settled.restart_resume and settled.restart_resume.count == 1
        assert not group_alive(pgid), "its worker is stopped before the task is queued again"
    finally:
        await h.close()


async def test_a_watcher_drops_an_event_older_than_what_it_already_sent(tmp_path: Path) -> None:
    h = await start_harness(tmp_path)
    try:
        task = await h.create("sleeper")
        # An async generator (Watchers.watch_task), typed as the iterator the engine hands out.
        watch = cast(AsyncGenerator[TaskEvent, None], h.engine.watch_task(task.task_id))
        snapshot = await anext(watch)
        v = snapshot.task.version
        # Publishes of two commits arriving out of order (two database threads), then a later one.
        for version in (v + 2, v + 1, v + 3):
            h.engine.hub.publish("task.state_changed", 0, task.model_copy(update={"version": version}))
        got = [(await anext(watch)).task.version for _ in range(2)]
        assert got == [v + 2, v + 3]
        await watch.aclose()
        # Every committed change raises the version.
        cancelled = await h.engine.cancel(task.task_id)
        assert cancelled.version == (await h.engine.store.get_task(task.task_id)).version > v
    finally:
        await h.close()
