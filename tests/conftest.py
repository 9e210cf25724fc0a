"""Fixtures shared by the whole suite."""

from tests.support.postgres import postgres_url  # noqa: F401  (one throwaway cluster per session)
