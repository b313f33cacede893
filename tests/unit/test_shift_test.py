"""The comparison's two-sample tests (core/verdict/shift_test.py): exact U distribution, Holm, the intervals."""

from __future__ import annotations

import itertools
import math

import pytest
from scipy import stats

from profwatch.core.changes.comparison import compare_captures
from profwatch.core.verdict.evidence import RankStepSummary
from profwatch.core.verdict.shift_test import _u_null_cdf, holm, rank_test_reaches, shift_interval, shift_test

# ProfilerStep#1009-1014 of HTA's trace_diff pair (host spans, ms): control tight, test slower and skewed
CONTROL = [75.473, 76.94, 76.212, 76.727, 78.473, 81.12]
TEST = [100.298, 122.149, 166.403, 81.971, 107.23, 166.35]


@pytest.mark.parametrize(("n", "m"), [(1, 1), (2, 3), (3, 5), (6, 6), (4, 7)])
def test_u_null_distribution_matches_enumeration(n: int, m: int):
    counts = [0] * (n * m + 1)
    for first in itertools.combinations(range(n + m), n):  # ranks of the first sample
        counts[sum(first) - n * (n - 1) // 2] += 1
    total = math.comb(n + m, n)
    cdf = list(itertools.accumulate(c / total for c in counts))
    assert _u_null_cdf(n, m) == pytest.approx(cdf)


def test_exact_p_values_agree_with_scipy():
    t, _, _ = shift_test(CONTROL, TEST, rank_test=True)
    assert t.method == "mann_whitney" and t.p_value == pytest.approx(1 / 924)
    assert t.p_value == pytest.approx(stats.mannwhitneyu(TEST, CONTROL, alternative="greater").pvalue)
    # Hodges-Lehmann 98 % interval: 4th smallest and largest of the 36 differences (P(U <= 3) = 7/924 <= 1 %)
    diffs = sorted(x - y for x in TEST for y in CONTROL)
    assert t.interval == (diffs[3], diffs[32]) and t.interval[0] > 0


def test_holm_step_down():
    assert holm({"a": 0.001, "b": 0.004, "c": 0.03}) == {"a", "b"}  # thresholds 0.0033, 0.005, 0.01
    assert holm({"a": 0.004, "b": 0.001}, alpha=0.01) == {"a", "b"}
    assert holm({"a": 0.006, "b": 0.0051}) == set()  # the smallest fails 0.005: nothing
    assert holm({}) == set()


def test_few_steps_use_welch_and_degenerate_samples_say_so():
    assert not rank_test_reaches(4, 4, 0.01) and rank_test_reaches(6, 6, 0.01 / 8)
    t, more, less = shift_test([10.0, 10.4, 9.8], [14.0, 14.5, 13.6], rank_test=False)
    assert t.method == "welch" and t.p_value is not None and t.p_value < 0.01 and more == t.p_value and less
    assert t.interval is not None and t.interval[0] < t.delta < t.interval[1]
    same, _, _ = shift_test([5.0, 5.0], [5.0, 5.0], rank_test=False)
    assert same.method == "exact" and same.delta == 0 and same.p_value == 1.0
    up, _, _ = shift_test([5.0, 5.0], [6.0, 6.0], rank_test=False)
    assert up.method == "exact" and up.p_value == 0.0 and up.interval == (1.0, 1.0)
    one, more, less = shift_test([5.0], [6.0], rank_test=False)
    assert one.method == "none" and one.p_value is None and more is None
    pooled, _, _ = shift_test([5.0], [6.0, 6.2, 5.9], rank_test=False)
    assert pooled.method == "pooled_t" and pooled.p_value is not None
    assert shift_interval([1.0, 2.0], [3.0, 4.0]) is None  # 2 and 2 values: no 1 % bound exists
    with pytest.raises(ValueError):
        shift_test([], [1.0], rank_test=False)


def _rows(steps: list[float], comp: list[float]) -> list[RankStepSummary]:
    return [RankStepSummary(0, i, s * 1e3, c * 1e3, 0.0, 0.0, 0.0, (s - c) * 1e3) for i, (s, c) in
            enumerate(zip(steps, comp, strict=True))]


def test_a_regression_that_makes_steps_vary_is_a_change():
    """Issue 32: the old rule (3 x the pooled per-step spread) called this pair "within noise" because the slower
    capture's own spread dominated it; every one of the 36 step pairs is slower."""
    ref = _rows(CONTROL, [c - 12.7 for c in CONTROL])
    now = _rows(TEST, [t - 4.5 for t in TEST])
    c = compare_captures(ref, now)
    assert c.step_time_changed and c.step_time_p_value == pytest.approx(1 / 924)
    assert [x.component for x in c.changes] == ["compute", "host"], c.to_json()
    compute = c.changes[0].to_json()
    assert compute["test"] == "mann_whitney" and compute["interval_s_per_step"][0] > 0
    assert "Holm over 6 hypotheses" in c.notes[-1]


def test_three_steps_of_a_regression_that_varies_are_a_change_on_the_log_scale():
    """A 10x job-wide compute regression on a loaded box (tests/e2e/test_reference_live.py): three reference steps of
    ~20 ms, three regressed ones spread over 0.7-1.3 s. Welch on the raw values has ~2 degrees of freedom and stops at
    p 0.015 (not a change at 1 %, Holm over 6); on log durations the change is plain."""
    ref, now = [20.0, 22.0, 19.0], [700.0, 1300.0, 1000.0]
    raw, _, _ = shift_test(ref, now, rank_test=False)
    assert raw.p_value is not None and raw.p_value > 0.01
    t, _, _ = shift_test(ref, now, rank_test=False, offset=0.5)
    assert t.method == "welch" and t.p_value is not None and t.p_value < 0.01 / 6
    assert t.interval is not None and 0 < t.interval[0] < t.delta < t.interval[1]
    with pytest.raises(ValueError):
        shift_test([-1.0, 2.0], [3.0, 4.0], rank_test=False, offset=0.5)
