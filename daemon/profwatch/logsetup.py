"""structlog configuration for the daemons: JSON lines on stderr (I/O setup; called once from cli.py)."""

from __future__ import annotations

import logging
import sys
import time

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
    """Log one line per ``kind`` (e.g. per rejection reason); later ones are only counted.

    Bounded: at most ``max_kinds`` kinds are remembered (kinds may carry peer-chosen values, e.g. a claimed
    world size). Once full, a new kind gets a line at most once per ``overflow_interval_s`` (monotonic clock),
    so a peer cycling through values cannot grow memory or the log without bound.
    """

    def __init__(self, max_kinds: int = 4096, overflow_interval_s: float = 60.0) -> None:
        self._seen: set[str] = set()
        self.max_kinds = max_kinds
        self.overflow_interval_s = overflow_interval_s
        self._next_overflow_line = 0.0
        self.suppressed = 0  # new kinds not logged because the set was full

    def first(self, kind: str) -> bool:
        """True the first time ``kind`` is seen (while fewer than ``max_kinds`` are remembered), else at most once
        per ``overflow_interval_s`` for kinds beyond the bound."""
        if kind in self._seen:
            return False
        if len(self._seen) < self.max_kinds:
            self._seen.add(kind)
            return True
        now = time.monotonic()
        if now >= self._next_overflow_line:
            self._next_overflow_line = now + self.overflow_interval_s
            return True
        self.suppressed += 1
        return False
