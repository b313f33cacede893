"""Serving units: a change in a unit's first minutes, while its regression baseline (18 blocks of 60 s) still
learns, is reported from the blocks learned so far (``detail.reference "provisional"``), not learned as normal; a
healthy host load that flickers 1.0-1.5x reports nothing (pure; generated reports on a fake clock through
JobDetector's serving path, and the detector's rule on given values)."""

from __future__ import annotations

from typing import Any

from profwatch.core.detection.job_detector import JobDetector
from profwatch.core.detection.regression import PROVISIONAL_EFFECT, StepTimeRegressionDetector
from profwatch.core.detection.settings import DetectionSettings
from profwatch.core.detection.types import FinalizedStep
from tests.unit.detection_helpers import of_kind, run
from tests.unit.test_serving_rescale import T0, _server


def _reports(recs: list[dict[str, Any]]) -> list[tuple[float, float, Any]]:
    """``(seconds from T0, magnitude, detail.reference or detail.detector)`` of each step_regression."""
    at = {r["step"]: r["ts_unix_s"] - T0 for r in recs}
    found, _ = run(iter(recs), 1, det=JobDetector("svc", 1, mode="serving"))
    return [(at[a.step], a.magnitude, a.detail.get("reference") or a.detail.get("detector"))
            for a in of_kind(found, "step_regression")]


def test_a_3x_change_in_a_serving_units_first_minutes_is_reported_within_minutes() -> None:
    """Every iteration 3x slower from 3, 5 or 10 minutes into the unit's life, under a host load flickering
    1.0-1.5x every 20-90 s (3 seeds each): reported within 4 minutes of the onset, magnitude bounded (0.5-3: the
    bands formed after the onset learned part of it), by the provisional rule or the unit's shared level
    (``UnitLevel``), whichever decides first. Before, the blocks of the change entered the learning
    baseline: 3 of 9 never reported, the others 6-13 minutes after the onset. From 2 minutes it is found in 1 of 3
    seeds (the rule needs two blocks before the change: see docs/detection.md). At most one more report in the 15
    minutes after the onset (a band reference rescaled at most 2x, ``serving.MAX_SCALE`` before, reported one 3x
    change 5-12 times)."""
    for seed in (1, 2, 3):
        for onset in (180.0, 300.0, 600.0):
            regs = _reports(list(_server([], steps=5_500, host_load=True, seed=seed, slow_from_s=onset, slow=3.0)))
            assert regs, (seed, onset)
            t, mag, ref = regs[0]
            assert onset <= t <= onset + 240.0 and 0.5 <= mag <= 3.0, (seed, onset, regs)
            assert ref in ("provisional", "unit_level"), (seed, onset, regs)
            assert len([r for r in regs if r[0] <= onset + 900.0]) <= 2, (seed, onset, regs)  # not again and again


def test_a_30_percent_change_in_the_learning_window_is_not_reported_by_the_provisional_rule() -> None:
    """+30 % from minute 5 (3 seeds): the provisional rule does not report it (its threshold, every changed block
    50 % over every earlier one, sits above what a healthy replica's blocks wander in the learning window:
    bench_corpus serving_dp run 0 read 0.77-0.9 then 1.16-1.36, and 25 % made 3 false arms there). A +30 % change
    in the first minutes is left to the change-point test once the baseline forms: a known limit."""
    for seed in (1, 2, 3):
        regs = _reports(list(_server([], steps=5_500, host_load=True, seed=seed, slow_from_s=300.0, slow=1.3)))
        assert all(ref != "provisional" for _, _, ref in regs), (seed, regs)


def test_a_healthy_flickering_host_for_an_hour_reports_nothing() -> None:
    """60 minutes of healthy traffic, the host's load 1.0-1.5x for 20-90 s at a time (6 seeds): no report; the
    provisional rule judges the first 18 blocks, where the flicker moves blocks by about +-15 %."""
    for seed in range(1, 7):
        assert _reports(list(_server([], steps=19_000, host_load=True, seed=seed))) == [], seed


def _det(hold: int = 2) -> StepTimeRegressionDetector:
    s = DetectionSettings(baseline_steps=60, min_baseline_steps=10, baseline_lag_steps=8, spike_hold_steps=hold)
    return StepTimeRegressionDetector("svc", s, provisional=True)


def _feed(det: StepTimeRegressionDetector, values: list[float]) -> list[tuple[int, float, dict[str, Any]]]:
    out = []
    for i, v in enumerate(values):
        rec = FinalizedStep(step=100 * (i + 1), time_s=v, slowest_rank=0, ranks_reported=1, stages=None,
                            excluded=None, work=8.0, steps=100)
        out += [(a.step, a.magnitude, a.detail) for a in det.on_step(rec)]
    return out


def test_the_provisional_rule_reports_a_rise_of_every_later_value_over_every_earlier_one_once() -> None:
    """Values 1.0, 1.05 then 1.7, 1.75, 1.68: reported at the fifth, first step that of the third, magnitude the
    ratio of the geometric means (+67 %), threshold in the detail; the new level is learned (no second report)."""
    found = _feed(_det(), [1.0, 1.05, 1.7, 1.75, 1.68, 1.71, 1.69, 1.72])
    assert len(found) == 1, found
    step, mag, detail = found[0]
    assert step == 500 and detail["first_step"] == 300 and detail["reference"] == "provisional"
    assert detail["learning"] is True and detail["threshold"] == PROVISIONAL_EFFECT
    assert 0.63 <= mag <= 0.70 and detail["baseline_values"] == 2


def test_the_provisional_rule_ignores_overlapping_levels_falls_and_short_rises() -> None:
    """A rise where one later value is not 50 % over every earlier one, a fall of any size, a rise of two values
    then back: nothing."""
    assert _feed(_det(), [1.0, 1.2, 1.35, 1.3, 1.45, 1.4]) == []
    assert _feed(_det(), [1.0, 1.1, 1.7, 1.6, 1.64, 1.7]) == []
    assert _feed(_det(), [1.0, 1.0, 0.3, 0.3, 0.3, 0.3]) == []
    assert _feed(_det(), [1.0, 1.0, 1.5, 1.5, 1.0, 1.0]) == []


def test_a_young_units_wandering_blocks_are_left_to_the_provisional_rule_while_it_learns() -> None:
    """The block ratios of a healthy replica split minutes into the job (bench_corpus serving_dp seed 32 run 13): 7
    blocks 0.84-1.13, most near 0.88, then 1.195, 1.223, 1.141. While the baseline learns, a serving unit with
    ``work`` reports a rise by the provisional rule alone (50 % over every earlier block): before, the learning
    path's spike rule (``spike_min_effect`` over the median of the blocks so far, for the hold) reported +37 % on
    healthy traffic and armed. A 3x change in the same window is still reported (provisional)."""
    young = [0.985, 0.879, 0.873, 1.003, 0.870, 0.872, 1.133, 0.838, 1.084, 1.078, 1.086, 1.062, 1.136, 1.035,
             1.053, 1.195, 1.223, 1.141, 0.852, 0.843]
    assert _feed(_det(hold=1), young) == []
    found = _feed(_det(hold=1), young[:15] + [3.0, 3.1, 2.9, 3.05])
    assert [d["reference"] for _, _, d in found] == ["provisional"]
