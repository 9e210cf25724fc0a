"""The benchmarks' conditions probes: a file create's cost and the machine's busy share.

Their timings are not asserted (benchmarks print them); what they read and leave behind is.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench.stats import CpuTimes, create_cost_us

# /proc/stat's first line: user nice system idle iowait irq softirq steal guest guest_nice
EARLIER = "cpu  1000 10 300 5000 40 0 20 5 70 0\ncpu0 500 5 150 2500 20 0 10 2 35 0\n"
LATER = "cpu  1600 10 500 5600 60 0 30 5 90 0\ncpu0 800 5 250 2800 30 0 15 2 45 0\n"


def test_busy_share_counts_kernel_and_user_time_as_busy_and_iowait_as_idle() -> None:
    earlier, later = CpuTimes.parse(EARLIER), CpuTimes.parse(LATER)
    # busy: user +600, system +200, softirq +10 (guest is inside user); idle: +600, iowait +20
    assert later.busy_share_since(earlier) == pytest.approx(810 / (810 + 620))


def test_busy_share_of_no_time_is_zero() -> None:
    same = CpuTimes.parse(EARLIER)
    assert same.busy_share_since(same) == 0.0


def test_an_old_kernel_without_the_steal_column_parses() -> None:
    times = CpuTimes.parse("cpu  100 0 50 900 10 1 2\n")
    assert (times.busy, times.idle) == (153, 910)


def test_the_live_machine_reads() -> None:
    before = CpuTimes.now()
    after = CpuTimes.now()
    assert after.busy >= before.busy and after.idle >= before.idle
    assert 0.0 <= after.busy_share_since(before) <= 1.0


def test_create_probe_makes_new_files_each_time_and_leaves_them(tmp_path: Path) -> None:
    folder = tmp_path / "probe"
    first = create_cost_us(folder, n=16)
    second = create_cost_us(folder, n=16)  # the same folder: new names, not a clash with the first
    assert math.isfinite(first) and first > 0 and math.isfinite(second) and second > 0
    files = sorted(folder.iterdir())
    # Left in place: deleting them would charge the next creates on a disk without a journal.
    assert len(files) == 32
    assert all(f.stat().st_size == 0 and f.stat().st_mode & 0o777 == 0o600 for f in files)


def test_launch_step_means_are_per_launch_between_two_reads() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from bench.stats import launch_step_means_ms, launch_steps

    def page(spawn_count: int, spawn_sum: float) -> dict[str, tuple[float, float]]:
        text = (
            "# TYPE taskgate_task_launch_step_seconds histogram\n"
            f'taskgate_task_launch_step_seconds_count{{step="spawn"}} {spawn_count}\n'
            f'taskgate_task_launch_step_seconds_sum{{step="spawn"}} {spawn_sum}\n'
            'taskgate_task_launch_step_seconds_count{step="running_commit"} 3\n'
            'taskgate_task_launch_step_seconds_sum{step="running_commit"} 0.03\n'
        )
        return launch_steps(text_string_to_metric_families(text))

    before, after = page(3, 0.06), page(7, 0.26)
    assert after["spawn"] == (7, 0.26)
    means = launch_step_means_ms(before, after)
    # 4 spawns took 0.2 s between the reads: 50 ms each; no running commit finished meanwhile.
    assert means == {"spawn": pytest.approx(50.0)}
