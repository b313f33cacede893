"""Periodic and transient spikes (issue 11 item 3), each case on a generated series through the JobDetector,
plus the arming of a periodic spike's next occurrence (daemon/profwatch/core/detection/spikes.py, regression.py, arming.py)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from profwatch.core.arming.policy import ArmingPolicy, ArmingSettings, JobArmState, capture_request
from profwatch.core.capture.planner import CaptureSettings, JobProgress, lead_steps, plan_capture
from profwatch.core.detection.job_detector import DetectionSettings, JobDetector
from profwatch.core.detection.spikes import SpikeFilter
from profwatch.simulate.telemetry import TelemetryScenario, generate_telemetry
from tests.unit.detection_helpers import of_kind, run

BASE = TelemetryScenario(world_size=8, steps=1200, cv=0.05, step_time_s=0.5)
CHECKPOINTS = replace(BASE, steps=1400, checkpoint_every=200, checkpoint_steps=3, checkpoint_factor=6.0,
                      checkpoint_flagged=False)


@pytest.mark.parametrize("seed", [0, 1])
def test_gc_pauses_on_all_ranks_never_fire_a_regression(seed: int) -> None:
    """(a) one-step 3x GC pauses on all 8 ranks, about 1 step in 50: events, never a step regression."""
    found, det = run(generate_telemetry(replace(BASE, gc_prob=0.02, gc_factor=3.0, seed=seed)), 8)
    assert of_kind(found, "step_regression") == [] and of_kind(found, "rank_outlier") == []
    spikes = of_kind(found, "step_spike")
    assert spikes, "transient spikes are recorded as events"
    assert all(a.detail["duration_steps"] <= a.detail["hold_steps"] for a in spikes)
    assert det.counters["episodes"] >= 15  # ~24 pauses; events are rate-limited, the rest counted
    assert det.counters["spike_events"] + det.counters["spikes_not_reported"] == det.counters["episodes"]


def test_transient_spike_is_recorded_but_never_arms() -> None:
    found, _ = run(generate_telemetry(replace(BASE, steps=400, spike_step=300, spike_factor=6.0)), 8)
    [spike] = of_kind(found, "step_spike")
    assert spike.detail["first_step"] == 300 and spike.detail["duration_steps"] == 1
    for mode in ("act", "observe"):
        d = ArmingPolicy(ArmingSettings(mode=mode, arm_on=("step_regression", "step_spike"))).decide(
            spike, JobArmState(), 0.0)
        assert (d.action, d.reason) == ("suppress", "transient_not_capturable")


def test_unflagged_checkpoints_are_learned_as_periodic_and_excluded() -> None:
    """(b) an unflagged checkpoint every 200 steps lasting 3 steps at 6x: no regression, the period is learned."""
    found, det = run(generate_telemetry(CHECKPOINTS), 8)
    assert of_kind(found, "step_regression") == []
    [per] = of_kind(found, "periodic_spike")
    d = per.detail
    assert (d["period_steps"], d["duration_steps"], d["next_onset_step"]) == (200, 3, 1001)
    assert per.step < 1001 and per.magnitude == pytest.approx(5.0, rel=0.2)
    # occurrences after learning are recognised, not reported as spikes
    assert [a.detail["first_step"] for a in of_kind(found, "step_spike")] == [201, 401, 601, 801]
    assert det.counters["periodic_occurrences"] == 2  # 1001 and 1201


def test_periodic_evaluation_is_learned() -> None:
    sc = replace(BASE, steps=1600, eval_every=250, eval_factor=10.0)
    found, _ = run(generate_telemetry(sc), 8)
    assert of_kind(found, "step_regression") == []
    [per] = of_kind(found, "periodic_spike")
    assert (per.detail["period_steps"], per.detail["duration_steps"], per.detail["next_onset_step"]) == (250, 1, 1251)


@pytest.mark.parametrize("seed", [0, 1])
def test_data_loader_stalls_fire_no_regression_and_no_outlier(seed: int) -> None:
    sc = replace(BASE, loader_stall_prob=0.01, loader_stall_factor=3.0, loader_stall_steps=2, seed=seed)
    found, _ = run(generate_telemetry(sc), 8)
    assert {a.kind for a in found} <= {"step_spike"}
    assert of_kind(found, "step_spike")


def test_sustained_regression_is_detected_while_spikes_continue() -> None:
    sc = replace(CHECKPOINTS, steps=1300, gc_prob=0.02, slowdown=0.10, slowdown_from_step=1050)
    found, _ = run(generate_telemetry(sc), 8)
    [reg] = of_kind(found, "step_regression")
    assert reg.detail["pattern"] == "cusum" and 1050 <= reg.step <= 1070
    assert 0.05 <= reg.magnitude <= 0.2  # the run's mean excess (a CUSUM run starts on a high step: biased up)
    assert len(of_kind(found, "periodic_spike")) == 1


def test_pattern_dropped_when_the_spikes_stop_and_a_hidden_occurrence_is_no_miss() -> None:
    recs = generate_telemetry(CHECKPOINTS)
    quiet = replace(CHECKPOINTS, steps=1700, checkpoint_every=None)
    tail = [r for r in generate_telemetry(quiet) if r["step"] > 1100]
    det = JobDetector("sim", 8)
    det.exclude_steps(1199, 1204, "capture c-1")  # the 1201 occurrence is hidden by a capture window
    found, _ = run([r for r in recs if r["step"] <= 1300], 8, det=det)
    assert det.counters["patterns_dropped"] == 0  # hidden, not missed
    det2 = JobDetector("sim", 8)
    run([r for r in recs if r["step"] <= 1100] + tail, 8, det=det2)
    assert det2.counters["patterns_learned"] == 1 and det2.counters["patterns_dropped"] == 1  # 1201, 1401 missed


def test_episode_longer_than_the_capture_lead_is_a_level_change() -> None:
    """A 6x excursion that lasts 30 steps outlasts the planner's lead (8 steps at 0.5 s): a step regression
    whose onset is the episode's, reported once the lead had passed."""
    sc = replace(BASE, steps=600, slowdown=5.0, slowdown_from_step=400)
    found, _ = run(generate_telemetry(sc), 8)
    [reg] = of_kind(found, "step_regression")
    lead = lead_steps(400, 0.5, CaptureSettings())
    assert reg.detail["pattern"] == "level" and reg.detail["first_step"] == 400 and reg.step == 400 + lead
    assert reg.magnitude == pytest.approx(5.0, rel=0.1)
    assert of_kind(found, "step_spike") == []


def test_armed_capture_covers_the_next_occurrence_when_the_policy_asks() -> None:
    found, det = run(generate_telemetry(replace(CHECKPOINTS, steps=900)), 8)
    [per] = of_kind(found, "periodic_spike")
    cap = CaptureSettings()
    policy = ArmingPolicy(ArmingSettings(arm_on=("step_regression", "periodic_spike")))
    decision = policy.decide(per, JobArmState(), 0.0)
    assert decision.action == "arm"
    furthest = det.furthest_step
    assert furthest is not None
    req = capture_request(per, decision, furthest_step=furthest, step_time_s=det.baseline_step_time_s, capture=cap)
    plan = plan_capture(req, JobProgress(job_id="sim", world_size=8, furthest_step=furthest,
                                         step_time_s=det.baseline_step_time_s, prof_root="/p", now_unix_s=0.0), cap)
    first_active = plan.start_step + plan.warmup
    assert first_active == 1001 and plan.active >= 3  # the active steps start at the predicted onset
    # without the setting the periodic spike only reports
    assert ArmingPolicy().decide(per, JobArmState(), 0.0).reason == "kind_not_armed"


def test_next_occurrence_too_close_moves_the_capture_one_period_on() -> None:
    found, _ = run(generate_telemetry(replace(CHECKPOINTS, steps=900)), 8)
    [per] = of_kind(found, "periodic_spike")
    decision = ArmingPolicy(ArmingSettings(arm_on=("periodic_spike",))).decide(per, JobArmState(), 0.0)
    req = capture_request(per, decision, furthest_step=998, step_time_s=0.5, capture=CaptureSettings())
    assert req.start_step is not None and req.start_step + decision.warmup == 1201


def test_random_spikes_are_not_mistaken_for_periodic() -> None:
    """5000 steps of random 3x spikes at 1 in 50 (about 100 episodes): no lattice is significant."""
    rng = np.random.default_rng(2)
    f = SpikeFilter(DetectionSettings())
    learned = 0
    for step in range(1, 5001):
        rel = 2.0 if rng.random() < 0.02 else 0.0
        learned += f.observe(step, rel, rel / 0.05, hold_steps=8).new_pattern is not None
    assert f.counters["episodes"] >= 80
    assert learned == 0
