"""What the notifier reads from the scheduler: its durable task event log, and a
conversation's tasks (for the unbacked-promise rule)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterable, Sequence
from typing import TypeAlias

import grpc
import structlog

from services.notifier import domain
from services.notifier.domain import Notification, SessionTask, TaskFact
from services.notifier.metrics import EVENT_LOG_BATCHES, EVENT_LOG_EVENTS
from services.notifier.servicer import NotifierServicer, new_id
from services.notifier.store import LogEvent, NotifierStore, QuestionFact
from taskgate.scheduler.v1 import scheduler_pb2 as spb
from taskgate.scheduler.v1 import scheduler_pb2_grpc as spb_grpc

log = structlog.get_logger("notifier.follower")

CURSOR = "scheduler.task_events"
EVENT_TYPES = {spb.TASK_EVENT_TYPE_STATE_CHANGED: "task.state_changed", spb.TASK_EVENT_TYPE_QUESTION: "task.question"}


def state_name(state: int) -> str:
    return spb.TaskState.Name(state).removeprefix("TASK_STATE_").lower()


# One event of the log: an entry of a batched response, or an unbatched response itself
# (what a scheduler without batches sends; both carry sequence, type and task).
LogItem: TypeAlias = spb.TaskEvent | spb.WatchTasksResponse


def fact_from_pb(event: LogItem) -> TaskFact:
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


# A batch is what the stream has ready when the previous one committed, up to this many...
BATCH_MAX = 256
# ...and what arrives this long after its first event: a transaction's fixed cost shared by
# more events, for a few ms more latency.
BATCH_LINGER_S = 0.005
# Events read ahead of the database; the stream waits (flow control) beyond this.
READ_AHEAD = 2 * BATCH_MAX


class _StreamEnded:
    """Put by the reader after the stream's last event: how it ended (None: closed)."""

    def __init__(self, error: BaseException | None) -> None:
        self.error = error


class EventLogFollower:
    """Follows the scheduler's task event log from the stored cursor.

    A reader task takes events off the stream while the previous batch commits; the
    writer then applies everything that is ready (up to ``batch_max``) in one
    transaction — each event's notification (if any), question facts and task-state
    effects, and the cursor at the batch's last event — and publishes the frames after
    the commit, in order. The notification's key makes a replayed event a no-op, so a
    crash mid-batch re-reads the batch from the cursor and duplicates nothing. After
    being down, it catches up from the cursor.
    """

    def __init__(
        self,
        stub: spb_grpc.SchedulerServiceStub,
        servicer: NotifierServicer,
        store: NotifierStore,
        batch_max: int = BATCH_MAX,
        linger_s: float = BATCH_LINGER_S,
    ) -> None:
        self.stub = stub
        self.servicer = servicer
        self.store = store
        self.batch_max = batch_max
        self.linger_s = linger_s
        self.batches = 0  # committed batches (a stream that made progress retries at once)
        self.connected = asyncio.Event()

    def prepare(self, event: LogItem) -> LogEvent:
        """What one event means to the store (ids and times are fixed here, before the write)."""
        fact = fact_from_pb(event)
        planned = domain.plan_notification(fact)
        now = self.servicer.clock.now_ms()
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
                created_at=now,
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
                asked_at=now,
            )
        task_state = (fact.task_id, fact.state) if fact.event_type == "task.state_changed" else None
        message_id = new_id() if n is not None else ""
        return LogEvent(event.sequence, n, message_id, question, task_state)

    async def handle_batch(self, events: Sequence[LogItem]) -> list[Notification | None]:
        """Apply ``events`` in one transaction, then publish their frames in order."""
        stored = await self.store.record_log_events(CURSOR, [self.prepare(e) for e in events])
        self.batches += 1
        EVENT_LOG_BATCHES.inc()
        EVENT_LOG_EVENTS.inc(len(events))
        for _, frame in stored:
            self.servicer.after_commit(frame)
        return [n for n, _ in stored]

    async def handle(self, event: LogItem) -> Notification | None:
        return (await self.handle_batch([event]))[0]

    async def follow(self, stream: AsyncIterable[spb.WatchTasksResponse]) -> None:
        """Apply the stream's events batch by batch until it ends; its error is raised."""
        ready: asyncio.Queue[LogItem | _StreamEnded] = asyncio.Queue(maxsize=READ_AHEAD)

        async def read() -> None:
            try:
                async for reply in stream:
                    if reply.events:  # a batch: its events, in order, into the same batching
                        for event in reply.events:
                            await ready.put(event)
                    else:
                        await ready.put(reply)
            except Exception as exc:  # noqa: BLE001 - handed to the writer, which raises it
                await ready.put(_StreamEnded(exc))
            else:
                await ready.put(_StreamEnded(None))

        reader = asyncio.create_task(read(), name="event-log-reader")
        try:
            while True:
                batch: list[LogItem] = []
                ended: _StreamEnded | None = None
                item = await ready.get()
                if self.linger_s > 0 and ready.qsize() < self.batch_max and not isinstance(item, _StreamEnded):
                    await asyncio.sleep(self.linger_s)
                while True:
                    if isinstance(item, _StreamEnded):
                        ended = item  # the reader's last item: nothing follows it
                        break
                    batch.append(item)
                    if len(batch) >= self.batch_max or ready.empty():
                        break
                    item = ready.get_nowait()
                if batch:
                    await self.handle_batch(batch)
                if ended is not None:
                    if ended.error is not None:
                        raise ended.error
                    return
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader

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
                spb.WatchTasksRequest(
                    all_sessions=True, since_sequence=cursor, event_types=list(EVENT_TYPES), batch=True
                )
            )
            batches = self.batches
            try:
                await stream.wait_for_connection()
                self.connected.set()
                if reported_down:
                    log.info("event_log_reconnected", cursor=cursor)
                    reported_down = False
                await self.follow(stream)
            except grpc.aio.AioRpcError as exc:
                if not reported_down:
                    log.warning("event_log_unreachable", code=exc.code().name, cursor=cursor)
                    reported_down = True
            except Exception:  # noqa: BLE001 - e.g. the database: retry from the stored cursor
                log.exception("event_log_follow_failed", cursor=cursor)
            finally:
                stream.cancel()
            if self.batches != batches:
                delay = 0.2
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
