"""Delivery of pending notifications to the operator's webhook channels.

One background loop per notifier process. Due conversations are chosen by the
database (busy ones left out before the limit), each is drained by its own task
with one notification in flight, and at most ``delivery_concurrency``
conversations are served at once: a slow or cooling-down conversation never
holds back another. The next due time is derived from the stored attempts, so a
restart keeps the schedule.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
import json
import time
from datetime import UTC, datetime

import httpx
import structlog

from libs.clock import Clock
from libs.settings import ChannelConfig, NotifierSettings
from services.notifier import domain
from services.notifier.domain import Backoff, Notification
from services.notifier.metrics import DELIVERY_ATTEMPTS, DELIVERY_RETRIES, DELIVERY_SECONDS
from services.notifier.store import NotifierStore

log = structlog.get_logger("notifier.delivery")

Conversation = tuple[str, str]


def iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def webhook_body(n: Notification) -> bytes:
    doc: dict[str, object] = {
        "notificationId": n.notification_id,
        "agentId": n.agent_id,
        "sessionId": n.session_id,
        "kind": n.kind.value,
        "taskId": n.task_id,
        "text": n.text,
        "createdAt": iso(n.created_at),
    }
    if n.question_id:
        doc["questionId"] = n.question_id
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


def signature(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class Deliverer:
    def __init__(
        self,
        store: NotifierStore,
        settings: NotifierSettings,
        channels: dict[str, ChannelConfig],
        clock: Clock,
        http: httpx.AsyncClient,
        gateway_http_addr: str = "127.0.0.1:8080",
    ) -> None:
        self.gateway_http_addr = gateway_http_addr
        self.store = store
        self.settings = settings
        self.channels = channels
        self.clock = clock
        self.http = http
        self.backoff = Backoff(settings.retry_initial_ms, settings.retry_max_ms)
        self._wake = asyncio.Event()
        self._busy: dict[Conversation, asyncio.Task[None]] = {}

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        try:
            while True:
                self._wake.clear()
                try:
                    await self.tick()
                    next_due = await self.store.next_due_at()
                except Exception:  # noqa: BLE001 - e.g. the database; the loop must go on
                    log.exception("delivery_tick_failed")
                    next_due = None
                now = self.clock.now_ms()
                # Due-but-busy ones are picked up when their conversation's task ends (it wakes us).
                wait_s = 1.0 if next_due is None or next_due <= now else min(1.0, (next_due - now) / 1000)
                try:
                    async with asyncio.timeout(max(wait_s, 0.005)):
                        await self._wake.wait()
                except TimeoutError:
                    pass
        finally:
            for task in self._busy.values():
                task.cancel()
            await asyncio.gather(*self._busy.values(), return_exceptions=True)

    async def tick(self) -> int:
        """Start draining every due conversation there is room for; returns how many started."""
        room = self.settings.delivery_concurrency - len(self._busy)
        if room <= 0:
            return 0
        due = await self.store.due_conversations(self.clock.now_ms(), room, set(self._busy))
        for conversation in due:
            task = asyncio.create_task(self._drain(conversation), name=f"deliver-{conversation[0]}/{conversation[1]}")
            self._busy[conversation] = task
            task.add_done_callback(functools.partial(self._done, conversation))
        return len(due)

    def _done(self, conversation: Conversation, _task: asyncio.Task[None]) -> None:
        self._busy.pop(conversation, None)
        self._wake.set()

    async def _drain(self, conversation: Conversation) -> None:
        while True:
            n = await self.store.due_in(*conversation, self.clock.now_ms())
            if n is None:
                return
            try:
                await self.attempt(n)
            except Exception:  # noqa: BLE001 - one bad attempt must not end the loop
                log.exception("delivery_attempt_crashed", notification_id=n.notification_id)
                return

    async def attempt(self, n: Notification) -> Notification:
        started = time.perf_counter()
        channel = self.channels.get(n.channel or "")
        status: int | None = None
        error: str | None = None
        retry_after: str | None = None
        if n.channel is None:
            # A foundation-era row without a channel: its history message is its delivery.
            status = 204
        elif channel is None:
            error = f"channel {n.channel!r} is not configured"
        else:
            body = webhook_body(n)
            headers = {
                "Content-Type": "application/json",
                "Idempotency-Key": n.notification_id,
                "X-Taskgate-Signature": signature(channel.secret, body),
            }
            try:
                reply = await self.http.post(
                    channel.delivery_url(n.channel, self.gateway_http_addr),
                    content=body,
                    headers=headers,
                    timeout=self.settings.delivery_timeout_ms / 1000,
                )
                status = reply.status_code
                retry_after = reply.headers.get("retry-after")
            except httpx.TimeoutException:
                error = f"timed out after {self.settings.delivery_timeout_ms} ms"
            except httpx.HTTPError as exc:
                error = f"{type(exc).__name__}: {exc}"[:300]
        outcome = domain.attempt_outcome(status, error, retry_after, self.clock.now_ms())
        stored = await self.store.record_attempt(n.notification_id, outcome, self.backoff)
        DELIVERY_SECONDS.observe(time.perf_counter() - started)
        DELIVERY_ATTEMPTS.labels(outcome.outcome.value, n.kind.value).inc()
        if len(stored.attempts) > 1:
            DELIVERY_RETRIES.labels(n.kind.value).inc()
        log.info(
            "delivery_attempt",
            notification_id=n.notification_id,
            task_id=n.task_id,
            channel=n.channel,
            outcome=outcome.outcome.value,
            http_status=status,
            error=error,
            attempt=len(stored.attempts),
            next_attempt_at=iso(stored.next_attempt_at),
        )
        return stored
