"""Admission: where a new task's workspace will be, decided before any row exists.

A profile with ``workspace_policy = "isolated-worktree"`` gets a Git worktree per task from
its project (``project_root`` of the profile, else ``[tasks] project_root``). A project that
is not a Git repository with a commit refuses the task with ``WORKER_GIT_PROJECT_REQUIRED``
(retryable: the operator can fix the project and the caller retry, ``continueTaskId`` echoed).
A continuation works in the workspace of the task it continues. Git runs as a subprocess on
the event loop (``asyncio.create_subprocess_exec``), never a blocking call.
"""

from __future__ import annotations

import asyncio
import shutil
from dataclasses import dataclass
from pathlib import Path

import structlog

from libs.settings import Settings, WorkerProfile
from services.scheduler import helper_children
from services.scheduler.domain import Task, WorkerGitProjectRequired

log = structlog.get_logger("scheduler")

ISOLATED_WORKTREE = "isolated-worktree"
GIT_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class WorkspacePlan:
    mode: str  # "agent" | "profile" | "worktree" | "continued"
    path: Path
    # An isolated worktree to create for the task (the project it comes from).
    worktree_from: Path | None = None


async def _git(*args: str, cwd: Path | None = None) -> tuple[int, str]:
    # Announced to the subreaper: its exit status is ours, not an orphan's to reap.
    with helper_children.running():
        proc = await asyncio.create_subprocess_exec(
            "git",
            *args,
            cwd=cwd,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            async with asyncio.timeout(GIT_TIMEOUT_S):
                out, _ = await proc.communicate()
        except TimeoutError:
            proc.kill()
            await proc.wait()
            return 124, "git did not answer in time"
    return proc.returncode or 0, out.decode(errors="replace").strip()


def _refuse(profile_name: str, why: str, continue_task_id: str | None) -> WorkerGitProjectRequired:
    metadata = {"retryable": "true", "profile": profile_name}
    if continue_task_id:
        metadata["continueTaskId"] = continue_task_id
    # No host path in the message: it reaches REST clients.
    return WorkerGitProjectRequired(
        "WORKER_GIT_PROJECT_REQUIRED",
        f"profile {profile_name!r} works in an isolated Git worktree, but its project {why}; "
        "the operator must point project_root at a Git repository with at least one commit, then retry",
        **metadata,
    )


async def git_project(root: str | None) -> tuple[Path | None, str]:
    """(the project's top level, "") when ``root`` is a Git work tree with a commit, else (None, why)."""
    if not root:
        return None, "is not configured"
    path = Path(root)
    if not await asyncio.to_thread(path.is_dir):
        return None, "does not exist"
    try:
        code, out = await _git("-C", str(path), "rev-parse", "--show-toplevel")
    except FileNotFoundError:
        return None, "cannot be checked: git is not installed"
    if code != 0:
        return None, "is not a Git repository"
    code, _ = await _git("-C", str(path), "rev-parse", "--verify", "--quiet", "HEAD^{commit}")
    if code != 0:
        return None, "has no commit yet"
    return Path(out), ""


async def plan_workspace(
    settings: Settings,
    profile_name: str,
    profile: WorkerProfile,
    agent_id: str,
    continues: Task | None,
    continue_task_id: str | None,
) -> WorkspacePlan:
    """Where the task will work; raises ``WorkerGitProjectRequired`` before anything exists."""
    if profile.workspace_policy == ISOLATED_WORKTREE:
        project, why = await git_project(profile.project_root or settings.tasks.project_root)
        if project is None:
            log.info("admission_refused", reason="WORKER_GIT_PROJECT_REQUIRED", profile=profile_name)
            raise _refuse(profile_name, why, continue_task_id)
        if continues is None:
            return WorkspacePlan("worktree", Path(), worktree_from=project)
    if continues is not None:
        return WorkspacePlan(continues.workspace_mode, Path(continues.workspace_path))
    return shared_workspace(settings, profile, agent_id)


def shared_workspace(settings: Settings, profile: WorkerProfile, agent_id: str) -> WorkspacePlan:
    """A shared-policy task's workspace: the profile's folder, else the agent's."""
    if profile.workspace:
        return WorkspacePlan("profile", Path(profile.workspace))
    return WorkspacePlan("agent", settings.agent_workspace(agent_id))


def worktree_path(settings: Settings, task_id: str) -> Path:
    return (settings.data_dir / "worktrees" / task_id).resolve()


async def create_worktree(project: Path, path: Path) -> None:
    """``git worktree add --detach`` at the project's HEAD: the task's own checkout."""
    await asyncio.to_thread(path.parent.mkdir, parents=True, exist_ok=True)
    code, out = await _git("-C", str(project), "worktree", "add", "--detach", str(path), "HEAD")
    if code != 0:
        log.warning("worktree_add_failed", detail=out[-500:])
        raise WorkerGitProjectRequired(
            "WORKER_GIT_PROJECT_REQUIRED",
            "the task's Git worktree could not be created; retry, or ask the operator to check the project",
            retryable="true",
        )


async def remove_worktree(project: Path, path: Path) -> None:
    """Undo a worktree whose task was not created (an idempotent repeat won)."""
    code, _ = await _git("-C", str(project), "worktree", "remove", "--force", str(path))
    if code != 0:
        await asyncio.to_thread(shutil.rmtree, path, True)
        await _git("-C", str(project), "worktree", "prune")
