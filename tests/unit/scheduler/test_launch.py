"""The launch protocol: the attempt row is committed before the fork, the identity and
`running` in one commit before the worker is released, and a failure after the spawn
stops the tree. Real workers, a real gRPC worker listener, SQLite and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from libs import proctree
from libs.db import Database
from libs.settings import WorkerProfile
from services.scheduler import cgroups, domain, processes
from services.scheduler.domain import Cancellation, State
from services.scheduler.store import MIGRATIONS, SchedulerStore
from tests.support.postgres import fresh_database
from tests.unit.scheduler.test_engine import start_harness
from tests.unit.scheduler.test_proof import cgroups_available


async def test_30_concurrent_launches_and_first_reports_on_postgres(tmp_path: Path, postgres_url: str) -> None:
    db = Database(fresh_database(postgres_url, "launch"), MIGRATIONS)
    h = await start_harness(tmp_path, db=db, max_running=30)
    try:
        # The workers' first calls (assignment, progress) race the other launches' commits.
        tasks = [await h.create("behave", [{"progress": f"hello {i}"}], title=f"t{i}") for i in range(30)]
        assert await h.engine.dispatch_once() == 30
        for task in tasks:
            done = await h.wait(task.task_id, [State.COMPLETED, State.FAILED], timeout_s=60)
            assert done.state == State.COMPLETED, done.failure
            assert done.progress is not None and done.progress.text.startswith("hello")
            _, attempts = await h.engine.get_task(task.task_id)
            assert len(attempts) == 1 and attempts[0].state == "ended" and attempts[0].first_contact_at is not None
        assert not h.engine.runtime.live, "no running slot leaked"
        assert len(h.engine.runtime.locks) == 0, "no per-task lock is kept after the task's end"
    finally:
        await h.close()


async def test_the_attempt_is_committed_launching_before_the_fork_and_running_before_the_release(
    tmp_path: Path,
) -> None:
    h = await start_harness(tmp_path)
    store: SchedulerStore = h.engine.store
    seen: list[Any] = []
    real_launching = store.begin_launch
    real_update = store.update_task

    async def spy_launching(task_id: str, plan: Any) -> Any:
        begun = await real_launching(task_id, plan)
        assert begun is not None
        attempt = begun[2]
        assert attempt is not None
        seen.append(("begin", attempt.state, attempt.pid, bool(attempt.token_hash)))
        return begun

    async def spy_update(
        task_id: str, change: Any, event_type: Any, at: int, attempt: Any = None, legacy_adoption: bool = False
    ) -> Any:
        out = await real_update(task_id, change, event_type, at, attempt=attempt, legacy_adoption=legacy_adoption)
        if attempt is not None and attempt.pid is not None:
            # Committed now; the launch has not gone on to the release yet.
            task, attempts = await h.engine.get_task(task_id)
            cmdline = Path(f"/proc/{attempt.pid}/cmdline").read_bytes()
            last = attempts[-1]
            seen.append(("commit", task.state, last.state, last.pid, last.pid_start_time, cmdline))
        return out

    # The first save checks the task is still queued and this host's (see store.begin_launch).
    store.begin_launch = spy_launching  # type: ignore[method-assign]
    store.update_task = spy_update  # type: ignore[method-assign]
    try:
        task = await h.create("sleeper")
        assert await h.engine.dispatch_once() == 1
        await h.wait(task.task_id, [State.RUNNING])
        # First: launching without a pid (before the fork).
        assert seen[0] == ("begin", "launching", None, True)
        # Then the identity and `running` in one commit, while the worker is still held: its
        # command line is still the hold's, `sleep 300` not exec'd yet.
        _, state, attempt_state, pid, start_time, cmdline = seen[1]
        assert state == State.RUNNING and attempt_state == "running"
        assert pid is not None and start_time == proctree.start_time_of(pid)
        assert cmdline.endswith(b"sleep\x00300\x00") and cmdline != b"sleep\x00300\x00", cmdline
        deadline = time.monotonic() + 10
        while Path(f"/proc/{pid}/cmdline").read_bytes() != b"sleep\x00300\x00":
            assert time.monotonic() < deadline, "the worker was never released"
            await asyncio.sleep(0.01)
    finally:
        store.begin_launch = real_launching  # type: ignore[method-assign]
        store.update_task = real_update  # type: ignore[method-assign]
        await h.close()


async def test_a_cancel_committed_during_the_launch_keeps_the_held_worker_from_running(tmp_path: Path) -> None:
    """Another host's cancel of a task whose launch has begun is ``cancel_requested``; found at
    the running commit, the held worker is never released: it exits without exec'ing, and the
    task is cancelled with its identity recorded."""
    marker = tmp_path / "ran"
    h = await start_harness(tmp_path, workers={"marker": WorkerProfile(command=["touch", str(marker)])})
    store: SchedulerStore = h.engine.store
    real_update = store.update_task

    async def cancelled_meanwhile(
        task_id: str, change: Any, event_type: Any, at: int, attempt: Any = None, legacy_adoption: bool = False
    ) -> Any:
        if attempt is not None and attempt.pid is not None and attempt.state == "running":
            cancellation = Cancellation(requested_at=at, cause=domain.USER_CANCELED)
            await real_update(task_id, lambda t: domain.request_cancel(t, cancellation, at), "task.state_changed", at)
        return await real_update(task_id, change, event_type, at, attempt=attempt, legacy_adoption=legacy_adoption)

    store.update_task = cancelled_meanwhile  # type: ignore[method-assign]
    try:
        task = await h.create("marker")
        await h.engine.dispatch_once()
        done = await h.wait(task.task_id, [State.CANCELLED, State.FAILED, State.COMPLETED])
        assert done.state == State.CANCELLED
        _, attempts = await h.engine.get_task(task.task_id)
        assert attempts[-1].pid is not None and attempts[-1].pid_start_time is not None
        assert attempts[-1].state == "ended"
        assert not marker.exists(), "the held worker was released"
    finally:
        store.update_task = real_update  # type: ignore[method-assign]
        await h.close()


async def test_a_shutdown_during_the_running_commit_never_runs_the_held_worker(tmp_path: Path) -> None:
    """The scheduler shuts down while a launch's identity-and-running commit is under way: the
    dispatcher (and the launch) are cancelled, the commit lands all the same (a group commit's
    unit runs whatever its caller does), and the shutdown's stop of the live attempts stops the
    held worker — never released — and re-queues the task for resumption."""
    marker = tmp_path / "ran"
    h = await start_harness(tmp_path, workers={"marker": WorkerProfile(command=["touch", str(marker)])})
    store: SchedulerStore = h.engine.store
    real_update = store.update_task
    at_commit, gate = asyncio.Event(), asyncio.Event()

    async def commit_under_way(
        task_id: str, change: Any, event_type: Any, at: int, attempt: Any = None, legacy_adoption: bool = False
    ) -> Any:
        if attempt is not None and attempt.pid is not None and attempt.state == "running":
            at_commit.set()

            async def lands_later() -> Any:
                await gate.wait()
                return await real_update(
                    task_id, change, event_type, at, attempt=attempt, legacy_adoption=legacy_adoption
                )

            return await asyncio.shield(asyncio.ensure_future(lands_later()))
        return await real_update(task_id, change, event_type, at, attempt=attempt, legacy_adoption=legacy_adoption)

    store.update_task = commit_under_way  # type: ignore[method-assign]
    task = await h.create("marker")
    dispatcher = asyncio.create_task(h.engine.launcher.dispatch_loop())
    h.engine._loops.append(dispatcher)  # as start() does: the shutdown cancels it first
    h.engine.runtime.wake.set()
    try:
        await asyncio.wait_for(at_commit.wait(), 15)
        held = h.engine.runtime.live[task.task_id].attempt
        assert held.pid is not None and held.pid_start_time is not None
        shutdown = asyncio.create_task(h.engine.shutdown())
        await asyncio.wait_for(asyncio.gather(dispatcher, return_exceptions=True), 15)
        gate.set()  # the commit lands while the shutdown stops what lives
        await asyncio.wait_for(shutdown, 30)
        stored = await store.get_task(task.task_id)
        assert stored.state == State.QUEUED, "re-queued for resumption"
        (attempt,) = await store.attempts_of(task.task_id)
        assert attempt.state == "ended" and attempt.pid == held.pid
        assert not proctree.identity_matches(held.pid, held.pid_start_time), "the held worker is gone"
        assert not marker.exists(), "and it never ran"
    finally:
        gate.set()
        store.update_task = real_update  # type: ignore[method-assign]
        await h.close()


async def test_a_fast_workers_first_report_finds_its_task_running(tmp_path: Path) -> None:
    # The launch pauses after the release (generous: the worker must start and report within it),
    # so the report comes before the launch has finished: `running` committed before the release.
    h = await start_harness(tmp_path, fault_hold_launch_ms=6000)
    try:
        task = await h.create("behave", [{"progress": "early bird"}, {"sleep": 300}])
        dispatch = asyncio.create_task(h.engine.dispatch_once())
        deadline = time.monotonic() + 15
        while (current := await h.engine.store.get_task(task.task_id)).progress is None:
            assert time.monotonic() < deadline, "the worker never reported"
            await asyncio.sleep(0.02)
        assert current.state == State.RUNNING and current.progress and current.progress.text == "early bird"
        assert await dispatch == 1
    finally:
        await h.close()


async def test_a_failure_after_the_spawn_stops_the_tree(tmp_path: Path) -> None:
    h = await start_harness(tmp_path)
    store: SchedulerStore = h.engine.store
    real_update = store.update_task

    async def failing(
        task_id: str, change: Any, event_type: Any, at: int, attempt: Any = None, legacy_adoption: bool = False
    ) -> Any:
        if attempt is not None and attempt.state == "running":
            raise RuntimeError("the database went away")
        return await real_update(task_id, change, event_type, at, attempt=attempt, legacy_adoption=legacy_adoption)

    store.update_task = failing  # type: ignore[method-assign]
    try:
        task = await h.create("sleeper")
        assert await h.engine.dispatch_once() == 0
        done = await h.wait(task.task_id, [State.FAILED])
        assert done.failure and done.failure.code == "WORKER_LAUNCH_FAILED"
        _, attempts = await h.engine.get_task(task.task_id)
        assert attempts[0].pid is not None and attempts[0].outcome == "launch_failed"
        assert not proctree.identity_matches(attempts[0].pid, attempts[0].pid_start_time or -1)
        assert not h.engine.runtime.live and not h.engine.runtime.by_token
    finally:
        store.update_task = real_update  # type: ignore[method-assign]
        await h.close()


async def test_any_error_before_the_release_fails_the_launch_and_frees_its_slot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from services.scheduler import processes

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the cgroup write went wrong in an unexpected way")

    h = await start_harness(tmp_path)
    try:
        monkeypatch.setattr(processes, "launch", broken)
        task = await h.create("sleeper")
        assert await h.engine.dispatch_once() == 0
        # Never left queued with a leaked running slot (dispatch would skip it forever).
        done = await h.wait(task.task_id, [State.FAILED], timeout_s=5)
        assert done.failure and done.failure.code == "WORKER_LAUNCH_FAILED"
        assert "unexpected way" in done.failure.message
        _, attempts = await h.engine.get_task(task.task_id)
        assert attempts[0].state == "ended" and attempts[0].outcome == "launch_failed"
        assert not h.engine.runtime.live and not h.engine.runtime.by_token
        assert not h.engine.ownership.owned
    finally:
        await h.close()


@pytest.mark.parametrize("command", [["/nonexistent/worker"], ["no-such-worker-command"]])
async def test_a_worker_that_cannot_start_fails_the_launch(tmp_path: Path, command: list[str]) -> None:
    from libs.settings import WorkerProfile

    h = await start_harness(tmp_path, workers={"broken": WorkerProfile(command=command)})
    try:
        task = await h.create("broken")
        await h.engine.dispatch_once()
        done = await h.wait(task.task_id, [State.FAILED])
        assert done.failure and done.failure.code == "WORKER_LAUNCH_FAILED"
        _, attempts = await h.engine.get_task(task.task_id)
        assert attempts[0].state == "ended" and attempts[0].outcome == "launch_failed"
    finally:
        await h.close()


async def test_a_profile_whose_user_cannot_be_used_fails_its_tasks_clearly(tmp_path: Path) -> None:
    from libs.settings import WorkerProfile

    h = await start_harness(tmp_path, workers={"ghost": WorkerProfile(command=["true"], user="no-such-user-tg")})
    try:
        task = await h.create("ghost")
        await h.engine.dispatch_once()
        done = await h.wait(task.task_id, [State.FAILED])
        assert done.failure and done.failure.code == "WORKER_LAUNCH_FAILED"
        assert "no-such-user-tg" in done.failure.message
    finally:
        await h.close()


@pytest.mark.skipif(not cgroups_available(), reason="no usable cgroup v2")
async def test_a_cancel_reaching_an_unfinished_launch_of_an_earlier_boot_stops_it_first(tmp_path: Path) -> None:
    """An earlier incarnation died between the spawn and the running commit: its attempt is
    `launching`, with no pid yet, and its held worker is in the attempt's cgroup."""
    from services.scheduler.engine import Engine

    first = await start_harness(tmp_path, proof_mode="cgroup")
    store: SchedulerStore = first.engine.store
    real_update = store.update_task
    at_commit = asyncio.Event()

    async def dies_before_running(
        task_id: str, change: Any, event_type: Any, at: int, attempt: Any = None, legacy_adoption: bool = False
    ) -> Any:
        if attempt is not None and attempt.pid is not None:
            at_commit.set()
            await asyncio.Event().wait()  # the first incarnation goes no further
        return await real_update(task_id, change, event_type, at, attempt=attempt, legacy_adoption=legacy_adoption)

    store.update_task = dies_before_running  # type: ignore[method-assign]
    task = await first.create("sleeper")
    dispatch = asyncio.create_task(first.engine.dispatch_once())
    await asyncio.wait_for(at_commit.wait(), 15)
    (attempt,) = await store.attempts_of(task.task_id)
    assert attempt.state == "launching" and attempt.pid is None and attempt.cgroup
    (held,) = cgroups.members(Path(attempt.cgroup))
    start = proctree.start_time_of(held)
    assert start is not None
    dispatch.cancel()
    await asyncio.gather(dispatch, return_exceptions=True)
    await first.worker_server.stop(0)
    await first.host.server.stop(0)
    first.sockets.close()
    store.update_task = real_update  # type: ignore[method-assign]
    second = Engine(first.engine.settings, SchedulerStore(first.db))  # before its recovery ran
    try:
        assert proctree.identity_matches(held, start), "the held worker lives on (its hold pipe is still open)"
        done = await second.cancel(task.task_id, wait_s=10)
        assert done.state == State.CANCELLED, "the queued task's launch is stopped before it is cancelled"
        assert not proctree.identity_matches(held, start)
    finally:
        if proctree.identity_matches(held, start):
            os.kill(held, 9)
        await first.engine.ownership.close()
        first.db.close()


async def test_200_fast_exiting_workers_all_record_their_identity_and_complete(tmp_path: Path) -> None:
    # /bin/true exits at once: its kernel start time must still be read while it is held.
    h = await start_harness(tmp_path, workers={"true": WorkerProfile(command=["/bin/true"])}, max_running=50)
    try:
        tasks = [await h.create("true", title=f"t{i}") for i in range(200)]

        async def dispatch() -> None:
            while True:
                await h.engine.dispatch_once()
                await asyncio.sleep(0.01)

        dispatcher = asyncio.create_task(dispatch())
        for task in tasks:
            done = await h.wait(task.task_id, [State.COMPLETED, State.FAILED], timeout_s=120)
            assert done.state == State.COMPLETED, done.failure
        dispatcher.cancel()
        for task in tasks:
            _, attempts = await h.engine.get_task(task.task_id)
            (attempt,) = attempts
            assert attempt.pid is not None and attempt.pid_start_time is not None, attempt
            assert attempt.exit_code == 0 and attempt.outcome == "exited"
            # The moment before its reap is stored with the exit: a later look can tell this
            # group's leftovers from a reused pid's group.
            assert attempt.group_held_ticks is not None and attempt.group_held_ticks >= attempt.pid_start_time
    finally:
        await h.close()


class FakeRegistry:
    """The pending-registry as the engine sees it: every question is answered at once."""

    def __init__(self) -> None:
        self.closed: list[str] = []

    async def ask(self, task_id: str, session_id: str, text: str, request_id: str) -> Any:
        return SimpleNamespace(question_id=f"q-{task_id}", revision=1, answer="")

    async def await_answer(self, question_id: str, wait_s: float) -> Any:
        return SimpleNamespace(question_id=question_id, revision=2, answer="yes")

    async def cancel_open(self, task_id: str) -> None:
        self.closed.append(task_id)


async def test_only_a_task_that_asked_has_its_questions_closed_at_its_end(tmp_path: Path) -> None:
    h = await start_harness(tmp_path)
    registry = FakeRegistry()
    h.engine.runtime.questions = registry
    try:
        quiet = await h.create("behave", [{"progress": "no questions"}])
        asking = await h.create("behave", [{"ask": "go on?"}])
        assert await h.engine.dispatch_once() == 2
        for task in (quiet, asking):
            done = await h.wait(task.task_id, [State.COMPLETED, State.FAILED], timeout_s=60)
            assert done.state == State.COMPLETED, done.failure
        await h.engine.runtime.drain_background()
        await h.engine.close_questions_once()  # the outbox holds a row only for the task that asked
        assert registry.closed == [asking.task_id]
        assert await h.engine.runtime.store.due_question_closes(h.engine.runtime.clock.now_ms() + 10**9) == []
    finally:
        await h.close()


class OrderedRegistry(FakeRegistry):
    """Records, at each question sent, whether the task's row already said it may have asked."""

    def __init__(self, store: SchedulerStore) -> None:
        super().__init__()
        self.store = store
        self.marked_first: list[bool] = []

    async def ask(self, task_id: str, session_id: str, text: str, request_id: str) -> Any:
        self.marked_first.append((await self.store.get_task(task_id)).may_have_asked)
        return await super().ask(task_id, session_id, text, request_id)


async def test_a_scheduler_that_did_not_create_a_task_knows_whether_it_asked(tmp_path: Path) -> None:
    """What a task asked is in its row, not in the memory of the scheduler that created it: a
    restarted scheduler (or another replica) ends a task that never asked without a call to the
    registry, and closes the questions of one that did. The row says so before the registry
    can hold the question, so a crash between the two still leaves the task closed at its end."""
    first = await start_harness(tmp_path)
    try:
        quiet = await first.create("behave", [{"progress": "no questions"}])
        asking = await first.create("behave", [{"ask": "go on?"}])
    finally:
        await first.close(db=False)
    second = await start_harness(tmp_path, db=first.db)
    registry = OrderedRegistry(second.engine.runtime.store)
    second.engine.runtime.questions = registry
    try:
        assert await second.engine.dispatch_once() == 2
        for task in (quiet, asking):
            done = await second.wait(task.task_id, [State.COMPLETED, State.FAILED], timeout_s=60)
            assert done.state == State.COMPLETED, done.failure
        await second.engine.runtime.drain_background()
        assert registry.marked_first == [True], "committed before the question was sent"
        await second.engine.close_questions_once()
        assert registry.closed == [asking.task_id]
    finally:
        await second.close()


async def test_the_dispatch_loop_fills_a_freed_slot_while_another_launch_is_still_under_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim's launches are not waited for together: with A's launch held up, B ends and its
    slot takes C at once — before A runs (the loop used to wait for the whole claim)."""
    h = await start_harness(tmp_path, workers={"quick": WorkerProfile(command=["true"])}, max_running=2)
    slow_launch = asyncio.Event()
    real_launch = processes.launch

    async def launch(command: Any, cwd: Path, env: Any, log_path: Path, token: str, **kw: Any) -> Any:
        if log_path.name.startswith(a.task_id):
            await slow_launch.wait()
        return await real_launch(command, cwd, env, log_path, token, **kw)

    monkeypatch.setattr(processes, "launch", launch)
    dispatcher: asyncio.Task[None] | None = None
    try:
        a = await h.create("quick", title="a")
        b = await h.create("quick", title="b")
        dispatcher = asyncio.create_task(h.engine.launcher.dispatch_loop())
        h.engine.runtime.wake.set()
        await h.wait(b.task_id, [State.COMPLETED])
        c = await h.create("quick", title="c")
        await h.wait(c.task_id, [State.COMPLETED])
        assert (await h.engine.store.get_task(a.task_id)).state == State.QUEUED, "A's launch is still held"
        slow_launch.set()
        await h.wait(a.task_id, [State.COMPLETED])
    finally:
        slow_launch.set()
        if dispatcher is not None:
            dispatcher.cancel()
            await asyncio.gather(dispatcher, return_exceptions=True)
        await h.close()


def launch_steps() -> dict[str, tuple[float, float]]:
    """taskgate_task_launch_step_seconds so far: (count, sum) per step."""
    from prometheus_client import REGISTRY

    from services.scheduler.metrics import LAUNCH_STEPS

    def value(name: str, step: str) -> float:
        return REGISTRY.get_sample_value(name, {"step": step}) or 0.0

    return {
        step: (
            value("taskgate_task_launch_step_seconds_count", step),
            value("taskgate_task_launch_step_seconds_sum", step),
        )
        for step in LAUNCH_STEPS
    }


async def test_each_launch_times_its_steps_and_a_failed_one_none(tmp_path: Path) -> None:
    """A launch that reaches `running` observes its four steps once each, and together they
    cover its claim-to-running time; one that fails at the spawn observes none."""
    h = await start_harness(tmp_path, workers={"missing": WorkerProfile(command=["/nonexistent/worker"])})
    try:
        before = launch_steps()
        began = time.perf_counter()
        task = await h.create("sleeper")
        assert await h.engine.dispatch_once() == 1
        await h.wait(task.task_id, [State.RUNNING])
        took = time.perf_counter() - began
        after = launch_steps()
        for step, (count, total) in after.items():
            assert count == before[step][0] + 1, step
            assert total >= before[step][1], step
        spent = sum(after[step][1] - before[step][1] for step in after)
        assert 0 < spent <= took
        failing = await h.create("missing")
        await h.engine.dispatch_once()
        await h.wait(failing.task_id, [State.FAILED])
        assert launch_steps() == after, "a failed launch is not timed as one that ran"
    finally:
        await h.close()


async def test_the_running_change_is_dated_when_the_worker_was_spawned_not_when_the_launch_began(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claim commit and the spawn come between a launch's start and its `running` commit
    (tens of ms under load): the change, its event and `updatedAt` carry the spawn's time, so a
    running task is never updated before it started."""
    h = await start_harness(tmp_path, workers={"quick": WorkerProfile(command=["true"])})
    real_launch = processes.launch

    async def slow_spawn(*args: Any, **kw: Any) -> Any:
        h.clock.advance(250)  # the spawn took a quarter of a second
        return await real_launch(*args, **kw)

    monkeypatch.setattr(processes, "launch", slow_spawn)
    try:
        task = await h.create("quick", title="dated")
        began = h.clock.now
        assert await h.engine.dispatch_once() == 1
        await h.wait(task.task_id, [State.COMPLETED])
        _, events = await h.engine.store.events_after(0, (), 100)
        running = [e for e in events if e.task.task_id == task.task_id and e.task.state == State.RUNNING]
        assert len(running) == 1
        started = running[0].task.started_at
        assert started == began + 250, "started when spawned"
        assert running[0].at == started, "the event is dated with the change, not the launch's start"
        assert running[0].task.updated_at == started
    finally:
        await h.close()
