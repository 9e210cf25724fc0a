"""Waiting in async tests for something another task does, with a generous bound."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def until(condition: Callable[[], object], timeout_s: float = 10.0) -> None:
    """Return once ``condition()`` is true; fail after ``timeout_s`` (generous: loaded machines)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached within {timeout_s} s")
        await asyncio.sleep(0.001)
