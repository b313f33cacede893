"""The daemons' clock for "how long since" (deadlines, last heard, stall checks): one function, so every in-memory
duration is measured on the same clock.

``CLOCK_BOOTTIME`` (Linux, ``clock_gettime(2)``): monotonic (an NTP step or ``date -s`` never moves it, so a
wall-clock jump can neither fake nor hide a silence) and, unlike ``CLOCK_MONOTONIC``, it counts the time the machine
was suspended (a VM paused for an hour has been silent for an hour). Wall time (``time.time()``) is only for what is
shown or stored.
"""

from __future__ import annotations

import time

__all__ = ["monotonic_s"]

_CLOCK = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)  # Linux has it; other systems fall back


def monotonic_s() -> float:
    """Seconds on ``CLOCK_BOOTTIME`` (arbitrary origin: compare two readings, never store one)."""
    return time.clock_gettime(_CLOCK)
