"""The telemetry agent's Prometheus metrics: what sampling costs.

Observed around the one sampling call (``Agent._run``), inside the sampler thread, so
the CPU figure is that thread's own time (``time.thread_time``), not the process's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from prometheus_client import Counter, Histogram

SAMPLE_SECONDS = Histogram(
    "taskgate_telemetry_sample_seconds",
    "Wall time of one sampling pass (one process-table read for every tree sampled)",
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
)
SAMPLE_CPU_SECONDS = Counter(
    "taskgate_telemetry_sample_cpu_seconds_total", "CPU time the sampler thread spent sampling"
)
TREES_SAMPLED = Counter("taskgate_telemetry_trees_sampled_total", "Process trees sampled (one per tree per pass)")

T = TypeVar("T")


def measured(sample: Callable[[], T], trees: int) -> T:
    """Run one sampling pass and record its cost (called in the sampler thread)."""
    wall, cpu = time.perf_counter(), time.thread_time()
    try:
        return sample()
    finally:
        SAMPLE_SECONDS.observe(time.perf_counter() - wall)
        SAMPLE_CPU_SECONDS.inc(time.thread_time() - cpu)
        TREES_SAMPLED.inc(trees)
