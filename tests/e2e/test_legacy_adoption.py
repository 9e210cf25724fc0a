"""Legacy adoption over the real five processes (issue 10 item 2): a task an older version left
``failed`` ``GATEWAY_SHUTDOWN`` a minute before start-up, whose failure report the webhook
receiver has not accepted yet, is resumed and completes; the failure report is never delivered."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import grpc

from libs.db import Database
from services.scheduler.domain import Failure, State, Task
from services.scheduler.store import MIGRATIONS, SchedulerStore
from taskgate.notifier.v1 import notifier_pb2 as npb
from taskgate.notifier.v1 import notifier_pb2_grpc as npb_grpc
from taskgate.scheduler.v1 import scheduler_pb2 as spb
from taskgate.scheduler.v1 import scheduler_pb2_grpc as spb_grpc
from tests.e2e.test_notifier import HOOK_AGENT, start_receiver, start_stack

SESSION = "legacy-1"


def get_task(channel: grpc.Channel, task_id: str) -> spb.Task:
    return spb_grpc.SchedulerServiceStub(channel).GetTask(spb.GetTaskRequest(task_id=task_id), timeout=10).task


def wait_state(channel: grpc.Channel, task_id: str, state: str, timeout_s: float = 60) -> spb.Task:
    deadline = time.monotonic() + timeout_s
    while True:
        task = get_task(channel, task_id)
        if spb.TaskState.Name(task.state).removeprefix("TASK_STATE_").lower() == state:
            return task
        assert time.monotonic() < deadline, f"task is {spb.TaskState.Name(task.state)}, not {state}"
        time.sleep(0.1)


def fail_as_an_older_version_did(db_url: str, task_id: str) -> None:
    """What a shutdown of an older version left: ``failed`` ``GATEWAY_SHUTDOWN``, no resume record."""

    async def rewrite() -> None:
        db = Database(db_url, MIGRATIONS)
        try:
            at = int(time.time() * 1000) - 60_000

            def fail(t: Task) -> Task:
                t.state, t.restart_resume = State.FAILED, None
                t.failure = Failure(code="GATEWAY_SHUTDOWN", message="the gateway shut down")
                t.ended_at = t.updated_at = at
                return t

            await SchedulerStore(db).update_task(task_id, fail, "task.state_changed", at)
        finally:
            db.close()

    asyncio.run(rewrite())


def test_a_recent_unreported_gateway_shutdown_failure_is_resumed_and_never_reported(tmp_path: Path) -> None:
    receiver, server = start_receiver()
    receiver.script[SESSION] = [(503, None)] * 10_000  # nothing for this session is accepted yet
    stack = start_stack(tmp_path, receiver)
    try:
        with stack.channel("scheduler") as channel:
            steps = [{"sleep_unless_resumed": 300}, {"result": {"text": "finished after adoption"}}]
            task = (
                spb_grpc.SchedulerServiceStub(channel)
                .CreateTask(
                    spb.CreateTaskRequest(
                        agent_id=HOOK_AGENT,
                        session_id=SESSION,
                        title="legacy",
                        instructions=json.dumps(steps),
                        profile="behave",
                    ),
                    timeout=10,
                )
                .task
            )
            wait_state(channel, task.task_id, "running")
        stack.stop()
        fail_as_an_older_version_did(f"sqlite:///{(stack.data_dir / 'scheduler.db').resolve()}", task.task_id)

        stack.start()
        with stack.channel("scheduler") as channel:
            done = wait_state(channel, task.task_id, "completed", timeout_s=90)
        assert done.result.text == "finished after adoption"
        assert done.restart_resume.count == 1 and done.restart_resume.revision == 1
        flipped = time.monotonic()
        receiver.script[SESSION] = []  # from now on the receiver accepts every report
        got = receiver.wait(
            SESSION, lambda rs: any(r.doc["kind"] == "task.completed" and r.at >= flipped for r in rs), timeout_s=60
        )
        # The failure report was never accepted: any attempt at it came before the flip (503).
        assert all(r.at < flipped for r in got if r.doc["kind"] == "task.failed")
        with stack.channel("notifier") as channel:
            notes = (
                npb_grpc.NotifierServiceStub(channel)
                .ListNotifications(
                    npb.ListNotificationsRequest(agent_id=HOOK_AGENT, session_id=SESSION, page_size=50), timeout=10
                )
                .notifications
            )
        failed = [
            n for n in notes if n.task_id == task.task_id and "failed" in npb.NotificationKind.Name(n.kind).lower()
        ]
        assert all(npb.NotificationState.Name(n.state).endswith("STOPPED") for n in failed), failed
        assert "legacy_failure_adopted" in (stack.data_dir / "logs" / "scheduler.log").read_text()
    except Exception:
        print(stack.logs())
        raise
    finally:
        stack.stop()
        server.shutdown()
