"""Domain records <-> notifier protos (the servicer's edge)."""

from __future__ import annotations

from libs.timestamps import ts
from services.notifier.domain import (
    Attempt,
    ConversationEvent,
    FollowUp,
    Kind,
    Message,
    Notification,
    Outcome,
    Response,
    State,
)
from services.notifier.store import Frame, QuestionView
from taskgate.notifier.v1 import notifier_pb2 as pb

KIND_TO_PB = {
    Kind.TASK_REPORT: pb.NOTIFICATION_KIND_TASK_REPORT,
    Kind.TASK_QUESTION: pb.NOTIFICATION_KIND_TASK_QUESTION,
    Kind.REMINDER: pb.NOTIFICATION_KIND_REMINDER,
    Kind.TASK_COMPLETED: pb.NOTIFICATION_KIND_TASK_COMPLETED,
    Kind.TASK_FAILED: pb.NOTIFICATION_KIND_TASK_FAILED,
    Kind.TASK_CANCELLED: pb.NOTIFICATION_KIND_TASK_CANCELLED,
    Kind.TASK_NEEDS_RECONCILIATION: pb.NOTIFICATION_KIND_TASK_NEEDS_RECONCILIATION,
}
KIND_FROM_PB = {v: k for k, v in KIND_TO_PB.items()}
STATE_TO_PB = {
    State.PENDING: pb.NOTIFICATION_STATE_PENDING,
    State.DELIVERED: pb.NOTIFICATION_STATE_DELIVERED,
    State.STOPPED: pb.NOTIFICATION_STATE_STOPPED,
}
STATE_FROM_PB = {v: k for k, v in STATE_TO_PB.items()}
OUTCOME_TO_PB = {Outcome.DELIVERED: pb.ATTEMPT_OUTCOME_DELIVERED, Outcome.FAILED: pb.ATTEMPT_OUTCOME_FAILED}
FOLLOW_UP_TO_PB = {
    FollowUp.CONTINUES: pb.FOLLOW_UP_CONTINUES,
    FollowUp.ASKS_USER: pb.FOLLOW_UP_ASKS_USER,
    FollowUp.NONE: pb.FOLLOW_UP_NONE,
}
FOLLOW_UP_FROM_PB = {v: k for k, v in FOLLOW_UP_TO_PB.items()}


def attempt_to_pb(a: Attempt) -> pb.DeliveryAttempt:
    return pb.DeliveryAttempt(
        attempt_time=ts(a.at), outcome=OUTCOME_TO_PB[a.outcome], http_status=a.http_status or 0, error=a.error or ""
    )


def notification_to_pb(n: Notification) -> pb.Notification:
    return pb.Notification(
        notification_id=n.notification_id,
        agent_id=n.agent_id,
        session_id=n.session_id,
        kind=KIND_TO_PB[n.kind],
        task_id=n.task_id or "",
        question_id=n.question_id or "",
        text=n.text,
        handled=n.state == State.DELIVERED,
        create_time=ts(n.created_at),
        attempt_count=len(n.attempts),
        state=STATE_TO_PB[n.state],
        attempts=[attempt_to_pb(a) for a in n.attempts],
        next_attempt_time=ts(n.next_attempt_at if n.state == State.PENDING else None),
        deliver_time=ts(n.delivered_at),
        channel=n.channel or "",
    )


def message_to_pb(m: Message) -> pb.Message:
    return pb.Message(
        message_id=m.message_id,
        response_id=m.response_id or "",
        role=m.role,
        text=m.text,
        create_time=ts(m.created_at),
        complete_time=ts(m.completed_at),
        notification_id=m.notification_id or "",
        follow_up=FOLLOW_UP_TO_PB[m.follow_up] if m.follow_up else pb.FOLLOW_UP_UNSPECIFIED,
    )


def response_to_pb(r: Response) -> pb.Response:
    return pb.Response(
        response_id=r.response_id,
        text=r.text,
        final=r.final,
        create_time=ts(r.created_at),
        update_time=ts(r.updated_at),
        complete_time=ts(r.completed_at),
    )


def event_to_pb(e: ConversationEvent) -> pb.ConversationEvent:
    return pb.ConversationEvent(kind=e.kind, event_time=ts(e.at), data=e.data)


def frame_to_pb(f: Frame) -> pb.StreamActivityResponse:
    if f.snapshot is not None:
        snap = pb.ResponseSnapshot(response_id=f.snapshot.response_id, text=f.snapshot.text, final=f.snapshot.final)
        return pb.StreamActivityResponse(sequence=f.seq, snapshot=snap)
    assert f.notification is not None
    return pb.StreamActivityResponse(sequence=f.seq, notification=notification_to_pb(f.notification))


def question_to_pb(q: QuestionView) -> pb.QuestionReminders:
    out = pb.QuestionReminders(
        question_id=q.question_id,
        task_id=q.task_id,
        state=q.state.value,
        muted=q.muted,
        reminders_sent=q.reminders_sent,
    )
    if q.snoozed_until is not None:
        out.snooze_until_time.FromMilliseconds(q.snoozed_until)
    return out
