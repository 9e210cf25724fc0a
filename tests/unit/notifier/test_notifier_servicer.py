"""The notifier servicer on an in-process gRPC server, with its real store (SQLite)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from libs.db import Database
from libs.grpc_server import NO_CALLER_AUTH, start_server
from services.notifier.activity import ActivityHub
from services.notifier.domain import SessionTask
from services.notifier.scheduler_link import EventLogFollower
from services.notifier.servicer import NotifierServicer
from services.notifier.store import MIGRATIONS, NotifierStore
from taskgate.notifier.v1 import notifier_pb2 as pb
from taskgate.notifier.v1 import notifier_pb2_grpc as pb_grpc
from taskgate.scheduler.v1 import scheduler_pb2 as spb


@dataclass
class Harness:
    stub: pb_grpc.NotifierServiceStub
    servicer: NotifierServicer
    store: NotifierStore
    tasks: list[SessionTask]


@pytest.fixture
async def h(tmp_path: Path) -> AsyncIterator[Harness]:
    db = Database(f"sqlite:///{tmp_path / 'n.db'}", MIGRATIONS)
    db.migrate()
    store = NotifierStore(db, retention_frames=5)
    tasks: list[SessionTask] = []

    async def session_tasks(agent_id: str, session_id: str) -> list[SessionTask]:
        return tasks

    servicer = NotifierServicer(store, ActivityHub(), session_tasks=session_tasks)
    host = await start_server(
        "127.0.0.1:0",
        [lambda s: pb_grpc.add_NotifierServiceServicer_to_server(servicer, s)],
        [],
        security=NO_CALLER_AUTH,
    )
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{host.port}")
    yield Harness(pb_grpc.NotifierServiceStub(channel), servicer, store, tasks)
    await channel.close()
    await host.server.stop(0)
    db.close()


def publish(response_id: str, text: str, final: bool = False) -> pb.PublishResponseRequest:
    return pb.PublishResponseRequest(
        agent_id="a", session_id="s", snapshot=pb.ResponseSnapshot(response_id=response_id, text=text, final=final)
    )


async def take(stream: grpc.aio.UnaryStreamCall, n: int) -> list[pb.StreamActivityResponse]:
    out: list[pb.StreamActivityResponse] = []
    async for item in stream:
        out.append(item)
        if len(out) == n:
            break
    return out


async def test_in_progress_responses_are_replayed_then_snapshots_replace(h: Harness) -> None:
    await h.stub.PublishResponse(publish("r1", "Hel"))
    await h.stub.PublishResponse(publish("r1", "Hello"))
    await h.stub.PublishResponse(publish("done", "old", final=True))
    stream = h.stub.StreamActivity(pb.StreamActivityRequest(agent_id="a", session_id="s"), timeout=10)
    (first,) = await take(stream, 1)
    assert first.snapshot.text == "Hello" and not first.snapshot.final  # only the current in-progress one
    later = asyncio.ensure_future(take(stream, 1))
    await h.stub.PublishResponse(publish("r1", "Hello world", final=True))
    (second,) = await asyncio.wait_for(later, 10)
    assert second.snapshot.final and second.snapshot.text == "Hello world" and second.sequence > first.sequence
    stream.cancel()
    history = await h.stub.ListMessages(pb.ListMessagesRequest(agent_id="a", session_id="s"))
    assert [(m.response_id, m.text, m.role) for m in history.messages] == [
        ("done", "old", "assistant"),
        ("r1", "Hello world", "assistant"),
    ]
    assert history.messages[1].complete_time.ToMilliseconds() >= history.messages[1].create_time.ToMilliseconds()


async def test_publish_after_final_is_response_final(h: Harness) -> None:
    await h.stub.PublishResponse(publish("r1", "x", final=True))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await h.stub.PublishResponse(publish("r1", "y"))
    assert err.value.code() == grpc.StatusCode.ABORTED and "final" in (err.value.details() or "")


async def test_resume_after_a_sequence_and_a_stale_one(h: Harness) -> None:
    seqs = []
    for i in range(3):
        await h.stub.PublishResponse(publish("r1", f"t{i}"))
    stream = h.stub.StreamActivity(pb.StreamActivityRequest(agent_id="a", session_id="s"), timeout=10)
    (now,) = await take(stream, 1)
    stream.cancel()
    seqs.append(now.sequence)
    await h.stub.PublishResponse(publish("r2", "other"))
    await h.stub.PublishResponse(publish("r1", "t3"))
    # Resume from the frame before "t2": every later frame, in order.
    stream = h.stub.StreamActivity(
        pb.StreamActivityRequest(agent_id="a", session_id="s", after_sequence=now.sequence - 1), timeout=10
    )
    frames = await take(stream, 3)
    stream.cancel()
    assert [f.snapshot.text for f in frames] == ["t2", "other", "t3"]
    # Only 5 frames are retained per conversation here: the first frame is gone, so the current snapshots come.
    for i in range(4, 8):
        await h.stub.PublishResponse(publish("r1", f"t{i}"))
    stream = h.stub.StreamActivity(pb.StreamActivityRequest(agent_id="a", session_id="s", after_sequence=1), timeout=10)
    frames = await take(stream, 2)
    stream.cancel()
    assert sorted(f.snapshot.text for f in frames) == ["other", "t7"]


async def test_enqueue_once_per_key_listed_with_state_and_history(h: Harness) -> None:
    note = pb.EnqueueNotificationRequest(
        agent_id="a", session_id="s", kind=pb.NOTIFICATION_KIND_REMINDER, text="hi", request_id="k1"
    )
    first = (await h.stub.EnqueueNotification(note)).notification
    again = (await h.stub.EnqueueNotification(note)).notification
    assert first.notification_id == again.notification_id
    # Without a channel the conversation itself is the delivery.
    assert first.state == pb.NOTIFICATION_STATE_DELIVERED
    page = await h.stub.ListNotifications(
        pb.ListNotificationsRequest(agent_id="a", session_id="s", state=pb.NOTIFICATION_STATE_DELIVERED)
    )
    assert page.total == 1 and page.pages == 1
    pending = await h.stub.ListNotifications(
        pb.ListNotificationsRequest(agent_id="a", session_id="s", state=pb.NOTIFICATION_STATE_PENDING)
    )
    assert pending.total == 0
    history = await h.stub.ListMessages(pb.ListMessagesRequest(agent_id="a", session_id="s"))
    assert [(m.role, m.notification_id) for m in history.messages] == [("notification", first.notification_id)]


@pytest.mark.parametrize(
    "bad",
    [
        pb.EnqueueNotificationRequest(agent_id="a", session_id="s", text="x"),
        pb.EnqueueNotificationRequest(agent_id="a", session_id="s", kind=1, text="  "),
        pb.EnqueueNotificationRequest(agent_id="../x", session_id="s", kind=1, text="x"),
        pb.EnqueueNotificationRequest(agent_id="a", session_id="s", kind=1, text="x" * 70000),
    ],
)
async def test_bad_notifications_are_invalid_argument(h: Harness, bad: pb.EnqueueNotificationRequest) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await h.stub.EnqueueNotification(bad)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def task_event(sequence: int, state: int, task_id: str = "t1") -> spb.WatchTasksResponse:
    return spb.WatchTasksResponse(
        sequence=sequence,
        type=spb.TASK_EVENT_TYPE_STATE_CHANGED,
        task=spb.Task(task_id=task_id, agent_id="a", session_id="s", title="Build", state=state),
    )


async def test_replayed_task_events_notify_once_and_move_the_cursor(h: Harness) -> None:
    follower = EventLogFollower(None, h.servicer, h.store)  # type: ignore[arg-type]
    assert await follower.handle(task_event(3, spb.TASK_STATE_RUNNING)) is None
    first = await follower.handle(task_event(4, spb.TASK_STATE_COMPLETED))
    again = await follower.handle(task_event(4, spb.TASK_STATE_COMPLETED))
    assert first is not None and again is not None and first.notification_id == again.notification_id
    assert await h.store.cursor("scheduler.task_events") == 4
    page = await h.stub.ListNotifications(pb.ListNotificationsRequest(agent_id="a", session_id="s"))
    assert [n.kind for n in page.notifications] == [pb.NOTIFICATION_KIND_TASK_COMPLETED]


async def report(h: Harness) -> str:
    follower = EventLogFollower(None, h.servicer, h.store)  # type: ignore[arg-type]
    n = await follower.handle(task_event(1, spb.TASK_STATE_COMPLETED))
    assert n is not None
    return n.notification_id


def reply(notification_id: str, follow_up: int) -> pb.ReplyToNotificationRequest:
    return pb.ReplyToNotificationRequest(
        agent_id="a", session_id="s", notification_id=notification_id, text="I'll keep going", follow_up=follow_up
    )


async def test_continues_without_work_records_an_unbacked_promise(h: Harness) -> None:
    nid = await report(h)
    answer = await h.stub.ReplyToNotification(reply(nid, pb.FOLLOW_UP_CONTINUES))
    assert answer.unbacked_promise and answer.message.text == "I'll keep going"
    events = await h.stub.ListConversationEvents(pb.ListConversationEventsRequest(agent_id="a", session_id="s"))
    assert [e.kind for e in events.events] == ["response.unbacked_promise"]
    assert events.events[0].data["notificationId"] == nid


async def test_continues_with_a_running_task_or_asks_user_records_nothing(h: Harness) -> None:
    nid = await report(h)
    assert not (await h.stub.ReplyToNotification(reply(nid, pb.FOLLOW_UP_ASKS_USER))).unbacked_promise
    h.tasks.append(SessionTask("running", 0))
    assert not (await h.stub.ReplyToNotification(reply(nid, pb.FOLLOW_UP_CONTINUES))).unbacked_promise
    events = await h.stub.ListConversationEvents(pb.ListConversationEventsRequest(agent_id="a", session_id="s"))
    assert events.total == 0


async def test_stop_keeps_the_update_for_the_next_user_turn(h: Harness) -> None:
    h.servicer.channel_of = lambda _agent: "hook"
    note = pb.EnqueueNotificationRequest(agent_id="a", session_id="s", kind=pb.NOTIFICATION_KIND_REMINDER, text="hi")
    n = (await h.stub.EnqueueNotification(note)).notification
    assert n.state == pb.NOTIFICATION_STATE_PENDING and n.next_attempt_time.seconds > 0
    stopped = await h.stub.StopNotification(
        pb.StopNotificationRequest(agent_id="a", session_id="s", notification_id=n.notification_id)
    )
    assert stopped.notification.state == pb.NOTIFICATION_STATE_STOPPED
    assert not stopped.notification.HasField("next_attempt_time")
    turn = await h.stub.CreateMessage(pb.CreateMessageRequest(agent_id="a", session_id="s", text="what's new?"))
    assert [u.notification_id for u in turn.pending_updates] == [n.notification_id]
    turn = await h.stub.CreateMessage(pb.CreateMessageRequest(agent_id="a", session_id="s", text="and now?"))
    assert list(turn.pending_updates) == []
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await h.stub.StopNotification(
            pb.StopNotificationRequest(agent_id="a", session_id="other", notification_id=n.notification_id)
        )
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_live_only_streams_mark_readiness_and_replay_is_a_call(h: Harness) -> None:
    await h.stub.PublishResponse(publish("r1", "open"))
    stream = h.stub.StreamActivity(pb.StreamActivityRequest(agent_id="a", session_id="s", live_only=True), timeout=10)
    (marker,) = await take(stream, 1)
    assert marker.sequence == 0 and not marker.HasField("snapshot") and not marker.HasField("notification")
    later = asyncio.ensure_future(take(stream, 1))
    await h.stub.PublishResponse(publish("r1", "open, more"))
    (live,) = await asyncio.wait_for(later, 10)
    assert live.snapshot.text == "open, more"
    stream.cancel()
    replay = await h.stub.ReplayActivity(pb.ReplayActivityRequest(agent_id="a", session_id="s"))
    assert [f.snapshot.text for f in replay.frames] == ["open, more"] and not replay.resumed
    resumed = await h.stub.ReplayActivity(
        pb.ReplayActivityRequest(agent_id="a", session_id="s", after_sequence=live.sequence - 1)
    )
    assert [f.sequence for f in resumed.frames] == [live.sequence] and resumed.resumed


# --- questions and reminders --------------------------------------------------------

QID, QID2 = "1" * 32, "2" * 32


def question_event(sequence: int, question_id: str, task_id: str = "t1") -> spb.WatchTasksResponse:
    return spb.WatchTasksResponse(
        sequence=sequence,
        type=spb.TASK_EVENT_TYPE_QUESTION,
        task=spb.Task(
            task_id=task_id,
            agent_id="a",
            session_id="s",
            title="Build",
            state=spb.TASK_STATE_WAITING_INPUT,
            pending_question=spb.PendingQuestion(question_id=question_id, text="Which DB?", revision=1),
        ),
    )


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def now_ms(self) -> int:
        return self.now


async def say(h: Harness, n: int) -> list[pb.Notification]:
    """n user messages; the reminders they made, from the notification list."""
    for _ in range(n):
        await h.stub.CreateMessage(pb.CreateMessageRequest(agent_id="a", session_id="s", text="hi"))
    page = await h.stub.ListNotifications(pb.ListNotificationsRequest(agent_id="a", session_id="s", page_size=100))
    return [n for n in page.notifications if n.kind == pb.NOTIFICATION_KIND_REMINDER]


async def test_reminders_follow_messages_and_cooldowns_and_mute_survives_a_restart(h: Harness, tmp_path: Path) -> None:
    clock = FakeClock()
    h.servicer.clock = clock
    h.servicer.reminder_base_ms = 1000
    follower = EventLogFollower(None, h.servicer, h.store)  # type: ignore[arg-type]
    asked = await follower.handle(question_event(1, QID))
    assert asked is not None and f"/task_question {QID} answer" in asked.text
    assert await say(h, 3) == []  # three messages, cooldown not yet passed
    clock.now += 1000
    reminders = await say(h, 1)
    assert len(reminders) == 1 and reminders[0].question_id == QID and "Reminder (1)" in reminders[0].text
    # The second needs 3 more messages and 3x the base.
    clock.now += 2999
    assert len(await say(h, 3)) == 1
    clock.now += 1
    assert len(await say(h, 1)) == 2
    # Mute; a new store on the same database (a restart) keeps it.
    await h.stub.MuteQuestion(pb.MuteQuestionRequest(agent_id="a", session_id="s", question_id=QID))
    h.servicer.store = NotifierStore(Database(f"sqlite:///{tmp_path / 'n.db'}", MIGRATIONS), retention_frames=5)
    clock.now += 100_000
    assert len(await say(h, 5)) == 2


async def test_snooze_defers_and_answered_or_replaced_questions_never_remind(h: Harness) -> None:
    clock = FakeClock()
    h.servicer.clock = clock
    h.servicer.reminder_base_ms = 1000
    h.servicer.snooze_ms = 50_000
    follower = EventLogFollower(None, h.servicer, h.store)  # type: ignore[arg-type]
    await follower.handle(question_event(1, QID))
    snoozed = await h.stub.SnoozeQuestion(pb.SnoozeQuestionRequest(agent_id="a", session_id="s", question_id=QID))
    assert snoozed.question.snooze_until_time.ToMilliseconds() == clock.now + 50_000
    clock.now += 49_999
    assert await say(h, 4) == []
    clock.now += 1
    assert len(await say(h, 1)) == 1
    # A new question of the task replaces the old one, and says so.
    replacing = await follower.handle(question_event(2, QID2))
    assert replacing is not None and f"replaces question {QID}" in replacing.text
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await h.stub.MuteQuestion(pb.MuteQuestionRequest(agent_id="a", session_id="s", question_id=QID))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    # Answered: the task runs again; no reminder however many messages.
    await follower.handle(task_event(3, spb.TASK_STATE_RUNNING))
    clock.now += 10_000_000
    assert len(await say(h, 6)) == 1
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await h.stub.SnoozeQuestion(pb.SnoozeQuestionRequest(agent_id="a", session_id="other", question_id=QID2))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await h.stub.SnoozeQuestion(pb.SnoozeQuestionRequest(agent_id="a", session_id="s", question_id="nope"))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
