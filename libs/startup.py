"""What every process does first: settings (or a clear exit), logging, its database."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Mapping
from pathlib import Path

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
    secure_data_dir(settings.data_dir)
    return settings


def secure_data_dir(data_dir: Path) -> None:
    """Only this uid may read or write what a service keeps: the data directory is
    0700, and everything the process creates from now on (databases, their WAL
    files, logs) is private (umask 077). Files of an older version are tightened too.
    """
    os.umask(0o077)
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(data_dir, 0o700)
    for path in data_dir.iterdir():
        try:
            if path.is_file() and not path.is_symlink():
                os.chmod(path, 0o600)
            elif path.is_dir() and not path.is_symlink():
                os.chmod(path, 0o700)
        except FileNotFoundError:
            pass  # another service's file that just went away (a WAL checkpoint)


async def migrate(db: Database) -> None:
    """Apply the service's pending migrations (off the event loop) and say so."""
    applied = await asyncio.to_thread(db.migrate)
    get_logger("db").info(
        "database_ready", url=db.engine.url.render_as_string(hide_password=True), migrations_applied=applied
    )
