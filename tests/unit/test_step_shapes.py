"""Step-time shapes that once fooled the job regression detector: step times that take turns (a hook called once
per micro-batch) and a very large level jump (generated records, fake clock from the records)."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

from profwatch.core.detection.types import FinalizedStep
from tests.unit.detection_helpers import of_kind, run


def _job(steps: int, world_size: int, step_time: Callable[[int], float], seed: int = 0) -> list[dict[str, Any]]:
    rnd = random.Random(seed)
    out: list[dict[str, Any]] = []
    ts = 1.76e9
    for s in range(steps):
        t = step_time(s) * (1.0 + 0.02 * rnd.random())
        ts += t
        out += [{"job_id": "j", "rank": r, "world_size": world_size, "step": s, "step_time_s": t, "ts_unix_s": ts}
                for r in range(world_size)]
    return out


def _turns(period: int, slow_from: int | None = None) -> Callable[[int], float]:
    def f(s: int) -> float:
        base = 1.0 if s % period == 0 else 0.1
        return base * (1.3 if slow_from is not None and s >= slow_from else 1.0)
    return f


@pytest.mark.parametrize("period", [2, 3, 4])
def test_steps_taking_turns_raise_nothing_and_a_later_slowdown_is_one_regression(period: int) -> None:
    steady, _ = run(_job(800, 4, _turns(period)), 4)
    assert steady == []
    slow, _ = run(_job(800, 4, _turns(period, slow_from=400)), 4)
    [reg] = of_kind(slow, "step_regression")
    assert 400 <= reg.step <= 440
    assert 0.2 <= reg.magnitude <= 0.4  # the run's mean excess (its start may precede the change a little)
    assert all(a.step >= 400 for a in slow), "nothing before the change"


def test_step_period_finds_the_shortest_period_of_separate_modes_only() -> None:
    from profwatch.core.detection.blocks import step_period
    def steps(f: Callable[[int], float]) -> list[FinalizedStep]:
        return [FinalizedStep(k, f(k), 0, 1, None, None) for k in range(32)]
    assert step_period(steps(lambda k: 1.0 if k % 2 else 0.1), 0.1) == 2
    assert step_period(steps(lambda k: 1.0 if k % 4 == 1 else 0.1), 0.1) == 4
    rnd = random.Random(1)
    assert step_period(steps(lambda k: 1.0 + 0.05 * rnd.random()), 0.1) == 1
    assert step_period(steps(lambda k: 1.0 if k % 2 else 0.97), 0.1) == 1  # below min_amplitude
