"""gRPC servicer of the notifier: translate requests, apply the domain rules, store, fan out."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Protocol

import grpc
import structlog

from libs import errors
from libs.clock import Clock, SystemClock
from services.notifier import convert, domain
from services.notifier.activity import ActivityHub
from services.notifier.domain import ConversationEvent, FollowUp, Message, Notification, Response, SessionTask
from services.notifier.store import Frame, NotifierStore, QuestionView, ReminderRow
from taskgate.notifier.v1 import notifier_pb2 as pb
from taskgate.notifier.v1 import notifier_pb2_grpc as pb_grpc

log = structlog.get_logger("notifier")

UUID_HEX = re.compile(r"[0-9a-f]{32}")


class SessionTasks(Protocol):
    """The scheduler's view of a conversation's tasks (for the unbacked-promise rule)."""

    async def __call__(self, agent_id: str, session_id: str) -> list[SessionTask]: ...


def new_id() -> str:
    return uuid.uuid4().hex


class NotifierServicer(pb_grpc.NotifierServiceServicer):
    def __init__(
        self,
        store: NotifierStore,
        hub: ActivityHub | None = None,
        clock: Clock | None = None,
        channel_of: Callable[[str], str | None] = lambda _agent: None,
        session_tasks: SessionTasks | None = None,
        wake_delivery: Callable[[], None] = lambda: None,
        reminder_base_ms: int = 600_000,
        snooze_ms: int = domain.SNOOZE_MS,
    ) -> None:
        self.reminder_base_ms = reminder_base_ms
        self.snooze_ms = snooze_ms
        self.store = store
        self.hub = hub or ActivityHub()
        self.clock = clock or SystemClock()
        self.channel_of = channel_of
        self.session_tasks = session_tasks
        self.wake_delivery = wake_delivery
        self._encoded_frames: dict[int, pb.StreamActivityResponse] = {}

    async def create_notification(self, n: Notification) -> Notification:
        """Shared by EnqueueNotification and the event-log follower's callers."""
        stored, frame = await self.store.enqueue(n, new_id())
        self.after_commit(frame)
        return stored

    def _encoded(self, frame: Frame) -> pb.StreamActivityResponse:
        """A live frame goes to every subscriber of its conversation: convert it once."""
        message = self._encoded_frames.get(frame.seq)
        if message is None:
            message = self._encoded_frames[frame.seq] = convert.frame_to_pb(frame)
            if len(self._encoded_frames) > 256:
                del self._encoded_frames[next(iter(self._encoded_frames))]
        return message

    def after_commit(self, frame: Frame | None) -> None:
        if frame is None:
            return
        self.hub.publish(frame)
        if frame.notification is not None:
            log.info(
                "notification_created",
                notification_id=frame.notification.notification_id,
                kind=frame.notification.kind.value,
                task_id=frame.notification.task_id,
                channel=frame.notification.channel,
            )
            if frame.notification.state == domain.State.PENDING:
                self.wake_delivery()  # one delivered at creation (no channel) has nothing to send

    # --- notifications -----------------------------------------------------------

    async def EnqueueNotification(
        self, request: pb.EnqueueNotificationRequest, context: grpc.aio.ServicerContext
    ) -> pb.EnqueueNotificationResponse:
        if request.kind not in convert.KIND_FROM_PB:
            raise domain.InvalidArgument("INVALID_KIND", "kind must be set", field="kind")
        domain.validate_conversation(request.agent_id, request.session_id)
        for name, value in (("taskId", request.task_id), ("requestId", request.request_id)):
            if value:
                domain.validate_id(name, value)
        domain.validate_text(request.text)
        n = Notification(
            notification_id=new_id(),
            agent_id=request.agent_id,
            session_id=request.session_id,
            kind=convert.KIND_FROM_PB[request.kind],
            task_id=request.task_id or None,
            text=request.text,
            created_at=self.clock.now_ms(),
            channel=self.channel_of(request.agent_id),
            key=request.request_id or None,
        )
        return pb.EnqueueNotificationResponse(
            notification=convert.notification_to_pb(await self.create_notification(n))
        )

    async def ListNotifications(
        self, request: pb.ListNotificationsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListNotificationsResponse:
        domain.validate_conversation(request.agent_id, request.session_id)
        size = request.page_size or 10
        domain.validate_page(request.page, size)
        state = convert.STATE_FROM_PB.get(request.state)
        shown, items = await self.store.list_notifications(
            request.agent_id, request.session_id, state, request.page, size
        )
        return pb.ListNotificationsResponse(
            notifications=[convert.notification_to_pb(n) for n in items],
            page=shown.page,
            pages=shown.pages,
            total=shown.total,
        )

    async def StopNotification(
        self, request: pb.StopNotificationRequest, context: grpc.aio.ServicerContext
    ) -> pb.StopNotificationResponse:
        domain.validate_conversation(request.agent_id, request.session_id)
        domain.validate_id("notificationId", request.notification_id)
        n = await self.store.stop(request.agent_id, request.session_id, request.notification_id)
        log.info("notification_stopped", notification_id=n.notification_id, state=n.state.value)
        return pb.StopNotificationResponse(notification=convert.notification_to_pb(n))

    async def ReplyToNotification(
        self, request: pb.ReplyToNotificationRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReplyToNotificationResponse:
        domain.validate_conversation(request.agent_id, request.session_id)
        domain.validate_id("notificationId", request.notification_id)
        domain.validate_text(request.text)
        follow_up = convert.FOLLOW_UP_FROM_PB.get(request.follow_up)
        if follow_up is None:
            raise domain.InvalidArgument(
                "INVALID_FOLLOW_UP", "followUp is continues, asks_user or none", field="followUp"
            )
        report = await self.store.get_notification(request.agent_id, request.session_id, request.notification_id)
        event = None
        if follow_up == FollowUp.CONTINUES:
            if self.session_tasks is None:
                raise errors.Unavailable("SCHEDULER_UNAVAILABLE", "cannot check the conversation's tasks")
            tasks = await self.session_tasks(request.agent_id, request.session_id)
            if domain.is_unbacked_promise(follow_up, tasks, report.created_at):
                event = ConversationEvent(
                    kind="response.unbacked_promise",
                    at=self.clock.now_ms(),
                    data={"notificationId": report.notification_id, "taskId": report.task_id or ""},
                )
        now = self.clock.now_ms()
        response_id = f"reply-{new_id()}"
        message = Message(
            message_id=new_id(),
            agent_id=request.agent_id,
            session_id=request.session_id,
            role="assistant",
            text=request.text,
            response_id=response_id,
            notification_id=report.notification_id,
            follow_up=follow_up,
            created_at=now,
            completed_at=now,
        )
        snapshot = Response(
            agent_id=request.agent_id,
            session_id=request.session_id,
            response_id=response_id,
            text=request.text,
            final=True,
            created_at=now,
            updated_at=now,
            completed_at=now,
        )
        stored, frame = await self.store.add_reply(message, snapshot, event)
        self.after_commit(frame)
        if event is not None:
            # The reply is delivered unchanged; the event and this line are for the operator.
            log.warning(
                "response_unbacked_promise",
                agent_id=request.agent_id,
                session_id=request.session_id,
                notification_id=report.notification_id,
                task_id=report.task_id,
            )
        return pb.ReplyToNotificationResponse(message=convert.message_to_pb(stored), unbacked_promise=event is not None)

    # --- messages and events -------------------------------------------------------

    async def ListMessages(
        self, request: pb.ListMessagesRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListMessagesResponse:
        domain.validate_conversation(request.agent_id, request.session_id)
        size = request.page_size or 10
        domain.validate_page(request.page, size)
        shown, items = await self.store.list_messages(request.agent_id, request.session_id, request.page, size)
        return pb.ListMessagesResponse(
            messages=[convert.message_to_pb(m) for m in items], page=shown.page, pages=shown.pages, total=shown.total
        )

    async def CreateMessage(
        self, request: pb.CreateMessageRequest, context: grpc.aio.ServicerContext
    ) -> pb.CreateMessageResponse:
        domain.validate_conversation(request.agent_id, request.session_id)
        domain.validate_text(request.text)
        now = self.clock.now_ms()
        message = Message(
            message_id=new_id(),
            agent_id=request.agent_id,
            session_id=request.session_id,
            role="user",
            text=request.text,
            created_at=now,
            completed_at=now,
        )
        stored, updates, frames = await self.store.add_user_message(message, self.reminder_base_ms, self._reminder_for)
        for frame in frames:
            self.after_commit(frame)
        return pb.CreateMessageResponse(
            message=convert.message_to_pb(stored), pending_updates=[convert.notification_to_pb(n) for n in updates]
        )

    def _reminder_for(self, q: ReminderRow, count: int) -> Notification:
        """The reminder notification of a question (built inside the message's transaction)."""
        return Notification(
            notification_id=new_id(),
            agent_id=q.agent_id,
            session_id=q.session_id,
            kind=domain.Kind.REMINDER,
            task_id=q.task_id,
            question_id=q.question_id,
            text=domain.reminder_text(q.title, q.text, q.question_id, count),
            created_at=self.clock.now_ms(),
            channel=self.channel_of(q.agent_id),
            key=f"{q.question_id}:reminder:{count}",
        )

    # --- questions -----------------------------------------------------------------

    async def _question_preference(self, agent_id: str, session_id: str, question_id: str, action: str) -> QuestionView:
        domain.validate_conversation(agent_id, session_id)
        if not UUID_HEX.fullmatch(question_id or ""):
            raise domain.InvalidArgument("INVALID_ID", "questionId must be 32 hex digits", field="questionId")
        view = await self.store.set_question_preference(
            agent_id, session_id, question_id, action, self.clock.now_ms(), self.snooze_ms
        )
        log.info("question_" + action + "d", question_id=question_id, task_id=view.task_id)
        return view

    async def SnoozeQuestion(
        self, request: pb.SnoozeQuestionRequest, context: grpc.aio.ServicerContext
    ) -> pb.SnoozeQuestionResponse:
        view = await self._question_preference(request.agent_id, request.session_id, request.question_id, "snooze")
        return pb.SnoozeQuestionResponse(question=convert.question_to_pb(view))

    async def MuteQuestion(
        self, request: pb.MuteQuestionRequest, context: grpc.aio.ServicerContext
    ) -> pb.MuteQuestionResponse:
        view = await self._question_preference(request.agent_id, request.session_id, request.question_id, "mute")
        return pb.MuteQuestionResponse(question=convert.question_to_pb(view))

    async def ClaimUnreportedFailure(
        self, request: pb.ClaimUnreportedFailureRequest, context: grpc.aio.ServicerContext
    ) -> pb.ClaimUnreportedFailureResponse:
        domain.validate_conversation(request.agent_id, request.session_id)
        domain.validate_id("taskId", request.task_id)
        if request.event_sequence <= 0:
            raise domain.InvalidArgument("INVALID_SEQUENCE", "eventSequence must be positive", field="eventSequence")
        claim = await self.store.claim_unreported_failure(
            request.agent_id, request.session_id, request.task_id, request.event_sequence, self.clock.now_ms()
        )
        log.info("failure_report_claimed", task_id=request.task_id, outcome=claim.value, claimed=claim.claimed)
        return pb.ClaimUnreportedFailureResponse(claimed=claim.claimed, outcome=claim.value)

    async def ListConversationEvents(
        self, request: pb.ListConversationEventsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListConversationEventsResponse:
        domain.validate_conversation(request.agent_id, request.session_id)
        size = request.page_size or 10
        domain.validate_page(request.page, size)
        shown, items = await self.store.list_events(request.agent_id, request.session_id, request.page, size)
        return pb.ListConversationEventsResponse(
            events=[convert.event_to_pb(e) for e in items], page=shown.page, pages=shown.pages, total=shown.total
        )

    # --- responses and activity ----------------------------------------------------

    async def PublishResponse(
        self, request: pb.PublishResponseRequest, context: grpc.aio.ServicerContext
    ) -> pb.PublishResponseResponse:
        domain.validate_conversation(request.agent_id, request.session_id)
        snap = request.snapshot
        domain.validate_id("responseId", snap.response_id)
        domain.validate_text(snap.text, allow_empty=True)
        now = self.clock.now_ms()
        response, frame = await self.store.publish(
            Response(
                agent_id=request.agent_id,
                session_id=request.session_id,
                response_id=snap.response_id,
                text=snap.text,
                final=snap.final,
                created_at=now,
                updated_at=now,
            )
        )
        self.after_commit(frame)
        return pb.PublishResponseResponse(response=convert.response_to_pb(response))

    async def _replay(self, agent_id: str, session_id: str, after: int | None) -> tuple[list[Frame], bool]:
        if after is not None:
            frames = await self.store.frames_after(agent_id, session_id, after)
            if frames is not None:
                return frames, True
        return await self.store.open_responses(agent_id, session_id), False

    async def ReplayActivity(
        self, request: pb.ReplayActivityRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReplayActivityResponse:
        domain.validate_conversation(request.agent_id, request.session_id)
        after = request.after_sequence if request.HasField("after_sequence") else None
        frames, resumed = await self._replay(request.agent_id, request.session_id, after)
        return pb.ReplayActivityResponse(frames=[convert.frame_to_pb(f) for f in frames], resumed=resumed)

    async def StreamActivity(
        self, request: pb.StreamActivityRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.StreamActivityResponse]:
        domain.validate_conversation(request.agent_id, request.session_id)
        agent_id, session_id = request.agent_id, request.session_id
        with self.hub.subscribe(agent_id, session_id) as sub:
            # Subscribed before reading, so nothing falls between; duplicates are skipped below.
            if request.live_only:
                frames: list[Frame] = []
                yield pb.StreamActivityResponse()
            else:
                after = request.after_sequence if request.HasField("after_sequence") else None
                frames, _ = await self._replay(agent_id, session_id, after)
            sent_snapshots: dict[str, int] = {}
            sent_notifications: set[int] = set()

            def fresh(frame: Frame) -> bool:
                if frame.snapshot is not None:
                    if sent_snapshots.get(frame.snapshot.response_id, -1) >= frame.seq:
                        return False
                    sent_snapshots[frame.snapshot.response_id] = frame.seq
                    return True
                return frame.seq not in sent_notifications

            for frame in frames:
                if fresh(frame):
                    if frame.notification is not None:
                        sent_notifications.add(frame.seq)
                    yield convert.frame_to_pb(frame)
            while True:
                try:
                    async with asyncio.timeout(1.0):
                        frame = await sub.queue.get()
                except TimeoutError:
                    if sub.overflowed:
                        raise errors.ResourceExhausted(
                            "STREAM_TOO_SLOW", "the stream fell behind; reconnect with Last-Event-ID"
                        ) from None
                    continue
                if fresh(frame):
                    yield self._encoded(frame)
