"""The real telemetry-agent process: serve, observe, restart with an empty watch list."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from libs import proctree
from taskgate.telemetry.v1 import telemetry_pb2 as pb
from taskgate.telemetry.v1 import telemetry_pb2_grpc as pb_grpc
from tests.support.procs import ServiceProcess, free_port
from tests.support.procs import channel as service_channel

pytestmark = pytest.mark.e2e

SLEEP = "import sys, time\nprint('ready', flush=True)\ntime.sleep(600)"


@pytest.fixture
def sleeper() -> Iterator[tuple[int, int]]:
    popen = subprocess.Popen([sys.executable, "-c", SLEEP], stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert popen.stdout is not None and popen.stdout.readline() == b"ready\n"
        start = proctree.start_time_of(popen.pid)
        assert start is not None
        yield popen.pid, start
    finally:
        popen.kill()
        popen.wait()
        if popen.stdout is not None:
            popen.stdout.close()


def _first(stream: grpc.Future, task_id: str, deadline_s: float = 15.0) -> pb.ExecutionObservation:
    """The next observation of ``task_id``; the stream's own deadline bounds the wait."""
    end = time.monotonic() + deadline_s
    for response in stream:
        if response.observation.task_id == task_id:
            return response.observation
        assert time.monotonic() < end
    raise AssertionError("stream ended")


def test_agent_process_serves_observations_and_restarts_empty(tmp_path: Path, sleeper: tuple[int, int]) -> None:
    pid, start = sleeper
    addr = f"127.0.0.1:{free_port()}"
    env = {
        "TASKGATE_TELEMETRY_ADDR": addr,
        "TASKGATE_TASKS_OBSERVATION_INTERVAL_MS": "150",
        "TASKGATE_DATA_DIR": str(tmp_path / "data"),
    }
    agent = ServiceProcess("services.telemetry_agent", env, tmp_path / "agent.log", addr)
    agent.start()
    try:
        with service_channel(addr, env, "scheduler") as channel:
            stub = pb_grpc.TelemetryAgentServiceStub(channel)
            stream = stub.StreamObservations(pb.StreamObservationsRequest(), timeout=30)
            stream.initial_metadata()
            stub.Watch(pb.WatchRequest(task_id="e2e", pid=pid, pid_start_time=start), timeout=5)
            first = _first(stream, "e2e")
            assert first.available and [p.pid for p in first.processes] == [pid]
            second = _first(stream, "e2e")
            assert second.observe_time.ToMilliseconds() > first.observe_time.ToMilliseconds()
            assert [w.task_id for w in stub.ListWatches(pb.ListWatchesRequest(), timeout=5).watches] == ["e2e"]

            assert agent.stop() == 0  # SIGTERM: graceful, the stream ends
            with pytest.raises(StopIteration):
                while True:
                    next(stream)

        agent.start()  # same address, fresh process: nothing was persisted
        with service_channel(addr, env, "scheduler") as channel:
            stub = pb_grpc.TelemetryAgentServiceStub(channel)
            assert list(stub.ListWatches(pb.ListWatchesRequest(), timeout=5).watches) == []
            stream = stub.StreamObservations(pb.StreamObservationsRequest(), timeout=30)
            stream.initial_metadata()
            stub.Watch(pb.WatchRequest(task_id="e2e", pid=pid, pid_start_time=start), timeout=5)  # re-register
            again = _first(stream, "e2e")
            assert again.available and again.root.pid == pid
            stream.cancel()
    finally:
        agent.stop()
    assert '"event": "watch_added"' in agent.logs()
