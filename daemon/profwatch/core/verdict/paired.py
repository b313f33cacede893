"""A rank against its peers step by step: the within-step permutation test of small groups (pure; numpy draws
the permutations, imported when a test runs: the node daemon never needs it).

Why: in a group of 2-5 ranks there are too few other ranks to measure how far apart healthy ranks sit, so
:func:`profwatch.core.verdict.ranking.judge_batch`'s between-rank test rests on its floor alone, the step-to-step
noise of a mean (``sigma_within / sqrt(steps)``): a t statistic on plain means read against the normal 4.0 (and in a
pair, once the slow rank is a candidate, against the other rank's value: twice the distance). On a busy host that
misses both ways. One step in ten in which a healthy rank is preempted for a whole step inflates the noise: a rank
computing 2.7x its peer's time while its peer waited for it in 9 of 10 steps read z 1.6-3.8 and was not named
(the live serving pair; ``tests/data/demo_cpu_starved``). And per-step differences made of preemptions of 2-25 ms
are far from normal: healthy pairs and trios whose 4-10 steps happened to go one way were named in 2-5 % of
batches (``tests/unit/test_verdict_paired.py``).

The test here needs no law for the noise. Per step ``s`` and rank ``r`` with peers ``P`` (the other ranks of the
step), as fractions of the step's median step time ``T_s``:

* own work: ``d_s = (W_r - mean_P W) / T_s``, ``W`` = computation + free time;
* late: ``d_s = (mean_P wait - wait_r) / T_s`` (peers' wait for it).

Each ``d_s`` is bounded to ``[-bound, bound]`` (a step's excess is at most the step; ``bound`` 1: one absurd step
cannot carry a rank). The statistic is the mean of ``d_s - delta``, a value within ``tie`` of zero counted as zero
(the noise floor: differences of a few tenths of a percent say nothing). ``delta`` is the
ranking's ``min_effect_frac``: the null is an excess of ``delta``, so a small systematic asymmetry of a healthy
group (one rank logging, the store's host) is not named however many steps show it.

The null: in a healthy group the ranks of a step are exchangeable (which rank a preemption or a slow request hits
is chance), so the rank's value in each step is, with equal chance, any of the step's ``N`` values, independently
across steps. Because every ``d`` is a function of the rank's own row and the step's totals (the peers' *mean* is
the reference), relabelling the ranks of a step permutes its ``d`` values. The p-value is the share of the
``N^n`` relabellings whose statistic is at least the observed one: enumerated when there are at most
``EXACT_MAX`` of them, else ``DRAWS`` random ones with a fixed seed (``(1 + k) / (1 + DRAWS)``, Phipson & Smyth
2010, "Permutation p-values should never be zero"). Source: Fisher's randomization test (*The Design of
Experiments*, 1935, section 21; in a pair it is the sign-flip test of paired differences). A trimmed mean as the
statistic was tried (Wilcox, *Introduction to Robust Estimation and Hypothesis Testing*, 4th ed., 2017, 4.4): its
ties between relabellings that differ only in cut steps raised the smallest p-value (a pair's 10 steps: 56/1024 with
2 cut at each end) and it named fewer slow ranks on the busy-host tables. The smallest p-value is ``N^-n``: a pair
needs 8 steps to be named at 1 % over its two ranks, a trio 6, a group of 4 needs 5, of 5 ranks 4.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from profwatch.core.verdict.evidence import RankStepSummary

PAIRED_SIGNALS = ("own", "late")
"""Signals the paired test runs on (``late`` only where every rank of the step has a usable wait)."""
EXACT_MAX = 65_536
"""Relabellings enumerated exactly up to this many (a pair's 16 steps, a group of 4's 8)."""
DRAWS = 20_000
"""Random relabellings above :data:`EXACT_MAX` (the p-value's resolution is then 5e-5)."""


@dataclass(frozen=True, slots=True)
class PairedTest:
    """One rank's paired test of one signal over ``steps`` steps.

    ``effect``: the mean of its bounded per-step excess (fraction of the step, in ``[-bound, bound]``);
    ``p``: the one-sided permutation p-value of "its excess exceeds ``delta``"; ``alpha``: the level it is read at;
    ``positive``: steps whose excess exceeds ``delta`` by more than the tie floor; ``ranks``: ranks of the group;
    ``exact``: enumerated (else ``DRAWS`` draws); ``passed``: ``p <= alpha``.
    """

    signal: str
    steps: int
    ranks: int
    effect: float
    p: float
    alpha: float
    delta: float
    positive: int
    exact: bool
    passed: bool
    min_p: float = 0.0
    """The smallest p-value these steps can give (``N^-n`` exact, ``1 / (1 + DRAWS)`` drawn): when it is above
    ``alpha`` the test cannot decide (:attr:`decides`)."""

    @property
    def decides(self) -> bool:
        """Whether the steps can reach the level at all (``min_p <= alpha``)."""
        return self.min_p <= self.alpha

    def to_json(self) -> dict[str, Any]:
        return {"signal": self.signal, "steps": self.steps, "ranks": self.ranks,
                "effect_frac": round(self.effect, 5), "p": float(f"{self.p:.3g}"),
                "alpha": float(f"{self.alpha:.3g}"), "delta_frac": round(self.delta, 5),
                "steps_above": self.positive, "passed": self.passed, "min_p": float(f"{self.min_p:.3g}"),
                "decides": self.decides,
                "method": "within-step permutation test of the mean" + ("" if self.exact else f" ({DRAWS} draws)")}


def permutation_test(steps: Sequence[Sequence[float]], own: Sequence[int], *, delta: float, tie: float,
                     alpha: float, bound: float = 1.0, signal: str = "") -> PairedTest | None:
    """One rank's one-sided within-step permutation test of "its excess exceeds ``delta``" (module docstring).

    Args:
        steps: per step, every rank's excess (fraction of the step; the same ranks' values in any order).
        own: per step, the index in ``steps[s]`` of the rank tested.
        delta: the null's excess (>= 0, fraction of the step).
        tie: values within ``tie`` of ``delta`` count as ``delta`` (> 0, fraction of the step).
        alpha: the level in (0, 1).
        bound: each value is clipped to ``[-bound, bound]`` (> 0).

    Returns:
        :class:`PairedTest`, or None with fewer than 2 steps. O(min(N^n, DRAWS) x n) time; memory O(EXACT_MAX x n)
        enumerated (n <= 16), O(DRAWS) drawn.

    Raises:
        ValueError: a parameter out of range, a step with fewer than 2 values, ``steps`` and ``own`` of different
            lengths, or a non-finite value.
    """
    if not (delta >= 0 and tie > 0 and 0 < alpha < 1 and bound > 0):
        raise ValueError(f"bad paired-test parameters delta={delta} tie={tie} alpha={alpha} bound={bound}")
    if len(steps) != len(own) or any(len(v) < 2 for v in steps):
        raise ValueError("each step needs the values of at least two ranks, and one index of the rank tested")
    if not all(math.isfinite(x) for v in steps for x in v):
        raise ValueError("non-finite excess")
    n = len(steps)
    if n < 2:
        return None
    import numpy as np

    def centred(v: Sequence[float]) -> list[float]:
        out = [min(bound, max(-bound, x)) - delta for x in v]
        return [0.0 if abs(x) < tie else x for x in out]

    vals = [centred(v) for v in steps]
    mine = np.array([[vals[s][own[s]] for s in range(n)]])
    observed = float(mine.mean())
    sizes = [len(v) for v in vals]
    total = math.prod(sizes)
    exact = total <= EXACT_MAX
    table = np.full((n, max(sizes)), np.nan)
    for s, v in enumerate(vals):
        table[s, :len(v)] = v
    if exact:
        idx = np.indices(sizes).reshape(n, -1).T  # at most EXACT_MAX x 16 indices (N >= 2: n <= 16)
        draws = int(total)
        stats = table[np.arange(n)[None, :], idx].mean(axis=1)
    else:
        # the draws step by step into one running sum: O(DRAWS) memory whatever the steps (a draws x steps table
        # held 320 MB and took 4.6 s for 5 ranks' 1,000 steps); the same draws as one table of them
        rng = np.random.default_rng(0)
        draws = DRAWS
        stats = np.zeros(DRAWS)
        for s, k in enumerate(sizes):
            stats += table[s, rng.integers(0, k, size=DRAWS)]
        stats /= n
    k = int(np.count_nonzero(stats >= observed - 1e-12))
    p = k / draws if exact else (1 + k) / (1 + draws)
    effect = sum(min(bound, max(-bound, steps[s][own[s]])) for s in range(n)) / n
    positive = int(np.count_nonzero(mine > 0))
    # the smallest p-value these values can give: the share of relabellings tied with the most extreme one (ties
    # come from equal values and zeros); drawn, at best one in draws + 1
    min_p = int(np.count_nonzero(stats >= stats.max() - 1e-12)) / draws if exact else 1.0 / (1 + draws)
    passed = p <= alpha and observed > 0  # a rank at or below the null's excess in the mean is never named
    return PairedTest(signal, n, int(max(sizes)), effect, p, alpha, delta, positive, exact, passed, min_p)


def peer_differences(by_step: Mapping[int, Mapping[int, RankStepSummary]], step_time_us: Mapping[int, float],
                     unreliable: set[int] | frozenset[int] = frozenset()) -> dict[str, list[dict[int, float]]]:
    """Per-step differences of every rank against its peers' mean: ``signal -> [{rank: d_s}]``, one dict per step
    in step order (module docstring).

    Args:
        by_step: step -> rank -> row (steps with at least two ranks are used).
        step_time_us: step -> the step's median step time (µs, > 0; steps without one are skipped).
        unreliable: ranks whose wait is zero-filled: steps with one of them have no ``late`` differences.

    O(S N) for S steps of N ranks.
    """
    out: dict[str, list[dict[int, float]]] = {name: [] for name in PAIRED_SIGNALS}
    for step in sorted(by_step):
        rows = by_step[step]
        t = step_time_us.get(step, 0.0)
        if len(rows) < 2 or not t > 0:
            continue
        n = len(rows)
        own = {r: row.computation_us + row.free_us for r, row in rows.items()}
        total_own = sum(own.values())
        out["own"].append({r: (w - (total_own - w) / (n - 1)) / t for r, w in own.items()})
        if unreliable & rows.keys():
            continue
        total_wait = sum(row.wait_us for row in rows.values())
        out["late"].append({r: ((total_wait - row.wait_us) / (n - 1) - row.wait_us) / t for r, row in rows.items()})
    return out
