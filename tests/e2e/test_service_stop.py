"""A service stopping with its clients' streams open: the scheduler, with the gateway's create
stream and the notifier's event-log watch on it, ends them and exits at once and cleanly."""

from __future__ import annotations

import json
import time

from tests.e2e.conftest import Api
from tests.support.stack import Stack

# The servers' grace (libs.grpc_server.serve): what a stop took while open streams held it.
GRACE_S = 5.0


def test_a_scheduler_stopped_with_its_clients_streams_open_exits_at_once_and_cleanly(stack: Stack, api: Api) -> None:
    """Both streams stay open as long as the gateway and the notifier: the stop ends the create
    stream once it has answered what it read (OK) and the watch UNAVAILABLE (its client
    reconnects), instead of waiting out the grace and cancelling them with an error logged."""
    first = api.wait_state(api.create("before the stop")["taskId"], "completed", "failed", timeout_s=60)
    assert first["state"] == "completed"  # the gateway's create stream is open
    # The notifier's watch is open once the task's ending has reached it through the watch.
    deadline = time.monotonic() + 30
    while first["taskId"] not in stack.procs["notifier"].logs():
        assert time.monotonic() < deadline, "the notifier never saw the task end"
        time.sleep(0.05)
    scheduler = stack.procs["scheduler"]
    seen = len(scheduler.logs())
    began = time.monotonic()
    code = scheduler.stop()
    took = time.monotonic() - began
    try:
        lines = [json.loads(line) for line in scheduler.logs()[seen:].splitlines() if line.startswith("{")]
        assert code == 0
        assert took < GRACE_S - 1, f"the stop took {took:.1f} s: a stream held it to the grace"
        assert not [line for line in lines if line.get("level") == "error"], "an error logged while stopping"
        ended = {(line.get("rpc", "").rsplit("/", 1)[-1], line.get("code")) for line in lines if line["event"] == "rpc"}
        assert ("StreamCreateTasks", "OK") in ended, ended
        assert ("WatchTasks", "UNAVAILABLE") in ended, ended
    finally:
        scheduler.start()
        stack.wait_healthy()
    # The gateway opens a new create stream and the notifier follows the log again.
    after = api.wait_state(api.create("after the stop")["taskId"], "completed", "failed", timeout_s=60)
    assert after["state"] == "completed"
