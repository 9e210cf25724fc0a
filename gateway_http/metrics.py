"""The HTTP edge's Prometheus metrics: requests, SSE subscribers and the shared upstream watches.

Served on their own port (``gateway_metrics_port``), never on the public API port.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from libs.metrics import LATENCY_BUCKETS

HTTP_DURATION = Histogram(
    "taskgate_http_request_duration_seconds",
    "HTTP requests by method, route template and status (a stream: until its response starts)",
    ["method", "route", "status"],
    buckets=LATENCY_BUCKETS,
)
SSE_SUBSCRIBERS = Gauge(
    "taskgate_sse_subscribers",
    "Open SSE streams by kind (tasks: a session's stream | task: one task's stream | activity)",
    ["stream"],
)
SSE_DROPPED = Counter(
    "taskgate_sse_subscribers_dropped_total",
    "SSE subscribers ended for falling behind their bounded buffer, by kind",
    ["stream"],
)
TASK_WATCHES = Gauge(
    "taskgate_gateway_task_watches",
    "WatchTasks streams this gateway holds open to the scheduler (one per watched session, shared)",
)
CREATE_BATCH = Histogram(
    "taskgate_gateway_create_batch_creates",
    "Creates per CreateTasks call the gateway sent to the scheduler (the creates that arrived while one was in flight)",
    buckets=(1, 2, 4, 8, 16, 32, 64),
)
