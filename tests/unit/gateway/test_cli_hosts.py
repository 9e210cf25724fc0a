"""`taskgate admin hosts list|resolve` against a real in-process scheduler on PostgreSQL,
called over gRPC with the operator's caller secret (from the environment, as the CLI reads it)."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import pytest

from gateway_http.cli import main as cli
from libs.db import Database
from services.scheduler.domain import State
from services.scheduler.store import SchedulerStore
from tests.unit.scheduler.test_engine import Harness
from tests.unit.scheduler.test_hosts import NOW, SECRETS, behave_task, launched, pg_db, survivor  # noqa: F401  (fixtures)


async def run_cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = await asyncio.to_thread(cli.main, list(argv), out)  # the CLI is sync: off the server's loop
    return code, out.getvalue()


@pytest.mark.postgres
async def test_hosts_list_and_resolve_with_the_operators_assertion(
    pg_db: Database,  # noqa: F811
    survivor: Harness,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("TASKGATE_DATA_DIR", str(tmp_path / "cli"))
    monkeypatch.setenv("TASKGATE_SCHEDULER_ADDR", survivor.engine.settings.scheduler_addr)
    monkeypatch.setenv("TASKGATE_SECRET_OPERATOR", SECRETS["operator"])
    lost = SchedulerStore(pg_db, "lost-box")
    await lost.register_host("boot", NOW - 60_000, 1_000, only_one=False)
    task, _ = await lost.create_task(behave_task(0))
    await launched(lost, task, "lost-box")
    await survivor.engine.store.sweep_lost(task.task_id, "lost-box", NOW, NOW)

    code, out = await run_cli("admin", "hosts", "list")
    assert code == 0, capsys.readouterr().err
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["HOST", "LEASE", "CONNECTED"]
    (lost_line,) = [line for line in lines if line.startswith("lost-box")]
    assert "expired" in lost_line and lost_line.split()[-2:] == ["1", "1"], "one HOST_LOST task, resolvable"
    assert any(line.startswith("survivor (answering)") and "live until" in line for line in lines)

    code, out = await run_cli("admin", "hosts", "resolve", "lost-box")
    assert code == 2 and "--host-is-gone" in capsys.readouterr().err
    assert (await survivor.engine.store.get_task(task.task_id)).state == State.NEEDS_RECONCILIATION

    code, out = await run_cli("admin", "hosts", "resolve", "survivor", "--host-is-gone")
    assert code == 2 and "INVALID_ARGUMENT" in capsys.readouterr().err

    code, out = await run_cli("admin", "hosts", "resolve", "lost-box", "--host-is-gone")
    assert code == 0, capsys.readouterr().err
    assert "resolved 1 task(s) of host lost-box that waited for it" in out
    assert task.task_id in out and "queued" in out and "removed from the hosts table" in out
    assert (await survivor.engine.store.get_task(task.task_id)).state == State.QUEUED

    # Nothing names the host any more (its task was released): the id is unknown now.
    code, out = await run_cli("admin", "hosts", "resolve", "lost-box", "--host-is-gone")
    err = capsys.readouterr().err
    assert code == 2 and "NOT_FOUND" in err and "already resolved" in err
