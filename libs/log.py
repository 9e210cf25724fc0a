"""Structured logging: JSON lines when not on a TTY, readable console output on one.

stdlib loggers (grpc, uvicorn) go through the same structlog processors so every
line of a process shares one format.
"""

from __future__ import annotations

import logging
import sys
from typing import Literal

import structlog


def configure_logging(service: str, level: str = "info", fmt: Literal["auto", "json", "console"] = "auto") -> None:
    def add_service(_: object, __: str, event: structlog.types.EventDict) -> structlog.types.EventDict:
        event.setdefault("service", service)
        return event

    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        add_service,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if use_json else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    # structlog's own loggers render and write directly (the fast path: no stdlib
    # LogRecord per line); stdlib loggers (grpc, uvicorn) go through the same
    # processors via ProcessorFormatter, so every line shares one format.
    structlog.configure(
        processors=[
            *shared,
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        logger_factory=structlog.WriteLoggerFactory(file=sys.stderr),
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        cache_logger_on_first_use=True,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            renderer,
        ],
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # httpx logs every request's URL at INFO, and a Bot API URL holds the bot's token.
    for noisy in ("uvicorn.access", "httpx", "httpcore", "telegram"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def get_logger(name: str | None = None) -> structlog.typing.FilteringBoundLogger:
    return structlog.get_logger(name)  # type: ignore[no-any-return]
