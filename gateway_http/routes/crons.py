"""Cron endpoints: /api/v1/crons, a job's run history, and a manual run that waits for its outcome.

``POST /api/v1/crons/{cronId}/run`` answers only once the run has ended (its task
finished, or the job's ``timeout_ms`` passed: ``timed_out``); a queue acknowledgement
is not a result. When the scheduler's answer is lost after the run may have started
(the connection drops), the answer is ``CRON_OUTCOME_UNKNOWN`` with ``retryable:
false``: read the job's run history before running it again. The caller's key is
checked again while it waits: revoked (or its access to the agent removed), the wait
ends with 401 ``TICKET_REVOKED`` — the run itself goes on and lands in the history.
"""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any, Literal

import grpc
from fastapi import APIRouter, Path, Request, Security
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials
from pydantic import BaseModel, ConfigDict

from gateway_http.auth import BEARER, KeyDep
from gateway_http.backends import Backends, request_metadata
from gateway_http.convert import iso
from gateway_http.errors import ApiError, responses
from gateway_http.schemas import ID_REGEX, PageQuery, PageSizeQuery
from gateway_http.store import GatewayStore
from libs.log import get_logger
from libs.settings import Settings
from taskgate.scheduler.v1 import crons_pb2 as pb

log = get_logger("gateway_http.crons")
router = APIRouter(prefix="/api/v1/crons", tags=["crons"], responses=responses(400, 401, 403, 404, 500, 503, 504))

CronIdPath = Annotated[str, Path(pattern=ID_REGEX, max_length=128, description="the cron job's id")]
# How often a waiting manual run checks that its key is still valid.
TICKET_CHECK_S = 0.5
# Past the run's own deadline, how long the gateway still waits for the scheduler's final word.
DEADLINE_SLACK_S = 30.0
CRON_OUTCOME_UNKNOWN = "CRON_OUTCOME_UNKNOWN"
# Transport failures: the request may or may not have reached the scheduler and acted.
LOST = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.DEADLINE_EXCEEDED,
    }
)

KINDS = {pb.CRON_RUN_KIND_SCHEDULE: "schedule", pb.CRON_RUN_KIND_MANUAL: "manual"}
OUTCOMES = {
    pb.CRON_RUN_OUTCOME_UNSPECIFIED: "running",
    pb.CRON_RUN_OUTCOME_COMPLETED: "completed",
    pb.CRON_RUN_OUTCOME_FAILED: "failed",
    pb.CRON_RUN_OUTCOME_CANCELLED: "cancelled",
    pb.CRON_RUN_OUTCOME_TIMED_OUT: "timed_out",
}


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CronFailure(_Closed):
    code: str
    message: str
    retryable: bool
    exitCode: int | None = None


class CronJob(_Closed):
    cronId: str
    schedule: str
    agentId: str
    sessionId: str
    title: str
    profile: str | None = None
    timeoutMs: int
    enabled: bool
    nextRunAt: str | None = None


class CronRun(_Closed):
    runId: str | None = None  # absent only when the answer was lost before the run was known
    cronId: str
    kind: Literal["schedule", "manual"]
    scheduledFor: str | None = None
    startedAt: str | None = None
    deadlineAt: str | None = None
    endedAt: str | None = None
    outcome: Literal["running", "completed", "failed", "cancelled", "timed_out", "CRON_OUTCOME_UNKNOWN"]
    taskIds: list[str]
    failure: CronFailure | None = None


class CronList(_Closed):
    crons: list[CronJob]


class CronRunPage(_Closed):
    cron: CronJob
    page: int
    pages: int
    total: int
    runs: list[CronRun]


class CronRunEnvelope(_Closed):
    run: CronRun


def _prune(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def job_json(j: pb.CronJob) -> dict[str, Any]:
    return _prune(
        {
            "cronId": j.cron_id,
            "schedule": j.schedule,
            "agentId": j.agent_id,
            "sessionId": j.session_id,
            "title": j.title,
            "profile": j.profile or None,
            "timeoutMs": j.timeout_ms,
            "enabled": j.enabled,
            "nextRunAt": iso(j.next_run_time),
        }
    )


def run_json(r: pb.CronRun) -> dict[str, Any]:
    out = _prune(
        {
            "runId": r.run_id,
            "cronId": r.cron_id,
            "kind": KINDS.get(r.kind, "manual"),
            "scheduledFor": iso(r.scheduled_time),
            "startedAt": iso(r.start_time),
            "deadlineAt": iso(r.deadline_time),
            "endedAt": iso(r.end_time),
            "outcome": OUTCOMES.get(r.outcome, "running"),
            "taskIds": list(r.task_ids),
        }
    )
    if r.HasField("failure"):
        f = r.failure
        out["failure"] = _prune(
            {
                "code": f.code,
                "message": f.message,
                "retryable": f.retryable,
                "exitCode": f.exit_code if f.HasField("exit_code") else None,
            }
        )
    return out


def unknown_json(cron_id: str, started: pb.CronRun | None, why: str) -> dict[str, Any]:
    """The run as far as the gateway knows it, with the outcome nobody can vouch for."""
    out: dict[str, Any] = (
        run_json(started) if started is not None else {"cronId": cron_id, "kind": "manual", "taskIds": []}
    )
    out["outcome"] = CRON_OUTCOME_UNKNOWN
    out.pop("endedAt", None)
    out["failure"] = {
        "code": CRON_OUTCOME_UNKNOWN,
        "message": f"{why}; the run may have started or finished: read GET /api/v1/crons/{cron_id}/runs "
        "before running it again",
        "retryable": False,
    }
    return out


def _backends(request: Request) -> Backends:
    return request.app.state.backends  # type: ignore[no-any-return]


@router.get("", response_model=CronList)
async def list_crons(request: Request, key: KeyDep) -> JSONResponse:
    """The cron jobs of the key's agents."""
    backends = _backends(request)
    reply = await backends.crons.ListCrons(
        pb.ListCronsRequest(agent_ids=key.agents), timeout=backends.timeout_s, metadata=request_metadata(request)
    )
    return JSONResponse({"crons": [job_json(j) for j in reply.crons]})


@router.get("/{cronId}/runs", response_model=CronRunPage)
async def list_runs(
    request: Request, cronId: CronIdPath, key: KeyDep, page: PageQuery = 0, page_size: PageSizeQuery = 10
) -> JSONResponse:
    """A job's run history, newest first."""
    backends = _backends(request)
    reply = await backends.crons.ListCronRuns(
        pb.ListCronRunsRequest(cron_id=cronId, agent_ids=key.agents, page=page, page_size=page_size),
        timeout=backends.timeout_s,
        metadata=request_metadata(request),
    )
    return JSONResponse(
        {
            "cron": job_json(reply.cron),
            "page": reply.page,
            "pages": reply.pages,
            "total": reply.total,
            "runs": [run_json(r) for r in reply.runs],
        }
    )


async def _still_valid(store: GatewayStore, secret: str, agent_id: str) -> bool:
    key = await store.authenticate(secret)
    return key is not None and agent_id in key.agents


async def _next(call: Any) -> pb.RunCronResponse | None:
    message = await call.read()
    return None if message is grpc.aio.EOF else message  # type: ignore[no-any-return]


@router.post("/{cronId}/run", response_model=CronRunEnvelope, responses=responses(409))
async def run_cron(
    request: Request,
    cronId: CronIdPath,
    key: KeyDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Security(BEARER)],
) -> JSONResponse:
    """Run the job now and answer with the run once it has ended (completed, failed,
    cancelled, timed_out) — or CRON_OUTCOME_UNKNOWN when the answer was lost."""
    backends = _backends(request)
    settings: Settings = request.app.state.settings
    job = settings.crons.get(cronId)
    if job is not None and job.agent in key.agents and not settings.agent(job.agent).orchestration_enabled:
        raise ApiError(409, "ORCHESTRATION_DISABLED", "orchestration is disabled for the job's agent")
    store: GatewayStore = request.app.state.store
    secret = credentials.credentials.strip() if credentials is not None else ""
    channel = backends.channels["scheduler"]
    try:
        # Nothing is sent before the link is up: a scheduler out of reach is a plain 503.
        async with asyncio.timeout(backends.timeout_s):
            await channel.channel_ready()
    except TimeoutError:
        raise ApiError(503, "UNAVAILABLE", "the scheduler is unavailable; nothing was started") from None
    call = backends.crons.RunCron(
        pb.RunCronRequest(cron_id=cronId, agent_ids=key.agents), metadata=request_metadata(request)
    )
    started: pb.CronRun | None = None
    try:
        try:
            async with asyncio.timeout(backends.timeout_s):
                first = await _next(call)
        except TimeoutError:
            return _unknown(cronId, None, "the scheduler did not confirm the run in time")
        if first is None:
            return _unknown(cronId, None, "the scheduler closed the call without an answer")
        started = first.run
        return await _await_end(call, started, first.cron.agent_id, store, secret)
    except grpc.aio.AioRpcError as exc:
        if exc.code() not in LOST:
            raise  # the scheduler refused it (unknown job, no access): nothing started
        log.warning("cron_outcome_unknown", cron_id=cronId, code=exc.code().name, run_id=started and started.run_id)
        return _unknown(cronId, started, f"the scheduler's answer was lost ({exc.code().name})")
    finally:
        call.cancel()  # ends only our wait: the run goes on in the scheduler


def _unknown(cron_id: str, started: pb.CronRun | None, why: str) -> JSONResponse:
    return JSONResponse({"run": unknown_json(cron_id, started, why)})


async def _await_end(call: Any, started: pb.CronRun, agent_id: str, store: GatewayStore, secret: str) -> JSONResponse:
    loop = asyncio.get_running_loop()
    left_s = started.deadline_time.ToMilliseconds() / 1000 - time.time()
    deadline = loop.time() + max(0.0, left_s) + DEADLINE_SLACK_S
    reading = asyncio.ensure_future(_next(call))
    try:
        while True:
            done, _ = await asyncio.wait({reading}, timeout=TICKET_CHECK_S)
            if done:
                final = reading.result()
                if final is None:
                    return _unknown(started.cron_id, started, "the scheduler closed the call before the run ended")
                return JSONResponse({"run": run_json(final.run)})
            if not await _still_valid(store, secret, agent_id):
                log.info("cron_wait_revoked", cron_id=started.cron_id, run_id=started.run_id)
                raise ApiError(
                    401,
                    "TICKET_REVOKED",
                    f"the API key was revoked while waiting; run {started.run_id} goes on: "
                    f"read GET /api/v1/crons/{started.cron_id}/runs",
                )
            if loop.time() > deadline:
                return _unknown(started.cron_id, started, "the scheduler did not report the run's end in time")
    finally:
        reading.cancel()
