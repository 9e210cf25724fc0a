"""Telemetry end to end: the scheduler feeds each task's process-tree observations into its snapshot."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from taskgate.scheduler.v1 import scheduler_pb2 as pb
from taskgate.scheduler.v1 import scheduler_pb2_grpc as pb_grpc
from tests.e2e.conftest import Api
from tests.support.stack import Stack


def executions(
    api: Api, task_id: str, count: int, keep: Callable[[pb.Task], bool] = lambda t: True, timeout_s: float = 30.0
) -> list[pb.Execution]:
    """The next ``count`` task.execution events of a task (observation interval is 200 ms here)."""
    seen: list[pb.Execution] = []
    with api.stack.channel("scheduler") as channel:
        stream = pb_grpc.SchedulerServiceStub(channel).WatchTasks(
            pb.WatchTasksRequest(task_id=task_id), timeout=timeout_s
        )
        try:
            for event in stream:
                if event.type == pb.TASK_EVENT_TYPE_EXECUTION and keep(event.task):
                    seen.append(event.task.execution)
                    if len(seen) == count:
                        break
        finally:
            stream.cancel()
    return seen


def cancel(api: Api, task_id: str) -> None:
    api.request("POST", f"/tasks/{task_id}/cancel")
    api.wait_state(task_id, "cancelled", "needs_reconciliation")


def test_a_cpu_burning_worker_shows_rising_user_ticks(api: Api) -> None:
    task = api.create("burner", profile="behave", instructions=json.dumps([{"burn": 60}]))
    try:
        observed = executions(api, task["taskId"], 4, keep=lambda t: t.execution.available)
        ticks = [e.cpu_user_ticks for e in observed]
        assert ticks[-1] > ticks[0], ticks
        assert observed[-1].last_activity_time.ToMilliseconds() > observed[0].last_activity_time.ToMilliseconds()
        snapshot = api.get(task["taskId"])
        execution = snapshot["execution"]
        assert execution["available"] is True and execution["cpu"]["userTicks"] > 0
        assert set(execution["io"]) == {"readCount", "writeCount", "readBytes", "writeBytes"}
        assert execution["processes"] and execution["processes"][0]["pid"] == snapshot["attempts"][0]["pid"]
        assert "historical" not in execution
        assert snapshot["activity"]["lastActivityAt"] >= execution["lastActivityAt"]
        assert "progress" not in snapshot, "CPU movement is activity, never progress"
    finally:
        cancel(api, task["taskId"])
    final = api.get(task["taskId"])["execution"]
    assert final["historical"] is True


def test_a_sleeping_worker_shows_no_activity_while_observations_continue(api: Api) -> None:
    task = api.create("napper", profile="sleeper")
    try:
        observed = executions(api, task["taskId"], 4, keep=lambda t: t.execution.available)
        later = observed[1:]
        assert len({e.observe_time.ToMilliseconds() for e in later}) == 3, "observation time moves"
        assert len({e.last_activity_time.ToMilliseconds() for e in later}) == 1, "activity time does not"
        assert len({(e.cpu_user_ticks, e.io_write_count) for e in later}) == 1
    finally:
        cancel(api, task["taskId"])


def test_an_agent_restart_is_survived(stack: Stack, api: Api) -> None:
    task = api.create("through a restart", profile="sleeper")
    try:
        executions(api, task["taskId"], 1)
        stack.procs["telemetry"].stop()
        restarted_at = time.time() * 1000
        stack.procs["telemetry"].start()
        after = executions(
            api, task["taskId"], 1, keep=lambda t: t.execution.observe_time.ToMilliseconds() > restarted_at
        )
        assert after[0].available
    finally:
        cancel(api, task["taskId"])


def test_tasks_run_while_the_agent_is_down(stack: Stack, api: Api) -> None:
    stack.procs["telemetry"].stop()
    try:
        task = api.wait_state(api.create("no telemetry")["taskId"], "completed", "failed", timeout_s=60)
        assert task["state"] == "completed"
    finally:
        stack.procs["telemetry"].start()
        stack.wait_healthy()
