"""A hostile worker reaches nothing but its own attempt; only a person answers its question."""

from __future__ import annotations

import json
import pwd
import time

import pytest

from services.scheduler.worker_log import attempt_log_path
from tests.e2e.conftest import Api
from tests.support.procs import as_nobody_command
from tests.support.stack import HOSTILE, Stack

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        as_nobody_command(HOSTILE) is None, reason="needs root and the user nobody (the isolated worker mode)"
    ),
]

# Refused (no credential, wrong one, method outside the list), or not served on that port at all.
REFUSED = {"UNAUTHENTICATED", "PERMISSION_DENIED", "UNAVAILABLE", "UNIMPLEMENTED"}


def attack_report(api: Api, task_id: str, timeout_s: float = 60) -> dict[str, object]:
    log = attempt_log_path(api.stack.data_dir, task_id, 1)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if log.exists():
            for line in log.read_text(errors="replace").splitlines():
                if line.startswith("ATTACKS "):
                    return json.loads(line[len("ATTACKS ") :])  # type: ignore[no-any-return]
        time.sleep(0.1)
    raise AssertionError(f"no attack report in {log}: {api.get(task_id)}")


def test_a_hostile_worker_gets_nothing_and_waits_for_a_person(stack: Stack, api: Api) -> None:
    victim = api.create("victim", profile="sleeper")
    targets = {name: stack.addr(name) for name in ("scheduler", "pending", "telemetry", "notifier")}
    task = api.create(
        "hostile", profile="hostile", instructions=json.dumps({"targets": targets, "victim": victim["taskId"]})
    )
    report = attack_report(api, task["taskId"])
    assert report["uid"] == pwd.getpwnam("nobody").pw_uid
    results = report["results"]
    assert isinstance(results, list) and len(results) >= 4 * 9 * 3, "every target x method x credential was tried"
    succeeded = [r for r in results if r["code"] not in REFUSED]
    assert succeeded == [], succeeded
    assert report["stolen"] == [], "the worker found caller secrets (environment or data directory)"
    # Its own attempt is untouched: still waiting for an answer, the victim still running.
    waiting = api.get(task["taskId"])
    assert waiting["state"] == "waiting_input", waiting
    assert api.get(victim["taskId"])["state"] == "running"
    question = waiting["pendingQuestion"]
    # A person answers over REST; only then does the worker go on.
    body = {"questionId": question["questionId"], "answer": "yes, deploy"}
    response = api.request("POST", f"/tasks/{task['taskId']}/answer", json=body)
    assert response.status_code == 200, response.text
    done = api.wait_state(task["taskId"], "completed", "failed", timeout_s=60)
    assert done["state"] == "completed" and done["result"]["text"] == "answer: yes, deploy", done
    api.request("POST", f"/tasks/{victim['taskId']}/cancel")
