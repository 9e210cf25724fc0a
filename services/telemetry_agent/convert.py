"""Domain objects to and from the telemetry protobuf messages (the only place both meet)."""

from __future__ import annotations

from libs.timestamps import ts
from services.telemetry_agent.domain import Member, Observation, WatchEntry
from taskgate.telemetry.v1 import telemetry_pb2 as pb


def identity_to_pb(member: Member) -> pb.ProcessIdentity:
    return pb.ProcessIdentity(pid=member.pid, start_time=member.start_time)


def observation_to_pb(obs: Observation) -> pb.ExecutionObservation:
    msg = pb.ExecutionObservation(
        task_id=obs.task_id,
        observe_time=ts(obs.observed_at),
        available=obs.available,
        reason=obs.reason or "",
        reason_detail=obs.reason_detail or "",
        processes=[identity_to_pb(m) for m in obs.members],
        ended=obs.ended,
        root=identity_to_pb(obs.root),
    )
    if obs.figures is not None:
        f = obs.figures
        msg.cpu_user_ticks = f.cpu_user_ticks
        msg.cpu_system_ticks = f.cpu_system_ticks
        msg.io_read_count = f.read_count
        msg.io_write_count = f.write_count
        msg.io_read_bytes = f.read_bytes
        msg.io_write_bytes = f.write_bytes
    if obs.last_activity_at is not None:
        msg.last_activity_time.CopyFrom(ts(obs.last_activity_at))
    return msg


def watch_entry_to_pb(entry: WatchEntry) -> pb.WatchedTree:
    return pb.WatchedTree(
        task_id=entry.watch.task_id,
        pid=entry.watch.pid,
        pid_start_time=entry.watch.start_time,
        create_time=ts(entry.created_at),
    )
