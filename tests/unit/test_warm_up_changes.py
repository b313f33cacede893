"""A change during a steep rising warm-up: found against the warm-up's line, with its own magnitude, once."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from profwatch.core.detection.job_detector import DetectionSettings
from profwatch.core.detection.regression import StepTimeRegressionDetector
from profwatch.core.detection.types import FinalizedStep
from tests.unit.test_regression import WARM_UPS, _rising_warm_up, feed


@pytest.mark.parametrize(("n", "onset"), [(40, 20), (40, 30), (60, 40), (30, 25)])
def test_a_small_change_during_a_steep_warm_up_is_found_once_with_its_own_magnitude(n: int, onset: int) -> None:
    """1.15x from step ``onset`` of a linear 0.3 -> 1.0 rise over ``n`` steps (counted from step 1; 2 % noise).
    The jump came a few steps before the spike screen held the risen steps, so the warm-up's line of the learned
    steps rose with it, the risen steps continued it and learning restarted past them: 0 of 10 seeds found (0 of 40
    over the four cases). A report made then measured the young baseline's level (+62 %), and the rest of the
    warm-up was reported again against the reported level. Now: found in at least 9 of 10 seeds (39 of 40
    measured), once, ``reference "warm_up_line"``, its onset within 3 steps and a magnitude of 10-20 %."""
    found = 0
    for seed in range(10):
        x = _rising_warm_up(n, 0.3, "linear", 0.02, seed)
        x[onset - 11:] *= 1.15
        regs = [(s, m, d) for s, k, m, d in feed(x, first=11) if k == "step_regression"]
        assert len(regs) <= 1, (seed, regs)
        for _, mag, d in regs:
            assert d["reference"] == "warm_up_line" and 0.1 <= mag <= 0.2, (seed, mag, d)
            assert abs(d["first_step"] - onset) <= 3 and d["baseline_s"] < 0.5, (seed, d)
            found += 1
    assert found >= 9, found


def _with_warm_up(x: np.ndarray, hold: int = 8, ranks: int = 8) -> list[tuple[int, str, float, dict[str, Any]]]:
    """Feed job step times ``x`` (step 1 first) as ``JobDetector`` does: its first 10 steps excluded as
    ``"warmup"`` (the detector keeps their newest values, never judges them), the rest measured; a spike hold of
    ``hold`` steps, ``ranks`` ranks reporting each step."""
    det = StepTimeRegressionDetector("j", DetectionSettings(), hold_steps=lambda _s, _t: hold)
    out: list[tuple[int, str, float, dict[str, Any]]] = []
    for i, v in enumerate(x.tolist()):
        for a in det.on_step(FinalizedStep(i + 1, v, 0, ranks, None, "warmup" if i < 10 else None)):
            out.append((a.step, a.kind, a.magnitude, a.detail))
    return out


@pytest.mark.parametrize(("onset", "factor", "cv", "least"),
                         [(12, 3.0, 0.08, 9), (12, 3.0, 0.015, 10), (14, 1.3, 0.015, 8), (12, 1.3, 0.05, 8)])
def test_a_change_right_after_flat_warm_up_steps_is_found_against_them(onset: int, factor: float, cv: float,
                                                                       least: int) -> None:
    """A job flat from step 1 (0.18 s), ``factor`` x from step ``onset`` on: 1-3 learned steps before the change,
    the steps before them dropped as warm-up. The split of the learned steps needs 5 before it, and the learned
    steps (one low, then flat) were taken for a warm-up's end: learned as normal in 10 of 10 seeds for each case.
    The flat warm-up steps are now the level before the change (``reference "warm_up_steps"``): found in at least
    ``least`` of 10 seeds (measured 10, 10, 8 and 10), once, with its onset and size, nothing before it."""
    found = 0
    for seed in range(10):
        rng = np.random.default_rng(seed)
        x = 0.18 * np.maximum(0.2, 1.0 + cv * rng.standard_normal(400))
        x[onset - 1:] *= factor
        regs = [(s, m, d) for s, k, m, d in _with_warm_up(x) if k == "step_regression"]
        assert len(regs) <= 1 and all(s >= onset for s, _, _ in regs), (seed, regs)
        for _, mag, d in regs:
            assert d["reference"] == "warm_up_steps" and abs(d["first_step"] - onset) <= 1, (seed, d)
            assert mag == pytest.approx(factor - 1.0, rel=0.25) and d["baseline_s"] == pytest.approx(0.18, rel=0.1)
            found += 1
    assert found >= least, found


def _interruption_sweep(seed0: int, at: tuple[int, int]) -> tuple[int, list[tuple[int, int]]]:
    """24 jobs (seeds ``[seed0, i]``): a 1.3x or 3x change from step 12-13 (1.5-8 % noise) and one unflagged
    interruption of 1-3 steps at 3-8x starting in ``range(*at)``. Returns how many changes were found (onset within a
    step, reported within 60 steps, magnitude within 30 %) and the reports on the same jobs without the change;
    asserts no report comes before the onset."""
    found, false = 0, []
    for seed in range(24):
        rng = np.random.default_rng([seed0, seed])
        cv, factor, onset = float(rng.uniform(0.015, 0.08)), float(rng.choice([1.3, 3.0])), int(rng.integers(12, 14))
        start, length = int(rng.integers(*at)), int(rng.integers(1, 4))
        x = 0.18 * np.maximum(0.2, 1.0 + cv * rng.standard_normal(400))
        x[start - 1:start - 1 + length] *= float(rng.uniform(3.0, 8.0))
        false += [(seed, s) for s, k, _, _ in _with_warm_up(x) if k in ("step_regression", "drift")]
        x[onset - 1:] *= factor
        regs = [(s, m, d) for s, k, m, d in _with_warm_up(x) if k == "step_regression"]
        assert all(s >= onset for s, _, _ in regs), (seed, regs)
        if regs and regs[0][0] <= onset + 60 and abs(regs[0][2]["first_step"] - onset) <= 1:
            assert regs[0][1] == pytest.approx(factor - 1.0, rel=0.3), (seed, regs[0])
            found += 1
    return found, false


def test_a_change_right_after_warm_up_steps_is_found_when_an_interruption_is_held_out_while_learning() -> None:
    """As above, with one unflagged interruption (1-3 steps at 3-8x, a checkpoint) at steps 35-55 while the baseline
    learns: the spike screen held it out of the learned steps, which were then no longer every step since the first
    measured one, and the warm-up steps' split was not tried: 1.3x and 3x from steps 12-13 (1.5-8 % noise, 24
    series) found in 0 before, 24 now; the same jobs without a change: no report (``bench/bench_corpus.py`` seed 35,
    ``interrupts`` run 12: 3x from step 12, one 3x step at 41, never found). An interruption before the screen
    starts enters the learned steps and still hides the change (drawn at steps 20-50, the 8 at steps 22-30 were
    lost)."""
    found, false = _interruption_sweep(31, (35, 56))
    assert false == []
    assert found >= 24, found


def test_rising_warm_up_steps_are_no_level_before_a_change() -> None:
    """The rising warm-ups of ``tests/unit/test_regression.py`` (5-60 steps after the dropped 10 from 0.3-0.9x, and
    15-61 steps from 0.6-0.85x; linear and exponential; 3-15 % noise), their dropped steps fed as warm-up: a split
    against the warm-up steps must beat a warm-up curve rising from the first of them by WARM_UP_STEPS_EVIDENCE
    noise variances. At WARM_UP_SHAPE_EVIDENCE (1) it reported 3 of them (``warm_up_steps``: 0.6x over 25 steps at
    15 %, 0.74x over 15 and 45 steps at 13 %: 1.5-2.8 variances), now none."""
    fired = []
    cases = [*((n, low, shape, cv, seed, 500) for (n, low), shape, cv, seed
               in itertools.product(WARM_UPS, ("linear", "exponential"), (0.03, 0.08, 0.15), range(3))),
             *((n, low, shape, cv, seed, 300) for n, low, shape, cv, seed
               in itertools.product((15, 30, 45, 61), (0.6, 0.74, 0.85), ("linear", "exponential"),
                                    (0.05, 0.09, 0.13), range(2)))]
    for n, low, shape, cv, seed, total in cases:
        rng = np.random.default_rng(seed)
        level = np.ones(total + 10)
        i = np.arange(n)
        level[:n] = np.linspace(low, 1.0, n) if shape == "linear" else 1.0 - (1.0 - low) * np.exp(-i / (n / 4.0))
        x = 0.5 * level * np.maximum(0.2, 1.0 + cv * rng.standard_normal(total + 10))
        fired += [(n, low, shape, cv, seed, d["reference"]) for _, k, _, d in _with_warm_up(x)
                  if k == "step_regression" and d.get("reference") == "warm_up_steps"]
    assert fired == []


def _falling(shape: str, n: int, length: int = 40) -> np.ndarray:
    """A 2x -> 1x warm-down over ``length`` steps from step 1, then flat: ``"linear"``, ``"exponential"`` (time
    constant a third of its length) or ``"stepped"`` (blocks of 8 steps, 2.0, 1.8, ..., 1.2)."""
    t = np.arange(n, dtype=np.float64)
    if shape == "linear":
        return np.where(t < length, 2.0 - t / length, 1.0)
    if shape == "exponential":
        return 1.0 + np.exp(-t / (length / 3.0))
    return np.where(t < length, 2.0 - np.floor(t / 8.0) / (length / 8.0), 1.0)


def _fall_case(onset: int, shape: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng([3100, onset, ("linear", "exponential", "stepped").index(shape), seed])
    cv = float(rng.uniform(0.01, 0.10))
    return 0.2 * _falling(shape, 400) * np.maximum(0.2, 1.0 + cv * rng.standard_normal(400))


def test_a_change_during_a_warm_up_that_falls_is_found_and_the_warm_down_alone_is_quiet() -> None:
    """1.3x from step 12, 20, 30 or 40 of a 2x -> 1x warm-down over 40 steps (linear, exponential, stepped in blocks
    of 8), 1-10 % noise, two seeds each (24 series; the first 10 steps dropped as warm-up, as ``JobDetector`` does):
    the warm-down gives no flat level before the change and no plateau, and the change was learned as part of the
    fall: found (reported within 150 steps of the onset) in 4 of 24 before, 16 now (``reference "warm_up_fall"``,
    ``regression._fall_split``: onset within 1 step, +20-45 % for +30 %; none before the onset); the same series
    without the change, and 60 stepped warm-downs of 1.5-8x (2-6 blocks of 3-11 steps, 1-20 % noise): no report."""
    found, quiet = 0, []
    for onset, shape, seed in itertools.product((12, 20, 30, 40), ("linear", "exponential", "stepped"), range(2)):
        x = _fall_case(onset, shape, seed)
        quiet += [(onset, shape, seed, s, k) for s, k, _, _ in _with_warm_up(x) if k in ("step_regression", "drift")]
        x[onset - 1:] *= 1.3
        regs = [(s, m, d) for s, k, m, d in _with_warm_up(x) if k == "step_regression"]
        assert all(s >= onset for s, _, _ in regs), (onset, shape, seed, regs)
        if regs and regs[0][0] <= onset + 150:
            s, mag, d = regs[0]
            if d.get("reference") == "warm_up_fall":
                assert abs(d["first_step"] - onset) <= 1 and 0.2 <= mag <= 0.45, (onset, shape, seed, regs[0])
            found += 1
    for seed in range(60):
        rng = np.random.default_rng([9400, seed])
        fall, blocks, length = float(np.exp(rng.uniform(np.log(1.5), np.log(8.0)))), int(rng.integers(2, 7)), \
            int(rng.integers(3, 12))
        level = np.ones(300)
        for b in range(blocks):
            level[b * length:(b + 1) * length] = fall ** (1.0 - b / blocks)
        x = level * np.maximum(0.2, 1.0 + float(rng.uniform(0.01, 0.20)) * rng.standard_normal(300))
        quiet += [("stepped", seed, s, k) for s, k, _, _ in _with_warm_up(x) if k in ("step_regression", "drift")]
    assert quiet == []
    assert found >= 16, found


def test_a_change_right_after_warm_up_steps_is_found_when_an_interruption_entered_the_learned_steps() -> None:
    """As above, the interruption (1-3 steps at 3-8x) at steps 22-30, before the spike screen of ``_learn`` starts
    (the baseline holds ``PROVISIONAL_MIN`` values): it entered the learned steps, and the split against the warm-up
    steps failed its rules, so 1.3x and 3x from steps 12-13 (1.5-8 % noise, 24 series) were found in 0 before. The
    learned steps are now screened by a running median (``regression._unscreened``) before that split: 21 found
    (onset within a step, reported within 60 steps), and the same jobs without a change: no report."""
    found, false = _interruption_sweep(3300, (22, 31))
    assert false == []
    assert found >= 21, found


def _blocks(x: np.ndarray, per: int = 4) -> list[tuple[int, str, float, dict[str, Any]]]:
    """Feed ``x`` as values of blocks of ``per`` fast steps (step ``per * (i + 1)``), the first 12 steps dropped as
    warm-up, as ``JobDetector`` does for fast steps."""
    det = StepTimeRegressionDetector("j", DetectionSettings(), hold_steps=lambda _s, _t: 200)
    out: list[tuple[int, str, float, dict[str, Any]]] = []
    for i, v in enumerate(x.tolist()):
        step = per * (i + 1)
        for a in det.on_step(FinalizedStep(step, v, 0, 4, None, "warmup" if step <= 12 else None, None, per)):
            out.append((a.step, a.kind, a.magnitude, a.detail))
    return out


def _rising_blocks(seed: int) -> tuple[np.ndarray, int]:
    rng = np.random.default_rng([3500, seed])
    low, length, cv = float(rng.uniform(0.3, 0.5)), int(rng.integers(40, 56)), float(rng.uniform(0.025, 0.045))
    steps = 4 * np.arange(1, 376)
    level = np.where(steps < length, low + (1.0 - low) * steps / length, 1.0)
    x = 0.018 * level * np.maximum(0.2, 1.0 + cv * rng.standard_normal(steps.size))
    return x, int(rng.integers(60, 72))


def test_a_change_after_a_rising_warm_up_of_fast_step_blocks_is_found() -> None:
    """18 ms steps in blocks of 4 (``steps`` 4 a value), a warm-up rising from 0.3-0.5x over 40-55 steps, 2.5-4.5 %
    block noise, then 1.3x from step 60-71 (``bench/bench_corpus.py`` seed 35, ``warmup_up`` run 6 is one of these:
    1.3x at step 66, lost). The first learning's 46 values span 184 steps, so it was never within
    ``SETTLE_MAX_STEPS`` (150) of the start and the stepped warm-up curve (``_curve_split``) was never tried; and
    where it is, the step may fall just short of its evidence (run 6: 24.1 noise variances of 25). Now the curve's
    knee must be young, and a step within ``CURVE_RECHECK_NEAR`` of its evidence is tried again on the next
    ``CURVE_RECHECK_VALUES`` values: 12 series, found 1 before, 3 now (``reference "warm_up_curve"``, onset within 8
    steps, +25-40 %); the same warm-ups without the change: no report. Most stay lost: their learned steps start on
    the rise, and its curve explains the change as well."""
    found, quiet = 0, []
    for seed in range(12):
        x, onset = _rising_blocks(seed)
        quiet += [(seed, s, k) for s, k, _, _ in _blocks(x) if k in ("step_regression", "drift")]
        x[onset // 4:] *= 1.3
        regs = [(s, m, d) for s, k, m, d in _blocks(x) if k == "step_regression"]
        assert all(s >= onset for s, _, _ in regs), (seed, regs)
        if regs and regs[0][0] <= onset + 300:
            _, mag, d = regs[0]
            assert d["reference"] == "warm_up_curve" and abs(d["first_step"] - onset) <= 8, (seed, regs[0])
            assert 0.25 <= mag <= 0.4, (seed, regs[0])
            found += 1
    assert quiet == []
    assert found >= 3, found


@pytest.mark.xfail(strict=True, reason="known false report: a chance dip of 4 steps at the end of a flat level after "
                                       "a stepped warm-down is read by _fall_split as the fall's end, and the "
                                       "normal steps after it as a jump up (+35 %, reference warm_up_fall)")
def test_a_chance_dip_on_the_flat_level_after_a_stepped_warm_down_is_no_jump() -> None:
    """A healthy stepped warm-down: 34 steps at 8.25x, 34 at 4.62x, then flat at 1x (10 % noise, numpy seed 198 as
    drawn by the breaker's generator). Steps 99-102 happen to be low (0.74-0.96 of the level) and 103-114 a little
    high (mean 1.1): the isotonic fit ends the fall at the dip, and the jump to the next steps passes every rule of
    ``_fall_split`` (the 4-step medians each side differ by +26 %), though the level 30 steps before the dip is the
    level after it. 1 of 400 such generated warm-downs (none before ``_fall_split``)."""
    rng = np.random.default_rng(198)
    n = 250
    rng.uniform(1.3, 10)
    rng.uniform(5, 80)
    noise = float(rng.choice([0.01, 0.03, 0.06, 0.1, 0.14]))
    rng.integers(2, 8)
    curve = np.concatenate([np.full(34, 8.24769765), np.full(34, 4.62384883), np.ones(n)])[:n]
    x = 0.05 * curve * np.exp(rng.normal(0, noise, n))
    assert noise == 0.1
    assert not [r for r in _with_warm_up(x) if r[1] == "step_regression"]


def _warm_up_then(n: int, low: float, cv: float, onset: int | None, seed: int, total: int = 300) -> np.ndarray:
    """Job step times (0.17 s level) rising linearly from ``low`` x over the first ``n`` steps, flat after, 1.3x from
    index ``onset`` on (None: no change), at relative noise ``cv``."""
    rng = np.random.default_rng(seed)
    level = np.ones(total)
    level[:n] = np.linspace(low, 1.0, n)
    if onset is not None:
        level[onset:] *= 1.3
    return 0.17 * level * np.maximum(0.2, 1.0 + cv * rng.standard_normal(total))


def _hold_18(x: np.ndarray) -> list[tuple[int, str, float, dict[str, Any]]]:
    """:func:`_with_warm_up` with a spike hold of 18 steps (the planner's lead at 0.17 s steps), 4 ranks."""
    return _with_warm_up(x, hold=18, ranks=4)


def test_a_change_on_the_plateau_soon_after_a_long_rising_warm_up_is_found_with_the_rise_it_restarted_past() -> None:
    """1.3x 10-16 steps after a linear 0.3-0.5 -> 1.0x rise over 35-45 steps ended (4-6 % noise, hold 18): the
    rise crossed the young baseline's spike screen and learning restarted from the risen steps, then the first
    learning's end took the change for the warm-up still rising (its kept steps began on the warm-up's tail, which a
    slower rise explains about as well as a step) and restarted again past it (``bench/bench_corpus.py`` seed 39,
    ``warmup_up`` run 15). The stepped warm-up curve is now also fitted with the learned values the restarts
    dropped: found in 147 of 160 jobs before, 156 now (at least 154 asserted), never before the onset; the same
    warm-ups without the change are never reported."""
    found = 0
    for n, gap, cv, low in itertools.product((35, 45), (10, 16), (0.04, 0.06), (0.3, 0.5)):
        for seed in range(10):
            regs = [s for s, k, _, _ in _hold_18(_warm_up_then(n, low, cv, n + gap, seed)) if k == "step_regression"]
            assert all(s >= n + gap for s in regs), (n, gap, cv, low, seed, regs)
            found += bool(regs)
            if seed < 3:
                quiet = [a for a in _hold_18(_warm_up_then(n, low, cv, None, seed)) if a[1] != "step_spike"]
                assert not quiet, (n, cv, low, seed, quiet)
    assert found >= 154, found


def _noisy_rising_blocks(seed: int, factor: float = 1.0) -> tuple[np.ndarray, int]:
    """13 ms steps in blocks of 4 (a value per block): a warm-up rising linearly from 0.5-0.7x over 20-35 steps,
    12-18 % per-step noise, ``factor`` x from a step 40-79 on; the block values and that step."""
    rng = np.random.default_rng([4848, seed])
    low, length, cv = float(rng.uniform(0.5, 0.7)), int(rng.integers(20, 36)), float(rng.uniform(0.12, 0.18))
    onset = int(rng.integers(40, 80))
    steps = np.arange(1, 4 * 200 + 1)
    level = np.where(steps < length, low + (1.0 - low) * steps / length, 1.0) * np.where(steps >= onset, factor, 1.0)
    x = 0.013 * level * np.maximum(0.2, 1.0 + cv * rng.standard_normal(steps.size))
    return x.reshape(-1, 4).mean(axis=1), onset


def test_a_noisy_rising_warm_up_of_fast_step_blocks_is_no_change() -> None:
    """A 13 ms job's warm-up rising from 0.5-0.7x over 20-35 steps at 12-18 % noise, judged in blocks of 4
    (``bench/bench_corpus.py --healthy-hours``, seed 101 ``warmup_up`` healthy run 4: 0.6 -> 1.0x over some 25 steps
    at 14.5 %, reported +46 % at step 196, ``reference "warm_up_steps"``: a false arm). The first learning's 49
    values span 180 steps, so at its end the generation was older than ``SETTLE_MAX_STEPS`` and the warm-up curve
    was never tried against a split 20 steps from the start: 6 of 40 such warm-ups were reported. The split's own
    step is judged young now: none is. A 1.3x change from step 40-79 after them is still found in at least 22 of
    40 (measured 24; 25 before)."""
    quiet = [(seed, s, k) for seed in range(40) for s, k, _, _ in _blocks(_noisy_rising_blocks(seed)[0])
             if k in ("step_regression", "drift")]
    assert quiet == []
    found = 0
    for seed in range(40):
        x, onset = _noisy_rising_blocks(seed, 1.3)
        regs = [s for s, k, _, _ in _blocks(x) if k == "step_regression"]
        assert all(s >= onset for s in regs), (seed, regs)
        found += bool(regs)
    assert found >= 22, found
