"""[notifier] and [channels] settings: defaults, environment overrides, validation."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from libs.settings import SettingsError, load_settings


def write(tmp_path: Path, body: str) -> dict[str, str]:
    config = tmp_path / "taskgate.toml"
    config.write_text(body)
    return {"TASKGATE_CONFIG": str(config)}


def test_defaults_match_the_design(tmp_path: Path) -> None:
    s = load_settings(write(tmp_path, ""))
    assert (s.notifier.sse_heartbeat_ms, s.notifier.retry_initial_ms, s.notifier.retry_max_ms) == (
        15_000,
        5_000,
        300_000,
    )
    assert s.channels == {} and s.agent("x").channel is None


def test_channels_and_overrides(tmp_path: Path) -> None:
    env = write(
        tmp_path,
        '[notifier]\nretry_initial_ms = 300\n[channels.chat]\nkind = "webhook"\nurl = "http://127.0.0.1:9/h"\n'
        'secret = "0123456789abcdef"\n[agents.a1]\nchannel = "chat"\n',
    )
    env |= {"TASKGATE_NOTIFIER_SSE_HEARTBEAT_MS": "250", "TASKGATE_NOTIFIER_ADDR": "127.0.0.1:6000"}
    s = load_settings(env)
    assert s.notifier.retry_initial_ms == 300 and s.notifier.sse_heartbeat_ms == 250
    assert s.notifier_addr == "127.0.0.1:6000"  # still the top-level address, not a [notifier] field
    assert s.agent("a1").channel == "chat" and s.channels["chat"].url == "http://127.0.0.1:9/h"


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ('[agents.a1]\nchannel = "nope"\n', "not a [channels] entry"),
        ('[channels.c]\nkind = "sms"\nurl = "http://x"\nsecret = "0123456789abcdef"\n', "kind"),
        ('[channels.c]\nkind = "webhook"\nurl = "ftp://x"\nsecret = "0123456789abcdef"\n', "http"),
        ('[channels.c]\nkind = "webhook"\nurl = "http://x"\nsecret = "short"\n', "secret"),
        ("[notifier]\nretry_initial_ms = 0\n", "retry_initial_ms"),
    ],
)
def test_bad_notifier_settings_are_named(tmp_path: Path, body: str, problem: str) -> None:
    with pytest.raises(SettingsError, match=re.escape(problem)):
        load_settings(write(tmp_path, body))
