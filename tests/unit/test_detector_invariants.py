"""Property-based tests (hypothesis) of the invariants every detector keeps over random series (issue 31):

- every magnitude is finite, a ratio ``now / baseline - 1`` in [-1, 100] (or up to the largest ratio between two
  of the series' steps less one, where the step noise takes that over 100);
- every ``baseline_s`` an event carries is at least 1 % of the observed level (the median job step time of the 50
  steps before the report; a serving unit's baseline is a ratio to its load's usual time: level 1);
- a series that only gets faster never raises a ``step_regression`` or a ``drift``.

The series are drawn by hypothesis (step time 1 ms-10 s, noise 0-30 %, warm-ups up and down, level shifts, spikes,
drifts, a slow rank, serving with ``work``, fast steps judged in blocks) and fed through the real ``JobDetector``
(or the regression detector alone, for the cheap exhaustive cases). Under ``CI=true`` the ``ci`` profile of
``tests/conftest.py`` derandomizes the examples, so a CI run is reproducible.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from profwatch.core.detection.job_detector import Anomaly, DetectionSettings, JobDetector
from profwatch.core.detection.regression import StepTimeRegressionDetector
from profwatch.core.detection.types import FinalizedStep
from tests.unit.detection_helpers import run

MAX_MAGNITUDE = 100.0
MIN_BASELINE_FRACTION = 0.01
SLOW = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def levels(draw: st.DrawFn, *, faster_only: bool = False) -> np.ndarray:
    """A job-wide level per step (1 = the usual level): a warm-up, level shifts, a drift, spikes."""
    n = draw(st.integers(80, 360))
    lv = np.ones(n)
    if draw(st.booleans()):  # a warm-up that falls (caches, autotuning) ...
        k = draw(st.integers(3, 80))
        lv[:k] = np.linspace(draw(st.floats(1.2, 20.0)), 1.0, k)
    elif not faster_only and draw(st.booleans()):  # ... or rises to the level
        k = draw(st.integers(3, 80))
        lv[:k] = np.linspace(draw(st.floats(0.1, 0.95)), 1.0, k)
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(1, n - 1))
        lv[at:] *= draw(st.floats(0.2, 0.95)) if faster_only else draw(st.floats(0.2, 5.0))
    if faster_only:
        if draw(st.booleans()):  # a steady fall
            lv *= np.maximum(0.05, 1.0 - draw(st.floats(1e-4, 2e-2)) * np.arange(n))
        return np.minimum.accumulate(lv)  # never slower than any earlier step's level
    if draw(st.booleans()):
        lv *= 1.0 + draw(st.floats(-3e-3, 1e-2)) * np.maximum(0, np.arange(n) - draw(st.integers(0, n)))
        lv = np.maximum(lv, 0.01)
    for _ in range(draw(st.integers(0, 4))):
        lv[draw(st.integers(0, n - 1))] *= draw(st.floats(1.5, 100.0))
    return np.clip(lv, 0.2, 20.0)  # no true ratio between two steps over 100: a magnitude over 100 is then a bug


def records(lv: np.ndarray, *, world: int, step_s: float, cv: float, seed: int, slow_rank: int | None = None,
            slow_factor: float = 1.0, slow_from: int = 0, serving: bool = False,
            noise_monotone: bool = False) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    out: list[dict[str, Any]] = []
    t = 1.7e9
    for i, level in enumerate(lv.tolist()):
        g = 1.0 if noise_monotone else max(0.2, 1.0 + cv * float(rng.standard_normal()))
        base = step_s * level * g
        compute = base * 0.8 * np.maximum(0.2, 1.0 + 0.005 * rng.standard_normal(world))
        if slow_rank is not None and i >= slow_from:
            compute[slow_rank] *= slow_factor
        st_ = float(compute.max()) + 0.2 * base
        t += st_
        for r in range(world):
            rec: dict[str, Any] = {"job_id": "prop", "rank": r, "step": i + 1, "step_time_s": st_, "ts_unix_s": t,
                                   "stages": {"compute": float(compute[r]), "comm": st_ - float(compute[r])}}
            if serving:
                rec["mode"] = "serving"
                rec["work"] = float(8 + 8 * (i % 3))
            out.append(rec)
    return out


def observed_level(recs: list[dict[str, Any]], step: int) -> float:
    times = [r["step_time_s"] for r in recs if r["rank"] == 0 and step - 50 <= r["step"] <= step]
    return float(np.median(times)) if times else math.nan


def observed_span(recs: list[dict[str, Any]]) -> float:
    """The largest ratio between two of the series' steps (time per unit of work where ``work`` is given): no change
    the series shows is larger, so no magnitude ``now / baseline - 1`` may exceed it less one. The generated levels
    keep it near ``MAX_MAGNITUDE + 1``; the step noise may take it a little over (a spike magnitude of 100.2 on a
    series whose steps span 101.5x is a true reading, not a bug)."""
    per = [r["step_time_s"] / r["work"] if r.get("work") else r["step_time_s"] for r in recs]
    return max(per) / min(per) if per else 1.0


def check_invariants(found: list[Anomaly], recs: list[dict[str, Any]], *, serving: bool = False) -> None:
    bound = max(MAX_MAGNITUDE, observed_span(recs) - 1.0) * (1.0 + 1e-9)
    for a in found:
        assert math.isfinite(a.magnitude) and -1.0 <= a.magnitude <= bound, (a.kind, a.magnitude, bound, a.detail)
        b = a.detail.get("baseline_s")
        if isinstance(b, (int, float)):
            level = 1.0 if serving else observed_level(recs, a.step)
            assert math.isfinite(b) and b >= MIN_BASELINE_FRACTION * level, (a.kind, b, level, a.detail)
        for key in ("excess",):
            v = a.detail.get(key)
            if isinstance(v, dict):
                assert all(math.isfinite(x) and x <= MAX_MAGNITUDE for x in v.values()), (a.kind, v)


@SLOW
@given(lv=levels(), world=st.integers(1, 8), step_s=st.floats(0.05, 10.0), cv=st.floats(0.0, 0.3),
       seed=st.integers(0, 2**16))
def test_job_detector_invariants_on_random_training_series(lv: np.ndarray, world: int, step_s: float, cv: float,
                                                          seed: int) -> None:
    recs = records(lv, world=world, step_s=step_s, cv=cv, seed=seed)
    found, _ = run(recs, world)
    check_invariants(found, recs)


@SLOW
@given(lv=levels(faster_only=True), world=st.integers(1, 4), step_s=st.floats(0.001, 10.0),
       cv=st.floats(0.0, 0.05), seed=st.integers(0, 2**16))
# found by a fresh clone's run: +8.6 % over a speedup's level measured from a few steps 4 % low (the interim
# reference's effect test now clears min_effect without leniency)
@example(lv=np.array([1.0] + [0.25] * 98 + [0.125] * 6), world=1, step_s=1.0, cv=0.03125, seed=3287)
def test_a_series_that_only_gets_faster_never_raises_a_regression(lv: np.ndarray, world: int, step_s: float,
                                                                 cv: float, seed: int) -> None:
    """Monotone level (warm-ups that fall, speedups, steady falls), little noise: no regression, no drift,
    whether the steps are judged one by one or in blocks (1 ms steps)."""
    recs = records(lv, world=world, step_s=step_s, cv=cv, seed=seed)
    found, _ = run(recs, world)
    check_invariants(found, recs)
    assert [a for a in found if a.kind in ("step_regression", "drift")] == []


@settings(max_examples=200, deadline=None)
@given(lv=levels(faster_only=True), step_s=st.floats(1e-4, 100.0))
def test_the_regression_detector_never_pages_a_noiseless_series_that_only_gets_faster(lv: np.ndarray,
                                                                                    step_s: float) -> None:
    """The change-point detector alone, exact monotone series (no noise at all: the noise floor is the scale)."""
    det = StepTimeRegressionDetector("j", DetectionSettings(), hold_steps=lambda _s, _t: 8)
    for i, x in enumerate((lv * step_s).tolist()):
        found = det.on_step(FinalizedStep(i + 1, x, 0, 1, None, None))
        assert [a for a in found if a.kind in ("step_regression", "drift")] == [], (i, x)
        for a in found:
            assert math.isfinite(a.magnitude) and -1.0 <= a.magnitude <= MAX_MAGNITUDE
        b = det.baseline_step_time_s
        assert b is None or b > 0


@settings(max_examples=100, deadline=None)
@given(n=st.integers(5, 70), low=st.floats(0.3, 0.9), exponential=st.booleans(), step_s=st.floats(1e-4, 100.0),
       skip=st.sampled_from([0, 10]))
def test_the_regression_detector_never_pages_a_noiseless_warm_up_that_rises_and_settles(n: int, low: float,
                                                                                       exponential: bool,
                                                                                       step_s: float,
                                                                                       skip: int) -> None:
    """Issue 31, class ``warmup_up``: a job that starts at ``low`` x its level and rises to it over ``n`` steps
    (linearly, or as ``1 - (1 - low) e^(-4 i / n)``), then stays there; the detector sees it from step 1, or from
    step 11 as behind ``JobDetector``'s ``warmup_steps``. Settling into the level is no regression and no drift,
    and the learned level is the level, not the warm-up's."""
    lv = np.ones(n + 300)
    i = np.arange(n)
    lv[:n] = 1.0 - (1.0 - low) * np.exp(-i / (n / 4.0)) if exponential else np.linspace(low, 1.0, n)
    det = StepTimeRegressionDetector("j", DetectionSettings(), hold_steps=lambda _s, _t: 8)
    for k, x in enumerate((lv[skip:] * step_s).tolist()):
        found = det.on_step(FinalizedStep(skip + k + 1, x, 0, 1, None, None))
        assert [(a.kind, a.magnitude) for a in found if a.kind in ("step_regression", "drift")] == [], (k, x)
    b = det.baseline_step_time_s
    assert b is not None and b == pytest.approx(step_s, rel=0.02)


@SLOW
@given(lv=levels(), world=st.integers(4, 12), cv=st.floats(0.0, 0.2), slow_factor=st.floats(1.0, 50.0),
       slow_from=st.integers(0, 200), seed=st.integers(0, 2**16), data=st.data())
def test_rank_outlier_and_structural_invariants(lv: np.ndarray, world: int, cv: float, slow_factor: float,
                                                slow_from: int, seed: int, data: st.DataObject) -> None:
    """One rank slower (from the start or later, up to 50x): rank_outlier and structural_imbalance magnitudes
    and excesses are bounded. The true ratio stays within the bound the invariant checks (100x): a level that
    moves 5x and a rank 25x slower on top is a real 125x, and reading it so is right (a hypothesis example)."""
    assume(slow_factor * float(lv.max()) / float(lv.min()) <= 100.0)
    rank = data.draw(st.integers(0, world - 1))
    recs = records(lv, world=world, step_s=0.2, cv=cv, seed=seed, slow_rank=rank, slow_factor=slow_factor,
                   slow_from=slow_from)
    found, _ = run(recs, world)
    check_invariants(found, recs)


@SLOW
@given(lv=levels(), world=st.integers(1, 4), step_s=st.floats(0.02, 1.0), cv=st.floats(0.0, 0.2),
       seed=st.integers(0, 2**16))
def test_serving_unit_invariants(lv: np.ndarray, world: int, step_s: float, cv: float, seed: int) -> None:
    """A serving unit (``mode="serving"``, ``work`` given) judges ratios to its loads' usual times: its baseline
    is a ratio and never ratchets toward zero whatever the level does."""
    recs = records(lv, world=world, step_s=step_s, cv=cv, seed=seed, serving=True)
    det = JobDetector("prop", world, DetectionSettings(), mode="serving")
    found, _ = run(recs, world, det=det)
    check_invariants(found, recs, serving=True)


@SLOW
@given(lv=levels(), world=st.integers(1, 4), step_s=st.floats(0.001, 0.02), cv=st.floats(0.0, 0.2),
       seed=st.integers(0, 2**16))
def test_blocks_of_fast_steps_keep_the_invariants(lv: np.ndarray, world: int, step_s: float, cv: float,
                                                  seed: int) -> None:
    """1-20 ms steps are judged in blocks (``block_target_s``): the invariants hold on the blocks' values too."""
    lv = np.repeat(lv, 8)  # enough steps for blocks to form and a baseline of blocks to learn
    recs = records(lv, world=world, step_s=step_s, cv=cv, seed=seed)
    found, _ = run(recs, world)
    check_invariants(found, recs)


def test_a_serving_baseline_follows_host_load_without_collapsing() -> None:
    """A serving unit (``work`` given: a batch size that wanders 1-32, a prefill every 16 iterations) on a host
    whose load comes and goes (x1.0-1.5, a new draw every 20-90 s) for an hour of traffic. Each reported rise used
    to multiply every load reference for good while the falls were learned silently: the ratios' baseline
    ratcheted toward zero (0.67 -> 1e-42 live). The references now carry a bounded, fading scale."""
    rng = np.random.default_rng(3)
    recs: list[dict[str, Any]] = []
    t, step, batch, host, next_change = 1.7e9, 0, 8, 1.0, 0.0
    while t < 1.7e9 + 3600:
        if t >= next_change:
            host, next_change = float(rng.uniform(1.0, 1.5)), t + float(rng.uniform(20, 90))
        step += 1
        batch = int(min(32, max(1, batch + rng.integers(-2, 3))))
        tokens = batch + (1024 if step % 16 == 0 else 0)
        frac = 0.5 + 0.5 * batch / 32 + (0.4 if step % 16 == 0 else 0.0)
        it = 0.07 * frac * host * max(0.3, 1.0 + 0.04 * float(rng.standard_normal()))
        t += it
        for r in range(2):
            recs.append({"job_id": "prop", "rank": r, "step": step, "step_time_s": it, "ts_unix_s": t,
                         "stages": {"compute": 0.8 * it, "comm": 0.2 * it}, "mode": "serving", "work": tokens})
    det = JobDetector("prop", 2, DetectionSettings(), mode="serving")
    found, _ = run(recs, 2, det=det)
    check_invariants(found, recs, serving=True)
    baselines = [a.detail["baseline_s"] for a in found if a.kind == "step_regression"]
    assert min(baselines, default=1.0) >= 0.3, baselines


def _corpus_job_steps(lv: np.ndarray, step_s: float, cv: float, world: int, rng: np.random.Generator) -> list[float]:
    """A ``bench/bench_corpus.py`` training run's job step times from its level ``lv`` (one per step), drawn as the
    corpus draws them from the run's noise stream ``rng``: the job's noise, each rank's compute, the slowest rank's
    step."""
    out = []
    for level in lv.tolist():
        g = max(0.2, 1.0 + cv * float(rng.standard_normal()))
        base = step_s * float(level) * g
        compute = base * 0.8 * np.maximum(0.2, 1.0 + 0.005 * rng.standard_normal(world))
        out.append(float(compute.max()) + 0.2 * base)
    return out


def _faster_run14() -> list[float]:
    """The job step times of ``bench/bench_corpus.py`` seed 31, class ``faster``, run 14, regenerated exactly: a
    warm-up that falls, then speedups of 37 %, 12 % and 38 % at 12 % noise (20 ranks, 0.94 s, 1390 steps)."""
    step_s, cv, world, steps = 0.9379194552306621, 0.11830449305458386, 20, 1390
    lv = np.ones(steps)
    lv[:9] = 1.0 + (2.7705444 - 1.0) * np.exp(-np.arange(9) / (9 / 4))
    for at, f in ((579, 0.6325440177129784), (738, 0.8772647611917195), (1091, 0.6153086353924735)):
        lv[at:] *= f
    rng = np.random.default_rng([31, 5, 14, 1])  # the corpus run's noise stream
    return _corpus_job_steps(lv, step_s, cv, world, rng)


def test_a_young_reference_learned_low_after_a_speedup_is_no_regression() -> None:
    """``bench/bench_corpus.py`` seed 31, class ``faster``, run 14 (:func:`_faster_run14`). The drift reference
    re-learned 51 steps after the last speedup from 30 values that came out 6 % under the level (0.302 s against
    0.323 s); once the window held 143 values at the true level, ``pattern "baseline"`` read +13 % against it, over
    ``min_effect`` plus two standard errors of *two 143-value* levels, and armed a capture on a series that only got
    faster. The margin must count the reference's own (larger) error."""
    det = StepTimeRegressionDetector("j", DetectionSettings(), hold_steps=lambda _s, _t: 8)
    found: list[Anomaly] = []
    for i, x in enumerate(_faster_run14()):
        found += det.on_step(FinalizedStep(i + 1, x, 0, 20, None, None))
    assert [(a.kind, a.step, a.detail) for a in found if a.kind in ("step_regression", "drift")] == []


def _rises_through_the_job_detector(job_id: str, step_times: list[float]) -> list[tuple[str, int, float]]:
    """Replay one rank's ``step_times`` (s) through the whole ``JobDetector`` (:func:`run`), check the invariants,
    and return its rises: ``(kind, step, magnitude)`` of every ``step_regression`` and ``drift``."""
    recs, t = [], 1.7e9
    for i, x in enumerate(step_times):
        t += x
        recs.append({"job_id": job_id, "rank": 0, "step": i + 1, "step_time_s": x, "ts_unix_s": t})
    found, _ = run(recs, 1)
    check_invariants(found, recs)
    return [(a.kind, a.step, round(a.magnitude, 3)) for a in found if a.kind in ("step_regression", "drift")]


def test_a_drift_is_never_reported_on_a_series_whose_recent_level_is_not_above_its_earlier_level() -> None:
    """The same run through the whole ``JobDetector`` (warm-up steps dropped, the capture lead as the spike hold):
    a non-paging ``drift`` of +17.8 % at step 1264 on a series that only got faster. The baseline's line, fitted to
    a chance trend of the young window (used from 3 standard errors) and extrapolated, stood at 0.352 s against a
    reference of 0.299 s (learned 5 % low), while the newest steps ran at 0.32 s. A rise (``drift`` or ``pattern
    "baseline"``) now needs the newest steps' own median above the reference by the rise and two standard errors."""
    assert _rises_through_the_job_detector("f14", _faster_run14()) == []


def _faster_run12() -> list[float]:
    """The job step times of ``bench/bench_corpus.py`` seed 38, class ``faster``, run 12, regenerated: a warm-up
    that falls, then speedups of 25 % and 21 % (steps 181 and 224) at 15.9 % noise (53 ranks, 7.6 s, 300 steps)."""
    step_s, cv, world, steps = 7.616351566636782, 0.15851683006094414, 53, 300
    lv = np.ones(steps)
    lv[:46] = 1.0 + (3.693705005584573 - 1.0) * np.exp(-np.arange(46) / (46 / 4))
    for at, f in ((180, 0.7492040002283827), (223, 0.7889676563544097)):
        lv[at:] *= f
    rng = np.random.default_rng([38, 5, 12, 1])  # the corpus run's noise stream
    return _corpus_job_steps(lv, step_s, cv, world, rng)


def test_a_baseline_re_learned_on_a_calm_stretch_after_a_speedup_keeps_the_noise_before_it() -> None:
    """``bench/bench_corpus.py`` seed 38, class ``faster``, run 12 (:func:`_faster_run12`). The baseline re-learned
    after the first speedup from 34 steps of a chance calm stretch read 12.6 % noise (17 % before the speedup, 16 %
    throughout); the interim reference of the second speedup carried it, and a chance 10-step stretch 17 % over the
    level (4.3 sigmas at 12.6 %) reported +22 % (``reference "before_speedup"``) on a series that only got faster."""
    assert _rises_through_the_job_detector("f12", _faster_run12()) == []


def _faster_run15_41() -> list[float]:
    """The job step times of ``bench/bench_corpus.py`` seed 41, class ``faster``, run 15, regenerated: a linear
    warm-up from 6.2x over 54 steps, then speedups of 13 % and 22 % (steps 702 and 822) at 17.1 % noise (3 ranks,
    42.6 ms, 1500 steps)."""
    step_s, cv, world, steps = 0.042634303971580745, 0.171085137823469, 3, 1500
    lv = np.ones(steps)
    lv[:54] = np.linspace(6.182280988276554, 1.0, 54)
    for at, f in ((701, 0.8694014415838954), (821, 0.7796650012943815)):
        lv[at:] *= f
    rng = np.random.default_rng([41, 5, 15, 1])  # the corpus run's noise stream
    return _corpus_job_steps(lv, step_s, cv, world, rng)


def test_a_rise_over_a_speedups_few_steps_counts_their_error_at_high_noise() -> None:
    """``bench/bench_corpus.py`` seed 41, class ``faster``, run 15 (:func:`_faster_run15_41`). The first speedup's
    reference rested on the 8 steps after its fire, which read 15 % under the level (1 standard error raised: still
    8 % low), and a 25-step CUSUM run that the upper CUSUM picked for being high read +14.8 % against it
    (``reference "before_speedup"``) and armed on a series that only got faster. At high noise a run over a speedup's
    reference now clears ``min_effect`` by two standard errors of the difference of the two means (the run's and the
    reference's steps), or confirms on the steps after it crossed (``_speedup_rise_clear``)."""
    assert _rises_through_the_job_detector("f15", _faster_run15_41()) == []


def test_a_speedups_reference_on_four_steps_that_read_low_is_no_regression() -> None:
    """Generator seed 160 of :func:`_speedups_only` (one 20 % speedup at step 215, 14.5 % noise): the speedup was
    confirmed on the 4 steps after its fire, which read 14 % under the level; raised one standard error they still
    set the reference 4.4 % low, and a chance 35-step run 5.8 % over the level read +10.7 % (step 264)."""
    det = StepTimeRegressionDetector("j", DetectionSettings(), hold_steps=lambda _s, _t: 8)
    found = []
    for i, x in enumerate(_speedups_only(160)):
        found += [(a.step, round(a.magnitude, 3), a.detail.get("reference"))
                  for a in det.on_step(FinalizedStep(i + 1, x, 0, 53, None, None))
                  if a.kind in ("step_regression", "drift")]
    assert found == []


def _speedups_only(seed: int) -> list[float]:
    """300 steps of 7.6 s at 10-20 % Gaussian noise, 1-3 speedups of 10-50 % from step 60 on (seeded)."""
    rng = np.random.default_rng([seed, 7])
    n = 300
    lv = np.ones(n)
    for _ in range(int(rng.integers(1, 4))):
        lv[int(rng.integers(60, n - 20)):] *= 1.0 - float(rng.uniform(0.10, 0.50))
    cv = float(rng.uniform(0.10, 0.20))
    return (7.6 * lv * np.maximum(0.2, 1.0 + cv * rng.standard_normal(n))).tolist()


def test_noisy_series_with_several_speedups_never_raise_a_regression() -> None:
    """100 seeded series that only get faster (1-3 speedups of 10-50 % at 10-20 % noise), the regression detector
    alone: none reports a regression. Before the noise of a baseline re-learned after a speedup was held towards the
    noise before it (``SPEEDUP_NOISE_Z``), seed 52 reported +10 % against the second speedup's interim reference,
    whose noise (11 %) a calm stretch after the first speedup had set (18 % before it, 15 % drawn)."""
    found = []
    for seed in range(100):
        det = StepTimeRegressionDetector("j", DetectionSettings(), hold_steps=lambda _s, _t: 8)
        for i, x in enumerate(_speedups_only(seed)):
            found += [(seed, a.step, round(a.magnitude, 3), a.detail.get("reference"))
                      for a in det.on_step(FinalizedStep(i + 1, x, 0, 53, None, None))
                      if a.kind in ("step_regression", "drift")]
    assert found == []
