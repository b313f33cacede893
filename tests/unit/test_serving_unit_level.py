"""Serving units: one level shared by a unit's work bands (:class:`~profwatch.core.detection.unit_level.UnitLevel`).
A lasting +50 % change in the unit's first minutes, which the load bands learned band by band, is reported; a
healthy host whose load flickers 1.0-1.5x reports nothing; falls are never reported; magnitudes stay bounded (pure;
generated reports on a fake clock through JobDetector's serving path, and the model on given values)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from profwatch.core.detection.job_detector import JobDetector
from profwatch.core.detection.settings import DetectionSettings
from profwatch.core.detection.unit_level import LEVEL_BLOCK_S, MAX_LOG, UnitLevel
from tests.unit.detection_helpers import of_kind, run
from tests.unit.test_serving_provisional import _reports
from tests.unit.test_serving_rescale import T0, _server


def test_a_50_percent_change_in_a_units_first_minutes_is_reported_by_the_shared_level() -> None:
    """+50 % from minute 5 under a host load flickering 1.0-1.5x (3 seeds): reported within 20 minutes of the onset,
    magnitude 0.25-0.9. Before the shared level, the load bands and the 18-block baseline learned it as normal in
    2 of 3 seeds (no report in the hour; the provisional rule found seed 1). (+30 % is at the edge of what five blocks before it can tell from a host
    load of 1.0-1.5x at ``LEVEL_Z``: found in some seeds only.)"""
    for seed in (1, 2, 3):
        regs = _reports(list(_server([], steps=12_000, host_load=True, seed=seed, slow_from_s=300.0, slow=1.5)))
        late = [r for r in regs if 300.0 <= r[0] <= 300.0 + 1200.0]
        assert late, (seed, regs)
        assert 0.25 <= late[0][1] <= 0.9, (seed, regs)


def _feed(level: UnitLevel, values: list[tuple[float, float]]) -> list[tuple[int, float, dict[str, object]]]:
    """``(time_s, work)`` per step, each step 1 s of the unit's time."""
    out = []
    for i, (t, w) in enumerate(values):
        level.elapse(LEVEL_BLOCK_S / 60.0)
        out += [(a.step, a.magnitude, a.detail) for a in level.add(i + 1, t, w)]
    return out


def _steps(n: int, factor_from: int, factor: float) -> list[tuple[float, float]]:
    """Steps whose work climbs from 1 to 32 over 1,000 steps and back; time ``0.1 * (0.5 + 0.5 w / 32)``, a 1 %
    ripple, times ``factor`` from step ``factor_from`` on."""
    out = []
    for i in range(n):
        w = 32 - abs((i % 2000) - 1000) * 31 // 1000
        t = 0.1 * (0.5 + 0.5 * w / 32) * (1.0 + 0.01 * math.sin(i)) * (factor if i >= factor_from else 1.0)
        out.append((t, float(w)))
    return out


def test_a_change_while_the_bands_form_is_in_the_level_not_in_the_new_bands_offsets() -> None:
    """3x from step 400 (work 13 of 1-32, climbing): every band learned later carries it in the level, so the change
    is reported once, as about 3x, within 10 blocks (a band reference of its own learned it: each new band formed
    at 3x)."""
    found = _feed(UnitLevel("svc", DetectionSettings()), _steps(2_500, 400, 3.0))
    assert len(found) == 1, found
    assert 2.5 <= 1.0 + found[0][1] <= 3.5 and found[0][2]["detector"] == "unit_level", found
    assert found[0][0] <= 400 + 600, found


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.lists(st.floats(min_value=1e-4, max_value=1e3), min_size=50, max_size=400),
       st.lists(st.one_of(st.none(), st.floats(min_value=0.5, max_value=4096)), min_size=1, max_size=400))
def test_reports_are_rises_with_bounded_magnitudes(times: list[float], works: list[float | None]) -> None:
    """Any series: every report is a rise (magnitude > 0), finite and at most 100x - 1; a series that only gets
    faster (sorted descending) reports nothing."""
    vals = [(t, works[i % len(works)]) for i, t in enumerate(times)]
    for a in _feed(UnitLevel("svc", DetectionSettings()), vals):
        assert 0.0 < a[1] <= math.exp(2 * MAX_LOG) and math.isfinite(a[1]), a
    falling = sorted(times, reverse=True)
    assert _feed(UnitLevel("svc", DetectionSettings()), [(t, None) for t in falling]) == []


def test_a_slow_units_3x_change_after_its_first_block_is_reported_and_a_host_swing_is_not() -> None:
    """One block (60 steps of 1 s) at 0.1 s, then 3x for 6 blocks: reported (a slow unit's first block can be
    its only one before a change: bench_corpus seed 31 serving_work run 4, a 3x change at 416 s, lost before); one
    block at 0.1 s, then 1.4x (a shared host's load swings 1.0-1.5x): nothing, a single block being a reference
    only for a change of at least 1.5x."""
    ripple = [1.0 + 0.02 * math.sin(i) for i in range(480)]
    found = _feed(UnitLevel("svc", DetectionSettings()), [(0.1 * r * (3.0 if i >= 60 else 1.0), None)
                                                          for i, r in enumerate(ripple)])
    assert len(found) == 1 and 2.5 <= 1.0 + found[0][1] <= 3.5 and found[0][2]["blocks_before"] == 1, found
    assert _feed(UnitLevel("svc", DetectionSettings()), [(0.1 * r * (1.4 if i >= 60 else 1.0), None)
                                                         for i, r in enumerate(ripple)]) == []


def _alternating_batches(seed: int, noise: float, hours: float = 3.0) -> list[tuple[int, float, float]]:
    """A healthy serving unit whose batch alternates between 64 and 128 (5 % jitter) every 20 minutes (traffic
    moving between two regimes), step time ``0.002 * work ** 0.9`` s with ``noise`` log-normal per step and no
    change at all: the reports of :class:`UnitLevel` as ``(minute, magnitude, z)``."""
    rng = np.random.default_rng(seed)
    level = UnitLevel("j", DetectionSettings())
    t, step, out = 0.0, 0, []
    while t < hours * 3600.0:
        work = (64.0, 128.0)[int(t // 1200.0) % 2] * math.exp(0.05 * float(rng.standard_normal()))
        x = 0.002 * work ** 0.9 * math.exp(noise * float(rng.standard_normal()))
        step, t = step + 1, t + x
        level.elapse(x)
        out += [(round(t / 60.0), round(a.magnitude, 2), a.detail["z"]) for a in level.add(step, x, work)]
    return out


@pytest.mark.xfail(strict=True, reason="open: a new band's offset is fixed from 8 values against the median of the "
                                       "last 8 known residuals; a regime switch carries that error into the level")
def test_a_healthy_unit_alternating_between_two_batch_regimes_reports_nothing() -> None:
    """Nothing changes but which work bands the traffic uses. The bands of the second regime learn their offsets,
    all at once, against the level the last 8 residuals of the first showed: with 30 % noise per step that level is
    off by ~0.13 (the median of 8) and each new band's median by as much again, and the offsets are fixed. So the
    level jumps by that error at every switch: a rise reported as +17-28 % (z 5.0-5.3) at every second switch (a
    fall is learned silently and shifts the blocks before it, so the next switch is a fresh rise), in 3 of 12
    seeds, every 40 minutes for as long as the traffic alternates (found by the adversarial review of the shared
    level; 1 of 12 seeds at 10 % noise)."""
    reported = {seed: r for seed in range(12) if (r := _alternating_batches(seed, 0.3))}
    assert not reported, reported


def test_a_change_while_the_level_moves_is_reported_once() -> None:
    """3x from 55 s into a replica's life under a host load of 1.0-1.5x (seed 3): new work bands learned their
    offsets against the unit's level while the change was still moving it (the level is the median of the last 8
    known-band residuals: it lags the change), took part of the change into their offsets and passed it on to the
    bands learned against them, so the level wandered and the same change was reported four times (+284 %, then
    +50 %, +21 %, +99 %). Bands now learn only against a level that is not moving (``UnitLevel._steady``): one
    report."""
    regs = _reports(list(_server([], steps=20_000, host_load=True, seed=3, slow_from_s=55.0, slow=3.0)))
    assert len(regs) == 1 and regs[0][2] == "unit_level" and 1.5 <= regs[0][1] <= 3.0, regs


def test_a_3x_change_is_reported_within_seconds_by_the_fast_test() -> None:
    """3x from 10 minutes into a unit with ``work`` under a host load flickering 1.0-1.5x (3 seeds): the median of
    the last 24 residuals (5 s of steps at least) is 2.5x and 4 block sigmas over the median block, so the shared
    level reports it within 30 s of the onset (``detail.test "fast"``), magnitude 1.5-4 (the change measured from
    its onset on: +209 % in seed 2). Before, the block test
    waited five blocks of 60 s (bench_corpus serving_work seed 31: 3x found 444-638 steps, minutes, after the
    onset). The same traffic without the change: no fast report in the hour (3 seeds)."""
    for seed in (1, 2, 3):
        recs = list(_server([], steps=20_000, host_load=True, seed=seed, slow_from_s=600.0, slow=3.0))
        at = {r["step"]: r["ts_unix_s"] - T0 for r in recs}
        found, _ = run(iter(recs), 1, det=JobDetector("svc", 1, mode="serving"))
        regs = [(at[a.step], a.magnitude, a.detail.get("test")) for a in of_kind(found, "step_regression")]
        assert regs and 600.0 <= regs[0][0] <= 630.0 and regs[0][2] == "fast", (seed, regs)
        assert 0.5 <= regs[0][1] <= 3.0, (seed, regs)  # +200 % read under a load of 1.0-1.5x either way
        healthy = list(_server([], steps=20_000, host_load=True, seed=seed))
        found, _ = run(iter(healthy), 1, det=JobDetector("svc", 1, mode="serving"))
        assert not [a for a in of_kind(found, "step_regression") if a.detail.get("test") == "fast"], seed


def _mix_moves(seed: int, slow: float = 1.0, move: bool = True) -> list[tuple[int, float, dict[str, object]]]:
    """A healthy unit (1 s of its time per step, cost ``0.1 * (0.5 + 0.5 w / 32)``, 2 % log-normal noise) whose
    batch climbs from 2 to 28 (16 steps each) while the host's load drops to 0.75x as it passes 16 (its large bands learn their
    offsets 0.29 low in log, each against the one before); then, at the old load, 20 blocks of mostly small
    batches (2-6, a large one every third step) and 20 of mostly large ones (20-28, a small one every third step;
    ``move`` False: small ones again), ``slow`` times slower: what :class:`UnitLevel` reports."""
    rng = np.random.default_rng(seed)
    small, large = (2.0, 3.0, 4.0, 5.0, 6.0), (20.0, 22.0, 24.0, 26.0, 28.0)
    vals = [(w, 0.75 if w >= 16.0 else 1.0) for w in (*small, 8.0, 10.0, 12.0, 14.0, 16.0, 18.0, *large)
            for _ in range(16)]
    for part in (small, large if move else small):
        other = large if part is small else small
        for i in range(20 * 60):
            vals.append(((other if i % 3 == 2 else part)[i % 5], 1.0 if len(vals) < 256 + 20 * 60 else slow))
    return _feed(UnitLevel("svc", DetectionSettings()),
                 [(0.1 * (0.5 + 0.5 * w / 32) * load * math.exp(0.02 * float(rng.standard_normal())), w)
                  for w, load in vals])


def test_a_healthy_unit_whose_batch_moves_between_bands_learned_apart_reports_nothing() -> None:
    """The unit's large bands' offsets are 0.29 low in log (learned in a chain under a lighter load) and its work
    mix moves from small to large batches: the blocks' level rises about +33 %, yet every
    band that both parts use is where it was. A change of the unit moves every band alike, so a split the bands do
    not show is not reported (``UnitLevel._within``; bench_corpus --healthy-hours seed 103 serving_work healthy run
    1: +27 % at z 5.58 while the bands' own change was +15 %, armed). The same unit 1.5x from the second part on,
    its mix unmoved, is still reported, at about 1.5x, as before (1.3x there is under ``LEVEL_Z`` in 2 of 3 seeds,
    before as now). Limit: a change that comes with such a mix move is judged on its bands' change against the
    split's standard error: 1.3x with the mix move, seed 1, is not reported (it was, at +67 %)."""
    for seed in (0, 1, 2):
        assert _mix_moves(seed) == [], seed
        found = _mix_moves(seed, slow=1.5, move=False)
        assert len(found) == 1 and found[0][2]["detector"] == "unit_level", (seed, found)
        assert 1.35 <= 1.0 + found[0][1] <= 1.65, (seed, found)
