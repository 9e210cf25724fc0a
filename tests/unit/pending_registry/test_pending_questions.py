"""Task questions over a real grpc.aio channel: every answer case, waiting, cancelling."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable

import grpc
import pytest

from taskgate.pending.v1 import pending_pb2 as pb

from .harness import Harness, eventually, reason

OPEN = pb.QUESTION_STATE_OPEN
ANSWERED = pb.QUESTION_STATE_ANSWERED


def new_task() -> str:
    return uuid.uuid4().hex


async def ask_q(h: Harness, task_id: str, text: str = "which branch?", request_id: str = "") -> pb.Question:
    reply = await h.stub.AskQuestion(
        pb.AskQuestionRequest(task_id=task_id, session_id="chat-s1", text=text, request_id=request_id), timeout=5
    )
    return reply.question


async def answer(h: Harness, task_id: str, question_id: str, text: str, by: str = "alice") -> pb.AnswerQuestionResponse:
    return await h.stub.AnswerQuestion(  # type: ignore[no-any-return]
        pb.AnswerQuestionRequest(task_id=task_id, question_id=question_id, answer=text, answered_by=by), timeout=5
    )


async def answer_error(h: Harness, task_id: str, question_id: str, text: str) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await answer(h, task_id, question_id, text)
    return exc.value


async def test_current_question_is_answered_and_stored(harness: Harness) -> None:
    task = new_task()
    q = await ask_q(harness, task)
    assert q.state == OPEN and q.revision == 1 and len(q.question_id) == 32 and q.task_id == task
    assert q.session_id == "chat-s1" and q.text == "which branch?"

    reply = await answer(harness, task, q.question_id, "main")
    assert not reply.replayed
    assert reply.question.state == ANSWERED and reply.question.answer == "main"
    assert reply.question.answered_by == "alice" and reply.question.HasField("answer_time")
    stored = await harness.stub.GetQuestion(pb.GetQuestionRequest(question_id=q.question_id))
    assert stored.question == reply.question


async def test_same_answer_again_is_idempotent(harness: Harness) -> None:
    task = new_task()
    q = await ask_q(harness, task)
    first = await answer(harness, task, q.question_id, "main", by="alice")
    again = await answer(harness, task, q.question_id, "main", by="bob")
    assert again.replayed and again.question == first.question  # answered_by stays alice


async def test_different_answer_to_answered_question_is_denied(harness: Harness) -> None:
    task = new_task()
    q = await ask_q(harness, task)
    await answer(harness, task, q.question_id, "main")
    exc = await answer_error(harness, task, q.question_id, "develop")
    assert exc.code() == grpc.StatusCode.PERMISSION_DENIED and reason(exc) == "QUESTION_ALREADY_ANSWERED"
    stored = await harness.stub.GetQuestion(pb.GetQuestionRequest(question_id=q.question_id))
    assert stored.question.answer == "main"


async def test_new_question_replaces_the_open_one(harness: Harness) -> None:
    task = new_task()
    first = await ask_q(harness, task, "one?")
    waiter = harness.stub.AwaitAnswer(pb.AwaitAnswerRequest(question_id=first.question_id), timeout=10)
    await eventually(_has_waiters(harness, 1), what="the waiter")
    second = await ask_q(harness, task, "two?")
    assert second.revision == 2 and second.state == OPEN
    woken = await waiter  # the old question's waiter learns it was replaced
    assert woken.question.state == pb.QUESTION_STATE_REPLACED and woken.question.HasField("close_time")

    exc = await answer_error(harness, task, first.question_id, "x")
    assert exc.code() == grpc.StatusCode.PERMISSION_DENIED and reason(exc) == "QUESTION_STALE"
    assert not (await answer(harness, task, second.question_id, "y")).replayed
    third = await ask_q(harness, task, "three?")
    assert third.revision == 3


def _has_waiters(h: Harness, n: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return h.registry.questions.waiter_count == n

    return check


async def test_question_of_another_task_is_denied(harness: Harness) -> None:
    task, other = new_task(), new_task()
    q = await ask_q(harness, task)
    await ask_q(harness, other)
    exc = await answer_error(harness, other, q.question_id, "main")
    assert exc.code() == grpc.StatusCode.PERMISSION_DENIED and reason(exc) == "QUESTION_STALE"


async def test_cancelled_question_is_stale_and_wakes_waiters(harness: Harness) -> None:
    task = new_task()
    q = await ask_q(harness, task)
    waiter = harness.stub.AwaitAnswer(pb.AwaitAnswerRequest(question_id=q.question_id), timeout=10)
    await eventually(_has_waiters(harness, 1), what="the waiter")
    cancelled = await harness.stub.CancelQuestions(pb.CancelQuestionsRequest(task_id=task))
    assert [c.question_id for c in cancelled.questions] == [q.question_id]
    assert (await waiter).question.state == pb.QUESTION_STATE_CANCELLED
    exc = await answer_error(harness, task, q.question_id, "main")
    assert exc.code() == grpc.StatusCode.PERMISSION_DENIED and reason(exc) == "QUESTION_STALE"
    again = await harness.stub.CancelQuestions(pb.CancelQuestionsRequest(task_id=task))
    assert list(again.questions) == []


@pytest.mark.parametrize(
    ("task_id", "question_id", "text", "expected"),
    [
        ("TASK", "QID", "", "ANSWER_EMPTY"),
        ("TASK", "QID", "   ", "ANSWER_EMPTY"),
        ("TASK", "QID", "x" * (64 * 1024 + 1), "ANSWER_TOO_LARGE"),
        ("TASK", "not-a-question-id", "x", "INVALID_ID"),
        ("TASK", "", "x", "INVALID_ID"),
        ("../etc", "QID", "x", "INVALID_ID"),
        ("", "QID", "x", "INVALID_ID"),
    ],
)
async def test_invalid_answers(harness: Harness, task_id: str, question_id: str, text: str, expected: str) -> None:
    task = new_task()
    q = await ask_q(harness, task)
    exc = await answer_error(
        harness, task if task_id == "TASK" else task_id, q.question_id if question_id == "QID" else question_id, text
    )
    assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT and reason(exc) == expected
    assert (await harness.stub.GetQuestion(pb.GetQuestionRequest(question_id=q.question_id))).question.state == OPEN


async def test_unknown_question_is_not_found(harness: Harness) -> None:
    task = new_task()
    missing = uuid.uuid4().hex
    exc = await answer_error(harness, task, missing, "main")
    assert exc.code() == grpc.StatusCode.NOT_FOUND and reason(exc) == "QUESTION_NOT_FOUND"
    for call in (
        harness.stub.GetQuestion(pb.GetQuestionRequest(question_id=missing)),
        harness.stub.AwaitAnswer(pb.AwaitAnswerRequest(question_id=missing), timeout=5),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert harness.registry.questions.waiter_count == 0


async def test_await_answer_blocks_until_answered_and_returns_at_once_after(harness: Harness) -> None:
    task = new_task()
    q = await ask_q(harness, task)
    waiters = [harness.stub.AwaitAnswer(pb.AwaitAnswerRequest(question_id=q.question_id), timeout=10) for _ in range(3)]
    await eventually(_has_waiters(harness, 3), what="three waiters")
    assert not any(w.done() for w in waiters)
    await answer(harness, task, q.question_id, "go")
    for woken in await asyncio.gather(*waiters):
        assert woken.question.state == ANSWERED and woken.question.answer == "go"
    later = await harness.stub.AwaitAnswer(pb.AwaitAnswerRequest(question_id=q.question_id), timeout=5)
    assert later.question.answer == "go"
    assert harness.registry.questions.waiter_count == 0


async def test_cancelled_await_leaves_no_waiter(harness: Harness) -> None:
    q = await ask_q(harness, new_task())
    call = harness.stub.AwaitAnswer(pb.AwaitAnswerRequest(question_id=q.question_id))
    await eventually(_has_waiters(harness, 1), what="the waiter")
    call.cancel()
    await eventually(_has_waiters(harness, 0), what="the waiter to go")


async def test_ask_question_is_idempotent_with_request_id(harness: Harness) -> None:
    task = new_task()
    first = await ask_q(harness, task, "q?", request_id="req-1")
    again = await ask_q(harness, task, "q?", request_id="req-1")
    assert again == first
    other = await ask_q(harness, task, "q2?", request_id="req-2")
    assert other.revision == 2


async def test_concurrent_answers_store_exactly_one(harness: Harness) -> None:
    task = new_task()
    q = await ask_q(harness, task)
    results = await asyncio.gather(
        *(answer(harness, task, q.question_id, f"answer-{i % 4}") for i in range(24)), return_exceptions=True
    )
    stored = (await harness.stub.GetQuestion(pb.GetQuestionRequest(question_id=q.question_id))).question.answer
    ok = [r for r in results if isinstance(r, pb.AnswerQuestionResponse)]
    denied = [r for r in results if isinstance(r, grpc.aio.AioRpcError)]
    assert len(ok) + len(denied) == 24
    assert all(r.question.answer == stored for r in ok)
    assert sum(1 for r in ok if not r.replayed) == 1
    assert all(reason(e) == "QUESTION_ALREADY_ANSWERED" for e in denied) and len(denied) == 18


async def test_ask_question_validation(harness: Harness) -> None:
    for request in (
        pb.AskQuestionRequest(task_id="x", session_id="chat-1", text="q"),
        pb.AskQuestionRequest(task_id=new_task(), session_id="bad id", text="q"),
        pb.AskQuestionRequest(task_id=new_task(), session_id="chat-1", text=""),
        pb.AskQuestionRequest(task_id=new_task(), session_id="chat-1", text="x" * (64 * 1024 + 1)),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await harness.stub.AskQuestion(request)
        assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_stop_wakes_waiters_with_unavailable(harness: Harness) -> None:
    q = await ask_q(harness, new_task())
    call = harness.stub.AwaitAnswer(pb.AwaitAnswerRequest(question_id=q.question_id), timeout=10)
    await eventually(_has_waiters(harness, 1), what="the waiter")
    await harness.registry.stop()
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await call
    assert exc.value.code() == grpc.StatusCode.UNAVAILABLE and reason(exc.value) == "REGISTRY_SHUTTING_DOWN"
