"""gRPC servicer of the pending registry: translate requests, call the domain services, translate back."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from libs.grpc_server import Registrar
from services.pending_registry import convert, domain
from services.pending_registry.domain import AnswerAttempt, NewAsk, NewQuestion, PickFilter
from services.pending_registry.entries import PendingEntries
from services.pending_registry.questions import Questions
from taskgate.pending.v1 import pending_pb2 as pb
from taskgate.pending.v1 import pending_pb2_grpc as pb_grpc

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["PendingRegistryService"].full_name


class PendingRegistryServicer(pb_grpc.PendingRegistryServiceServicer):
    def __init__(self, entries: PendingEntries, questions: Questions) -> None:
        self.entries = entries
        self.questions = questions

    # --- pending entries ----------------------------------------------------

    async def Ask(self, request: pb.AskRequest, context: grpc.aio.ServicerContext) -> pb.AskResponse:
        ask = NewAsk(
            session_id=request.session_id,
            kind=convert.kind_from_pb(request.kind),
            payload=request.payload,
            tool_results=convert.tool_results_from_pb(request.tool_results),
            agent_id=request.agent_id,
        )
        entry_id, answer = await self.entries.ask(ask)
        return pb.AskResponse(entry_id=entry_id, answer=answer)

    async def Listen(
        self, request: pb.ListenRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ListenResponse]:
        async for event in self.entries.listen(request.prefix, request.listener_name):
            yield convert.event_to_pb(event)

    async def PickNext(self, request: pb.PickNextRequest, context: grpc.aio.ServicerContext) -> pb.PickNextResponse:
        entry = await self.entries.pick(
            request.picker, PickFilter(prefix=request.prefix), convert.wait_from_pb(request.max_wait)
        )
        return pb.PickNextResponse(entry=convert.entry_to_pb(entry) if entry else None)

    async def PickNextMatch(
        self, request: pb.PickNextMatchRequest, context: grpc.aio.ServicerContext
    ) -> pb.PickNextMatchResponse:
        kinds = convert.kinds_from_pb(request.kinds)
        if kinds is None:
            raise domain.InvalidArgument("INVALID_KIND", "kinds must be confirm, ask or secret", field="kinds")
        wanted = PickFilter(prefix=request.prefix, kinds=kinds, session_id=request.session_id or None)
        entry = await self.entries.pick(request.picker, wanted, convert.wait_from_pb(request.max_wait))
        return pb.PickNextMatchResponse(entry=convert.entry_to_pb(entry) if entry else None)

    async def Reply(self, request: pb.ReplyRequest, context: grpc.aio.ServicerContext) -> pb.ReplyResponse:
        self.entries.reply(request.entry_id, request.answer, request.picker or None)
        return pb.ReplyResponse()

    async def HasListener(
        self, request: pb.HasListenerRequest, context: grpc.aio.ServicerContext
    ) -> pb.HasListenerResponse:
        found = self.entries.has_listener(origin=request.origin or None, session_id=request.session_id or None)
        return pb.HasListenerResponse(has_listener=found)

    async def CancelSession(
        self, request: pb.CancelSessionRequest, context: grpc.aio.ServicerContext
    ) -> pb.CancelSessionResponse:
        deleted, canceled = await self.entries.cancel_session(
            request.session_id, request.cause, agent_id=request.agent_id or None
        )
        return pb.CancelSessionResponse(deleted=deleted, canceled_entries=canceled)

    async def GetSessionTask(
        self, request: pb.GetSessionTaskRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetSessionTaskResponse:
        snapshot = await self.entries.session_task(request.agent_id, request.session_id)
        return pb.GetSessionTaskResponse(snapshot=convert.snapshot_to_pb(snapshot))

    # --- task questions -----------------------------------------------------

    async def AskQuestion(
        self, request: pb.AskQuestionRequest, context: grpc.aio.ServicerContext
    ) -> pb.AskQuestionResponse:
        question = await self.questions.ask(
            NewQuestion(
                task_id=request.task_id,
                session_id=request.session_id,
                text=request.text,
                request_id=request.request_id or None,
            )
        )
        return pb.AskQuestionResponse(question=convert.question_to_pb(question))

    async def GetQuestion(
        self, request: pb.GetQuestionRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetQuestionResponse:
        question = await self.questions.get(request.question_id)
        return pb.GetQuestionResponse(question=convert.question_to_pb(question))

    async def AnswerQuestion(
        self, request: pb.AnswerQuestionRequest, context: grpc.aio.ServicerContext
    ) -> pb.AnswerQuestionResponse:
        question, replayed = await self.questions.answer(
            AnswerAttempt(
                task_id=request.task_id,
                question_id=request.question_id,
                answer=request.answer,
                answered_by=request.answered_by or None,
            )
        )
        return pb.AnswerQuestionResponse(question=convert.question_to_pb(question), replayed=replayed)

    async def AwaitAnswer(
        self, request: pb.AwaitAnswerRequest, context: grpc.aio.ServicerContext
    ) -> pb.AwaitAnswerResponse:
        question = await self.questions.await_answer(request.question_id)
        return pb.AwaitAnswerResponse(question=convert.question_to_pb(question))

    async def CancelQuestions(
        self, request: pb.CancelQuestionsRequest, context: grpc.aio.ServicerContext
    ) -> pb.CancelQuestionsResponse:
        cancelled = await self.questions.cancel_task(request.task_id)
        return pb.CancelQuestionsResponse(questions=[convert.question_to_pb(q) for q in cancelled])


def registrar(servicer: PendingRegistryServicer) -> Registrar:
    def register(server: grpc.aio.Server) -> None:
        pb_grpc.add_PendingRegistryServiceServicer_to_server(servicer, server)

    return register
