"""Domain objects to and from the scheduler's protobuf messages (the only place both meet)."""

from __future__ import annotations

import json

from libs.timestamps import ts
from services.scheduler import domain
from services.scheduler.domain import Attempt, State, Task, ToolEvent
from taskgate.scheduler.v1 import scheduler_pb2 as pb

STATE_TO_PB = {
    State.QUEUED: pb.TASK_STATE_QUEUED,
    State.RUNNING: pb.TASK_STATE_RUNNING,
    State.WAITING_INPUT: pb.TASK_STATE_WAITING_INPUT,
    State.COMPLETED: pb.TASK_STATE_COMPLETED,
    State.FAILED: pb.TASK_STATE_FAILED,
    State.CANCEL_REQUESTED: pb.TASK_STATE_CANCEL_REQUESTED,
    State.CANCELLED: pb.TASK_STATE_CANCELLED,
    State.NEEDS_RECONCILIATION: pb.TASK_STATE_NEEDS_RECONCILIATION,
    State.RECOVERING: pb.TASK_STATE_RECOVERING,
    State.PAUSED: pb.TASK_STATE_PAUSED,
}
TOOL_STATUS_TO_PB = {"returned": pb.TOOL_STATUS_RETURNED, "error": pb.TOOL_STATUS_ERROR}
TOOL_STATUS_FROM_PB = {v: k for k, v in TOOL_STATUS_TO_PB.items()}
EVENT_TYPE_TO_PB = {
    "task.snapshot": pb.TASK_EVENT_TYPE_SNAPSHOT,
    "task.state_changed": pb.TASK_EVENT_TYPE_STATE_CHANGED,
    "task.progress": pb.TASK_EVENT_TYPE_PROGRESS,
    "task.tool": pb.TASK_EVENT_TYPE_TOOL,
    "task.execution": pb.TASK_EVENT_TYPE_EXECUTION,
    "task.question": pb.TASK_EVENT_TYPE_QUESTION,
}


def tool_to_pb(event: ToolEvent) -> pb.ToolEvent:
    msg = pb.ToolEvent(name=event.name, status=TOOL_STATUS_TO_PB[event.status], event_time=ts(event.at))
    if event.exit_code is not None:
        msg.exit_code = event.exit_code
    return msg


def attempt_to_pb(a: Attempt) -> pb.Attempt:
    msg = pb.Attempt(
        attempt_id=a.attempt_id,
        number=a.number,
        start_time=ts(a.started_at),
        end_time=ts(a.ended_at),
        pid=a.pid or 0,
        pgid=a.pgid or 0,
        pid_start_time=a.pid_start_time or 0,
        boot_id=a.boot_id,
        harness=a.harness or "",
        harness_model=a.harness_model or "",
        outcome=a.outcome or "",
        descendants=[pb.ProcessIdentity(pid=d.pid, start_time=d.start_time) for d in a.descendants],
    )
    if a.usage is not None:
        for name in ("input_tokens", "cached_input_tokens", "output_tokens"):
            value = getattr(a.usage, name)
            if value is not None:
                setattr(msg.usage, name, value)
    if a.exit_code is not None:
        msg.exit_code = a.exit_code
    return msg


def task_to_pb(
    task: Task,
    now: int,
    attempts: list[Attempt] | None = None,
    preview_chars: int | None = None,
    tree: domain.TreeView | None = None,
) -> pb.Task:
    """The public snapshot. ``preview_chars`` bounds free text for list entries; ``tree``
    (detail only) adds the sub-tasks and the tree's evidence."""

    def text(value: str) -> str:
        return domain.preview(value, preview_chars) if preview_chars else value

    msg = pb.Task(
        task_id=task.task_id,
        agent_id=task.agent_id,
        session_id=task.session_id,
        title=task.title,
        instructions=text(task.instructions),
        state=STATE_TO_PB[task.state],
        execution_type=pb.EXECUTION_TYPE_GATEWAY_MANAGED if task.gateway_managed else pb.EXECUTION_TYPE_WORKER,
        target_profile=task.profile,
        harness=task.harness or "",
        harness_model=task.harness_model or "",
        workspace=pb.Workspace(mode=task.workspace_mode, path=task.workspace_path),
        observed_paths=task.observed_paths[-20:] if preview_chars else task.observed_paths,
        current_filesystem_verified=False,
        update_time=ts(task.updated_at),
        timing=pb.Timing(
            create_time=ts(task.created_at),
            first_start_time=ts(task.first_started_at),
            start_time=ts(task.started_at),
            end_time=ts(task.ended_at),
            elapsed_ms=task.elapsed_ms(now),
        ),
    )
    if task.progress is not None:
        msg.progress.CopyFrom(pb.Progress(text=text(task.progress.text), update_time=ts(task.progress.updated_at)))
    if task.last_activity_at is not None or task.last_tool is not None:
        activity = msg.activity
        if task.last_activity_at is not None:
            activity.last_activity_time.CopyFrom(ts(task.last_activity_at))
        if task.last_tool is not None:
            activity.last_tool.CopyFrom(tool_to_pb(task.last_tool))
        recent = task.recent_tools[-5:] if preview_chars else task.recent_tools
        activity.recent_tools.extend(tool_to_pb(t) for t in recent)
    if task.execution is not None:
        e = task.execution
        msg.execution.CopyFrom(
            pb.Execution(
                available=e.available,
                reason=e.reason or "",
                observe_time=ts(e.observed_at),
                last_activity_time=ts(e.last_activity_at),
                historical=task.terminal,
                processes=[pb.ProcessIdentity(pid=p.pid, start_time=p.start_time) for p in e.processes],
            )
        )
        for name in (
            "cpu_user_ticks",
            "cpu_system_ticks",
            "io_read_count",
            "io_write_count",
            "io_read_bytes",
            "io_write_bytes",
        ):
            value = getattr(e, name)
            if value is not None:
                setattr(msg.execution, name, value)
    if task.pending_question is not None and not task.terminal:
        q = task.pending_question
        msg.pending_question.CopyFrom(
            pb.PendingQuestion(question_id=q.question_id, text=text(q.text), revision=q.revision)
        )
    msg.version = task.version
    if task.restart_resume is not None:
        r = task.restart_resume
        msg.restart_resume.CopyFrom(
            pb.RestartResume(count=r.count, revision=r.revision, pending=r.pending, last_progress=r.last_progress or "")
        )
    if task.inspection is not None:
        msg.inspection.CopyFrom(pb.Inspection(reason=task.inspection.reason, since_time=ts(task.inspection.since)))
    if task.cancellation is not None:
        c = task.cancellation
        msg.cancellation.CopyFrom(
            pb.Cancellation(
                request_time=ts(c.requested_at),
                cause=c.cause,
                replaced_by_task_id=c.replaced_by_task_id or "",
                cleanup=c.cleanup or "",
            )
        )
    if task.failure is not None:
        f = task.failure
        msg.failure.CopyFrom(pb.Failure(code=f.code, message=f.message, retryable=f.retryable))
        if f.exit_code is not None:
            msg.failure.exit_code = f.exit_code
    if task.result is not None:
        msg.result.CopyFrom(
            pb.Result(text=text(task.result.text), unresolved_background=task.result.unresolved_background)
        )
    if task.gateway_target is not None:
        g = task.gateway_target
        msg.gateway_target.CopyFrom(
            pb.GatewayTarget(
                name=g.name,
                adapter=g.adapter,
                native_session_id=g.native_session_id,
                display_name=g.display_name or "",
                options=g.options,
            )
        )
    if task.gateway_dispatch is not None:
        msg.gateway_dispatch.CopyFrom(
            pb.GatewayDispatch(
                request_id=task.gateway_dispatch.request_id, submit_time=ts(task.gateway_dispatch.submitted_at)
            )
        )
    msg.continue_task_id = task.continue_task_id or ""
    msg.continued_by_task_id = task.continued_by_task_id or ""
    msg.parent_task_id = task.parent_task_id or ""
    if task.skill is not None:
        # Name, arguments, invocation: never the body or a host path (see ``skills``).
        msg.skill.CopyFrom(
            pb.SkillRef(
                name=task.skill.name,
                args_json=json.dumps(task.skill.args, sort_keys=True),
                invocation=task.skill.invocation or "",
            )
        )
    if tree is not None:
        msg.subagents.extend(
            pb.Subagent(
                task_id=c.task_id,
                title=c.title,
                state=STATE_TO_PB[c.state],
                harness=c.harness or "",
                harness_model=c.harness_model or "",
            )
            for c in tree.children
        )
        if tree.evidence is not None:
            ev = tree.evidence
            msg.evidence.CopyFrom(
                pb.Evidence(
                    skills=ev.skills,
                    subagents=ev.subagents,
                    subagent_models=ev.subagent_models,
                    tool_counts=[pb.ToolCount(name=n, count=c) for n, c in ev.tool_counts.items()],
                    observed_paths=ev.observed_paths,
                    current_filesystem_verified=False,
                )
            )
    if attempts:
        msg.attempts.extend(attempt_to_pb(a) for a in attempts)
        latest = attempts[-1]
        msg.harness = latest.harness or ""
        msg.harness_model = latest.harness_model or ""
    return msg


def usage_from_pb(req: pb.ReportUsageRequest) -> domain.Usage:
    """The counters a worker reported (``req.delta`` says whether they add up)."""
    return domain.Usage(
        input_tokens=req.input_tokens if req.HasField("input_tokens") else None,
        cached_input_tokens=req.cached_input_tokens if req.HasField("cached_input_tokens") else None,
        output_tokens=req.output_tokens if req.HasField("output_tokens") else None,
    )


def target_from_pb(req: pb.TargetRequest, safemode_cleared: bool) -> domain.GatewayTarget:
    return domain.GatewayTarget(
        safemode_cleared=safemode_cleared,
        name=req.name,
        adapter="",
        native_session_id=req.native_session_id,
        display_name=req.display_name or None,
        options=dict(req.options),
    )


def host_to_pb(host: domain.HostSummary, now: int, serving_host_id: str) -> pb.SchedulerHost:
    return pb.SchedulerHost(
        host_id=host.host_id,
        boot_id=host.boot_id or "",
        start_time=ts(host.started_at),
        lease_expire_time=ts(host.lease_expires_at),
        lease_live=host.lease_live(now),
        connected=host.connected,
        serving=host.host_id == serving_host_id,
        queued_tasks=host.queued,
        active_tasks=host.active,
        needs_reconciliation_tasks=host.needs_reconciliation,
        host_lost_tasks=host.host_lost,
    )
