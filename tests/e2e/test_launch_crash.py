"""A scheduler SIGKILLed in the middle of a launch leaves no untracked worker after restart.

The scheduler runs as its own process with the fault-injection setting
``fault_hold_launch_ms``, which holds each launch after the worker was released (its
identity and `running` committed together while it was still held) and before the
launch has finished: the exit is not being waited for yet. The test kills it there,
once the worker has started a child that left its group, restarts it, and checks that
start-up recovery stopped what remained of the attempt (its cgroup, or its recorded
identity, group and descendants) before dispatching the task again.

Before the running commit the worker is still held: a kill there leaves a trampoline
that exits unreleased, and an attempt row still `launching` (``test_launch.py``).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from libs import proctree
from taskgate.scheduler.v1 import scheduler_pb2 as pb
from taskgate.scheduler.v1 import scheduler_pb2_grpc as pb_grpc
from tests.support.procs import ServiceProcess, free_port
from tests.support.procs import channel as service_channel
from tests.support.stack import worker_socket_dir
from tests.unit.scheduler.test_proof import cgroups_available

CONFIG = """
[tasks]
cancel_grace_ms = 300
cleanup_confirm_ms = 1500
supervisor_interval_ms = 100
proof_mode = "{mode}"

[workers.default-worker]
command = ["sh", "-c", {command}]
"""

# cgroup mode: even a daemon that left session and group is found by its cgroup.
# subreaper-only mode: the recorded identity, group and descendants are what recovery can prove.
COMMANDS = {
    "cgroup": "setsid sh -c 'sleep 33 &'; sleep 300",
    "cgroup_v1": "setsid sh -c 'sleep 33 &'; sleep 300",
    "subreaper": "sleep 33 & sleep 300",
}


def log_events(proc: ServiceProcess, event: str) -> list[dict[str, object]]:
    found = []
    for line in proc.logs().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("event") == event:
            found.append(record)
    return found


def the_workers(leader: int, leader_start: int) -> list[proctree.ProcStat]:
    """Live processes of the launched worker: the `sh` leader and its `sleep 33` (not the passing shells)."""
    found = []
    for stat in proctree.process_table().values():
        if not stat.alive or stat.start_time < leader_start:
            continue
        try:
            cmdline = Path(f"/proc/{stat.pid}/cmdline").read_bytes()
        except OSError:
            continue
        if cmdline == b"sleep\x0033\x00" or stat.pid == leader:
            found.append(stat)
    return found


def recorded_descendants(stub: pb_grpc.SchedulerServiceStub, task_id: str) -> set[tuple[int, int]]:
    attempt = stub.GetTask(pb.GetTaskRequest(task_id=task_id), timeout=10).task.attempts[0]
    return {(d.pid, d.start_time) for d in attempt.descendants}


def _gone_for_good(pid: int) -> bool:
    """Reap ``pid`` if it is this process's child (a subreaper test runner inherits orphans);
    True once no process, not even a zombie, has it."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    return proctree.read_stat(pid) is None


@pytest.mark.parametrize(
    ("mode", "leader_dies_meanwhile"),
    [
        pytest.param("cgroup", False, marks=pytest.mark.skipif(not cgroups_available(), reason="no usable cgroup v2")),
        pytest.param("cgroup_v1", False, marks=pytest.mark.skipif(not cgroups_available((1,)), reason="no v1 freezer")),
        ("subreaper", False),
        # The worker's `sh` dies while no scheduler runs: its group has no leader any more, and
        # only the children the supervisor recorded before the kill tie it to the attempt.
        ("subreaper", True),
    ],
)
def test_a_scheduler_killed_mid_launch_leaves_no_untracked_worker(
    tmp_path: Path, mode: str, leader_dies_meanwhile: bool
) -> None:
    config = tmp_path / "taskgate.toml"
    config.write_text(CONFIG.format(mode=mode, command=json.dumps(COMMANDS[mode])))
    addr = f"127.0.0.1:{free_port()}"
    env = {
        "TASKGATE_CONFIG": str(config),
        "TASKGATE_DATA_DIR": str(tmp_path / "data"),
        "TASKGATE_SCHEDULER_ADDR": addr,
        "TASKGATE_TELEMETRY_ADDR": f"127.0.0.1:{free_port()}",
        "TASKGATE_PENDING_ADDR": f"127.0.0.1:{free_port()}",
        "TASKGATE_WORKER_SOCKET_DIR": worker_socket_dir(),  # removed when the run ends
        "TASKGATE_TASKS_FAULT_HOLD_LAUNCH_MS": "600000",
    }
    first = ServiceProcess("services.scheduler", env, tmp_path / "first.log", addr).start()
    survivors: list[proctree.ProcStat] = []
    second = None
    try:
        with service_channel(addr, env) as channel:
            stub = pb_grpc.SchedulerServiceStub(channel)
            task = stub.CreateTask(
                pb.CreateTaskRequest(agent_id="agent-1", session_id="cli-1", title="held"), timeout=10
            ).task
            deadline = time.monotonic() + 20
            while not (held := log_events(first, "fault_hold_launch")):
                assert time.monotonic() < deadline, first.logs()[-3000:]
                time.sleep(0.02)
            leader = int(held[0]["pid"])  # type: ignore[call-overload]
            leader_start = proctree.start_time_of(leader)
            assert leader_start is not None
            deadline = time.monotonic() + 10
            while len(survivors := the_workers(leader, leader_start)) < 2:
                assert time.monotonic() < deadline, "the released worker did not start its child"
                time.sleep(0.02)
            assert stub.GetTask(pb.GetTaskRequest(task_id=task.task_id), timeout=10).task.state == pb.TASK_STATE_RUNNING
            if leader_dies_meanwhile:
                child = next(p for p in survivors if p.pid != leader)
                deadline = time.monotonic() + 10
                while (child.pid, child.start_time) not in recorded_descendants(stub, task.task_id):
                    assert time.monotonic() < deadline, "the supervisor did not record the worker's child"
                    time.sleep(0.05)
        first.kill()  # SIGKILL before the launch has finished
        assert all(proctree.identity_matches(p.pid, p.start_time) for p in survivors), "the worker outlived it"
        if leader_dies_meanwhile:
            os.kill(leader, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while not _gone_for_good(leader):
                assert time.monotonic() < deadline, "the killed leader was never reaped"
                time.sleep(0.02)
            survivors = [p for p in survivors if p.pid != leader]
            assert proctree.live_group_members(proctree.process_table(), leader), "its group lives on without it"

        second = ServiceProcess(
            "services.scheduler", {**env, "TASKGATE_TASKS_FAULT_HOLD_LAUNCH_MS": "0"}, tmp_path / "second.log", addr
        ).start()
        deadline = time.monotonic() + 20
        while any(proctree.identity_matches(p.pid, p.start_time) for p in survivors):
            assert time.monotonic() < deadline, f"untracked worker left running:\n{second.logs()[-3000:]}"
            time.sleep(0.05)
        recovered = log_events(second, "recovered_task")
        assert recovered and recovered[0]["confirmed"] is True and recovered[0]["task_id"] == task.task_id
        with service_channel(addr, env) as channel:
            stub = pb_grpc.SchedulerServiceStub(channel)
            deadline = time.monotonic() + 20
            while True:
                current = stub.GetTask(pb.GetTaskRequest(task_id=task.task_id), timeout=10).task
                if current.state == pb.TASK_STATE_RUNNING and len(current.attempts) == 2:
                    break
                assert time.monotonic() < deadline, current
                time.sleep(0.05)
            assert current.attempts[0].outcome == "interrupted" and current.attempts[0].pid == leader
            assert current.restart_resume.count == 1, "resumed as after any interruption"
            stub.CancelTask(pb.CancelTaskRequest(task_id=task.task_id), timeout=30)
    finally:
        first.kill()
        if second is not None:
            second.stop()
        for p in survivors:
            if proctree.identity_matches(p.pid, p.start_time):
                if p.pgid == p.pid:  # the leader: its whole group (the `sleep 300` too)
                    os.killpg(p.pgid, signal.SIGKILL)
                os.kill(p.pid, signal.SIGKILL)
