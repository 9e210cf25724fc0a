"""Chaos: the scheduler SIGKILLed while the gateway's create batches are in flight.

Sixteen clients create tasks as fast as the stack answers, each create with its own
``requestId``; the gateway sends them to the scheduler in batches on its ``StreamCreateTasks``
stream. The scheduler is SIGKILLed mid-stream and started again (the gateway opens a new
stream). A create that got no 201 (the batch it rode in failed, or the gateway answered 503
while the scheduler was down) is sent again with the same ``requestId`` until it gets one, as
a client is told to.

What must hold: every create acknowledged with a 201 before the kill is still there after
it (a 201 is only sent once the task is committed); a create whose answer was lost and was
sent again is the same task (the request id), never a second one; and the session ends up
with exactly one task per request id, each run to its end once.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import add_member, create_key
from tests.support.stack import Stack, make_stack

AGENT, SESSION = "agent-batches", "chaos-batches"
CLIENTS = 16
CREATES = 480
KILL_AFTER = 120  # acknowledged creates before the SIGKILL
RETRY_FOR_S = 90.0

CONFIG = """
[workers.quick]
command = ["true"]
"""


@dataclass
class Creates:
    """Who got which task, and what went wrong on the way (shared by the client threads)."""

    acked: dict[str, str] = field(default_factory=dict)  # request id -> task id of its 201
    acked_before_kill: dict[str, str] = field(default_factory=dict)
    failures: Counter[str] = field(default_factory=Counter)  # non-201 answers and transport errors
    resent: int = 0  # creates answered 201 only after being sent again (a failed answer first)
    lock: threading.Lock = field(default_factory=threading.Lock)
    killed: threading.Event = field(default_factory=threading.Event)
    errors: list[str] = field(default_factory=list)


def client(stack: Stack, key: str, request_ids: list[str], out: Creates) -> None:
    url = f"{stack.http_url}/api/v1/agents/{AGENT}/sessions/{SESSION}/tasks"
    with httpx.Client(headers={"Authorization": f"Bearer {key}"}, timeout=30) as http:
        for request_id in request_ids:
            body = {"title": request_id, "profile": "quick", "requestId": request_id}
            deadline = time.monotonic() + RETRY_FOR_S
            failed_before = False
            while True:
                try:
                    answer = http.post(url, json=body)
                except httpx.HTTPError as exc:
                    cause = type(exc).__name__
                else:
                    if answer.status_code == 201:
                        break
                    cause = f"{answer.status_code} {answer.json().get('error', '')}"
                    if answer.status_code not in (502, 503, 504):
                        with out.lock:
                            out.errors.append(f"{request_id}: {answer.status_code} {answer.text[:300]}")
                        return
                failed_before = True
                with out.lock:
                    out.failures[cause] += 1
                if time.monotonic() > deadline:
                    with out.lock:
                        out.errors.append(f"{request_id}: no 201 within {RETRY_FOR_S} s ({cause})")
                    return
                time.sleep(0.1)
            task_id = answer.json()["task"]["taskId"]
            with out.lock:
                out.acked[request_id] = task_id
                if not out.killed.is_set():
                    out.acked_before_kill[request_id] = task_id
                if failed_before:
                    out.resent += 1


@pytest.fixture(params=["sqlite", "postgresql"])
def stack(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stack]:
    stack = make_stack(tmp_path / "stack", extra_config=CONFIG, max_running=16)
    if request.param == "postgresql":
        stack.use_postgresql(request.getfixturevalue("postgres_url"), prefix="batches_")
    try:
        stack.start()
        yield stack
    except Exception:
        print(stack.logs())
        raise
    finally:
        stack.stop()


def test_a_scheduler_killed_mid_batch_loses_and_doubles_no_create(stack: Stack) -> None:
    key = create_key(stack, "chaos", AGENT)
    add_member(stack, AGENT, SESSION, "chaos")
    out = Creates()
    request_ids = [f"req-{i:04d}" for i in range(CREATES)]
    threads = [
        threading.Thread(target=client, args=(stack, key, request_ids[i::CLIENTS], out), daemon=True)
        for i in range(CLIENTS)
    ]
    for thread in threads:
        thread.start()

    deadline = time.monotonic() + 60
    while len(out.acked) < KILL_AFTER:
        assert time.monotonic() < deadline, f"only {len(out.acked)} creates answered: {out.errors}"
        time.sleep(0.01)
    out.killed.set()  # from here on a 201 may come before or after the kill: not counted as before
    scheduler = stack.procs["scheduler"]
    scheduler.kill()  # SIGKILL, with creates in flight on all sixteen clients
    scheduler.start(wait=False)
    stack.wait_healthy()
    for thread in threads:
        thread.join(timeout=RETRY_FOR_S + 30)
    assert not any(t.is_alive() for t in threads), "a client never finished"
    assert out.errors == [], out.errors

    # The kill landed on creates in flight (otherwise this test proved nothing).
    assert sum(out.failures.values()) > 0, "no create failed: the kill fell between batches"
    # One 201 per request id, and no two request ids share a task.
    assert sorted(out.acked) == request_ids
    assert len(set(out.acked.values())) == CREATES

    # The session holds exactly the acknowledged tasks — those acknowledged before the kill
    # among them — and each ran to its end.
    base = f"{stack.http_url}/api/v1/agents/{AGENT}/sessions/{SESSION}"
    with httpx.Client(headers={"Authorization": f"Bearer {key}"}, timeout=30) as http:
        deadline = time.monotonic() + 120
        while True:
            listed: list[dict[str, object]] = []
            page, pages = 0, 1
            while page < pages:
                body = http.get(f"{base}/tasks", params={"all": "true", "page_size": 100, "page": page}).json()
                listed += body["tasks"]
                pages = body["pages"]
                page += 1
            if all(t["state"] == "completed" for t in listed) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    ids = [str(t["taskId"]) for t in listed]
    assert len(ids) == len(set(ids)) == CREATES, (len(ids), len(set(ids)))
    assert set(ids) == set(out.acked.values())
    assert set(out.acked_before_kill.values()) <= set(ids)
    states = Counter(str(t["state"]) for t in listed)
    assert states == Counter({"completed": CREATES}), states
    print(
        f"\ncreate batches under a scheduler SIGKILL: {CREATES} creates, {len(out.acked_before_kill)}"
        f" acknowledged before the kill, failed answers {dict(out.failures)}, {out.resent}"
        f" creates sent again after a failure, 0 lost, 0 doubled"
    )
