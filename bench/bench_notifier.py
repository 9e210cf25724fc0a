"""The notifier against the real five-process system.

1. Activity fan-out: 1,000 SSE subscribers of one session on one gateway; a
   snapshot published over REST (PUT .../responses/{id}) → received by every
   subscriber: p50/p99, and the gateway's resident memory before/after.
2. Delivery throughput: notifications enqueued over gRPC → POSTed to a local
   webhook receiver (2xx at once), across 50 conversations and within one.

Run: .venv/bin/python bench/bench_notifier.py   (or `make bench`)
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.stats import pct, rss_mib  # noqa: E402
from libs.grpc_client import ClientSecurity, aio_channel  # noqa: E402
from taskgate.notifier.v1 import notifier_pb2 as npb  # noqa: E402
from taskgate.notifier.v1 import notifier_pb2_grpc as npb_grpc  # noqa: E402
from tests.e2e.conftest import add_member, create_key  # noqa: E402
from tests.support.procs import (
    client_security,  # noqa: E402
    free_port,  # noqa: E402
)
from tests.support.stack import make_stack  # noqa: E402

AGENT, SESSION, HOOK_AGENT = "agent-1", "chat-bench", "agent-hook"
SUBSCRIBERS = 1000
SNAPSHOTS = 20
DELIVERIES = 600
CONVERSATIONS = 50
SEQUENTIAL = 200


# --- 1,000 SSE subscribers on raw sockets (lighter than 1,000 HTTP clients) -------------


class Subscriber:
    def __init__(self) -> None:
        self.seen: dict[str, float] = {}
        self.ready = asyncio.Event()

    async def run(self, host: str, port: int, path: str, key: str) -> None:
        reader, writer = await asyncio.open_connection(host, port)
        request = f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\n"
        writer.write((request + "Accept: text/event-stream\r\n\r\n").encode())
        await writer.drain()
        try:
            while True:
                line = await reader.readline()
                if not line:
                    return
                if line.startswith(b"HTTP/1.1 200"):
                    self.ready.set()
                elif line.startswith(b'data: {"responseId"'):
                    marker = line.split(b'"text": "', 1)[1].split(b'"', 1)[0].decode()
                    self.seen.setdefault(marker, time.perf_counter())
        finally:
            writer.close()


async def fan_out(stack_url: str, key: str, gateway_pid: int) -> dict[str, float]:
    host, port = stack_url.removeprefix("http://").split(":")
    path = f"/api/v1/agents/{AGENT}/sessions/{SESSION}/activity/stream"
    rss_idle = rss_mib(gateway_pid)
    subs = [Subscriber() for _ in range(SUBSCRIBERS)]
    tasks = []
    for i, sub in enumerate(subs):
        tasks.append(asyncio.create_task(sub.run(host, int(port), path, key)))
        if i % 50 == 49:
            await asyncio.sleep(0.05)  # don't overrun the listen backlog
    await asyncio.wait_for(asyncio.gather(*(s.ready.wait() for s in subs)), 120)
    await asyncio.sleep(2.0)  # every stream has subscribed at the notifier
    rss_connected = rss_mib(gateway_pid)
    latencies: list[float] = []
    published: dict[str, float] = {}
    async with httpx.AsyncClient(base_url=stack_url, headers={"Authorization": f"Bearer {key}"}) as http:
        for i in range(SNAPSHOTS):
            marker = f"snap-{i}"
            published[marker] = time.perf_counter()
            r = await http.put(
                f"/api/v1/agents/{AGENT}/sessions/{SESSION}/responses/bench", json={"text": marker, "final": False}
            )
            r.raise_for_status()
            deadline = time.monotonic() + 30
            while sum(marker in s.seen for s in subs) < SUBSCRIBERS and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.2)
    rss_after = rss_mib(gateway_pid)
    missing = 0
    for s in subs:
        for marker, at in published.items():
            if marker in s.seen:
                latencies.append((s.seen[marker] - at) * 1000)
            else:
                missing += 1
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return {
        "p50": statistics.median(latencies),
        "p99": pct(latencies, 0.99),
        "max": max(latencies),
        "missing": missing,
        "rss_idle": rss_idle,
        "rss_connected": rss_connected,
        "rss_after": rss_after,
    }


# --- a local webhook receiver (asyncio, keep-alive, 204 at once) --------------------------


class Receiver:
    def __init__(self) -> None:
        self.count = 0
        self.keys: set[str] = set()
        self.done = asyncio.Event()
        self.expect = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.lower() == b"content-length":
                        length = int(value)
                    elif name.lower() == b"idempotency-key":
                        self.keys.add(value.strip().decode())
                await reader.readexactly(length)
                self.count += 1
                if self.expect and len(self.keys) >= self.expect:
                    self.done.set()
                writer.write(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            writer.close()


async def deliveries(
    notifier_addr: str, security: ClientSecurity, receiver: Receiver, sessions: int, n: int
) -> tuple[float, int]:
    receiver.keys.clear()
    receiver.count = 0
    receiver.done.clear()
    receiver.expect = n
    async with aio_channel(notifier_addr, security) as channel:
        stub = npb_grpc.NotifierServiceStub(channel)
        start = time.perf_counter()
        sem = asyncio.Semaphore(32)

        async def one(i: int) -> None:
            async with sem:
                await stub.EnqueueNotification(
                    npb.EnqueueNotificationRequest(
                        agent_id=HOOK_AGENT,
                        session_id=f"conv-{sessions}-{i % sessions}",
                        kind=npb.NOTIFICATION_KIND_REMINDER,
                        text=f"notification {i}",
                    ),
                    timeout=30,
                )

        await asyncio.gather(*(one(i) for i in range(n)))
        await asyncio.wait_for(receiver.done.wait(), 300)
        return time.perf_counter() - start, receiver.count


async def main() -> None:
    receiver = Receiver()
    hook_port = free_port()
    server = await asyncio.start_server(receiver.handle, "127.0.0.1", hook_port)
    with tempfile.TemporaryDirectory() as tmp:
        stack = make_stack(Path(tmp))
        config = Path(stack.env["TASKGATE_CONFIG"])
        config.write_text(
            config.read_text()
            + f"""
[channels.hook]
kind = "webhook"
url = "http://127.0.0.1:{hook_port}/hook"
secret = "bench-secret-0123456789"

[agents.{HOOK_AGENT}]
channel = "hook"
"""
        )
        print("starting the five services ...", flush=True)
        stack.start()
        try:
            key = create_key(stack, "bench", AGENT)
            add_member(stack, AGENT, SESSION, "bench")
            gateway = stack.procs["gateway"].proc
            notifier, operator = stack.addr("notifier"), client_security(stack.env)
            assert gateway is not None
            print(f"fan-out: {SUBSCRIBERS} SSE subscribers x {SNAPSHOTS} snapshots ...", flush=True)
            fan = await fan_out(stack.http_url, key, gateway.pid)
            print(f"delivery: {DELIVERIES} notifications over {CONVERSATIONS} conversations ...", flush=True)
            spread_s, spread_posts = await deliveries(notifier, operator, receiver, CONVERSATIONS, DELIVERIES)
            print(f"delivery: {SEQUENTIAL} notifications in one conversation ...", flush=True)
            one_s, one_posts = await deliveries(notifier, operator, receiver, 1, SEQUENTIAL)
        finally:
            stack.stop()
            server.close()
            await server.wait_closed()
    print()
    print("taskgate bench_notifier (5 real processes, SQLite, loopback, 2 cores shared with the clients)")
    print(
        f"SSE fan-out, {SUBSCRIBERS} subscribers on one gateway, REST PUT -> frame received: "
        f"p50 {fan['p50']:.0f} ms, p99 {fan['p99']:.0f} ms, max {fan['max']:.0f} ms, missing {fan['missing']:.0f}"
    )
    print(
        f"gateway RSS: {fan['rss_idle']:.0f} MiB idle, {fan['rss_connected']:.0f} MiB with {SUBSCRIBERS} streams, "
        f"{fan['rss_after']:.0f} MiB after {SNAPSHOTS} snapshots "
        f"({(fan['rss_connected'] - fan['rss_idle']) * 1024 / SUBSCRIBERS:.0f} KiB per stream)"
    )
    print(
        f"webhook delivery, {CONVERSATIONS} conversations: {DELIVERIES} in {spread_s:.2f} s = "
        f"{DELIVERIES / spread_s:.0f}/s ({spread_posts} POSTs)"
    )
    print(
        f"webhook delivery, one conversation (one in flight): {SEQUENTIAL} in {one_s:.2f} s = "
        f"{SEQUENTIAL / one_s:.0f}/s ({one_posts} POSTs)"
    )


if __name__ == "__main__":
    asyncio.run(main())
