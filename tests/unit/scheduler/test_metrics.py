"""The scheduler's lifecycle metrics: counted from committed changes only, timed from queued."""

from __future__ import annotations

from prometheus_client import REGISTRY

from services.scheduler.domain import State
from services.scheduler.metrics import LifecycleMetrics
from tests.unit.scheduler.test_domain import make_task


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_transitions_and_launch_timings_come_from_published_changes() -> None:
    metrics = LifecycleMetrics()
    before = {
        "created": sample("taskgate_task_transitions_total", **{"from": "none", "to": "queued"}),
        "launched": sample("taskgate_task_transitions_total", **{"from": "queued", "to": "running"}),
        "latency": sample("taskgate_task_launch_latency_seconds_count"),
        "latency_sum": sample("taskgate_task_launch_latency_seconds_sum"),
        "wait_sum": sample("taskgate_task_queue_wait_seconds_sum"),
    }
    queued = make_task(State.QUEUED, task_id="t-metrics", created_at=1_000, started_at=None, first_started_at=None)
    metrics.published("task.state_changed", 1_000, None, queued, now_ms=1_000)
    # A progress event is no transition.
    metrics.published("task.progress", 1_500, State.QUEUED, queued, now_ms=1_500)
    running = make_task(State.RUNNING, task_id="t-metrics", created_at=1_000, started_at=4_000, first_started_at=4_000)
    # The launch began at 3,000 (the change's time); running was committed at 4,500.
    metrics.published("task.state_changed", 3_000, State.QUEUED, running, now_ms=4_500)

    assert sample("taskgate_task_transitions_total", **{"from": "none", "to": "queued"}) == before["created"] + 1
    assert sample("taskgate_task_transitions_total", **{"from": "queued", "to": "running"}) == before["launched"] + 1
    assert sample("taskgate_task_launch_latency_seconds_count") == before["latency"] + 1
    assert abs(sample("taskgate_task_launch_latency_seconds_sum") - before["latency_sum"] - 3.5) < 1e-9
    assert abs(sample("taskgate_task_queue_wait_seconds_sum") - before["wait_sum"] - 2.0) < 1e-9
    assert metrics.queued_since == {}, "nothing kept once the task runs"


def test_a_task_that_ends_while_queued_is_forgotten() -> None:
    metrics = LifecycleMetrics()
    queued = make_task(State.QUEUED, task_id="t-gone", created_at=1, started_at=None, first_started_at=None)
    metrics.published("task.state_changed", 1, None, queued, now_ms=1)
    cancelled = make_task(State.CANCELLED, task_id="t-gone", created_at=1, started_at=None, first_started_at=None)
    metrics.published("task.state_changed", 2, State.QUEUED, cancelled, now_ms=2)
    assert metrics.queued_since == {}
