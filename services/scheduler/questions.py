"""The scheduler's client of the pending-registry, for task questions.

The registry owns questions and answers; the scheduler only relays a worker's
question (with the task and session it knows from the worker token) and waits
for the answer on the worker's behalf.
"""

from __future__ import annotations

import grpc
from google.protobuf.duration_pb2 import Duration

from libs import errors
from libs.grpc_client import ClientSecurity, aio_channel, error_info
from taskgate.pending.v1 import pending_pb2 as pb
from taskgate.pending.v1 import pending_pb2_grpc as pb_grpc

RPC_TIMEOUT_S = 10.0


class RegistryUnavailable(errors.Unavailable):
    pass


class QuestionClosed(errors.FailedPrecondition):
    pass


def _relay(exc: grpc.aio.AioRpcError) -> errors.DomainError:
    """Map a registry failure to the error the worker sees (UNAVAILABLE is retried by the SDK)."""
    info = error_info(exc)
    reason = info.reason if info else exc.code().name
    if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED):
        return RegistryUnavailable("PENDING_REGISTRY_UNAVAILABLE", "the pending-registry is unavailable; retry")
    if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
        return errors.InvalidArgument(reason, exc.details() or reason)
    return QuestionClosed(reason, exc.details() or reason)


class QuestionsClient:
    def __init__(self, addr: str, security: ClientSecurity) -> None:
        self._channel = aio_channel(addr, security)
        self._stub = pb_grpc.PendingRegistryServiceStub(self._channel)

    async def ask(self, task_id: str, session_id: str, text: str, request_id: str) -> pb.Question:
        try:
            reply = await self._stub.AskQuestion(
                pb.AskQuestionRequest(task_id=task_id, session_id=session_id, text=text, request_id=request_id),
                timeout=RPC_TIMEOUT_S,
            )
        except grpc.aio.AioRpcError as exc:
            raise _relay(exc) from exc
        return reply.question

    async def await_answer(self, question_id: str, wait_s: float) -> pb.Question | None:
        """The question once answered (or closed); None when ``wait_s`` passed first."""
        try:
            reply = await self._stub.AwaitAnswer(pb.AwaitAnswerRequest(question_id=question_id), timeout=wait_s)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                return None
            raise _relay(exc) from exc
        return reply.question

    async def cancel_open(self, task_id: str) -> None:
        """Close the task's open questions; raises when the registry did not confirm (the
        scheduler's question-close outbox tries again)."""
        try:
            await self._stub.CancelQuestions(pb.CancelQuestionsRequest(task_id=task_id), timeout=RPC_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            raise _relay(exc) from exc

    async def close(self) -> None:
        await self._channel.close()


def max_wait_s(duration: Duration, default_s: float = 25.0, limit_s: float = 60.0) -> float:
    seconds = duration.ToMilliseconds() / 1000 if duration.ByteSize() else default_s
    return min(max(seconds, 0.1), limit_s)
