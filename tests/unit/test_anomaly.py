"""Tests of the JobDetector facade (daemon/profwatch/core/detection/job_detector.py) and the step aggregation it composes
(daemon/profwatch/core/detection/aggregation.py), on generated telemetry (fake clock from the records; no sockets, no sleeps)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from pydantic import ValidationError

from profwatch.core.detection.job_detector import Anomaly, DetectionSettings, FinalizedStep, JobDetector
from profwatch.core.detection.types import RankProgress
from profwatch.simulate.telemetry import TelemetryScenario, generate_telemetry
from rankhook.wire import StepReport
from tests.unit.detection_helpers import kinds, run

BASE = TelemetryScenario(world_size=8, steps=300, cv=0.01, step_time_s=0.5)
WARM = DetectionSettings().warmup_steps


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_stationary_noise_fires_nothing(seed: int) -> None:
    found, det = run(generate_telemetry(replace(BASE, steps=600, cv=0.05, seed=seed)), 8)
    assert found == []
    assert det.counters["finalized"] == 600
    assert det.counters["excluded"] == WARM


def test_flagged_checkpoints_are_excluded() -> None:
    sc = replace(BASE, steps=400, checkpoint_every=25, checkpoint_factor=6.0, checkpoint_flagged=True)
    found, det = run(generate_telemetry(sc), 8)
    assert found == []
    assert det.counters["excluded"] == WARM + 15


def test_capture_window_does_not_retrigger() -> None:
    sc = replace(BASE, cv=0.02, capture_start_step=150, capture_steps=3, capture_factor=1.8, parse_steps=2,
                 parse_factor=1.6)
    found, det = run(generate_telemetry(sc), 8)
    assert found == []
    assert det.counters["excluded"] == WARM + 3 + 2


def test_planned_capture_window_excluded_without_capturing_flag() -> None:
    recs = generate_telemetry(replace(BASE, capture_start_step=150, capture_steps=3, capture_factor=1.8,
                                      parse_factor=1.6))
    for r in recs:
        r.pop("capturing", None)
    det = JobDetector("sim", 8)
    det.exclude_steps(150, 152, "capture c-1")  # parse_steps (2) added after the window
    found, _ = run(recs, 8, det=det)
    assert found == []
    assert det.counters["excluded"] == WARM + 5
    with pytest.raises(ValueError):
        det.exclude_steps(10, 9, "backwards")


def _long_parse(parse_steps: int) -> list[dict]:
    """Telemetry with a 3-step window at 150 and a parse that slows the job 1.6x for ``parse_steps`` steps after it
    (torch_npu parsing on a busy host), without the ``capturing`` flag: only the coordinator's plan hides them."""
    recs = generate_telemetry(replace(BASE, cv=0.02, capture_start_step=150, capture_steps=3, capture_factor=1.8,
                                      parse_steps=parse_steps, parse_factor=1.6))
    for r in recs:
        r.pop("capturing", None)
    return recs


def test_a_long_parse_after_the_window_stays_hidden_until_the_batch_is_complete() -> None:
    recs = _long_parse(30)  # steps 153..182 slowed
    # without the open exclusion, parse_steps (2) hides only 153-154: the rest is a regression
    det = JobDetector("sim", 8)
    det.exclude_steps(150, 152, "capture c-1")
    found, _ = run(recs, 8, det=det)
    assert kinds(found) == ["step_regression"]
    # with it, closed when the batch is complete (the coordinator sees every rank dir finished at step 184)
    det = JobDetector("sim", 8)
    det.exclude_steps(150, 152, "capture c-1")
    det.exclude_until_closed(153, "parse c-1")
    found, _ = run([r for r in recs if r["step"] <= 184], 8, det=det)
    det.close_exclusion("parse c-1")
    more, _ = run([r for r in recs if r["step"] > 184], 8, det=det)
    assert found + more == []
    furthest = 184
    assert det.counters["excluded"] == WARM + (furthest + DetectionSettings().parse_steps - 150 + 1)


def test_a_closed_exclusion_leaves_a_later_slowdown_to_detection_and_an_open_one_is_bounded() -> None:
    # closed at once (the batch was complete right after the window): a slowdown from step 200 is found as usual
    recs = generate_telemetry(replace(BASE, steps=400, cv=0.02, slowdown=0.3, slowdown_from_step=200))
    det = JobDetector("sim", 8)
    det.exclude_until_closed(153, "parse c-1")
    found, _ = run([r for r in recs if r["step"] <= 160], 8, det=det)
    det.close_exclusion("parse c-1")
    more, _ = run([r for r in recs if r["step"] > 160], 8, det=det)
    assert kinds(found + more) == ["step_regression"] and (found + more)[0].step >= 200
    # never closed (the batch never completes): it ends by itself after parse_max_steps
    det = JobDetector("sim", 8, DetectionSettings(parse_max_steps=20))
    det.exclude_until_closed(153, "parse c-1")
    found, det = run(recs, 8, det=det)
    assert kinds(found) == ["step_regression"] and found[0].step >= 200
    assert det.counters["excluded"] == WARM + 20
    # a close before the range began drops it; closing an unknown reason changes nothing
    det = JobDetector("sim", 8)
    det.exclude_until_closed(300, "parse c-2")
    run([r for r in recs if r["step"] <= 100], 8, det=det)
    det.close_exclusion("parse c-2")
    det.close_exclusion("parse c-3")
    run([r for r in recs if 100 < r["step"] <= 199], 8, det=det)
    assert det.counters["excluded"] == WARM


def test_counter_restart_resets_state() -> None:
    sc = replace(BASE, steps=200, restart_after_step=150, restart_steps=150, cv=0.02)
    found, det = run(generate_telemetry(sc), 8, DetectionSettings(stall_after_s=10.0))
    assert found == []  # no stall across the restart gap, no regression from step-number reuse
    assert det.counters["restarts"] == 1
    assert det.counters["excluded"] == 2 * WARM  # warm-up again after the restart


def test_detection_works_after_restart() -> None:
    sc = replace(BASE, steps=100, restart_after_step=100, restart_steps=200, slowdown=0.3, slowdown_from_step=120)
    found, det = run(generate_telemetry(sc), 8)
    assert kinds(found) == ["step_regression"]
    assert found[0].step >= 120 and det.furthest_step == 200


def test_update_settings_at_runtime() -> None:
    recs = generate_telemetry(replace(BASE, slowdown=0.2, slowdown_from_step=150))
    det = JobDetector("sim", 8)
    run(recs[: 100 * 8], 8, det=det)
    det.update_settings(DetectionSettings(min_effect=0.5, spike_min_effect=0.6, baseline_steps=80))
    found, _ = run(recs[100 * 8:], 8, det=det)
    assert found == []  # 20 % is below the new minimum effect
    det.update_settings(DetectionSettings(min_effect=0.05))
    assert det.baseline_step_time_s == pytest.approx(0.6, rel=0.05)  # learned state kept: the new level


def test_settings_validation() -> None:
    with pytest.raises(ValidationError):
        DetectionSettings(bogus=1)  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        DetectionSettings(min_baseline_steps=60, baseline_steps=50)
    with pytest.raises(ValidationError):
        DetectionSettings(min_effect=0)
    with pytest.raises(ValidationError):
        DetectionSettings(min_effect=0.4, spike_min_effect=0.3)
    with pytest.raises(ValueError):
        JobDetector("j", 0)


def test_bad_duplicate_and_late_reports_are_counted() -> None:
    det = JobDetector("j", 2, DetectionSettings(finalize_lag_steps=1))
    assert det.observe(StepReport("j", 7, 1, 1.0, 1.0), 1.0) == []
    det.observe(StepReport("j", 0, 1, 1.0, 1.0), 1.0)
    det.observe(StepReport("j", 0, 1, 1.0, 1.0), 1.0)
    det.observe(StepReport("j", 0, 2, 1.0, 2.0), 2.0)
    det.observe(StepReport("j", 0, 3, 1.0, 3.0), 3.0)  # finalises step 1 and 2 by lag
    det.observe(StepReport("j", 1, 1, 1.0, 1.0), 3.0)  # rank 1 arrives after its step was finalised
    assert det.counters["bad_rank"] == 1
    assert det.counters["duplicate"] == 1
    assert det.counters["late"] == 1


def test_memory_bounded_with_stalled_rank_and_many_exclusions() -> None:
    s = DetectionSettings(max_exclusions=8, baseline_steps=100)
    det = JobDetector("j", 4, s)
    for k in range(1, 2000):
        for r in range(3):  # rank 3 never reports
            det.observe(StepReport("j", r, k, 1.0, float(k), capturing=(k % 10 == 0)), float(k))
        det.exclude_steps(k + 5, k + 6, "x")
        assert det.aggregator.open_steps <= s.finalize_lag_steps + 1
    assert det.aggregator.exclusion_ranges <= 8


class _Recorder:
    """A StepDetector that records what it is fed and fires on every 50th non-excluded step."""

    def __init__(self) -> None:
        self.steps: list[FinalizedStep] = []
        self.resets = 0
        self.settings: DetectionSettings | None = None

    def on_step(self, step: FinalizedStep) -> list[Anomaly]:
        self.steps.append(step)
        if step.excluded is None and step.step % 50 == 0:
            return [Anomaly("step_regression", "sim", step.step, (), 1.0, {"by": "recorder"})]
        return []

    def reset(self) -> None:
        self.resets += 1

    def update_settings(self, settings: DetectionSettings) -> None:
        self.settings = settings


class _NoStalls:
    def __init__(self) -> None:
        self.arrivals: list[tuple[int, float]] = []

    def on_arrival(self, rank: int, arrival_unix_s: float) -> None:
        self.arrivals.append((rank, arrival_unix_s))

    def mark_left(self, rank: int) -> None:
        pass

    def check(self, progress: RankProgress, now_unix_s: float) -> list[Anomaly]:
        return [Anomaly("stalled_rank", "sim", progress.furthest_step or 0, (0,), 1.0, {"now": now_unix_s})]

    @property
    def stalled_ranks(self) -> frozenset[int]:
        return frozenset()

    def update_settings(self, settings: DetectionSettings) -> None:
        pass


def test_detectors_are_swappable_and_fed_every_step_in_order() -> None:
    rec, stalls = _Recorder(), _NoStalls()
    sc = replace(BASE, steps=120, world_size=4, restart_after_step=100, restart_steps=20)
    det = JobDetector("sim", 4, step_detectors=[rec], stall_detector=stalls)
    found, _ = run(generate_telemetry(sc), 4, det=det)
    assert [a.detail for a in found if a.kind == "step_regression"] == [{"by": "recorder"}] * 2  # steps 50, 100
    first_epoch = [s.step for s in rec.steps][:100]
    assert first_epoch == list(range(1, 101))
    assert [s.excluded for s in rec.steps[:WARM]] == ["warmup"] * WARM
    assert all(s.ranks_reported == 4 and s.time_s > 0 for s in rec.steps)
    assert rec.resets == 1  # the step counter restarted once
    assert len(stalls.arrivals) == 120 * 4
    assert kinds(det.tick(5.0)) == ["stalled_rank"]
    det.update_settings(DetectionSettings(min_effect=0.2))
    assert rec.settings is not None and rec.settings.min_effect == 0.2


def test_an_open_exclusion_is_never_evicted_by_the_closed_ranges_and_open_ones_are_bounded() -> None:
    from types import SimpleNamespace

    from profwatch.core.detection.aggregation import MAX_OPEN_EXCLUSIONS, StepAggregator

    agg = StepAggregator(1, DetectionSettings(max_exclusions=8, parse_steps=0, warmup_steps=0))
    agg.exclude_until_closed(100, "parse c1")
    reasons: dict[int, str | None] = {}
    for st in range(1, 130):
        # the rank's own profiler flags every other step from 101 to 119: one closed range each, 10 > 8 kept
        rep = SimpleNamespace(rank=0, step=st, step_time_s=1.0, stages=None, flags=(),
                              capturing=100 < st < 120 and st % 2 == 1)
        for f in agg.observe(rep, 0.0)[0]:
            reasons[f.step] = f.excluded
    assert all(reasons[st] is not None for st in range(100, 129)), {k: v for k, v in reasons.items() if k >= 100}
    assert reasons[99] is None
    # open ranges are bounded: the oldest goes first
    for k in range(MAX_OPEN_EXCLUSIONS + 3):
        agg.exclude_until_closed(1000 + k, f"parse x{k}")
    assert len(agg._open) == MAX_OPEN_EXCLUSIONS and "parse x0" not in agg._open and "parse c1" not in agg._open
