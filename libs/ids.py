"""Identifier rules every service and the gateway agree on."""

from __future__ import annotations

import itertools
import re
import secrets

# Agent, session, request and principal ids: bounded, path-safe, no leading dot or dash.
ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
# Task, question and attempt ids are uuid4 hex.
UUID_HEX_PATTERN = re.compile(r"^[0-9a-f]{32}$")


_sequence = itertools.count()


def time_ordered_id(now_ms: int) -> str:
    """32 hex characters that sort by creation: milliseconds, a per-process sequence, randomness.

    Queues ordered by id are FIFO even for tasks created within the same millisecond.
    """
    return f"{now_ms & 0xFFFFFFFFFFFF:012x}{next(_sequence) & 0xFFFFFF:06x}{secrets.token_hex(7)}"
