"""Recurring job-wide interruptions the job does not flag (an evaluation or checkpoint every N steps lasting longer
than the spike hold): reported once, then recognised as the job's pattern; a persistent change during or right
after one is still reported (daemon/profwatch/core/detection/interruptions.py, regression.py, spikes.py).

Each case feeds a generated job step-time series (seeded) to the change-point detector alone, with a fixed spike
hold of 4 steps (the capture planner's lead at a 2 s step)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from profwatch.core.detection.interruptions import (
    MAX_HOLD_STEPS,
    MAX_INTERRUPTION_STEPS,
    MAX_TIMED_INTERRUPTION_STEPS,
    REVERT_STEPS,
    Interruption,
    NewLevel,
    RecurringInterruptions,
)
from profwatch.core.detection.regression import StepTimeRegressionDetector
from profwatch.core.detection.settings import DetectionSettings
from profwatch.core.detection.types import Anomaly, FinalizedStep

HOLD = 4
STEP_S = 1.9


def series(steps: int, onsets: list[int], duration: int | list[int], factor: float | list[float], *, cv: float = 0.03,
           seed: int = 0, change_at: int | None = None, change: float = 1.0) -> np.ndarray:
    """Job step times: ``STEP_S`` with ``cv`` noise, interruptions at ``onsets`` (1-based steps) of ``duration`` steps
    at ``factor`` x (one value or one per onset), and a change of ``change`` x from ``change_at`` to the end."""
    rng = np.random.default_rng(seed)
    lv = np.ones(steps)
    durations = duration if isinstance(duration, list) else [duration] * len(onsets)
    factors = factor if isinstance(factor, list) else [factor] * len(onsets)
    for o, d, f in zip(onsets, durations, factors, strict=True):
        lv[o - 1:o - 1 + d] *= f
    if change_at is not None:
        lv[change_at - 1:] *= change
    return STEP_S * lv * np.maximum(0.2, 1.0 + cv * rng.standard_normal(steps))


def feed(xs: np.ndarray) -> tuple[list[Anomaly], StepTimeRegressionDetector]:
    det = StepTimeRegressionDetector("j", DetectionSettings(), hold_steps=lambda _s, _t: HOLD)
    out: list[Anomaly] = []
    for i, x in enumerate(xs.tolist()):
        out += det.on_step(FinalizedStep(i + 1, x, 0, 4, None, None))
    return out, det


def regressions(found: list[Anomaly]) -> list[Anomaly]:
    return [a for a in found if a.kind == "step_regression"]


def test_a_checkpoint_every_197_steps_longer_than_the_hold_is_reported_once() -> None:
    """5 steps at 7x every 197 steps (the corpus' interrupts run 12): the first is a level change (nothing said it
    would end), the later ones are the job's pattern: ``step_spike`` ``"recurring"``, never a regression."""
    onsets = [198, 395, 592, 789]
    found, det = feed(series(865, onsets, 5, 7.0))
    [first] = regressions(found)
    assert first.detail["pattern"] == "level" and first.detail["first_step"] == 198
    recurring = [a for a in found if a.kind == "step_spike" and a.detail["pattern"] == "recurring"]
    assert recurring and recurring[0].detail["first_step"] == 395
    assert recurring[0].detail["recurring"]["seen"] == 1
    assert det.recurring.counters["interruptions_recognised"] == 3
    assert det.recurring.interval(6.0) == 197


def test_jittered_interval_duration_and_level_are_one_pattern() -> None:
    """An evaluation every 250 +- 30 steps, 9-13 steps at 4-6x: one report."""
    rng = np.random.default_rng(3)
    onsets, o = [], 120
    while o < 1800:
        onsets.append(o)
        o += int(rng.integers(220, 281))
    durations = [int(d) for d in rng.integers(9, 14, len(onsets))]
    factors = [float(f) for f in rng.uniform(4.0, 6.0, len(onsets))]
    found, _ = feed(series(1900, onsets, durations, factors, seed=1))
    assert len(regressions(found)) == 1


def test_a_persistent_change_right_after_an_interruption_is_reported() -> None:
    """3x for good from the step after the third occurrence ends: reported, at most the learned hold late."""
    onsets = [198, 395, 592]
    found, _ = feed(series(900, onsets, 5, 7.0, change_at=597, change=3.0))
    late = [a for a in regressions(found) if a.step >= 597]
    assert late, "the change after the interruption was lost"
    assert late[0].step - 597 <= MAX_HOLD_STEPS


def test_a_persistent_change_that_starts_during_an_interruption_is_reported() -> None:
    """The third occurrence never ends (7x for good): reported once it outlasts the learned hold (2 x 5 + 2)."""
    found, _ = feed(series(900, [198, 395], 5, 7.0, change_at=592, change=7.0))
    late = [a for a in regressions(found) if a.step >= 592]
    assert late and late[0].detail["first_step"] == 592
    assert late[0].step - 592 < 2 * 5 + 2 + 2


def test_a_small_change_during_an_interruption_is_found_by_the_change_point_test() -> None:
    """+30 % for good from the middle of a recurrence: the interruption ends, the rise stays and is found."""
    found, _ = feed(series(900, [198, 395, 592], 5, 7.0, change_at=594, change=1.3))
    late = [a for a in regressions(found) if a.step >= 594]
    assert late and late[0].step - 594 <= 60


@pytest.mark.parametrize(("after", "change", "cv"), [(0, 1.3, 0.03), (0, 1.3, 0.15), (2, 1.15, 0.03),
                                                    (10, 1.3, 0.03), (10, 3.0, 0.15), (25, 1.3, 0.15)])
def test_a_change_right_after_the_first_interruption_is_its_own_report(after: int, change: float, cv: float) -> None:
    """The first occurrence is reported and the baseline re-learns; a change from 0-25 steps after it ends is
    judged against the level before it (it was learned as the job's level, never reported)."""
    at = 203 + after
    found, _ = feed(series(700, [198], 5, 7.0, change_at=at, change=change, cv=cv))
    late = [a for a in regressions(found) if a.step >= at]
    assert late, "the change after the interruption was learned as normal"
    assert late[0].detail["reference"] == "before_interruption" and late[0].step - at <= 45
    assert 0.1 <= late[0].magnitude <= 1.3 * (change - 1.0)  # a CUSUM run's mean may start on noise: low
    assert late[0].detail["baseline_s"] == pytest.approx(STEP_S, rel=0.1)


def test_a_new_level_after_an_interruption_needs_min_effect_clear_of_its_error() -> None:
    rec = RecurringInterruptions()
    rec.reported(100, 104, 6.0, 1.0, 0.03)
    out = [rec.observe(105 + i, 1.3, 0.3, 6.0, 0.1) for i in range(REVERT_STEPS)]
    assert out[-1] == NewLevel(105, 1.0, pytest.approx(0.3), REVERT_STEPS)
    rec.reported(200, 204, 6.0, 1.0, 0.03)
    assert all(rec.observe(205 + i, 1.05, 0.3, 6.0, 0.1) is None for i in range(REVERT_STEPS - 1))
    assert isinstance(rec.observe(213, 1.05, 0.3, 6.0, 0.1), Interruption)  # under min_effect: came back


def test_an_excursion_that_never_comes_back_is_not_learned() -> None:
    rec = RecurringInterruptions()
    rec.reported(100, 104, 2.0, 1.0, 0.03)
    # 3 s steps: 100 of them are 5 minutes (an interruption's time bound), a regime's bound is 240 steps
    for step in range(105, 105 + MAX_TIMED_INTERRUPTION_STEPS):
        assert rec.observe(step, 3.0, 0.3, 6.0, 0.1) is None
    assert list(rec.seen) == [] and rec.counters["interruptions_not_ended"] == 1
    assert rec.hold(400, 2.0, HOLD) == HOLD


def test_an_excursion_that_comes_back_is_learned_and_its_hold_bounded() -> None:
    rec = RecurringInterruptions()
    rec.reported(100, 104, 6.0, 1.0, 0.03)
    out = [rec.observe(step, 1.0, 0.3, 6.0, 0.1) for step in range(105, 105 + REVERT_STEPS)]
    assert out[-1] is not None and (out[-1].onset, out[-1].duration) == (100, 5)
    assert rec.hold(300, 5.5, HOLD) == 5 * 3 // 2 + 2 + 1  # ceil(1.5 x 5) + 2
    assert rec.hold(300, 0.5, HOLD) == HOLD  # 1.5x is not alike to 7x
    rec.recognised(300, 5, 6.0)
    assert rec.hold(500, 6.0, HOLD) == 2 * 5 + 2  # on the interval (200)
    rec.recognised(500, 500, 6.0)  # bounded: never learned longer than a persistent change
    assert rec.hold(700, 6.0, HOLD) <= MAX_HOLD_STEPS


def test_strays_after_the_return_do_not_stop_the_learning_but_a_level_that_stays_does() -> None:
    rec = RecurringInterruptions()
    rec.reported(100, 104, 6.0, 1.0, 0.03)
    xs = [1.0, 1.0, 3.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]  # a GC pause after the return
    assert [o for o in (rec.observe(105 + i, x, 0.3, 6.0, 0.1) for i, x in enumerate(xs)) if o is not None]
    rec2 = RecurringInterruptions()
    rec2.reported(100, 104, 6.0, 1.0, 0.03)
    for i in range(20):
        rec2.observe(105 + i, 1.0 if i % 3 == 0 else 2.0, 0.3, 6.0, 0.1)
    assert list(rec2.seen) == []


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(interval=st.integers(50, 1000), duration=st.integers(HOLD + 1, MAX_INTERRUPTION_STEPS - 1),
       factor=st.floats(1.5, 10.0), jitter=st.floats(0.0, 0.1), cv=st.floats(0.01, 0.05),
       seed=st.integers(0, 2**16))
# a chance 2-step dip fired the speedup detector 4 steps before the 5th checkpoint, whose steps after a speedup were
# not held: a +57 % cusum report (drawn by hypothesis at cf20ef2)
@example(interval=345, duration=5, factor=2.0, jitter=0.0, cv=0.046875, seed=27866)
def test_property_a_recurring_interruption_is_reported_at_most_once(interval: int, duration: int, factor: float,
                                                                    jitter: float, cv: float, seed: int) -> None:
    """Any interval 50-1000 steps (jittered up to 10 %), duration from over the hold to 59 steps, 1.5-10x: at most
    one ``step_regression`` (the first occurrence), every magnitude bounded. Excursions are spike-sized: at least
    ``spike_z`` (6) noise sigmas over the level (a smaller one is the change-point test's, not the spike hold's)."""
    rng = np.random.default_rng(seed)
    interval = max(interval, duration + 60)  # the job runs between two of them
    onsets, o = [], 100
    while o < 100 + 5 * interval:
        onsets.append(o)
        o += max(duration + 60, int(interval * (1.0 + jitter * rng.uniform(-1, 1))))
    cv = min(cv, (factor - 1.0) / 8.0)
    found, _ = feed(series(o + 20, onsets, duration, factor, cv=cv, seed=seed))
    assert len(regressions(found)) <= 1, [(a.step, a.detail.get("pattern")) for a in regressions(found)]
    assert all(-1.0 <= a.magnitude <= 100.0 for a in found)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(interval=st.integers(80, 400), duration=st.integers(HOLD + 1, 30), factor=st.floats(2.0, 10.0),
       change=st.floats(1.3, 4.0), after=st.integers(0, 3), seed=st.integers(0, 2**16))
def test_property_a_persistent_change_after_a_recurrence_is_reported(interval: int, duration: int, factor: float,
                                                                     change: float, after: int, seed: int) -> None:
    """A persistent change (>= 60 steps) starting at the end of the third occurrence or up to 3 steps after it is
    reported within the longest hold plus the change-point test's delay."""
    onsets = [100 + k * (interval + duration) for k in range(3)]
    at = onsets[-1] + duration + after
    found, _ = feed(series(at + MAX_HOLD_STEPS + 100, onsets, duration, factor, cv=0.03, seed=seed,
                           change_at=at, change=change))
    late = [a for a in regressions(found) if a.step >= at]
    assert late, "a persistent change after a recurring interruption was lost"
    assert late[0].step - at <= MAX_HOLD_STEPS + 40


@pytest.mark.parametrize("factor", [1.5, 10.0])
def test_both_ends_of_the_level_range(factor: float) -> None:
    found, _ = feed(series(1200, [150, 450, 750, 1050], 20, factor, cv=0.02))
    assert len(regressions(found)) == 1


@pytest.mark.parametrize("seed", range(3))
def test_an_excursion_longer_than_an_interruption_is_a_change_even_when_it_recurs(seed: int) -> None:
    """50-step 2x interruptions every 200 steps of a 3 s job are learned; then 100-step ones on the same interval
    (300 s at 2x: persistent by the corpus' definition, longer than MAX_INTERRUPTION_STEPS) are each a level change,
    reported while they last, never a ``"recurring"`` spike (the hold was 2 * 50 + 2 steps: they ended inside it)."""
    rng = np.random.default_rng(seed)
    xs = 3.0 * np.maximum(0.2, 1.0 + 0.03 * rng.standard_normal(1100))
    for onset, duration in [(200, 50), (400, 50), (600, 100), (800, 100)]:
        xs[onset - 1:onset - 1 + duration] *= 2.0
    found, _ = feed(xs)
    for onset in (600, 800):
        late = [a for a in regressions(found) if onset <= a.step < onset + 100]
        assert late and late[0].step - onset <= MAX_INTERRUPTION_STEPS + HOLD, (onset, found)
        assert not [a for a in found if a.kind == "step_spike" and a.detail["first_step"] == onset]


def test_a_recurring_excursion_under_the_spike_test_at_its_edges_is_not_a_cusum_report() -> None:
    """The hypothesis example (interval 50 -> 75 steps, 15 steps at 1.5x, 4.7 % noise, seed 0): the second
    occurrence's leading step (z 5.8 against a young baseline's noise) and a later elevated step under the spike
    test went to the CUSUM, which fired 4 steps in (before: a ``cusum`` report at step 179). The excursion alike
    to the first is judged by its hold alone."""
    found, _ = feed(series(495, [100, 175, 250, 325, 400], 15, 1.5, cv=0.047, seed=0))
    assert [a.step for a in regressions(found)] == [104]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_an_excursion_a_step_longer_than_the_recurring_transients_before_it_is_held(seed: int) -> None:
    """Unflagged checkpoints of 4 steps at 4x against a 4-step hold, 100-300 steps apart (irregular: no periodic
    pattern), end within the hold five times (transient ``step_spike``); the sixth runs 5 steps. It was reported as
    a level change (a false arm, 3 of 3 seeds): an interruption was learned only from a level report. The transients
    of that kind seen twice or more now give it their hold (1.5x the longest, + 2 steps: 8), and it ends within
    it: ``step_spike`` ``"recurring"``, with the transients it was judged on."""
    rng = np.random.default_rng(seed)
    onsets = [int(v) for v in np.cumsum(rng.integers(100, 300, 8)) + 50]
    durations = [5 if j in (5, 7) else 4 for j in range(len(onsets))]
    found, det = feed(series(onsets[-1] + 40, onsets, durations, 4.0, seed=seed))
    assert regressions(found) == []
    held = [a for a in found if a.kind == "step_spike" and a.detail["pattern"] == "recurring"]
    assert held and held[0].detail["first_step"] == onsets[5]
    assert held[0].detail["recurring"]["transients_seen"] >= 2
    assert held[0].detail["recurring"]["longest_transient_steps"] == 4


def test_a_persistent_change_alike_to_recurring_transients_is_still_reported_within_their_hold() -> None:
    """The same 4-step 4x transients, then the job stays 4x slower from step 1500: reported as a level change after
    at most the transients' hold (8 steps), never before its onset."""
    onsets = [150, 330, 610, 790, 1020, 1240]
    found, _ = feed(series(1600, onsets, 4, 4.0, seed=4, change_at=1500, change=4.0))
    regs = regressions(found)
    assert regs and regs[0].detail["first_step"] >= 1500 and regs[0].step <= 1500 + 8 + 1, regs
    assert RecurringInterruptions().hold(0, 3.0, HOLD) == HOLD  # nothing seen: the base hold


def test_transients_are_bounded_and_one_step_ones_are_not_kept() -> None:
    """``transient``: a 1-step episode is not kept (no length to learn); at most MAX_OCCURRENCES are, each at most
    MAX_INTERRUPTION_STEPS long, and the hold they give is at most MAX_HOLD_STEPS."""
    rec = RecurringInterruptions()
    rec.transient(10, 1, 3.0)
    assert not rec.transients
    for i in range(20):
        rec.transient(100 * i, 500, 3.0)
    assert len(rec.transients) == rec.transients.maxlen and max(o.duration for o in rec.transients) == MAX_INTERRUPTION_STEPS
    assert rec.hold(5000, 3.0, HOLD) == MAX_HOLD_STEPS
