"""The worker log tail: bounded, the latest attempt by default, never through a symlink;
and GetWorkerLog over a real in-process gRPC server with a real worker's output."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from libs.errors import FailedPrecondition
from services.scheduler.domain import InvalidArgument, State
from services.scheduler.worker_log import (
    DEFAULT_TAIL_BYTES,
    MAX_TAIL_BYTES,
    attempt_log_path,
    legacy_attempt_log_path,
    open_for_worker,
    prune,
    read_tail,
    validate_tail_request,
)
from taskgate.scheduler.v1 import scheduler_pb2 as pb
from taskgate.scheduler.v1 import scheduler_pb2_grpc as pb_grpc
from tests.unit.scheduler.test_engine import Harness, start_harness

TASK = "a" * 32


def write_log(data_dir: Path, number: int, content: bytes) -> Path:
    path = attempt_log_path(data_dir, TASK, number)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path


def test_the_tail_is_bounded_and_says_when_there_is_more(tmp_path: Path) -> None:
    write_log(tmp_path, 1, b"0123456789")
    tail = read_tail(tmp_path, TASK, 1, 4)
    assert (tail.content, tail.size_bytes, tail.truncated) == (b"6789", 10, True)
    whole = read_tail(tmp_path, TASK, 1, 100)
    assert (whole.content, whole.truncated) == (b"0123456789", False)
    assert read_tail(tmp_path, TASK, 2, 100).content == b""  # no such log (yet): empty


def test_a_log_written_by_an_older_version_is_still_read(tmp_path: Path) -> None:
    old = legacy_attempt_log_path(tmp_path, TASK, 1)
    old.parent.mkdir(parents=True)
    old.write_bytes(b"from before")
    assert read_tail(tmp_path, TASK, 1, 100).content == b"from before"
    write_log(tmp_path, 1, b"now")  # the current layout wins where both exist
    assert read_tail(tmp_path, TASK, 1, 100).content == b"now"


def test_a_workers_log_is_private_and_never_created_through_a_symlink(tmp_path: Path) -> None:
    path = attempt_log_path(tmp_path, TASK, 1)
    os.close(open_for_worker(path))  # the folder is made on first use
    assert (path.stat().st_mode & 0o777, path.parent.stat().st_mode & 0o777) == (0o600, 0o700)
    secret = tmp_path / "gateway.secret"
    secret.write_text("s3cret")
    # A worker (same uid) aiming its next attempt's output at a caller secret:
    aimed = attempt_log_path(tmp_path, TASK, 2)
    os.symlink(secret, aimed)
    with pytest.raises(OSError):
        open_for_worker(aimed)
    assert secret.read_text() == "s3cret"


def test_bounds_of_a_request() -> None:
    assert validate_tail_request(0, 0) == DEFAULT_TAIL_BYTES
    assert validate_tail_request(3, MAX_TAIL_BYTES) == MAX_TAIL_BYTES
    for attempt, tail in ((0, MAX_TAIL_BYTES + 1), (0, -1), (-1, 10)):
        with pytest.raises(InvalidArgument):
            validate_tail_request(attempt, tail)


def test_a_symlinked_log_or_folder_is_not_followed(tmp_path: Path) -> None:
    secret = tmp_path / "secrets" / "gateway.secret"
    secret.parent.mkdir()
    secret.write_text("s3cret")
    log = attempt_log_path(tmp_path, TASK, 1)
    log.parent.mkdir(parents=True)
    os.symlink(secret, log)
    with pytest.raises(FailedPrecondition) as refused:
        read_tail(tmp_path, TASK, 1, 100)
    assert refused.value.reason == "WORKER_LOG_UNREADABLE"
    log.unlink()
    log.parent.rmdir()
    os.symlink(secret.parent, log.parent)  # the task's folder itself
    with pytest.raises(FailedPrecondition):
        read_tail(tmp_path, TASK, 1, 100)


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[Harness]:
    h = await start_harness(tmp_path)
    yield h
    await h.close()


async def test_get_worker_log_reads_the_latest_attempts_output(harness: Harness) -> None:
    task = await harness.create("behave", [{"print": "hello from the worker"}, {"result": {"text": "ok"}}])
    async with grpc.aio.insecure_channel(harness.engine.settings.scheduler_addr) as channel:
        stub = pb_grpc.SchedulerServiceStub(channel)
        before = await stub.GetWorkerLog(pb.GetWorkerLogRequest(task_id=task.task_id), timeout=5)
        assert (before.attempt_number, before.content, before.size_bytes) == (0, b"", 0)  # no attempt yet
        assert await harness.engine.dispatch_once() == 1
        await harness.wait(task.task_id, [State.COMPLETED])
        reply = await stub.GetWorkerLog(pb.GetWorkerLogRequest(task_id=task.task_id), timeout=5)
        assert reply.attempt_number == 1 and reply.content == b"hello from the worker\n" and not reply.truncated
        assert not reply.expired
        tail = await stub.GetWorkerLog(pb.GetWorkerLogRequest(task_id=task.task_id, tail_bytes=6), timeout=5)
        assert (tail.content, tail.size_bytes, tail.truncated) == (b"orker\n", 22, True)
        for bad in (
            pb.GetWorkerLogRequest(task_id=task.task_id, tail_bytes=MAX_TAIL_BYTES + 1),
            pb.GetWorkerLogRequest(task_id="../etc"),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.GetWorkerLog(bad, timeout=5)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        for missing in (
            pb.GetWorkerLogRequest(task_id="b" * 32),
            pb.GetWorkerLogRequest(task_id=task.task_id, attempt_number=2),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.GetWorkerLog(missing, timeout=5)
            assert refused.value.code() == grpc.StatusCode.NOT_FOUND


DAY_S = 86_400.0


def aged(path: Path, days: float, now: float) -> Path:
    os.utime(path, (now - days * DAY_S, now - days * DAY_S), follow_symlinks=False)
    return path


def log_of(data_dir: Path, task_id: str, number: int, content: bytes) -> Path:
    path = attempt_log_path(data_dir, task_id, number)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path


def test_logs_past_the_retention_are_deleted_unless_their_task_runs_here(tmp_path: Path) -> None:
    now = time.time()
    old = aged(log_of(tmp_path, "b" * 32, 1, b"old"), 8, now)
    live = aged(log_of(tmp_path, "c" * 32, 1, b"quiet worker"), 8, now)
    recent = aged(log_of(tmp_path, "d" * 32, 2, b"recent"), 6, now)
    legacy = legacy_attempt_log_path(tmp_path, "e" * 32, 1)
    legacy.parent.mkdir(parents=True)
    legacy.write_bytes(b"older version")
    aged(legacy, 9, now)
    pruned = prune(tmp_path, now - 7 * DAY_S, live={"c" * 32})
    assert not old.exists() and not legacy.exists()
    assert not legacy.parent.exists(), "an older version's folder goes once empty"
    assert live.exists(), "a running task keeps its log, however quiet"
    assert recent.exists()
    assert (pruned.files, pruned.bytes, pruned.kept_live) == (2, len(b"old") + len(b"older version"), 1)
    assert read_tail(tmp_path, "b" * 32, 1, 100).content == b"", "a pruned log reads as empty"


def test_pruning_deletes_a_link_never_its_target_and_leaves_folders(tmp_path: Path) -> None:
    """A worker of the scheduler's uid can write into the logs folder: what it puts there must
    not make the retention delete anything else."""
    now = time.time()
    secret = tmp_path / "secret.txt"
    secret.write_text("caller secret")
    aged(secret, 30, now)
    folder = attempt_log_path(tmp_path, TASK, 1).parent
    folder.mkdir(parents=True)
    link = folder / f"{'f' * 32}.attempt-1.log"
    link.symlink_to(secret)
    aged(link, 30, now)
    sub = folder / f"{'g' * 32}.attempt-1.log"
    sub.mkdir()
    (sub / "inside").write_text("x")
    aged(sub, 30, now)
    # The whole folder swapped for a link to elsewhere is not followed either.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    victim = elsewhere / "victim.attempt-1.log"
    victim.write_text("v")
    aged(victim, 30, now)
    notes = folder / "notes.txt"
    notes.write_text("n")
    aged(notes, 30, now)
    prune(tmp_path, now - 7 * DAY_S, live=set())
    assert not link.is_symlink() and secret.read_text() == "caller secret"
    assert (sub / "inside").exists(), "a folder is no log"
    assert notes.exists(), "only what is named as a log is deleted"
    # The folder, or the logs folder above it, swapped for a link to elsewhere: not followed.
    folder.rename(tmp_path / "moved")
    folder.symlink_to(elsewhere)
    prune(tmp_path, now - 7 * DAY_S, live=set())
    assert victim.exists()
    legacy_elsewhere = elsewhere / ("e" * 32)
    legacy_elsewhere.mkdir()
    kept = legacy_elsewhere / "attempt-1.log"
    kept.write_text("k")
    aged(kept, 30, now)
    logs = folder.parent
    logs.rename(tmp_path / "logs-moved")
    logs.symlink_to(elsewhere)
    prune(tmp_path, now - 7 * DAY_S, live=set())
    assert kept.exists()


async def test_the_scheduler_prunes_a_finished_tasks_log_and_keeps_a_running_ones(tmp_path: Path) -> None:
    h = await start_harness(tmp_path)
    try:
        done = await h.create("behave", [{"progress": "hi"}])
        assert await h.engine.dispatch_once() == 1
        await h.wait(done.task_id, [State.COMPLETED])
        running = await h.create("sleeper")
        assert await h.engine.dispatch_once() == 1
        await h.wait(running.task_id, [State.RUNNING])
        now = time.time()
        finished_log = aged(attempt_log_path(tmp_path, done.task_id, 1), 8, now)
        running_log = aged(attempt_log_path(tmp_path, running.task_id, 1), 8, now)
        pruned = await h.engine.log_retention.prune_once(now)
        assert (pruned.files, pruned.kept_live) == (1, 1)
        assert not finished_log.exists() and running_log.exists()
        # The tail says a deleted log apart from an empty one once the attempt is past the retention.
        gone = await h.engine.worker_log(done.task_id, 0, 0)
        assert (gone.attempt_number, gone.content, gone.expired) == (1, b"", False)  # ended just now (engine clock)
        h.clock.advance(7 * 86_400_000 + 1)
        gone = await h.engine.worker_log(done.task_id, 0, 0)
        assert (gone.attempt_number, gone.content, gone.expired) == (1, b"", True)
        assert not (await h.engine.worker_log(running.task_id, 0, 0)).expired  # still running: never expired
    finally:
        await h.close()


def test_a_stop_ends_a_long_pass_early(tmp_path: Path) -> None:
    now = time.time()
    for i in range(3000):
        aged(log_of(tmp_path, f"{i:032x}", 1, b"x"), 8, now)
    asked = 0

    def stop() -> bool:
        nonlocal asked
        asked += 1
        return asked > 1  # the shutdown comes during the pass

    pruned = prune(tmp_path, now - 7 * DAY_S, live=set(), stop=stop)
    assert 0 < pruned.files < 3000, pruned
    assert prune(tmp_path, now - 7 * DAY_S, live=set()).files == 3000 - pruned.files, "the next pass goes on"
