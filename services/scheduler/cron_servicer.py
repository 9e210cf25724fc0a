"""gRPC servicer of the scheduler's cron jobs (``CronService``) and its conversions."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable

import grpc

from libs.settings import CronJob
from libs.timestamps import ts
from services.scheduler import cron_domain
from services.scheduler.cron_domain import CronRun
from services.scheduler.crons import CronRunner
from taskgate.scheduler.v1 import crons_pb2 as pb
from taskgate.scheduler.v1 import crons_pb2_grpc as pb_grpc
from taskgate.scheduler.v1 import scheduler_pb2

KIND_TO_PB = {cron_domain.SCHEDULE: pb.CRON_RUN_KIND_SCHEDULE, cron_domain.MANUAL: pb.CRON_RUN_KIND_MANUAL}
OUTCOME_TO_PB = {
    cron_domain.COMPLETED: pb.CRON_RUN_OUTCOME_COMPLETED,
    cron_domain.FAILED: pb.CRON_RUN_OUTCOME_FAILED,
    cron_domain.CANCELLED: pb.CRON_RUN_OUTCOME_CANCELLED,
    cron_domain.TIMED_OUT: pb.CRON_RUN_OUTCOME_TIMED_OUT,
}


def job_to_pb(cron_id: str, job: CronJob, now_ms: int) -> pb.CronJob:
    msg = pb.CronJob(
        cron_id=cron_id,
        schedule=job.schedule,
        agent_id=job.agent,
        session_id=job.session,
        title=job.title,
        profile=job.profile,
        timeout_ms=job.timeout_ms,
        enabled=job.enabled,
    )
    if job.enabled:
        msg.next_run_time.CopyFrom(ts(cron_domain.next_tick(job.schedule, now_ms)))
    return msg


def run_to_pb(run: CronRun) -> pb.CronRun:
    msg = pb.CronRun(
        run_id=run.run_id,
        cron_id=run.cron_id,
        kind=KIND_TO_PB.get(run.kind, pb.CRON_RUN_KIND_UNSPECIFIED),
        start_time=ts(run.started_at),
        deadline_time=ts(run.deadline_at),
        outcome=OUTCOME_TO_PB.get(run.outcome or "", pb.CRON_RUN_OUTCOME_UNSPECIFIED),
        task_ids=list(run.task_ids),
    )
    if run.scheduled_for is not None:
        msg.scheduled_time.CopyFrom(ts(run.scheduled_for))
    if run.ended_at is not None:
        msg.end_time.CopyFrom(ts(run.ended_at))
    if run.failure is not None:
        f = run.failure
        msg.failure.CopyFrom(scheduler_pb2.Failure(code=f.code, message=f.message, retryable=f.retryable))
        if f.exit_code is not None:
            msg.failure.exit_code = f.exit_code
    return msg


def _agents(agent_ids: Iterable[str], all_agents: bool) -> set[str] | None:
    """Whose jobs the caller may see: None for every job."""
    return None if all_agents else set(agent_ids)


class CronServicer(pb_grpc.CronServiceServicer):
    def __init__(self, crons: CronRunner) -> None:
        self.crons = crons

    def _now(self) -> int:
        return self.crons.rt.clock.now_ms()

    async def ListCrons(self, request: pb.ListCronsRequest, context: grpc.aio.ServicerContext) -> pb.ListCronsResponse:
        now = self._now()
        jobs = self.crons.list_jobs(_agents(request.agent_ids, request.all_agents))
        return pb.ListCronsResponse(crons=[job_to_pb(cron_id, job, now) for cron_id, job in jobs])

    async def ListCronRuns(
        self, request: pb.ListCronRunsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListCronRunsResponse:
        job, page, pages, total, runs = await self.crons.list_runs(
            request.cron_id, _agents(request.agent_ids, request.all_agents), request.page, request.page_size
        )
        return pb.ListCronRunsResponse(
            cron=job_to_pb(request.cron_id, job, self._now()),
            page=page,
            pages=pages,
            total=total,
            runs=[run_to_pb(r) for r in runs],
        )

    async def RunCron(
        self, request: pb.RunCronRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.RunCronResponse]:
        job = self.crons.job(request.cron_id, _agents(request.agent_ids, request.all_agents))
        run = await self.crons.run_now(request.cron_id)
        yield pb.RunCronResponse(run=run_to_pb(run), cron=job_to_pb(request.cron_id, job, self._now()))
        # Bounded by the job's timeout (the run itself ends timed_out then); a little
        # slack for the pass that records it.
        wait_s = (run.deadline_at - self._now()) / 1000 + 2 * self.crons.poll_s + 1.0
        final = await self.crons.wait_for_end(run.run_id, max(0.0, wait_s))
        yield pb.RunCronResponse(run=run_to_pb(final or run))
