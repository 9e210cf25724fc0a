"""Scheduler protobuf snapshots to the REST JSON shape (camelCase; absent fields omitted)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from taskgate.scheduler.v1 import scheduler_pb2 as pb

STATE_NAMES = {
    value: name.removeprefix("TASK_STATE_").lower()
    for name, value in pb.TaskState.items()
    if value != pb.TASK_STATE_UNSPECIFIED
}
TOOL_STATUS_NAMES = {pb.TOOL_STATUS_RETURNED: "returned", pb.TOOL_STATUS_ERROR: "error"}
EXECUTION_TYPES = {pb.EXECUTION_TYPE_WORKER: "worker", pb.EXECUTION_TYPE_GATEWAY_MANAGED: "gateway-managed"}
TERMINAL_STATES = {"completed", "failed", "cancelled"}


def iso(stamp: Timestamp) -> str | None:
    if stamp.seconds == 0 and stamp.nanos == 0:
        return None
    moment = datetime.fromtimestamp(stamp.ToMilliseconds() / 1000, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _prune(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def tool_json(t: pb.ToolEvent) -> dict[str, Any]:
    return _prune(
        {
            "name": t.name,
            "status": TOOL_STATUS_NAMES.get(t.status),
            "at": iso(t.event_time),
            "exitCode": t.exit_code if t.HasField("exit_code") else None,
        }
    )


def attempt_json(a: pb.Attempt) -> dict[str, Any]:
    usage = None
    if a.HasField("usage"):
        usage = (
            _prune(
                {
                    "inputTokens": a.usage.input_tokens if a.usage.HasField("input_tokens") else None,
                    "cachedInputTokens": a.usage.cached_input_tokens
                    if a.usage.HasField("cached_input_tokens")
                    else None,
                    "outputTokens": a.usage.output_tokens if a.usage.HasField("output_tokens") else None,
                }
            )
            or None
        )
    return _prune(
        {
            "attemptId": a.attempt_id,
            "number": a.number,
            "startedAt": iso(a.start_time),
            "endedAt": iso(a.end_time),
            "pid": a.pid or None,
            "pgid": a.pgid or None,
            "pidStartTime": a.pid_start_time or None,
            "bootId": a.boot_id,
            "harness": a.harness or None,
            "harnessModel": a.harness_model or None,
            "usage": usage,
            "exitCode": a.exit_code if a.HasField("exit_code") else None,
            "outcome": a.outcome or None,
            "descendants": [{"pid": d.pid, "startTime": d.start_time} for d in a.descendants] or None,
        }
    )


def execution_json(e: pb.Execution) -> dict[str, Any]:
    return _prune(
        {
            "available": e.available,
            "reason": e.reason or None,
            "observedAt": iso(e.observe_time),
            "lastActivityAt": iso(e.last_activity_time),
            "historical": True if e.historical else None,
            "cpu": {"userTicks": e.cpu_user_ticks, "systemTicks": e.cpu_system_ticks},
            "io": {
                "readCount": e.io_read_count,
                "writeCount": e.io_write_count,
                "readBytes": e.io_read_bytes,
                "writeBytes": e.io_write_bytes,
            },
            "processes": [{"pid": p.pid, "startTime": p.start_time} for p in e.processes],
        }
    )


def task_json(t: pb.Task) -> dict[str, Any]:
    out: dict[str, Any] = {
        "taskId": t.task_id,
        "agentId": t.agent_id,
        "sessionId": t.session_id,
        "title": t.title,
        "instructions": t.instructions,
        "state": STATE_NAMES.get(t.state, "unknown"),
        "executionType": EXECUTION_TYPES.get(t.execution_type, "worker"),
        "targetProfile": t.target_profile,
    }
    if t.HasField("progress"):
        out["progress"] = {"text": t.progress.text, "updatedAt": iso(t.progress.update_time)}
    if t.HasField("activity"):
        out["activity"] = _prune(
            {
                "lastActivityAt": iso(t.activity.last_activity_time),
                "lastTool": tool_json(t.activity.last_tool) if t.activity.HasField("last_tool") else None,
                "recentTools": [tool_json(x) for x in t.activity.recent_tools],
            }
        )
    if t.HasField("execution"):
        out["execution"] = execution_json(t.execution)
    if t.HasField("inspection"):
        out["inspection"] = {"reason": t.inspection.reason, "since": iso(t.inspection.since_time)}
    out["timing"] = _prune(
        {
            "createdAt": iso(t.timing.create_time),
            "firstStartedAt": iso(t.timing.first_start_time),
            "startedAt": iso(t.timing.start_time),
            "endedAt": iso(t.timing.end_time),
            "elapsedMs": t.timing.elapsed_ms,
        }
    )
    if t.HasField("cancellation"):
        c = t.cancellation
        out["cancellation"] = _prune(
            {
                "requestedAt": iso(c.request_time),
                "cause": c.cause,
                "replacedByTaskId": c.replaced_by_task_id or None,
                "cleanup": c.cleanup or None,
            }
        )
    if t.HasField("failure"):
        f = t.failure
        out["failure"] = _prune(
            {
                "code": f.code,
                "message": f.message,
                "retryable": f.retryable,
                "exitCode": f.exit_code if f.HasField("exit_code") else None,
            }
        )
    if t.HasField("result"):
        out["result"] = _prune(
            {
                "text": t.result.text,
                "unresolvedBackground": True if t.result.unresolved_background else None,
            }
        )
    if t.HasField("pending_question"):
        q = t.pending_question
        out["pendingQuestion"] = {"questionId": q.question_id, "text": q.text, "revision": q.revision}
    if t.HasField("restart_resume"):
        r = t.restart_resume
        out["restartResume"] = _prune(
            {
                "count": r.count,
                "revision": r.revision,
                "pending": r.pending,
                "lastProgress": r.last_progress or None,
            }
        )
    if t.harness:
        out["harness"] = t.harness
    if t.harness_model:
        out["harnessModel"] = t.harness_model
    out["workspace"] = {"mode": t.workspace.mode, "path": t.workspace.path}
    out["observedPaths"] = list(t.observed_paths)
    out["currentFilesystemVerified"] = False
    out["attempts"] = [attempt_json(a) for a in t.attempts]
    out["updatedAt"] = iso(t.update_time)
    if t.HasField("gateway_target"):
        g = t.gateway_target
        out["gatewayTarget"] = _prune(
            {
                "adapter": g.adapter,
                "nativeSessionId": g.native_session_id,
                "displayName": g.display_name or None,
                "options": dict(g.options),
            }
        )
    if t.HasField("gateway_dispatch"):
        out["gatewayDispatch"] = _prune(
            {"requestId": t.gateway_dispatch.request_id, "submittedAt": iso(t.gateway_dispatch.submit_time)}
        )
    for key, value in (
        ("continueTaskId", t.continue_task_id),
        ("continuedByTaskId", t.continued_by_task_id),
        ("parentTaskId", t.parent_task_id),
    ):
        if value:
            out[key] = value
    if t.HasField("skill"):
        out["skill"] = _prune(
            {
                "name": t.skill.name,
                "args": _json_object(t.skill.args_json),
                "invocation": t.skill.invocation or None,
            }
        )
    if t.subagents:
        out["subagents"] = [
            _prune(
                {
                    "taskId": c.task_id,
                    "title": c.title,
                    "state": STATE_NAMES.get(c.state, "unknown"),
                    "harness": c.harness or None,
                    "harnessModel": c.harness_model or None,
                }
            )
            for c in t.subagents
        ]
    if t.HasField("evidence"):
        e = t.evidence
        out["evidence"] = {
            "skills": list(e.skills),
            "subagents": list(e.subagents),
            "subagentModels": list(e.subagent_models),
            "toolCounts": [{"name": c.name, "count": c.count} for c in e.tool_counts],
            "observedPaths": list(e.observed_paths),
            "currentFilesystemVerified": False,
        }
    out["version"] = t.version
    return out


# A task-stream event's progress text is a summary; the full text is in GET .../tasks/{taskId}.
SLIM_PROGRESS_CHARS = 200


def slim_task_json(t: pb.Task) -> dict[str, Any]:
    """A task-stream event's snapshot: what a list or a badge shows, without instructions,
    result, attempts or telemetry (the client GETs the task for its detail)."""
    out: dict[str, Any] = {"taskId": t.task_id, "title": t.title, "state": STATE_NAMES.get(t.state, "unknown")}
    if t.HasField("progress"):
        text = t.progress.text
        if len(text) > SLIM_PROGRESS_CHARS:
            text = text[: SLIM_PROGRESS_CHARS - 1] + "…"
        out["progress"] = {"text": text, "updatedAt": iso(t.progress.update_time)}
    if t.HasField("pending_question"):
        out["pendingQuestion"] = {"questionId": t.pending_question.question_id, "revision": t.pending_question.revision}
    if t.HasField("failure"):
        out["failure"] = {"code": t.failure.code}
    # New input (an answer, a resume after a pause) starts a new revision; the first is 1.
    out["revision"] = t.restart_resume.revision if t.HasField("restart_resume") and t.restart_resume.revision else 1
    out["version"] = t.version  # raised by every committed change: a client re-reads the detail when it moves
    out["updatedAt"] = iso(t.update_time)
    return out
