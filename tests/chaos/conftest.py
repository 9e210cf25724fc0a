"""The chaos suite (``make chaos``): every test here carries the ``chaos`` marker, which the
default run (``make test``) deselects."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/chaos/" in str(item.fspath):
            item.add_marker(pytest.mark.chaos)
