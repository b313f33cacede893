"""Per-rank step-time windows with bounded memory (pure).

Each rank keeps the last ``capacity`` (step, step_time_s) pairs in two typed ring buffers (``array('i')`` for
steps, ``array('f')`` for float32 step times: 8 bytes per step, so 16k ranks x 1000 steps is about 128 MB).
"""

from __future__ import annotations

from array import array


class StepWindow:
    """Ring buffer of one rank's recent steps.

    Args:
        capacity: number of steps kept (oldest dropped first).
    """

    __slots__ = ("capacity", "_steps", "_times", "_n", "_head")

    def __init__(self, capacity: int = 1000) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self._steps = array("i")
        self._times = array("f")
        self._n = 0
        self._head = 0  # next write position once full

    def append(self, step: int, step_time_s: float) -> None:
        """Add one step (steps above 2**31-1 are clamped: windows are for recent timing, not identity)."""
        if step > 2147483647:
            step = 2147483647
        if self._n < self.capacity:
            self._steps.append(step)
            self._times.append(step_time_s)
            self._n += 1
        else:
            h = self._head
            self._steps[h] = step
            self._times[h] = step_time_s
            self._head = (h + 1) % self.capacity

    def __len__(self) -> int:
        return self._n

    def items(self) -> list[tuple[int, float]]:
        """Return ``[(step, step_time_s), ...]`` oldest first."""
        if self._n < self.capacity:
            return list(zip(self._steps, self._times, strict=True))
        h = self._head
        steps = self._steps[h:] + self._steps[:h]
        times = self._times[h:] + self._times[:h]
        return list(zip(steps, times, strict=True))

    def recent_times(self, n: int) -> list[float]:
        """Return up to the last ``n`` step times (seconds), oldest first."""
        items = self.items()
        return [t for _, t in items[-n:]]

    def clear(self) -> None:
        """Forget everything (e.g. after a step counter restart)."""
        self._steps = array("i")
        self._times = array("f")
        self._n = 0
        self._head = 0


def median(values: list[float]) -> float | None:
    """Median of a list (None when empty)."""
    if not values:
        return None
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else 0.5 * (s[mid - 1] + s[mid])
