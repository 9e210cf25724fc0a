"""What the kinds of task cost: admission of an isolated worktree, and a tree's detail.

Run: .venv/bin/python bench/bench_kinds.py
The scheduler's engine alone on SQLite (no worker runs: the dispatcher is not started):
- create latency (p50/p99 over CREATES tasks) for a shared-workspace profile and for an
  isolated-worktree profile (two `git rev-parse` calls and one `git worktree add` per task);
- the detail of a root task whose tree holds 2 / 20 / 200 sub-tasks over three levels
  (``Engine.task_detail``: one trip to the database, one indexed query per level, then the
  evidence aggregated in Python).
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from libs.db import Database  # noqa: E402
from libs.settings import Settings, TaskSettings, WorkerProfile  # noqa: E402
from services.scheduler.domain import NewTask, State, Task  # noqa: E402
from services.scheduler.engine import Engine  # noqa: E402
from services.scheduler.store import MIGRATIONS, SchedulerStore  # noqa: E402

CREATES = 60
DETAIL_CALLS = 100
TREES = (2, 20, 200)


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


def git_project(path: Path) -> Path:
    path.mkdir()
    (path / "f").write_text("x")
    git = ["git", "-c", "user.name=b", "-c", "user.email=b@e.invalid", "-C", str(path)]
    for args in (["init", "-q"], ["add", "f"], ["commit", "-q", "-m", "c"]):
        subprocess.run([*git, *args], check=True)
    return path


async def creates(engine: Engine, profile: str) -> list[float]:
    took = []
    for i in range(CREATES):
        start = time.perf_counter()
        await engine.create_task(NewTask("agent-1", "cli-1", f"t{i}", "", profile, None, None, None))
        took.append((time.perf_counter() - start) * 1000)
    return took


async def tree_detail(engine: Engine, size: int) -> list[float]:
    store = engine.store
    now = int(time.time() * 1000)
    root = Task(
        task_id=f"{size:08x}" + "0" * 24,
        agent_id="agent-1",
        session_id="tree",
        title="root",
        instructions="",
        profile="shared",
        state=State.RUNNING,
        created_at=now,
        updated_at=now,
    )
    await store.create_task(root)
    parents, made = [root], 0
    for depth in (1, 2, 3):
        per_parent = max(1, round((size / 3) / len(parents)))
        level = []
        for parent in parents:
            for _ in range(per_parent):
                if made >= size:
                    break
                made += 1
                child = root.model_copy(
                    update={
                        "task_id": f"{size:08x}{made:024x}",
                        "parent_task_id": parent.task_id,
                        "root_task_id": root.task_id,
                        "depth": depth,
                        "harness_model": "gpt-x",
                        "tool_counts": {"bash": 3},
                        "observed_paths": [f"src/{made}.py"],
                    }
                )
                await store.create_task(child)
                level.append(child)
        parents = level or parents
    took = []
    for _ in range(DETAIL_CALLS):
        start = time.perf_counter()
        _task, _attempts, view = await engine.task_detail(root.task_id)
        took.append((time.perf_counter() - start) * 1000)
    assert view.evidence is not None and len(view.evidence.subagents) == made
    return took


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        settings = Settings(
            data_dir=root / "var",
            tasks=TaskSettings(project_root=str(git_project(root / "project")), max_subtask_depth=3),
            workers={
                "shared": WorkerProfile(command=["true"]),
                "isolated": WorkerProfile(command=["true"], workspace_policy="isolated-worktree"),
            },
        )
        db = Database(f"sqlite:///{root / 'scheduler.db'}", MIGRATIONS)
        db.migrate()
        engine = Engine(settings, SchedulerStore(db))
        print("create (ms)            p50      p99")
        for profile in ("shared", "isolated"):
            took = await creates(engine, profile)
            print(f"  {profile:<18} {statistics.median(took):7.2f}  {pct(took, 0.99):7.2f}")
        print("root detail with its tree (ms)   p50      p99")
        for size in TREES:
            took = await tree_detail(engine, size)
            print(f"  {size:>4} sub-tasks              {statistics.median(took):7.2f}  {pct(took, 0.99):7.2f}")
        db.close()


if __name__ == "__main__":
    asyncio.run(main())
