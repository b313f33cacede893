"""Robust statistics for verdicts: medians, leave-one-out medians, MAD scale, trimmed pooling, outlier test (pure).

Everything is O(n log n) (one sort) or better, so ranking stays cheap at 16,384 ranks. Sources: the MAD scale
``1.4826 x median |x - median|`` is the consistent sigma estimator of Hampel (1974); the "modified z-score"
outlier rule on it is Iglewicz & Hoaglin, *How to Detect and Handle Outliers* (ASQC, 1993), section 3.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

MAD_TO_SIGMA = 1.4826
"""1 / Phi^-1(3/4): makes the median absolute deviation a consistent estimator of a normal sigma."""


def median_of_sorted(a: Sequence[float]) -> float:
    """Median of an already sorted, non-empty sequence."""
    n = len(a)
    mid = n // 2
    return float(a[mid]) if n % 2 else (a[mid - 1] + a[mid]) / 2.0


def median(values: Iterable[float]) -> float:
    """Median of ``values``; raises ValueError when empty."""
    a = sorted(values)
    if not a:
        raise ValueError("median of no values")
    return median_of_sorted(a)


def loo_medians(values: Sequence[float]) -> list[float | None]:
    """Leave-one-out medians: ``out[i]`` = median of ``values`` without element ``i`` (``None`` when n == 1).

    One sort, then O(1) per element: without the element at sorted position ``p`` the median of the other
    ``m = n - 1`` values is one of three numbers, chosen by ``p`` against the middle index ``k = m // 2``; and ``p``
    is known from the value alone (ties give the same result either way). O(n log n) instead of the O(n^2) of
    n separate medians.
    """
    n = len(values)
    if n == 0:
        return []
    if n == 1:
        return [None]
    a = sorted(values)
    k = (n - 1) // 2
    if (n - 1) % 2:  # m odd: the median is a[k] when p > k, else a[k + 1]
        ak, hi, lo = a[k], a[k + 1], a[k]
        return [hi if v <= ak else lo for v in values]
    # m even: p < k -> (a[k] + a[k+1]) / 2; p == k -> (a[k-1] + a[k+1]) / 2; p > k -> (a[k-1] + a[k]) / 2
    ak = a[k]
    below = (a[k] + a[k + 1]) / 2.0
    at = (a[k - 1] + a[k + 1]) / 2.0
    above = (a[k - 1] + a[k]) / 2.0
    return [below if v < ak else above if v > ak else at for v in values]


def mad_sigma(values: Iterable[float], center: float | None = None) -> float:
    """``1.4826 x median(|x - center|)`` (center: the median by default); 0.0 for fewer than 2 values."""
    a = list(values)
    if len(a) < 2:
        return 0.0
    c = median(a) if center is None else center
    return MAD_TO_SIGMA * median(abs(v - c) for v in a)


def trimmed_pool(values: Sequence[float]) -> float:
    """Mean of ``values`` after dropping the single largest one (n >= 3); the smaller of two; the value of one.

    The pooled statistic of a rank: a rank must stand out *without* its worst step, so a one-off delay (the
    start-up step of a capture, a GC pause) cannot make a suspect on its own (``docs/verdicts.md``).
    """
    n = len(values)
    if n == 0:
        raise ValueError("trimmed_pool of no values")
    if n == 1:
        return float(values[0])
    if n == 2:
        return float(min(values))
    return (sum(values) - max(values)) / (n - 1)


def pooled_within_sigma(series: Iterable[Sequence[float]]) -> tuple[float, int]:
    """Pooled within-series standard deviation ``sqrt(sum (x - mean_i)^2 / sum (n_i - 1))`` and its degrees of
    freedom. Series with fewer than two values contribute nothing; ``(0.0, 0)`` when none has two."""
    ss = 0.0
    dof = 0
    for xs in series:
        n = len(xs)
        if n < 2:
            continue
        mu = sum(xs) / n
        ss += sum((x - mu) ** 2 for x in xs)
        dof += n - 1
    return (math.sqrt(ss / dof), dof) if dof else (0.0, 0)


_CHI2_MEDIAN = (0.454936, 1.386294, 2.365974, 3.356694, 4.351460, 5.348121, 6.345811, 7.344121)
"""Medians of the chi-square distribution with 1..8 degrees of freedom (standard tables)."""


def chi2_median(dof: int) -> float:
    """Median of the chi-square distribution with ``dof`` >= 1 degrees of freedom: the exact value up to 8, the
    Wilson-Hilferty approximation ``k (1 - 2 / (9 k))^3`` above (error under 0.1 %). Raises ValueError below 1."""
    if dof < 1:
        raise ValueError(f"chi-square median needs dof >= 1, got {dof}")
    return _CHI2_MEDIAN[dof - 1] if dof <= len(_CHI2_MEDIAN) else dof * (1.0 - 2.0 / (9.0 * dof)) ** 3


def within_sigma(series: Iterable[Sequence[float]]) -> tuple[float, int]:
    """Within-series standard deviation, unbiased at any series length and robust to a few odd series; returns
    ``(sigma, series used)`` (``(0.0, 0)`` when no series has two values).

    Notes:
        Each series of ``n >= 2`` values gives ``SS / chi2_median(n - 1)`` with ``SS`` its sum of squared
        deviations from its own mean: for normal noise ``SS / sigma^2`` is chi-square with ``n - 1`` degrees of
        freedom, so each such estimate has median ``sigma^2`` whatever ``n`` is. ``sigma^2`` is the median of
        these estimates over the series: a series with a one-off spike (a GC pause) shifts only its own estimate.
        This replaces a MAD of deviations from each series' own median, which at 3-4 values per series is 0.4-0.6
        of the true sigma (one deviation of three is exactly 0) even after a ``sqrt(n / (n - 1))`` correction
        (docs/verdicts.md). Source: the chi-square law of the sample variance (Cochran's theorem); the median
        across groups is the robust pooling of Rousseeuw & Croux (1993) style scale estimators.
    """
    ests: list[float] = []
    for xs in series:
        n = len(xs)
        if n < 2:
            continue
        mu = sum(xs) / n
        ests.append(sum((x - mu) ** 2 for x in xs) / chi2_median(n - 1))
    if not ests:
        return 0.0, 0
    return math.sqrt(median(ests)), len(ests)


@dataclass(slots=True)
class OutlierTest:
    """Result of :func:`upper_outliers`: robust ``center`` and ``sigma`` of the non-candidates, every key's ``z``
    (``(x - center) / sigma``), the keys left out of the noise estimate (``candidates``) and how many values the
    estimate rests on (``n_noise``). ``sigma_between`` is the MAD scale, ``sigma`` the one used (after the floor)."""

    center: float
    sigma: float
    sigma_between: float
    n_noise: int
    z: dict[int, float] = field(default_factory=dict)
    candidates: frozenset[int] = frozenset()


def upper_outliers(values: Mapping[int, float], *, candidate_z: float, sigma_floor: float = 0.0,
                   min_mad_n: int = 5, max_rounds: int = 5, final_sd: bool = False) -> OutlierTest:
    """Robust z of every value against the noise of the others, the candidates excluded from that noise.

    Notes:
        Round 0 takes the median and MAD scale of all values. Each round marks as candidates the keys whose z
        exceeds ``candidate_z`` and re-estimates center and scale from the rest, until the candidate set is
        stable (at most ``max_rounds``). So two or three slow ranks do not inflate the noise that judges each
        of them (``docs/verdicts.md``). The scale is ``max(MAD scale, sigma_floor)``: with few ranks the MAD can
        collapse towards 0, and the caller's floor (step-to-step noise, an absolute minimum) keeps z finite and
        honest. With fewer than ``min_mad_n`` non-candidate values the MAD is not used, only the floor: the MAD
        of 2-4 values says little, and in a 4-rank job with two slow ranks it would sit between the two pairs.
        ``final_sd``: once the candidates are stable, the scale is the sample standard deviation of the
        non-candidates instead of their MAD scale (the candidates, beyond ``candidate_z``, are out already): about
        2.7x as efficient, so at 8 ranks the scale is not inflated now and then by a MAD of 7 values (the max with
        the floor took every upward miss; docs/verdicts.md).
    """
    keys = list(values)
    if not keys:
        return OutlierTest(0.0, max(sigma_floor, 0.0), 0.0, 0)
    cands: frozenset[int] = frozenset()
    center = sigma = between = 0.0
    n_noise = 0
    for _ in range(max_rounds + 1):
        rest = [values[k] for k in keys if k not in cands] or [values[k] for k in keys]
        n_noise = len(rest)
        center = median(rest)
        between = mad_sigma(rest, center) if n_noise >= max(2, min_mad_n) else 0.0
        sigma = max(between, sigma_floor)
        if sigma <= 0:
            sigma = 1e-12
        new = frozenset(k for k in keys if (values[k] - center) / sigma > candidate_z)
        if len(new) > len(keys) // 2:  # a majority cannot be the outliers: keep the previous set
            break
        if new == cands:
            break
        cands = new
    if final_sd and n_noise >= max(2, min_mad_n):
        rest = [values[k] for k in keys if k not in cands] or [values[k] for k in keys]
        mu = sum(rest) / len(rest)
        between = math.sqrt(sum((v - mu) ** 2 for v in rest) / (len(rest) - 1))
        sigma = max(between, sigma_floor, 1e-12)
    z = {k: (values[k] - center) / sigma for k in keys}
    return OutlierTest(center, sigma, between, n_noise, z, cands)


@dataclass(slots=True)
class ArrayOutlierTest:
    """Result of :func:`upper_outliers_array`: as :class:`OutlierTest`, with ``z`` (float64, one per value, in
    the values' order) and ``candidates`` (bool, the same shape) as arrays instead of dicts keyed by position."""

    center: float
    sigma: float
    sigma_between: float
    n_noise: int
    z: np.ndarray
    candidates: np.ndarray


def upper_outliers_array(values: np.ndarray, *, candidate_z: float, sigma_floor: float = 0.0, min_mad_n: int = 5,
                         max_rounds: int = 5) -> ArrayOutlierTest:
    """:func:`upper_outliers` (``final_sd=False``) over a 1-D float array, keys being positions: the same rounds,
    floor and majority rule, in array operations (a group of 523,776 link pairs at 1024 ranks is tested in a few
    passes over 4 MB instead of dicts and lists of Python floats, hundreds of MB). Equal to :func:`upper_outliers`
    on the same values up to floating-point summation order (``tests/unit/test_robust.py``)."""
    import numpy as np  # lazily: importing the settings (every command) must not load numpy
    v = np.asarray(values, dtype=np.float64)
    n = len(v)
    none = np.zeros(n, dtype=bool)
    if not n:
        return ArrayOutlierTest(0.0, max(sigma_floor, 0.0), 0.0, 0, np.zeros(0), none)
    cands = none
    center = sigma = between = 0.0
    n_noise = 0
    for _ in range(max_rounds + 1):
        rest = v[~cands] if not cands.all() else v
        n_noise = len(rest)
        center = float(np.median(rest))
        between = MAD_TO_SIGMA * float(np.median(np.abs(rest - center))) if n_noise >= max(2, min_mad_n) else 0.0
        sigma = max(between, sigma_floor)
        if sigma <= 0:
            sigma = 1e-12
        new = (v - center) / sigma > candidate_z
        if int(new.sum()) > n // 2:  # a majority cannot be the outliers: keep the previous set
            break
        if np.array_equal(new, cands):
            break
        cands = new
    return ArrayOutlierTest(center, sigma, between, n_noise, (v - center) / sigma, cands)
