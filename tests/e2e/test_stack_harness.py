"""The test and benchmark harness's stack: a start that fails leaves nothing running."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.support.stack import make_stack


def test_a_stack_that_fails_to_start_stops_the_services_it_started(tmp_path: Path) -> None:
    stack = make_stack(tmp_path)
    notifier_port = int(stack.env["TASKGATE_NOTIFIER_ADDR"].rpartition(":")[2])
    with socket.socket() as taken:  # someone else listens on the notifier's port
        taken.bind(("127.0.0.1", notifier_port))
        taken.listen()
        with pytest.raises(RuntimeError, match="notifier exited early"):
            stack.start()
    started = {name: proc.proc for name, proc in stack.procs.items()}
    assert {"scheduler", "pending", "telemetry", "notifier"} <= started.keys()
    still_running = [name for name, proc in started.items() if proc is not None and proc.poll() is None]
    assert still_running == [], f"left running after the failed start: {still_running}"
