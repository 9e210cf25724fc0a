"""Every service's /metrics, scraped from the running stack: the named metrics exist and move.

Counters are shared with the other tests of the session's stack, so each check compares
a scrape before with one after.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import Api
from tests.support.stack import Stack

EXPECTED = {
    "scheduler": {
        "taskgate_tasks",
        "taskgate_task_transitions",
        "taskgate_task_launch_latency_seconds",
        "taskgate_task_queue_wait_seconds",
        "taskgate_task_watchers",
        "taskgate_group_commit_batches",
        "taskgate_group_commit_batch_seconds",
        "taskgate_group_commit_reruns",
        "taskgate_store_units",
        "taskgate_store_unit_cpu_seconds",
        "taskgate_exit_proofs",
        "taskgate_rpc_duration_seconds",
    },
    "pending": {
        "taskgate_pending_entries_registered",
        "taskgate_pending_entry_claims",
        "taskgate_pending_questions",
        "taskgate_pending_open_entries",
        "taskgate_pending_waiters",
        "taskgate_rpc_duration_seconds",
    },
    "telemetry": {
        "taskgate_telemetry_sample_seconds",
        "taskgate_telemetry_sample_cpu_seconds",
        "taskgate_telemetry_trees_sampled",
        "taskgate_telemetry_watched_trees",
        "taskgate_rpc_duration_seconds",
    },
    "notifier": {
        "taskgate_notifier_delivery_attempts",
        "taskgate_notifier_delivery_retries",
        "taskgate_notifier_delivery_seconds",
        "taskgate_rpc_duration_seconds",
    },
    "gateway": {
        "taskgate_http_request_duration_seconds",
        "taskgate_sse_subscribers",
        "taskgate_sse_subscribers_dropped",
        "taskgate_gateway_task_watches",
        "taskgate_gateway_create_batch_creates",
    },
}

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(stack: Stack, service: str) -> tuple[set[str], Samples]:
    response = httpx.get(stack.metrics_url(service), timeout=10)
    assert response.status_code == 200, response.text
    families = list(text_string_to_metric_families(response.text))
    samples = {(s.name, frozenset(s.labels.items())): s.value for f in families for s in f.samples}
    return {f.name for f in families}, samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def eventually(check: Callable[[], bool], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_every_service_serves_its_metrics(stack: Stack) -> None:
    for service, names in EXPECTED.items():
        present, _ = scrape(stack, service)
        assert names <= present, (service, names - present)


def test_a_task_moves_the_lifecycle_metrics(stack: Stack, api: Api) -> None:
    _, before = scrape(stack, "scheduler")
    task = api.create("metered", profile="exit-at-once")
    api.wait_state(task["taskId"], "completed")

    def moved() -> bool:
        _, after = scrape(stack, "scheduler")
        return value(after, "taskgate_task_transitions_total", **{"from": "running", "to": "completed"}) > value(
            before, "taskgate_task_transitions_total", **{"from": "running", "to": "completed"}
        )

    eventually(moved)
    _, after = scrape(stack, "scheduler")
    for previous, state in [("none", "queued"), ("queued", "running"), ("running", "completed")]:
        labels = {"from": previous, "to": state}
        assert value(after, "taskgate_task_transitions_total", **labels) >= (
            value(before, "taskgate_task_transitions_total", **labels) + 1
        ), labels
    for histogram in ("taskgate_task_launch_latency_seconds", "taskgate_task_queue_wait_seconds"):
        assert value(after, f"{histogram}_count") >= value(before, f"{histogram}_count") + 1, histogram
    assert value(after, "taskgate_tasks", state="completed") >= value(before, "taskgate_tasks", state="completed") + 1
    # Spawned by the spawn helper wherever `make` built it (the default worker_spawn = auto).
    from services.scheduler.spawner import SPAWN_PROGRAM

    by = "helper" if SPAWN_PROGRAM.is_file() else "scheduler"
    assert (
        value(after, "taskgate_worker_spawns_total", by=by) >= value(before, "taskgate_worker_spawns_total", by=by) + 1
    )
    # The worker left nothing: the kernel proved it (leader's pidfd, cgroup, no stray child) with
    # no table read, wherever it can (Linux 6.9 with /proc children lists).
    from libs.proctree import kernel_answers_exits

    proof, other = ("kernel", "table") if kernel_answers_exits() else ("table", "kernel")
    assert (
        value(after, "taskgate_exit_proofs_total", by=proof)
        >= value(before, "taskgate_exit_proofs_total", by=proof) + 1
    )
    assert value(after, "taskgate_exit_proofs_total", by=other) == value(before, "taskgate_exit_proofs_total", by=other)
    # The gateway sends its creates in batches on its StreamCreateTasks stream (one create here, alone).
    batches = "taskgate_create_stream_batch_seconds_count"
    assert value(after, batches, outcome="ok") > value(before, batches, outcome="ok")
    # The gateway timed the REST call by its route template (no task ids in labels).
    _, gateway = scrape(stack, "gateway")
    route = {"method": "POST", "route": "/api/v1/agents/{agentId}/sessions/{sessionId}/tasks", "status": "201"}
    assert value(gateway, "taskgate_http_request_duration_seconds_count", **route) >= 1
    assert value(gateway, "taskgate_gateway_create_batch_creates_count") >= 1
    _, telemetry = scrape(stack, "telemetry")
    assert value(telemetry, "taskgate_telemetry_sample_seconds_count") > 0


@contextmanager
def task_stream(api: Api) -> Iterator[list[dict[str, object]]]:
    """An open /tasks/events stream (headers received) whose frames a thread collects."""
    frames: list[dict[str, object]] = []
    client = httpx.Client(timeout=30)
    request = client.build_request("GET", api.base + "/tasks/events", headers={"Authorization": f"Bearer {api.key}"})
    response = client.send(request, stream=True)
    assert response.status_code == 200

    def read() -> None:
        try:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    frames.append(json.loads(line[len("data: ") :]))
        except httpx.HTTPError:
            pass  # closed by the test

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        yield frames
    finally:
        # Closing the response does not wake the reader blocked in recv (it waited for the next
        # heartbeat: 10 s per stream); shutting the socket down does, and the gateway sees the close.
        with contextlib.suppress(OSError):
            response.extensions["network_stream"].get_extra_info("socket").shutdown(socket.SHUT_RDWR)
        response.close()
        client.close()
        reader.join(timeout=10)
        assert not reader.is_alive(), "the stream's reader did not end"


def test_task_streams_share_one_watch_and_send_slim_events(stack: Stack, api: Api) -> None:
    def gauges() -> tuple[float, float, float]:
        _, gateway = scrape(stack, "gateway")
        _, scheduler = scrape(stack, "scheduler")
        return (
            value(gateway, "taskgate_sse_subscribers", stream="tasks"),
            value(gateway, "taskgate_gateway_task_watches"),
            value(scheduler, "taskgate_task_watchers"),
        )

    # Streams of earlier tests on this stack may still be going away: counted now, they would
    # be missed at the end. Start from a gateway that holds none.
    eventually(lambda: gauges()[:2] == (0, 0), timeout_s=30)
    subscribers, watches, watchers = gauges()
    with task_stream(api) as first:
        assert gauges()[:2] == (subscribers + 1, watches + 1)
        with task_stream(api) as second, task_stream(api) as third:
            # Three clients of one session: still one stream to the scheduler (its count may
            # still include a watcher of an earlier test that is going away, never two more).
            now = gauges()
            assert now[:2] == (subscribers + 3, watches + 1) and now[2] <= watchers + 1, (now, watchers)
            task = api.create("slim", profile="exit-at-once", instructions="long instructions " * 50)
            for frames in (first, second, third):

                def completed(frames: list[dict[str, object]] = frames) -> bool:
                    return any(
                        f["task"]["taskId"] == task["taskId"] and f["task"]["state"] == "completed"  # type: ignore[index]
                        for f in frames
                    )

                eventually(completed)
            mine = [f["task"] for f in first if f["task"]["taskId"] == task["taskId"]]  # type: ignore[index]
            for snapshot in mine:
                assert isinstance(snapshot, dict)
                assert {"taskId", "title", "state", "revision", "updatedAt"} <= set(snapshot), snapshot
                assert not {"instructions", "result", "attempts", "execution"} & set(snapshot), snapshot
        eventually(lambda: gauges()[:2] == (subscribers + 1, watches + 1))
    # The last client gone: the gateway closes the shared watch too.
    eventually(lambda: gauges()[:2] == (subscribers, watches))
