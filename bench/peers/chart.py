"""Draw docs/bench/tasks_per_s.png and docs/bench/latency.png from results.json (matplotlib).

Run (peers' environment): var/bench-peers-venv/bin/python bench/peers/chart.py docs/bench/results.json docs/bench
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import matplotlib  # noqa: E402

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt  # noqa: E402

from bench.comparison import TARGET_TASKS_PER_S, Comparison, SystemResult, is_taskgate  # noqa: E402

TASKGATE_COLOR, PEER_COLOR, FLOOR_COLOR = "#d62728", "#1f77b4", "#7f7f7f"


def color(s: SystemResult) -> str:
    if is_taskgate(s.key):
        return TASKGATE_COLOR
    return FLOOR_COLOR if s.key.startswith("spawn-floor") else PEER_COLOR


def subtitle(c: Comparison) -> str:
    n = max((s.n for s in c.systems), default=0)
    rounds = max((s.rounds for s in c.systems), default=0)
    loads = [s.extra["load_1m"] for s in c.systems if "load_1m" in s.extra]
    load_text = f"\nload average {min(loads):.1f}–{max(loads):.1f} (medians per system)" if loads else ""
    when = c.generated_at[:16].replace("T", " ") + " UTC" if c.generated_at else ""
    return f"N={n}, median of {rounds} rounds, {c.machine.get('cpus', '?')} cores{load_text}, {when}"


def draw_rates(c: Comparison, path: Path) -> None:
    shown = [s for s in c.systems if not s.skipped and s.tasks_per_s is not None]
    fig, ax = plt.subplots(figsize=(9, 0.6 * len(shown) + 1.8))
    labels = [s.label for s in shown]
    values = [s.tasks_per_s or 0.0 for s in shown]
    bars = ax.barh(labels, values, color=[color(s) for s in shown])
    ax.bar_label(bars, labels=[f"{v:,.0f}/s" for v in values], padding=3, fontsize=9)
    ax.axvline(TARGET_TASKS_PER_S, color=TASKGATE_COLOR, linestyle="--", linewidth=1)
    ax.text(
        TARGET_TASKS_PER_S,
        0.01,
        f" taskgate target {TARGET_TASKS_PER_S:g}/s",
        color=TASKGATE_COLOR,
        fontsize=8,
        transform=ax.get_xaxis_transform(),  # x in data, y in axes fraction: at the bottom
    )
    ax.invert_yaxis()
    ax.set_xlabel("tasks (or spawns) per second, enqueue → all completed — higher is better")
    ax.set_xlim(0, max(values + [TARGET_TASKS_PER_S]) * 1.18)
    ax.set_title(f"Throughput on one machine\n{subtitle(c)}", fontsize=10)
    skipped = [f"{s.label}: {s.skipped}" for s in c.systems if s.skipped]
    if skipped:
        fig.text(0.01, 0.01, "skipped — " + "; ".join(skipped), fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def draw_latency(c: Comparison, path: Path) -> None:
    shown = [s for s in c.systems if not s.skipped and s.latency_p50_ms is not None]
    fig, ax = plt.subplots(figsize=(9, 0.7 * len(shown) + 1.8))
    ys = range(len(shown))
    height = 0.38
    p50 = [s.latency_p50_ms or 0.0 for s in shown]
    p99 = [s.latency_p99_ms or 0.0 for s in shown]
    b50 = ax.barh([y - height / 2 for y in ys], p50, height, label="p50", color=[color(s) for s in shown])
    b99 = ax.barh([y + height / 2 for y in ys], p99, height, label="p99", color=[color(s) for s in shown], alpha=0.45)
    ax.bar_label(b50, labels=[f"p50 {v:,.1f} ms" for v in p50], padding=3, fontsize=8)
    ax.bar_label(b99, labels=[f"p99 {v:,.1f} ms" for v in p99], padding=3, fontsize=8)
    ax.set_yticks(list(ys), [s.label for s in shown])
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlim(min(p50 + p99) / 2, max(p50 + p99) * 12)
    ax.set_xlabel("per-task latency, enqueue → completed (ms, log scale; a burst of N, queue wait included)")
    ax.set_title(f"Latency on one machine\n{subtitle(c)}", fontsize=10)
    fig.text(0.01, 0.01, "spawn floor: one spawn + wait, no queue; the others: each task of the burst", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit("usage: chart.py RESULTS_JSON OUT_DIR")
    comparison = Comparison.read(Path(sys.argv[1]))
    out = Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    draw_rates(comparison, out / "tasks_per_s.png")
    draw_latency(comparison, out / "latency.png")
    print(f"wrote {out / 'tasks_per_s.png'} and {out / 'latency.png'}", flush=True)


if __name__ == "__main__":
    main()
