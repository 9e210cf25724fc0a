"""Several scheduler replicas on one PostgreSQL, each a separate process (issue 11 item 3).

Tasks created over gRPC on every replica are claimed (FOR UPDATE SKIP LOCKED) and
run exactly once; a cancel sent to one replica for another's task is applied by
the owner; a replica SIGKILLed mid-run leaves its tasks HOST_LOST after its lease
(never re-run elsewhere) and reconciles them when it returns with the same host id.
The replicas share this machine's one telemetry agent.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter, deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Unpack

import httpx
import psycopg
import pytest

from libs import proctree
from taskgate.scheduler.v1 import scheduler_pb2 as pb
from taskgate.scheduler.v1 import scheduler_pb2_grpc as pb_grpc
from tests.support.stack import Stack, StackTasks, make_stack

pytestmark = pytest.mark.postgres

LEASE_MS = 1500
GRACE_MS = 1000


def replica_stack(tmp_path: Path, postgres_url: str, replicas: int, **tasks: Unpack[StackTasks]) -> Stack:
    stack = make_stack(tmp_path / "replicas", **tasks).use_postgresql(postgres_url)
    stack.add_scheduler_replicas(replicas - 1, lease_ms=LEASE_MS, grace_ms=GRACE_MS)
    stack.start()
    try:
        stack.wait_replicas_serving()
    except Exception:
        print(stack.logs())
        stack.stop()
        raise
    return stack


@pytest.fixture
def stack_of(tmp_path: Path, postgres_url: str) -> Iterator[Any]:
    started: list[Stack] = []

    def start(replicas: int, **tasks: Unpack[StackTasks]) -> Stack:
        started.append(replica_stack(tmp_path, postgres_url, replicas, **tasks))
        return started[-1]

    yield start
    for stack in started:
        stack.stop()


def db(stack: Stack) -> psycopg.Connection[Any]:
    return psycopg.connect(stack.env["TASKGATE_SCHEDULER_DB_URL"], autocommit=True)


def create_spread(stack: Stack, count: int, profile: str, in_flight: int = 64) -> list[str]:
    """``count`` tasks created round-robin over every replica's CreateTask, ``in_flight`` at a
    time: the queue fills faster than the replicas drain it, so a kill lands mid-run (one
    create after another, the tasks finished about as fast as they were created)."""
    names = stack.scheduler_names()
    channels = [stack.scheduler_channel(n, "gateway") for n in names]
    stubs = [pb_grpc.SchedulerServiceStub(c) for c in channels]
    ids: list[str] = []
    pending: deque[Any] = deque()
    try:
        for i in range(count):
            request = pb.CreateTaskRequest(
                agent_id="agent-1", session_id="cli-replicas", title=f"t{i}", profile=profile
            )
            pending.append(stubs[i % len(stubs)].CreateTask.future(request, timeout=30))
            if len(pending) >= in_flight:
                ids.append(pending.popleft().result().task.task_id)
        ids.extend(f.result().task.task_id for f in pending)
        return ids
    finally:
        for c in channels:
            c.close()


def states(stack: Stack) -> Counter[str]:
    with db(stack) as conn:
        return Counter({row[0]: row[1] for row in conn.execute("SELECT state, count(*) FROM tasks GROUP BY state")})


def wait_until(what: str, check: Any, stack: Stack, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            print(stack.logs())
            raise AssertionError(f"timed out waiting for {what}: {states(stack)}; unfinished: {unfinished(stack)}")
        time.sleep(0.2)


def _attempt_line(attempt: dict[str, Any]) -> str:
    fields = ("number", "host_id", "state", "outcome", "exit_code", "signal", "pid")
    return "#{number} {host_id} {state} {outcome} exit={exit_code} signal={signal} pid={pid}".format_map(
        {k: attempt.get(k) for k in fields}
    )


def unfinished(stack: Stack, limit: int = 10) -> list[str]:
    """The first tasks not completed (failed ones first), each on a line with its owner, failure
    and attempts: what a timeout must show, since the throwaway database is gone once the test
    ends."""
    with db(stack) as conn:
        rows = conn.execute(
            "SELECT task_id, state, owner_host, doc FROM tasks WHERE state <> 'completed'"
            " ORDER BY state, task_id LIMIT %s",
            (limit,),
        ).fetchall()
        found = []
        for task_id, state, owner, doc in rows:
            failure = json.loads(doc).get("failure") or {}
            attempts = conn.execute("SELECT doc FROM attempts WHERE task_id = %s ORDER BY number", (task_id,))
            runs = [_attempt_line(json.loads(r[0])) for r in attempts]
            found.append(
                f"{task_id} {state} owner={owner} failure={failure.get('code')}: {failure.get('message')}"
                f" attempts={runs}"
            )
    return found


def attempts_by_task(stack: Stack) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    with db(stack) as conn:
        for task_id, doc in conn.execute("SELECT task_id, doc FROM attempts ORDER BY task_id, number"):
            found.setdefault(task_id, []).append(json.loads(doc))
    return found


def worker_starts(stack: Stack) -> Counter[str]:
    """task id -> ``worker_started`` lines over every replica's log (restarted ones append)."""
    logs = stack.log_dir or stack.data_dir / "logs"
    seen: Counter[str] = Counter()
    for name in stack.scheduler_names():
        path = logs / f"{name}.log"
        for line in path.read_text(errors="replace").splitlines() if path.exists() else []:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("event") == "worker_started":
                seen[record["task_id"]] += 1
    return seen


def assert_ran_once(stack: Stack, task_ids: list[str], replicas: int) -> None:
    attempts = attempts_by_task(stack)
    assert all(len(attempts.get(t, [])) == 1 for t in task_ids), "a task with other than one attempt"
    starts = worker_starts(stack)
    assert all(starts[t] == 1 for t in task_ids), [t for t in task_ids if starts[t] != 1][:5]
    hosts = Counter(a[0]["host_id"] for a in attempts.values())
    assert len(hosts) == replicas, f"every replica ran some: {hosts}"
    print(f"tasks per host: {dict(hosts)}")


@pytest.mark.parametrize("replicas,count", [(2, 120), (3, 90)])
def test_replicas_run_each_task_exactly_once(stack_of: Any, replicas: int, count: int) -> None:
    stack = stack_of(replicas, max_running=8)
    task_ids = create_spread(stack, count, "true")
    wait_until("all completed", lambda: states(stack).get("completed", 0) == count, stack, 120)
    assert_ran_once(stack, task_ids, replicas)


def test_a_cancel_sent_to_one_replica_is_applied_by_the_owner(stack_of: Any) -> None:
    stack = stack_of(2, max_running=2)
    task_ids = create_spread(stack, 4, "sleeper")
    wait_until("four running", lambda: states(stack).get("running", 0) == 4, stack, 60)
    with db(stack) as conn:
        owners = dict(conn.execute("SELECT task_id, owner_host FROM tasks").fetchall())
    assert len(set(owners.values())) == 2, owners
    # Through the first replica (the gateway's) to a task the other one runs.
    other = next(t for t in task_ids if owners[t] != _host_of(stack, "scheduler"))
    attempt = attempts_by_task(stack)[other][0]
    with stack.scheduler_channel("scheduler", "gateway") as channel:
        stub = pb_grpc.SchedulerServiceStub(channel)
        reply = stub.CancelTask(pb.CancelTaskRequest(task_id=other), timeout=30).task
        assert reply.state in (pb.TASK_STATE_CANCEL_REQUESTED, pb.TASK_STATE_CANCELLED)
        deadline = time.monotonic() + 20
        while (task := stub.GetTask(pb.GetTaskRequest(task_id=other), timeout=10).task).state != (
            pb.TASK_STATE_CANCELLED
        ):
            assert time.monotonic() < deadline, task
            time.sleep(0.1)
    assert task.cancellation.cleanup == "confirmed"
    assert not proctree.identity_matches(attempt["pid"], attempt["pid_start_time"]), "the worker was stopped"
    assert "applying_requested_stop" in stack.procs["scheduler-1"].logs()
    assert states(stack)["running"] == 3, "the others run on"

    # A pause the same way: the owner stops it with proof and it is `paused`; a resume on
    # this replica re-queues it for any host (nothing runs while paused).
    paused = next(t for t in task_ids if owners[t] != _host_of(stack, "scheduler") and t != other)
    with stack.scheduler_channel("scheduler", "operator") as channel:
        stub = pb_grpc.SchedulerServiceStub(channel)
        task = stub.PauseTask(pb.PauseTaskRequest(task_id=paused, wait_ms=20_000), timeout=30).task
        deadline = time.monotonic() + 20
        while task.state != pb.TASK_STATE_PAUSED:
            assert time.monotonic() < deadline, task
            time.sleep(0.1)
            task = stub.GetTask(pb.GetTaskRequest(task_id=paused), timeout=10).task
        resumed = stub.ResumeTask(pb.ResumeTaskRequest(task_id=paused), timeout=10).task
        assert resumed.state == pb.TASK_STATE_QUEUED
    wait_until("resumed and running", lambda: states(stack).get("running", 0) == 3, stack, 60)
    assert len(attempts_by_task(stack)[paused]) == 2


def _host_of(stack: Stack, name: str) -> str:
    """The host id a replica registered (its data dir's default)."""
    from services.scheduler.hosts import default_host_id

    env = stack.replicas.get(name, stack.env)
    return default_host_id(os.uname().nodename, Path(env["TASKGATE_DATA_DIR"]))


def _all_host_lost(stack: Stack, task_ids: list[str]) -> bool:
    with db(stack) as conn:
        rows = conn.execute("SELECT state, doc FROM tasks WHERE task_id = ANY(%s)", (task_ids,)).fetchall()
    return all(r[0] == "needs_reconciliation" and json.loads(r[1])["failure"]["code"] == "HOST_LOST" for r in rows)


def test_a_killed_replica_leaves_host_lost_then_reconciles_on_return(stack_of: Any) -> None:
    stack = stack_of(2, max_running=3)
    victim = "scheduler-1"
    victim_host = _host_of(stack, victim)
    task_ids = create_spread(stack, 6, "sleeper")
    wait_until("six running", lambda: states(stack).get("running", 0) == 6, stack, 60)
    with db(stack) as conn:
        lost = [r[0] for r in conn.execute("SELECT task_id FROM tasks WHERE owner_host = %s", (victim_host,))]
    assert lost, "the victim runs some tasks"
    before = attempts_by_task(stack)
    stack.procs[victim].kill()  # SIGKILL: its sleepers live on, no lease renewals any more
    for t in lost:
        a = before[t][0]
        assert proctree.identity_matches(a["pid"], a["pid_start_time"]), "the worker outlives its scheduler"

    wait_until("HOST_LOST", lambda: _all_host_lost(stack, lost), stack, 60)
    time.sleep((LEASE_MS + GRACE_MS) / 1000)  # a while longer: nothing re-runs them
    after = attempts_by_task(stack)
    assert all(len(after[t]) == 1 for t in lost), "never re-run while its worker may live"
    assert states(stack)["running"] == 6 - len(lost)

    # The same host id returns: its recovery stops the old workers (identity-checked),
    # then resumes the tasks — one live worker per task at any time.
    stack.procs[victim] = stack.replica_process(victim).start()
    wait_until(
        "resumed",
        lambda: all(len(attempts_by_task(stack).get(t, [])) == 2 for t in lost) and states(stack)["running"] == 6,
        stack,
        60,
    )
    for t in lost:
        first, second = attempts_by_task(stack)[t]
        assert not proctree.identity_matches(first["pid"], first["pid_start_time"])
        assert first["ended_at"] <= second["started_at"]
        assert second["host_id"] == victim_host
    assert "reconciled_host_lost" in stack.procs[victim].logs()
    assert len(task_ids) == 6


def test_a_stalled_replica_takes_back_its_running_tasks_when_it_wakes(stack_of: Any) -> None:
    """SIGSTOP a replica past its lease and grace: the other sweeps its running tasks HOST_LOST.
    Woken (SIGCONT), it still holds their workers, alive: it takes the tasks back — running, the
    same attempt and process, nothing re-run — and they answer to a cancel again (one sent to the
    other replica is applied by the owner)."""
    stack = stack_of(2, max_running=3)
    stalled = "scheduler-1"
    stalled_host = _host_of(stack, stalled)
    create_spread(stack, 6, "sleeper")
    wait_until("six running", lambda: states(stack).get("running", 0) == 6, stack, 60)
    with db(stack) as conn:
        held = [r[0] for r in conn.execute("SELECT task_id FROM tasks WHERE owner_host = %s", (stalled_host,))]
    assert held, "the stalled replica runs some tasks"
    before = attempts_by_task(stack)
    process = stack.procs[stalled].proc
    assert process is not None
    process.send_signal(signal.SIGSTOP)
    try:
        wait_until("HOST_LOST", lambda: _all_host_lost(stack, held), stack, 60)
    finally:
        process.send_signal(signal.SIGCONT)

    def taken_back() -> bool:
        with db(stack) as conn:
            rows = conn.execute("SELECT state FROM tasks WHERE task_id = ANY(%s)", (held,)).fetchall()
        return all(r[0] == "running" for r in rows)

    wait_until("taken back", taken_back, stack, 60)
    after = attempts_by_task(stack)
    for t in held:
        (attempt,) = after[t]
        assert attempt["attempt_id"] == before[t][0]["attempt_id"] and attempt["pid"] == before[t][0]["pid"]
        assert proctree.identity_matches(attempt["pid"], attempt["pid_start_time"]), "its worker ran on"
    logs = stack.procs[stalled].logs()
    assert "lease_lapsed" in logs and "host_lost_task_taken_back" in logs
    with stack.scheduler_channel("scheduler", "gateway") as channel:
        stub = pb_grpc.SchedulerServiceStub(channel)
        stub.CancelTask(pb.CancelTaskRequest(task_id=held[0]), timeout=30)
        deadline = time.monotonic() + 60
        while stub.GetTask(pb.GetTaskRequest(task_id=held[0]), timeout=10).task.state != pb.TASK_STATE_CANCELLED:
            assert time.monotonic() < deadline, "the cancel was not applied"
            time.sleep(0.2)
    assert not proctree.identity_matches(after[held[0]][0]["pid"], after[held[0]][0]["pid_start_time"])


def test_a_watch_on_one_replica_sees_changes_made_by_another(stack_of: Any) -> None:
    stack = stack_of(2, max_running=2)
    anchor = create_spread(stack, 1, "sleeper")[0]  # on the first replica
    with stack.scheduler_channel("scheduler", "gateway") as channel:
        stream = pb_grpc.SchedulerServiceStub(channel).WatchTasks(
            pb.WatchTasksRequest(agent_id="agent-1", session_id="cli-replicas"), timeout=30
        )
        first = next(stream)  # the stream is live once its snapshot arrived
        assert first.type == pb.TASK_EVENT_TYPE_SNAPSHOT and first.task.task_id == anchor
        # Created on the other replica: its event reaches this one's watchers from the log.
        with stack.scheduler_channel("scheduler-1", "gateway") as other:
            created = (
                pb_grpc.SchedulerServiceStub(other)
                .CreateTask(
                    pb.CreateTaskRequest(agent_id="agent-1", session_id="cli-replicas", title="w", profile="sleeper"),
                    timeout=10,
                )
                .task
            )
            seen = []
            for event in stream:
                if event.task.task_id != created.task_id:
                    continue
                assert event.type != pb.TASK_EVENT_TYPE_SNAPSHOT
                seen.append(event.task.state)
                if event.task.state == pb.TASK_STATE_RUNNING:
                    # Cancelled through the other replica, whoever runs it: this stream still shows it.
                    pb_grpc.SchedulerServiceStub(other).CancelTask(
                        pb.CancelTaskRequest(task_id=created.task_id), timeout=30
                    )
                if event.task.state == pb.TASK_STATE_CANCELLED:
                    break
        stream.cancel()
    assert seen[0] == pb.TASK_STATE_QUEUED and seen[-1] == pb.TASK_STATE_CANCELLED, seen


def test_the_gateway_on_postgresql_remembers_keys_and_hears_the_cli_s_changes(stack_of: Any) -> None:
    """The gateway's key and membership memory on PostgreSQL: it listens for the tables'
    notifications, and a membership removed or a key revoked with the CLI is refused as soon as
    the notification is in (asked again for at most 5 s: the CLI's commit and the notification
    reach the gateway on two connections)."""
    from tests.e2e.conftest import Api, add_member, run_cli

    stack = stack_of(1, max_running=1)
    with psycopg.connect(stack.env["TASKGATE_GATEWAY_DB_URL"], autocommit=True) as gateway_db:
        created = run_cli(stack, "admin", "keys", "create", "--principal", "rita", "--agent", "agent-1")
        assert created.returncode == 0, created.stderr
        key_id = created.stdout.split("key id:")[1].split()[0]
        rita = Api(stack, created.stdout.strip().splitlines()[-1], agent="agent-1", session="pg-access")
        add_member(stack, "agent-1", "pg-access", "rita")
        for _ in range(3):
            assert rita.request("GET", "/tasks?page_size=1").status_code == 200
        listening = gateway_db.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query = %s",
            ("LISTEN taskgate_access",),
        ).fetchone()
        assert listening is not None and listening[0] == 1  # the gateway's listener

    def answer_within(path: str, status: int) -> httpx.Response:
        deadline = time.monotonic() + 5
        while (response := rita.request("GET", path)).status_code != status and time.monotonic() < deadline:
            time.sleep(0.05)
        return response

    removed = run_cli(
        stack, "admin", "members", "remove", "--agent", "agent-1", "--session", "pg-access", "--principal", "rita"
    )
    assert removed.returncode == 0, removed.stderr
    refused = answer_within("/tasks?page_size=1", 403)
    assert refused.status_code == 403 and refused.json()["error"] == "NOT_A_MEMBER", refused.text
    add_member(stack, "agent-1", "pg-access", "rita")
    assert answer_within("/tasks?page_size=1", 200).status_code == 200
    assert run_cli(stack, "admin", "keys", "revoke", key_id).returncode == 0
    revoked = answer_within("/tasks?page_size=1", 401)
    assert revoked.status_code == 401 and revoked.json()["error"] == "UNAUTHENTICATED", revoked.text
