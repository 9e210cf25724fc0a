"""Cron jobs end to end: real processes, REST through the gateway.

A manual run answers only after the worker's result; a revoked key ends its caller's wait
while the job completes and lands in the history; a lost answer (the scheduler killed
mid-run) is CRON_OUTCOME_UNKNOWN; two scheduler replicas on one PostgreSQL fire each
tick once.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.e2e.conftest import add_member, create_key, run_cli
from tests.support.postgres import fresh_database
from tests.support.procs import ServiceProcess, free_port
from tests.support.stack import Stack, make_stack

SESSION = "cron-e2e"


def steps(*items: object) -> str:
    # A TOML literal string holding the behave worker's JSON steps.
    return "'" + json.dumps(list(items)) + "'"


CRONS = f"""
[crons.report]
schedule = "0 0 1 1 *"
enabled = false
agent = "agent-1"
session = "{SESSION}"
title = "nightly report"
profile = "behave"
instructions = {steps({"progress": "collecting"}, {"sleep": 1}, {"result": {"text": "report done"}})}
timeout_ms = 60000

[crons.slow]
schedule = "0 0 1 1 *"
enabled = false
agent = "agent-1"
session = "{SESSION}"
title = "slow job"
profile = "behave"
instructions = {steps({"progress": "started"}, {"sleep": 6}, {"result": {"text": "slow done"}})}
timeout_ms = 60000

[crons.off]
schedule = "* * * * * *"
agent = "agent-off"
session = "{SESSION}"
title = "orchestration is off for this agent"
profile = "true"

[crons.other]
schedule = "0 0 1 1 *"
agent = "agent-2"
session = "{SESSION}"
title = "another agent's job"
profile = "true"
"""


@pytest.fixture(scope="module")
def cron_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    stack = make_stack(tmp_path_factory.mktemp("crons"), extra_config=CRONS).start()
    yield stack
    stack.stop()


def key_with_id(stack: Stack, principal: str, *agents: str) -> tuple[str, str]:
    args = ["admin", "keys", "create", "--principal", principal]
    for agent in agents:
        args += ["--agent", agent]
    result = run_cli(stack, *args)
    assert result.returncode == 0, result.stderr
    found = re.search(r"key id:\s+(\S+)", result.stdout)
    assert found is not None, result.stdout
    return found.group(1), result.stdout.strip().splitlines()[-1]


def call(stack: Stack, key: str, method: str, path: str, timeout: float = 30) -> httpx.Response:
    return httpx.request(method, stack.http_url + path, headers={"Authorization": f"Bearer {key}"}, timeout=timeout)


def in_background(fn: Callable[[], httpx.Response]) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["response"] = fn()
        except Exception as exc:  # surfaced by the test's assertion on out
            out["error"] = exc
        out["at"] = time.monotonic()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def wait_run(
    stack: Stack, key: str, cron_id: str, done: Callable[[dict[str, Any]], bool], timeout_s: float = 30
) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        runs = call(stack, key, "GET", f"/api/v1/crons/{cron_id}/runs").json()["runs"]
        for run in runs:
            if done(run):
                return run
        assert time.monotonic() < deadline, f"no such run of {cron_id}: {runs}"
        time.sleep(0.1)


def test_jobs_and_history_only_for_the_keys_agents(cron_stack: Stack) -> None:
    key1 = create_key(cron_stack, "cron-1", "agent-1")
    key2 = create_key(cron_stack, "cron-2", "agent-2")
    listed = call(cron_stack, key1, "GET", "/api/v1/crons")
    assert listed.status_code == 200, listed.text
    jobs = {j["cronId"]: j for j in listed.json()["crons"]}
    assert sorted(jobs) == ["report", "slow"]
    assert jobs["report"]["enabled"] is False and "nextRunAt" not in jobs["report"]
    assert jobs["report"]["timeoutMs"] == 60000 and jobs["report"]["agentId"] == "agent-1"
    assert [j["cronId"] for j in call(cron_stack, key2, "GET", "/api/v1/crons").json()["crons"]] == ["other"]
    other = call(cron_stack, key2, "GET", "/api/v1/crons").json()["crons"][0]
    assert other["enabled"] is True and other["nextRunAt"].startswith(f"{time.gmtime().tm_year + 1}-01-01T00:00:00")

    denied = call(cron_stack, key1, "POST", "/api/v1/crons/other/run")
    assert denied.status_code == 403 and denied.json()["error"] == "AGENT_ACCESS_DENIED"
    assert call(cron_stack, key1, "GET", "/api/v1/crons/other/runs").status_code == 403
    assert call(cron_stack, key2, "GET", "/api/v1/crons/other/runs").json()["total"] == 0, (
        "the refused run never started"
    )
    missing = call(cron_stack, key1, "POST", "/api/v1/crons/nope/run")
    assert missing.status_code == 404 and missing.json()["error"] == "CRON_NOT_FOUND"
    assert httpx.get(cron_stack.http_url + "/api/v1/crons", timeout=30).status_code == 401
    assert call(cron_stack, key1, "GET", "/api/v1/crons/report/runs?page_size=0").status_code == 400
    # An agent with orchestration disabled: no manual run (409) and no scheduled one (every second).
    key_off = create_key(cron_stack, "cron-off", "agent-off")
    off = call(cron_stack, key_off, "POST", "/api/v1/crons/off/run")
    assert off.status_code == 409 and off.json()["error"] == "ORCHESTRATION_DISABLED"
    time.sleep(1.5)
    assert call(cron_stack, key_off, "GET", "/api/v1/crons/off/runs").json()["total"] == 0


def test_a_manual_run_answers_after_the_workers_result(cron_stack: Stack) -> None:
    key = create_key(cron_stack, "cron-runner", "agent-1")
    add_member(cron_stack, "agent-1", SESSION, "cron-runner")
    started = time.monotonic()
    response = call(cron_stack, key, "POST", "/api/v1/crons/report/run", timeout=60)
    elapsed = time.monotonic() - started
    assert response.status_code == 200, response.text
    run = response.json()["run"]
    assert run["outcome"] == "completed" and run["kind"] == "manual" and "endedAt" in run
    assert elapsed >= 1.0, "the answer waited for the worker (it sleeps 1 s), not for the queue"
    (task_id,) = run["taskIds"]
    task = call(cron_stack, key, "GET", f"/api/v1/agents/agent-1/sessions/{SESSION}/tasks/{task_id}").json()["task"]
    assert task["state"] == "completed" and task["result"]["text"] == "report done"
    assert task["title"] == "nightly report"
    history = call(cron_stack, key, "GET", "/api/v1/crons/report/runs").json()
    assert history["total"] == 1 and history["runs"][0] == run


def test_a_revoked_key_ends_the_wait_and_the_job_still_lands_in_history(cron_stack: Stack) -> None:
    key_id, key = key_with_id(cron_stack, "cron-revoked", "agent-1")
    watcher = create_key(cron_stack, "cron-watcher", "agent-1")
    thread, out = in_background(lambda: call(cron_stack, key, "POST", "/api/v1/crons/slow/run", timeout=60))
    running = wait_run(cron_stack, watcher, "slow", lambda r: r["outcome"] == "running")
    revoked = run_cli(cron_stack, "admin", "keys", "revoke", key_id)
    assert revoked.returncode == 0, revoked.stderr
    revoked_at = time.monotonic()
    thread.join(timeout=30)
    assert "response" in out, out
    response = out["response"]
    assert response.status_code == 401 and response.json()["error"] == "TICKET_REVOKED", response.text
    assert running["runId"] in response.json()["message"]
    assert out["at"] - revoked_at < 5, "the wait ended soon after the revocation"
    # The job itself was not touched: it completes and its run is in the history.
    ended = wait_run(
        cron_stack, watcher, "slow", lambda r: r["runId"] == running["runId"] and r["outcome"] != "running"
    )
    assert ended["outcome"] == "completed" and ended["taskIds"] == running["taskIds"]


def test_a_lost_answer_is_cron_outcome_unknown(cron_stack: Stack) -> None:
    """Runs last in this module: it kills the stack's scheduler (and starts it again)."""
    key = create_key(cron_stack, "cron-lost", "agent-1")
    thread, out = in_background(lambda: call(cron_stack, key, "POST", "/api/v1/crons/slow/run", timeout=60))
    running = wait_run(cron_stack, key, "slow", lambda r: r["outcome"] == "running")
    scheduler = cron_stack.procs["scheduler"]
    try:
        scheduler.kill()  # the connection drops after the run was dispatched
        thread.join(timeout=30)
        assert "response" in out, out
        response = out["response"]
        assert response.status_code == 200, response.text
        run = response.json()["run"]
        assert run["outcome"] == "CRON_OUTCOME_UNKNOWN" and run["runId"] == running["runId"]
        assert run["failure"]["code"] == "CRON_OUTCOME_UNKNOWN" and run["failure"]["retryable"] is False
        assert "/api/v1/crons/slow/runs" in run["failure"]["message"]
    finally:
        scheduler.start()
    # The history, read as the answer says, still has the run (durable), whatever became of it.
    listed = wait_run(cron_stack, key, "slow", lambda r: r["runId"] == running["runId"])
    assert listed["taskIds"] == running["taskIds"]


TICKS = """
[crons.tick]
schedule = "* * * * * *"
agent = "agent-1"
session = "cron-ticks"
title = "every second"
profile = "true"
"""


@pytest.mark.postgres
def test_two_scheduler_replicas_on_postgresql_fire_each_tick_once(postgres_url: str, tmp_path: Path) -> None:
    stack = make_stack(tmp_path / "ticks", extra_config=TICKS)
    url = fresh_database(postgres_url, "cron_ticks")
    stack.env["TASKGATE_SCHEDULER_DB_URL"] = url
    replica_addr = f"127.0.0.1:{free_port()}"
    replica_env = {
        **stack.env,
        "TASKGATE_SCHEDULER_ADDR": replica_addr,
        # Its own data dir (cgroups, worker sockets, logs), the same secrets.
        "TASKGATE_DATA_DIR": str(tmp_path / "replica"),
        "TASKGATE_SECRETS_DIR": str(tmp_path / "ticks" / "secrets"),
        "TASKGATE_WORKER_SOCKET_DIR": str(tmp_path / "replica-sock"),
    }
    replica = ServiceProcess("services.scheduler", replica_env, tmp_path / "replica.log", replica_addr)
    try:
        stack.start()
        replica.start()
        time.sleep(5)  # about five ticks while both replicas run
        replica.stop()
        stack.procs["scheduler"].stop()
        with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://")) as conn:
            runs = conn.execute("SELECT scheduled_for, doc FROM cron_runs WHERE cron_id = 'tick'").fetchall()
            tasks = conn.execute("SELECT task_id FROM tasks WHERE session_id = 'cron-ticks'").fetchall()
        ticks = sorted(r[0] for r in runs)
        assert len(ticks) >= 3, ticks
        # Each second once: no tick twice, none skipped between the first and the last.
        assert ticks == list(range(ticks[0], ticks[-1] + 1000, 1000)), ticks
        # One task per run and no task without its run: the losing claims created nothing.
        assert sorted(t for r in runs for t in json.loads(r[1])["taskIds"]) == sorted(t[0] for t in tasks)
        # Both replicas took part: each claimed ticks (won or found taken by the other).
        for name, text in {"a": stack.procs["scheduler"].logs(), "b": replica.logs()}.items():
            assert "cron_tick_taken" in text or "cron_run_started" in text, name
    except Exception:
        print(stack.logs(), replica.logs()[-4000:])
        raise
    finally:
        replica.stop()
        stack.stop()
