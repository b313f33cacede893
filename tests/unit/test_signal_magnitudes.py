"""The verdict's signals at extreme magnitudes (property-based, hypothesis): step times and work of any float a
parser can produce (1e-300, subnormals, 1e300, 0, NaN, infinities) never crash ``measure_signals`` or the ranking,
and every pooled signal and within-rank sigma stays finite: an out-of-bounds row is left out with a note, a tiny
step time is floored."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from profwatch.core.verdict.evidence import MAX_ROW_US, ClusterEvidence, RankStepSummary, RecipeStatus
from profwatch.core.verdict.ranking import judge_batch
from profwatch.core.verdict.signals import measure_signals

_EXTREME = st.sampled_from([0.0, 5e-324, 1e-300, 1e-9, 1.0, 1e3, 1e6, MAX_ROW_US, MAX_ROW_US * 1.01, 1e300,
                            1.7e308, math.inf, -math.inf, math.nan, -1e300])
_ANY = st.one_of(_EXTREME, st.floats(min_value=0.0, max_value=1e308), st.floats(min_value=1.0, max_value=1e5))


def _rows(step_time: float, comp: float, slow: float) -> list[RankStepSummary]:
    """3 ranks x 3 steps; rank 0's computation rises by ``slow`` per step (a within-rank spread)."""
    return [RankStepSummary(rank=r, step=s, step_time_us=step_time, computation_us=comp * (1 + r) + (s * slow if r == 0
                                                                                                   else 0.0),
                            communication_us=100.0, wait_us=10.0, transmit_us=90.0, free_us=5.0)
            for r in range(3) for s in range(3)]


def _check(rows: list[RankStepSummary]) -> None:
    table = measure_signals(rows)
    for values in table.pooled.values():
        assert all(math.isfinite(v) for v in values.values())
    assert all(math.isfinite(sigma) for sigma, _ in table.within.values())
    ev = ClusterEvidence(kind="ascend_pt", summaries=rows)
    ev.recipes["cluster_time_summary"] = RecipeStatus("cluster_time_summary", "ok")
    verdict = judge_batch(ev)
    assert all(math.isfinite(s.score) for s in verdict.suspects)


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(_ANY, _ANY, _ANY)
@example(1e-300, 1000.0, 7.0)  # the OverflowError of within_sigma: excess ~1e303, its square past a float
@example(5e-324, 1000.0, 0.0)  # 1 / step time is infinite: NaN excess before the floor
@example(1000.0, 1e300, 1e299)  # work past the bound: left out
def test_extreme_step_times_and_work_keep_every_signal_finite(step_time: float, comp: float, slow: float) -> None:
    _check(_rows(step_time, comp, slow))


@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(_ANY, _ANY, _ANY, _ANY, _ANY), min_size=4, max_size=12))
def test_rows_of_any_magnitudes_keep_every_signal_finite(fields: list[tuple[float, ...]]) -> None:
    rows = [RankStepSummary(rank=i % 4, step=i // 4, step_time_us=a, computation_us=b, communication_us=c,
                            wait_us=d, transmit_us=c - d if math.isfinite(c - d) else 0.0, free_us=e)
            for i, (a, b, c, d, e) in enumerate(fields)]
    _check(rows)


def test_a_row_past_the_bound_is_left_out_with_a_note_and_a_tiny_step_time_is_floored() -> None:
    rows = _rows(1000.0, 1000.0, 7.0) + [RankStepSummary(3, 0, 1000.0, 1e300, 100.0, 10.0, 90.0, 5.0)]
    table = measure_signals(rows)
    assert 3 not in table.n_steps
    assert any("beyond 7 days" in n for n in table.notes)
    tiny = measure_signals(_rows(1e-300, 1000.0, 7.0))
    assert all(abs(v) < 1e16 for v in tiny.pooled["own"].values())
