"""The peer comparison's result code: rounds -> figures, ratios, targets, results.json, the README table.

Timings are not tested here (benchmarks print them); only what is computed from them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.compare_peers import result_from_file
from bench.comparison import (
    SPAWN_SEQUENTIAL,
    TASKGATE,
    TASKGATE_BACKLOG,
    Comparison,
    RoundFigures,
    SystemResult,
    markdown_table,
    percentile,
    summary_lines,
    targets_table,
)


def system(key: str, rates: list[float], latencies: tuple[float, ...] = (), **extra: float) -> SystemResult:
    rounds = [RoundFigures(tasks_per_s=r, latencies_ms=latencies, extra=dict(extra)) for r in rates]
    return SystemResult.from_rounds(key, key.title(), "no-op", f"run {key}", 1000, rounds, version="1.0")


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert percentile(values, 0.5) == 50.0
    assert percentile(values, 0.99) == 99.0
    assert percentile(values, 1.0) == 100.0
    assert percentile([7.0], 0.99) == 7.0
    with pytest.raises(ValueError):
        percentile([], 0.5)
    with pytest.raises(ValueError):
        percentile([1.0], 1.5)


def test_rounds_give_median_rate_pooled_latencies_and_median_extras() -> None:
    rounds = [
        RoundFigures(tasks_per_s=50.0, latencies_ms=(1.0, 2.0), extra={"scheduler_cpu_ms_per_task": 9.0}),
        RoundFigures(tasks_per_s=70.0, latencies_ms=(3.0, 4.0), extra={"scheduler_cpu_ms_per_task": 7.0}),
        RoundFigures(tasks_per_s=60.0, latencies_ms=(100.0,), extra={"scheduler_cpu_ms_per_task": 8.0}),
    ]
    result = SystemResult.from_rounds(TASKGATE, "taskgate", "w", "cmd", 1000, rounds)
    assert result.tasks_per_s == 60.0
    assert result.round_tasks_per_s == (50.0, 70.0, 60.0)
    assert result.rounds == 3
    assert result.latency_p50_ms == 3.0  # of the pooled 1, 2, 3, 4, 100
    assert result.latency_p99_ms == 100.0
    assert result.extra == {"scheduler_cpu_ms_per_task": 8.0}


def test_a_system_without_latencies_has_none() -> None:
    result = system("huey", [10.0])
    assert result.latency_p50_ms is None and result.latency_p99_ms is None
    with pytest.raises(ValueError):
        SystemResult.from_rounds("x", "x", "w", "cmd", 1, [])


def test_ratios_and_targets_against_the_issue() -> None:
    comparison = Comparison(
        systems=(
            system(TASKGATE, [100.0], scheduler_cpu_ms_per_task=8.0),
            system("procrastinate", [400.0]),
            system("celery", [150.0]),
            system(SPAWN_SEQUENTIAL, [200.0]),
            SystemResult.skip("huey", "Huey", "no-op", "run huey", "not installed"),
        )
    )
    assert comparison.ratios() == {"procrastinate": 0.25, "celery": 100.0 / 150.0, SPAWN_SEQUENTIAL: 0.5}
    targets = {t.name: t for t in comparison.targets()}
    assert targets["tasks/s"].met is False and targets["tasks/s"].measured == 100.0
    assert targets["above procrastinate"].met is False
    assert targets["vs Celery"].met is True  # 0.67 >= 0.6
    assert targets["vs sequential spawn floor"].met is True  # 0.5 >= 0.45
    assert targets["scheduler CPU per task"].met is False and targets["scheduler CPU per task"].measured == 8.0


def test_the_backlog_run_is_judged_against_procrastinate_apart_and_is_no_peer() -> None:
    comparison = Comparison(
        systems=(
            system(TASKGATE, [600.0], scheduler_cpu_ms_per_task=0.9),
            system(TASKGATE_BACKLOG, [780.0]),
            system("procrastinate", [650.0]),
        )
    )
    # taskgate's own ratios leave its other run out; the backlog run has its own.
    assert comparison.ratios() == {"procrastinate": 600.0 / 650.0}
    assert comparison.ratios(TASKGATE_BACKLOG) == {"procrastinate": 1.2}
    targets = {t.name: t for t in comparison.targets()}
    assert targets["above procrastinate"].met is False
    assert targets["above procrastinate, with a backlog"].met is True
    assert targets["above procrastinate, with a backlog"].measured == 1.2
    table = markdown_table(comparison).splitlines()
    assert "| 780.0 |" in table[3] and "| — |" in table[3]  # no "taskgate ÷ itself"
    assert "| 0.92× |" in table[4]
    lines = list(summary_lines(comparison))
    assert not any("taskgate/this" in line for line in lines[:4])  # taskgate's two runs
    # Without the backlog run there is no such target (older results.json files).
    without = Comparison(systems=(system(TASKGATE, [600.0]), system("procrastinate", [650.0])))
    assert "above procrastinate, with a backlog" not in {t.name for t in without.targets()}


def test_targets_without_the_figures_they_need_are_unknown() -> None:
    comparison = Comparison(systems=(system("huey", [1000.0]),))
    assert comparison.ratios() == {}
    assert all(t.met is None for t in comparison.targets())


def test_results_json_round_trips(tmp_path: Path) -> None:
    comparison = Comparison(
        systems=(
            system(TASKGATE, [90.0, 95.0], (10.0, 20.0), scheduler_cpu_ms_per_task=7.5),
            SystemResult.skip("celery", "Celery (Redis)", "no-op", "run celery", "redis-server is not on PATH"),
        ),
        generated_at="2026-11-30T16:00:00+00:00",
        machine={"cpus": 2},
    )
    path = tmp_path / "docs" / "results.json"
    comparison.write(path)
    raw = json.loads(path.read_text())
    assert raw["schema"] == 1
    assert [s["key"] for s in raw["systems"]] == [TASKGATE, "celery"]
    assert raw["systems"][1]["skipped"] == "redis-server is not on PATH"
    assert raw["systems"][1]["tasks_per_s"] is None
    assert {t["name"] for t in raw["targets"]} >= {"tasks/s", "scheduler CPU per task"}
    assert Comparison.read(path) == comparison
    raw["schema"] = 99
    with pytest.raises(ValueError, match="schema"):
        Comparison.from_json(raw)


def test_table_rows_carry_figures_ratios_skips_and_commands() -> None:
    comparison = Comparison(
        systems=(
            system(TASKGATE, [100.0], (5.0,), scheduler_cpu_ms_per_task=8.0),
            system("procrastinate", [400.0], (2.5,), load_1m=3.25),
            SystemResult.skip("celery", "Celery (Redis)", "no-op", "make bench-peers", "redis-server is not on PATH"),
        )
    )
    table = markdown_table(comparison).splitlines()
    assert len(table) == 2 + 3
    assert table[2].startswith("| Taskgate |") and "| 100.0 |" in table[2] and "`run taskgate`" in table[2]
    assert "| 0.25× | 3.2 |" in table[3] and "2.50 ms" in table[3]
    assert "skipped: redis-server is not on PATH" in table[4] and "`make bench-peers`" in table[4]
    targets = targets_table(comparison)
    assert "| tasks/s | >= 600/s | 100.0 | no |" in targets
    assert "| vs Celery | >= 0.6x Celery | — | — |" in targets
    lines = list(summary_lines(comparison))
    assert any("reproduce: run procrastinate" in line for line in lines)
    assert any("skipped: redis-server is not on PATH" in line for line in lines)


def test_a_runner_file_becomes_a_system_result(tmp_path: Path) -> None:
    path = tmp_path / "huey.json"
    rounds = [{"tasks_per_s": 900.0, "latencies_ms": [1.0, 3.0]}, {"tasks_per_s": 1100.0, "latencies_ms": [2.0]}]
    path.write_text(json.dumps({"version": "huey 3.5.4", "config": {}, "rounds": rounds}))
    result = result_from_file("huey", path, 1000, "make bench-peers")
    assert result.label == "Huey (SQLite)"
    assert result.version == "huey 3.5.4"
    assert result.tasks_per_s == 1000.0
    assert result.latency_p50_ms == 2.0
