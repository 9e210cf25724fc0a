"""The five processes with mutual TLS on every internal link, as the compose file runs them."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from taskgate.scheduler.v1 import scheduler_pb2 as pb
from taskgate.scheduler.v1 import scheduler_pb2_grpc as pb_grpc
from tests.e2e.conftest import Api, add_member, create_key
from tests.support.procs import REPO
from tests.support.stack import Stack, make_stack

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def tls_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("tls")
    subprocess.run([str(REPO / "scripts" / "gen_internal_tls.sh"), str(root / "tls")], check=True, capture_output=True)
    stack = make_stack(root / "data")
    stack.env.update(
        {
            "TASKGATE_TLS_CERT_FILE": str(root / "tls" / "tls.pem"),
            "TASKGATE_TLS_KEY_FILE": str(root / "tls" / "tls.key"),
            "TASKGATE_TLS_CA_FILE": str(root / "tls" / "ca.pem"),
            "TASKGATE_TLS_CLIENT_AUTH": "true",
        }
    )
    stack.start()
    yield stack
    stack.stop()


def _code(call: object) -> grpc.StatusCode:
    try:
        call()  # type: ignore[operator]
    except grpc.RpcError as exc:
        return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def test_a_task_runs_end_to_end_over_mutual_tls(tls_stack: Stack) -> None:
    key = create_key(tls_stack, "tls-user", "agent-1")
    add_member(tls_stack, "agent-1", "cli-tls", "tls-user")
    api = Api(tls_stack, key, session="cli-tls")
    task = api.create("over tls", profile="sleeper")
    # gateway -> scheduler -> telemetry-agent -> scheduler, every hop over mutual TLS.
    watched = api.wait_for(task["taskId"], lambda t: t.execution.available, timeout_s=60)
    assert watched["execution"]["processes"], watched
    assert api.request("POST", f"/tasks/{task['taskId']}/cancel").status_code == 200
    assert api.wait_state(task["taskId"], "cancelled", timeout_s=30)["state"] == "cancelled"


def test_plaintext_and_certificate_less_clients_are_refused(tls_stack: Stack) -> None:
    addr = tls_stack.addr("scheduler")
    request = pb.ListTasksRequest(agent_id="agent-1", session_id="cli-tls", page_size=1)
    # Even with a valid caller secret, plaintext gets nowhere.
    secret = (tls_stack.data_dir / "secrets" / "operator.secret").read_text().strip()
    metadata = (("authorization", f"Bearer {secret}"),)
    with grpc.insecure_channel(addr) as plain:
        assert _code(lambda: pb_grpc.SchedulerServiceStub(plain).ListTasks(request, timeout=5, metadata=metadata)) == (
            grpc.StatusCode.UNAVAILABLE
        )
    ca = Path(tls_stack.env["TASKGATE_TLS_CA_FILE"]).read_bytes()
    with grpc.secure_channel(addr, grpc.ssl_channel_credentials(root_certificates=ca)) as no_cert:
        assert _code(
            lambda: pb_grpc.SchedulerServiceStub(no_cert).ListTasks(request, timeout=5, metadata=metadata)
        ) == (grpc.StatusCode.UNAVAILABLE)
    # The operator's own channel (secret + client certificate) works.
    with tls_stack.channel("scheduler") as channel:
        assert _code(lambda: pb_grpc.SchedulerServiceStub(channel).ListTasks(request, timeout=5)) == (
            grpc.StatusCode.OK
        )


def test_the_container_health_probe_speaks_tls(tls_stack: Stack) -> None:
    for name in ("scheduler", "pending", "telemetry", "notifier"):
        probe = subprocess.run(
            [sys.executable, "-m", "libs.healthcheck", tls_stack.addr(name)],
            cwd=REPO,
            env={**os.environ, **tls_stack.env},
            capture_output=True,
            timeout=30,
            check=False,
        )
        assert probe.returncode == 0, (name, probe.stderr)
