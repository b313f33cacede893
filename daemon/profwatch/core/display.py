"""Show file names and other OS-given text on any terminal and in JSON, whatever the locale (pure).

POSIX file names are bytes. Python hands them over as str decoded with the file system encoding and the
``surrogateescape`` handler: a byte that does not decode becomes a lone surrogate (U+DC80..U+DCFF). Under a C /
POSIX locale without UTF-8 mode (``PYTHONUTF8=0``) the file system encoding is ASCII, so *every* non-ASCII byte
arrives that way; under a UTF-8 locale only invalid UTF-8 does. Such a str cannot be encoded for output or
for JSON-as-UTF-8, which is how ``scan`` and ``analyze`` crashed with UnicodeEncodeError. See docs/paths.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any


def display_str(text: str) -> str:
    """``text`` with the original bytes of its surrogate escapes restored and decoded as UTF-8; bytes that are not
    UTF-8 are shown as ``\\xNN`` escapes. Text without surrogates is returned unchanged.

    Examples: ``"bad_\\udcff"`` -> ``"bad_\\\\xff"``; ``"\\udcd0\\udcb4"`` (UTF-8 of "д" read under an ASCII
    locale) -> ``"д"``; ``"µs"`` -> ``"µs"``. Never raises.
    """
    if text.isascii() or not any("\ud800" <= ch <= "\udfff" for ch in text):
        return text
    try:
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate that is not an escaped byte (e.g. from JSON): escape it as is
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return raw.decode("utf-8", "backslashreplace")


def printable(value: Any) -> Any:
    """``value`` (JSON-like: dicts, lists, tuples, str, numbers) with every str, keys included, passed through
    :func:`display_str`, ready for ``json.dumps`` or a terminal. Other objects are returned as they are."""
    if isinstance(value, str):
        return display_str(value)
    if isinstance(value, Mapping):
        return {printable(k): printable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [printable(v) for v in value]
    return value


def clip(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters for one terminal line: unchanged when it fits, else cut at the last
    space that keeps at least half of the width (a path or a word with no space in reach is cut where it must be)
    and ended with ``…``. ``width`` below 2 is taken as 2. Never raises.

    Examples: ``clip("slow_rank failed: returncode 1", 20)`` -> ``"slow_rank failed:…"``;
    ``clip("/a/very/long/path/without/spaces", 12)`` -> ``"/a/very/lon…"``.
    """
    width = max(2, width)
    if len(text) <= width:
        return text
    cut = text.rfind(" ", 0, width)  # the text before the space and "…" fit in width
    head = text[:cut] if cut >= width // 2 else text[: width - 1]
    return head.rstrip() + "…"


def span_text(seconds: float) -> str:
    """``seconds`` (>= 0) as a person reads it: ``42s``, ``7m05s``, ``2h04m``; ``?`` for a value that is not a
    finite number (a deadline restored from a damaged state db)."""
    if not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
        return "?"
    s = round(seconds)
    if s < 100:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def when_text(unix_s: Any, now: float) -> str:
    """A recorded wall-clock time (seconds since the epoch) as a person reads it: ``2026-12-07 14:03:05 UTC (5m02s
    ago)`` against ``now``; ``never`` for None (or not a finite number); the raw number for one no date can show (a
    damaged record)."""
    if not isinstance(unix_s, (int, float)) or not math.isfinite(unix_s):
        return "never"
    try:
        stamp = datetime.fromtimestamp(float(unix_s), tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError):  # a damaged record: no date this far from now
        return f"at unix time {unix_s!r} (not a date)"
    return f"{stamp} ({span_text(max(0.0, now - float(unix_s)))} ago)"
