"""libs.retention: the pass schedule and the batch loop shared by the scheduler's and the
notifier's retention."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from libs import retention


class Log:
    def __init__(self) -> None:
        self.events: list[str] = []

    def exception(self, event: str, **_: Any) -> None:
        self.events.append(event)


async def test_no_retention_runs_no_pass() -> None:
    calls: list[int] = []

    async def prune(now: int) -> None:
        calls.append(now)

    await asyncio.wait_for(retention.run_passes(0, prune, lambda: 1, lambda: False, Log(), "x"), 1)  # type: ignore[arg-type]
    assert calls == []


async def test_a_failing_pass_is_logged_and_the_next_one_comes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retention, "FIRST_PASS_AFTER_S", 0.01)
    monkeypatch.setattr(retention, "MIN_INTERVAL_S", 0.01)
    calls: list[int] = []
    log = Log()

    async def prune(now: int) -> None:
        calls.append(now)
        if len(calls) == 1:
            raise RuntimeError("the database went away")

    # Stops once three passes have run (the first failed).
    await asyncio.wait_for(
        retention.run_passes(1, prune, lambda: 42, lambda: len(calls) >= 3, log, "prune_failed"),  # type: ignore[arg-type]
        5,
    )
    assert calls == [42, 42, 42] and log.events == ["prune_failed"]


async def test_batches_go_on_until_one_deletes_nothing_with_a_pause_as_long_after_each() -> None:
    sizes = [3, 3, 1, 0, 5]
    ran: list[float] = []

    async def batch() -> int:
        ran.append(time.perf_counter())
        await asyncio.sleep(0.02)  # the batch's own time
        return sizes[len(ran) - 1]

    done = await retention.in_batches(batch, lambda n: n, lambda: False)
    assert done == [3, 3, 1] and len(ran) == 4  # the empty fourth ends it; the fifth never runs
    gaps = [b - a for a, b in zip(ran, ran[1:], strict=False)]
    assert all(gap >= 0.035 for gap in gaps), gaps  # ≈ 0.02 of batch + ≥ 0.02 of pause each


def test_a_pass_comes_hourly_or_every_tenth_of_a_shorter_retention() -> None:
    assert retention.pass_interval_s(30 * 86_400_000) == 3600.0
    assert retention.pass_interval_s(100_000) == 10.0
    assert retention.pass_interval_s(3000) == 1.0  # at least a second apart
