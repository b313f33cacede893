"""Tests of daemon/core/anomaly.py on generated telemetry (fake clock from the records; no sockets, no sleeps)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import pytest
from pydantic import ValidationError

from daemon.core.anomaly import Anomaly, DetectionSettings, JobDetector
from daemon.simulate.telemetry import TelemetryScenario, generate_telemetry
from rankhook.wire import StepReport


def to_report(rec: dict[str, Any]) -> StepReport:
    return StepReport(job_id=rec["job_id"], rank=rec["rank"], step=rec["step"], step_time_s=rec["step_time_s"],
                      ts_unix_s=rec["ts_unix_s"], stages=rec.get("stages"), flags=tuple(rec.get("flags", ())),
                      capturing=bool(rec.get("capturing", False)))


def run(records: Iterable[dict[str, Any]], world_size: int, settings: DetectionSettings | None = None,
        det: JobDetector | None = None) -> tuple[list[Anomaly], JobDetector]:
    """Feed records in order; tick once per second of record time (as the coordinator does)."""
    det = det or JobDetector("sim", world_size, settings)
    out: list[Anomaly] = []
    last_tick = float("-inf")
    for rec in records:
        out += det.observe(to_report(rec), rec["ts_unix_s"])
        if rec["ts_unix_s"] - last_tick >= 1.0:
            last_tick = rec["ts_unix_s"]
            out += det.tick(rec["ts_unix_s"])
    return out, det


def kinds(found: list[Anomaly]) -> list[str]:
    return [a.kind for a in found]


BASE = TelemetryScenario(world_size=8, steps=300, cv=0.01, step_time_s=0.5)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_stationary_noise_fires_nothing(seed: int) -> None:
    found, det = run(generate_telemetry(replace(BASE, steps=600, cv=0.05, seed=seed)), 8)
    assert found == []
    assert det.counters["finalized"] == 600
    assert det.counters["excluded"] == DetectionSettings().warmup_steps


@pytest.mark.parametrize(("slowdown", "fires"), [(0.05, False), (0.10, True), (0.20, True), (0.50, True)])
def test_sustained_slowdown_fires_only_at_or_above_min_effect(slowdown: float, fires: bool) -> None:
    found, _ = run(generate_telemetry(replace(BASE, slowdown=slowdown, slowdown_from_step=100)), 8)
    regs = [a for a in found if a.kind == "step_regression"]
    if not fires:
        assert regs == []
        return
    assert len(regs) == 1, found  # debounced: the new level is re-learned, no second fire
    a = regs[0]
    assert 100 <= a.step <= 200
    assert a.detail["pattern"] == "step"
    assert a.magnitude == pytest.approx(slowdown, abs=0.03)
    assert a.ranks == ()


@pytest.mark.parametrize("slowdown", [0.20, 0.50])
def test_large_regression_detected_within_sustain_steps(slowdown: float) -> None:
    found, _ = run(generate_telemetry(replace(BASE, cv=0.02, slowdown=slowdown, slowdown_from_step=120)), 8)
    regs = [a for a in found if a.kind == "step_regression"]
    assert regs and regs[0].step == 120 + DetectionSettings().sustain_steps - 1
    assert regs[0].detail["first_step"] == 120


def test_gradual_drift_fires_as_drift_and_debounces() -> None:
    found, _ = run(generate_telemetry(replace(BASE, steps=400, drift_per_step=0.001, drift_from_step=50)), 8)
    assert found, "a 35% drift over 350 steps must be reported"
    assert all(a.kind == "step_regression" and a.detail["pattern"] == "drift" for a in found)
    assert 1 <= len(found) <= 3
    assert all(a.magnitude >= 0.10 for a in found)


def test_single_spike_fires_nothing() -> None:
    found, _ = run(generate_telemetry(replace(BASE, cv=0.05, spike_step=150, spike_factor=5.0)), 8)
    assert found == []


@pytest.mark.parametrize("flagged", [True, False])
def test_periodic_checkpoint_spikes_fire_nothing(flagged: bool) -> None:
    sc = replace(BASE, steps=400, checkpoint_every=25, checkpoint_factor=6.0, checkpoint_flagged=flagged)
    found, det = run(generate_telemetry(sc), 8)
    assert found == []
    warm = DetectionSettings().warmup_steps
    assert det.counters["excluded"] == warm + (15 if flagged else 0)


def test_stalled_rank_is_stalled_not_regression() -> None:
    sc = replace(BASE, stall_rank=3, stall_from_step=150)
    found, det = run(generate_telemetry(sc), 8, DetectionSettings(stall_after_s=10.0))
    assert kinds(found) == ["stalled_rank"]
    a = found[0]
    assert a.ranks == (3,)
    assert a.detail["last_step"][3] == 149
    assert a.detail["steps_behind"][3] >= 5
    assert det.stalled_ranks == {3}
    # the rank comes back: cleared, and it may be reported again later
    det.observe(StepReport("sim", 3, 400, 0.5, 2e9))
    assert det.stalled_ranks == frozenset()


def test_rank_that_left_is_not_stalled() -> None:
    sc = replace(BASE, stall_rank=3, stall_from_step=150)
    det = JobDetector("sim", 8, DetectionSettings(stall_after_s=10.0))
    recs = generate_telemetry(sc)
    run(recs[: 149 * 8 + 8], 8, det=det)
    det.mark_left(3)
    found, _ = run(recs[149 * 8 + 8:], 8, det=det)
    assert found == []


def test_stall_needs_both_steps_behind_and_silence() -> None:
    det = JobDetector("j", 2, DetectionSettings(stall_after_s=10.0, stall_steps_behind=5, warmup_steps=0))
    for k in range(1, 4):
        det.observe(StepReport("j", 0, k, 1.0, 100.0 + k))
        det.observe(StepReport("j", 1, k, 1.0, 100.0 + k))
    det.observe(StepReport("j", 0, 4, 1.0, 104.0))
    assert det.tick(1000.0) == []  # silent long enough, but only 1 step behind
    for k in range(5, 10):
        det.observe(StepReport("j", 0, k, 1.0, 100.0 + k))
    assert det.tick(105.0) == []  # 6 steps behind, silent only 2 s
    found = det.tick(114.0)
    assert [a.ranks for a in found] == [(1,)]
    assert det.tick(200.0) == []  # reported once per stall episode


def test_slow_compute_rank_named_as_outlier() -> None:
    sc = replace(BASE, slow_rank=5, slow_rank_factor=1.3, slow_rank_from_step=100)
    found, _ = run(generate_telemetry(sc), 8)
    outliers = [a for a in found if a.kind == "rank_outlier"]
    assert len(outliers) == 1
    assert outliers[0].ranks == (5,)
    assert outliers[0].detail["stage"][5] == "compute"
    assert outliers[0].magnitude == pytest.approx(0.3, abs=0.05)
    # in synchronous training every rank waits: the job's step time rose too (a genuine regression)
    assert "step_regression" in kinds(found)


def test_inference_step_time_outlier() -> None:
    sc = replace(BASE, sync=False, with_stages=False, slow_rank=2, slow_rank_factor=1.5, slow_rank_from_step=50)
    found, _ = run(generate_telemetry(sc), 8, DetectionSettings(outlier_on_step_time=True))
    outliers = [a for a in found if a.kind == "rank_outlier"]
    assert [a.ranks for a in outliers] == [(2,)]
    assert outliers[0].detail["stage"][2] == "step_time_s"


def test_capture_window_does_not_retrigger() -> None:
    sc = replace(BASE, cv=0.02, capture_start_step=150, capture_steps=3, capture_factor=1.8, parse_steps=2,
                 parse_factor=1.6)
    found, det = run(generate_telemetry(sc), 8)
    assert found == []
    assert det.counters["excluded"] == DetectionSettings().warmup_steps + 3 + 2


def test_planned_capture_window_excluded_without_capturing_flag() -> None:
    recs = generate_telemetry(replace(BASE, capture_start_step=150, capture_steps=3, capture_factor=1.8,
                                      parse_factor=1.6))
    for r in recs:
        r.pop("capturing", None)
    det = JobDetector("sim", 8)
    det.exclude_steps(150, 152, "capture c-1")  # parse_steps (2) added after the window
    found, _ = run(recs, 8, det=det)
    assert found == []
    assert det.counters["excluded"] == DetectionSettings().warmup_steps + 5


def test_counter_restart_resets_state() -> None:
    sc = replace(BASE, steps=200, restart_after_step=150, restart_steps=150, cv=0.02)
    found, det = run(generate_telemetry(sc), 8, DetectionSettings(stall_after_s=10.0))
    assert found == []  # no stall across the restart gap, no regression from step-number reuse
    assert det.counters["restarts"] == 1
    assert det.counters["excluded"] == 2 * DetectionSettings().warmup_steps  # warm-up again after the restart


def test_detection_works_after_restart() -> None:
    sc = replace(BASE, steps=100, restart_after_step=100, restart_steps=200, slowdown=0.3, slowdown_from_step=120)
    found, det = run(generate_telemetry(sc), 8)
    assert kinds(found) == ["step_regression"]
    assert found[0].step >= 120 and det.furthest_step == 200


def test_update_settings_at_runtime() -> None:
    recs = generate_telemetry(replace(BASE, slowdown=0.2, slowdown_from_step=150))
    det = JobDetector("sim", 8)
    run(recs[: 100 * 8], 8, det=det)
    det.update_settings(DetectionSettings(min_effect=0.5, baseline_steps=80))
    found, _ = run(recs[100 * 8:], 8, det=det)
    assert found == []
    det.update_settings(DetectionSettings(min_effect=0.05))
    assert det.baseline_step_time_s == pytest.approx(0.6, rel=0.05)


def test_settings_validation() -> None:
    with pytest.raises(ValidationError):
        DetectionSettings(bogus=1)  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        DetectionSettings(min_baseline_steps=60, baseline_steps=50)
    with pytest.raises(ValidationError):
        DetectionSettings(min_effect=0)
    with pytest.raises(ValueError):
        JobDetector("j", 0)


def test_bad_duplicate_and_late_reports_are_counted() -> None:
    det = JobDetector("j", 2, DetectionSettings(finalize_lag_steps=1))
    assert det.observe(StepReport("j", 7, 1, 1.0, 1.0)) == []
    det.observe(StepReport("j", 0, 1, 1.0, 1.0))
    det.observe(StepReport("j", 0, 1, 1.0, 1.0))
    det.observe(StepReport("j", 0, 2, 1.0, 2.0))
    det.observe(StepReport("j", 0, 3, 1.0, 3.0))  # finalises step 1 and 2 by lag
    det.observe(StepReport("j", 1, 1, 1.0, 1.0))  # rank 1 arrives after its step was finalised
    assert det.counters["bad_rank"] == 1
    assert det.counters["duplicate"] == 1
    assert det.counters["late"] == 1


def test_memory_bounded_with_stalled_rank_and_many_exclusions() -> None:
    s = DetectionSettings(max_exclusions=8)
    det = JobDetector("j", 4, s)
    for k in range(1, 2000):
        for r in range(3):  # rank 3 never reports
            det.observe(StepReport("j", r, k, 1.0, float(k), capturing=(k % 10 == 0)))
        det.exclude_steps(k + 5, k + 6, "x")
        assert len(det._pending) <= s.finalize_lag_steps + 1
    assert len(det._exclusions) <= 8
    assert len(det._baseline) <= s.baseline_steps


def test_ten_percent_at_five_percent_noise_confirmed_by_window_median() -> None:
    found, _ = run(generate_telemetry(replace(BASE, cv=0.05, slowdown=0.10, slowdown_from_step=100, seed=4)), 8)
    regs = [a for a in found if a.kind == "step_regression"]
    assert len(regs) == 1 and 100 <= regs[0].step <= 140
    assert regs[0].detail["pattern"] in ("step", "window")
