"""gRPC servicer of the notifier (foundation: the outbox only)."""

from __future__ import annotations

import time
import uuid

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from services.notifier import domain
from services.notifier.domain import Kind, Notification
from services.notifier.store import NotifierStore
from taskgate.notifier.v1 import notifier_pb2 as pb
from taskgate.notifier.v1 import notifier_pb2_grpc as pb_grpc

KIND_FROM_PB = {
    pb.NOTIFICATION_KIND_TASK_REPORT: Kind.TASK_REPORT,
    pb.NOTIFICATION_KIND_TASK_QUESTION: Kind.TASK_QUESTION,
    pb.NOTIFICATION_KIND_REMINDER: Kind.REMINDER,
}
KIND_TO_PB = {v: k for k, v in KIND_FROM_PB.items()}
MAX_PAGE_SIZE = 100


def _to_pb(n: Notification) -> pb.Notification:
    created = Timestamp()
    created.FromMilliseconds(n.created_at)
    return pb.Notification(
        notification_id=n.notification_id,
        agent_id=n.agent_id,
        session_id=n.session_id,
        kind=KIND_TO_PB[n.kind],
        task_id=n.task_id or "",
        body=n.body,
        handled=n.handled,
        create_time=created,
        attempt_count=n.attempt_count,
    )


class NotifierServicer(pb_grpc.NotifierServiceServicer):
    def __init__(self, store: NotifierStore) -> None:
        self.store = store

    async def EnqueueNotification(
        self, request: pb.EnqueueNotificationRequest, context: grpc.aio.ServicerContext
    ) -> pb.EnqueueNotificationResponse:
        if request.kind not in KIND_FROM_PB:
            raise domain.InvalidArgument("INVALID_KIND", "kind must be set", field="kind")
        domain.validate_new(
            request.agent_id, request.session_id, request.task_id or None, request.body, request.request_id or None
        )
        n = Notification(
            notification_id=uuid.uuid4().hex,
            agent_id=request.agent_id,
            session_id=request.session_id,
            kind=KIND_FROM_PB[request.kind],
            task_id=request.task_id or None,
            body=request.body,
            created_at=int(time.time() * 1000),
            request_id=request.request_id or None,
        )
        return pb.EnqueueNotificationResponse(notification=_to_pb(await self.store.enqueue(n)))

    async def ListNotifications(
        self, request: pb.ListNotificationsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListNotificationsResponse:
        domain.validate_new(request.agent_id, request.session_id, None, "-", None)
        size = request.page_size or 50
        if not 1 <= size <= MAX_PAGE_SIZE:
            raise domain.InvalidArgument("INVALID_PAGE_SIZE", "page_size must be 1-100", field="page_size")
        token = request.page_token or "0"
        if not token.isdigit():
            raise domain.InvalidArgument("INVALID_PAGE_TOKEN", "malformed page_token", field="page_token")
        offset = int(token)
        items = await self.store.list_for(request.agent_id, request.session_id, offset, size + 1)
        next_token = str(offset + size) if len(items) > size else ""
        return pb.ListNotificationsResponse(notifications=[_to_pb(n) for n in items[:size]], next_page_token=next_token)
