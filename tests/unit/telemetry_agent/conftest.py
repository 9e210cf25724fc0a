"""Fixtures: real worker-like subprocesses, an in-process agent server, a stream collector."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest

from libs import proctree
from libs.grpc_server import NO_CALLER_AUTH, ServiceHost, start_server
from services.telemetry_agent.agent import Agent
from services.telemetry_agent.procread import ProcfsReader
from services.telemetry_agent.sampler import Reader, Sampler
from services.telemetry_agent.servicer import SERVICE_NAME, TelemetryAgentServicer
from taskgate.telemetry.v1 import telemetry_pb2 as pb
from taskgate.telemetry.v1 import telemetry_pb2_grpc as pb_grpc

BURN = "while True: pass"
# Says "ready" once its start-up (imports and all) is over, then does nothing.
SLEEP = "import sys, time\nprint('ready', flush=True)\ntime.sleep(600)"
WRITE_TO_PIPE = "import os, time\nwhile True:\n    os.write(1, b'x')\n    time.sleep(0.02)"
# Starts a sleeping child on "spawn", kills and reaps it on "stop"; answers with a line each time.
PARENT = """
import subprocess, sys
child = None
for line in sys.stdin:
    if line.strip() == "spawn":
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        print(child.pid, flush=True)
    elif line.strip() == "stop":
        child.kill(); child.wait()
        print("stopped", flush=True)
"""


@dataclass
class Proc:
    popen: subprocess.Popen[bytes]
    start_time: int

    @property
    def pid(self) -> int:
        return self.popen.pid

    def command(self, line: str) -> str:
        assert self.popen.stdin is not None and self.popen.stdout is not None
        self.popen.stdin.write(line.encode() + b"\n")
        self.popen.stdin.flush()
        return self.popen.stdout.readline().decode().strip()


class Procs:
    def __init__(self) -> None:
        self.started: list[subprocess.Popen[bytes]] = []

    def start(self, code: str, **kw: Any) -> Proc:
        """Start ``python -c code``; for SLEEP, return once it says it is ready."""
        if code == SLEEP:
            kw.setdefault("stdout", subprocess.PIPE)
        popen = subprocess.Popen([sys.executable, "-c", code], start_new_session=True, **kw)
        self.started.append(popen)
        if code == SLEEP:
            assert popen.stdout is not None and popen.stdout.readline() == b"ready\n"
        deadline = time.monotonic() + 10
        while (start := proctree.start_time_of(popen.pid)) is None:
            assert time.monotonic() < deadline, "no start time"
            time.sleep(0.005)
        return Proc(popen, start)

    def cleanup(self) -> None:
        for popen in self.started:
            if popen.poll() is None:
                popen.kill()
            popen.wait()
            for stream in (popen.stdin, popen.stdout):
                if stream is not None:
                    stream.close()


@pytest.fixture
def procs() -> Iterator[Procs]:
    p = Procs()
    yield p
    p.cleanup()


class Collector:
    """Reads one observation stream in the background; tests poll it with timeouts."""

    def __init__(self, call: Any) -> None:
        self.call = call
        self.items: list[pb.ExecutionObservation] = []
        self.batches: list[int] = []  # sizes of the batches received, in batch mode
        self.error: grpc.RpcError | None = None
        self._new = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> Collector:
        await self.call.initial_metadata()  # subscribed on the server once headers arrive
        self._task = asyncio.create_task(self._pump())
        return self

    async def _pump(self) -> None:
        try:
            async for response in self.call:
                if response.HasField("observation"):
                    self.items.append(response.observation)
                else:
                    self.batches.append(len(response.observations))
                    self.items.extend(response.observations)
                self._new.set()
        except grpc.RpcError as exc:
            self.error = exc
        finally:
            self._new.set()

    async def until(
        self, match: Callable[[pb.ExecutionObservation], bool], timeout: float = 10.0, after: int = 0
    ) -> pb.ExecutionObservation:
        """The first observation (from index ``after``) that matches, waiting for it."""
        deadline = asyncio.get_running_loop().time() + timeout
        seen = after
        while True:
            while seen < len(self.items):
                obs = self.items[seen]
                seen += 1
                if match(obs):
                    return obs
            if self._task is not None and self._task.done():
                raise AssertionError(f"stream ended ({self.error}) before a match")
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                raise AssertionError(f"no matching observation within {timeout}s; got {self.items[after:][-3:]}")
            self._new.clear()
            try:
                await asyncio.wait_for(self._new.wait(), left)
            except TimeoutError:
                pass

    async def closed(self, timeout: float = 10.0) -> None:
        assert self._task is not None
        await asyncio.wait_for(asyncio.shield(self._task), timeout)

    def of(self, task_id: str) -> list[pb.ExecutionObservation]:
        return [o for o in self.items if o.task_id == task_id]

    async def stop(self) -> None:
        self.call.cancel()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)


@dataclass
class AgentClient:
    agent: Agent
    host: ServiceHost
    channel: grpc.aio.Channel
    stub: pb_grpc.TelemetryAgentServiceStub

    async def watch(self, task_id: str, proc: Proc | None = None, pid: int = 0, start_time: int = 0) -> None:
        if proc is not None:
            pid, start_time = proc.pid, proc.start_time
        await self.stub.Watch(pb.WatchRequest(task_id=task_id, pid=pid, pid_start_time=start_time), timeout=5)

    async def stream(self, include_latest: bool = False, batch: bool = False) -> Collector:
        call = self.stub.StreamObservations(pb.StreamObservationsRequest(include_latest=include_latest, batch=batch))
        return await Collector(call).start()


AgentFactory = Callable[..., Awaitable[AgentClient]]


@pytest.fixture
async def make_agent() -> AsyncIterator[AgentFactory]:
    made: list[tuple[AgentClient, list[Collector]]] = []

    async def factory(interval_s: float = 0.15, reader: Reader | None = None, **kw: Any) -> AgentClient:
        agent = Agent(Sampler(reader or ProcfsReader()), interval_s, **kw)
        await agent.start()

        def register(server: grpc.aio.Server) -> None:
            pb_grpc.add_TelemetryAgentServiceServicer_to_server(TelemetryAgentServicer(agent), server)

        host = await start_server("127.0.0.1:0", [register], [SERVICE_NAME], security=NO_CALLER_AUTH)
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{host.port}")
        client = AgentClient(agent, host, channel, pb_grpc.TelemetryAgentServiceStub(channel))
        made.append((client, []))
        return client

    yield factory
    for client, _ in made:
        await client.agent.stop()
        await client.host.stop(0)
        await client.channel.close()
