"""Container workers: admission from real ``podman inspect`` output (committed under
tests/data/containers, captured from podman 4.3 with runc), and — where podman runs on this
machine — the engine for real: refusals before anything runs, cancel proven by the engine,
the host client's exit proving nothing, and an unproven stop ending needs_reconciliation."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import tarfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from libs.db import Database
from libs.settings import ContainerSpec, WorkerProfile
from services.scheduler import containers
from services.scheduler.containers import AllowedMount, no_new_privileges, refusals
from services.scheduler.domain import State
from services.scheduler.store import MIGRATIONS
from tests.unit.scheduler.test_engine import Harness, start_harness

DATA = Path(__file__).resolve().parents[2] / "data" / "containers"
IMAGE = "localhost/taskgate-test-box:1"


def inspected(name: str) -> dict[str, Any]:
    return json.loads((DATA / f"podman-inspect-{name}.json").read_text())[0]  # type: ignore[no-any-return]


WORK = [AllowedMount("/tmp/tgbox/ws", "/work", True)]


def test_admission_of_real_inspect_output() -> None:
    assert refusals(inspected("ok"), WORK) == []
    assert refusals(inspected("priv"), WORK) == ["privileged mode"]
    # `--security-opt no-new-privileges --security-opt no-new-privileges=false`: the later one wins.
    assert refusals(inspected("nnpoff"), WORK) == ["no-new-privileges is disabled"]
    assert refusals(inspected("nonnp"), WORK) == ["no-new-privileges is disabled"]
    # A mount the profile does not list, or writable where the profile says read-only.
    assert refusals(inspected("ok"), []) == ["unknown bind mount /tmp/tgbox/ws -> /work"]
    assert refusals(inspected("ok"), [AllowedMount("/tmp/tgbox/ws", "/work", False)]) != []


def test_no_new_privileges_is_read_in_option_order() -> None:
    assert no_new_privileges(["no-new-privileges"]) is True
    assert no_new_privileges(["no-new-privileges", "no-new-privileges=false"]) is False
    assert no_new_privileges(["no-new-privileges:false", "seccomp=unconfined", "no-new-privileges:true"]) is True
    assert no_new_privileges(["no-new-privileges=true", "no-new-privileges:false"]) is False
    assert no_new_privileges([]) is False  # the engines' default is off


# --- a real engine -----------------------------------------------------------------------


def _podman_runs() -> str | None:
    if shutil.which("podman") is None:
        return "podman is not installed"
    if not Path("/bin/busybox").exists():
        return "no static busybox to build a local image from"
    return None


@pytest.fixture(scope="module")
def podman_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A local image (static busybox, no registry), runc, no default rlimits (ENV-NOTES)."""
    why = _podman_runs()
    if why:
        pytest.skip(why)
    root = tmp_path_factory.mktemp("box")
    conf = root / "containers.conf"
    conf.write_text("[containers]\ndefault_ulimits = []\n")
    env = {**os.environ, "CONTAINERS_CONF": str(conf)}
    rootfs = root / "rootfs"
    (rootfs / "bin").mkdir(parents=True)
    shutil.copy("/bin/busybox", rootfs / "bin" / "busybox")
    for applet in ("sh", "sleep"):
        (rootfs / "bin" / applet).symlink_to("busybox")
    with tarfile.open(root / "box.tar", "w") as tar:
        tar.add(rootfs, arcname=".")
    importing = ["podman", "import", str(root / "box.tar"), IMAGE]
    built = subprocess.run(importing, env=env, capture_output=True, timeout=120)
    if built.returncode != 0:
        pytest.skip(f"podman cannot build a local image here: {built.stderr.decode()[-300:]}")
    yield env


def box(tmp_path: Path, *options: str, mounts: list[str] | None = None) -> WorkerProfile:
    return WorkerProfile(
        command=["/bin/sleep", "300"],
        container=ContainerSpec(
            engine="podman",
            image=IMAGE,
            mounts=mounts if mounts is not None else [f"{tmp_path}:/work"],
            options=list(options),
            engine_args=["--runtime", "runc"],
        ),
    )


@pytest.fixture
async def harness(
    tmp_path: Path, podman_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Harness]:
    monkeypatch.setenv("CONTAINERS_CONF", podman_env["CONTAINERS_CONF"])
    stray = tmp_path / "stray"
    stray.mkdir()
    workers = {
        "box": box(tmp_path),
        "box-privileged": box(tmp_path, "--privileged"),
        "box-nnp-off": box(tmp_path, "--security-opt", "no-new-privileges=false"),
        "box-stray-mount": box(tmp_path, "-v", f"{stray}:/stray"),
    }
    db = Database(f"sqlite:///{tmp_path / 'scheduler.db'}", MIGRATIONS)
    h = await start_harness(tmp_path, db=db, workers=workers, cancel_grace_ms=1000)
    yield h
    await h.close()


def engine_state(name: str) -> dict[str, Any] | None:
    found = subprocess.run(["podman", "inspect", "--type", "container", name], capture_output=True, timeout=60)
    return json.loads(found.stdout)[0] if found.returncode == 0 else None  # type: ignore[no-any-return]


async def attempt_of(h: Harness, task_id: str) -> Any:
    _, attempts = await h.engine.get_task(task_id)
    return attempts[-1]


@pytest.mark.parametrize(
    ("profile", "reason"),
    [
        ("box-privileged", "privileged mode"),
        ("box-nnp-off", "no-new-privileges is disabled"),
        ("box-stray-mount", "unknown bind mount"),
    ],
)
async def test_admission_refuses_before_anything_runs(harness: Harness, profile: str, reason: str) -> None:
    task = await harness.create(profile)
    await harness.engine.dispatch_once()
    failed = await harness.wait(task.task_id, [State.FAILED, State.RUNNING], timeout_s=60)
    assert failed.state == State.FAILED and failed.failure is not None
    assert failed.failure.code == "WORKER_LAUNCH_FAILED" and reason in failed.failure.message
    attempt = await attempt_of(harness, task.task_id)
    assert attempt.pid is None, "nothing was spawned, not even on the host"
    assert engine_state(containers.container_name(attempt.attempt_id)) is None, "the refused container is removed"


async def test_cancel_is_proven_by_the_engine(harness: Harness) -> None:
    task = await harness.create("box")
    await harness.engine.dispatch_once()
    await harness.wait(task.task_id, [State.RUNNING], timeout_s=60)
    name = containers.container_name((await attempt_of(harness, task.task_id)).attempt_id)
    deadline = time.monotonic() + 30
    while not ((state := engine_state(name)) and state["State"]["Running"]):
        assert time.monotonic() < deadline, "the container did not start"
        await asyncio.sleep(0.1)
    await harness.engine.cancel(task.task_id, wait_s=0)
    done = await harness.wait(task.task_id, [State.CANCELLED, State.NEEDS_RECONCILIATION], timeout_s=60)
    assert done.state == State.CANCELLED, done.failure
    assert engine_state(name) is None, "stopped, proven and removed by the engine"


async def test_the_host_clients_exit_is_not_the_containers(harness: Harness) -> None:
    task = await harness.create("box")
    await harness.engine.dispatch_once()
    await harness.wait(task.task_id, [State.RUNNING], timeout_s=60)
    attempt = await attempt_of(harness, task.task_id)
    name = containers.container_name(attempt.attempt_id)
    deadline = time.monotonic() + 30
    while not ((state := engine_state(name)) and state["State"]["Running"]):
        assert time.monotonic() < deadline, "the container did not start"
        await asyncio.sleep(0.1)
    os.kill(attempt.pid, signal.SIGKILL)  # only the client: the container runs on without it
    ended = await harness.wait(task.task_id, [State.FAILED, State.COMPLETED, State.CANCELLED], timeout_s=60)
    assert ended.state == State.FAILED
    assert engine_state(name) is None, "the scheduler stopped the container the client left behind"


async def test_without_the_engines_proof_a_cancel_ends_needs_reconciliation(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = await harness.create("box")
    await harness.engine.dispatch_once()
    await harness.wait(task.task_id, [State.RUNNING], timeout_s=60)
    real = containers.ContainerEngine.stop_and_prove

    async def engine_unreachable(self: containers.ContainerEngine, name: str, grace_s: float) -> str:
        return f"the engine cannot inspect container {name}"

    monkeypatch.setattr(containers.ContainerEngine, "stop_and_prove", engine_unreachable)
    await harness.engine.cancel(task.task_id, wait_s=0)
    stuck = await harness.wait(task.task_id, [State.NEEDS_RECONCILIATION, State.CANCELLED], timeout_s=60)
    assert stuck.state == State.NEEDS_RECONCILIATION, "the host client gone is not proof"
    assert stuck.failure is not None and stuck.failure.code == "CLEANUP_UNCONFIRMED"
    assert "cannot inspect container" in stuck.failure.message
    # The engine back: the container (still there) is stopped and proven.
    monkeypatch.setattr(containers.ContainerEngine, "stop_and_prove", real)
    name = containers.container_name((await attempt_of(harness, task.task_id)).attempt_id)
    spec = box(Path("/")).container
    assert spec is not None
    assert await containers.ContainerEngine(spec).stop_and_prove(name, 1) == ""
