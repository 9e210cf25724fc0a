"""Cron jobs, pure: which ticks are due, what a run is, how a run ends.

No grpc, no sql: the runner (``crons``) and the store (``cron_store``) build on this.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from croniter import croniter

from libs import errors
from services.scheduler.domain import Failure, State

# A run's outcome; None while it runs.
COMPLETED, FAILED, CANCELLED, TIMED_OUT = "completed", "failed", "cancelled", "timed_out"
OUTCOMES = (COMPLETED, FAILED, CANCELLED, TIMED_OUT)
SCHEDULE, MANUAL = "schedule", "manual"
# The cause a task cancelled by its run's timeout carries.
CRON_TIMED_OUT = "cron_timed_out"
# Ticks one pass fires at most per job; older missed ticks are skipped (and logged),
# so a clock jump or a long pause never becomes a burst of tasks.
MAX_TICKS_PER_PASS = 10


class CronNotFound(errors.NotFound):
    pass


class CronAccessDenied(errors.PermissionDenied):
    pass


@dataclass(frozen=True)
class CronRun:
    run_id: str
    cron_id: str
    kind: str  # schedule | manual
    started_at: int
    deadline_at: int
    scheduled_for: int | None = None  # the tick, for a scheduled run
    ended_at: int | None = None
    outcome: str | None = None
    task_ids: tuple[str, ...] = field(default_factory=tuple)
    failure: Failure | None = None

    @property
    def ended(self) -> bool:
        return self.ended_at is not None

    def ending(self, outcome: str, at: int, failure: Failure | None = None) -> CronRun:
        return replace(self, outcome=outcome, ended_at=at, failure=failure)


def _dt(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def due_ticks(schedule: str, after_ms: int, now_ms: int, limit: int = MAX_TICKS_PER_PASS) -> tuple[list[int], int]:
    """Ticks of ``schedule`` (UTC) in ``(after_ms, now_ms]``, oldest first: the newest
    ``limit`` of them, and how many older ones were skipped."""
    it = croniter(schedule, _dt(after_ms))
    ticks: list[int] = []
    skipped = 0
    while True:
        tick = int(round(it.get_next(float) * 1000))
        if tick > now_ms:
            break
        if tick <= after_ms:  # croniter's float rounding: never the same tick twice
            continue
        ticks.append(tick)
        if len(ticks) > limit:
            ticks.pop(0)
            skipped += 1
    return ticks, skipped


def next_tick(schedule: str, after_ms: int) -> int:
    return int(round(croniter(schedule, _dt(after_ms)).get_next(float) * 1000))


def outcome_of(state: State) -> str | None:
    """A run's outcome from its task's state; None while the task has not finished."""
    return {State.COMPLETED: COMPLETED, State.FAILED: FAILED, State.CANCELLED: CANCELLED}.get(state)


def run_outcome(run: CronRun, task_states: dict[str, State], now_ms: int) -> str | None:
    """How an open run ends now, if it does: its tasks' outcome once every one finished
    (the first not completed wins), else ``timed_out`` past its deadline."""
    outcomes = [outcome_of(task_states[t]) if t in task_states else None for t in run.task_ids]
    if run.task_ids and all(o is not None for o in outcomes):
        return next((o for o in outcomes if o != COMPLETED), COMPLETED)
    if now_ms >= run.deadline_at:
        return TIMED_OUT
    return None
