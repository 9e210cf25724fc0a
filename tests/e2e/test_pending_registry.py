"""The pending registry as a real process: answers and snapshots survive SIGKILL and restart.

Each scenario runs on SQLite (the default under TASKGATE_DATA_DIR) and on a
throwaway PostgreSQL cluster (skipped, with the reason, when PostgreSQL is not
installed). The store itself is also exercised in-process on both backends.
"""

from __future__ import annotations

import asyncio
import random
import signal
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import grpc
import pytest

from libs.grpc_client import error_info
from services.pending_registry.domain import AnswerAttempt, EntryKind, NewAsk, NewQuestion, PickFilter
from services.pending_registry.registry import PendingRegistry
from taskgate.pending.v1 import pending_pb2 as pb
from taskgate.pending.v1 import pending_pb2_grpc as pb_grpc
from tests.support.postgres import fresh_database
from tests.support.procs import ServiceProcess, free_port
from tests.support.procs import channel as service_channel

pytestmark = pytest.mark.e2e
R = TypeVar("R")

RPC_TIMEOUT = 10.0


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """ "" for the default SQLite file under the data dir, else a fresh PostgreSQL database
    (``postgres_url`` comes from tests/conftest.py)."""
    if request.param == "sqlite":
        return ""
    cluster: str = request.getfixturevalue("postgres_url")
    return fresh_database(cluster, "pending")


class Registry:
    """One registry process on a fixed port, restartable on the same data."""

    def __init__(self, tmp_path: Path, db_url: str) -> None:
        self.addr = f"127.0.0.1:{free_port()}"
        env = {"TASKGATE_PENDING_ADDR": self.addr, "TASKGATE_DATA_DIR": str(tmp_path / "data")}
        if db_url:
            env["TASKGATE_PENDING_DB_URL"] = db_url
        self.proc = ServiceProcess("services.pending_registry", env, tmp_path / "pending.log", self.addr)
        self.channel = service_channel(self.addr, env)
        self.stub = pb_grpc.PendingRegistryServiceStub(self.channel)

    def start(self) -> Registry:
        self.proc.start()
        return self

    def kill(self) -> None:
        assert self.proc.proc is not None
        self.proc.proc.send_signal(signal.SIGKILL)
        self.proc.proc.wait(timeout=10)

    def close(self) -> None:
        self.channel.close()
        self.proc.kill()


@pytest.fixture
def registry(tmp_path: Path, db_url: str) -> Iterator[Registry]:
    reg = Registry(tmp_path, db_url).start()
    try:
        yield reg
    finally:
        reg.close()


def call(method: Callable[..., R], request: object) -> R:
    # wait_for_ready: ride out the reconnect after a restart instead of failing fast.
    return method(request, timeout=RPC_TIMEOUT, wait_for_ready=True)


def reason(exc: grpc.RpcError) -> str:
    info = error_info(exc)
    return info.reason if info else ""


def wait_for(check: Callable[[], bool], what: str, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_answers_survive_sigkill_and_restart(registry: Registry) -> None:
    stub = registry.stub
    task, waiting_task = uuid.uuid4().hex, uuid.uuid4().hex
    answered = call(stub.AskQuestion, pb.AskQuestionRequest(task_id=task, session_id="chat-1", text="branch?"))
    q = answered.question
    call(
        stub.AnswerQuestion,
        pb.AnswerQuestionRequest(task_id=task, question_id=q.question_id, answer="main", answered_by="alice"),
    )
    # A worker blocked on another question while the registry dies.
    open_q = call(
        stub.AskQuestion, pb.AskQuestionRequest(task_id=waiting_task, session_id="tg-1", text="deploy?")
    ).question
    blocked = stub.AwaitAnswer.future(pb.AwaitAnswerRequest(question_id=open_q.question_id), timeout=30)
    call(stub.GetQuestion, pb.GetQuestionRequest(question_id=open_q.question_id))
    assert not blocked.done()

    registry.kill()
    with pytest.raises(grpc.RpcError) as exc:
        blocked.result(timeout=RPC_TIMEOUT)
    assert exc.value.code() == grpc.StatusCode.UNAVAILABLE
    registry.start()

    # The stored answer is there for a caller that just calls again.
    got = call(stub.AwaitAnswer, pb.AwaitAnswerRequest(question_id=q.question_id)).question
    assert (got.state, got.answer, got.answered_by) == (pb.QUESTION_STATE_ANSWERED, "main", "alice")
    again = call(stub.AnswerQuestion, pb.AnswerQuestionRequest(task_id=task, question_id=q.question_id, answer="main"))
    assert again.replayed
    with pytest.raises(grpc.RpcError) as exc:
        call(stub.AnswerQuestion, pb.AnswerQuestionRequest(task_id=task, question_id=q.question_id, answer="dev"))
    assert exc.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert reason(exc.value) == "QUESTION_ALREADY_ANSWERED"

    # The worker that was waiting reconnects, waits again, and gets the answer given after the restart.
    rewait = stub.AwaitAnswer.future(
        pb.AwaitAnswerRequest(question_id=open_q.question_id), timeout=30, wait_for_ready=True
    )
    still_open = call(stub.GetQuestion, pb.GetQuestionRequest(question_id=open_q.question_id)).question
    assert still_open.state == pb.QUESTION_STATE_OPEN and still_open.revision == 1
    call(
        stub.AnswerQuestion,
        pb.AnswerQuestionRequest(task_id=waiting_task, question_id=open_q.question_id, answer="yes"),
    )
    assert rewait.result(timeout=RPC_TIMEOUT).question.answer == "yes"
    # Revisions continue across the restart.
    nxt = call(stub.AskQuestion, pb.AskQuestionRequest(task_id=waiting_task, session_id="tg-1", text="next?"))
    assert nxt.question.revision == 2


def test_pending_snapshot_survives_restart(registry: Registry) -> None:
    stub = registry.stub
    tools = [
        pb.ToolResult(tool_call_id="c1", name="read", arguments="€" * 400, output="ü" * 3000),
        pb.ToolResult(tool_call_id="c2", name="ls", arguments="{}", output="README.md"),
    ]
    producer = stub.Ask.future(
        pb.AskRequest(
            session_id="tg-chat7",
            agent_id="agent-1",
            kind=pb.ENTRY_KIND_ASK,
            payload="which environment?",
            tool_results=tools,
        ),
        timeout=60,
        wait_for_ready=True,
    )

    snapshots: list[pb.PendingSnapshot] = []

    def snapshot_written() -> bool:
        try:
            snapshots.append(
                stub.GetSessionTask(
                    pb.GetSessionTaskRequest(agent_id="agent-1", session_id="tg-chat7"), timeout=5
                ).snapshot
            )
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.NOT_FOUND
        return bool(snapshots)

    wait_for(snapshot_written, "the pending snapshot")
    before = snapshots[-1]
    registry.kill()
    with pytest.raises(grpc.RpcError):
        producer.result(timeout=RPC_TIMEOUT)
    registry.start()

    after = call(stub.GetSessionTask, pb.GetSessionTaskRequest(agent_id="agent-1", session_id="tg-chat7")).snapshot
    assert after == before
    assert after.payload == "which environment?" and after.origin == "tg-"
    big, small = after.tool_results
    assert big.arguments == "€" * 341 and big.arguments_truncated  # 1023 bytes: a 4th byte would split
    assert big.output == "ü" * 2048 and big.output_truncated
    assert small.output == "README.md" and not small.output_truncated
    # The entry itself died with its producer's call: nobody can claim it now.
    assert not call(stub.PickNext, pb.PickNextRequest(prefix="", picker="late")).HasField("entry")
    # Pausing keeps the snapshot; only the user's cancel deletes it.
    assert not call(stub.CancelSession, pb.CancelSessionRequest(session_id="tg-chat7", cause="paused")).deleted
    assert call(stub.CancelSession, pb.CancelSessionRequest(session_id="tg-chat7", cause="user_canceled")).deleted
    with pytest.raises(grpc.RpcError) as exc:
        call(stub.GetSessionTask, pb.GetSessionTaskRequest(agent_id="agent-1", session_id="tg-chat7"))
    assert exc.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_sigterm_releases_blocked_callers_and_exits(registry: Registry) -> None:
    stub = registry.stub
    producer = stub.Ask.future(
        pb.AskRequest(session_id="cli-1", kind=pb.ENTRY_KIND_CONFIRM, payload="ok?"), timeout=60, wait_for_ready=True
    )
    wait_for(lambda: _has_entry(registry), "the entry")
    started = time.monotonic()
    assert registry.proc.stop(signal.SIGTERM, timeout_s=15) == 0
    with pytest.raises(grpc.RpcError) as exc:
        producer.result(timeout=RPC_TIMEOUT)
    assert exc.value.code() == grpc.StatusCode.UNAVAILABLE and reason(exc.value) == "REGISTRY_SHUTTING_DOWN"
    assert time.monotonic() - started < 5  # not held for the grace period


def _has_entry(registry: Registry) -> bool:
    stream = registry.stub.Listen(pb.ListenRequest(prefix="cli-"), timeout=5)
    try:
        first = next(stream)
        return first.type == pb.LISTEN_EVENT_TYPE_AVAILABLE
    finally:
        stream.cancel()


# --- the store on both backends, in-process ------------------------------------------


def test_store_under_concurrency(db_url: str, tmp_path: Path) -> None:
    url = db_url or f"sqlite:///{tmp_path}/pending.db"
    asyncio.run(_store_under_concurrency(url))


async def _store_under_concurrency(url: str) -> None:
    registry = PendingRegistry.open(url)
    await asyncio.to_thread(registry.db.migrate)
    assert await asyncio.to_thread(registry.db.migrate) == []  # idempotent
    await registry.start()
    entries, questions = registry.entries, registry.questions
    try:
        # Many producers, many pickers: one claimer per entry; every answer reaches its producer.
        producers = [
            asyncio.ensure_future(
                entries.ask(NewAsk(f"{['tg-', 'dc-', 'chat-'][i % 3]}s{i}", EntryKind.ASK, str(i), agent_id="agent-1"))
            )
            for i in range(90)
        ]
        deadline = time.monotonic() + 20
        while entries.live_count < 90:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        claims: dict[str, list[str]] = defaultdict(list)

        async def picker(name: str, prefix: str) -> None:
            while (entry := await entries.pick(name, PickFilter(prefix))) is not None:
                claims[entry.entry_id].append(name)
                entries.reply(entry.entry_id, name, picker=name)

        await asyncio.wait_for(
            asyncio.gather(*(picker(f"p{i}", ["", "tg-", "dc-", "chat-"][i % 4]) for i in range(16))), 30
        )
        answers = await asyncio.wait_for(asyncio.gather(*producers), 30)
        assert len(claims) == 90 and all(len(v) == 1 for v in claims.values())
        assert all(claims[entry_id] == [name] for entry_id, name in answers)
        assert await registry.store.count_entries() == 0

        # Concurrent questions of one task: distinct, consecutive revisions, one left open.
        task = uuid.uuid4().hex
        asked = await asyncio.gather(*(questions.ask(NewQuestion(task, "tg-1", f"q{i}")) for i in range(12)))
        assert sorted(q.revision for q in asked) == list(range(1, 13))
        states = [(await questions.get(q.question_id)).state.value for q in asked]
        assert states.count("open") == 1 and states.count("replaced") == 11
        latest = max(asked, key=lambda q: q.revision)

        # Concurrent different answers: exactly one is stored, the rest are denied or replays.
        rng = random.Random(3)
        outcomes = await asyncio.gather(
            *(
                questions.answer(AnswerAttempt(task, latest.question_id, f"a{rng.randrange(3)}", None))
                for _ in range(15)
            ),
            return_exceptions=True,
        )
        stored = (await questions.get(latest.question_id)).answer
        fresh = [o for o in outcomes if isinstance(o, tuple) and not o[1]]
        assert len(fresh) == 1 and fresh[0][0].answer == stored
        for o in outcomes:
            if isinstance(o, BaseException):
                assert getattr(o, "reason", "") == "QUESTION_ALREADY_ANSWERED"
            else:
                assert o[0].answer == stored
    finally:
        await registry.stop()
        registry.db.close()
