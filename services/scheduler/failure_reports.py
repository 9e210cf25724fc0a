"""The scheduler's client of the notifier, for start-up's legacy adoption.

A task an older version left ``failed`` ``GATEWAY_SHUTDOWN`` is resumed only if no one
has received its failure report; the notifier owns reports, so it decides and claims the
report in one transaction (``ClaimUnreportedFailure``).
"""

from __future__ import annotations

from libs.grpc_client import ClientSecurity, aio_channel
from services.scheduler.domain import Task
from taskgate.notifier.v1 import notifier_pb2 as pb
from taskgate.notifier.v1 import notifier_pb2_grpc as pb_grpc

RPC_TIMEOUT_S = 5.0


class FailureReportsClient:
    def __init__(self, addr: str, security: ClientSecurity) -> None:
        self._channel = aio_channel(addr, security)
        self._stub = pb_grpc.NotifierServiceStub(self._channel)

    async def claim_unreported_failure(self, task: Task, event_sequence: int) -> bool:
        """True when the failure was never reported and now never will be (raises when the
        notifier cannot be asked: the caller tries again)."""
        reply = await self._stub.ClaimUnreportedFailure(
            pb.ClaimUnreportedFailureRequest(
                agent_id=task.agent_id,
                session_id=task.session_id,
                task_id=task.task_id,
                event_sequence=event_sequence,
            ),
            timeout=RPC_TIMEOUT_S,
        )
        return reply.claimed

    async def close(self) -> None:
        await self._channel.close()
