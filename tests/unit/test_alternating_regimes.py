"""A job alternating two step-time regimes (an RL job's rollout at 2-5x for 10-120 steps, then its training steps):
each return of the slow regime was a level change on the base code (c9fa6c3), 10.4 false arms per healthy hour in
``bench/bench_new_shapes.py`` ``alternating`` (seed 31). The slow regime is the job's pattern once it came back
(``daemon/profwatch/core/detection/interruptions.py``: a time term on an interruption's length, regimes over it
learned once seen twice); a persistent change in such a job is still reported.

Each case feeds a generated job step-time series (seeded; the bench's shape parameters of the run named) to the
change-point detector, with the capture planner's lead as the spike hold and the first 10 steps excluded as warm-up
(``JobDetector``'s defaults); deterministic, no clock."""

from __future__ import annotations

import numpy as np
import pytest

from profwatch.core.capture.planner import CaptureSettings, spike_hold
from profwatch.core.detection.interruptions import MAX_TIMED_INTERRUPTION_STEPS
from profwatch.core.detection.regression import StepTimeRegressionDetector
from profwatch.core.detection.settings import DetectionSettings
from profwatch.core.detection.types import Anomaly, FinalizedStep


def alternating(step_s: float, factor: float, slow: int, fast: int, steps: int, cv: float, seed: int = 0,
                change_at: int | None = None, change: float = 1.0, fast_first: bool = False) -> np.ndarray:
    """Job step times (s): ``slow`` steps at ``factor`` x ``step_s``, then ``fast`` at ``step_s``, repeated from step 1
    (``fast_first``: the ``fast`` ones first); ``cv`` relative noise; ``change`` x on every step from step
    ``change_at`` on."""
    idx = np.arange(steps) + (slow if fast_first else 0)
    level = np.where(idx % (slow + fast) < slow, factor, 1.0)
    if change_at is not None:
        level[change_at - 1:] *= change
    rng = np.random.default_rng(seed)
    return step_s * level * np.maximum(0.2, 1.0 + cv * rng.standard_normal(steps))


def regressions(xs: np.ndarray) -> list[Anomaly]:
    det = StepTimeRegressionDetector("j", DetectionSettings(), hold_steps=spike_hold(CaptureSettings()))
    out: list[Anomaly] = []
    for i, x in enumerate(xs.tolist()):
        out += det.on_step(FinalizedStep(i + 1, x, 0, 4, None, "warmup" if i < 10 else None))
    return [a for a in out if a.kind == "step_regression"]


def test_a_short_slow_regime_that_came_first_is_not_reported_at_each_return() -> None:
    """``alternating`` run 0 (0.091 s, 3.65x for 20 steps, then 11 fast, starting slow): the first fast regime was a
    speedup, every later slow one a ``cusum`` report against ``"before_speedup"`` 3 steps in (15 reports in 1500
    steps on the base code), never watched for its return. Now a spike-sized one is, and the regime is learned."""
    found = regressions(alternating(0.0913, 3.65, 20, 11, 1500, 0.016, seed=3))
    assert len(found) == 1, [(a.step, a.detail.get("pattern"), a.detail.get("reference")) for a in found]


@pytest.mark.parametrize("fast_first", [False, True])
@pytest.mark.parametrize(("step_s", "factor", "slow", "fast"), [(0.307, 4.66, 78, 86), (0.269, 4.09, 95, 86)])
def test_a_slow_regime_longer_than_60_steps_but_shorter_than_5_minutes_is_learned(step_s: float, factor: float,
                                                                                  slow: int, fast: int,
                                                                                  fast_first: bool) -> None:
    """Runs 1 and 3: slow regimes of 78 and 95 steps (112 and 105 s) outlasted ``MAX_INTERRUPTION_STEPS`` (60, with
    no time term) and were reported at every return (8-9 reports). Within 5 minutes they are interruptions. A job
    that starts fast reports the first (nothing said it would end), a job that starts slow none: the first fast
    regime is a speedup, and the level it left one the job visited (``RecurringInterruptions.left``)."""
    found = regressions(alternating(step_s, factor, slow, fast, 1500, 0.027, seed=1, fast_first=fast_first))
    assert len(found) == (1 if fast_first else 0), [(a.step, a.detail.get("pattern")) for a in found]


@pytest.mark.parametrize("fast_first", [False, True])
def test_a_slow_regime_longer_than_5_minutes_is_learned_once_it_came_back_twice(fast_first: bool) -> None:
    """Run 10 (1.24 s, 4.93x for 87 steps: 9 minutes, then 72 fast): persistent by the corpus' definition, reported
    at every return on the base code (8 reports, 6 arms). Reported while nothing said the job returns from it; a
    level the job has left twice (``REGIMES_SEEN``; the first time before the first speedup when it starts slow) is
    its own."""
    found = regressions(alternating(1.2392, 4.93, 87, 72, 1309, 0.043, seed=2, fast_first=fast_first))
    assert len(found) == (2 if fast_first else 1), [(a.step, a.detail.get("pattern")) for a in found]


@pytest.mark.parametrize("change", [1.3, 3.0])
@pytest.mark.parametrize(("step_s", "factor", "slow", "fast", "at"),
                         [(0.307, 4.66, 78, 86, 700), (0.307, 4.66, 78, 86, 740), (0.0913, 3.65, 20, 11, 900),
                          (1.2392, 4.93, 87, 72, 1000)])
def test_a_persistent_change_in_an_alternating_job_is_still_reported(step_s: float, factor: float, slow: int,
                                                                     fast: int, at: int, change: float) -> None:
    """A job-wide 1.3x or 3x change from a step in the fast regime (or the slow one) after the pattern was learned
    is reported, at most a learned regime's hold late (``MAX_TIMED_INTERRUPTION_STEPS``)."""
    xs = alternating(step_s, factor, slow, fast, at + MAX_TIMED_INTERRUPTION_STEPS + 200, 0.027, seed=4,
                     change_at=at, change=change)
    late = [a for a in regressions(xs) if a.step >= at]
    assert late, "a persistent change in an alternating job was lost"
    assert late[0].step - at <= MAX_TIMED_INTERRUPTION_STEPS
