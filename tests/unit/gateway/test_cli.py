"""CLI behaviour that needs no server: watch prints only changes, tables read well."""

from __future__ import annotations

import argparse
import io
import os
from pathlib import Path
from typing import Any

import pytest

from gateway_http.cli import main as cli
from gateway_http.cli.tables import render_table


def snapshot(state: str, progress: str, elapsed: int) -> dict[str, Any]:
    return {
        "taskId": "t" * 32,
        "title": "x",
        "state": state,
        "progress": {"text": progress, "updatedAt": None},
        "timing": {"elapsedMs": elapsed},
        "workspace": {"path": "/w"},
    }


class ScriptedClient:
    def __init__(self, snapshots: list[dict[str, Any]]) -> None:
        self.snapshots = snapshots
        self.calls = 0

    def get_task(self, task_id: str) -> dict[str, Any]:
        self.calls += 1
        return self.snapshots[min(self.calls - 1, len(self.snapshots) - 1)]


def watch_args(**kw: Any) -> argparse.Namespace:
    return argparse.Namespace(task_id="t" * 32, page=0, all=False, interval=3.0, **kw)


def test_watch_prints_only_changed_snapshots_and_exits_at_the_end(monkeypatch: pytest.MonkeyPatch) -> None:
    client = ScriptedClient(
        [
            snapshot("running", "a", 1000),
            snapshot("running", "a", 4000),  # only the clock moved
            snapshot("running", "b", 7000),
            snapshot("running", "b", 10000),
            snapshot("completed", "b", 12000),
        ]
    )
    monkeypatch.setattr(cli, "_client", lambda args: client)
    sleeps: list[float] = []
    out = io.StringIO()
    code = cli.cmd_tasks_watch(watch_args(), out, sleep=sleeps.append)
    lines = out.getvalue().splitlines()
    assert code == 0 and client.calls == 5
    assert len(lines) == 3 and "running" in lines[0] and lines[1].endswith("b") and "completed" in lines[2]
    assert sleeps == [3.0] * 4, "polls every 3 s"


def test_watch_ctrl_c_stops_watching_without_cancelling(monkeypatch: pytest.MonkeyPatch) -> None:
    class Client(ScriptedClient):
        def cancel_task(self, *a: Any) -> None:
            raise AssertionError("watch must never cancel")

    client = Client([snapshot("running", "a", 0)])
    monkeypatch.setattr(cli, "_client", lambda args: client)

    def interrupt(_: float) -> None:
        raise KeyboardInterrupt

    out = io.StringIO()
    assert cli.cmd_tasks_watch(watch_args(), out, sleep=interrupt) == 130
    assert "the task keeps running" in out.getvalue()


def test_watch_of_a_failed_task_exits_non_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    failed = snapshot("failed", "", 0) | {"failure": {"code": "WORKER_EXITED", "message": "exit 3"}}
    monkeypatch.setattr(cli, "_client", lambda args: ScriptedClient([failed]))
    out = io.StringIO()
    assert cli.cmd_tasks_watch(watch_args(), out, sleep=lambda _: None) == 1
    assert "WORKER_EXITED" in out.getvalue()


def test_tables_align_and_truncate() -> None:
    text = render_table(["id", "title"], [["1", "short"], ["22", "x" * 100]], max_width=10)
    lines = text.splitlines()
    assert lines[0].startswith("ID  ") and lines[2].endswith("xxxxxxxxx…")
    assert len({line.index(line.split()[1]) for line in lines}) == 1, "columns line up"


def test_tasks_commands_need_a_key(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("TASKGATE_API_KEY", raising=False)
    assert cli.main(["tasks", "--agent", "a", "--session", "s", "list"]) == 2
    assert "TASKGATE_API_KEY" in capsys.readouterr().err


def test_members_add_takes_several_sessions_in_one_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in [n for n in os.environ if n.startswith("TASKGATE_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("TASKGATE_DATA_DIR", str(tmp_path))
    base = ["admin", "members", "add", "--agent", "agent-1", "--principal", "nora"]

    out = io.StringIO()
    assert cli.main([*base, "--session", "s1", "--session", "s2", "--session", "s1"], out) == 0
    assert out.getvalue().splitlines() == ["added nora → agent-1/s1", "added nora → agent-1/s2"]

    out = io.StringIO()
    assert cli.main([*base, "--session", "s2", "--session", "s3"], out) == 0
    assert out.getvalue().splitlines() == ["already a member: nora → agent-1/s2", "added nora → agent-1/s3"]

    out = io.StringIO()
    assert cli.main(["admin", "members", "list", "--agent", "agent-1"], out) == 0
    listed = [line.split()[1] for line in out.getvalue().splitlines() if line.startswith("agent-1")]
    assert listed == ["s1", "s2", "s3"]


def test_members_add_refuses_a_bad_session_and_adds_none(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in [n for n in os.environ if n.startswith("TASKGATE_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("TASKGATE_DATA_DIR", str(tmp_path))
    with pytest.raises(SystemExit):
        cli.main(["admin", "members", "add", "--agent", "a", "--principal", "p", "--session", "ok", "--session", ".x"])
    out = io.StringIO()
    assert cli.main(["admin", "members", "list"], out) == 0
    assert out.getvalue().split() == ["AGENT", "SESSION", "PRINCIPAL", "ADDED"], "no membership was added"
