"""The scheduler's side of the telemetry agent: register trees, consume observations.

Telemetry is advisory: every call here is best-effort and in the background, so an
agent that is down or restarting never stops a task from running. After the
observation stream breaks (an agent restart drops its in-memory watch list) the
client reconnects with backoff and registers every tree again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import grpc
import structlog

from libs.grpc_client import ClientSecurity, aio_channel
from services.scheduler.domain import Execution, ProcessIdentity
from taskgate.telemetry.v1 import telemetry_pb2 as pb
from taskgate.telemetry.v1 import telemetry_pb2_grpc as pb_grpc

log = structlog.get_logger("scheduler.telemetry")

ObservationSink = Callable[[str, Execution], Awaitable[None]]
RPC_TIMEOUT_S = 5.0
MAX_BACKOFF_S = 5.0


FIGURES = ("cpu_user_ticks", "cpu_system_ticks", "io_read_count", "io_write_count", "io_read_bytes", "io_write_bytes")


def observation_from_pb(o: pb.ExecutionObservation) -> Execution:
    reason = o.reason + (f": {o.reason_detail}" if o.reason_detail else "") if o.reason else None
    return Execution(
        available=o.available,
        reason=reason,
        observed_at=o.observe_time.ToMilliseconds(),
        last_activity_at=o.last_activity_time.ToMilliseconds() if o.HasField("last_activity_time") else None,
        processes=[ProcessIdentity(pid=p.pid, start_time=p.start_time) for p in o.processes],
        # Unset figures (telemetry unavailable) stay unset: nothing is guessed.
        **{name: getattr(o, name) for name in FIGURES if o.HasField(name)},
    )


class TelemetryClient:
    def __init__(self, addr: str, security: ClientSecurity) -> None:
        self._channel = aio_channel(addr, security)
        self._stub = pb_grpc.TelemetryAgentServiceStub(self._channel)
        self._watches: dict[str, tuple[int, int]] = {}
        self._pending: set[asyncio.Task[None]] = set()
        self._runner: asyncio.Task[None] | None = None
        self.sink: ObservationSink | None = None
        self.connected = asyncio.Event()

    # --- TelemetryHook -------------------------------------------------------

    def watch(self, task_id: str, pid: int, start_time: int) -> None:
        self._watches[task_id] = (pid, start_time)
        self._background(self._register(task_id, pid, start_time))

    def unwatch(self, task_id: str) -> None:
        if self._watches.pop(task_id, None) is not None:
            self._background(self._unregister(task_id))

    # --- lifecycle -----------------------------------------------------------

    def start(self, sink: ObservationSink) -> None:
        self.sink = sink
        self._runner = asyncio.create_task(self._consume(), name="telemetry-stream")

    async def close(self) -> None:
        if self._runner is not None:
            self._runner.cancel()
            await asyncio.gather(self._runner, return_exceptions=True)
        await asyncio.gather(*self._pending, return_exceptions=True)
        await self._channel.close()

    def _background(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _register(self, task_id: str, pid: int, start_time: int) -> None:
        try:
            await self._stub.Watch(
                pb.WatchRequest(task_id=task_id, pid=pid, pid_start_time=start_time), timeout=RPC_TIMEOUT_S
            )
        except grpc.aio.AioRpcError as exc:
            # Re-sent after the stream reconnects.
            log.debug("telemetry_watch_failed", task_id=task_id, code=exc.code().name)

    async def _unregister(self, task_id: str) -> None:
        try:
            await self._stub.Unwatch(pb.UnwatchRequest(task_id=task_id), timeout=RPC_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            log.debug("telemetry_unwatch_failed", task_id=task_id, code=exc.code().name)

    async def _consume(self) -> None:
        backoff = 0.2
        while True:
            # wait_for_ready: headers arrive only once the agent really accepted the stream.
            stream = self._stub.StreamObservations(pb.StreamObservationsRequest(batch=True), wait_for_ready=True)
            try:
                await stream.initial_metadata()
                # Subscribed: (re-)register every live tree; an agent restart forgot them.
                for task_id, (pid, start_time) in list(self._watches.items()):
                    await self._register(task_id, pid, start_time)
                self.connected.set()
                log.info("telemetry_connected", watches=len(self._watches))
                backoff = 0.2
                async for response in stream:
                    for observation in response.observations:
                        # Only the current attempt's tree: a late observation of an earlier one is dropped.
                        if self._watches.get(observation.task_id) == (
                            observation.root.pid,
                            observation.root.start_time,
                        ):
                            if self.sink is not None:
                                await self.sink(observation.task_id, observation_from_pb(observation))
            except grpc.aio.AioRpcError as exc:
                if self.connected.is_set():
                    log.warning("telemetry_stream_lost", code=exc.code().name)
            finally:
                self.connected.clear()
                stream.cancel()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_S)
