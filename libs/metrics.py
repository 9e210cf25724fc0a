"""Prometheus metrics: what every process shares, and its ``/metrics`` endpoint.

Each process serves the Prometheus text format on its own port
(``<service>_metrics_port``, 0 = off) from prometheus-client's exporter, which
runs in a daemon thread: a scrape never waits on the event loop except for the
gauges computed on scrape (``ScrapeGauge``), which ask the loop for a fresh value
with a short timeout and fall back to the last one.

Metric names start with ``taskgate_``; the README lists every one.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Generic, TypeVar
from wsgiref.simple_server import WSGIServer

import structlog
from prometheus_client import REGISTRY, CollectorRegistry, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

log = structlog.get_logger("metrics")

M = TypeVar("M", bound=MetricWrapperBase)

# Latency buckets from sub-millisecond RPCs to long waits (streams are observed over their life).
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0)

RPC_DURATION = Histogram(
    "taskgate_rpc_duration_seconds",
    "Server-side duration of internal gRPC calls by full method name and status code "
    "(a server stream: its whole life; refused calls: UNAUTHENTICATED / PERMISSION_DENIED)",
    ["method", "code"],
    buckets=LATENCY_BUCKETS,
)


class Children(Generic[M]):
    """A labelled metric's children, each made once per label values: prometheus-client's
    ``labels()`` validates, takes the metric's lock and builds its key on every call, several
    times the cost of the observation itself. Only for label values that are few and bounded
    (methods, status codes, states, route templates); two threads making the same child at
    once get the same one from ``labels()``."""

    def __init__(self, metric: M) -> None:
        self._metric = metric
        self._children: dict[tuple[str, ...], M] = {}

    def __call__(self, *values: str) -> M:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._metric.labels(*values)
        return child


Fetch = Callable[[], Awaitable[Mapping[tuple[str, ...], float]]]


class ScrapeGauge(Collector):
    """A gauge family computed when scraped, by a coroutine on the service's event loop.

    Cheap by construction: nothing runs between scrapes. The exporter thread waits
    at most ``timeout_s`` for the loop; on a timeout or error the last values are
    served (and the failure logged), so a busy service still answers its scrape.
    """

    def __init__(
        self,
        name: str,
        documentation: str,
        labels: Sequence[str],
        fetch: Fetch,
        loop: asyncio.AbstractEventLoop,
        timeout_s: float = 2.0,
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labels = list(labels)
        self.fetch = fetch
        self.loop = loop
        self.timeout_s = timeout_s
        self.last: Mapping[tuple[str, ...], float] = {}

    def describe(self) -> Iterable[Metric]:
        # Registration calls describe(), not collect(): no loop round trip from the loop itself.
        return [GaugeMetricFamily(self.name, self.documentation, labels=self.labels)]

    def collect(self) -> Iterable[Metric]:
        try:
            future = asyncio.run_coroutine_threadsafe(self._fetch(), self.loop)
            self.last = future.result(self.timeout_s)
        except Exception as exc:  # noqa: BLE001 - serve the last values; the scrape must answer
            log.warning("metrics_scrape_stale", metric=self.name, error=type(exc).__name__)
        family = GaugeMetricFamily(self.name, self.documentation, labels=self.labels)
        for key, value in sorted(self.last.items()):
            family.add_metric(list(key), value)
        yield family

    async def _fetch(self) -> Mapping[tuple[str, ...], float]:
        return await self.fetch()


def register_scrape_gauge(
    name: str,
    documentation: str,
    labels: Sequence[str],
    fetch: Fetch,
    registry: CollectorRegistry = REGISTRY,
) -> ScrapeGauge:
    """Register a ``ScrapeGauge`` bound to the running loop (call from the service's ``main``)."""
    gauge = ScrapeGauge(name, documentation, labels, fetch, asyncio.get_running_loop())
    registry.register(gauge)
    return gauge


class MetricsEndpoint:
    """The process's ``/metrics`` listener (prometheus-client's exporter thread)."""

    def __init__(self, server: WSGIServer, thread: threading.Thread) -> None:
        self.server = server
        self.thread = thread

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    @classmethod
    def start(cls, host: str, port: int, registry: CollectorRegistry = REGISTRY) -> MetricsEndpoint | None:
        """Listen on ``host:port``; port 0 means no endpoint (None)."""
        if port == 0:
            return None
        server, thread = start_http_server(port, addr=host, registry=registry)
        endpoint = cls(server, thread)
        log.info("metrics_listening", addr=f"{host}:{endpoint.port}")
        return endpoint

    async def stop(self) -> None:
        # shutdown() waits for the serving thread's poll loop: off the event loop.
        await asyncio.to_thread(self.server.shutdown)
        self.server.server_close()
