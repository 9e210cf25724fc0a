"""The agent: the watch list, the sampling loop and the observation fan-out.

Lives on the event loop; the sampling itself (process table, /proc reads) runs
in one dedicated worker thread, so it never blocks the loop and two samples
never overlap. Nothing is persisted: after a restart the watch list is empty
and the scheduler registers its watches again.

Cadence: every ``interval_s`` all watched trees are sampled from one process
table snapshot. Besides that, a tree is sampled at once (a "prompt" sample,
coalesced with others pending) when it is registered (its baseline, which also
fences the identity straight away) and when its root exits. Root exit is
noticed through a pidfd (Linux >= 5.3) that becomes readable when the process
ends; where no pidfd can be opened, the end is seen at the next tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from libs import proctree
from libs.log import get_logger
from libs.thread_names import name_after_python_thread
from services.telemetry_agent.broadcast import Broadcaster, Subscription
from services.telemetry_agent.domain import (
    MAX_WATCHES,
    Observation,
    ResourceExhausted,
    Watch,
    WatchEntry,
    page_of,
    validate_page,
    validate_task_id,
    validate_watch,
)
from services.telemetry_agent.metrics import measured
from services.telemetry_agent.sampler import Clock, Sampler, wall_ms

log = get_logger("telemetry_agent")

# Observations a subscriber may fall behind before it is dropped (at least this,
# or two per watched task, whichever is more).
SUBSCRIBER_BACKLOG = 4096


def open_pidfd(watch: Watch) -> int | None:
    """A pidfd on the root, or None (no pidfd support, gone, or another process)."""
    if not hasattr(os, "pidfd_open"):
        return None
    try:
        fd = os.pidfd_open(watch.pid)
    except OSError:
        return None
    # Opened first, checked second: if the start time matches now, the fd is on that process.
    if proctree.start_time_of(watch.pid) != watch.start_time:
        os.close(fd)
        return None
    return fd


@dataclass
class _Entry:
    watch: Watch
    created_at: int
    pidfd: int | None = None


class Agent:
    def __init__(
        self,
        sampler: Sampler,
        interval_s: float,
        *,
        clock: Clock = wall_ms,
        subscriber_backlog: int = SUBSCRIBER_BACKLOG,
        max_watches: int = MAX_WATCHES,
        pidfd_opener: Callable[[Watch], int | None] | None = open_pidfd,
    ) -> None:
        self._sampler = sampler
        self.interval_s = interval_s
        self._clock = clock
        self._max_watches = max_watches
        self._pidfd_opener = pidfd_opener
        self._entries: dict[str, _Entry] = {}
        self._latest: dict[str, Observation] = {}
        self._prompt: set[str] = set()
        self._wake = asyncio.Event()
        self._broadcaster = Broadcaster(subscriber_backlog)
        self._executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="sampler", initializer=name_after_python_thread
        )
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        for entry in self._entries.values():
            self._add_reader(entry)
        self._task = asyncio.create_task(self._run(), name="telemetry-sampling")
        log.info("sampling_started", interval_ms=round(self.interval_s * 1000))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._broadcaster.close_all()
        for task_id in list(self._entries):
            self._remove(task_id)
        self._executor.shutdown(wait=False, cancel_futures=True)

    # -- the watch list ---------------------------------------------------------------------------

    async def watch(self, task_id: str, pid: int, start_time: int) -> bool:
        """Register a watch; False when exactly this one was registered already."""
        watch = validate_watch(task_id, pid, start_time)
        current = self._entries.get(task_id)
        if current is not None and current.watch == watch:
            return False
        if current is None and len(self._entries) >= self._max_watches:
            raise ResourceExhausted("TOO_MANY_WATCHES", f"this agent watches {self._max_watches} trees already")
        fd = await asyncio.to_thread(self._pidfd_opener, watch) if self._pidfd_opener else None
        current = self._entries.get(task_id)
        if current is not None and current.watch == watch:  # registered while we waited
            if fd is not None:
                os.close(fd)
            return False
        if current is not None:
            self._remove(task_id)
        entry = _Entry(watch, self._clock(), fd)
        self._entries[task_id] = entry
        self._add_reader(entry)
        self._request_sample(task_id)
        log.info(
            "watch_added",
            task_id=task_id,
            pid=pid,
            pid_start_time=start_time,
            replaced=current is not None,
            exit_notification=fd is not None,
        )
        return True

    async def unwatch(self, task_id: str) -> bool:
        validate_task_id(task_id)
        if task_id not in self._entries:
            return False
        self._remove(task_id)
        log.info("watch_removed", task_id=task_id)
        return True

    def list_watches(self, page_size: int, page_token: str) -> tuple[list[WatchEntry], str]:
        req = validate_page(page_size, page_token)
        entries = [WatchEntry(e.watch, e.created_at) for e in self._entries.values()]
        return page_of(entries, req)

    # -- subscribers ------------------------------------------------------------------------------

    @property
    def watch_count(self) -> int:
        return len(self._entries)

    def subscribe(self, include_latest: bool = False) -> Subscription:
        backlog = max(self._broadcaster.limit, 2 * len(self._entries))
        subscription = self._broadcaster.subscribe(backlog)
        if include_latest:
            subscription.offer([self._latest[task_id] for task_id in sorted(self._latest)])
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        self._broadcaster.unsubscribe(subscription)

    def subscribers(self) -> int:
        return len(self._broadcaster)

    # -- sampling ---------------------------------------------------------------------------------

    def _request_sample(self, task_id: str) -> None:
        self._prompt.add(task_id)
        self._wake.set()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_tick = time.monotonic() + self.interval_s
        while True:
            delay = next_tick - time.monotonic()
            if delay > 0 and not self._prompt:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._wake.wait()
            self._wake.clear()
            now = time.monotonic()
            if now >= next_tick:
                # Skip ticks missed (a slow sample) rather than bunching them.
                next_tick += (int((now - next_tick) // self.interval_s) + 1) * self.interval_s
                targets = [self._entries[t].watch for t in sorted(self._entries)]
                self._prompt.clear()
            elif self._prompt:
                targets = [self._entries[t].watch for t in sorted(self._prompt) if t in self._entries]
                self._prompt.clear()
            else:
                continue
            keep = [e.watch for e in self._entries.values()]
            try:
                observations = await loop.run_in_executor(
                    self._executor, measured, functools.partial(self._sampler.sample, targets, keep), len(targets)
                )
            except Exception:  # noqa: BLE001 - a failed sample must not stop the loop
                log.exception("sample_failed", trees=len(targets))
                continue
            self._apply(observations)

    def _apply(self, observations: list[Observation]) -> None:
        current: list[Observation] = []
        for observation in observations:
            entry = self._entries.get(observation.task_id)
            if entry is None or not observation.is_of(entry.watch):
                continue  # unwatched or replaced while it was being sampled
            current.append(observation)
            if observation.ended:
                self._remove(observation.task_id)
                log.info(
                    "tree_ended",
                    task_id=observation.task_id,
                    available=observation.available,
                    reason=observation.reason,
                )
            else:
                self._latest[observation.task_id] = observation
        for subscription in self._broadcaster.publish(current):
            log.warning("subscriber_dropped", reason="SUBSCRIBER_TOO_SLOW", backlog=subscription.limit)

    # -- root exit notification -------------------------------------------------------------------

    def _add_reader(self, entry: _Entry) -> None:
        if entry.pidfd is None or self._loop is None:
            return
        try:
            self._loop.add_reader(entry.pidfd, self._root_exited, entry.watch)
        except (NotImplementedError, ValueError, OSError):
            os.close(entry.pidfd)
            entry.pidfd = None

    def _root_exited(self, watch: Watch) -> None:
        entry = self._entries.get(watch.task_id)
        if entry is None or entry.watch != watch or entry.pidfd is None:
            return
        # Readable stays readable: stop listening, keep the fd until the watch goes.
        assert self._loop is not None
        self._loop.remove_reader(entry.pidfd)
        self._request_sample(watch.task_id)

    def _remove(self, task_id: str) -> None:
        entry = self._entries.pop(task_id, None)
        self._latest.pop(task_id, None)
        self._prompt.discard(task_id)
        if entry is not None and entry.pidfd is not None:
            if self._loop is not None:
                self._loop.remove_reader(entry.pidfd)
            os.close(entry.pidfd)
            entry.pidfd = None
