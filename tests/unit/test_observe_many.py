"""``JobDetector.observe_many`` (the coordinator's batch entry, issue 26) gives what ``observe`` gives report by
report: the same anomalies, at the same reports, and the same counters, on the job shapes the detectors know
(training with a slowdown, a slow rank, a stall, a restart and flagged checkpoints; roles; serving jobs that say
their mode and that must be recognised from idle gaps; reports of ranks outside the job)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from itertools import groupby
from typing import Any

import pytest

from profwatch.core.detection.job_detector import Anomaly, JobDetector
from profwatch.simulate.telemetry import ServingScenario, TelemetryScenario, generate_telemetry, iter_serving_telemetry
from tests.unit.detection_helpers import to_report

BASE = TelemetryScenario(world_size=8, steps=320, cv=0.02, step_time_s=0.5)
SHAPES: dict[str, tuple[Any, int]] = {
    "slowdown": (generate_telemetry(replace(BASE, slowdown=0.3, slowdown_from_step=160)), 8),
    "slow_rank": (generate_telemetry(replace(BASE, slow_rank=3, slow_rank_factor=1.6, slow_rank_from_step=150)), 8),
    "stall_restart_checkpoints": (generate_telemetry(replace(
        BASE, stall_rank=2, stall_from_step=120, restart_after_step=220, restart_steps=80, checkpoint_every=50,
        capture_start_step=260)), 8),
    "roles": (generate_telemetry(replace(BASE, roles=("a", "a", "b", "b", "a", "a", "b", "b"), slow_rank=5,
                                         slow_rank_from_step=200)), 8),
    "serving_said": (list(iter_serving_telemetry(ServingScenario(replicas=2, tp=2, duration_s=1500, seed=5,
                                                                   with_mode=True, slow_rank=1, slow_from_s=1000))), 4),
    "serving_seen": (list(iter_serving_telemetry(ServingScenario(replicas=1, tp=4, duration_s=1500, seed=3,
                                                                  with_mode=False))), 4),
    "ranks_outside": (generate_telemetry(replace(BASE, world_size=8, steps=200)), 6),  # ranks 6, 7 are counted
}


def _chunks(records: list[dict[str, Any]], size: int) -> Iterable[tuple[float, list[Any]]]:
    """Reports in arrival order, ``size`` at a time, each chunk arriving at its last record's time (a batch)."""
    for _, grp in groupby(enumerate(records), key=lambda ir: ir[0] // size):
        recs = [r for _, r in grp]
        yield recs[-1].get("arrival_s", recs[-1]["ts_unix_s"]), [to_report(r) for r in recs]


def _one_by_one(det: JobDetector, chunks: list[tuple[float, list[Any]]]) -> list[tuple[int, list[Anomaly]]]:
    out: list[tuple[int, list[Anomaly]]] = []
    seen, last_tick = 0, float("-inf")
    for now, reports in chunks:
        for m in reports:
            seen += 1
            found = det.observe(m, now)
            if found:
                out.append((seen, found))
        if now - last_tick >= 1.0:
            last_tick = now
            out.append((-seen, det.tick(now)))
    return out


def _batched(det: JobDetector, chunks: list[tuple[float, list[Any]]]) -> list[tuple[int, list[Anomaly]]]:
    out: list[tuple[int, list[Anomaly]]] = []
    seen, last_tick = 0, float("-inf")
    for now, reports in chunks:
        i = 0
        while i < len(reports):
            i, found = det.observe_many(reports, now, i)
            if found:
                out.append((seen + i, found))
        seen += len(reports)
        if now - last_tick >= 1.0:
            last_tick = now
            out.append((-seen, det.tick(now)))
    return out


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("size", [3, 16])
def test_observe_many_is_observe_report_by_report(shape: str, size: int) -> None:
    records, world = SHAPES[shape]
    chunks = list(_chunks(records, size))
    a, b = JobDetector("sim", world), JobDetector("sim", world)
    one, many = _one_by_one(a, chunks), _batched(b, chunks)
    assert many == one
    assert b.counters == a.counters and b.mode == a.mode and len(b.units) == len(a.units)
    assert any(found for _, found in one) or shape in ("ranks_outside", "serving_seen")  # anomalies were compared
    if shape == "serving_seen":  # healthy: what is compared is the switch to serving mode and the idle steps
        assert a.counters["mode_switches"] == 1 and a.counters["idle_steps"] > 10
    if shape == "ranks_outside":
        assert a.counters["bad_rank"] > 0


def test_observe_many_starts_where_asked_and_says_where_it_stopped() -> None:
    records = generate_telemetry(replace(BASE, steps=60))
    reports = [to_report(r) for r in records]
    det = JobDetector("sim", 8)
    assert det.observe_many(reports, 1.0, len(reports)) == (len(reports), [])
    assert det.counters["reports"] == 0
    assert det.observe_many(reports, 1.0, len(reports) - 8) == (len(reports), [])
    assert det.counters["reports"] == 8
