"""Domain objects to and from the scheduler's protobuf messages (the only place both meet)."""

from __future__ import annotations

import functools
import json

from libs.timestamps import set_ts, ts
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


def _fill_tool(msg: pb.ToolEvent, event: ToolEvent) -> None:
    msg.name = event.name
    msg.status = TOOL_STATUS_TO_PB[event.status]
    set_ts(msg.event_time, event.at)
    if event.exit_code is not None:
        msg.exit_code = event.exit_code


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
    msg = pb.Task()
    fill_task(msg, task, now, attempts, preview_chars, tree)
    return msg


def _same(value: str) -> str:
    return value


_EXECUTION_COUNTERS = (
    "cpu_user_ticks",
    "cpu_system_ticks",
    "io_read_count",
    "io_write_count",
    "io_read_bytes",
    "io_write_bytes",
)


def fill_task(
    msg: pb.Task,
    task: Task,
    now: int,
    attempts: list[Attempt] | None = None,
    preview_chars: int | None = None,
    tree: domain.TreeView | None = None,
) -> None:
    """``task_to_pb`` written into ``msg`` (an empty Task, e.g. inside a batch of events).

    Sub-messages are filled in place rather than built and copied, and a scalar that is
    empty is not assigned at all (in proto3 an empty string or zero is the field unset);
    a sub-message's presence is kept exactly: one that was set before is set here, also
    when all its fields are empty. The event stream converts a task per event, so this
    is on the scheduler's hot path.
    """
    text = _same if not preview_chars else functools.partial(domain.preview, limit=preview_chars)
    msg.task_id = task.task_id
    msg.agent_id = task.agent_id
    msg.session_id = task.session_id
    msg.title = task.title
    if task.instructions:
        msg.instructions = text(task.instructions)
    msg.state = STATE_TO_PB[task.state]
    msg.execution_type = pb.EXECUTION_TYPE_GATEWAY_MANAGED if task.gateway_managed else pb.EXECUTION_TYPE_WORKER
    msg.target_profile = task.profile
    if task.harness:
        msg.harness = task.harness
    if task.harness_model:
        msg.harness_model = task.harness_model
    workspace = msg.workspace  # always present, also when both parts are empty
    workspace.mode = task.workspace_mode
    workspace.path = task.workspace_path
    if task.observed_paths:
        msg.observed_paths.extend(task.observed_paths[-20:] if preview_chars else task.observed_paths)
    set_ts(msg.update_time, task.updated_at)
    timing = msg.timing
    set_ts(timing.create_time, task.created_at)
    if task.first_started_at is not None:
        set_ts(timing.first_start_time, task.first_started_at)
    if task.started_at is not None:
        set_ts(timing.start_time, task.started_at)
    if task.ended_at is not None:
        set_ts(timing.end_time, task.ended_at)
    elapsed = task.elapsed_ms(now)
    if elapsed:
        timing.elapsed_ms = elapsed
    if task.progress is not None:
        progress = msg.progress
        progress.text = text(task.progress.text)
        set_ts(progress.update_time, task.progress.updated_at)
    if task.last_activity_at is not None or task.last_tool is not None:
        activity = msg.activity
        if task.last_activity_at is not None:
            set_ts(activity.last_activity_time, task.last_activity_at)
        if task.last_tool is not None:
            _fill_tool(activity.last_tool, task.last_tool)
        for tool in task.recent_tools[-5:] if preview_chars else task.recent_tools:
            _fill_tool(activity.recent_tools.add(), tool)
    if task.execution is not None:
        e = task.execution
        execution = msg.execution
        execution.available = e.available  # marks it present, also when false
        if e.reason:
            execution.reason = e.reason
        set_ts(execution.observe_time, e.observed_at)
        if e.last_activity_at is not None:
            set_ts(execution.last_activity_time, e.last_activity_at)
        if task.terminal:
            execution.historical = True
        for name in _EXECUTION_COUNTERS:
            value = getattr(e, name)
            if value is not None:  # optional fields: a zero is a reading, None is none
                setattr(execution, name, value)
        for p in e.processes:
            execution.processes.add(pid=p.pid, start_time=p.start_time)
    if task.pending_question is not None and not task.terminal:
        q = task.pending_question
        question = msg.pending_question
        question.question_id = q.question_id
        question.text = text(q.text)
        question.revision = q.revision
    if task.version:
        msg.version = task.version
    if task.restart_resume is not None:
        r = task.restart_resume
        resume = msg.restart_resume
        resume.count = r.count
        resume.revision = r.revision
        resume.pending = r.pending
        if r.last_progress:
            resume.last_progress = r.last_progress
    if task.inspection is not None:
        inspection = msg.inspection
        inspection.reason = task.inspection.reason
        set_ts(inspection.since_time, task.inspection.since)
    if task.cancellation is not None:
        c = task.cancellation
        cancellation = msg.cancellation
        set_ts(cancellation.request_time, c.requested_at)
        cancellation.cause = c.cause
        if c.replaced_by_task_id:
            cancellation.replaced_by_task_id = c.replaced_by_task_id
        if c.cleanup:
            cancellation.cleanup = c.cleanup
    if task.failure is not None:
        f = task.failure
        failure = msg.failure
        failure.code = f.code
        failure.message = f.message
        if f.retryable:
            failure.retryable = True
        if f.exit_code is not None:
            failure.exit_code = f.exit_code
    if task.result is not None:
        result = msg.result
        result.text = text(task.result.text)  # marks it present, also when empty
        if task.result.unresolved_background:
            result.unresolved_background = True
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
        dispatch = msg.gateway_dispatch
        dispatch.request_id = task.gateway_dispatch.request_id
        if task.gateway_dispatch.submitted_at is not None:
            set_ts(dispatch.submit_time, task.gateway_dispatch.submitted_at)
    if task.continue_task_id:
        msg.continue_task_id = task.continue_task_id
    if task.continued_by_task_id:
        msg.continued_by_task_id = task.continued_by_task_id
    if task.parent_task_id:
        msg.parent_task_id = task.parent_task_id
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


def fill_event(msg: pb.TaskEvent, sequence: int, event_type: str, at: int, task: Task, now: int) -> None:
    """One event of the log into ``msg`` (an entry of a batched WatchTasksResponse)."""
    msg.sequence = sequence
    msg.type = EVENT_TYPE_TO_PB[event_type]
    set_ts(msg.event_time, at)
    fill_task(msg.task, task, now)


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
        resolvable_tasks=host.resolvable,
    )
