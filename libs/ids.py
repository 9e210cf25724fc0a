"""Identifier rules every service and the gateway agree on."""

from __future__ import annotations

import re

# Agent, session, request and principal ids: bounded, path-safe, no leading dot or dash.
ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
# Task, question and attempt ids are uuid4 hex.
UUID_HEX_PATTERN = re.compile(r"^[0-9a-f]{32}$")
