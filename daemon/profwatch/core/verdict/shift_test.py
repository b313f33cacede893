"""Did a component's time per step change between two captures? One-sided two-sample tests with Holm's correction
(pure; scipy does the statistics, imported when a test runs: the node daemon never needs it).

The sample unit is the step: each capture gives one value per captured step (the mean over the compared ranks,
so ranks laid out from one trace count once). Steps of a real job are few (3-8 per capture), noisy and skewed
(a regression often makes steps vary more: HTA's trace_diff pair goes from 75-81 ms to 82-166 ms per step), so:

* **Mann-Whitney U** (exact, one-sided; Mann & Whitney 1947, ``scipy.stats.mannwhitneyu``): distribution-free,
  insensitive to the skew and to one very slow step. It is used when the samples can reach the level: its
  smallest p-value is ``1 / C(n + m, n)`` (1/924 at 6 and 6 steps), which must be at most Holm's first threshold
  ``alpha / hypotheses``.
* **Welch's t-test on log durations** (one-sided, ``scipy.stats.ttest_ind(equal_var=False)`` on
  ``log(value + offset)``) otherwise: at 3-4 steps per capture no rank test can reach 1 % (1/C(8, 4) = 1/70), so a
  normal model decides, on the log scale because step durations vary multiplicatively and a slower capture
  varies more in absolute terms (a 10x compute regression whose three steps spread by hundreds of ms is plain on
  the log scale, while raw Welch with ~2 degrees of freedom cannot reach 1 %). ``offset`` (the caller's floor,
  0.5 % of the reference step) keeps a component at zero finite and makes changes far below it negligible. With
  one step in one capture, Student's pooled t-test on the same scale (the other capture's spread stands for both).
  With one step in both, no test (only the caller's floor decides).
* Each component is tested in both directions (more time, less time): ``2 x components`` hypotheses, Holm's
  step-down correction (Holm 1979) keeps the chance of naming any change falsely below ``alpha`` (1 %).
* The interval goes with the test, each bound a one-sided ``alpha`` bound (98 % two-sided at 1 %): with
  Mann-Whitney the distribution-free interval of the shift of the step values (Hodges & Lehmann 1963; Hollander &
  Wolfe, *Nonparametric Statistical Methods*, 3rd ed., 4.3: the k-th smallest and largest of the ``n x m``
  pairwise differences, k from the exact null distribution of U), with Welch's test its log-scale interval
  ``(lo, hi)`` as a change at the reference's level: ``g x (exp(lo) - 1) .. g x (exp(hi) - 1)``, ``g`` the
  geometric mean of ``ref + offset`` (on the values as they are when ``offset`` is 0).

Identical steps (synthetic captures: no spread at all) have no test statistic: the difference is then exact, a
change when it is not zero (the caller's floor keeps a microsecond from counting).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import fmean
from typing import Literal

ALPHA = 0.01
"""Familywise level of the comparison (one-sided tests, Holm-corrected)."""

Method = Literal["mann_whitney", "welch", "pooled_t", "exact", "none"]


@dataclass(frozen=True, slots=True)
class ShiftTest:
    """One component's test: ``delta`` = mean(now) - mean(ref) (the unit of the inputs), ``p_value`` one-sided in
    the direction of ``delta`` (None without a test), ``interval`` the ``1 - 2 alpha`` interval of ``delta``
    (None without a spread), ``method`` which test ran."""

    delta: float
    p_value: float | None
    interval: tuple[float, float] | None
    method: Method


def rank_test_reaches(n: int, m: int, level: float) -> bool:
    """Whether an exact rank test of ``n`` and ``m`` values can give a p-value of at most ``level``."""
    return n >= 1 and m >= 1 and 1.0 / math.comb(n + m, n) <= level


def _spread(xs: Sequence[float]) -> float:
    return max(xs) - min(xs) if xs else 0.0


def shift_test(ref: Sequence[float], now: Sequence[float], *, rank_test: bool, alpha: float = ALPHA,
               offset: float = 0.0) -> tuple[ShiftTest, float | None, float | None]:
    """Test ``now`` against ``ref``: ``(ShiftTest, p_more, p_less)``, the one-sided p-values of "now takes more"
    and "now takes less" (None without a test).

    Args:
        ref, now: one value per step (any unit; at least one each).
        rank_test: use Mann-Whitney (the caller checked :func:`rank_test_reaches` for its family), else Welch.
        alpha: sets the interval's level, ``1 - 2 alpha``.
        offset: added before the log of the t-tests and their interval (> 0: log scale; 0: the values as
            they are).

    Raises:
        ValueError: an empty sample, or a value at or below ``-offset`` with ``offset > 0``.
    """
    if not ref or not now:
        raise ValueError("each capture needs at least one step")
    delta = fmean(now) - fmean(ref)
    if len(ref) < 2 and len(now) < 2:
        return ShiftTest(delta, None, None, "none"), None, None
    if _spread(ref) == 0.0 and _spread(now) == 0.0:
        if delta == 0.0:
            return ShiftTest(0.0, 1.0, (0.0, 0.0), "exact"), 1.0, 1.0
        more, less = (0.0, 1.0) if delta > 0 else (1.0, 0.0)
        return ShiftTest(delta, 0.0, (delta, delta), "exact"), more, less
    from scipy import stats  # the coordinator's analysis stack only

    equal_var = min(len(ref), len(now)) < 2  # one step on one side: the other side's spread stands for both
    if offset > 0:
        if min(*ref, *now) <= -offset:
            raise ValueError("values must exceed -offset for the log scale")
        log_now, log_ref = [math.log(x + offset) for x in now], [math.log(x + offset) for x in ref]
    else:
        log_now, log_ref = list(now), list(ref)
    t_more = stats.ttest_ind(log_now, log_ref, equal_var=equal_var, alternative="greater")
    t_less = stats.ttest_ind(log_now, log_ref, equal_var=equal_var, alternative="less")
    ci = stats.ttest_ind(log_now, log_ref, equal_var=equal_var).confidence_interval(1.0 - 2.0 * alpha)
    interval: tuple[float, float] | None = None
    if math.isfinite(ci.low) and math.isfinite(ci.high):
        if offset > 0:  # the log-scale interval as a change at the reference's level (its geometric mean)
            level = math.exp(fmean(log_ref))
            interval = (level * math.expm1(float(ci.low)), level * math.expm1(float(ci.high)))
        else:
            interval = (float(ci.low), float(ci.high))
    if rank_test:
        more = float(stats.mannwhitneyu(now, ref, alternative="greater", method="exact").pvalue)
        less = float(stats.mannwhitneyu(now, ref, alternative="less", method="exact").pvalue)
        method: Method = "mann_whitney"
        interval = shift_interval(ref, now, alpha)
    else:
        more, less = float(t_more.pvalue), float(t_less.pvalue)
        method = "pooled_t" if equal_var else "welch"
    if not (math.isfinite(more) and math.isfinite(less)):
        return ShiftTest(delta, None, interval, "none"), None, None
    return ShiftTest(delta, more if delta >= 0 else less, interval, method), more, less


def _u_null_cdf(n: int, m: int) -> list[float]:
    """``P(U <= u)`` for ``u = 0 .. n*m`` under the null (no ties): the number of rank arrangements with each
    ``U``, counted by the recurrence ``c(n, m, u) = c(n - 1, m, u - m) + c(n, m - 1, u)`` (Mann & Whitney 1947)."""
    # rows[j][u] = arrangements of i values of the first sample and j of the second with U = u (i grows outside)
    prev = [[1] for _ in range(m + 1)]  # i = 0: U = 0 only
    for i in range(1, n + 1):
        cur: list[list[int]] = [[1]]  # j = 0
        for j in range(1, m + 1):
            size = i * j + 1
            row = [0] * size
            for u, c in enumerate(prev[j]):  # the largest value is the first sample's: it beats all j others
                row[u + j] += c
            for u, c in enumerate(cur[j - 1]):  # the largest value is the second sample's
                row[u] += c
            cur.append(row)
        prev = cur
    counts = prev[m]
    total = math.comb(n + m, n)
    acc, out = 0, []
    for c in counts:
        acc += c
        out.append(acc / total)
    return out


EXACT_MAX_PAIRS = 2500
"""Above this many pairwise differences the interval's rank comes from U's normal approximation."""


def shift_interval(ref: Sequence[float], now: Sequence[float], alpha: float = ALPHA) -> tuple[float, float] | None:
    """The Hodges-Lehmann interval of the shift ``now - ref``: ``(d_(k), d_(nm + 1 - k))`` of the sorted pairwise
    differences, ``k - 1`` the largest ``u`` with ``P(U <= u) <= alpha`` (each bound a one-sided ``alpha``
    bound); None when the samples are too small for any such ``k`` (then no distribution-free bound exists)."""
    n, m = len(now), len(ref)
    diffs = sorted(x - y for x in now for y in ref)
    if n * m <= EXACT_MAX_PAIRS:
        cdf = _u_null_cdf(n, m)
        below = [u for u, p in enumerate(cdf) if p <= alpha]
        if not below:
            return None
        k = below[-1] + 1
    else:
        from scipy import stats

        k = int(n * m / 2 - stats.norm.ppf(1 - alpha) * math.sqrt(n * m * (n + m + 1) / 12.0))
        if k < 1:
            return None
    return diffs[k - 1], diffs[n * m - k]


def holm(p_values: Mapping[str, float], alpha: float = ALPHA) -> set[str]:
    """Holm's step-down procedure (Holm 1979): the hypotheses rejected at familywise level ``alpha``. Sorted by
    p-value, the i-th smallest (0-based) is rejected while ``p <= alpha / (m - i)``; the first that is not stops."""
    out: set[str] = set()
    m = len(p_values)
    for i, (key, p) in enumerate(sorted(p_values.items(), key=lambda kv: kv[1])):
        if p > alpha / (m - i):
            break
        out.add(key)
    return out
