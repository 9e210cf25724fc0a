"""The in-place task conversion (``convert.fill_task``) says exactly what the plain one said.

``reference_task_to_pb`` is the conversion as it was before it was made cheaper (built
with constructors, ``Timestamp.FromMilliseconds`` and ``CopyFrom``), kept here verbatim as
the oracle: for every task shape below, both give the same bytes, so every field's value
and every sub-message's presence (an empty but present sub-message is on the wire) agree.
"""

from __future__ import annotations

import json

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from libs.timestamps import MAX_MS, MIN_MS, set_ts, ts
from services.scheduler import convert, domain
from services.scheduler.convert import STATE_TO_PB, attempt_to_pb
from services.scheduler.domain import State, Task, ToolEvent
from taskgate.scheduler.v1 import scheduler_pb2 as pb


def old_ts(ms: int | None) -> Timestamp | None:
    if ms is None:
        return None
    stamp = Timestamp()
    stamp.FromMilliseconds(ms)
    return stamp


def old_tool_to_pb(event: ToolEvent) -> pb.ToolEvent:
    msg = pb.ToolEvent(name=event.name, status=convert.TOOL_STATUS_TO_PB[event.status], event_time=old_ts(event.at))
    if event.exit_code is not None:
        msg.exit_code = event.exit_code
    return msg


def reference_task_to_pb(  # noqa: C901 - a verbatim copy of the old conversion
    task: Task,
    now: int,
    attempts: list[domain.Attempt] | None = None,
    preview_chars: int | None = None,
    tree: domain.TreeView | None = None,
) -> pb.Task:
    def text(value: str) -> str:
        return domain.preview(value, preview_chars) if preview_chars else value

    ts = old_ts
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
            activity.last_tool.CopyFrom(old_tool_to_pb(task.last_tool))
        recent = task.recent_tools[-5:] if preview_chars else task.recent_tools
        activity.recent_tools.extend(old_tool_to_pb(t) for t in recent)
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


T0 = 1_764_540_000_123


def base(**fields: object) -> Task:
    values: dict[str, object] = {
        "task_id": "01JTASK0000000000000000000",
        "agent_id": "agent-1",
        "session_id": "cli-1",
        "title": "t",
        "instructions": "",
        "profile": "true",
        "state": State.QUEUED,
        "created_at": T0,
        "updated_at": T0,
    }
    values.update(fields)
    return Task.model_validate(values)


def tool(name: str, status: str, at: int, exit_code: int | None = None) -> ToolEvent:
    return ToolEvent(name=name, status=status, at=at, exit_code=exit_code)


LONG = "x" * 300
TASKS: dict[str, Task] = {
    "queued, minimal": base(),
    "all empty strings, time zero": base(
        title="", profile="", workspace_mode="", workspace_path="", created_at=0, updated_at=0
    ),
    "completed /bin/true": base(
        state=State.COMPLETED,
        workspace_path="/w/agent-1",
        first_started_at=T0 + 5,
        started_at=T0 + 5,
        ended_at=T0 + 40,
        result=domain.Result(text=""),
        version=4,
    ),
    "running, busy": base(
        state=State.RUNNING,
        instructions=LONG,
        harness="codex",
        harness_model="m-1",
        first_started_at=T0 - 1_000_000,
        started_at=T0,
        progress=domain.Progress(text=LONG, updated_at=T0 + 1),
        last_activity_at=T0 + 2,
        last_tool=tool("bash", "error", T0 + 3, exit_code=0),
        recent_tools=[tool(f"t{i}", "returned", T0 + i, exit_code=i if i % 2 else None) for i in range(8)],
        observed_paths=[f"/p/{i}" for i in range(30)],
        execution=domain.Execution(
            available=True,
            observed_at=T0 + 9,
            last_activity_at=T0 + 8,
            cpu_user_ticks=0,
            cpu_system_ticks=3,
            io_write_bytes=0,
            processes=[domain.ProcessIdentity(pid=10, start_time=99), domain.ProcessIdentity(pid=11, start_time=0)],
        ),
        inspection=domain.Inspection(reason="idle", since=T0 + 4),
        restart_resume=domain.RestartResume(count=1, revision=2, pending=False, last_progress=None),
        tool_counts={"bash": 3},
        version=17,
    ),
    "activity time only, execution unavailable": base(
        state=State.RUNNING,
        last_activity_at=0,
        execution=domain.Execution(available=False, reason=None, observed_at=0),
    ),
    "last tool only": base(state=State.RUNNING, last_tool=tool("x", "returned", T0)),
    "waiting for an answer": base(
        state=State.WAITING_INPUT,
        pending_question=domain.PendingQuestion(question_id="q-1", text=LONG, revision=0),
        restart_resume=domain.RestartResume(count=0, revision=0, pending=True, last_progress="step 2"),
    ),
    "terminal keeps no question, execution historical": base(
        state=State.FAILED,
        pending_question=domain.PendingQuestion(question_id="q-1", text="?", revision=1),
        execution=domain.Execution(available=True, reason="gone", observed_at=T0),
        failure=domain.Failure(code="WORKER_EXITED", message="exit 0?", retryable=False, exit_code=0),
        ended_at=T0 + 5,
    ),
    "cancelled": base(
        state=State.CANCELLED,
        cancellation=domain.Cancellation(requested_at=T0, cause="user_canceled"),
        failure=domain.Failure(code="", message="", retryable=True),
        result=domain.Result(text=LONG, unresolved_background=True),
    ),
    "cancel replaced, cleanup unconfirmed": base(
        state=State.NEEDS_RECONCILIATION,
        cancellation=domain.Cancellation(
            requested_at=T0, cause="replaced", replaced_by_task_id="01JOTHER", cleanup="unconfirmed"
        ),
    ),
    "gateway-managed": base(
        execution_type=domain.GATEWAY_MANAGED,
        gateway_target=domain.GatewayTarget(
            name="n", adapter="a", native_session_id="s", display_name=None, options={"k": "v"}
        ),
        gateway_dispatch=domain.GatewayDispatch(request_id="r-1", submitted_at=None),
    ),
    "gateway dispatch submitted": base(
        execution_type=domain.GATEWAY_MANAGED,
        gateway_dispatch=domain.GatewayDispatch(request_id="", submitted_at=0),
    ),
    "tree links and skill": base(
        continue_task_id="01JPREV",
        continued_by_task_id="01JNEXT",
        parent_task_id="01JPARENT",
        root_task_id="01JPARENT",
        depth=1,
        skill=domain.SkillRef(name="review", args={"b": 1, "a": "x"}, invocation="/review"),
    ),
    "before the epoch": base(created_at=-1, updated_at=-1_500, first_started_at=-999, ended_at=MAX_MS),
}

ATTEMPTS = [
    domain.Attempt(attempt_id="a-1", task_id="t", number=1, boot_id="b", token_hash="h", harness="h1"),
    domain.Attempt(
        attempt_id="a-2",
        task_id="t",
        number=2,
        boot_id="b",
        token_hash="h",
        started_at=T0,
        pid=5,
        harness=None,
        harness_model="m",
        usage=domain.Usage(input_tokens=0, output_tokens=7),
        exit_code=0,
    ),
]
TREE = domain.TreeView(
    children=[base(task_id="c-1", harness="x"), base(task_id="c-2", state=State.RUNNING)],
    evidence=domain.TreeEvidence(
        skills=["s"], subagents=["c-1", "c-2"], subagent_models=["m"], tool_counts={"a": 1}, observed_paths=["/p"]
    ),
)


def wire(msg: pb.Task) -> bytes:
    return msg.SerializeToString(deterministic=True)


@pytest.mark.parametrize("name", sorted(TASKS))
@pytest.mark.parametrize("preview_chars", [None, 40])
def test_the_in_place_conversion_says_what_the_old_one_said(name: str, preview_chars: int | None) -> None:
    task = TASKS[name]
    now = T0 + 60_000
    new = convert.task_to_pb(task, now, preview_chars=preview_chars)
    old = reference_task_to_pb(task, now, preview_chars=preview_chars)
    assert wire(new) == wire(old)
    assert new == old


@pytest.mark.parametrize("name", ["queued, minimal", "running, busy", "tree links and skill"])
def test_detail_with_attempts_and_tree_is_unchanged(name: str) -> None:
    task = TASKS[name]
    new = convert.task_to_pb(task, T0, ATTEMPTS, tree=TREE)
    old = reference_task_to_pb(task, T0, ATTEMPTS, tree=TREE)
    assert wire(new) == wire(old)
    only_tree = domain.TreeView(children=[], evidence=None)
    assert wire(convert.task_to_pb(task, T0, tree=only_tree)) == wire(reference_task_to_pb(task, T0, tree=only_tree))


def test_fill_task_writes_into_a_message_inside_another() -> None:
    reply = pb.WatchTasksResponse()
    convert.fill_task(reply.task, TASKS["running, busy"], T0)
    assert wire(reply.task) == wire(reference_task_to_pb(TASKS["running, busy"], T0))


@pytest.mark.parametrize("ms", [0, 1, 999, 1000, -1, -999, -1000, -1001, T0, MIN_MS, MAX_MS])
def test_timestamps_match_from_milliseconds(ms: int) -> None:
    assert ts(ms) == old_ts(ms)
    holder = pb.Progress()
    set_ts(holder.update_time, ms)
    assert holder.HasField("update_time") and holder.update_time == old_ts(ms)


@pytest.mark.parametrize("ms", [MIN_MS - 1, MAX_MS + 1])
def test_timestamps_out_of_range_are_refused_as_before(ms: int) -> None:
    with pytest.raises(ValueError):
        old_ts(ms)
    with pytest.raises(ValueError):
        ts(ms)
    with pytest.raises(ValueError):
        set_ts(pb.Progress().update_time, ms)


def test_absent_time_stays_absent() -> None:
    assert ts(None) is None
