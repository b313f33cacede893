"""Tests of daemon/profwatch/core/arming/policy.py (pure; fake clock)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from profwatch.core.arming.policy import (
    ArmDecision,
    ArmHistory,
    ArmingPolicy,
    ArmingSettings,
    JobArmState,
    capture_request,
    describe_anomaly,
    small_group_steps,
)
from profwatch.core.capture.planner import CaptureSettings, lead_steps
from profwatch.core.detection.job_detector import Anomaly

REG = Anomaly("step_regression", "j1", 120, (), 0.25, {})
OUT = Anomaly("rank_outlier", "j1", 130, (5,), 0.3, {})
STALL = Anomaly("stalled_rank", "j1", 140, (3,), 1.0, {})
SPIKE = Anomaly("step_spike", "j1", 150, (), 2.0, {"first_step": 148, "duration_steps": 1})
PERIODIC = Anomaly("periodic_spike", "j1", 805, (), 5.0,
                   {"period_steps": 200, "next_onset_step": 1001, "duration_steps": 3})
NOW = 10_000.0


def decide(anomaly: Anomaly = REG, state: JobArmState | None = None, **settings: Any) -> ArmDecision:
    return ArmingPolicy(ArmingSettings(**settings)).decide(anomaly, state or JobArmState(), NOW)


def test_act_mode_arms_with_window_defaults() -> None:
    d = decide()
    assert (d.action, d.reason) == ("arm", "armed")
    assert (d.warmup, d.active, d.rank_list) == (1, 4, None)
    assert "step_regression" in d.capture_reason and "+25%" in d.capture_reason
    assert d.to_json()["rank_list"] is None


def test_rank_outlier_arms_configured_rank_list() -> None:
    d = decide(OUT, rank_list=(0, 5))
    assert d.action == "arm" and d.rank_list == (0, 5)


@pytest.mark.parametrize(
    ("anomaly", "state", "settings", "reason"),
    [
        (REG, JobArmState(), {"mode": "off"}, "mode_off"),
        (STALL, JobArmState(), {}, "stalled_rank_not_capturable"),
        (OUT, JobArmState(), {"arm_on": ("step_regression",)}, "kind_not_armed"),
        (REG, JobArmState(), {"min_magnitude": 0.5}, "below_min_magnitude"),
        (REG, JobArmState(capture_in_flight=True), {}, "capture_in_flight"),
        (REG, JobArmState(episode_captured_unix_s=NOW - 10), {"cooldown_s": 60}, "cooldown"),
        (REG, JobArmState(last_arm_unix_s=NOW - 10), {"min_arm_gap_s": 60}, "min_arm_gap"),
        (REG, JobArmState(rotating=True), {}, "culprit_rotates"),
        (REG, JobArmState(episode_unchanged=True, episode_captured_unix_s=NOW - 5000), {}, "captured_unchanged"),
        (REG, JobArmState(), {"max_capture_bytes_per_hour": 10, "rank_list": (0, 1)}, "larger_than_byte_cap"),
        (REG, JobArmState(captures_last_hour=4), {"max_captures_per_hour": 4}, "hourly_cap"),
        (REG, JobArmState(bytes_last_hour=2**30), {"max_capture_bytes_per_hour": 2**30}, "byte_cap"),
        (REG, JobArmState(stalled_ranks=frozenset({3})), {}, "stalled_rank_in_capture"),
        (STALL, JobArmState(), {"mode": "observe"}, "stalled_rank_not_capturable"),
        (SPIKE, JobArmState(), {"arm_on": ("step_spike",)}, "transient_not_capturable"),
        (PERIODIC, JobArmState(), {}, "kind_not_armed"),
    ],
)
def test_suppression_reasons(anomaly: Anomaly, state: JobArmState, settings: dict[str, Any], reason: str) -> None:
    d = decide(anomaly, state, **settings)
    assert (d.action, d.reason) == ("suppress", reason)


def test_stalled_rank_outside_rank_list_does_not_block() -> None:
    d = decide(OUT, JobArmState(stalled_ranks=frozenset({3})), rank_list=(5,))
    assert d.action == "arm"


def test_cooldown_and_gap_expire_and_no_byte_cap() -> None:
    assert decide(state=JobArmState(episode_captured_unix_s=NOW - 61), cooldown_s=60).action == "arm"
    assert decide(state=JobArmState(last_arm_unix_s=NOW - 61), min_arm_gap_s=60).action == "arm"
    assert decide(state=JobArmState(last_arm_unix_s=NOW - 61), cooldown_s=900).action == "arm"  # other episode
    assert decide(state=JobArmState(bytes_last_hour=10**15), max_capture_bytes_per_hour=None).action == "arm"


def test_observe_mode_applies_the_same_limits() -> None:
    assert (decide(mode="observe").action, decide(mode="observe").reason) == ("would_arm", "observe_mode")
    d = decide(state=JobArmState(capture_in_flight=True), mode="observe")
    assert (d.action, d.reason) == ("suppress", "capture_in_flight")


def test_settings_validation_and_runtime_update() -> None:
    with pytest.raises(ValidationError):
        ArmingSettings(mode="maybe")  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        ArmingSettings(nope=1)  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        ArmingSettings(active=0)
    policy = ArmingPolicy()
    policy.update_settings(ArmingSettings(mode="off"))
    assert policy.decide(REG, JobArmState(), NOW).reason == "mode_off"


def test_arm_history_rolls_over_one_hour() -> None:
    h = ArmHistory()
    h.record_arm(1000.0)
    h.record_bytes(1100.0, 500)
    st = h.state(1200.0, capture_in_flight=True)
    assert (st.captures_last_hour, st.bytes_last_hour, st.last_arm_unix_s, st.capture_in_flight) == (1, 500, 1000.0, True)
    st = h.state(1000.0 + 3600.0 + 200.0, capture_in_flight=False)
    assert (st.captures_last_hour, st.bytes_last_hour, st.last_arm_unix_s) == (0, 0, 1000.0)


def test_observe_mode_would_arm_counts_for_gap_and_cap_like_an_arm() -> None:
    """One arming path: in observe mode a would_arm is recorded, so the second anomaly meets the gap and the cap
    exactly as it would in act mode (issue 10: observe mode used to report would_arm on every anomaly)."""
    for mode, first in (("act", "arm"), ("observe", "would_arm")):
        policy = ArmingPolicy(ArmingSettings(mode=mode, min_arm_gap_s=600, max_captures_per_hour=2))
        h = ArmHistory()
        actions = []
        for i, t in enumerate((NOW, NOW + 60, NOW + 700, NOW + 1400)):
            d = h.decide(policy, REG, t, capture_in_flight=False)
            actions.append((d.action, d.reason))
            h.record(d, t)
            assert h.state(t, capture_in_flight=False).captures_last_hour == min(2, (i + 2) // 2)
        assert actions == [(first, "armed" if mode == "act" else "observe_mode"), ("suppress", "min_arm_gap"),
                           (first, "armed" if mode == "act" else "observe_mode"), ("suppress", "hourly_cap")]


def test_release_returns_the_hourly_slot_and_hold_until_says_when_each_hold_ends() -> None:
    s = ArmingSettings(max_captures_per_hour=2, min_arm_gap_s=60, cooldown_s=900, max_capture_bytes_per_hour=1000)
    h = ArmHistory()
    h.record_arm(NOW, "c1")
    h.record_arm(NOW + 100, "c2")
    assert h.hold_until("hourly_cap", NOW + 200, s) == NOW + 3600
    assert h.hold_until("min_arm_gap", NOW + 120, s) == NOW + 160
    assert h.hold_until("cooldown", NOW + 120, s, episode_captured_unix_s=NOW) == NOW + 900
    assert h.release("c1") and not h.release("c1")
    assert h.state(NOW + 200, capture_in_flight=False).captures_last_hour == 1
    h.record_bytes(NOW, 600)
    h.record_bytes(NOW + 50, 300)
    assert h.hold_until("byte_cap", NOW + 200, s, estimated_bytes=200) == NOW + 3600
    assert h.hold_until("capture_in_flight", NOW + 200, s) is None


def test_suppressed_decisions_are_not_recorded_and_bytes_add_up() -> None:
    h = ArmHistory()
    policy = ArmingPolicy(ArmingSettings(max_capture_bytes_per_hour=1000))
    h.record(h.decide(policy, STALL, NOW, capture_in_flight=False), NOW)
    assert h.last_arm_unix_s is None
    h.record_bytes(NOW, 600)
    h.record_bytes(NOW + 1, 500)
    h.record_bytes(NOW + 2, 0)
    assert h.decide(policy, REG, NOW + 3, capture_in_flight=False).reason == "byte_cap"


def test_capture_request_lets_the_planner_place_ordinary_captures() -> None:
    d = decide(OUT, rank_list=(5,))
    req = capture_request(OUT, d, furthest_step=130, step_time_s=0.5, capture=CaptureSettings())
    assert (req.start_step, req.warmup, req.active, req.rank_list, req.job_id) == (None, 1, 4, [5], "j1")
    assert "rank_outlier" in req.reason


@pytest.mark.parametrize(("furthest", "step_time", "onset"), [(810, 0.5, 1001), (995, 0.5, 1201), (810, 20.0, 1001),
                                                              (1400, 2.0, 1601)])
def test_capture_request_places_a_periodic_capture_on_a_predicted_onset(furthest: int, step_time: float,
                                                                        onset: int) -> None:
    cap = CaptureSettings(max_active=10)
    d = decide(PERIODIC, arm_on=("periodic_spike",), warmup=1, active=2)
    req = capture_request(PERIODIC, d, furthest_step=furthest, step_time_s=step_time, capture=cap)
    assert req.start_step is not None
    assert req.start_step + d.warmup == onset  # active steps start at the onset
    assert req.start_step >= furthest + lead_steps(furthest, step_time, cap)  # never closer than the planner allows
    assert req.active == 3  # the spike's duration
    short = CaptureSettings(max_active=2)
    assert capture_request(PERIODIC, d, furthest_step=810, step_time_s=0.5, capture=short).active == 2


def test_a_change_against_the_previous_generation_names_the_requeue_in_its_capture_reason() -> None:
    """A requeue of the same world size onto slower nodes (1.6x from its start) is reported once against the previous
    generation's level: its capture reason says so, as an engineer reading the one alert needs to know the baseline
    is the job before the requeue, not this generation's own steps."""
    a = Anomaly("step_regression", "j", 56, (), 0.57, {"pattern": "level", "reference": "previous_generation"})
    assert describe_anomaly(a) == "step_regression +57% at step 56 over the previous generation (requeued)"
    b = Anomaly("step_regression", "j", 56, (), 0.57, {"pattern": "level", "reference": "learned_steps"})
    assert describe_anomaly(b) == "step_regression +57% at step 56"


@pytest.mark.parametrize(("world", "rank_list", "active", "planned"),
                         [(2, None, 12, 10), (3, None, 12, 10), (4, None, 12, 10), (5, None, 4, 4), (64, (3, 9), 12, 10),
                          (64, (3,), 4, 4), (None, None, 4, 4)])
def test_a_capture_of_a_small_group_records_more_steps_up_to_max_active(
        world: int | None, rank_list: tuple[int, ...] | None, active: int, planned: int) -> None:
    """A group of 2-4 ranks is judged step by step, which needs 5-8 steps to decide (a lockstep TP pair's late z was
    1.96 over 4 steps, 11-15 over 17-20): a capture covering 2-4 ranks records ``small_group_active`` steps, capped
    at ``[capture] max_active``; one rank, a larger group (5 ranks decide at 4 steps) or an unknown world size keeps
    ``active``. The anomalies are 2x: their step-by-step test needs no more steps (:func:`small_group_steps`)."""
    from profwatch.core.arming.targeting import JobTopology

    out = Anomaly("rank_outlier", "j1", 130, (5,), 2.0, {})
    reg = Anomaly("step_regression", "j1", 120, (), 2.0, {})
    topo = JobTopology(world, {r: f"h{r // 8}" for r in range(world)}) if world is not None else None
    kw: dict[str, Any] = {"rank_list": rank_list} if rank_list is not None else {}
    d = ArmingPolicy(ArmingSettings(**kw)).decide(out if rank_list else reg, JobArmState(), NOW, topo)
    assert d.action == "arm" and d.active == active and d.sized_active is None
    req = capture_request(out, d, furthest_step=100, step_time_s=0.5, capture=CaptureSettings())
    assert req.active == planned and req.max_active is None
    wide = capture_request(out, d, furthest_step=100, step_time_s=0.5, capture=CaptureSettings(max_active=16))
    assert wide.active == active
    contradicted = ArmingPolicy(ArmingSettings(active=15)).decide(reg, JobArmState(), NOW, topo)
    assert capture_request(reg, contradicted, furthest_step=100, step_time_s=0.5,
                           capture=CaptureSettings()).active == 15  # the user's own active: the planner refuses it


@pytest.mark.parametrize(("ranks", "magnitude", "noise", "steps"),
                         [(2, 0.3, 0.25, 20), (2, 0.3, 0.30, 29), (2, 0.3, 0.34, 37), (2, 0.3, 0.35, 40),
                          (2, 0.5, 0.35, 18), (3, 0.3, 0.35, 42), (4, 0.4, 0.35, 28),
                          (2, 2.0, 0.35, 8), (3, 2.0, 0.35, 6), (4, 3.0, 0.35, 5),
                          (2, float("nan"), 0.35, 8), (2, 0.0, 0.35, 8), (2, 1e300, 0.35, 8), (2, 0.01, 0.35, 10_000)])
def test_small_group_steps_is_what_the_step_by_step_test_needs_at_the_anomalys_size(
        ranks: int, magnitude: float, noise: float, steps: int) -> None:
    """The live TP serving pair (rank 1 +30 %, per-step noise 25-34 % of the step): 10 captured steps gave p 0.07
    and 0.21 where 0.005 is needed; at 90 % power the test needs ((z_0.995 + z_0.9) noise / (0.3 / 1.3 - 0.015))^2
    = 20-37 steps. Never fewer than the steps whose smallest p-value N^-n reaches the level (8 for a pair, 6 for a
    trio, 5 for four ranks); no size (NaN, 0) asks for those alone, an absurd one is bounded, and an effect under
    the tie floor asks for more than any cap."""
    assert small_group_steps(ranks, magnitude, noise) == steps


def test_small_group_steps_refuses_a_bad_group_or_level() -> None:
    """The level is ``[analysis.ranking] family_alpha``, which its settings already keep inside (0, 1)."""
    from profwatch.core.verdict.ranking import RankingSettings

    for kw in ({"ranks": 1}, {"noise_frac": 0.0}, {"power": 1.0}, {"power": 0.0}):
        args: dict[str, Any] = {"ranks": 2, "magnitude": 0.3, "noise_frac": 0.3, **kw}
        with pytest.raises(ValueError, match="bad small-group sizing"):
            small_group_steps(**args)
    with pytest.raises(ValidationError):
        RankingSettings(family_alpha=1.0)


@pytest.mark.parametrize(("world", "rank_list", "magnitude", "active", "planned"),
                         [(2, None, 0.3, 40, 40), (2, None, 0.5, 18, 18), (4, None, 0.4, 28, 28),
                          (64, (3, 9), 0.3, 40, 40), (2, None, 0.2, 40, 40), (2, None, 2.0, 12, 10),
                          (5, None, 0.3, 4, 4), (64, (3,), 0.3, 4, 4), (None, None, 0.3, 4, 4)])
def test_a_small_groups_window_is_sized_for_its_anomaly_past_max_active(
        world: int | None, rank_list: tuple[int, ...] | None, magnitude: float, active: int, planned: int) -> None:
    """A capture of 2-4 ranks records the steps its step-by-step test needs at the anomaly's size
    (:func:`small_group_steps` at ``[arming] small_group_noise_frac`` 0.35), at least ``small_group_active`` and at
    most ``small_group_max_active`` (40), past ``[capture] max_active`` (10): the planner accepts it (the request
    carries its own ``max_active``) and gives it a deadline for the longer window. A large anomaly keeps
    ``small_group_active`` capped at ``max_active``; one rank, 5 ranks or an unknown world size keep ``active``.
    Before: every small group recorded 10 steps (the live TP pair +30 %: p 0.07 and 0.21, named nobody)."""
    from profwatch.core.arming.targeting import JobTopology
    from profwatch.core.capture.planner import JobProgress, plan_capture

    a = Anomaly("rank_outlier", "j1", 130, rank_list or (1,), magnitude, {})
    topo = JobTopology(world, {r: f"h{r // 8}" for r in range(world)}) if world is not None else None
    kw: dict[str, Any] = {"rank_list": rank_list} if rank_list is not None else {}
    d = ArmingPolicy(ArmingSettings(**kw)).decide(a, JobArmState(), NOW, topo)
    assert d.action == "arm" and d.active == active
    req = capture_request(a, d, furthest_step=100, step_time_s=0.5, capture=CaptureSettings())
    assert req.active == planned
    job = JobProgress(job_id="j1", world_size=world or 8 if rank_list is None else 64, furthest_step=100,
                      step_time_s=0.5, prof_root="/p", now_unix_s=NOW)
    plan = plan_capture(req, job, CaptureSettings())
    assert plan.active == planned
    short = plan_capture(req.model_copy(update={"active": 4, "max_active": None}), job, CaptureSettings())
    assert plan.deadline_unix_s - short.deadline_unix_s == pytest.approx((planned - 4) * 0.5 * 3.0)


def test_a_sized_window_stops_at_small_group_max_active_and_a_manual_arm_at_max_active() -> None:
    """``small_group_max_active`` bounds the sized window (a 10 % rank of a pair would need 317 steps); a request
    that carries no ``max_active`` of its own (a manual arm) is still refused above ``[capture] max_active``."""
    from profwatch.core.arming.targeting import JobTopology
    from profwatch.core.capture.planner import CannotPlanCapture, CaptureRequest, JobProgress, plan_capture

    a = Anomaly("rank_outlier", "j1", 130, (1,), 0.1, {})
    topo = JobTopology(2, {0: "h0", 1: "h0"})
    d = ArmingPolicy(ArmingSettings(small_group_max_active=24)).decide(a, JobArmState(), NOW, topo)
    assert d.active == d.sized_active == 24
    assert capture_request(a, d, furthest_step=100, step_time_s=0.5, capture=CaptureSettings()).active == 24
    assert ArmingPolicy(ArmingSettings(small_group_max_active=12)).decide(a, JobArmState(), NOW, topo).sized_active \
        is None  # no more than small_group_active: the usual window
    job = JobProgress(job_id="j1", world_size=2, furthest_step=100, step_time_s=0.5, prof_root="/p", now_unix_s=NOW)
    with pytest.raises(CannotPlanCapture, match="over max_active 10"):
        plan_capture(CaptureRequest(job_id="j1", reason="manual", active=24), job, CaptureSettings())
    with pytest.raises(CannotPlanCapture, match="over max_active 64"):
        plan_capture(CaptureRequest(job_id="j1", reason="x", active=80, max_active=80), job, CaptureSettings())


@pytest.mark.parametrize("world", [2, 3, 4])
def test_a_job_wide_anomaly_of_a_small_job_keeps_the_small_group_window_unsized(world: int) -> None:
    """The sized window exists for the step-by-step test naming one slow rank of a small group; a job-wide anomaly
    has no rank to name (its magnitude is the whole job's slowdown, shared by every rank of the group), so a +10 %
    job-wide regression (or periodic spike) of a 2-4-rank job records ``small_group_active`` steps (12, capped at
    ``max_active`` 10 by the request), not the 40 its size would ask of a rank. A rank outlier, a replica slower
    than its peers (a ``step_regression`` naming its ranks) and a slow-from-start rank of the same size are still
    sized. Before: the job-wide regression recorded 40 steps (``sized_active`` 40)."""
    from profwatch.core.arming.targeting import JobTopology

    topo = JobTopology(world, {r: "h0" for r in range(world)})
    policy = ArmingPolicy(ArmingSettings(arm_on=("step_regression", "rank_outlier", "periodic_spike",
                                                 "slow_from_start")))
    for wide in (Anomaly("step_regression", "j1", 120, (), 0.1, {}), Anomaly("periodic_spike", "j1", 805, (), 0.1, PERIODIC.detail)):
        d = policy.decide(wide, JobArmState(), NOW, topo)
        assert (d.action, d.active, d.sized_active) == ("arm", 12, None), wide.kind
        assert capture_request(wide, d, furthest_step=100, step_time_s=0.5, capture=CaptureSettings()).active == 10
    for named in (Anomaly("rank_outlier", "j1", 130, (1,), 0.1, {}), Anomaly("step_regression", "j1", 130, (1,), 0.1, {}),
                  Anomaly("slow_from_start", "j1", 130, (1,), 0.1, {})):
        d = policy.decide(named, JobArmState(), NOW, topo)
        assert (d.action, d.active, d.sized_active) == ("arm", 40, 40), named.kind


def test_the_small_group_window_is_sized_for_the_configured_ranking_test() -> None:
    """The step-by-step test reads ``[analysis.ranking]`` (``family_alpha``, ``min_effect_frac``,
    ``paired_tie_frac``); the window is sized for the configured values, not copies of their defaults: a +50 % rank
    of a pair needs 18 steps at the defaults, 13 at ``family_alpha`` 0.05, 23 at ``min_effect_frac`` 0.05, and no
    window reaches a +10 % rank under a tie floor of 0.1. The policy takes them from the configuration (the
    coordinator's ``settings.analysis.ranking``; ``profwatch replay``'s ``[analysis]`` table). Before: no
    ``ranking`` argument (the defaults were copied into the policy)."""
    from profwatch.core.arming.targeting import JobTopology
    from profwatch.core.verdict.ranking import RankingSettings

    assert small_group_steps(2, 0.5, 0.35) == small_group_steps(2, 0.5, 0.35, ranking=RankingSettings()) == 18
    assert small_group_steps(2, 0.5, 0.35, ranking=RankingSettings(family_alpha=0.05)) == 13
    assert small_group_steps(2, 0.5, 0.35, ranking=RankingSettings(min_effect_frac=0.05)) == 23
    assert small_group_steps(2, 0.1, 0.35, ranking=RankingSettings(paired_tie_frac=0.1)) == 10_000
    topo = JobTopology(2, {0: "h0", 1: "h0"})
    a = Anomaly("rank_outlier", "j1", 130, (1,), 0.5, {})
    assert ArmingPolicy(ArmingSettings()).decide(a, JobArmState(), NOW, topo).sized_active == 18
    loose = ArmingPolicy(ArmingSettings(), RankingSettings(family_alpha=0.05))
    assert loose.decide(a, JobArmState(), NOW, topo).sized_active == 13
    loose.update_settings(ArmingSettings(cooldown_s=1.0))  # [arming] changed at runtime: the ranking stays
    assert loose.decide(a, JobArmState(), NOW, topo).sized_active == 13


def test_replay_reads_the_ranking_the_window_is_sized_for(tmp_path: Any) -> None:
    """``profwatch replay --config`` validates and uses ``[analysis]`` (its ``ranking``), as the coordinator does.
    Before: ``[analysis]`` was ignored."""
    from profwatch.commands.replay import load_config

    path = tmp_path / "pw.toml"
    path.write_text("[analysis.ranking]\nfamily_alpha = 0.05\n", encoding="utf-8")
    ignored: list[str] = []
    cfg = load_config(path, ignored)
    assert cfg.analysis.ranking.family_alpha == 0.05 and ignored == []
    path.write_text("[analysis.ranking]\nfamily_alpha = 2.0\n", encoding="utf-8")
    with pytest.raises(ValidationError):
        load_config(path)


def test_an_arm_decisions_json_carries_every_field() -> None:
    """``ArmDecision.to_json`` says it holds every field: ``configured_active`` and ``sized_active`` too (what
    explains a window longer than ``[arming] active``). Before: both were left out."""
    from dataclasses import fields

    from profwatch.core.arming.targeting import JobTopology

    d = ArmingPolicy(ArmingSettings()).decide(Anomaly("rank_outlier", "j1", 130, (1,), 0.3, {}), JobArmState(), NOW,
                                              JobTopology(2, {0: "h0", 1: "h0"}))
    doc = d.to_json()
    assert (doc["configured_active"], doc["sized_active"], doc["active"]) == (4, 40, 40)
    assert {f.name for f in fields(ArmDecision)} - {"target"} <= set(doc) and "targeting" in doc


def test_min_arm_gap_holds_no_new_named_rank_episode_after_a_job_wide_arm() -> None:
    """Issue 31 (bench_corpus seed 36, class levels, run 4): a job-wide arm at 15.6 s held a rank 1.3x slower,
    reported at 21.3 s, until 75.6 s, after the run ended. A new named-rank episode passes the gap after an arm that
    named no ranks; the gap still holds a named one after a named arm, a repeat, and a job-wide one after any arm."""
    recent = NOW - 10
    assert decide(OUT, JobArmState(last_arm_unix_s=recent), min_arm_gap_s=60).reason == "armed"
    assert decide(OUT, JobArmState(last_arm_unix_s=recent, last_arm_named=True), min_arm_gap_s=60).reason \
        == "min_arm_gap"
    assert decide(OUT, JobArmState(last_arm_unix_s=recent, repeat=True), min_arm_gap_s=60).reason == "min_arm_gap"
    assert decide(REG, JobArmState(last_arm_unix_s=recent, last_arm_named=True), min_arm_gap_s=60).reason \
        == "min_arm_gap"
    assert decide(REG, JobArmState(last_arm_unix_s=recent), min_arm_gap_s=60).reason == "min_arm_gap"


def test_arm_history_knows_whether_its_last_arm_named_ranks_through_marks_and_withdrawals() -> None:
    h = ArmHistory()
    h.record_arm(NOW, "named")
    assert h.mark_arm("named", named=True) and not h.mark_arm("other", named=True)
    assert h.state(NOW + 1, capture_in_flight=False).last_arm_named
    h.record_arm(NOW + 5, "job")  # a job-wide arm after it: the gap no longer holds a new named episode
    assert not h.state(NOW + 6, capture_in_flight=False).last_arm_named
    assert h.mark_arm("job", repeat=True) and not h.state(NOW + 6, capture_in_flight=False).last_arm_named
    assert h.state(NOW + 6, capture_in_flight=False).repeats_last_hour == 1
    assert h.withdraw("job")  # the gap runs from the named arm again, and knows it named ranks
    st = h.state(NOW + 7, capture_in_flight=False)
    assert (st.last_arm_unix_s, st.last_arm_named) == (NOW, True)
