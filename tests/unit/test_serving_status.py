"""``profwatch status`` says how many of a serving job's units are still learning (issue 31: a quiet status must
not read as a watched one while a unit's own test has no baseline yet)."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from profwatch.core.detection.job_detector import JobDetector
from profwatch.core.status_text import render_job, render_serving
from tests.unit.detection_helpers import run

T0 = 1_764_500_000.0


def busy(seconds: float, *, seed: int = 3) -> Iterator[dict[str, Any]]:
    """One TP-2 serving unit stepping without pause for ``seconds`` (0.1 s iterations, ``work`` 8-24)."""
    rng = np.random.default_rng(seed)
    t, step, batch = T0, 0, 16
    while t < T0 + seconds:
        step += 1
        batch = int(min(24, max(8, batch + rng.integers(-2, 3))))
        it = 0.1 * (0.5 + 0.5 * batch / 32) * (1 + 0.02 * rng.standard_normal())
        t += it
        for rank in (0, 1):
            yield {"job_id": "svc", "rank": rank, "step": step, "step_time_s": round(it, 6), "ts_unix_s": t,
                   "mode": "serving", "work": batch}


def test_a_young_serving_unit_reads_learning_then_watched() -> None:
    det = JobDetector("svc", 2, mode="serving")
    run(busy(5 * 60.0), 2, det=det)
    view = det.serving_view()
    assert view is not None
    assert (view["units"], view["learning"], view["watched"]) == (1, 1, 0)
    unit = view["detail"][0]
    assert unit["ranks"] == [0, 1] and unit["state"] == "learning"
    assert 0 < unit["blocks"] < unit["blocks_needed"]  # a few 60 s blocks taken, the baseline needs more
    text = "\n".join(render_job({"job_id": "svc", "world_size": 2, "ranks_seen": 2, "furthest_step": 1,
                                 "serving": view}))
    assert "1 still learning their normal speed from traffic" in text and "0 watched" in text
    assert (f"unit of ranks 0,1: learning its normal speed: has {unit['blocks']} min of the {unit['blocks_needed']} "
            f"min of traffic it needs ({unit['blocks']} of {unit['blocks_needed']} periods of 60 s with 8+ steps); "
            "until then only large slowdowns are reported") in text, text

    det = JobDetector("svc", 2, mode="serving")
    run(busy(40 * 60.0), 2, det=det)  # long enough for the block baseline (blocks_needed minutes and more)
    view = det.serving_view()
    assert view is not None and (view["learning"], view["watched"]) == (0, 1)
    assert "still learning" not in "\n".join(render_serving(view))


def test_a_unit_without_a_whole_period_yet_says_it_waits_for_traffic() -> None:
    """20 s of traffic: no 60 s period is complete. The line read "learning, 0 of 18 blocks" (a new user took it
    for a stuck job); it now says what it waits for, in minutes of traffic."""
    det = JobDetector("svc", 2, mode="serving")
    run(busy(20.0), 2, det=det)
    view = det.serving_view()
    assert view is not None and view["detail"][0]["blocks"] == 0 and view["detail"][0]["blocks_needed"] == 18
    text = "\n".join(render_serving(view))
    assert "0 of 18 blocks" not in text
    assert ("unit of ranks 0,1: waiting for traffic to learn its normal speed: needs 18 min of it (18 periods of "
            "60 s with 8+ steps), none complete yet; until then only large slowdowns are reported") in text, text


def test_a_unit_of_idle_gaps_only_says_so() -> None:
    recs = [{"job_id": "svc", "rank": 0, "step": s, "step_time_s": 60.0, "ts_unix_s": T0 + 60.0 * s,
             "mode": "serving", "work": 16} for s in range(1, 30)]
    det = JobDetector("svc", 1, mode="serving")
    run(recs, 1, det=det)
    view = det.serving_view()
    assert view is not None and view["no_busy_step"] == 1 and view["watched"] == 0
    assert "1 with no busy step yet" in "\n".join(render_serving(view))


def test_training_jobs_have_no_serving_view() -> None:
    recs = [{"job_id": "trn", "rank": 0, "step": s, "step_time_s": 0.5, "ts_unix_s": T0 + s} for s in range(1, 50)]
    det = JobDetector("trn", 1)
    run(recs, 1, det=det)
    assert det.serving_view() is None
    assert render_serving(None) == []
