"""Figures of the peer comparison (issue 11 item 6): one record per system, the JSON file, the table.

Standard library only: it is imported by the project's environment (the orchestrator, the tests)
and by the peers' environment (the peer runners, the chart), which share nothing else.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1

# The targets of issue 11 for `/bin/true` worker tasks, REST created -> completed, N=1000.
TARGET_TASKS_PER_S = 600.0
TARGET_CELERY_RATIO = 0.6
TARGET_SPAWN_FLOOR_RATIO = 0.45
TARGET_SCHEDULER_CPU_MS = 1.5

TASKGATE = "taskgate"
# taskgate again with its creates ahead of its workers, as each peer's client enqueues ahead of its
# consumer: with 16 creates in flight taskgate's run is a closed loop on a create's latency (the
# creates take ~97 % of it), while every peer is timed draining a backlog.
TASKGATE_BACKLOG = "taskgate-backlog"
BACKLOG_CREATES_IN_FLIGHT = 64
SPAWN_SEQUENTIAL = "spawn-floor-sequential"
SPAWN_PARALLEL = "spawn-floor-8-in-flight"


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 1]) of a non-empty sequence."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must lie in [0, 1], not {q}")
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return float(ordered[rank - 1])


@dataclass(frozen=True)
class RoundFigures:
    """One round of one system: N tasks enqueued -> all completed."""

    tasks_per_s: float
    latencies_ms: tuple[float, ...] = ()  # per task, enqueue -> completion; empty when not measurable
    extra: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> RoundFigures:
        return cls(
            tasks_per_s=float(raw["tasks_per_s"]),
            latencies_ms=tuple(float(v) for v in raw.get("latencies_ms", ())),
            extra={str(k): float(v) for k, v in raw.get("extra", {}).items()},
        )

    def to_json(self) -> dict[str, Any]:
        return {"tasks_per_s": self.tasks_per_s, "latencies_ms": list(self.latencies_ms), "extra": self.extra}


@dataclass(frozen=True)
class SystemResult:
    """What results.json says of one system: the median round's rate, pooled latency percentiles."""

    key: str
    label: str
    workload: str
    command: str
    n: int = 0
    rounds: int = 0
    tasks_per_s: float | None = None
    round_tasks_per_s: tuple[float, ...] = ()
    latency_p50_ms: float | None = None
    latency_p99_ms: float | None = None
    extra: dict[str, float] = field(default_factory=dict)
    version: str = ""
    skipped: str | None = None  # why the system did not run; no figures then

    @classmethod
    def from_rounds(
        cls,
        key: str,
        label: str,
        workload: str,
        command: str,
        n: int,
        rounds: Sequence[RoundFigures],
        version: str = "",
    ) -> SystemResult:
        if not rounds:
            raise ValueError(f"{key}: no rounds")
        pooled = [v for r in rounds for v in r.latencies_ms]
        extra_keys = sorted({k for r in rounds for k in r.extra})
        return cls(
            key=key,
            label=label,
            workload=workload,
            command=command,
            n=n,
            rounds=len(rounds),
            tasks_per_s=statistics.median(r.tasks_per_s for r in rounds),
            round_tasks_per_s=tuple(r.tasks_per_s for r in rounds),
            latency_p50_ms=percentile(pooled, 0.50) if pooled else None,
            latency_p99_ms=percentile(pooled, 0.99) if pooled else None,
            extra={k: statistics.median(r.extra[k] for r in rounds if k in r.extra) for k in extra_keys},
            version=version,
        )

    @classmethod
    def skip(cls, key: str, label: str, workload: str, command: str, reason: str) -> SystemResult:
        return cls(key=key, label=label, workload=workload, command=command, skipped=reason)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> SystemResult:
        def opt(name: str) -> float | None:
            value = raw.get(name)
            return None if value is None else float(value)

        return cls(
            key=str(raw["key"]),
            label=str(raw["label"]),
            workload=str(raw["workload"]),
            command=str(raw["command"]),
            n=int(raw.get("n", 0)),
            rounds=int(raw.get("rounds", 0)),
            tasks_per_s=opt("tasks_per_s"),
            round_tasks_per_s=tuple(float(v) for v in raw.get("round_tasks_per_s", ())),
            latency_p50_ms=opt("latency_p50_ms"),
            latency_p99_ms=opt("latency_p99_ms"),
            extra={str(k): float(v) for k, v in raw.get("extra", {}).items()},
            version=str(raw.get("version", "")),
            skipped=raw.get("skipped"),
        )

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["round_tasks_per_s"] = list(self.round_tasks_per_s)
        return out


@dataclass(frozen=True)
class Target:
    name: str
    wanted: str
    measured: float | None
    met: bool | None  # None: a figure it needs is missing


@dataclass(frozen=True)
class Comparison:
    systems: tuple[SystemResult, ...]
    generated_at: str = ""
    machine: dict[str, Any] = field(default_factory=dict)

    def get(self, key: str) -> SystemResult | None:
        for system in self.systems:
            if system.key == key:
                return system
        return None

    def rate(self, key: str) -> float | None:
        system = self.get(key)
        return None if system is None or system.skipped else system.tasks_per_s

    def ratios(self, own_key: str = TASKGATE) -> dict[str, float]:
        """taskgate's tasks/s (``own_key``: which of its runs) divided by each other system's that
        has a figure; taskgate's other run is not one of them."""
        own = self.rate(own_key)
        if not own:
            return {}
        out = {}
        for system in self.systems:
            other = self.rate(system.key)
            if not is_taskgate(system.key) and other:
                out[system.key] = own / other
        return out

    def targets(self) -> list[Target]:
        own = self.rate(TASKGATE)
        ratios = self.ratios()
        taskgate = self.get(TASKGATE)
        cpu = None if taskgate is None else taskgate.extra.get("scheduler_cpu_ms_per_task")

        def at_least(value: float | None, bound: float) -> bool | None:
            return None if value is None else value >= bound

        procrastinate = self.rate("procrastinate")

        def above_procrastinate(name: str, own_key: str) -> Target:
            rate = self.rate(own_key)
            met = None if rate is None or procrastinate is None else rate > procrastinate
            return Target(name, "> 1.0x procrastinate", self.ratios(own_key).get("procrastinate"), met)

        # The backlog run's own target only where it ran (results.json files before it have none).
        with_backlog = self.get(TASKGATE_BACKLOG) is not None
        return [
            Target("tasks/s", f">= {TARGET_TASKS_PER_S:g}/s", own, at_least(own, TARGET_TASKS_PER_S)),
            above_procrastinate("above procrastinate", TASKGATE),
            *([above_procrastinate("above procrastinate, with a backlog", TASKGATE_BACKLOG)] if with_backlog else []),
            Target(
                "vs Celery",
                f">= {TARGET_CELERY_RATIO:g}x Celery",
                ratios.get("celery"),
                at_least(ratios.get("celery"), TARGET_CELERY_RATIO),
            ),
            Target(
                "vs sequential spawn floor",
                f">= {TARGET_SPAWN_FLOOR_RATIO:g}x",
                ratios.get(SPAWN_SEQUENTIAL),
                at_least(ratios.get(SPAWN_SEQUENTIAL), TARGET_SPAWN_FLOOR_RATIO),
            ),
            Target(
                "scheduler CPU per task",
                f"<= {TARGET_SCHEDULER_CPU_MS:g} ms",
                cpu,
                None if cpu is None else cpu <= TARGET_SCHEDULER_CPU_MS,
            ),
        ]

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_VERSION,
            "generated_at": self.generated_at,
            "machine": self.machine,
            "systems": [s.to_json() for s in self.systems],
            "ratios_taskgate_to": self.ratios(),
            "targets": [asdict(t) for t in self.targets()],
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Comparison:
        if raw.get("schema") != SCHEMA_VERSION:
            raise ValueError(f"results schema {raw.get('schema')!r}, expected {SCHEMA_VERSION}")
        return cls(
            systems=tuple(SystemResult.from_json(s) for s in raw["systems"]),
            generated_at=str(raw.get("generated_at", "")),
            machine=dict(raw.get("machine", {})),
        )

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=2, sort_keys=False) + "\n")

    @classmethod
    def read(cls, path: Path) -> Comparison:
        return cls.from_json(json.loads(path.read_text()))


def is_taskgate(key: str) -> bool:
    """Whether a system's key is one of taskgate's runs (16 creates in flight, or a backlog)."""
    return key in (TASKGATE, TASKGATE_BACKLOG)


def _fmt(value: float | None, digits: int = 1, suffix: str = "") -> str:
    return "—" if value is None else f"{value:,.{digits}f}{suffix}"


def _ms(value: float | None) -> str:
    """Milliseconds with the digits that mean something at that size."""
    if value is None:
        return "—"
    return _fmt(value, 2 if value < 10 else 1 if value < 1000 else 0, " ms")


def markdown_table(comparison: Comparison) -> str:
    """The README's table: one row per system, the command that reproduces each figure.

    "load avg" is the median over the rounds of the 1-minute load average as each round ended.
    """
    ratios = comparison.ratios()
    lines = [
        "| system | workload | tasks/s (median) | latency p50 | latency p99 | taskgate ÷ system | load avg "
        "| reproduce |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in comparison.systems:
        if s.skipped:
            lines.append(f"| {s.label} | {s.workload} | skipped: {s.skipped} | — | — | — | — | `{s.command}` |")
            continue
        ratio = "1" if s.key == TASKGATE else "—" if is_taskgate(s.key) else _fmt(ratios.get(s.key), 2, "×")
        lines.append(
            f"| {s.label} | {s.workload} (N={s.n}, {s.rounds} rounds) | {_fmt(s.tasks_per_s)} "
            f"| {_ms(s.latency_p50_ms)} | {_ms(s.latency_p99_ms)} | {ratio} "
            f"| {_fmt(s.extra.get('load_1m'))} | `{s.command}` |"
        )
    return "\n".join(lines)


def targets_table(comparison: Comparison) -> str:
    lines = ["| target (issue 11) | wanted | measured | met |", "|---|---|---|---|"]
    for t in comparison.targets():
        met = "—" if t.met is None else ("yes" if t.met else "no")
        digits = 2 if t.name != "tasks/s" else 1
        lines.append(f"| {t.name} | {t.wanted} | {_fmt(t.measured, digits)} | {met} |")
    return "\n".join(lines)


def summary_lines(comparison: Comparison) -> Iterable[str]:
    """Plain lines for the terminal: each figure with the command that reproduces it."""
    ratios = comparison.ratios()
    for s in comparison.systems:
        if s.skipped:
            yield f"  {s.label:<44} skipped: {s.skipped}"
            continue
        ratio = "" if s.key not in ratios else f"  taskgate/this {ratios[s.key]:.2f}x"
        yield (
            f"  {s.label:<44} {_fmt(s.tasks_per_s):>9} tasks/s  p50 {_fmt(s.latency_p50_ms, 2):>8} ms  "
            f"p99 {_fmt(s.latency_p99_ms, 2):>8} ms{ratio}"
        )
        yield f"      reproduce: {s.command}"
    for t in comparison.targets():
        met = "n/a" if t.met is None else ("met" if t.met else "NOT met")
        yield f"  target {t.name}: wanted {t.wanted}, measured {_fmt(t.measured, 2)} -> {met}"
