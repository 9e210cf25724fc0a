"""What every process does first: settings (or a clear exit), logging, its database."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Mapping

from libs.db import Database
from libs.log import configure_logging, get_logger
from libs.settings import Settings, SettingsError, load_settings


def boot(service: str, environ: Mapping[str, str]) -> Settings:
    """Validated settings with logging configured; exits naming each bad setting otherwise."""
    try:
        settings = load_settings(environ)
    except SettingsError as exc:
        sys.exit(f"{service}: {exc}")
    configure_logging(service, settings.log_level, settings.log_format)
    return settings


async def migrate(db: Database) -> None:
    """Apply the service's pending migrations (off the event loop) and say so."""
    applied = await asyncio.to_thread(db.migrate)
    get_logger("db").info(
        "database_ready", url=db.engine.url.render_as_string(hide_password=True), migrations_applied=applied
    )
