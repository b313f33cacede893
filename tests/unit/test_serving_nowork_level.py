"""Serving units without ``work``: the unit's shared level (:class:`~profwatch.core.detection.unit_level.UnitLevel`
``without_work``, given every step) reports a lasting 3x change within minutes under a shared host's flickering
load and a wandering batch, and nothing on the same healthy traffic; on any series its reports are rises with
bounded magnitudes; a slow rank of a tensor-parallel group is compared step by step, not in the unit's 16-step
blocks (pure; generated reports on a fake clock through JobDetector's serving path, and the model on given
values)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from profwatch.core.detection.job_detector import JobDetector
from profwatch.core.detection.settings import DetectionSettings
from profwatch.core.detection.unit_level import LEVEL_BLOCK_S, MAX_LOG, NOWORK_EFFECT, UnitLevel
from tests.unit.detection_helpers import of_kind, run
from tests.unit.test_serving_provisional import _reports
from tests.unit.test_serving_rescale import STEP_S, T0


def _nowork(seed: int, steps: int, slow_from_s: float = float("inf")) -> list[dict[str, Any]]:
    """One replica without ``work`` on a fake clock, busy a third of the time: bursts of 100 iterations of
    ``STEP_S * (0.5 + 0.5 b / 32)`` (the batch ``b`` a random walk in 1-32, unreported) times 2 % noise and the
    host's load (1.0-1.5x, a new value every 20-90 s), each burst followed by an idle gap of 30 s (in the next
    step's time); every iteration 3x slower from ``slow_from_s`` seconds on (a real, lasting change)."""
    rng = np.random.default_rng(seed)
    t, batch, gap, load, load_until = T0, 16, 0.0, 1.0, T0
    out: list[dict[str, Any]] = []
    for step in range(1, steps + 1):
        if t >= load_until:
            load, load_until = float(rng.uniform(1.0, 1.5)), t + float(rng.uniform(20.0, 90.0))
        batch = int(min(32, max(1, batch + rng.integers(-2, 3))))
        it = STEP_S * (0.5 + 0.5 * batch / 32) * (1.0 + 0.02 * float(rng.standard_normal())) * load
        it *= 3.0 if t - T0 >= slow_from_s else 1.0
        t += it
        out.append({"job_id": "svc", "rank": 0, "step": step, "step_time_s": round(it + gap, 6), "ts_unix_s": t,
                    "mode": "serving"})
        gap = 0.0
        if step % 100 == 0:
            gap = 30.0
            t += gap
    return out


def test_without_work_a_lasting_3x_change_is_reported_within_minutes_by_the_units_level() -> None:
    """3x from minute 20 (3 seeds): reported within 8 minutes of the onset by the unit's level, as at least
    ``1 + NOWORK_EFFECT``, once in the 15 minutes after it. Before the level judged units without ``work``, their
    load bands (busy fraction) took the slower steps in as a busier load's normal and nothing was reported in the
    half hour after the onset (bench_corpus seed 32 serving_nowork: 3x and 2.6x changes of 4 of 4 runs lost)."""
    for seed in (1, 2, 3):
        regs = _reports(_nowork(seed, 9_000, slow_from_s=1_200.0))
        late = [r for r in regs if r[0] >= 1_200.0]
        assert late and late[0][0] <= 1_200.0 + 480.0, (seed, regs)
        assert late[0][2] == "unit_level" and NOWORK_EFFECT <= late[0][1] <= 3.0, (seed, regs)
        assert len([r for r in late if r[0] <= 1_200.0 + 900.0]) == 1, (seed, regs)


def test_without_work_a_3x_change_is_reported_within_three_minutes_by_the_fast_test() -> None:
    """3x from minute 20 (5 seeds): the fast test's window of a block's time (``NOWORK_FAST_MIN_S``) reports it
    within 3 minutes of the onset (57-153 s), measured from its onset on (+167-252 % for +200 % under a load of
    1.0-1.5x). It waited for the block test's five blocks before (202-436 s: bench_corpus seed 35
    serving_nowork, 3x found a median of 344 steps after the onset)."""
    for seed in (1, 2, 3, 4, 5):
        regs = _reports(_nowork(seed, 9_000, slow_from_s=1_200.0))
        late = [r for r in regs if r[0] >= 1_200.0]
        assert late and late[0][0] <= 1_200.0 + 180.0, (seed, regs)
        assert late[0][2] == "unit_level" and 1.5 <= late[0][1] <= 3.0, (seed, regs)


def test_without_work_a_healthy_flickering_host_with_a_wandering_batch_is_no_change_of_the_level() -> None:
    """2.5 hours of the same traffic without a change (4 seeds): the unit's level reports nothing. (The regression
    detector's CUSUM read +21 % once, at 2.3 h of seed 1, before and after the level judged units without
    ``work``: a known limit of that test on a wandering batch, not asserted here.)"""
    for seed in (1, 2, 3, 4):
        assert [r for r in _reports(_nowork(seed, 19_000)) if r[2] == "unit_level"] == [], seed


def _tp_nowork(seed: int, slow_rank_from_s: float, factor: float, tp: int = 4) -> list[dict[str, Any]]:
    """One tensor-parallel group of ``tp`` ranks without ``work`` (bench_corpus's serving model): the iteration
    ``it`` as in :func:`_nowork` (bursts of 100, 30 s idle gaps, the host's load, 3 % noise), each rank's compute
    ``0.8 * it`` (1 % own noise), the step ``max(compute) + 0.2 * it`` on every rank; from ``slow_rank_from_s``
    on, rank 1's compute is ``factor`` times longer (a slow GPU: the whole group waits for it)."""
    rng = np.random.default_rng(seed)
    t, batch, gap, load, load_until = T0, 16, 0.0, 1.0, T0
    out: list[dict[str, Any]] = []
    for step in range(1, 6_001):
        if t >= load_until:
            load, load_until = float(rng.uniform(1.0, 1.5)), t + float(rng.uniform(20.0, 90.0))
        batch = int(min(32, max(1, batch + rng.integers(-2, 3))))
        it = STEP_S * (0.5 + 0.5 * batch / 32) * (1.0 + 0.03 * float(rng.standard_normal())) * load
        compute = 0.8 * it * (1.0 + 0.01 * rng.standard_normal(tp))
        if t - T0 >= slow_rank_from_s:
            compute[1] *= factor
        dur = float(compute.max()) + 0.2 * it
        t += dur
        for r in range(tp):
            out.append({"job_id": "svc", "rank": r, "world_size": tp, "step": step,
                        "step_time_s": round(dur + gap, 6), "ts_unix_s": t + 0.001 * r, "mode": "serving",
                        "stages": {"compute": float(compute[r]), "comm": dur - float(compute[r])}})
        gap = 0.0
        if step % 100 == 0:
            gap = 30.0
            t += gap
    return out


def test_without_work_a_slow_tensor_parallel_rank_is_named_within_a_minute() -> None:
    """Rank 1 of 4 with 3x and 1.3x its compute from minute 10 (2 seeds each): ``rank_outlier`` names it within 60 s
    of the onset; the healthy 10 minutes before name nobody. The rank comparison of a unit without ``work`` was
    given the unit's 16-step blocks (made for the load bands), and a window of 12 of them took 7 minutes after a
    3.5x TP rank's onset (bench_corpus seed 31 serving_nowork run 4); ranks of one step run the same batch, so
    they are compared step by step, as with ``work``."""
    for seed in (1, 2):
        for factor in (3.0, 1.3):
            recs = _tp_nowork(seed, 600.0, factor)
            at = {r["step"]: r["ts_unix_s"] - T0 for r in recs}
            found, _ = run(iter(recs), 4, det=JobDetector("svc", 4, mode="serving"))
            named = [(round(at[a.step]), a.ranks) for a in of_kind(found, "rank_outlier")]
            assert named and named[0][1] == (1,) and 600 <= named[0][0] <= 660, (seed, factor, named)


def _feed(level: UnitLevel, times: list[float]) -> list[tuple[float, dict[str, Any]]]:
    """Each time a step of 1 s of the unit's time (an idle share included), no ``work``."""
    out = []
    for i, t in enumerate(times):
        level.elapse(LEVEL_BLOCK_S / 60.0)
        out += [(a.magnitude, a.detail) for a in level.add(i + 1, t, None)]
    return out


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(st.floats(min_value=1e-4, max_value=1e3), min_size=60, max_size=900),
       st.floats(min_value=0.01, max_value=10.0), st.integers(min_value=1, max_value=600))
def test_without_work_reports_are_bounded_rises_and_a_healthy_swing_is_never_one(
        times: list[float], scale: float, period: int) -> None:
    """Any series: every report is a rise of at least ``NOWORK_EFFECT``, finite and at most 100x - 1, naming the
    detector and its noise (at least the floor); a series that only gets faster reports nothing; a healthy series
    whose every value lies within 1.45x of one level (a batch and host swing of any period) reports nothing."""
    for mag, detail in _feed(UnitLevel("svc", DetectionSettings(), without_work=True), times):
        assert NOWORK_EFFECT <= mag <= math.exp(2 * MAX_LOG) and math.isfinite(mag), (mag, detail)
        assert detail["detector"] == "unit_level" and detail["without_work"] and detail["noise"] >= 0.2, detail
    assert _feed(UnitLevel("svc", DetectionSettings(), without_work=True), sorted(times, reverse=True)) == []
    swing = [scale * (1.0 + 0.45 * ((i // period) % 2) * (0.5 + 0.5 * math.sin(i))) for i in range(len(times))]
    assert _feed(UnitLevel("svc", DetectionSettings(), without_work=True), swing) == []


def test_without_work_a_min_effect_over_the_least_rise_holds_for_the_reported_change() -> None:
    """``min_effect`` 1.0 (over ``NOWORK_EFFECT``): the split asked for 2x, but the change measured from the onset
    (the median of the blocks from there) was let through at ``1 + NOWORK_EFFECT``: +91.7 % was reported (a level
    from 1x to about 2x with 35 % noise, seed 268). Every report is at least ``min_effect`` now."""
    rng = np.random.default_rng(268)
    n0, n1 = int(rng.integers(120, 400)), int(rng.integers(120, 400))
    hi = np.exp(rng.normal(np.log(rng.uniform(1.5, 2.4)), 0.35, n1))
    xs = [float(x) for x in np.exp(rng.normal(0, 0.2, n0))] + [float(x) for x in hi]
    st_ = DetectionSettings(min_effect=1.0, spike_min_effect=1.0)
    found = _feed(UnitLevel("svc", st_, without_work=True), xs)
    assert all(mag >= 1.0 for mag, _ in found), found
    clear = [float(x) for x in np.exp(rng.normal(0, 0.2, 300))] + [float(x) for x in 3.0 * np.exp(rng.normal(0, 0.2, 300))]
    found = _feed(UnitLevel("svc", st_, without_work=True), clear)
    assert len(found) == 1 and 1.0 <= found[0][0] <= 3.0, found  # a 3x change is still reported
