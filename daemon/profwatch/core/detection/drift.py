"""Slow drift of a job's step time: reported once per threshold it grows, never confused with a sudden change
(pure; no I/O).

The regression detector's baseline follows a steady trend (``daemon/profwatch/core/detection/baseline.py``), so a
drift never moves its change-point statistic; :class:`DriftTracker` compares the level the baseline has reached
with the level it had when first learned and says when it has grown by another ``drift_threshold``.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np


class DriftTracker:
    """The drift of one job's step time since its reference level.

    Args:
        threshold: relative growth between two reports (``drift_threshold``, 0.10 = every 10 % more).

    Notes:
        Reference: the baseline level when it is first learned in a generation (step ``since_step``). When the
        detector re-learns its baseline after a sudden change (or a speed-up), :meth:`suspend` keeps the drift
        reached so far and :meth:`learned` sets the new reference so that the change itself is not counted as
        drift: ``reference = new level / (1 + drift so far)``. A re-learn at a lower level than the one suspended (a
        speed-up) is no drift either, and it takes back the drift it undoes: ``reference = min(reference before,
        new level)``, so the reference is never below a level the job ran at. (Before, the drift so far was carried
        across a fall as across a rise: a healthy job whose host load wandered within 0.95-1.08x, its baseline
        following the small rises and re-learning after the falls, reached a reference of 0.29 s with every
        300-step median at 0.35-0.39 s and reported ``drift`` +12 %, +21 %, +32 % at a slope of 0.)  Total drift = ``level / reference - 1``; a
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
        self.reference_n = 0
        """Values the reference level was estimated from (0 = unknown): its standard error is ``noise / sqrt(n)``."""
        self._carry = 1.0
        self._suspended: tuple[float, float] | None = None  # (reference, level) when the re-learn began

    def suspend(self, level_s: float) -> None:
        """The baseline is about to be re-learned at ``level_s`` (its last level, seconds): keep the drift so far."""
        if self.reference_s is not None and self.reference_s > 0 and level_s > 0:
            self._carry = level_s / self.reference_s
            self._suspended = (self.reference_s, level_s)
        self.reference_s = None

    def learned(self, level_s: float, step: int, n: int = 0) -> None:
        """The baseline is learned (again) at ``level_s`` (seconds) at ``step``, from ``n`` values (0 = unknown)."""
        if self.reference_s is None and level_s > 0:
            before = self._suspended
            if before is not None and level_s < before[1]:  # a fall: it takes back the drift it undoes
                self.reference_s = min(before[0], level_s)
                self._carry = level_s / self.reference_s
            else:
                self.reference_s = level_s / self._carry
            self._suspended = None
            self.reference_n = n
            self.last_step = step
            if self.since_step is None:
                self.since_step = step

    def rebase(self, level_s: float, step: int, n: int = 0) -> None:
        """The level jumped to ``level_s`` (seconds, estimated from ``n`` values; 0 = unknown) at ``step`` and that
        jump is not drift: keep the drift reported so far and take the rest out of the total."""
        if level_s > 0:
            self.reference_s = level_s / (1.0 + self.reports * self.threshold)
            self.reference_n = n
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


RAMP_MIN_AFTER = 8
"""Values a ramp needs after its knee: a sudden change seen for a few steps fits a steep ramp from just before
it as well as a step; a drift has risen for many steps before the change-point test fires."""


def ramp_evidence(rel: np.ndarray) -> tuple[float, int, float]:
    """How much better a ramp than a step explains ``rel`` (1-D, oldest first: relative excess over the baseline's
    line, e.g. ``x / level - 1``), where the ramp starts and how fast it rises: ``(sse_step - sse_ramp, knee,
    slope)`` (slope in ``rel`` units per value).

    Step: one level before and another from some index on (the best split). Ramp: a level, then a straight rise
    from the knee on (``a + b * max(0, i - knee)``, the best knee with at least :data:`RAMP_MIN_AFTER` values
    after it; only rising ramps, ``b > 0``). Both models have three parameters, so their residual sums of squares
    compare directly (divide by the noise variance for a log-likelihood ratio times two, Gaussian noise). Returns
    ``(-inf, -1, 0.0)`` below 8 values or when no rising ramp fits. Cost O(n^2) (n <= a few hundred; run at a fire
    only)."""
    y = np.asarray(rel, dtype=np.float64)
    n = y.size
    if n < 8:
        return -math.inf, -1, 0.0
    c1, c2 = np.cumsum(y), np.cumsum(y * y)
    left = np.arange(1, n)
    ss_left = c2[:-1] - c1[:-1] ** 2 / left
    right = n - left
    s_r, s2_r = c1[-1] - c1[:-1], c2[-1] - c2[:-1]
    sse_step = float(np.min(ss_left + s2_r - s_r**2 / right))
    knees = np.arange(0, n - RAMP_MIN_AFTER)
    fits = _rising_fits(y, np.maximum(0.0, np.arange(n)[None, :] - knees[:, None]))  # (knees, n)
    if fits is None:
        return -math.inf, -1, 0.0
    sse_ramp, slope = fits
    best = int(np.argmin(sse_ramp))
    return sse_step - float(sse_ramp[best]), int(knees[best]), float(slope[best])


def warm_up_sse(rel: np.ndarray, min_knee: int = 2) -> tuple[float, int]:
    """The residual sum of squares of the best *warm-up curve* through ``rel`` (1-D, oldest first) and its knee:
    a straight rise from the first value that then stays flat, ``a + b * min(i, knee)`` with ``b > 0`` and
    ``knee`` from ``min_knee`` to ``n - 1`` (``knee = n - 1``: one straight line, no flat part). Least squares
    for each knee; three parameters (level, slope, knee), as a two-level step's (two levels, split), so the two
    residual sums compare directly. Returns ``(inf, -1)`` below 3 values or when no rising curve fits. A rise
    that saturates (``1 - c e^{-i / tau}``) is close to such a curve; a flat stretch followed by a jump is not
    (the curve must rise from the first value). Cost O(n^2) (n <= a few hundred; run at the end of a first
    learning only). Our own model (piecewise-linear regression with one breakpoint, Hudson 1966, JASA 61:1097,
    the first segment's slope free and the second's 0)."""
    y = np.asarray(rel, dtype=np.float64)
    n = y.size
    if n < 3 or min_knee > n - 1:
        return math.inf, -1
    knees = np.arange(max(1, min_knee), n)
    fits = _rising_fits(y, np.minimum(np.arange(n, dtype=np.float64)[None, :],
                                      knees[:, None].astype(np.float64)))  # (knees, n)
    if fits is None:
        return math.inf, -1
    sse = fits[0]
    best = int(np.argmin(sse))
    return max(0.0, float(sse[best])), int(knees[best])


WARM_UP_NULL_SEED = 31
"""Seed of the simulated series of :func:`warm_up_split_null`: fixed, so a decision depends on its input only."""


def warm_up_split_null(rel: np.ndarray, k_lo: int, k_hi: int, reps: int, quantile: float,
                       min_knee: int = 2) -> float:
    """How much better the best two-level split of ``rel`` (1-D, oldest first; the split's first later index from
    ``k_lo`` to ``k_hi``) explains a series than the best warm-up curve (:func:`warm_up_sse`) does *by chance* when
    the series is that curve: the ``quantile`` of ``sse_curve - sse_split`` over ``reps`` series simulated from the
    curve fitted to ``rel`` (its knee, level and slope) plus Gaussian noise of its residual variance
    (``sse / (n - 3)``), in the units of ``rel``'s residual sums. A parametric bootstrap (Efron and Tibshirani 1993,
    "An Introduction to the Bootstrap", ch. 6) of a comparison of two non-nested models: both fits pick the best of
    tens of candidate break points (split, knee) on the same steps, so their residual sums differ by several noise
    variances on a warm-up at high noise (a rise of about 1-2 noise deviations over tens of steps), more than a
    fixed margin allows. Deterministic (:data:`WARM_UP_NULL_SEED`). Returns 0.0 when no rising curve fits, below 3
    values or when the range of splits is empty. Cost ``reps`` times :func:`warm_up_sse` (O(reps n^2))."""
    y = np.asarray(rel, dtype=np.float64)
    n = y.size
    lo, hi = max(1, k_lo), min(n - 1, k_hi)
    sse, knee = warm_up_sse(y, min_knee)
    if n < 4 or knee < 0 or hi < lo or reps < 1:
        return 0.0
    h = np.minimum(np.arange(n, dtype=np.float64), float(knee))
    b, a = np.polyfit(h, y, 1)
    curve = a + b * h
    sigma = math.sqrt(max(0.0, sse) / (n - 3))
    rng = np.random.default_rng(WARM_UP_NULL_SEED)
    sims = curve[None, :] + sigma * rng.standard_normal((reps, n))
    c1, c2 = np.cumsum(sims, axis=1), np.cumsum(sims * sims, axis=1)
    ks = np.arange(lo, hi + 1)
    left = ks.astype(np.float64)
    s1, s2 = c1[:, ks - 1], c2[:, ks - 1]
    t1, t2 = c1[:, -1:], c2[:, -1:]
    split = np.min(s2 - s1**2 / left + (t2 - s2) - (t1 - s1) ** 2 / (n - left), axis=1)
    gains = np.array([warm_up_sse(sims[r], min_knee)[0] for r in range(reps)]) - split
    gains = gains[np.isfinite(gains)]
    return float(np.quantile(gains, quantile)) if gains.size else 0.0


class StepOnCurve(NamedTuple):
    """The best warm-up curve with a level step on its plateau (:func:`warm_up_step`); ``rel`` units throughout."""

    gain: float
    """The curve's residual sum of squares less the stepped curve's (>= 0)."""
    sse: float
    """The stepped curve's residual sum of squares (>= 0)."""
    knee: int
    """Where the curve's line ends and its plateau begins (an index)."""
    k: int
    """The step's first index (``>= knee``)."""
    plateau: float
    """The fitted level just before the step."""
    step: float
    """The step's height (> 0: a rise)."""
    slope: float
    """The line's slope per value (> 0: a warm-up that rose, < 0: one that fell)."""
    step_se: float
    """The step's standard error per unit of noise: ``1 / sqrt(r.r)``, ``r`` the step's indicator with the curve's
    regressors partialled out."""


def warm_up_step(rel: np.ndarray, min_after: int, min_knee: int = 2) -> StepOnCurve | None:
    """The best *warm-up curve with a level step on its plateau* through ``rel`` (1-D, oldest first): a straight
    line from the first value (rising or falling) to a knee, flat from there, and a step of height ``c`` from index
    ``k >= knee`` on (``a + b * min(i, knee) + c * [i >= k]``, at least ``min_after`` values from ``k``), against
    the same curve without the step (the knee from ``min_knee`` to ``n - 1``, either slope sign). Returns
    a :class:`StepOnCurve` (the best pair's fit and its gain over the best curve without a step); None below
    ``min_after + 3`` values. Least squares for each (knee, k) pair by partialling the step's indicator out of
    ``[1, min(i, knee)]`` (Frisch-Waugh-Lovell); cost O(n^2) (n <= a few hundred; run at the end of a first learning
    only). Our own model: Hudson's one-breakpoint regression (1966, JASA 61:1097) with a level shift added."""
    y = np.asarray(rel, dtype=np.float64)
    n = y.size
    if n < min_after + 3 or min_knee > n - 1:
        return None
    idx = np.arange(n, dtype=np.float64)
    best_curve = math.inf
    best: tuple[float, StepOnCurve] | None = None
    for knee in range(max(1, min_knee), n):
        h = np.minimum(idx, float(knee))
        hc = h - h.mean()
        shh = float(hc @ hc)
        if shh <= 0.0:
            continue
        yc = y - y.mean()
        b0 = float(hc @ yc) / shh
        ry = yc - b0 * hc  # y with [1, h] partialled out
        best_curve = min(best_curve, float(ry @ ry))
        ks = np.arange(knee, n - min_after + 1)
        if ks.size == 0:
            continue
        s = (idx[None, :] >= ks[:, None]).astype(np.float64)  # (ks, n) step indicators
        sc = s - s.mean(axis=1, keepdims=True)
        rs = sc - np.outer(sc @ hc / shh, hc)
        srr = np.einsum("ij,ij->i", rs, rs)
        ok = srr > 1e-12
        if not ok.any():
            continue
        srs = rs @ ry
        red = np.where(ok, srs**2 / np.where(ok, srr, 1.0), -np.inf)
        j = int(np.argmax(red))
        c = float(srs[j] / srr[j])
        sse = float(ry @ ry) - float(red[j])
        if best is None or sse < best[0]:
            # the plateau before the step: a + b * knee with a, b fitted together with the step
            b = b0 - c * float(sc[j] @ hc) / shh
            a = float(y.mean()) - b * float(h.mean()) - c * float(s[j].mean())
            best = (sse, StepOnCurve(0.0, max(0.0, sse), knee, int(ks[j]), a + b * knee, c, b, 1.0 / math.sqrt(float(srr[j]))))
    if best is None or not math.isfinite(best_curve):
        return None
    sse, fit = best
    return fit._replace(gain=max(0.0, best_curve - max(0.0, sse)))


def _rising_fits(y: np.ndarray, h: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Least squares of ``y`` (n values) on each row of ``h`` (k rows of n regressor values: one hinge per knee),
    ``y ~ a + b * h_k``: ``(sse, b)``, each of k values, with ``sse`` +inf where the fit does not rise (``b <= 0``)
    or ``h_k`` is constant; None when no row rises. Shared by :func:`ramp_evidence` and :func:`warm_up_sse`."""
    hc = h - h.mean(axis=1, keepdims=True)
    yc = y - y.mean()
    shy = hc @ yc
    shh = np.einsum("ij,ij->i", hc, hc)
    ok = (shh > 0) & (shy > 0)
    if not ok.any():
        return None
    safe = np.where(shh > 0, shh, 1.0)
    return float(yc @ yc) - np.where(ok, shy**2 / safe, -np.inf), shy / safe


def trend_z(values: np.ndarray) -> float:
    """Mann-Kendall trend statistic of ``values`` (1-D, oldest first) in standard deviations of its null
    distribution: ``S / sqrt(n (n - 1) (2n + 5) / 18)`` with ``S`` the sum over pairs ``i < j`` of
    ``sign(x_j - x_i)`` (Mann 1945, Econometrica 13:245; Kendall 1975, "Rank Correlation Methods"; no correction for
    ties, which continuous step times do not have). Positive: the values rise. Rank-based, so a few spikes move it
    by at most a few pairs each, and it does not assume a line: a rise that then stays flat is a rise too. About
    N(0, 1) for independent, identically distributed values from n of about 10 on. Returns 0.0 below 3 values.
    Cost O(n^2) (n <= a few hundred; run at the end of a first learning only)."""
    y = np.asarray(values, dtype=np.float64)
    n = y.size
    if n < 3:
        return 0.0
    i, j = np.triu_indices(n, 1)
    s = float(np.sign(y[j] - y[i]).sum())
    return s / math.sqrt(n * (n - 1) * (2 * n + 5) / 18.0)


def _falling_fit(y: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """Least-squares non-increasing fit of ``y`` (oldest first) by pool-adjacent-violators (Ayer et al., Ann. Math.
    Statist. 26:641, 1955; Barlow et al., "Statistical inference under order restrictions", 1972): the fitted
    blocks' means and sizes (oldest first) and the residual sum of squares. ``y`` non-empty, finite."""
    means: list[float] = []
    sizes: list[int] = []
    for v in y.tolist():
        m, n = float(v), 1
        while means and means[-1] < m:  # an increase violates the order: pool it with the block before
            pm, pn = means.pop(), sizes.pop()
            m, n = (pm * pn + m * n) / (pn + n), pn + n
        means.append(m)
        sizes.append(n)
    mean_arr = np.asarray(means, dtype=np.float64)
    size_arr = np.asarray(sizes, dtype=np.int64)
    fit = np.repeat(mean_arr, size_arr)
    return mean_arr, size_arr, float(np.sum((y - fit) ** 2))


class RiseOnFall(NamedTuple):
    """A jump up inside a falling series (:func:`rise_on_fall`). ``k``: the index where the later part begins;
    ``gain``: how much better two falling parts explain the series than one (residual sum, in the series' units
    squared); ``jump``: the later part's first fitted level minus the earlier part's last one (in the series'
    units, > 0); ``n_before`` / ``n_after``: the sizes of those two fitted blocks (a jump's standard error is
    ``noise * sqrt(1 / n_before + 1 / n_after)``); ``fall``: the earlier part's fitted drop, first block to last
    (>= 0); ``before``: the earlier part's last fitted level."""

    k: int
    gain: float
    jump: float
    n_before: int
    n_after: int
    fall: float
    before: float


def rise_on_fall(logs: np.ndarray, k_lo: int, k_hi: int) -> RiseOnFall | None:
    """The best single jump up in a series that otherwise only falls (``logs``: log step times, oldest first): for
    each split ``k_lo <= k <= k_hi`` the series is fitted by one non-increasing curve and by two, one each side of
    ``k`` (:func:`_falling_fit`, isotonic regression; no shape assumed, so a linear, exponential or stepped
    warm-down fits alike), and the split with the largest reduction of the residual sum that jumps up at ``k`` is
    returned; None when no split in range jumps up or the range is empty. A warm-down with a change during it (a
    1.3x job-wide slowdown 2-30 steps into a 2x -> 1x fall) is one such jump; a healthy warm-down is one falling
    curve, where a split gains only by chance (for Gaussian noise the isotonic fit's gain over a level grows like
    the harmonic sum, ~ln n noise variances; the split's gain is bounded in :data:`~profwatch.core.detection.
    regression.FALL_JUMP_EVIDENCE` noise variances by its caller). Bounds: ``gain >= 0``, ``jump > 0``,
    ``1 <= n_before <= k``, ``1 <= n_after <= len(logs) - k``. Pure; O(n^2) for n values (called once per
    learning, n <= 128)."""
    n = logs.size
    k_lo, k_hi = max(1, k_lo), min(n - 1, k_hi)
    if k_lo > k_hi or not np.all(np.isfinite(logs)):
        return None
    whole = _falling_fit(logs)[2]
    best: RiseOnFall | None = None
    for k in range(k_lo, k_hi + 1):
        bm, bs, b_sse = _falling_fit(logs[:k])
        am, as_, a_sse = _falling_fit(logs[k:])
        jump = float(am[0] - bm[-1])
        gain = max(0.0, whole - b_sse - a_sse)
        if jump > 0.0 and (best is None or gain > best.gain):
            best = RiseOnFall(k, gain, jump, int(bs[-1]), int(as_[0]), float(bm[0] - bm[-1]), float(bm[-1]))
    return best
