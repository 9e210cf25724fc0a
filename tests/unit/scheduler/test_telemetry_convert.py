from __future__ import annotations

from google.protobuf.timestamp_pb2 import Timestamp

from services.scheduler.telemetry import observation_from_pb
from taskgate.telemetry.v1 import telemetry_pb2 as pb


def stamp(ms: int) -> Timestamp:
    t = Timestamp()
    t.FromMilliseconds(ms)
    return t


def test_unavailable_telemetry_has_no_figures() -> None:
    o = pb.ExecutionObservation(
        task_id="t", observe_time=stamp(5000), available=False, reason="ACCESS_DENIED", reason_detail="pid 7"
    )
    e = observation_from_pb(o)
    assert not e.available and e.reason == "ACCESS_DENIED: pid 7"
    assert e.cpu_user_ticks is None and e.io_write_bytes is None and e.last_activity_at is None


def test_available_figures_and_times_are_kept_apart() -> None:
    o = pb.ExecutionObservation(
        task_id="t",
        observe_time=stamp(9000),
        available=True,
        cpu_user_ticks=0,
        cpu_system_ticks=2,
        io_write_count=5,
        last_activity_time=stamp(7000),
        processes=[pb.ProcessIdentity(pid=10, start_time=99)],
    )
    e = observation_from_pb(o)
    assert e.cpu_user_ticks == 0 and e.cpu_system_ticks == 2 and e.io_write_count == 5
    assert e.observed_at == 9000 and e.last_activity_at == 7000
    assert [(p.pid, p.start_time) for p in e.processes] == [(10, 99)]
