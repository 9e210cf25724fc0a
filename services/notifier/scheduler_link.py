"""What the notifier reads from the scheduler: its durable task event log, and a
conversation's tasks (for the unbacked-promise rule)."""

from __future__ import annotations

import asyncio

import grpc
import structlog

from services.notifier import domain
from services.notifier.domain import Notification, SessionTask, TaskFact
from services.notifier.servicer import NotifierServicer, new_id
from services.notifier.store import NotifierStore, QuestionFact
from taskgate.scheduler.v1 import scheduler_pb2 as spb
from taskgate.scheduler.v1 import scheduler_pb2_grpc as spb_grpc

log = structlog.get_logger("notifier.follower")

CURSOR = "scheduler.task_events"
EVENT_TYPES = {spb.TASK_EVENT_TYPE_STATE_CHANGED: "task.state_changed", spb.TASK_EVENT_TYPE_QUESTION: "task.question"}


def state_name(state: int) -> str:
    return spb.TaskState.Name(state).removeprefix("TASK_STATE_").lower()


def fact_from_pb(event: spb.WatchTasksResponse) -> TaskFact:
    task = event.task
    return TaskFact(
        event_type=EVENT_TYPES.get(event.type, "other"),
        task_id=task.task_id,
        agent_id=task.agent_id,
        session_id=task.session_id,
        title=task.title,
        state=state_name(task.state),
        result_text=task.result.text,
        failure_code=task.failure.code,
        failure_message=task.failure.message,
        question_id=task.pending_question.question_id,
        question_text=task.pending_question.text,
    )


class EventLogFollower:
    """Follows the scheduler's task event log from the stored cursor.

    Each event's notification (if any) and the cursor are written in one
    transaction; the notification's key makes a replayed event a no-op. After
    being down, it catches up from the cursor.
    """

    def __init__(self, stub: spb_grpc.SchedulerServiceStub, servicer: NotifierServicer, store: NotifierStore) -> None:
        self.stub = stub
        self.servicer = servicer
        self.store = store
        self.connected = asyncio.Event()

    async def handle(self, event: spb.WatchTasksResponse) -> Notification | None:
        fact = fact_from_pb(event)
        planned = domain.plan_notification(fact)
        n = None
        if planned is not None:
            n = Notification(
                notification_id=new_id(),
                agent_id=fact.agent_id,
                session_id=fact.session_id,
                kind=planned.kind,
                task_id=fact.task_id,
                question_id=planned.question_id,
                text=planned.text,
                created_at=self.servicer.clock.now_ms(),
                channel=self.servicer.channel_of(fact.agent_id),
                key=planned.key,
            )
        question = None
        if fact.event_type == "task.question" and fact.question_id:
            question = QuestionFact(
                question_id=fact.question_id,
                agent_id=fact.agent_id,
                session_id=fact.session_id,
                task_id=fact.task_id,
                title=fact.title,
                text=fact.question_text,
                asked_at=self.servicer.clock.now_ms(),
            )
        task_state = (fact.task_id, fact.state) if fact.event_type == "task.state_changed" else None
        stored, frame = await self.store.record_log_event(
            CURSOR, event.sequence, n, new_id(), question=question, task_state=task_state
        )
        self.servicer.after_commit(frame)
        return stored

    async def run(self) -> None:
        delay = 0.2
        reported_down = False
        while True:
            try:
                cursor = await self.store.cursor(CURSOR)
            except Exception:  # noqa: BLE001 - the database may come back
                log.exception("event_log_cursor_unreadable")
                await asyncio.sleep(2.0)
                continue
            stream = self.stub.WatchTasks(
                spb.WatchTasksRequest(all_sessions=True, since_sequence=cursor, event_types=list(EVENT_TYPES))
            )
            try:
                await stream.wait_for_connection()
                self.connected.set()
                if reported_down:
                    log.info("event_log_reconnected", cursor=cursor)
                    reported_down = False
                async for event in stream:
                    await self.handle(event)
                    delay = 0.2
            except grpc.aio.AioRpcError as exc:
                if not reported_down:
                    log.warning("event_log_unreachable", code=exc.code().name, cursor=cursor)
                    reported_down = True
            except Exception:  # noqa: BLE001 - e.g. the database: retry from the stored cursor
                log.exception("event_log_follow_failed", cursor=cursor)
            finally:
                stream.cancel()
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)


class SchedulerSessionTasks:
    def __init__(self, stub: spb_grpc.SchedulerServiceStub, timeout_s: float) -> None:
        self.stub = stub
        self.timeout_s = timeout_s

    async def __call__(self, agent_id: str, session_id: str) -> list[SessionTask]:
        # Newest first: the active ones and this turn's are on the first page unless
        # a conversation has more than 100 tasks in flight.
        reply = await self.stub.ListTasks(
            spb.ListTasksRequest(
                agent_id=agent_id, session_id=session_id, page=0, page_size=100, include_finished=True, preview_chars=1
            ),
            timeout=self.timeout_s,
        )
        return [
            SessionTask(state=state_name(t.state), created_at=t.timing.create_time.ToMilliseconds())
            for t in reply.tasks
        ]
