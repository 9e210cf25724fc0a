"""The pending-registry's Prometheus metrics: entries registered and claimed, questions.

Counted where the registry decides (``PendingEntries.ask`` / ``_claim``, ``Questions``);
the open entries and waiting front-ends are read from memory on scrape (``__main__``).
"""

from __future__ import annotations

from prometheus_client import Counter

ENTRIES_REGISTERED = Counter(
    "taskgate_pending_entries_registered_total",
    "Pending entries (asks, confirms, secrets) registered, by kind",
    ["kind"],
)
ENTRY_CLAIMS = Counter("taskgate_pending_entry_claims_total", "Pending entries claimed by a front-end")
QUESTIONS = Counter(
    "taskgate_pending_questions_total", "Task questions asked and answered (first answer only)", ["event"]
)
QUESTIONS_PRUNED = Counter(
    "taskgate_pending_questions_pruned_total",
    "Questions deleted by question retention (tasks ended longer ago than pending_question_retention_ms)",
)
