"""A serving unit without ``work``: a batch-size wander of healthy traffic is no ``step_regression``, a lasting
slowdown still is (pure; generated reports on a fake clock, through JobDetector's serving path)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from profwatch.core.detection.job_detector import JobDetector
from tests.unit.detection_helpers import of_kind, run

STEP_S = 0.25
MAX_BATCH = 32
ONSET = 6_000


def _server(*, wander_steps: int = 0, wander_target: float = 0.0, slow_factor: float = 1.0,
             steps: int = 7_000, seed: int = 1) -> Iterator[dict[str, Any]]:
    """One replica's records (no ``work``) on a fake clock: iteration time ``STEP_S * (0.5 + 0.5 b / 32)`` times
    3 % noise, with the batch ``b`` a random walk around 19 (as ``simulate/telemetry.py``'s serving model), an
    idle gap of 20 s every 400 steps (in the next step's time). From :data:`ONSET` on, for ``wander_steps``
    steps the walk's target is ``wander_target`` (the batch wanders up: more work per iteration, healthy), and
    every iteration is ``slow_factor`` times slower (a real slowdown)."""
    rng = np.random.default_rng(seed)
    t, batch, gap = 1_764_500_000.0, 19, 0.0
    for step in range(1, steps + 1):
        target = wander_target if ONSET <= step < ONSET + wander_steps else 19.2
        batch = int(min(MAX_BATCH, max(1, batch + rng.integers(-2, 3) + (1 if batch < target else -1))))
        it = STEP_S * (0.5 + 0.5 * batch / MAX_BATCH) * max(0.3, 1.0 + 0.03 * float(rng.standard_normal()))
        if step >= ONSET:
            it *= slow_factor
        t += it
        yield {"job_id": "svc", "rank": 0, "step": step, "step_time_s": round(it + gap, 6), "ts_unix_s": t,
               "mode": "serving"}
        gap = 0.0
        if step % 400 == 0:
            gap = 20.0
            t += gap


def _regressions(records: Iterator[dict[str, Any]]) -> list[int]:
    found, _ = run(records, 1, det=JobDetector("svc", 1, mode="serving"))
    return [a.step for a in of_kind(found, "step_regression")]


def test_without_work_a_short_batch_wander_below_min_effect_is_not_a_regression() -> None:
    """The batch wanders ~25 % over its usual size for 48 steps (3 blocks of +7-10 %, the shape of the false page
    of bench ``serving_dp_nowork`` at 4.2 h). Without ``work`` the busy fraction does not see the batch, so the
    ratios rise; their mean stays under ``min_effect`` and must not page. It did while a fire needed only
    ``mean + 2 standard errors >= min_effect`` (3 blocks: the standard error is wide)."""
    assert _regressions(_server()) == []  # the healthy traffic alone is quiet
    assert _regressions(_server(wander_steps=48, wander_target=24.5)) == []


def test_without_work_a_lasting_slowdown_of_min_effect_or_more_still_fires_within_a_few_blocks() -> None:
    """+12 % and +30 % from :data:`ONSET` on are still reported, within 800 steps (about 4 blocks of
    SERVING_BLOCK_S: the regression detector judges time blocks of a serving unit)."""
    for factor in (1.12, 1.30):
        steps = _regressions(_server(slow_factor=factor))
        assert steps, factor
        assert ONSET <= steps[0] <= ONSET + 800, (factor, steps)
