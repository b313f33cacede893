"""Tests of the job step-time change-point detector (daemon/profwatch/core/detection/regression.py) on generated series."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from profwatch.core.detection.drift import ramp_evidence, warm_up_sse
from profwatch.core.detection.job_detector import DetectionSettings
from profwatch.core.detection.regression import StepTimeRegressionDetector, cusum_design, cusum_threshold, fallen_level
from profwatch.core.detection.types import FinalizedStep
from profwatch.simulate.telemetry import TelemetryScenario, generate_telemetry
from tests.unit.detection_helpers import of_kind, run

BASE = TelemetryScenario(world_size=8, steps=300, cv=0.01, step_time_s=0.5)


def feed(xs: np.ndarray, settings: DetectionSettings | None = None, hold: int = 8,
         det: StepTimeRegressionDetector | None = None, first: int = 1) -> list[tuple[int, str, float, dict[str, Any]]]:
    det = det or StepTimeRegressionDetector("j", settings or DetectionSettings(), hold_steps=lambda _s, _t: hold)
    out: list[tuple[int, str, float, dict[str, Any]]] = []
    for i, x in enumerate(xs.tolist()):
        for a in det.on_step(FinalizedStep(first + i, x, 0, 8, None, None)):
            out.append((a.step, a.kind, a.magnitude, a.detail))
    return out


def series(n: int, cv: float, seed: int, *, at: int | None = None, shift: float = 0.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = 0.5 * np.maximum(0.2, 1.0 + cv * rng.standard_normal(n))
    if at is not None:
        x[at:] *= 1.0 + shift
    return x


@pytest.mark.parametrize(("slowdown", "pattern"), [(0.10, "cusum"), (0.20, "cusum"), (0.50, "level")])
def test_sustained_slowdown_fires_once_with_its_size_and_onset(slowdown: float, pattern: str) -> None:
    found, _ = run(generate_telemetry(replace(BASE, slowdown=slowdown, slowdown_from_step=100)), 8)
    regs = of_kind(found, "step_regression")
    assert len(regs) == 1, found  # debounced: the new level is re-learned, no second fire
    a = regs[0]
    assert a.detail["pattern"] == pattern
    assert a.magnitude == pytest.approx(slowdown, abs=0.03)
    assert 98 <= a.detail["first_step"] <= 100  # the change-point estimate
    # at 1 % noise a 10-20 % shift fires within the three steps the clip allows; 50 % is a spike episode
    # that fires once it outlasted the capture planner's lead (8 steps at 0.5 s/step)
    delay = a.step - 100 + 1
    assert (2 <= delay <= 3) if pattern == "cusum" else delay == 9
    assert a.ranks == ()


def test_shift_below_min_effect_is_never_reported() -> None:
    found, _ = run(generate_telemetry(replace(BASE, steps=800, slowdown=0.05, slowdown_from_step=100)), 8)
    assert of_kind(found, "step_regression") == []


def test_ten_percent_at_five_percent_noise_median_delay_within_lorden_bound() -> None:
    """Issue 11 item 8: 10 % at 5 % noise, median delay within 1.2x of ln(1e5) / (2^2 / 2) = 5.76 steps."""
    delays, early, missed = [], 0, []
    for seed in range(60):
        fired = [s for s, k, _, _ in feed(series(500, 0.05, seed, at=400, shift=0.10)) if k == "step_regression"]
        early += sum(s < 400 for s in fired)
        after = [s for s in fired if s >= 400]
        relearning = [s for s in fired if 400 - 46 <= s < 400]  # min_baseline_steps + baseline_lag_steps
        if not after and relearning:
            # The (counted) false alarm re-learned across the onset: the change entered the new window, and a
            # shift of exactly min_effect is then judged against a 30-value reference, its error counted
            # (regression.py _drift); seed 17 read +11.8 % against 10 % + 2.1 % and waits (it fired by luck before).
            continue
        if not after:
            missed.append(seed)
            continue
        delays.append(after[0] - 400 + 1)
    # A shift of exactly min_effect whose run reads under it is absorbed, by design: seed 57's run held at h
    # reading +9.7 % until the change entered the baseline as a line (it fired at 57 steps only while a chance
    # trend, significant against the least-squares error, reset S+; baseline.TREND_SE_FACTOR). At most one.
    assert len(missed) <= 1, f"seeds {missed}: missed"
    bound = math.log(1e5) / (2.0**2 / 2.0)
    assert float(np.median(delays)) <= 1.2 * bound
    assert min(delays) >= 2
    assert early <= 1  # 60 x 400 steps before the change, learning included: about 0.2 expected


def test_stationary_five_percent_noise_false_alarms_stay_rare() -> None:
    """3 x 20k stationary steps: the design rate is 1 per 100k steps (0.6 measured over 1M), so at most 2."""
    false = sum(k == "step_regression" for seed in (11, 12, 13) for _, k, _, _ in feed(series(20_000, 0.05, seed)))
    assert false <= 2


def test_single_spike_is_an_event_not_a_regression() -> None:
    xs = series(300, 0.05, seed=3)
    xs[150] *= 5.0
    found = feed(xs)
    assert [(s, k) for s, k, _, _ in found] == [(153, "step_spike")]  # reported once two normal steps followed
    assert found[0][3]["first_step"] == 151 and found[0][3]["duration_steps"] == 1


def test_spike_outlasting_the_hold_is_a_level_change() -> None:
    xs = series(300, 0.02, seed=4)
    xs[150:170] *= 6.0  # 20 steps at 6x: longer than the 8-step lead, whatever it turns out to be
    found = feed(xs, hold=8)
    assert [(k, d["pattern"]) for _, k, _, d in found][:1] == [("step_regression", "level")]
    assert found[0][0] == 151 + 8 and found[0][3]["first_step"] == 151


def test_gradual_drift_is_reported_once_per_threshold_grown() -> None:
    found, _ = run(generate_telemetry(replace(BASE, steps=400, drift_per_step=0.001, drift_from_step=50)), 8)
    assert of_kind(found, "step_regression") == [], "a drift is not a change point"
    drifts = of_kind(found, "drift")
    assert 2 <= len(drifts) <= 3, "a 35% drift over 350 steps: one report per 10 % grown, after the baseline learned"
    assert [round(a.detail["threshold"], 2) for a in drifts] == [round(0.1 * (i + 1), 2) for i in range(len(drifts))]
    assert all(a.detail["slope_per_step"] == pytest.approx(0.001, rel=0.35) for a in drifts)


def test_speedup_relearns_and_a_later_return_to_the_old_level_is_a_regression() -> None:
    xs = series(900, 0.02, seed=5)
    xs[300:] *= 0.7  # the job got 30 % faster (e.g. a slow node was replaced)
    xs[600:] /= 0.7  # and then back to where it was: 43 % slower than the new normal
    det = StepTimeRegressionDetector("j", DetectionSettings(), hold_steps=lambda _s, _t: 8)
    found = feed(xs, det=det)
    assert det.counters["speedups"] == 1
    regs = [(s, d["pattern"]) for s, k, _, d in found if k == "step_regression"]
    assert len(regs) == 1 and 601 <= regs[0][0] <= 615


def test_noise_floor_on_a_perfectly_steady_job() -> None:
    xs = np.full(200, 0.5)
    xs[120:] = 0.55  # +10 % with zero noise: the floor (1 %) stands in for sigma
    found = feed(xs)
    assert [(s, k) for s, k, _, _ in found] == [(123, "step_regression")]


def test_cusum_threshold_matches_siegmunds_arl() -> None:
    for k in (0.25, 0.5, 1.0, 2.0, 5.0):
        for arl in (1e3, 1e5, 1e7):
            h = cusum_threshold(k, arl)
            if h <= 0.05:
                continue  # clamped: such a large shift fires on any step over k + h / 2
            b = h + 1.166
            assert (math.exp(2 * k * b) - 2 * k * b - 1) / (2 * k * k) == pytest.approx(arl, rel=1e-6)
    assert cusum_threshold(1.0, 1e6) > cusum_threshold(1.0, 1e5) > cusum_threshold(2.0, 1e5)
    with pytest.raises(ValueError):
        cusum_threshold(0.0, 1e5)
    k, h, clip = cusum_design(0.10, 0.05, 1e5)
    assert k == pytest.approx(1.0) and h == pytest.approx(4.937, abs=0.01)
    assert 2 * (clip - k) <= h  # two outliers alone never fire


def test_restart_reset_and_runtime_settings_keep_the_learned_level() -> None:
    det = StepTimeRegressionDetector("j", DetectionSettings(), hold_steps=lambda _s, _t: 8)
    feed(series(200, 0.02, seed=6), det=det)
    assert det.baseline_step_time_s == pytest.approx(0.5, rel=0.02)
    det.update_settings(DetectionSettings(baseline_steps=100, min_baseline_steps=20))
    assert det.baseline_step_time_s == pytest.approx(0.5, rel=0.02)
    det.reset()
    assert det.baseline_step_time_s is None


def test_a_level_change_while_learning_is_reported_and_detection_goes_on() -> None:
    """A 3x level from step 26, while the baseline learns (it holds 9 values of the old level): once it outlasts
    the hold it is a ``step_regression`` (``pattern "level"``, ``learning`` true; it used to restart learning
    silently, so a change soon after a job's start was never reported), learning restarts at the new level, and
    a genuine +20 % later is found by the CUSUM as usual."""
    xs = series(400, 0.02, seed=7)
    xs[25:] *= 3.0
    xs[300:] *= 1.2
    det = StepTimeRegressionDetector("j", DetectionSettings(), hold_steps=lambda _s, _t: 8)
    found = feed(xs, det=det)
    assert det.counters["relearn_while_learning"] == 1
    assert det.baseline_step_time_s == pytest.approx(1.8, rel=0.05)
    early = [(s, m, d) for s, k, m, d in found if s < 300]
    assert len(early) == 1
    step, magnitude, detail = early[0]
    assert (detail["pattern"], detail["learning"], detail["first_step"]) == ("level", True, 26)
    assert 26 + 8 <= step <= 26 + 10 and magnitude == pytest.approx(2.0, abs=0.15)
    assert [(k, d["pattern"]) for s, k, _, d in found if s >= 300] == [("step_regression", "cusum")]


def test_a_start_up_level_that_falls_restarts_learning_and_a_change_after_it_is_found() -> None:
    """The first steps at 2x (a busy host at start-up) until step 45, then the usual level, then 1.6x from step
    80: learning restarts at the fall, so the slowdown is judged against the level the job runs at (it was
    learned as normal: 8 of 20 found with 10 % noise, 0 of 20 with 5 %)."""
    hits = 0
    for seed in range(10):
        xs = series(300, 0.05, seed=seed)
        xs[:45] *= 2.0
        xs[79:139] *= 1.6
        found = feed(xs)
        regs = [s for s, k, _, _ in found if k == "step_regression"]
        assert all(s >= 80 for s in regs), regs  # the fall itself is never a regression
        hits += any(80 <= s < 100 for s in regs)
    assert hits == 10


def test_a_drift_that_starts_mid_job_is_a_drift_not_a_change_point_and_a_sudden_change_during_it_is_found() -> None:
    """A flat job that starts drifting (+0.3 %/step from step 301) was paged as a run of step_regressions (about 4
    per run: each fire re-learned a baseline that could not follow the ramp); the change-point test now sees the
    ramp (``ramp_evidence``) and reports the rise as `drift`; a sudden +11 % later during the drift is still a
    step_regression within a few steps."""
    regs, drifts, delays = 0, 0, []
    for seed in range(10):
        rng = np.random.default_rng(seed)
        x = 0.5 * np.maximum(0.2, 1.0 + 0.02 * rng.standard_normal(1000))
        x *= 1.0 + 0.003 * np.maximum(0, np.arange(1000) - 300)
        x[800:] *= 1.11
        found = feed(x)
        regs += sum(1 for s, k, _, _ in found if k == "step_regression" and s < 801)
        drifts += sum(1 for s, k, _, _ in found if k == "drift" and s < 801)
        after = [s for s, k, _, _ in found if k == "step_regression" and s >= 801]
        assert after, f"seed {seed}: the sudden change was missed"
        delays.append(after[0] - 801 + 1)
    assert regs <= 1, regs
    assert 10 * 10 <= drifts <= 10 * 16  # +150 % by step 800: at most one report per 10 % grown
    assert float(np.median(delays)) <= 5, delays


def test_ramp_evidence_tells_a_ramp_from_a_step_and_finds_the_knee() -> None:
    rng = np.random.default_rng(0)
    noise = 0.02 * rng.standard_normal(100)
    step = np.where(np.arange(100) >= 96, 0.11, 0.0) + noise  # a sudden change seen for 4 steps
    gain, _, _ = ramp_evidence(step)
    assert gain < 0
    ramp = 0.003 * np.maximum(0, np.arange(100) - 60) + noise  # a drift since value 60
    gain, knee, slope = ramp_evidence(ramp)
    assert gain > 12 * 0.02**2 and abs(knee - 60) <= 8 and slope == pytest.approx(0.003, rel=0.3)
    assert ramp_evidence(np.zeros(5)) == (-math.inf, -1, 0.0)


def test_a_warm_up_that_only_gets_faster_never_pages_and_its_level_never_reaches_zero() -> None:
    """Issue 31, finding 1: step time falling linearly 1.0 s -> 0.05 s, then flat. The baseline's falling trend was
    extrapolated past zero: a `step_regression` with ``baseline_s`` 1e-12 and magnitude 5e10. The level is now
    never extrapolated below the smallest recent step, so a series that only gets faster reports nothing."""
    for n_fall, cv, seed in ((35, 0.03, 1), (100, 0.02, 1), (60, 0.02, 2), (100, 0.02, 3)):
        rng = np.random.default_rng(seed)
        level = np.concatenate([np.full(10, 1.0), np.linspace(1.0, 0.05, n_fall), np.full(400, 0.05)])
        xs = level * np.maximum(0.2, 1.0 + cv * rng.standard_normal(level.size))
        det = StepTimeRegressionDetector("j", DetectionSettings(), hold_steps=lambda _s, _t: 8)
        found = feed(xs, det=det)
        assert [(s, k) for s, k, _, _ in found if k in ("step_regression", "drift")] == [], (n_fall, seed)
        assert det.baseline_step_time_s is not None and det.baseline_step_time_s >= 0.04


@pytest.mark.parametrize("gap", [5, 15, 30, 45])
def test_a_slowdown_soon_after_a_speedup_is_found_in_the_usual_delay(gap: int) -> None:
    """Issue 31, finding 5: steady, a 25 % speedup, then every step 3x slower ``gap`` steps later. The speedup
    re-learned the baseline and the slowdown was learned as the new normal (no report in 12 of 12 replays). While
    the baseline re-learns, steps are now judged against the level before the speedup."""
    xs = series(700, 0.05, seed=gap)
    xs[300:] *= 0.75
    xs[300 + gap:] *= 3.0
    found = feed(xs)
    regs = [(s, m, d) for s, k, m, d in found if k == "step_regression"]
    assert len(regs) == 1, regs
    step, magnitude, detail = regs[0]
    assert 300 + gap + 1 <= step <= 300 + gap + 6  # the steady job's delay for a 2.25x level is 3 steps
    assert detail["reference"] == "before_speedup"
    # 3x the level after the speedup (+200 %), judged against that level as the speedup's own run showed it,
    # raised by one standard error and never above the level before (2.25x: +125 %)
    assert 1.15 <= magnitude <= 2.2


def test_a_moderate_slowdown_soon_after_a_speedup_is_found_and_a_speedup_alone_is_not_paged() -> None:
    """A 25 % speedup then +30 % (just under the level before the speedup) 5-45 steps later, 5 % noise: found
    within 6 steps, or 8 where the re-learned baseline took over first and held the first risen steps as spike
    steps for the hold (the interim reference is the level after the speedup, not the one before); the speedup alone
    pages nothing."""
    for gap in (5, 15, 30, 45):
        for seed in range(3):
            xs = series(700, 0.05, seed=seed * 100 + gap)
            xs[300:] *= 0.75
            xs[300 + gap:] *= 1.3
            regs = [s for s, k, _, _ in feed(xs) if k == "step_regression"]
            # within 6 steps, or the hold (8) when the young baseline read the +30 % steps as spike steps
            assert regs and 300 + gap < regs[0] <= 300 + gap + 8, (gap, seed, regs)
    for seed in range(10):
        xs = series(700, 0.05, seed=seed)
        xs[300:] *= 0.75
        assert [s for s, k, _, _ in feed(xs) if k == "step_regression"] == []


def test_a_chance_dip_taken_for_a_speedup_does_not_make_the_return_to_the_level_a_slowdown() -> None:
    """A 3-step -15 % dip at 5 % noise, then the same level: the lower CUSUM fires on the dip, and its run, picked
    because it was low, set the interim reference 8-10 % under the level; the return to the level was reported as
    +11-24 % (14 of 20 seeds). The steps after the speedup's fire do not confirm it, so the return is judged
    against the level before it, and a run begun against the interim reference starts again when the re-learned
    baseline takes over (it otherwise fired 47 steps later with its old mean, 3 of 20)."""
    late = 0
    for seed in range(20):
        xs = series(600, 0.05, seed=seed)
        xs[300:303] *= 0.85
        regs = [(s, d) for s, k, _, d in feed(xs) if k == "step_regression"]
        # seed 3: the dip goes on one step after the speedup's fire (0.79): confirmed, +11 % at step 311
        assert [s for s, d in regs if d.get("reference") == "before_speedup"] == ([311] if seed == 3 else []), seed
        late += any(300 < s <= 360 and d.get("reference") is None for s, d in regs)
    assert late == 0


def test_a_slowdown_after_an_unconfirmed_speedup_is_judged_against_the_level_before_it() -> None:
    """A speedup that the steps after it do not confirm (they are back at the old level): a slowdown to 3x right
    after it is still found, against the level before the speedup, and says so."""
    xs = series(600, 0.05, seed=7)
    xs[300:303] *= 0.8
    xs[303:] *= 3.0
    regs = [(s, m, d) for s, k, m, d in feed(xs) if k == "step_regression"]
    assert len(regs) == 1, regs
    step, magnitude, detail = regs[0]
    assert 304 <= step <= 308
    assert detail["reference"] == "before_speedup" and detail["speedup_confirmed"] is False
    assert detail["steps_after_speedup"] <= 1  # at most the run's first step, at the dip's level, before it rose
    assert detail["baseline_s"] == pytest.approx(detail["level_before_speedup_s"])
    assert magnitude == pytest.approx(2.0, abs=0.3)  # 3x the level before it, not over the dip's level


def test_a_cusum_run_under_min_effect_fires_only_when_the_steps_after_it_crossed_confirm() -> None:
    """Stationary 5 % noise with chance fires made frequent (``false_alarm_steps`` 1000): a run whose mean is under
    ``min_effect`` was let through by the ``EFFECT_Z`` leniency (4 fires at +7-10 % in 20 seeds of 1500 steps); it
    now also needs the steps after its crossing, which did not pick it, to be over the baseline: none. A real
    +10 % change still fires within the Lorden bound's margin (test_ten_percent_at_five_percent_noise_...)."""
    st = DetectionSettings(false_alarm_steps=1000)
    lenient = []
    for seed in range(20):
        xs = series(1500, 0.05, seed=seed)
        lenient += [(seed, s, m) for s, k, m, d in feed(xs, settings=st)
                    if k == "step_regression" and d["pattern"] == "cusum" and m < st.min_effect]
    assert lenient == []
    xs = series(600, 0.05, seed=11, at=300, shift=0.10)
    regs = [(s, m, d) for s, k, m, d in feed(xs) if k == "step_regression"]
    assert len(regs) == 1 and 300 < regs[0][0] <= 330, regs


def test_magnitudes_are_ratios_on_log_step_time() -> None:
    """A 50x stall that lasts reads +4900 % (the geometric mean of the run's ratios), not clipped."""
    xs = series(300, 0.02, seed=3)
    xs[200:] *= 50.0
    found = [(m, d) for _s, k, m, d in feed(xs) if k == "step_regression"]
    assert found and found[0][0] == pytest.approx(49.0, rel=0.05)


def test_warm_up_steps_reported_as_zero_seconds_never_form_a_baseline() -> None:
    """Adversarial finding: steps 1-199 reported as exactly 0 s on 4 ranks (a warm-up the hook did not time), then
    ~0.3 s steps, gave ``step_regression +30403437605.1%`` with ``baseline_s: 1e-09`` and armed a capture. A step
    time under ``MIN_STEP_S`` (1 us) is no measurement: it never enters the baseline, which keeps learning until it
    holds real steps; the job is steady at 0.3 s from there on, so nothing is reported."""
    import numpy as np

    from tests.unit.detection_helpers import run

    rng = np.random.default_rng(7)
    recs = []
    for step in range(1, 600):
        for rank in range(4):
            t = 0.0 if step < 200 else 0.3 * (1.0 + 0.02 * float(rng.standard_normal()))
            recs.append({"job_id": "sim", "rank": rank, "step": step, "step_time_s": t,
                         "ts_unix_s": 1.7e9 + step * 0.3 + rank * 1e-3})
    for tiny in (0.0, 5e-7):
        found, det = run([r | {"step_time_s": tiny} if r["step"] < 200 else r for r in recs], 4)
        assert [(a.kind, a.step, a.magnitude) for a in found if a.kind in ("step_regression", "drift")] == [], tiny
        for a in found:
            assert abs(a.magnitude) < 100 and (a.detail.get("baseline_s") or 1.0) >= 1e-3, (a.kind, a.detail)
        assert (b := det.baseline_step_time_s) is not None and b > 0.25


def _warm_up(seed: int, cv: float, low: float, n: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    level = np.ones(600)
    level[:n] = np.linspace(low, 1.0, n)
    return 0.5 * level * np.maximum(0.2, 1.0 + cv * rng.standard_normal(600))


def test_a_warm_up_that_rises_and_settles_is_learned_past_not_paged() -> None:
    """Issue 31's corpus, class warmup_up: the first learned steps rise linearly from 0.6x to the job's level over 40
    steps, then stay there (10 % noise). Learned as normal, the young baseline read the settled level as a
    regression (``pattern "baseline"`` or ``"cusum"`` at steps 64-166) in 30 of 30 seeds; now learning starts again
    past the warm-up (counted in ``warmup_restarts``)."""
    fired = restarted = 0
    for seed in range(30):
        det = StepTimeRegressionDetector("j", DetectionSettings(), hold_steps=lambda _s, _t: 8)
        fired += any(k == "step_regression" for _, k, _, _ in feed(_warm_up(seed, 0.10, 0.6, 40), det=det))
        restarted += det.counters["warmup_restarts"] > 0
    assert fired <= 6 and restarted >= 24, (fired, restarted)


def _rising_warm_up(n: int, low: float, shape: str, cv: float, seed: int, total: int = 500) -> np.ndarray:
    """Job step times (0.5 s level) whose first ``n`` steps rise from ``low`` x the level to it, linearly or
    exponentially (1 - (1 - low) e^(-4 i / n)), then stay there, at relative noise ``cv``; the first 10 steps are
    dropped, as ``JobDetector`` drops ``warmup_steps``."""
    rng = np.random.default_rng(seed)
    level = np.ones(total + 10)
    i = np.arange(n)
    level[:n] = np.linspace(low, 1.0, n) if shape == "linear" else 1.0 - (1.0 - low) * np.exp(-i / (n / 4.0))
    return (0.5 * level * np.maximum(0.2, 1.0 + cv * rng.standard_normal(total + 10)))[10:]


WARM_UPS = [(n + 10, low) for n in (5, 15, 30, 45, 60) for low in (0.3, 0.6, 0.9)]
"""(steps of the rise, counted from step 1; starting level): issue 31's ``warmup_up`` kind, 5-60 steps after the
10 the detector never sees, 0.3-0.9x."""


@pytest.mark.parametrize("shape", ["linear", "exponential"])
def test_a_noiseless_warm_up_that_rises_settles_into_the_level_without_a_regression(shape: str) -> None:
    """Issue 31 (class ``warmup_up``): a job that starts fast and settles slower (caches filling, fragmentation,
    clocks). Noiseless, every such warm-up must settle into the level without a report. Before: a rise over the
    young baseline during the first learning was a level change (+37-180 %), or the learned steps were split into
    two levels, in 60 of 288 shapes of this kind; the first learning now waits while its steps still rise and
    takes a rise that continues the warm-up's own line for the warm-up."""
    for n, low in WARM_UPS:
        det = StepTimeRegressionDetector("j", DetectionSettings(), hold_steps=lambda _s, _t: 8)
        found = feed(_rising_warm_up(n, low, shape, 0.0, 0), det=det, first=11)
        assert [(s, k, round(m, 3)) for s, k, m, _ in found if k in ("step_regression", "drift")] == [], (n, low)
        assert det.baseline_step_time_s == pytest.approx(0.5, rel=0.02), (n, low)


def test_a_noisy_warm_up_that_rises_settles_into_the_level_without_a_regression() -> None:
    """The same warm-ups, linear and exponential, at 3, 8 and 15 % noise, 3 seeds each (270 series of 500 steps):
    38 paged before (``pattern "level"`` while learning, a split of the learned steps, ``"baseline"``), 5 now (a
    long linear rise a step fits better than a ramp, at 3-15 % noise: the rest of the ambiguity)."""
    fired = []
    for (n, low), shape, cv, seed in itertools.product(WARM_UPS, ("linear", "exponential"), (0.03, 0.08, 0.15),
                                                       range(3)):
        found = feed(_rising_warm_up(n, low, shape, cv, seed), first=11)
        if any(k in ("step_regression", "drift") for _, k, _, _ in found):
            fired.append((n, low, shape, cv, seed))
    assert len(fired) <= 8, fired


@pytest.mark.parametrize(("n", "low", "onset", "factor", "least"),
                         [(40, 0.6, 25, 3.0, 20), (70, 0.3, 40, 3.0, 20), (40, 0.6, 30, 1.3, 18),
                          (40, 0.6, 80, 1.3, 20), (30, 0.5, 70, 1.5, 20)])
def test_a_slowdown_during_or_after_a_rising_warm_up_is_still_found(n: int, low: float, onset: int, factor: float,
                                                                     least: int) -> None:
    """A real slowdown that starts while the job still warms up (3x: it jumps off the warm-up's line) or after it
    settled is reported, after its onset, in ``least`` of 20 seeds (5 % noise), and nothing is reported before it.
    Measured now: 20, 20, 19, 20 and 20 of 20. Before the warm-up rules, the first, third and fourth cases: 20 of 20
    each, but the warm-up itself was reported before the onset in 4 of 20 of the 1.3x at step 80."""
    found = 0
    for seed in range(20):
        x = _rising_warm_up(n, low, "linear", 0.05, seed)
        x[onset - 11:] *= factor
        regs = [s for s, k, _, _ in feed(x, first=11) if k == "step_regression"]
        assert all(s >= onset for s in regs), (seed, regs)
        found += bool(regs)
    assert found >= least, found


@pytest.mark.parametrize(("cv", "onset", "factor"), [(0.05, 30, 1.3), (0.10, 35, 1.3), (0.05, 20, 1.2)])
def test_a_sudden_change_while_learning_is_not_taken_for_a_warm_up(cv: float, onset: int, factor: float) -> None:
    """The warm-up rule restarts learning only for a rise from the first learned steps that then stays flat and
    explains them better than a step: a sudden change with its onset among the learned steps is still reported."""
    found = 0
    for seed in range(30):
        x = series(600, cv, seed)
        x[onset:] *= factor
        found += any(k == "step_regression" and s >= onset for s, k, _, _ in feed(x))
    assert found >= 29, found


def test_a_change_among_the_first_learned_steps_is_reported_at_the_end_of_learning() -> None:
    """Issue 31's corpus (class noisy): +30 % from the 12th learned step at 9 % noise is no spike step (z about 3),
    so it entered the young baseline, which learned the changed level as normal: never reported. The first learned
    steps are now split in two levels when that explains them far better than one: reported once, as a level change
    while learning with its onset and ratio, and the baseline learns the later level (nothing more fires)."""
    x = series(600, 0.094, 3)
    x[11:] *= 1.3
    got = feed(x)
    assert len(got) == 1, got
    step, kind, mag, detail = got[0]
    assert kind == "step_regression" and detail["learning"] and detail["reference"] == "learned_steps"
    assert step <= 50 and abs(detail["first_step"] - 12) <= 2 and mag == pytest.approx(0.3, abs=0.08)


@pytest.mark.parametrize("before", [5, 6, 7])
@pytest.mark.parametrize(("factor", "cv"), [(1.3, 0.042), (1.3, 0.08), (1.2, 0.03)])
def test_a_change_a_few_steps_into_the_learning_is_split_off(before: int, factor: float, cv: float) -> None:
    """The randomized corpus (seed 32, class steady, run 15): 1.3x from the 8th learned step at 4 % noise left 7
    steps at the level before it, fewer than a split needed (LEARNED_STEP_MIN_AFTER), and was learned as normal:
    0-9 of 20 seeds reported before. A split with 5-7 steps before it is now a change when it clears min_effect by
    two standard errors: reported (reference "learned_steps") by the end of learning, never before the onset."""
    found = 0
    for seed in range(20):
        x = series(600, cv, seed)
        x[before:] *= factor
        got = feed(x)
        assert not [a for a in got if a[0] <= before], got
        # first_step: the onset, later by the steps the spike screen held out of the learned ones (up to the hold)
        found += any(d.get("reference") == "learned_steps" and before <= d["first_step"] <= before + 1 + 8
                     for _, _, _, d in got)
    assert found >= 17, found


@pytest.mark.parametrize("cv", [0.03, 0.10])
def test_a_short_warm_up_is_no_split_with_few_steps_before(cv: float) -> None:
    """A warm-up whose first 5 steps rise to the level (from 0.6-0.9x) is not split off as a change now that 5-7
    steps before a split can be enough (LEARNED_STEP_MIN_BEFORE): such a split must clear min_effect by two
    standard errors, and the earlier part must not rise."""
    for low in (0.9, 0.8, 0.6):
        for seed in range(40):
            x = series(600, cv, seed)
            x[:5] *= np.linspace(low, 1.0, 5)
            assert not [d for _, _, _, d in feed(x) if d.get("reference") == "learned_steps"], (low, seed)


def test_a_flat_start_is_not_split_into_two_levels() -> None:
    """The split needs LEARNED_STEP_EVIDENCE noise variances: 200 flat series (10 % noise) report no more than
    before the rule (4 of 200 over 300 steps: the young baseline's own false alarms, docs/detection.md), and none of
    them is a split of the learned steps."""
    split = 0
    fired = 0
    for seed in range(200):
        got = [a for a in feed(series(300, 0.10, 1000 + seed)) if a[1] == "step_regression"]
        fired += bool(got)
        split += any(d.get("reference") == "learned_steps" for _, _, _, d in got)
    assert split == 0 and fired <= 4, (split, fired)


@pytest.mark.parametrize("size", [1.3, 3.0])
@pytest.mark.parametrize("gap", [1, 3, 10, 25, 40])
def test_a_second_slowdown_soon_after_a_report_is_its_own_report(gap: int, size: float) -> None:
    """Issue 31 (randomized corpus, class moe run 35): steady, +40 % job-wide from step 200 (reported), then a
    further ``size``x from ``gap`` steps after that report. The report re-learned the baseline, which absorbed the
    second change (1.3x at gaps 1-10 and 3x at gap 1: never reported; later gaps: found 20-30 steps late). While the
    baseline re-learns, steps are now judged against the level the report measured (``reference
    "reported_level"``): the second change is its own report in the steady job's delay (hold 8 + 1 step, a few
    more when +30 % straddles spike_min_effect), its magnitude a ratio to the first change's level."""
    for seed in range(3):
        xs = series(700, 0.03, seed=seed * 100 + gap)
        xs[200:] *= 1.4
        first = [s for s, k, _, _ in feed(xs) if k == "step_regression"]
        assert len(first) == 1 and 200 < first[0] <= 210, first
        onset = first[0] + gap
        xs[onset:] *= size
        regs = [(s, m, d) for s, k, m, d in feed(xs) if k == "step_regression"]
        assert len(regs) == 2 and regs[0][0] == first[0], (seed, regs)
        step, magnitude, detail = regs[1]
        assert onset < step <= onset + 12, (seed, step, onset)
        if onset - first[0] <= 30:  # judged while the baseline re-learns (min_baseline_steps 30)
            assert detail["reference"] == "reported_level"
            assert detail["baseline_s"] == pytest.approx(0.5 * 1.4, rel=0.06)
        assert magnitude == pytest.approx(size - 1.0, abs=0.12 * size), (seed, magnitude)


def test_a_reported_level_alone_or_with_a_checkpoint_after_it_is_no_second_report() -> None:
    """The interim reference after a report is the level the report measured, raised by one standard error: a
    job that stays at that level reports nothing more (+10-60 % at 3-8 % noise, 20 seeds each; a CUSUM run that
    began with steps before the change, or left spike steps out, once read +28 % for +35 % and reported the same
    level again at +10 %), and a 4-step checkpoint (3x) soon after the report is held as a spike, not reported."""
    for shift in (0.10, 0.2, 0.35, 0.6):
        for cv in (0.03, 0.08):
            for seed in range(20):
                xs = series(500, cv, seed=seed, at=200, shift=shift)
                regs = [(s, round(m, 3), d.get("reference")) for s, k, m, d in feed(xs) if k == "step_regression"]
                # (a +10 % change at 8 % noise read +7 % once, and the learned baseline's own test found the rest
                # 128 steps later: that test's business, not the interim reference's)
                assert regs and all(r[2] != "reported_level" and not regs[0][0] < r[0] <= regs[0][0] + 60
                                    for r in regs), (shift, cv, seed, regs)
    for gap in (2, 10, 20):
        xs = series(500, 0.03, seed=gap, at=200, shift=0.4)
        xs[209 + gap:213 + gap] *= 3.0
        regs = [s for s, k, _, _ in feed(xs) if k == "step_regression"]
        assert regs == [209], (gap, regs)


@pytest.mark.parametrize(("low", "high", "factor", "least"), [(0.3, 0.5, 1.25, 8), (0.6, 1.0, 1.2, 5)])
def test_a_moderate_slowdown_during_a_rising_warm_up_jumps_off_its_line(low: float, high: float, factor: float,
                                                                         least: int) -> None:
    """A 1.2-1.25x slowdown at step 40 of a 60-step linear warm-up (3 % noise) jumps off the warm-up's line by more
    than ``min_effect`` plus its standard error: it is no continuation of the warm-up (a bound of
    ``spike_min_effect`` took it for one and learned the changed level in 7-8 of 10 seeds; now found in 9 and 6 of
    10); the same warm-up without the slowdown reports nothing."""
    found = 0
    for seed in range(10):
        rng = np.random.default_rng(seed)
        level = np.ones(600)
        level[:60] = np.linspace(low, high, 60)
        level[60:] = high
        x = 0.5 * level * np.maximum(0.2, 1.0 + 0.03 * rng.standard_normal(600))
        assert [k for _, k, _, _ in feed(x) if k in ("step_regression", "drift")] == [], seed
        x[40:] *= factor
        regs = [s for s, k, _, _ in feed(x) if k == "step_regression"]
        assert all(s >= 40 for s in regs), (seed, regs)
        found += bool(regs)
    assert found >= least, found


def _ramped_in(noise: str, seed: int, shift: float, ramp: int = 5) -> np.ndarray:
    """500 steps of 0.5 s at 5 % heavy-tailed noise (``"t3"``: Student's t with 3 degrees of freedom; ``"burst"``:
    Gaussian with 10 % of steps 1.2-1.6x, a busy host), ``1 + shift`` x from step 200 on, reached over ``ramp``
    steps (a load that builds up)."""
    rng = np.random.default_rng(seed)
    n = 500
    if noise == "t3":
        e = 1.0 + 0.05 * rng.standard_t(3, n)
    else:
        e = (1.0 + 0.05 * rng.standard_normal(n)) * np.where(rng.random(n) < 0.1, rng.uniform(1.2, 1.6, n), 1.0)
    level = np.ones(n)
    level[200:] = 1.0 + shift
    level[200:200 + ramp] = 1.0 + shift * np.arange(1, ramp + 1) / ramp
    return 0.5 * np.maximum(0.2, e) * level


def test_a_change_that_ramps_in_over_a_few_steps_is_reported_once() -> None:
    """A +66 % or 2x change that builds up over 5 steps, at 5 % heavy-tailed noise: the first report fired on the
    ramp's first 2-4 steps and measured a level the change had not reached, and the interim reference after it
    (``"reported_level"``) reported the rest of the rise again (+8-43 %): 29 of 80 series before. The interim
    reference now follows the few steps after a report that rested on a CUSUM run or on risen steps that still
    rose (REPORT_FOLLOW_STEPS), and a further rise judged against it must clear ``min_effect`` by itself: 3 of 80
    (CUSUM reports of +12-15 % on the ramp's first steps, whose rise outlasts the follow)."""
    twice = []
    for noise, shift, seed in itertools.product(("t3", "burst"), (0.66, 1.0), range(20)):
        regs = [(s, round(m, 3), d.get("reference")) for s, k, m, d in feed(_ramped_in(noise, seed, shift))
                if k == "step_regression" and s >= 200]
        assert regs, (noise, shift, seed)
        if any(r[2] == "reported_level" for r in regs[1:]):
            twice.append((noise, shift, seed, regs))
    assert len(twice) <= 3, twice


@pytest.mark.parametrize("gap", [5, 10, 25])
def test_a_further_slowdown_after_a_cusum_report_is_still_its_own_report(gap: int) -> None:
    """The follow after a CUSUM report lasts REPORT_FOLLOW_STEPS steps: +20 % from step 200 (3 % noise, a CUSUM
    report), then a further 1.3x from ``gap`` steps after that report is its own report in the steady job's delay,
    judged against the first change's level."""
    for seed in range(5):
        xs = series(600, 0.03, seed=seed * 7 + gap, at=200, shift=0.2)
        first = [(s, d["pattern"]) for s, k, _, d in feed(xs) if k == "step_regression"]
        assert len(first) == 1 and first[0][1] == "cusum" and 200 < first[0][0] <= 212, first
        onset = first[0][0] + gap
        xs[onset:] *= 1.3
        regs = [(s, m, d) for s, k, m, d in feed(xs) if k == "step_regression"]
        assert len(regs) == 2 and regs[0][0] == first[0][0], (seed, regs)
        step, magnitude, detail = regs[1]
        assert onset < step <= onset + 12, (seed, step, onset)
        assert magnitude == pytest.approx(0.3, abs=0.1), (seed, magnitude)


@pytest.mark.parametrize(("low", "onset", "least"), [(0.6, 40, 9), (0.8, 50, 8)])
def test_a_small_slowdown_during_a_rising_warm_up_is_found_off_its_line(low: float, onset: int, least: int) -> None:
    """Issue 31's corpus kind (warm-ups up, a change while the baseline learns): 1.15x from step ``onset`` of a
    60-step linear rise from ``low`` to 1.0 (3 % noise). At the end of the first learning the steps rose, so
    learning restarted from the warm-up's flat part, which held the change: learned as the level the warm-up
    settled at (found in 1 and 0 of 10 seeds before). The learned steps are now searched for a jump off the
    earlier steps' line before learning restarts (``reference "warm_up_line"``, its magnitude the jump): 10 and 9
    of 10; nothing is reported before the onset, and the warm-up alone reports nothing."""
    found = 0
    for seed in range(10):
        rng = np.random.default_rng(seed)
        level = np.ones(600)
        level[:60] = np.linspace(low, 1.0, 60)
        x = 0.5 * level * np.maximum(0.2, 1.0 + 0.03 * rng.standard_normal(600))
        assert [k for _, k, _, _ in feed(x) if k in ("step_regression", "drift")] == [], seed
        x[onset:] *= 1.15
        regs = [(s, m, d.get("reference")) for s, k, m, d in feed(x) if k == "step_regression"]
        assert all(s >= onset for s, _, _ in regs), (seed, regs)
        assert all(0.1 <= m <= 0.25 for _, m, ref in regs if ref == "warm_up_line"), (seed, regs)
        found += bool(regs)
    assert found >= least, found


@pytest.mark.parametrize(("at", "shift"), [(20, 0.12), (20, 0.15), (30, 0.12), (30, 0.15), (40, 0.12)])
def test_a_small_change_during_the_first_learning_is_reported_once(at: int, shift: float) -> None:
    """+12-15 % from step ``at`` of the first learning (3 % noise) is found from the learned steps
    (``reference "learned_steps"``) once: the watch for an excursion's return took the change going on after that
    report for a new level over the one before it and reported it again 12-20 steps later (seeds 0-5)."""
    for seed in range(6):
        rng = np.random.default_rng(seed)
        x = 0.5 * np.maximum(0.2, 1 + 0.03 * rng.standard_normal(400))
        x[at:] *= 1 + shift
        regs = [(s, round(m, 3), d.get("reference")) for s, k, m, d in feed(x) if k == "step_regression"]
        assert len(regs) == 1, (seed, regs)


@pytest.mark.parametrize("factor", [2.0, 3.0])
def test_a_large_slowdown_right_after_a_cusum_report_is_its_own_report(factor: float) -> None:
    """+20 % from step 200 (3 % noise, a CUSUM report), then ``factor`` x more from the step right after the report:
    the follow after the report (REPORT_FOLLOW_STEPS) took it for the first change's rest and it was never
    reported (0 of 8 seeds); the reference now follows at most FOLLOW_MAX_RATIO times the reported level."""
    for seed in range(8):
        xs = series(600, 0.03, seed=seed * 7 + 100, at=200, shift=0.2)
        first = [s for s, k, _, d in feed(xs) if k == "step_regression"]
        assert len(first) == 1, (seed, first)
        xs[first[0]:] *= factor  # from step first + 1 on (step i + 1 is xs[i])
        regs = [(s, round(m, 2)) for s, k, m, _ in feed(xs) if k == "step_regression"]
        assert len(regs) == 2 and first[0] < regs[1][0] <= first[0] + 30, (seed, regs)
        assert regs[1][1] >= 0.1, (seed, regs)  # against the followed reference (at most 1.5x the first level)


@pytest.mark.parametrize("speedup", [0.9, 0.7, 0.6, 0.5])
@pytest.mark.parametrize("gap", [3, 4, 6, 10, 30, 60])
def test_a_slowdown_soon_after_a_speedup_is_found_against_the_level_after_it(speedup: float, gap: int) -> None:
    """5 % noise, seeds 34-37: the level falls to ``speedup`` x at step 300, then +30 % ``gap`` steps later (under
    the old level for the larger speedups): a slowdown of the new level, expected within 40 steps. The speedup's
    lower CUSUM run began on a chance low step before it, so its mean read 0.32 s for a level of 0.25 s after -50 %
    and +30 % from there sat at the reference (lost: seeds 36 and 37 at -40 to -50 %, gaps 3-20); the run is now
    split at its fall (``fallen_level``), and the steps of the rise's run before it rises count as evidence of the
    fallen level (a rise 3 steps after the speedup left no other step to confirm it)."""
    for seed in range(34, 38):
        xs = series(700, 0.05, seed=seed)
        xs[300:] *= speedup
        xs[300 + gap:] *= 1.3
        regs = [s for s, k, _, _ in feed(xs) if k == "step_regression"]
        assert regs and 300 + gap < regs[0] <= 300 + gap + 40, (seed, regs)


@pytest.mark.parametrize(("n", "cv"), [(5, 0.03), (5, 0.05), (8, 0.03)])
def test_a_short_saturating_warm_up_is_not_a_change_of_the_first_learned_steps(n: int, cv: float) -> None:
    """The first ``n`` steps of a generation ``1 - 0.2 exp(-2.5 i / n)`` of the level (0.80-0.97x for 5 steps, a
    warm-up that saturates), seeds 20-59: nothing to report. The short split of the first learned steps (5-7 before
    a change) read it as a change (5 steps at 5 % noise: seeds 25, 47 and 49, +17.7 % from step 6 for 47; 8 steps at
    3 %: seed 43); a warm-up curve (a rise from the first step, then flat) now explains them better than the split
    by WARM_UP_SHORT_EVIDENCE noise variances."""
    fired = []
    for seed in range(20, 60):
        xs = series(300, cv, seed=seed)
        xs[:n] *= 1 - 0.2 * np.exp(-np.arange(n) / (n / 2.5))
        fired += [(seed, s, round(m, 3)) for s, k, m, _ in feed(xs) if k == "step_regression"]
    assert fired == []


def test_a_rising_warm_up_a_line_explains_is_no_change_of_the_learned_steps() -> None:
    """``bench/bench_corpus.py`` seed 32, ``warmup_up`` run 8: 0.74 -> 1.0 over 51 steps at 9 % noise, its learned
    steps split at step 31 and reported as +16 % (a false arm; the split beat one straight line through them by 0.4
    noise variances). The kind: warm-ups of 15-61 steps from 0.6-0.85x, linear and exponential, at 5-13 % noise,
    2 seeds each (108 series): 5 reported a change of their learned steps before (seed 1: 0.6x/30 steps at 13 %,
    0.74x/30 and 45 steps at 9 %, 0.85x/30 steps at 5 %; 0.6x/61 exponential at 9 %), none now: a split must beat
    the best warm-up curve (a straight rise from the first learned step, flat from its knee on, or one line) by
    WARM_UP_SHAPE_EVIDENCE noise variances."""
    fired = []
    for n, low, shape, cv, seed in itertools.product((15, 30, 45, 61), (0.6, 0.74, 0.85), ("linear", "exponential"),
                                                     (0.05, 0.09, 0.13), range(2)):
        found = feed(_rising_warm_up(n, low, shape, cv, seed, total=300), first=11)
        fired += [(n, low, shape, cv, seed, s) for s, k, _, _ in found if k == "step_regression"]
    assert fired == []


def test_warm_up_sse_fits_a_rise_then_flat_and_not_a_flat_start() -> None:
    """``warm_up_sse``: a noiseless rise over 10 values, then flat, fits exactly at its knee; a flat start followed
    by a jump (a sudden change) leaves a residual; a falling series has no rising curve (inf)."""
    rise = np.minimum(np.arange(40), 10) * 0.02
    sse, knee = warm_up_sse(rise)
    assert sse == pytest.approx(0.0, abs=1e-12) and knee == 10
    jump = np.where(np.arange(40) >= 12, 0.3, 0.0)
    assert warm_up_sse(jump)[0] > 0.1
    assert warm_up_sse(-rise) == (math.inf, -1)


MOE_RUN_15 = [0.42886, 0.3775, 0.39249, 0.39488, 0.41762, 0.36123, 0.37789, 0.35386, 0.36951, 0.47959, 0.37054, 0.32964, 0.32709, 0.41745, 0.33728, 0.35376, 0.39062, 0.32975, 0.35066, 0.36748, 0.33586, 0.41442, 0.354, 0.32807, 0.35026, 0.37636, 0.33997, 0.35857, 0.39098, 0.33256, 0.40827, 0.40675, 0.39543, 0.42769, 0.41055, 0.30194, 0.34138, 0.33715, 0.36777, 0.35145, 0.37173, 0.34887, 0.35029, 0.38987, 0.33217, 0.30595, 0.34775, 0.39592, 0.32865, 0.36616, 0.39708, 0.37351, 0.37914, 0.36859, 0.39781, 0.35656, 0.33472, 0.4222, 0.4023, 0.36596, 0.36295, 0.42033, 0.39763, 0.34641, 0.28568, 0.37622, 0.38894, 0.37934, 0.39988, 0.3506, 0.34782, 0.35322, 0.38954, 0.34883, 0.47148, 0.38582, 0.36855, 0.32776, 0.3628, 0.34664, 0.3568, 0.36281, 0.33687, 0.39614, 0.34037, 0.36713, 0.34808, 0.36215, 0.39685, 0.41855, 0.3442, 0.32944, 0.34541, 0.3956, 0.38458, 0.35407, 0.30379, 0.39062, 0.4049, 0.40664, 0.3684, 0.37839, 0.42694, 0.42972, 0.35254, 0.3722, 0.35498, 0.33498, 0.35759, 0.34507, 0.3607, 0.37056, 0.33781, 0.39366, 0.38457, 0.37463, 0.38278, 0.36594, 0.3953, 0.38363, 0.31932, 0.42813, 0.37019, 0.30451, 0.35565, 0.41491, 0.46515, 0.4075, 0.35328, 0.35989, 0.42397, 0.41965, 0.41627, 0.4098, 0.3865, 0.47407, 0.36857, 0.37169, 0.42193, 0.40568, 0.42785]
"""Job step times (s) of steps 11-151 of ``bench/bench_corpus.py`` seed 32, class ``moe``, run 15 (32 ranks,
0.37 s steps, 9.9 % noise; healthy until its hot expert starts at step 698), generated by that script."""


def test_a_cusum_run_at_high_noise_that_clears_min_effect_by_less_than_its_error_waits_for_confirmation() -> None:
    """The corpus's MOE_RUN_15 fired a plain CUSUM ``step_regression`` of +10.5 % at step 151 (a run of 16 steps at
    9.2 % noise: its mean cleared min_effect by 0.05 standard errors), a false arm. At noise over min_effect /
    CONFIRM_DELTA such a run now waits for the steps after it to confirm, as a marginal one does: none came."""
    xs = np.asarray(MOE_RUN_15)
    assert [(s, round(m, 3)) for s, k, m, _ in feed(xs, first=11) if k == "step_regression"] == []
    # a real change at that noise is still found, in about the same delay
    for shift in (0.2, 0.3):
        found = 0
        for seed in range(10):
            ys = series(500, 0.092, seed=seed + 700, at=300, shift=shift)
            regs = [s for s, k, _, _ in feed(ys) if k == "step_regression" and s >= 300]
            found += bool(regs) and regs[0] <= 300 + 40
        assert found >= 9, (shift, found)


@pytest.mark.parametrize(("dur", "height"), [(4, 2.0), (5, 1.6)])
def test_a_change_that_begins_as_a_checkpoint_ends_is_reported_once(dur: int, height: float) -> None:
    """A checkpoint every 100 steps (``dur`` steps at ``height`` x, 3 % noise), and the job 3x slower from the step
    after the one at step 400 ends: the spike filter held both as one excursion and reported it at the median of
    its steps (+50 % for 2x then 3x); the 3x that went on was reported a second time, 3 steps later, against that
    level (8 of 8 seeds). The level a report of held steps measured is now the later of their two levels when they
    hold two (``_level_later``): one report."""
    for seed in range(8):
        xs = series(800, 0.03, seed=seed)
        for c in range(100, 800, 100):
            xs[c:c + dur] *= height
        xs[400 + dur + 1:] *= 3.0
        regs = [(s, round(m, 2), d.get("reference")) for s, k, m, d in feed(xs) if k == "step_regression"]
        assert len([r for r in regs if r[0] > 400]) == 1, (seed, regs)


def test_a_speedups_run_is_split_only_past_the_steps_before_its_fall() -> None:
    """``fallen_level``: the lower CUSUM run of a -50 % speedup that began on a chance low step before it measures
    the level after the fall (the whole run's mean read 0.32 s for 0.25 s); a run down a slow decline at 17 % noise
    is not split at its last, lowest step (``bench/bench_corpus.py`` seed 32, ``faster`` run 9: that level, -47 %
    from one step, made a chance run over the steps after it a +10 % slowdown on a series that only got faster)."""
    level, n = fallen_level([0.47, 0.26, 0.25], 0.05)
    assert n == 2 and level == pytest.approx(math.sqrt(0.26 * 0.25))
    rng = np.random.default_rng(9)
    decline = list(np.linspace(1.0, 0.85, 50) * np.exp(0.17 * rng.standard_normal(50))) + [0.53]
    level, n = fallen_level(decline, 0.17)
    assert n >= 48 and level > 0.8, (level, n)
    assert fallen_level([0.5, 0.49, 0.51], 0.05) == (pytest.approx(0.49997, abs=1e-3), 3)  # no fall: one level


def test_a_doubling_soon_after_a_warm_down_is_reported() -> None:
    rng = np.random.default_rng(7025)
    x = 1.0 * np.maximum(0.2, 1 + 0.02 * rng.standard_normal(600))
    x[:38] *= np.linspace(4.26, 1.0, 38)
    x[40:] *= 2.0
    regs = [f for f in feed(x) if f[1] == "step_regression" and f[0] >= 41]
    assert regs and regs[0][0] <= 41 + 60, regs


def test_a_step_soon_after_a_warm_down_is_reported_across_sizes_gaps_and_falls() -> None:
    """The kind of the test above: warm-downs of 3-10x over 20-60 steps, then a step of 1.5x, 2x or 3x 0-40 steps
    after their end (2 % noise), 60 drawn series: 7 were lost before the stepped warm-up curve (``_curve_split``),
    1 now (a 1.5x step one step after a 7.5x fall); found within 60 steps of the onset, none before it."""
    lost = []
    for seed in range(60):
        rng = np.random.default_rng([7000, seed])
        fall, n_fall = float(rng.uniform(3, 10)), int(rng.integers(20, 61))
        size, gap = float(rng.choice([1.5, 2.0, 3.0])), int(rng.integers(0, 41))
        x = np.maximum(0.2, 1 + 0.02 * rng.standard_normal(600))
        x[:n_fall] *= np.linspace(fall, 1.0, n_fall)
        x[n_fall + gap:] *= size
        regs = [f[0] for f in feed(x) if f[1] == "step_regression"]
        assert all(r > n_fall + gap for r in regs), (seed, regs)  # never before the change
        if not regs or regs[0] > n_fall + gap + 60:
            lost.append(seed)
    assert len(lost) <= 1, lost


def _warm_down(rng: np.random.Generator, n: int) -> tuple[np.ndarray, int]:
    """A warm-down of 1.5-20x (log-uniform) to the level 1.0 over 5-60 steps, linear or exponential (time constant a
    third of its length), and where it ends."""
    length, linear = int(rng.integers(5, 61)), bool(rng.random() < 0.5)
    fall = float(np.exp(rng.uniform(np.log(1.5), np.log(20.0))))
    t = np.arange(n, dtype=np.float64)
    if linear:
        return np.where(t < length, fall + (1.0 - fall) * t / length, 1.0), length
    return 1.0 + (fall - 1.0) * np.exp(-t / max(1.0, length / 3.0)), length


def test_a_change_after_a_warm_down_is_found_and_a_warm_down_alone_is_quiet() -> None:
    """Warm-downs of 1.5-20x over 5-60 steps (linear or exponential, 1-10 % noise), then 1.3x, 1.5x, 2x or 3x from
    0-40 steps after their end (step 12 at the earliest), 80 drawn series: lost (not reported within 150 steps)
    30 before the stepped warm-up curve and the fallen-flat restart, 25 with the curve alone, 15 now; and the same
    warm-downs without a change at 1-20 % noise: no report (80 series)."""
    lost, quiet = [], []
    for seed in range(80):
        rng = np.random.default_rng([9100, seed])
        level, length = _warm_down(rng, 400)
        x = level * np.maximum(0.2, 1.0 + float(rng.uniform(0.01, 0.10)) * rng.standard_normal(400))
        onset = max(12, length + int(rng.integers(0, 41)))
        x[onset:] *= float(rng.choice([1.3, 1.5, 2.0, 3.0]))
        regs = [f[0] for f in feed(x) if f[1] == "step_regression"]
        assert all(r > onset for r in regs), (seed, onset, regs)
        if not regs or regs[0] > onset + 150:
            lost.append(seed)
        rng = np.random.default_rng([9200, seed])
        level, _ = _warm_down(rng, 400)
        x = level * np.maximum(0.2, 1.0 + float(rng.uniform(0.01, 0.20)) * rng.standard_normal(400))
        quiet += [(seed, f[0], f[1]) for f in feed(x) if f[1] in ("step_regression", "drift")]
    assert quiet == []
    assert len(lost) <= 15, lost


def _held_rise(step_s: float, factor: float, *, onset: int = 300, n: int = 900, cv: float = 0.02,
               seed: int = 5) -> tuple[int, dict[str, Any]]:
    """Steps from ``onset`` to the first step_regression of a job-wide ``factor`` rise at ``step_s`` steps (the
    capture planner's lead as the spike hold, as the coordinator hands it), and its detail."""
    from profwatch.core.capture.planner import CaptureSettings, spike_hold

    rng = np.random.default_rng(seed)
    xs = step_s * np.maximum(0.2, 1.0 + cv * rng.standard_normal(n))
    xs[onset:] *= factor
    det = StepTimeRegressionDetector("j", DetectionSettings(), hold_steps=spike_hold(CaptureSettings()))
    regs = [f for f in feed(xs, det=det) if f[1] == "step_regression"]
    assert regs, "the rise was never reported"
    return regs[0][0] - onset, regs[0][3]


def test_a_rise_at_fast_steps_is_held_for_the_lead_at_its_own_step_time() -> None:
    """A 3x job-wide rise at 8 ms steps is held for the planner's lead at its own 24 ms steps (3 s: 127 steps), not
    at the baseline's (377 steps, 9 s of the risen steps): bench_corpus seed 31 noisy run 5 took 403 steps."""
    from profwatch.core.capture.planner import CaptureSettings, lead_steps

    delay, detail = _held_rise(0.008, 3.0)
    own = lead_steps(300, 0.024, CaptureSettings())
    assert detail["pattern"] == "level"
    assert own - 10 <= detail["hold_steps"] <= own + 10
    assert delay <= own + 12  # 377 steps and more on the old rule
    assert delay * 0.024 <= 3.5  # seconds of the risen steps: about the lead's poll + margin


@pytest.mark.parametrize(("step_s", "factor", "expected"), [(0.5, 3.0, 10), (0.1, 1.5, 23), (0.05, 3.0, 23)])
def test_the_hold_of_slower_steps_is_bounded_by_the_baseline_lead_and_the_floor(step_s: float, factor: float,
                                                                                expected: int) -> None:
    """Where the baseline's lead is a few steps (0.5 s steps: 9) the hold stays that lead (10 steps to the report,
    as before); at 0.1 s steps a 1.5x rise is held for max(the lead at its own time 22, min(the baseline's lead 33,
    HOLD_FLOOR_STEPS 16)) = 22 (34 steps to the report before), at 0.05 s steps a 3x one for 22 (64 before)."""
    delay, detail = _held_rise(step_s, factor)
    assert detail["pattern"] == "level"
    assert delay == expected


def test_an_unflagged_checkpoint_of_a_few_steps_at_fast_steps_stays_a_transient() -> None:
    """5 steps at 8x in a 0.1 s job: the lead at their own 0.8 s steps is 6 steps, but the hold never goes under
    HOLD_FLOOR_STEPS (16) there, so the checkpoint is a step_spike, not a level change."""
    from profwatch.core.capture.planner import CaptureSettings, spike_hold

    rng = np.random.default_rng(3)
    xs = 0.1 * np.maximum(0.2, 1.0 + 0.02 * rng.standard_normal(600))
    for at in (200, 400):
        xs[at:at + 5] *= 8.0
    det = StepTimeRegressionDetector("j", DetectionSettings(), hold_steps=spike_hold(CaptureSettings()))
    kinds_ = [f[1] for f in feed(xs, det=det)]
    assert "step_regression" not in kinds_


def test_a_change_held_after_a_speedup_as_alike_to_a_level_left_is_reported_when_it_outlasts_the_hold() -> None:
    """A job that ran its first 230 steps at a level 1.6x the next one (remembered as a level left,
    ``RecurringInterruptions.left``), a further 25 % speedup at step 911, then +40 % 16 steps later, one step of it
    back at the level before (4 % noise). After the speedup the +40 % steps are alike to the level left and held
    for its hold; they fed the young baseline, and when the held episode broke on the one low step that baseline
    (the changed level) took over: reported 316 steps after the onset (a later episode's hold) in 4 of 6 seeds,
    never in 1 (``bench_corpus`` seed 31 levels run 14: a 1.3x change never reported). Held steps are now kept out
    of the baseline and one ordinary step does not end the episode (as in the spike filter): the change is
    reported, at the latest when it outlasts the hold (240 steps)."""
    for seed in range(6):
        xs = series(1300, 0.04, seed=seed)
        xs[230:] *= 0.62
        xs[910:] *= 0.75
        xs[926:] *= 1.4
        xs[1000] /= 1.4
        regs = [(s, d) for s, k, _, d in feed(xs) if k == "step_regression"]
        assert regs and all(s > 926 for s, _ in regs), (seed, regs)
        step, detail = regs[0]
        assert step <= 926 + 245 and detail["reference"] == "before_speedup", (seed, regs)
