"""Slow drift of a job's step time: reported once per threshold it grows, never confused with a sudden change
(pure; no I/O).

The regression detector's baseline follows a steady trend (``daemon/profwatch/core/detection/baseline.py``), so a
drift never moves its change-point statistic; :class:`DriftTracker` compares the level the baseline has reached
with the level it had when first learned and says when it has grown by another ``drift_threshold``.
"""

from __future__ import annotations

import math
from typing import Any


class DriftTracker:
    """The drift of one job's step time since its reference level.

    Args:
        threshold: relative growth between two reports (``drift_threshold``, 0.10 = every 10 % more).

    Notes:
        Reference: the baseline level when it is first learned in a generation (step ``since_step``). When the
        detector re-learns its baseline after a sudden change (or a speed-up), :meth:`suspend` keeps the drift
        reached so far and :meth:`learned` sets the new reference so that the change itself is not counted as
        drift: ``reference = new level / (1 + drift so far)``. Total drift = ``level / reference - 1``; a
        ``drift`` is reported when it reaches ``(k + 1) * threshold`` with k the reports so far (so at most one
        report per threshold grown; k never goes down, so a level that wavers around a threshold, or falls back and
        rises again, is not reported twice). Slope: the baseline's trend (Theil-Sen) relative to the reference, per step and per hour at the
        current step time.
    """

    def __init__(self, threshold: float) -> None:
        if not threshold > 0:
            raise ValueError(f"drift threshold must be > 0, got {threshold}")
        self.threshold = threshold
        self.reset()

    def reset(self) -> None:
        """Forget the reference (a new generation)."""
        self.reference_s: float | None = None
        self.since_step: int | None = None
        self.reports = 0
        self.last_step: int | None = None
        self._carry = 1.0

    def suspend(self, level_s: float) -> None:
        """The baseline is about to be re-learned at ``level_s`` (its last level, seconds): keep the drift so far."""
        if self.reference_s is not None and self.reference_s > 0 and level_s > 0:
            self._carry = level_s / self.reference_s
        self.reference_s = None

    def learned(self, level_s: float, step: int) -> None:
        """The baseline is learned (again) at ``level_s`` (seconds) at ``step``."""
        if self.reference_s is None and level_s > 0:
            self.reference_s = level_s / self._carry
            self.last_step = step
            if self.since_step is None:
                self.since_step = step

    def rebase(self, level_s: float, step: int) -> None:
        """The level jumped to ``level_s`` (seconds) at ``step`` and that jump is not drift: keep the drift reported
        so far and take the rest out of the total."""
        if level_s > 0:
            self.reference_s = level_s / (1.0 + self.reports * self.threshold)
            self.last_step = step

    def observe(self, level_s: float, slope_s_per_step: float, step_time_s: float,
                step: int | None = None) -> dict[str, Any] | None:
        """Check the level (seconds) against the reference; return the ``drift`` detail when it grew by another
        threshold, else None. ``slope_s_per_step``: the baseline's trend (seconds per step)."""
        ref = self.reference_s
        if ref is None or ref <= 0:
            return None
        total = level_s / ref - 1.0
        k = self.reports
        if total >= (k + 1) * self.threshold:
            self.reports = int(math.floor(total / self.threshold + 1e-9))
            if step is not None:
                self.last_step = step
            slope = slope_s_per_step / ref
            per_hour = slope * 3600.0 / step_time_s if step_time_s > 0 else None
            return {"pattern": "drift", "total": round(total, 6), "slope_per_step": slope,
                    "slope_per_hour": per_hour, "reference_s": ref, "step_time_s": level_s,
                    "since_step": self.since_step, "threshold": round(self.reports * self.threshold, 6),
                    "reports": self.reports}
        return None
