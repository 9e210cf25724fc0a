from __future__ import annotations

from pathlib import Path

import pytest

from libs.settings import SettingsError, load_settings


def test_defaults_come_from_the_shipped_config() -> None:
    s = load_settings({})
    assert s.scheduler_addr == "127.0.0.1:50051" and s.http_addr == "127.0.0.1:8080"
    assert s.tasks.idle_timeout_ms == 300000 and s.tasks.cancel_grace_ms == 5000
    assert s.workers["default-worker"].command == ["python", "-m", "examples.workers.demo"]
    assert s.db_url("scheduler").startswith("sqlite:///") and s.db_url("scheduler").endswith("var/scheduler.db")


def test_toml_then_environment(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(
        'pending_addr = "127.0.0.1:6000"\n[tasks]\ndefault_timeout_ms = 42\nmax_running = 2\n'
        '[workers.w]\ncommand = ["true"]\nharness = "codex"\n'
    )
    s = load_settings(
        {
            "TASKGATE_CONFIG": str(config),
            "TASKGATE_TASKS_MAX_RUNNING": "7",
            "TASKGATE_DATA_DIR": str(tmp_path),
            "TASKGATE_WORKER_TOKEN": "ignored",
        }
    )
    assert s.pending_addr == "127.0.0.1:6000"
    assert s.tasks.idle_timeout_ms == 42, "default_timeout_ms is the alias of idle_timeout_ms"
    assert s.tasks.max_running == 7 and s.data_dir == tmp_path
    assert s.workers["w"].harness == "codex"


@pytest.mark.parametrize(
    ("env", "toml", "needle"),
    [
        ({"TASKGATE_TASKS_MAX_RUNNING": "many"}, "", "tasks.max_running"),
        ({"TASKGATE_SCHEDULER_ADDR": "nohostport"}, "", "scheduler_addr"),
        ({}, "[tasks]\nunknown_knob = 1\n", "tasks.unknown_knob"),
        ({}, "[workers.w]\ncommand = []\n", "workers.w.command"),
        ({}, "this is not toml", "cannot read config"),
    ],
)
def test_bad_configuration_names_the_problem(tmp_path: Path, env: dict[str, str], toml: str, needle: str) -> None:
    config = tmp_path / "c.toml"
    config.write_text(toml)
    with pytest.raises(SettingsError) as err:
        load_settings({"TASKGATE_CONFIG": str(config), **env})
    assert needle in str(err.value)


def test_a_missing_config_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="does not exist"):
        load_settings({"TASKGATE_CONFIG": str(tmp_path / "absent.toml")})


def test_a_process_with_bad_settings_exits_naming_itself_and_the_field() -> None:
    from libs.startup import boot

    with pytest.raises(SystemExit) as err:
        boot("scheduler", {"TASKGATE_TASKS_CANCEL_GRACE_MS": "-5"})
    assert str(err.value).startswith("scheduler: ") and "tasks.cancel_grace_ms" in str(err.value)


def test_each_service_has_a_metrics_port_setting() -> None:
    defaults = load_settings({"TASKGATE_CONFIG": ""})
    assert defaults.metrics_host == "127.0.0.1"
    env = {
        f"TASKGATE_{name}_METRICS_PORT": str(9000 + i)
        for i, name in enumerate(["SCHEDULER", "PENDING", "TELEMETRY", "NOTIFIER", "GATEWAY"])
    }
    settings = load_settings({**env, "TASKGATE_METRICS_HOST": "0.0.0.0"})
    ports = [
        settings.scheduler_metrics_port,
        settings.pending_metrics_port,
        settings.telemetry_metrics_port,
        settings.notifier_metrics_port,
        settings.gateway_metrics_port,
    ]
    assert ports == [9000, 9001, 9002, 9003, 9004] and settings.metrics_host == "0.0.0.0"
    with pytest.raises(SettingsError, match="scheduler_metrics_port"):
        load_settings({"TASKGATE_SCHEDULER_METRICS_PORT": "70000"})


def test_an_agents_workspace_its_own_folder_or_one_under_the_data_dir(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(f'[agents.mine]\nworkspace = "{tmp_path / "elsewhere"}"\n')
    first = load_settings({"TASKGATE_CONFIG": str(config), "TASKGATE_DATA_DIR": str(tmp_path / "a")})
    # The default is remembered per (data dir, agent): another data dir has its own.
    second = load_settings({"TASKGATE_DATA_DIR": str(tmp_path / "b" / ".." / "b")})
    for _ in range(2):
        assert first.agent_workspace("mine") == tmp_path / "elsewhere"
        assert first.agent_workspace("agent-1") == (tmp_path / "a").resolve() / "workspaces" / "agent-1"
        assert first.agent_workspace("agent-2") == (tmp_path / "a").resolve() / "workspaces" / "agent-2"
        assert second.agent_workspace("agent-1") == (tmp_path / "b").resolve() / "workspaces" / "agent-1"
        assert second.agent_workspace("mine") == (tmp_path / "b").resolve() / "workspaces" / "mine"
