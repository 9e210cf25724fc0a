"""A throwaway PostgreSQL cluster for tests: ``start_postgres(tmpdir) -> (url, stop)``.

Uses the PostgreSQL binaries on this machine (``TASKGATE_PG_BIN``, else the newest
``/usr/lib/postgresql/*/bin``, else ``initdb`` on PATH). ``initdb`` refuses to run
as root, so as root the cluster is created and run by the ``postgres`` system
user in a directory it owns. Durability is switched off: it is a test cluster.

Reuse from any test module (or a conftest.py)::

    from tests.support.postgres import postgres_url, fresh_database  # noqa: F401  (fixtures)

    def test_x(postgres_url: str) -> None:
        url = fresh_database(postgres_url, "my_service")
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.procs import free_port

PG_USER = "postgres"


class PostgresUnavailable(Exception):
    """No usable PostgreSQL binaries here; the message says why."""


def find_pg_bin() -> Path | None:
    configured = os.environ.get("TASKGATE_PG_BIN")
    if configured:
        return Path(configured) if (Path(configured) / "initdb").exists() else None
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"),
        key=lambda p: int(Path(p).parent.name) if Path(p).parent.name.isdigit() else 0,
    )
    for candidate in reversed(candidates):
        if (Path(candidate) / "initdb").exists():
            return Path(candidate)
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _as_pg_user(cmd: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return cmd
    return ["runuser", "-u", PG_USER, "--", *cmd]


def start_postgres(tmpdir: Path | str) -> tuple[str, Callable[[], None]]:
    """Start a private cluster on a free 127.0.0.1 port: (url, stop).

    ``tmpdir`` receives a copy of the server log when it stops. The cluster
    itself lives in a fresh directory under the system temp dir (pytest's own
    temp dirs are not reachable by the ``postgres`` user), removed by ``stop``.
    Raises PostgresUnavailable when the binaries (or, as root, the ``postgres``
    user) are missing.
    """
    bin_dir = find_pg_bin()
    if bin_dir is None:
        raise PostgresUnavailable("no PostgreSQL binaries (initdb) found; set TASKGATE_PG_BIN")
    if os.geteuid() == 0:
        try:
            pg = pwd.getpwnam(PG_USER)
        except KeyError as exc:
            raise PostgresUnavailable(f"running as root and there is no {PG_USER!r} user for initdb") from exc
        if shutil.which("runuser") is None:
            raise PostgresUnavailable("running as root and runuser is missing")
    base = Path(tempfile.mkdtemp(prefix="taskgate-pg-"))
    data = base / "data"
    log_path = base / "server.log"
    if os.geteuid() == 0:
        os.chown(base, pg.pw_uid, pg.pw_gid)
    port = free_port()

    def run(cmd: list[str], timeout: float = 60) -> None:
        done = subprocess.run(_as_pg_user(cmd), capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")

    run(
        [
            str(bin_dir / "initdb"),
            "-D",
            str(data),
            "-U",
            PG_USER,
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--no-sync",
            "--no-instructions",
            "--locale=C",
        ]
    )
    options = (
        f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off"
        " -c full_page_writes=off -c max_connections=200"
    )
    run([str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(log_path), "-o", options, "-w", "-t", "60", "start"])
    stopped = False

    def stop() -> None:
        nonlocal stopped
        if stopped:
            return
        stopped = True
        try:
            run([str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "-t", "30", "stop"])
        finally:
            try:
                if log_path.exists():
                    Path(tmpdir).mkdir(parents=True, exist_ok=True)
                    shutil.copy(log_path, Path(tmpdir) / "postgres.log")
            finally:
                shutil.rmtree(base, ignore_errors=True)

    url = f"postgresql://{PG_USER}@127.0.0.1:{port}/postgres"
    try:
        _wait_ready(url)
    except BaseException:
        stop()
        raise
    return url, stop


def _wait_ready(url: str, timeout_s: float = 30.0) -> None:
    import psycopg

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with psycopg.connect(url, connect_timeout=2) as conn:
                conn.execute("SELECT 1")
                return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@contextlib.contextmanager
def throwaway_cluster() -> Iterator[str]:
    """A private cluster for the length of the block (its URL), stopped and removed after;
    PostgresUnavailable when it cannot start (a benchmark says so and skips)."""
    with tempfile.TemporaryDirectory() as tmp:
        url, stop = start_postgres(tmp)
        try:
            yield url
        finally:
            stop()


def fresh_database(url: str, prefix: str = "test") -> str:
    """Create an empty database in the cluster at ``url``; the URL of it."""
    import psycopg

    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return url.rsplit("/", 1)[0] + f"/{name}"


@pytest.fixture(scope="session")
def postgres_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A session-wide throwaway cluster; skips (with the reason) when PostgreSQL is not installed."""
    try:
        url, stop = start_postgres(tmp_path_factory.mktemp("postgres"))
    except PostgresUnavailable as exc:
        print(f"skipping PostgreSQL tests: {exc}")
        pytest.skip(f"PostgreSQL unavailable: {exc}")
    try:
        yield url
    finally:
        stop()
