"""Domain objects to and from the pending registry's protobuf messages (the only place both meet)."""

from __future__ import annotations

from collections.abc import Iterable

from google.protobuf.duration_pb2 import Duration

from libs.timestamps import ts
from services.pending_registry.domain import (
    Entry,
    EntryEvent,
    EntryKind,
    EventType,
    Question,
    QuestionState,
    RemovalReason,
    Snapshot,
    ToolResult,
)
from taskgate.pending.v1 import pending_pb2 as pb

KIND_TO_PB = {
    EntryKind.CONFIRM: pb.ENTRY_KIND_CONFIRM,
    EntryKind.ASK: pb.ENTRY_KIND_ASK,
    EntryKind.SECRET: pb.ENTRY_KIND_SECRET,
}
KIND_FROM_PB = {v: k for k, v in KIND_TO_PB.items()}
STATE_TO_PB = {
    QuestionState.OPEN: pb.QUESTION_STATE_OPEN,
    QuestionState.ANSWERED: pb.QUESTION_STATE_ANSWERED,
    QuestionState.REPLACED: pb.QUESTION_STATE_REPLACED,
    QuestionState.CANCELLED: pb.QUESTION_STATE_CANCELLED,
}
EVENT_TO_PB = {
    EventType.AVAILABLE: pb.LISTEN_EVENT_TYPE_AVAILABLE,
    EventType.SYNCED: pb.LISTEN_EVENT_TYPE_SYNCED,
    EventType.CLAIMED: pb.LISTEN_EVENT_TYPE_CLAIMED,
    EventType.REMOVED: pb.LISTEN_EVENT_TYPE_REMOVED,
}
REASON_TO_PB = {
    RemovalReason.ANSWERED: pb.REMOVAL_REASON_ANSWERED,
    RemovalReason.WITHDRAWN: pb.REMOVAL_REASON_WITHDRAWN,
    RemovalReason.CANCELED: pb.REMOVAL_REASON_CANCELED,
    RemovalReason.SHUTDOWN: pb.REMOVAL_REASON_SHUTDOWN,
}


def wait_from_pb(wait: Duration) -> float:
    return wait.seconds + wait.nanos / 1e9


def kind_from_pb(kind: int) -> EntryKind | None:
    return KIND_FROM_PB.get(kind)  # type: ignore[call-overload]


def kinds_from_pb(kinds: Iterable[int]) -> frozenset[EntryKind] | None:
    """None when any kind is unknown or unspecified."""
    out = [KIND_FROM_PB.get(k) for k in kinds]  # type: ignore[call-overload]
    return None if any(k is None for k in out) else frozenset(k for k in out if k is not None)


def tool_results_from_pb(results: Iterable[pb.ToolResult]) -> tuple[ToolResult, ...]:
    return tuple(
        ToolResult(tool_call_id=r.tool_call_id, name=r.name, arguments=r.arguments, output=r.output) for r in results
    )


def entry_to_pb(entry: Entry) -> pb.PendingEntry:
    return pb.PendingEntry(
        entry_id=entry.entry_id,
        session_id=entry.session_id,
        origin=entry.origin,
        kind=KIND_TO_PB[entry.kind],
        payload=entry.payload,
        create_time=ts(entry.created_at),
        claimed_by=entry.claimed_by or "",
        claim_time=ts(entry.claimed_at),
        agent_id=entry.agent_id,
    )


def event_to_pb(event: EntryEvent) -> pb.ListenResponse:
    msg = pb.ListenResponse(type=EVENT_TO_PB[event.type])
    if event.entry is not None:
        msg.entry.CopyFrom(entry_to_pb(event.entry))
    if event.reason is not None:
        msg.removal_reason = REASON_TO_PB[event.reason]
    return msg


def snapshot_to_pb(snapshot: Snapshot) -> pb.PendingSnapshot:
    return pb.PendingSnapshot(
        agent_id=snapshot.agent_id,
        session_id=snapshot.session_id,
        entry_id=snapshot.entry_id,
        payload=snapshot.payload,
        origin=snapshot.origin,
        kind=KIND_TO_PB[snapshot.kind],
        create_time=ts(snapshot.created_at),
        tool_results=[
            pb.ToolResult(
                tool_call_id=r.tool_call_id,
                name=r.name,
                arguments=r.arguments,
                output=r.output,
                arguments_truncated=r.arguments_truncated,
                output_truncated=r.output_truncated,
            )
            for r in snapshot.tool_results
        ],
    )


def question_to_pb(q: Question) -> pb.Question:
    return pb.Question(
        question_id=q.question_id,
        task_id=q.task_id,
        session_id=q.session_id,
        text=q.text,
        revision=q.revision,
        ask_time=ts(q.asked_at),
        answer=q.answer or "",
        answered_by=q.answered_by or "",
        answer_time=ts(q.answered_at),
        state=STATE_TO_PB[q.state],
        close_time=ts(q.closed_at),
    )
