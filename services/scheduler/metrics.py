"""The scheduler's Prometheus metrics, fed from one chokepoint: ``Runtime.published``.

Every committed change reaches watchers through ``published`` (after commit), so the
transition counter and the launch timings are observed there and nowhere else: a
refused or rolled-back change is never counted. The tasks-by-state gauge and the
watcher count are computed on scrape (``libs.metrics.ScrapeGauge``).
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

from libs.metrics import LATENCY_BUCKETS, Children
from services.scheduler.domain import State, Task

TRANSITIONS = Counter(
    "taskgate_task_transitions_total",
    "Committed task state changes by previous and new state (from=none: a task created)",
    ["from", "to"],
)
LAUNCH_LATENCY = Histogram(
    "taskgate_task_launch_latency_seconds",
    "From a task becoming queued to its worker committed running (queue wait + spawn + identity + commit)",
    buckets=LATENCY_BUCKETS,
)
BATCHES = Counter(
    "taskgate_group_commit_batches_total",
    "Group-commit transactions of the scheduler's store that committed (one or more units each)",
)
# On SQLite a batch may commit on the event loop (``group_commit``): its wall time is then time
# the loop did nothing else — a commit that meets the WAL checkpoint's fsync shows here.
BATCH_SECONDS = Histogram(
    "taskgate_group_commit_batch_seconds",
    "Wall time of each group-commit batch (its transaction, and a rerun's), by where it ran: "
    "loop (SQLite, the database thread idle) or thread",
    ["on"],
    buckets=LATENCY_BUCKETS[:10],
)
BATCH_RERUNS = Counter(
    "taskgate_group_commit_reruns_total",
    "Batches run without savepoints in which a unit failed, run again with each unit isolated",
)
# Where the database thread's time goes, by kind of store unit (``group_commit``): its CPU, not
# its wall time, so waiting for the GIL or the disk is not counted. What the thread spends
# besides (begin, savepoints, commit) is its total CPU less these.
STORE_UNITS = Counter(
    "taskgate_store_units_total",
    "Units of work the scheduler's group commit ran (on its database thread or its event loop), "
    "by store call (update_task, create_task ...)",
    ["unit"],
)
STORE_UNIT_CPU = Counter(
    "taskgate_store_unit_cpu_seconds_total",
    "CPU time (of the thread that ran it) inside each kind of store unit, committed or not",
    ["unit"],
)
TASKS_PRUNED = Counter(
    "taskgate_tasks_pruned_total",
    "Finished tasks deleted with their events and attempts by [tasks] finished_task_retention_ms",
)
CRON_RUNS_PRUNED = Counter(
    "taskgate_cron_runs_pruned_total",
    "Ended cron runs deleted by [tasks] finished_task_retention_ms",
)
# A launch's wall time by step, from its claim to its worker committed running: where a launch
# waits (for the group commit, for a spawn thread, for the CPU) when the host is busy.
WORKER_SPAWNS = Counter(
    "taskgate_worker_spawns_total",
    "Workers spawned, by what spawned them: helper (taskgate-spawn) or scheduler (itself, on a "
    "thread: worker_spawn = scheduler, no helper built, or the helper gone)",
    ["by"],
)
EXIT_PROOFS = Counter(
    "taskgate_exit_proofs_total",
    "Exited workers whose attempt was looked at for leftovers, by what answered: kernel (the "
    "leader's pidfd, the cgroup and this process's children said nothing is left, no table read) "
    "or table (a process-table read was needed: something may be left, or the kernel could not tell)",
    ["by"],
)
LAUNCH_STEP = Histogram(
    "taskgate_task_launch_step_seconds",
    "Wall time of each step of a launch: claim_commit (the task, its earlier attempts and the "
    "launching attempt, one transaction), spawn (log file, cgroup, held fork/exec, start time; "
    "with its wait for a thread), running_commit (the pid, start time and `running` in one "
    "transaction, the worker still held), release (the worker let go, the event published)",
    ["step"],
    buckets=LATENCY_BUCKETS,
)
LAUNCH_STEPS = ("claim_commit", "spawn", "running_commit", "release")
STREAM_BATCH_SECONDS = Histogram(
    "taskgate_create_stream_batch_seconds",
    "Batches of creates on StreamCreateTasks streams (the gateway's), from reading one to "
    "writing its answer, by outcome: ok (its creates answered, each made or refused alone), "
    "refused (the batch whole: empty, too large, a malformed call_id) or failed (a fault: INTERNAL)",
    ["outcome"],
    buckets=LATENCY_BUCKETS[:10],
)
QUEUE_WAIT = Histogram(
    "taskgate_task_queue_wait_seconds",
    "From a task becoming queued to the dispatcher starting its launch (waiting for a slot)",
    buckets=LATENCY_BUCKETS,
)


class LifecycleMetrics:
    """Observes committed changes; remembers when each task of this incarnation was queued."""

    def __init__(self) -> None:
        self.queued_since: dict[str, int] = {}  # task id -> ms it became queued
        self._transitions = Children(TRANSITIONS)  # per (from, to)

    def published(self, event_type: str, at: int, previous: State | None, task: Task, now_ms: int) -> None:
        if event_type != "task.state_changed":
            return
        if previous != task.state:
            self._transitions(previous.value if previous is not None else "none", task.state.value).inc()
        if task.state == State.QUEUED:
            self.queued_since[task.task_id] = at
        elif task.state == State.RUNNING and previous == State.QUEUED:
            queued_at = self.queued_since.pop(task.task_id, None)
            if queued_at is None and task.first_started_at == task.started_at:
                queued_at = task.created_at  # queued by an earlier incarnation, first launch
            if queued_at is not None:
                # ``at`` of the running change is when its launch began (before the spawn).
                QUEUE_WAIT.observe(max(0, at - queued_at) / 1000)
                LAUNCH_LATENCY.observe(max(0, now_ms - queued_at) / 1000)
        else:
            self.queued_since.pop(task.task_id, None)
