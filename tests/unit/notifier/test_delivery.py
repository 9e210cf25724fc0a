"""The delivery loop's decisions with an injected clock and an httpx mock receiver."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest

from libs.db import Database
from libs.settings import ChannelConfig, NotifierSettings
from services.notifier.delivery import Deliverer
from services.notifier.domain import Kind, Notification, State
from services.notifier.store import MIGRATIONS, NotifierStore

SECRET = "s3cret-s3cret-s3cret"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def now_ms(self) -> int:
        return self.now


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[NotifierStore]:
    db = Database(f"sqlite:///{tmp_path / 'n.db'}", MIGRATIONS)
    db.migrate()
    yield NotifierStore(db)
    db.close()


def deliverer(
    store: NotifierStore, clock: FakeClock, handler: Callable[[httpx.Request], httpx.Response], **cfg: int
) -> Deliverer:
    settings = NotifierSettings(**{"retry_initial_ms": 5_000, "retry_max_ms": 300_000, **cfg})
    channels = {
        "hook": ChannelConfig(kind="webhook", url="http://receiver/a", secret=SECRET),
        "slow": ChannelConfig(kind="webhook", url="http://receiver/slow", secret=SECRET),
    }
    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return Deliverer(store, settings, channels, clock, http)


async def add(store: NotifierStore, clock: FakeClock, session: str = "s", channel: str = "hook") -> Notification:
    n = Notification(
        notification_id=f"n{session}{clock.now}",
        agent_id="a",
        session_id=session,
        kind=Kind.TASK_COMPLETED,
        task_id="t",
        text="done",
        created_at=clock.now,
        channel=channel,
    )
    stored, _ = await store.enqueue(n, f"m{session}{clock.now}")
    return stored


async def test_fails_twice_then_delivers_on_the_schedule_with_a_stable_key_and_signature(store: NotifierStore) -> None:
    clock = FakeClock()
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(500 if len(seen) <= 2 else 204)

    d = deliverer(store, clock, handler)
    n = await add(store, clock)
    start = clock.now
    assert await d.tick() == 1
    await settled(d)
    assert len(seen) == 1
    for wait in (4_999, 1):  # not before 5 s after the first failure
        clock.now += wait
        await d.tick()
        await settled(d)
    assert len(seen) == 2
    clock.now += 9_999
    await d.tick()
    await settled(d)
    assert len(seen) == 2
    clock.now += 1
    await d.tick()
    await settled(d)
    assert len(seen) == 3
    final = await store.get_notification("a", "s", n.notification_id)
    assert final.state == State.DELIVERED and [a.at - start for a in final.attempts] == [0, 5_000, 15_000]
    assert {r.headers["idempotency-key"] for r in seen} == {n.notification_id}
    for r in seen:
        expected = hmac.new(SECRET.encode(), r.content, hashlib.sha256).hexdigest()
        assert r.headers["x-taskgate-signature"] == f"sha256={expected}"
    # Delivered: never again.
    clock.now += 10_000_000
    assert await d.tick() == 0


async def test_retry_after_is_honoured(store: NotifierStore) -> None:
    clock = FakeClock()
    replies = [httpx.Response(429, headers={"Retry-After": "60"}), httpx.Response(200)]
    d = deliverer(store, clock, lambda _r: replies.pop(0))
    n = await add(store, clock)
    await d.tick()
    await settled(d)
    stored = await store.get_notification("a", "s", n.notification_id)
    assert stored.next_attempt_at == clock.now + 60_000 and stored.attempts[0].http_status == 429


async def settled(d: Deliverer) -> None:
    """Every attempt the last tick started is recorded (no fixed sleep: the machine may be loaded)."""
    await until(lambda: not d._busy)


async def until(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """Wait for a condition with a generous bound (the machine may be loaded), never a fixed sleep."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def test_a_slow_conversation_does_not_hold_back_another(store: NotifierStore) -> None:
    clock = FakeClock()
    release = asyncio.Event()
    delivered: list[str] = []

    async def slow_then_ok(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/slow":
            await release.wait()
        delivered.append(request.url.path)
        return httpx.Response(200)

    settings = NotifierSettings(delivery_concurrency=2)
    channels = {
        "hook": ChannelConfig(kind="webhook", url="http://receiver/a", secret=SECRET),
        "slow": ChannelConfig(kind="webhook", url="http://receiver/slow", secret=SECRET),
    }
    http = httpx.AsyncClient(transport=httpx.MockTransport(slow_then_ok))
    d = Deliverer(store, settings, channels, clock, http)
    await add(store, clock, session="stuck", channel="slow")
    clock.now += 1
    await add(store, clock, session="fine")
    assert await d.tick() == 2
    await until(lambda: ("a", "fine") not in d._busy)  # its attempt is recorded; the slow one still waits
    assert delivered == ["/a"]
    # The busy conversation is not offered again while its attempt is in flight.
    clock.now += 1
    await add(store, clock, session="fine")
    assert await d.tick() == 1
    await until(lambda: delivered == ["/a", "/a"])
    release.set()
    await until(lambda: delivered[-1] == "/slow")


async def test_a_timeout_is_a_failed_attempt(store: NotifierStore) -> None:
    clock = FakeClock()

    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=request)

    d = deliverer(store, clock, handler)
    n = await add(store, clock)
    await d.tick()
    await settled(d)
    stored = await store.get_notification("a", "s", n.notification_id)
    assert stored.state == State.PENDING and "timed out" in (stored.attempts[0].error or "")
    assert stored.next_attempt_at == clock.now + 5_000
