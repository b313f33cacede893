"""The daemons' clock (I/O: reads the system clocks): Unix seconds that never step.

A wall-clock step (NTP correcting a drifted clock, a VM resumed, an operator's ``date -s``) must not end a job,
mark a node DOWN ("last heard 3600 s ago") or expire a capture. :class:`SteadyClock` counts elapsed time on
``CLOCK_BOOTTIME`` (Linux: monotonic, never stepped, and unlike ``CLOCK_MONOTONIC`` it counts a suspend, so a
deadline that passed while the machine slept has passed; clock_gettime(2)) from the wall time read once at start.
Its values are Unix seconds (equal to the wall clock until the wall clock steps), so they read as times in logs
and are stored as wall times; every in-memory deadline, "last heard" and expiry is compared on it. Wall time
proper (:meth:`SteadyClock.wall`) is for what leaves the process as a time of day: CloudEvent ``time``,
Alertmanager's ``startsAt``/``endsAt``.

After a restart the new process anchors on the wall clock again; stored deadlines are re-based with a bound
(``core/capture/lifecycle.py`` ``rebase``: the time left bounded by its stage) so a restart never expires a capture
because the wall clock moved meanwhile; the hourly cap's arms are counted from their stored wall times, none later
than now.
"""

from __future__ import annotations

import time
from collections.abc import Callable

_CLOCK = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)  # Linux has it; other systems fall back


def boottime_s() -> float:
    """``CLOCK_BOOTTIME`` in seconds (``CLOCK_MONOTONIC`` where the platform has no BOOTTIME; arbitrary origin)."""
    return time.clock_gettime(_CLOCK)


class SteadyClock:
    """Callable: Unix seconds = wall time at construction + ``CLOCK_BOOTTIME`` elapsed since (module doc).

    Args:
        wall: wall-clock source (Unix seconds); read once here, and by :meth:`wall` / :meth:`step_s`.
        boot: the never-stepping source (seconds, arbitrary origin).
    """

    def __init__(self, wall: Callable[[], float] = time.time, boot: Callable[[], float] = boottime_s) -> None:
        self._wall, self._boot = wall, boot
        self._wall0, self._boot0 = wall(), boot()

    def __call__(self) -> float:
        return self._wall0 + (self._boot() - self._boot0)

    def wall(self) -> float:
        """The wall clock now (for times of day that leave the process)."""
        return self._wall()

    def step_s(self) -> float:
        """How far the wall clock moved against this clock since start (s; + ahead, - behind)."""
        return self._wall() - self()

