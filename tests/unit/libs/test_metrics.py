"""The /metrics endpoint, gauges computed on scrape (over real HTTP), and cached metric children."""

from __future__ import annotations

import asyncio

import httpx
from prometheus_client import CollectorRegistry, Counter

from libs.metrics import Children, MetricsEndpoint, ScrapeGauge
from tests.support.procs import free_port


async def test_port_zero_means_no_endpoint() -> None:
    assert MetricsEndpoint.start("127.0.0.1", 0) is None


async def test_a_scrape_gauge_is_computed_on_the_loop_at_each_scrape() -> None:
    registry = CollectorRegistry()
    calls = 0

    async def fetch() -> dict[tuple[str, ...], float]:
        nonlocal calls
        calls += 1
        return {("queued",): 2.0, ("running",): float(calls)}

    registry.register(ScrapeGauge("t_tasks", "tasks", ["state"], fetch, asyncio.get_running_loop()))
    Counter("t_things_total", "things", registry=registry).inc(3)
    assert calls == 0, "registering computes nothing"
    endpoint = MetricsEndpoint.start("127.0.0.1", free_port(), registry)
    assert endpoint is not None
    try:
        async with httpx.AsyncClient() as client:
            first = (await client.get(f"http://127.0.0.1:{endpoint.port}/metrics")).text
            second = (await client.get(f"http://127.0.0.1:{endpoint.port}/metrics")).text
        assert 't_tasks{state="queued"} 2.0' in first and 't_tasks{state="running"} 1.0' in first
        assert 't_tasks{state="running"} 2.0' in second
        assert "t_things_total 3.0" in first
    finally:
        await endpoint.stop()


async def test_a_scrape_gauge_serves_its_last_values_when_the_loop_does_not_answer() -> None:
    loop = asyncio.get_running_loop()
    answers: list[dict[tuple[str, ...], float]] = [{(): 7.0}]

    async def fetch() -> dict[tuple[str, ...], float]:
        if not answers:
            raise RuntimeError("store unavailable")
        return answers.pop()

    gauge = ScrapeGauge("t_open", "open", [], fetch, loop, timeout_s=5)

    def collect() -> float:
        (family,) = list(gauge.collect())
        return float(family.samples[0].value)

    assert await asyncio.to_thread(collect) == 7.0
    assert await asyncio.to_thread(collect) == 7.0, "the failure serves the last value"


def test_children_are_made_once_per_label_values_and_count_into_the_metric() -> None:
    registry = CollectorRegistry()
    counter = Counter("t_children_total", "test", ["method", "code"], registry=registry)
    children = Children(counter)
    assert children("A", "OK") is children("A", "OK")
    assert children("A", "OK") is not children("A", "ERR")
    children("A", "OK").inc()
    children("A", "OK").inc()
    children("A", "ERR").inc()
    assert registry.get_sample_value("t_children_total", {"method": "A", "code": "OK"}) == 2
    assert registry.get_sample_value("t_children_total", {"method": "A", "code": "ERR"}) == 1
    # A child made through labels() elsewhere is the same series.
    counter.labels("A", "OK").inc()
    assert registry.get_sample_value("t_children_total", {"method": "A", "code": "OK"}) == 3
