"""structlog configuration for the daemons: JSON lines on stderr (I/O setup; called once from cli.py)."""

from __future__ import annotations

import logging
import sys

import structlog


def configure_logging(level: str = "INFO", fmt: str = "json") -> None:
    """Configure structlog + stdlib logging. ``fmt`` is ``json`` (default, for journald) or ``console``."""
    lvl = getattr(logging, level.upper(), logging.INFO)
    logging.basicConfig(stream=sys.stderr, level=lvl, format="%(message)s")
    renderer = structlog.processors.JSONRenderer() if fmt == "json" else structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        # not cached: the daemons log rarely (never per message), and an uncached logger follows a later
        # structlog.configure (tests capture logs after an in-process command has configured logging)
        cache_logger_on_first_use=False,
    )


class OncePerKind:
    """Log one line per ``kind`` (e.g. per rejection reason); later ones are only counted."""

    def __init__(self) -> None:
        self._seen: set[str] = set()

    def first(self, kind: str) -> bool:
        """True the first time ``kind`` is seen."""
        if kind in self._seen:
            return False
        self._seen.add(kind)
        return True
