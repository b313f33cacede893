"""Tests of daemon/profwatch/core/detection/serving.py's load bands without `work` (pure; generated steps)."""

from __future__ import annotations

import numpy as np

from profwatch.core.detection.serving import LoadNormaliser
from profwatch.core.detection.settings import DetectionSettings
from profwatch.core.detection.types import FinalizedStep


def test_without_work_steps_after_an_idle_gap_are_compared_with_the_load_of_now_not_of_an_hour_ago() -> None:
    """A server whose iteration time grows slowly with its load (+30 % over 48k steps), idle 20 s every 400
    steps, judged in blocks of 16 steps. With the busy fraction over the last 64 steps, the blocks right after each
    gap fell in a band of their own whose reference was tens of gaps old (about +10 % off: false step_regressions
    on healthy traffic); measured over time, the band follows the load and its reference is recent."""
    rng = np.random.default_rng(1)
    norm = LoadNormaliser(DetectionSettings())
    ratios: list[float] = []
    block: list[FinalizedStep] = []
    for step in range(1, 48_001):
        if step % 400 == 0:
            fs = FinalizedStep(step, 20.0, 0, 4, None, "idle")
        else:
            t = 0.15 * (1.0 + 0.3 * step / 48_000) * (1.0 + 0.03 * rng.standard_normal())
            fs = FinalizedStep(step, t, 0, 4, None, None)
        norm.note_step(fs)
        block.append(fs)
        if len(block) == 16:
            idle = any(b.excluded for b in block)
            med = float(np.median([b.time_s for b in block]))
            out = norm.normalise(FinalizedStep(step, med, 0, 4, None, "idle" if idle else None, steps=16))
            if out.excluded is None and step > 8_000:
                ratios.append(out.time_s)
            block = []
    assert len(ratios) > 2_000
    assert max(abs(r - 1.0) for r in ratios) < 0.05, max(ratios)
