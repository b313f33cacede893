"""Tests of daemon/core/arming.py (pure; fake clock)."""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass
from typing import Any

import pytest
from pydantic import ValidationError

from daemon.core.anomaly import Anomaly
from daemon.core.arming import (
    ArmDecision,
    ArmHistory,
    ArmingPolicy,
    ArmingSettings,
    JobArmState,
    fallback_start_step,
    plan_start_step,
)

REG = Anomaly("step_regression", "j1", 120, (), 0.25, {})
OUT = Anomaly("rank_outlier", "j1", 130, (5,), 0.3, {})
STALL = Anomaly("stalled_rank", "j1", 140, (3,), 1.0, {})
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
        (REG, JobArmState(last_arm_unix_s=NOW - 10), {"cooldown_s": 60}, "cooldown"),
        (REG, JobArmState(captures_last_hour=4), {"max_captures_per_hour": 4}, "hourly_cap"),
        (REG, JobArmState(bytes_last_hour=2**30), {"max_capture_bytes_per_hour": 2**30}, "byte_cap"),
        (REG, JobArmState(stalled_ranks=frozenset({3})), {}, "stalled_rank_in_capture"),
        (STALL, JobArmState(), {"mode": "observe"}, "stalled_rank_not_capturable"),
    ],
)
def test_suppression_reasons(anomaly: Anomaly, state: JobArmState, settings: dict[str, Any], reason: str) -> None:
    d = decide(anomaly, state, **settings)
    assert (d.action, d.reason) == ("suppress", reason)


def test_stalled_rank_outside_rank_list_does_not_block() -> None:
    d = decide(OUT, JobArmState(stalled_ranks=frozenset({3})), rank_list=(5,))
    assert d.action == "arm"


def test_cooldown_expires_and_no_byte_cap() -> None:
    assert decide(state=JobArmState(last_arm_unix_s=NOW - 61), cooldown_s=60).action == "arm"
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


@pytest.mark.parametrize(
    ("furthest", "step_time", "expected"),
    [
        (5, 0.5, 5 + 8 + 2),  # poll 2 s before step 11: ceil((2+2)/0.5) = 8
        (100, 0.5, 100 + 6 + 2),  # poll = step time clamped to >= 1 s: ceil((1+2)/0.5) = 6
        (100, 100.0, 100 + 1 + 2),  # poll clamped to 50 s: ceil(52/100) = 1
        (100, None, 100 + 3 + 2),  # unknown step time counts as 1 s
        (100, 3.0, 100 + 2 + 2),  # poll 3 s: ceil(5/3) = 2
    ],
)
def test_fallback_start_step(furthest: int, step_time: float | None, expected: int) -> None:
    assert fallback_start_step(furthest, step_time) == expected


def test_plan_start_step_delegates_to_capture_planner(monkeypatch: pytest.MonkeyPatch) -> None:
    @dataclass
    class Plan:
        start_step: int

    calls: list[tuple[Any, Any, Any]] = []
    fake = types.ModuleType("daemon.core.capture")
    fake.CaptureRequest = lambda **kw: ("req", kw)  # type: ignore[attr-defined]
    fake.JobProgress = lambda **kw: ("job", kw)  # type: ignore[attr-defined]
    fake.CaptureSettings = lambda: "settings"  # type: ignore[attr-defined]

    def plan_capture(req: Any, job: Any, settings: Any) -> Plan:
        calls.append((req, job, settings))
        return Plan(job[1]["furthest_step"] + 42)

    fake.plan_capture = plan_capture  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "daemon.core.capture", fake)
    import daemon.core

    monkeypatch.setattr(daemon.core, "capture", fake, raising=False)
    d = decide()
    assert plan_start_step("j1", 8, 100, 0.5, d, now_unix_s=NOW) == (142, "capture.plan_capture")
    assert calls[0][1][1]["world_size"] == 8 and calls[0][2] == "settings"


def test_plan_start_step_falls_back_when_planner_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    broken = types.ModuleType("daemon.core.capture")
    monkeypatch.setitem(sys.modules, "daemon.core.capture", broken)
    import daemon.core

    monkeypatch.setattr(daemon.core, "capture", broken, raising=False)
    assert plan_start_step("j1", 8, 100, 0.5, decide(), now_unix_s=NOW) == (108, "fallback")
