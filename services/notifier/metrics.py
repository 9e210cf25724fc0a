"""The notifier's Prometheus metrics: delivery attempts, retries and their latency
(observed at the one place an attempt's outcome is recorded, ``Deliverer.attempt``),
and the scheduler event log's batches (``EventLogFollower.handle_batch``).
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
NOTIFICATIONS_PRUNED = Counter(
    "taskgate_notifier_notifications_pruned_total",
    "Notifications done with, deleted with their delivery attempts by [notifier] notification_retention_ms",
)
CONVERSATION_ROWS_PRUNED = Counter(
    "taskgate_notifier_conversation_rows_pruned_total",
    "History messages, final response snapshots and conversation events deleted by [notifier]"
    " conversation_retention_ms",
    ["kind"],
)
EVENT_LOG_EVENTS = Counter(
    "taskgate_notifier_event_log_events_total", "Scheduler event-log events applied (committed) by the notifier"
)
EVENT_LOG_BATCHES = Counter(
    "taskgate_notifier_event_log_batches_total",
    "Transactions the event-log events were applied in (events / batches = the mean batch size)",
)
