"""The Bot API stand-in (tests/support/botapi.py): a client that hung up is no error of its own."""

from __future__ import annotations

import pytest

from tests.support.botapi import _BotApiServer, start_bot_api


def test_a_client_gone_before_its_answer_prints_nothing_but_other_errors_do(capsys: pytest.CaptureFixture[str]) -> None:
    """The notifier gives up its long poll when it stops, and the stand-in's answer then meets
    a closed socket: that must not print a traceback into the test run's output. A fault of the
    stand-in itself still does."""
    api = start_bot_api()
    # The stand-in's own server: its handle_error takes any request (none is read here).
    assert isinstance(api.server, _BotApiServer)
    try:
        for gone in (BrokenPipeError(32, "Broken pipe"), ConnectionResetError(104, "Connection reset by peer")):
            try:
                raise gone
            except ConnectionError:
                api.server.handle_error(None, ("127.0.0.1", 1))
        assert capsys.readouterr().err == ""
        try:
            raise ValueError("a bug in the stand-in")
        except ValueError:
            api.server.handle_error(None, ("127.0.0.1", 1))
        assert "ValueError: a bug in the stand-in" in capsys.readouterr().err
    finally:
        api.server.shutdown()
