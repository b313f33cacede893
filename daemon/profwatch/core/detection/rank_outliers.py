"""Rank-outlier detection: ranks consistently slower than their peers in a compared stage (pure).

Implements the ``StepDetector`` Protocol of ``daemon/profwatch/core/detection/types.py``.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from profwatch.core.detection.settings import DetectionSettings
from profwatch.core.detection.types import MAD_TO_SIGMA, Anomaly, FinalizedStep

NUMPY_MIN_RANKS = 256
"""Below this many ranks the per-step cross-rank comparison runs in pure Python (cheaper than numpy)."""


def median_mad(xs: list[float]) -> tuple[float, float]:
    """Median and MAD (median absolute deviation) of a non-empty list (pure Python; cheap below ~100 values)."""
    s = sorted(xs)
    n = len(s)
    med = s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])
    d = sorted(abs(x - med) for x in s)
    mad = d[n // 2] if n % 2 else 0.5 * (d[n // 2 - 1] + d[n // 2])
    return med, mad


def outlying_ranks(arr: list[float], s: DetectionSettings) -> list[tuple[int, float]]:
    """Ranks whose value is outlying above the peer median: ``[(rank, relative excess)]``.

    ``arr`` has one entry per rank (seconds; NaN = not reported). Rule in :class:`RankOutlierDetector` Notes.
    """
    if len(arr) < NUMPY_MIN_RANKS:
        present = [v for v in arr if not math.isnan(v)]
        if len(present) < s.outlier_min_ranks:
            return []
        m, mad = median_mad(present)
        if m <= 0:
            return []
        thr = max(s.outlier_z * max(MAD_TO_SIGMA * mad, s.noise_floor * m), s.outlier_min_effect * m,
                  s.outlier_min_abs_s)
        return [(r, (v - m) / m) for r, v in enumerate(arr) if v - m >= thr]
    a = np.asarray(arr, dtype=np.float64)
    v = a[~np.isnan(a)]
    if v.size < s.outlier_min_ranks:
        return []
    m = float(np.median(v))
    if m <= 0:
        return []
    mad = float(np.median(np.abs(v - m)))
    thr = max(s.outlier_z * max(MAD_TO_SIGMA * mad, s.noise_floor * m), s.outlier_min_effect * m, s.outlier_min_abs_s)
    with np.errstate(invalid="ignore"):
        idx = np.flatnonzero(a - m >= thr)
    return [(int(r), (float(a[r]) - m) / m) for r in idx.tolist()]


class RankOutlierDetector:
    """Names ranks that are slower than their peers in most of the recent steps.

    Args:
        job_id: copied into every :class:`Anomaly`.
        world_size: ranks of the job.
        settings: the ``outlier_*`` thresholds and ``noise_floor``.

    Notes:
        Algorithm: per non-excluded finalised step and per compared stage (``outlier_stages``; plus
        ``step_time_s`` when ``outlier_on_step_time``), peer median m and MAD over the ranks that reported it
        (at least ``outlier_min_ranks``). A rank is outlying in that step when
        ``(v - m) / max(1.4826 * MAD, noise_floor * m) >= outlier_z`` and ``v >= m * (1 + outlier_min_effect)``
        and ``v - m >= outlier_min_abs_s``. A rank outlying in ``outlier_min_steps`` of the last
        ``outlier_window_steps`` non-excluded steps fires one ``rank_outlier`` (ranks firing at the same step
        are grouped); it may fire again only after its count fell below half of ``outlier_min_steps``.

        Assumptions: only *slower* is tested, so ranks that wait longer at a barrier because a peer is slow are
        not named (their compute stage is normal; a pure wait stage is shorter on the slow rank); leave pure
        wait stages out of ``outlier_stages``. Job-wide events (GC pauses, checkpoints on every rank) raise the
        peer median with every rank and are not outliers; a one-step stall of one rank (a data loader hiccup)
        counts one step of ``outlier_min_steps``.

        Source: peer-relative per-rank scores as in NVIDIA Resiliency Extension's straggler detection
        (``nvidia-resiliency-ext``, relative section scores) and MegaScale's per-rank timers (Jiang et al.,
        NSDI'24); HolisticTraceAnalysis ranks slow ranks by the wait they cause, not by duration.
        Median/MAD scale: Rousseeuw & Croux 1993.

        Cost: O(world_size) per compared stage per step (numpy from 256 ranks), O(1) window upkeep per rank hit.
    """

    def __init__(self, job_id: str, world_size: int, settings: DetectionSettings) -> None:
        self.job_id = job_id
        self.world_size = world_size
        self.settings = settings
        self.reset()

    def reset(self) -> None:
        """Forget the window (restart, or a new window size)."""
        n = self.world_size
        self._hits: list[int] = [0] * n
        self._excess_sum: list[float] = [0.0] * n
        self._ring: deque[list[tuple[int, float]]] = deque()
        self._reported: set[int] = set()
        self._stage: dict[int, str] = {}

    @property
    def reported_ranks(self) -> frozenset[int]:
        """Ranks reported and not cleared yet (their count has not fallen below half of ``outlier_min_steps``):
        the episode layer's sign that a rank-outlier episode still holds."""
        return frozenset(self._reported)

    def update_settings(self, settings: DetectionSettings) -> None:
        """Swap thresholds; the window restarts when its size or the firing count changes."""
        old, self.settings = self.settings, settings
        if (settings.outlier_window_steps, settings.outlier_min_steps) != (old.outlier_window_steps,
                                                                            old.outlier_min_steps):
            self.reset()

    def on_step(self, step: FinalizedStep) -> list[Anomaly]:
        """Compare the ranks of one finalised step; return a ``rank_outlier`` when a rank's window fills."""
        if step.excluded is not None or not step.stages:
            return []
        best: dict[int, tuple[float, str]] = {}
        for name, arr in step.stages.items():
            for r, rel in outlying_ranks(arr, self.settings):
                if r not in best or rel > best[r][0]:
                    best[r] = (rel, name)
        a = self._window(step.step, best)
        return [a] if a is not None else []

    def _window(self, step: int, flagged: dict[int, tuple[float, str]]) -> Anomaly | None:
        s = self.settings
        hits, excess_sum = self._hits, self._excess_sum
        for r, (rel, name) in flagged.items():
            hits[r] += 1
            excess_sum[r] += rel
            self._stage[r] = name
        self._ring.append([(r, rel) for r, (rel, _) in flagged.items()])
        if len(self._ring) > s.outlier_window_steps:
            for r, rel in self._ring.popleft():
                hits[r] -= 1
                excess_sum[r] -= rel
                if hits[r] == 0:
                    self._stage.pop(r, None)
        if self._reported:
            for r in [r for r in self._reported if hits[r] * 2 < s.outlier_min_steps]:
                self._reported.discard(r)
        new = sorted(r for r in flagged if hits[r] >= s.outlier_min_steps and r not in self._reported)
        if not new:
            return None
        self._reported.update(new)
        per_rank = {r: excess_sum[r] / hits[r] for r in new}
        detail = {"window_steps": len(self._ring), "outlying_steps": {r: hits[r] for r in new},
                  "excess": per_rank, "stage": {r: self._stage.get(r, "") for r in new}}
        return Anomaly("rank_outlier", self.job_id, step, tuple(new), max(per_rank.values()), detail)
