"""Issue 13's rules without a stack: harness routing, usage counters, skill arguments,
sub-task bounds and evidence, continuation, and the Git admission check (real git)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from libs import errors
from libs.settings import SkillArg, SkillConfig, TaskSettings, WorkerProfile, load_settings
from services.scheduler import admission, domain, skills
from services.scheduler.domain import State, Task, Usage


def task(task_id: str = "a" * 32, **fields: object) -> Task:
    base: dict[str, object] = {
        "task_id": task_id,
        "agent_id": "agent",
        "session_id": "s",
        "title": "t",
        "instructions": "",
        "profile": "p",
        "state": State.QUEUED,
        "created_at": 1,
        "updated_at": 1,
    }
    return Task.model_validate({**base, **fields})


def test_a_harness_is_asked_for_only_through_a_profile_that_runs_it() -> None:
    domain.check_harness("p", "codex", "gpt-x", None, None)
    domain.check_harness("p", "codex", "gpt-x", "codex", "gpt-x")
    with pytest.raises(domain.InvalidArgument) as caught:
        domain.check_harness("p", None, None, "codex", None)
    assert caught.value.reason == "HARNESS_MISMATCH"
    with pytest.raises(domain.InvalidArgument):
        domain.check_harness("p", "codex", "gpt-x", None, "gpt-y")


def test_profiles_name_only_known_harnesses() -> None:
    with pytest.raises(ValueError):
        WorkerProfile(command=["x"], harness="gemini")  # type: ignore[arg-type]


def test_usage_totals_replace_and_deltas_add() -> None:
    stored = Usage(input_tokens=10, output_tokens=2)
    assert domain.merge_usage(stored, Usage(input_tokens=12), delta=False) == Usage(input_tokens=12)
    summed = domain.merge_usage(stored, Usage(input_tokens=5, cached_input_tokens=1), delta=True)
    assert summed == Usage(input_tokens=15, cached_input_tokens=1, output_tokens=2)
    assert domain.merge_usage(None, Usage(output_tokens=3), delta=True) == Usage(output_tokens=3)


def test_skill_arguments_follow_the_schema() -> None:
    skill = SkillConfig(
        profile="p",
        instructions_file="/nowhere",
        cli=True,
        args_schema={
            "target": SkillArg(type="string", required=True, max_length=5),
            "depth": SkillArg(type="integer"),
            "mode": SkillArg(enum=["fast", "slow"]),
        },
    )
    assert skills.validate_args("r", skill, '{"target": "src", "depth": 2}') == {"target": "src", "depth": 2}
    for bad in (
        '{"depth": 1}',
        '{"target": "toolong"}',
        '{"target": "a", "depth": true}',
        '{"target": "a", "x": 1}',
        '{"target": "a", "mode": "other"}',
        "[]",
        "not json",
    ):
        with pytest.raises(domain.InvalidArgument) as caught:
            skills.validate_args("r", skill, bad)
        assert caught.value.reason == "INVALID_SKILL_ARGS", bad
    ref = skills.skill_ref("r", skill, {"target": "src"})
    assert ref.invocation == '/r {"target": "src"}'
    assert skills.skill_ref("r", skill.model_copy(update={"cli": False}), {}).invocation is None


async def test_an_unreadable_skill_is_refused_without_its_path(tmp_path: Path) -> None:
    missing = tmp_path / "secret-place" / "body.md"
    with pytest.raises(skills.SkillUnavailable) as caught:
        await skills.body("r", SkillConfig(profile="p", instructions_file=str(missing)))
    assert "secret-place" not in caught.value.message
    missing.parent.mkdir()
    missing.write_text("the body")
    assert await skills.body("r", SkillConfig(profile="p", instructions_file=str(missing))) == "the body"


def test_skills_must_name_a_configured_profile(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text("[skills.x]\nprofile = 'nope'\ninstructions_file = 'f'\n")
    with pytest.raises(Exception, match="skills.x.profile"):
        load_settings({"TASKGATE_CONFIG": str(config)})


def test_sub_tasks_are_bounded_in_depth_and_fan_out() -> None:
    settings = TaskSettings(max_subtask_depth=2, max_subtasks_per_task=2)
    domain.check_spawn(task(depth=1), 1, settings)
    with pytest.raises(domain.InvalidArgument) as caught:
        domain.check_spawn(task(depth=2), 0, settings)
    assert caught.value.reason == "SUBTASK_DEPTH_EXCEEDED"
    with pytest.raises(domain.InvalidArgument) as caught:
        domain.check_spawn(task(depth=0), 2, settings)
    assert caught.value.reason == "SUBTASK_FANOUT_EXCEEDED"


def test_evidence_aggregates_the_tree_and_is_absent_for_a_plain_task() -> None:
    root = task(tool_counts={"bash": 1}, observed_paths=["a"])
    assert domain.tree_evidence(root, []) is None
    child = task(
        "b" * 32,
        harness_model="gpt-x",
        tool_counts={"bash": 2, "read": 1},
        observed_paths=["a", "b"],
        skill={"name": "review", "args": {}},
    )
    evidence = domain.tree_evidence(root, [child])
    assert evidence is not None
    assert evidence.skills == ["review"] and evidence.subagents == ["b" * 32]
    assert evidence.subagent_models == ["gpt-x"]
    assert evidence.tool_counts == {"bash": 3, "read": 1} and evidence.observed_paths == ["a", "b"]
    tool = domain.ToolEvent(name="bash", status="returned", at=5)
    domain.apply_tool(root, tool, keep=1)
    assert root.tool_counts == {"bash": 2} and root.updated_at == 5


def test_only_a_finished_task_of_the_same_session_is_continued_once() -> None:
    done = task(state=State.COMPLETED)
    domain.check_continuable(done, "agent", "s")
    with pytest.raises(domain.WorkerDenied):
        domain.check_continuable(done, "agent", "other")
    with pytest.raises(domain.InvalidTransition):
        domain.check_continuable(task(state=State.RUNNING), "agent", "s")
    with pytest.raises(errors.AlreadyExists):
        domain.check_continuable(task(state=State.FAILED, continued_by_task_id="c" * 32), "agent", "s")


def _git(path: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@e.invalid", "-C", str(path), *args], check=True)


async def test_admission_needs_a_git_project_with_a_commit(tmp_path: Path) -> None:
    assert (await admission.git_project(""))[1] == "is not configured"
    assert (await admission.git_project(str(tmp_path / "none")))[1] == "does not exist"
    plain = tmp_path / "plain"
    plain.mkdir()
    assert (await admission.git_project(str(plain)))[1] == "is not a Git repository"
    _git(plain, "init", "-q")
    assert (await admission.git_project(str(plain)))[1] == "has no commit yet"
    (plain / "f").write_text("x")
    _git(plain, "add", "f")
    _git(plain, "commit", "-q", "-m", "c")
    project, why = await admission.git_project(str(plain))
    assert project == plain.resolve() and why == ""
    settings = load_settings({"TASKGATE_DATA_DIR": str(tmp_path), "TASKGATE_TASKS_PROJECT_ROOT": str(tmp_path / "x")})
    profile = WorkerProfile(command=["x"], workspace_policy="isolated-worktree")
    with pytest.raises(domain.WorkerGitProjectRequired) as caught:
        await admission.plan_workspace(settings, "iso", profile, "agent", None, "d" * 32)
    assert caught.value.metadata == {"retryable": "true", "profile": "iso", "continueTaskId": "d" * 32}
    assert str(tmp_path) not in caught.value.message
    plan = await admission.plan_workspace(
        settings, "iso", profile.model_copy(update={"project_root": str(plain)}), "agent", None, None
    )
    assert plan.mode == "worktree" and plan.worktree_from == plain.resolve()
    tree = admission.worktree_path(settings, "e" * 32)
    await admission.create_worktree(plain, tree)
    assert (tree / "f").read_text() == "x"
    await admission.remove_worktree(plain, tree)
    assert not tree.exists()
    shared = await admission.plan_workspace(settings, "p", WorkerProfile(command=["x"]), "agent", None, None)
    assert shared.mode == "agent", "default-worker needs no Git"


def test_a_gateway_managed_create_names_only_a_target() -> None:
    target = domain.GatewayTarget(name="remote", adapter="", native_session_id="s-1")
    plain = domain.NewTask("a", "s", "t", "", "", None, None, None, target=target)
    assert domain.validate_target_request(plain) is target
    for extra in ({"profile": "p"}, {"skill_name": "x"}, {"continue_task_id": "c" * 32}, {"harness": "codex"}):
        with pytest.raises(domain.InvalidArgument) as caught:
            domain.validate_target_request(domain.NewTask(**{**plain.__dict__, **extra}))  # type: ignore[arg-type]
        assert caught.value.reason == "TARGET_EXCLUSIVE"
    many = target.model_copy(update={"options": {f"k{i}": "v" for i in range(33)}})
    with pytest.raises(domain.InvalidArgument):
        domain.validate_target_request(domain.NewTask("a", "s", "t", "", "", None, None, None, target=many))


def test_an_unanswered_request_is_overdue_after_its_outcome_timeout() -> None:
    sent = task(
        state=State.RUNNING,
        execution_type="gateway-managed",
        gateway_dispatch={"request_id": "a" * 32, "submitted_at": 1000},
    )
    assert not domain.outcome_overdue(sent, 500, 1499)
    assert domain.outcome_overdue(sent, 500, 1500)
    assert not domain.outcome_overdue(task(state=State.RUNNING), 500, 10_000), "a worker task never is"
    waiting = sent.model_copy(update={"state": State.WAITING_INPUT})
    assert not domain.outcome_overdue(waiting, 500, 10_000), "waiting for a person is never overdue"
    answered = sent.model_copy(update={"updated_at": 5000})
    assert not domain.outcome_overdue(answered, 500, 5499), "the deadline restarts when the target got its answer"
    failure = domain.dispatch_outcome_unknown("lost")
    assert failure.code == "DISPATCH_OUTCOME_UNKNOWN" and failure.retryable is False


async def test_a_cancel_left_half_told_is_told_again_and_an_overdue_request_ends_unknown(tmp_path: Path) -> None:
    """No process anywhere: the deadline loop ends an unanswered request DISPATCH_OUTCOME_UNKNOWN
    and tells the target about a cancel an earlier incarnation left cancel_requested."""
    from libs.clock import Clock
    from libs.db import Database
    from libs.settings import Settings, TargetConfig
    from services.scheduler.engine import Engine
    from services.scheduler.store import MIGRATIONS, SchedulerStore
    from tests.support.procs import free_port

    class At(Clock):
        now = 10_000_000

        def now_ms(self) -> int:
            return self.now

    # Nothing listens there: a cancel cannot be acknowledged.
    url = f"http://127.0.0.1:{free_port()}/t"
    settings = Settings(
        data_dir=tmp_path,
        targets={"t": TargetConfig(url=url, secret="s" * 16, outcome_timeout_ms=1000, dispatch_timeout_ms=500)},
    )
    db = Database(f"sqlite:///{tmp_path}/s.db", MIGRATIONS)
    db.migrate()
    clock = At()
    engine = Engine(settings, SchedulerStore(db), clock=clock)
    try:
        store = engine.store
        gateway = {"name": "t", "adapter": "http", "native_session_id": "n"}
        for task_id, state in (("a" * 32, State.RUNNING), ("b" * 32, State.CANCEL_REQUESTED)):
            row = task(
                task_id,
                state=state,
                execution_type="gateway-managed",
                gateway_target=gateway,
                gateway_dispatch={"request_id": task_id, "submitted_at": clock.now},
                cancellation={"requested_at": clock.now, "cause": "user_canceled"} if state != State.RUNNING else None,
            )
            await store.create_task(row)
        clock.now += 999
        assert await engine.check_dispatch_deadlines_once() == 0
        clock.now += 1
        assert await engine.check_dispatch_deadlines_once() == 1
        await engine.runtime.drain_background()
        overdue = await store.get_task("a" * 32)
        assert overdue.state == State.FAILED and overdue.failure is not None
        assert overdue.failure.code == "DISPATCH_OUTCOME_UNKNOWN" and not overdue.failure.retryable
        told = await store.get_task("b" * 32)
        assert told.state == State.NEEDS_RECONCILIATION and told.failure is not None
        assert told.failure.code == "CLEANUP_UNCONFIRMED" and "did not acknowledge" in told.failure.message
    finally:
        db.close()
