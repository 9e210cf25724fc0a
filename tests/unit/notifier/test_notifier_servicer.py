"""The notifier's outbox servicer on an in-process gRPC server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from libs.db import Database
from libs.grpc_server import NO_CALLER_AUTH, start_server
from services.notifier.servicer import NotifierServicer
from services.notifier.store import MIGRATIONS, NotifierStore
from taskgate.notifier.v1 import notifier_pb2 as pb
from taskgate.notifier.v1 import notifier_pb2_grpc as pb_grpc


@pytest.fixture
async def stub(tmp_path: Path) -> AsyncIterator[pb_grpc.NotifierServiceStub]:
    db = Database(f"sqlite:///{tmp_path / 'n.db'}", MIGRATIONS)
    db.migrate()
    servicer = NotifierServicer(NotifierStore(db))
    host = await start_server(
        "127.0.0.1:0",
        [lambda s: pb_grpc.add_NotifierServiceServicer_to_server(servicer, s)],
        [],
        security=NO_CALLER_AUTH,
    )
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{host.port}")
    yield pb_grpc.NotifierServiceStub(channel)
    await channel.close()
    await host.server.stop(0)
    db.close()


def note(**kw: object) -> pb.EnqueueNotificationRequest:
    base: dict[str, object] = dict(agent_id="a", session_id="s", kind=pb.NOTIFICATION_KIND_TASK_REPORT, body="done")
    base.update(kw)
    return pb.EnqueueNotificationRequest(**base)  # type: ignore[arg-type]


async def test_enqueue_is_idempotent_per_request_id_and_pages(stub: pb_grpc.NotifierServiceStub) -> None:
    first = (await stub.EnqueueNotification(note(request_id="r1"))).notification
    again = (await stub.EnqueueNotification(note(request_id="r1", body="other"))).notification
    assert again.notification_id == first.notification_id and again.body == "done"
    await stub.EnqueueNotification(note(body="second"))
    page = await stub.ListNotifications(pb.ListNotificationsRequest(agent_id="a", session_id="s", page_size=1))
    assert [n.body for n in page.notifications] == ["done"] and page.next_page_token
    rest = await stub.ListNotifications(
        pb.ListNotificationsRequest(agent_id="a", session_id="s", page_size=1, page_token=page.next_page_token)
    )
    assert [n.body for n in rest.notifications] == ["second"] and not rest.next_page_token


@pytest.mark.parametrize(
    "bad",
    [note(kind=pb.NOTIFICATION_KIND_UNSPECIFIED), note(body="  "), note(agent_id="../x"), note(body="x" * 70000)],
)
async def test_bad_notifications_are_invalid_argument(stub: pb_grpc.NotifierServiceStub, bad: object) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.EnqueueNotification(bad)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_unbuilt_rpcs_say_unimplemented(stub: pb_grpc.NotifierServiceStub) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.ListMessages(pb.ListMessagesRequest(agent_id="a", session_id="s"))
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_unbuilt_streams_say_unimplemented(stub: pb_grpc.NotifierServiceStub) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for _ in stub.StreamActivity(pb.StreamActivityRequest(agent_id="a", session_id="s")):
            pass
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
