"""schemathesis fuzzes /openapi.json of a real stack, as a stranger would, with --checks all.

One real key, agent and session are pinned (schemathesis.toml reads them from the
environment, as the taskgate CLI does); the session has a pending snapshot so
GET /v1/session/{sessionId}/task answers with one. Every worker profile exits at once:
the tasks schemathesis creates run for real and end quickly. The run is bounded by
a fixed seed (reproducible) and the examples per operation of its fuzzing phase: 12 here
(``TASKGATE_FUZZ_MAX_EXAMPLES``; ``make fuzz`` runs 100). Its time is schemathesis generating
bodies, not the stack answering: 25 examples cost 49 s of the 79 s the test took, the coverage
phase's 1,040 boundary cases 27 s.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from taskgate.pending.v1 import pending_pb2 as ppb
from taskgate.pending.v1 import pending_pb2_grpc as ppb_grpc
from tests.e2e.conftest import add_member, create_key
from tests.support.procs import REPO
from tests.support.stack import Stack, make_stack

AGENT = "agent-fuzz"
SESSION = "tg-fuzz"
SEED = "20261130"
MAX_EXAMPLES = int(os.environ.get("TASKGATE_FUZZ_MAX_EXAMPLES", "12"))
FUZZ_CONFIG = """
[tasks]
max_running = 4
supervisor_interval_ms = 100
cancel_grace_ms = 500
cleanup_confirm_ms = 1000

[workers.default-worker]
command = ["python", "-c", "pass"]

[workers.quick]
command = ["python", "-c", "pass"]
"""


@pytest.fixture(scope="module")
def fuzz_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    data_dir = tmp_path_factory.mktemp("fuzz")
    stack = make_stack(data_dir)
    (data_dir / "taskgate.toml").write_text(FUZZ_CONFIG)
    stack.start()
    yield stack
    stack.stop()


def leave_pending_snapshot(stack: Stack) -> None:
    """An ask from a chat session whose producer went away: its snapshot stays."""
    with stack.channel("pending", "frontend") as channel:
        stub = ppb_grpc.PendingRegistryServiceStub(channel)
        producer = stub.Ask.future(
            ppb.AskRequest(session_id=SESSION, agent_id=AGENT, kind=ppb.ENTRY_KIND_ASK, payload="which branch?"),
            timeout=30,
        )
        deadline = time.monotonic() + 15
        while True:
            try:
                stub.GetSessionTask(ppb.GetSessionTaskRequest(agent_id=AGENT, session_id=SESSION), timeout=5)
                break
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.NOT_FOUND and time.monotonic() < deadline, exc
                time.sleep(0.05)
        producer.cancel()


def test_schemathesis_finds_no_failure(fuzz_stack: Stack) -> None:
    key = create_key(fuzz_stack, "fuzzer", AGENT)
    add_member(fuzz_stack, AGENT, SESSION, "fuzzer")
    leave_pending_snapshot(fuzz_stack)
    env = {**os.environ, "TASKGATE_API_KEY": key, "TASKGATE_AGENT": AGENT, "TASKGATE_SESSION": SESSION}
    # The console script installed beside the interpreter running the tests (the project's .venv).
    schemathesis = Path(sys.executable).parent / "schemathesis"
    result = subprocess.run(
        [
            str(schemathesis),
            "--config-file",
            str(REPO / "schemathesis.toml"),
            "run",
            f"{fuzz_stack.http_url}/openapi.json",
            "--checks",
            "all",
            "--seed",
            SEED,
            "--max-examples",
            str(MAX_EXAMPLES),
        ],
        cwd=fuzz_stack.data_dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=300 + 2 * 25 * MAX_EXAMPLES,  # 25 operations, at worst ~2 s per case
        check=False,
    )
    assert result.returncode == 0, result.stdout[-20000:] + result.stderr[-3000:]
    assert "Test cases:" in result.stdout and " passed" in result.stdout


def test_health_degrades_without_telemetry_and_fails_without_a_required_backend(fuzz_stack: Stack) -> None:
    # Runs last on this module's own stack: it stops services.
    fuzz_stack.procs["telemetry"].stop()
    response = httpx.get(f"{fuzz_stack.http_url}/healthz", timeout=10)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "degraded" and body["advisory"]["telemetry"] != "SERVING"
    assert set(body["required"].values()) == {"SERVING"}
    fuzz_stack.procs["notifier"].stop()
    response = httpx.get(f"{fuzz_stack.http_url}/healthz", timeout=10)
    assert response.status_code == 503
    assert response.json()["status"] == "unavailable" and response.json()["required"]["notifier"] != "SERVING"
