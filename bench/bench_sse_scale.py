"""1,000 task-stream SSE subscribers on one gateway, against the real five-process system.

1. REST cancel of a running worker (``POST .../tasks/{id}/cancel``), p50/p99, idle.
2. 1,000 subscribers of one session's ``GET .../tasks/events`` (raw sockets, in one child
   process at nice 10: they stand for remote clients): every task state change → frame
   received by each subscriber, p50/p99/max, measured from the change's ``updatedAt`` (the
   scheduler's wall clock, same machine) to the moment the subscriber read the frame; frames missing.
3. The same REST cancels while the 1,000 streams are open (their events are the ones of 2).

Also prints the scheduler's live WatchTasks subscriptions and the gateway's upstream
watches (from /metrics: 1,000 subscribers should cost the scheduler one stream) and the
gateway's resident memory.

Run: .venv/bin/python bench/bench_sse_scale.py [--subscribers N] [--cancels N]   (or `make bench`)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import selectors
import socket
import statistics
import sys
import tempfile
import time
from datetime import datetime
from multiprocessing.connection import Connection
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.stats import pct, rss_mib  # noqa: E402
from tests.e2e.conftest import add_member, create_key  # noqa: E402
from tests.support.stack import Stack, make_stack  # noqa: E402

AGENT, SESSION = "agent-1", "chat-sse-scale"


def cpu_ms(pid: int) -> float:
    """The process's user + system CPU time so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def wall_ms(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000


def data_lines(reads: list[tuple[float, bytes]]) -> list[tuple[float, bytes]]:
    """(receipt time of the read that completed it, data line), parsed after the run."""
    out: list[tuple[float, bytes]] = []
    pending = b""
    for at, chunk in reads:
        pending += chunk
        *complete, pending = pending.split(b"\n")
        out.extend((at, line) for line in complete if line.startswith(b"data: "))
    return out


def metric(stack: Stack, service: str, name: str) -> float:
    text = httpx.get(stack.metrics_url(service), timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    return float("nan")


async def cancels(http: httpx.AsyncClient, base: str, n: int) -> list[float]:
    """Each round: a running `sleep 300` worker, then the timed REST cancel (SIGTERM ends it at once)."""
    timings: list[float] = []
    for _ in range(n):
        r = await http.post(f"{base}/tasks", json={"title": "bench-cancel", "instructions": "", "profile": "sleeper"})
        r.raise_for_status()
        task_id = r.json()["task"]["taskId"]
        deadline = time.monotonic() + 30
        while (await http.get(f"{base}/tasks/{task_id}")).json()["task"]["state"] != "running":
            if time.monotonic() > deadline:
                raise TimeoutError(f"{task_id} never ran")
            await asyncio.sleep(0.02)
        start = time.perf_counter()
        r = await http.post(f"{base}/tasks/{task_id}/cancel", json={})
        timings.append((time.perf_counter() - start) * 1000)
        r.raise_for_status()
        deadline = time.monotonic() + 30
        while (await http.get(f"{base}/tasks/{task_id}")).json()["task"]["state"] != "cancelled":
            if time.monotonic() > deadline:
                raise TimeoutError(f"{task_id} never cancelled")
            await asyncio.sleep(0.02)
    return timings


def event_latencies(
    subs: list[list[tuple[float, bytes]]], task_ids: set[str]
) -> tuple[list[float], int, int, dict[tuple[str, str], list[float]]]:
    """(latencies ms, frames received, state changes missed by some subscriber, latencies by change)."""
    latencies: list[float] = []
    by_change: dict[tuple[str, str], list[float]] = {}
    received = 0
    expected: set[tuple[str, str]] = set()
    seen_per_sub: list[set[tuple[str, str]]] = []
    for sub in subs:
        seen: set[tuple[str, str]] = set()
        for at, line in sub:
            task = json.loads(line[len(b"data: ") :]).get("task")
            if not task or task["taskId"] not in task_ids:
                continue
            received += 1
            change = (task["taskId"], task["state"])
            if change in seen:
                continue
            seen.add(change)
            latencies.append(at - wall_ms(task["updatedAt"]))
            by_change.setdefault(change, []).append(latencies[-1])
        seen_per_sub.append(seen)
        expected |= seen
    missing = sum(len(expected - seen) for seen in seen_per_sub)
    return latencies, received, missing, by_change


def subscriber_process(url: str, path: str, key: str, n: int, conn: Connection) -> None:
    """The subscribers in their own process at a lower priority: they stand for clients on other
    machines, so their reading should take as little as it can from the services' two cores.
    One selector loop over raw non-blocking sockets: each read is kept with its receipt time
    and parsed after the run (an asyncio stream reader per client, the earlier version, woke a
    task per socket per frame: its own work competed with the gateway it measured)."""
    os.nice(10)
    host, port = url.removeprefix("http://").split(":")
    request = (
        f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\nAccept: text/event-stream\r\n\r\n"
    ).encode()
    selector = selectors.DefaultSelector()
    reads: list[list[tuple[float, bytes]]] = [[] for _ in range(n)]
    heads = [b""] * n
    socks: list[socket.socket] = []
    for i in range(n):
        sock = socket.create_connection((host, int(port)))
        sock.sendall(request)
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ, i)
        socks.append(sock)
        if i % 50 == 49:
            time.sleep(0.05)  # don't overrun the listen backlog
    selector.register(conn, selectors.EVENT_READ, -1)
    waiting_heads = n
    deadline = time.monotonic() + 180
    stopping = False
    while not stopping:
        if waiting_heads and time.monotonic() > deadline:
            raise TimeoutError(f"{waiting_heads} subscribers got no answer")
        for selected, _ in selector.select(1.0):
            i = selected.data
            if i == -1:
                conn.recv()  # "stop"
                stopping = True
                continue
            data = socks[i].recv(65536)
            if not data:
                selector.unregister(socks[i])
                continue
            at = time.time() * 1000
            if waiting_heads and b"\r\n\r\n" not in heads[i]:
                heads[i] += data
                head, sep, rest = heads[i].partition(b"\r\n\r\n")
                if not sep:
                    continue
                if not head.startswith(b"HTTP/1.1 200"):
                    raise RuntimeError(head.decode(errors="replace"))
                waiting_heads -= 1  # the gateway answers once the stream is live
                if not waiting_heads:
                    conn.send("ready")
                data = rest
            if data:
                reads[i].append((at, data))
    for sock in socks:
        sock.close()
    conn.send([data_lines(r) for r in reads])


async def run(stack: Stack, key: str, subscribers: int, n_cancels: int) -> None:
    base = f"{stack.http_url}/api/v1/agents/{AGENT}/sessions/{SESSION}"
    headers = {"Authorization": f"Bearer {key}"}
    gateway_pid = stack.procs["gateway"].proc.pid  # type: ignore[union-attr]
    async with httpx.AsyncClient(headers=headers, timeout=60) as http:
        await cancels(http, base, 3)  # warm-up
        cpu_before = cpu_ms(gateway_pid)
        idle = await cancels(http, base, n_cancels)
        cpu_idle = cpu_ms(gateway_pid) - cpu_before
        rss_idle = rss_mib(gateway_pid)

        path = f"/api/v1/agents/{AGENT}/sessions/{SESSION}/tasks/events"
        here, there = multiprocessing.Pipe()
        child = multiprocessing.Process(
            target=subscriber_process, args=(stack.http_url, path, key, subscribers, there), daemon=True
        )
        opened = time.perf_counter()
        child.start()
        if not await asyncio.to_thread(here.poll, 240):
            raise TimeoutError("the subscribers did not connect")
        assert here.recv() == "ready"
        open_s = time.perf_counter() - opened
        watchers = metric(stack, "scheduler", "taskgate_task_watchers")
        upstream = metric(stack, "gateway", "taskgate_gateway_task_watches")
        streams = metric(stack, "gateway", "taskgate_sse_subscribers")
        rss_open = rss_mib(gateway_pid)

        listed = (await http.get(f"{base}/tasks?all=true&page_size=100")).json()["tasks"]
        earlier = {t["taskId"] for t in listed}
        cpu_before, child_before = cpu_ms(gateway_pid), cpu_ms(child.pid)  # type: ignore[arg-type]
        loaded = await cancels(http, base, n_cancels)
        await asyncio.sleep(2.0)  # the last frames arrive
        cpu_loaded = cpu_ms(gateway_pid) - cpu_before
        child_cpu = cpu_ms(child.pid) - child_before  # type: ignore[arg-type]
        listed = (await http.get(f"{base}/tasks?all=true&page_size=100")).json()["tasks"]
        measured = {t["taskId"] for t in listed} - earlier
        rss_after = rss_mib(gateway_pid)
        here.send("stop")
        lines = await asyncio.to_thread(here.recv)
        child.join(30)

    latencies, received, missing, by_change = event_latencies(lines, measured)
    p50_idle, p50_loaded = statistics.median(idle), statistics.median(loaded)
    print(f"REST cancel, idle ({n_cancels}): p50 {p50_idle:.1f} ms  p99 {pct(idle, 0.99):.1f} ms")
    print(
        f"REST cancel, {subscribers} SSE subscribers ({n_cancels}): p50 {p50_loaded:.1f} ms"
        f"  p99 {pct(loaded, 0.99):.1f} ms  (p50 {p50_loaded / p50_idle:.2f}x idle)"
    )
    if latencies:
        print(
            f"state change -> frame, each of {subscribers} subscribers"
            f" ({len(latencies)} receipts of {received} frames): p50 {statistics.median(latencies):.1f} ms"
            f"  p99 {pct(latencies, 0.99):.1f} ms  max {max(latencies):.1f} ms  missing {missing}"
        )
    if by_change:
        # Where the time goes: up to the first subscriber's read (commit, scheduler, gateway),
        # then from the first to the last (the fan-out over 1,000 sockets and the readers).
        first = [min(v) for v in by_change.values()]
        spread = [max(v) - min(v) for v in by_change.values()]
        print(
            f"per state change ({len(by_change)}): first subscriber p50 {statistics.median(first):.1f} ms"
            f"  p99 {pct(first, 0.99):.1f} ms; last minus first p50 {statistics.median(spread):.1f} ms"
            f"  p99 {pct(spread, 0.99):.1f} ms"
        )
        by_state: dict[str, list[float]] = {}
        for (_, state), v in by_change.items():
            by_state.setdefault(state, []).append(min(v))
        print(
            "  first subscriber by state: "
            + "; ".join(
                f"{state} p50 {statistics.median(v):.1f} max {max(v):.1f} ms" for state, v in sorted(by_state.items())
            )
        )
    if received:
        # CPU time does not depend on how busy the shared machine is, unlike the latencies.
        print(
            f"gateway CPU: {cpu_idle:.0f} ms for the idle cancels, {cpu_loaded:.0f} ms with the streams:"
            f" {(cpu_loaded - cpu_idle) * 1000 / received:.1f} us per frame sent;"
            f" subscriber process {child_cpu * 1000 / received:.1f} us per frame read"
        )
    print(f"{subscribers} streams opened in {open_s:.1f} s; gateway SSE subscribers (metric) {streams:.0f}")
    print(
        f"scheduler WatchTasks subscriptions with {subscribers} subscribers: {watchers:.0f}"
        f" (gateway upstream watches: {upstream:.0f})"
    )
    print(
        f"gateway resident memory: {rss_idle:.0f} MiB idle -> {rss_open:.0f} MiB with the streams"
        f" -> {rss_after:.0f} MiB after the events"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--subscribers", type=int, default=1000)
    parser.add_argument("--cancels", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        stack = make_stack(Path(tmp), metrics=True, cancel_grace_ms=5000)
        stack.start()
        try:
            key = create_key(stack, "bench", AGENT)
            add_member(stack, AGENT, SESSION, "bench")
            asyncio.run(run(stack, key, args.subscribers, args.cancels))
        finally:
            stack.stop()


if __name__ == "__main__":
    main()
