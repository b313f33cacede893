"""A serving unit with sparse traffic (a burst of steps, then a long idle gap): the gaps are idle from the first
report on, so they never become the usual step (adversarial pass: 2 requests a minute paged 9 times)."""
from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np

from profwatch.commands.replay import render_summary, replay_lines
from profwatch.core.detection.job_detector import JobDetector
from tests.unit.detection_helpers import run

T0 = 1_764_500_000.0


def bursts(n: int, *, burst: int = 2, every_s: float = 60.0, base: float = 0.2, slow_from: int | None = None,
           slow: float = 1.0, seed: int = 1) -> Iterator[dict[str, Any]]:
    """``n`` steps of one serving rank: ``burst`` steps (~0.15 s, ``work`` near 16), then an idle gap up to
    ``every_s``; the gap is counted in the step after it (as a server's step timer sees it). Steps from
    ``slow_from`` on take ``slow`` times longer."""
    rng = np.random.default_rng(seed)
    t, batch, gap = T0, 16, 0.0
    for step in range(1, n + 1):
        batch = int(min(32, max(1, batch + rng.integers(-2, 3))))
        it = base * (0.5 + 0.5 * batch / 32) * (1 + 0.02 * rng.standard_normal())
        if slow_from is not None and step >= slow_from:
            it *= slow
        t += it
        yield {"job_id": "svc", "rank": 0, "step": step, "step_time_s": round(it + gap, 6), "ts_unix_s": t,
               "mode": "serving", "work": batch}
        gap = 0.0
        if step % burst == 0:
            gap = every_s - burst * base * 0.75
            t += gap


def test_two_requests_a_minute_healthy_is_quiet() -> None:
    found, det = run(bursts(2400), 1, det=JobDetector("svc", 1, mode="serving"))
    assert found == []
    usual = det.baseline_step_time_s
    assert usual is not None and usual < 1.0  # learned from the busy steps, not the ~60 s gaps
    assert det.job_counters["idle_steps"] >= 1199  # every gap step but none of the busy ones


def test_two_requests_a_minute_plus_50_percent_is_found() -> None:
    found, _ = run(bursts(2400, slow_from=1200, slow=1.5), 1, det=JobDetector("svc", 1, mode="serving"))
    regs = [a for a in found if a.kind == "step_regression"]
    assert regs, Counter(a.kind for a in found)
    assert regs[0].step >= 1200
    assert 0.3 <= regs[0].magnitude <= 0.7
    assert all(a.step >= 1200 for a in found)


def test_gap_first_report_is_idle_before_any_usual_step() -> None:
    # the very first report is a gap (server up, waiting for its first request): idle, not the usual step
    recs = list(bursts(400))
    recs[0]["step_time_s"] = 59.9
    found, det = run(recs, 1, det=JobDetector("svc", 1, mode="serving"))
    assert found == []
    usual = det.baseline_step_time_s
    assert usual is not None and usual < 1.0


def test_training_long_first_step_is_not_a_gap() -> None:
    # training (mode not given): no usual step yet means no idle gap, so a long first step does not count
    det = JobDetector("trn", 1)
    recs = [{"job_id": "trn", "rank": 0, "step": s, "step_time_s": 30.0 if s == 1 else 0.5,
             "ts_unix_s": T0 + s} for s in range(1, 40)]
    run(recs, 1, det=det)
    assert det.job_counters["idle_steps"] == 0
    assert det.mode != "serving"


def test_one_request_a_minute_says_not_learned() -> None:
    # every step is an idle gap: nothing is watched, and the detector and replay's summary say so
    recs = [{"job_id": "svc", "rank": 0, "step": s, "step_time_s": 60.0, "ts_unix_s": T0 + 60.0 * s,
             "mode": "serving", "work": 16} for s in range(1, 200)]
    found, det = run(recs, 1, det=JobDetector("svc", 1, mode="serving"))
    assert found == []
    assert det.unlearned_units == [[0]]
    lines = [json.dumps({k: v for k, v in r.items() if k != "arrival_s"}) for r in recs]
    text = render_summary(replay_lines(lines))
    assert "svc ranks=[0]: not watched: no usual step learned" in text
    # one busy step later the unit has a usual step and is watched
    _, det2 = run([*recs, {**recs[-1], "step": 200, "step_time_s": 0.15, "ts_unix_s": T0 + 12_000.15},
                   {**recs[-1], "step": 201, "step_time_s": 0.15, "ts_unix_s": T0 + 12_000.3}], 1,
                  det=JobDetector("svc", 1, mode="serving"))
    assert det2.unlearned_units == []
    assert "not watched" not in render_summary(replay_lines(json.dumps(r) for r in bursts(400)))
