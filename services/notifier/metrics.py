"""The notifier's Prometheus metrics: delivery attempts, retries and their latency.

Observed at the one place an attempt's outcome is recorded (``Deliverer.attempt``).
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

from libs.metrics import LATENCY_BUCKETS

DELIVERY_ATTEMPTS = Counter(
    "taskgate_notifier_delivery_attempts_total",
    "Notification delivery attempts by outcome (delivered | failed) and notification kind",
    ["outcome", "kind"],
)
DELIVERY_RETRIES = Counter(
    "taskgate_notifier_delivery_retries_total", "Delivery attempts after a notification's first (retries)", ["kind"]
)
DELIVERY_SECONDS = Histogram(
    "taskgate_notifier_delivery_seconds",
    "One delivery attempt: the channel's answer (or error) and recording the outcome",
    buckets=LATENCY_BUCKETS,
)
