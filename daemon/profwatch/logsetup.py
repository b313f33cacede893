"""structlog configuration for the daemons: JSON lines on stderr (I/O setup; called once from cli.py).

Under systemd, when stderr *is* the journal (``$JOURNAL_STREAM`` names stderr's device and inode: systemd.exec(5),
"$JOURNAL_STREAM"), every line starts with its syslog priority, ``<3>`` error, ``<4>`` warning, ``<6>`` info,
``<7>`` debug (sd-daemon(3), "SD_ERR" ... prefixes, which journald strips and stores as ``PRIORITY``), so
``journalctl -p warning`` finds the warnings. Anywhere else the lines stay clean JSON.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

import structlog

SYSLOG_PRIORITY = {"critical": 2, "exception": 3, "error": 3, "warning": 4, "warn": 4, "info": 6, "debug": 7}
"""structlog/stdlib level name -> syslog priority (RFC 5424 section 6.2.1 severities)."""


def priority_prefix(level: str) -> str:
    """``<N>`` for a level name (unknown levels: ``<6>``, info)."""
    return f"<{SYSLOG_PRIORITY.get(level.lower(), 6)}>"


def stderr_is_journal(environ: Mapping[str, str], stderr_fd: int = 2) -> bool:
    """True when ``$JOURNAL_STREAM`` (``<device>:<inode>``, decimal) is the file stderr is connected to."""
    value = environ.get("JOURNAL_STREAM", "")
    dev, _, ino = value.partition(":")
    if not (dev.isdigit() and ino.isdigit()):
        return False
    try:
        st = os.fstat(stderr_fd)
    except OSError:
        return False
    return st.st_dev == int(dev) and st.st_ino == int(ino)


class _PriorityRenderer:
    """Wrap a structlog renderer: the rendered line gets the priority prefix of its level."""

    def __init__(self, renderer: Callable[..., Any]) -> None:
        self.renderer = renderer

    def __call__(self, logger: Any, name: str, event_dict: Any) -> Any:
        level = str(event_dict.get("level", name))
        return priority_prefix(level) + str(self.renderer(logger, name, event_dict))


class _PriorityFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return priority_prefix(record.levelname) + super().format(record)


def configure_logging(level: str = "INFO", fmt: str = "json", environ: Mapping[str, str] | None = None) -> None:
    """Configure structlog + stdlib logging. ``fmt`` is ``json`` (default, for journald) or ``console``; priority
    prefixes when :func:`stderr_is_journal` (``environ`` defaults to ``os.environ``)."""
    lvl = getattr(logging, level.upper(), logging.INFO)
    fd = sys.stderr.fileno() if _has_fd(sys.stderr) else -1
    journal = stderr_is_journal(os.environ if environ is None else environ, fd)
    logging.basicConfig(stream=sys.stderr, level=lvl, format="%(message)s")
    if journal:
        for h in logging.getLogger().handlers:
            h.setFormatter(_PriorityFormatter("%(message)s"))
    renderer: Callable[..., Any] = (structlog.processors.JSONRenderer() if fmt == "json"
                                    else structlog.dev.ConsoleRenderer(colors=False))
    if journal:
        renderer = _PriorityRenderer(renderer)
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


def _has_fd(stream: Any) -> bool:
    try:
        stream.fileno()
    except (OSError, ValueError, AttributeError):  # pytest's capture, click's runner: no real descriptor
        return False
    return True


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
