"""The whole system on PostgreSQL: every service database in a throwaway cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.conftest import AGENT, SESSION, Api, add_member, create_key
from tests.support.stack import make_stack


def test_a_task_completes_with_every_database_on_postgresql(postgres_url: str, tmp_path: Path) -> None:
    stack = make_stack(tmp_path / "pg-stack").use_postgresql(postgres_url).start()
    try:
        api = Api(stack, create_key(stack, "pg-user", AGENT))
        add_member(stack, AGENT, SESSION, "pg-user")
        task = api.wait_state(api.create("on postgres", instructions="x y")["taskId"], "completed", "failed")
        assert task["state"] == "completed" and task["result"]["text"].startswith("Done")
        assert not list((tmp_path / "pg-stack").glob("*.db")), "no SQLite file when every URL is PostgreSQL"
    except Exception:
        print(stack.logs())
        raise
    finally:
        stack.stop()


pytestmark = pytest.mark.postgres
