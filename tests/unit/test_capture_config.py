"""daemon/profwatch/core/capture/planner.py: profiler_config.json schema, rejections, render, planner lead/margin math."""

from __future__ import annotations

import json

import pytest

from profwatch.core.capture.planner import (
    CannotPlanCapture,
    CaptureRequest,
    CaptureSettings,
    ExperimentalConfig,
    InvalidProfilerConfig,
    JobProgress,
    ProfilerConfig,
    lead_steps,
    max_steps_ahead,
    new_capture_id,
    plan_capture,
    poll_interval_s,
)
from rankhook.profconfig import TEMPLATE, validate_config


def test_defaults_mirror_torch_npu_template() -> None:
    rendered = ProfilerConfig(start_step=5).render()
    expected = {**TEMPLATE, "start_step": 5, "metadata": {}}
    assert rendered == expected
    assert ExperimentalConfig().model_dump(mode="json") == TEMPLATE["experimental_config"]


def test_default_start_step_zero_is_refused() -> None:
    with pytest.raises(InvalidProfilerConfig, match="start_step 0 never fires"):
        ProfilerConfig()


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ({"start_step": 0}, "never fires"),
        ({"start_step": -2}, "start_step"),
        ({"start_step": "5"}, "start_step"),
        ({"start_step": True}, "start_step"),
        ({"active": 0}, "active"),
        ({"active": -1}, "active"),
        ({"warmup": -3}, "warmup"),
        ({"analyse": 1}, "analyse"),
        ({"async_mode": "true"}, "async_mode"),
        ({"record_shapes": None}, "record_shapes"),
        ({"is_rank": 1, "rank_list": [0]}, "is_rank"),
        ({"is_rank": True, "rank_list": []}, "empty rank_list"),
        ({"is_rank": True, "rank_list": ["1"]}, "rank_list"),
        ({"is_rank": True, "rank_list": [1.0]}, "rank_list"),
        ({"is_rank": True, "rank_list": [-1]}, "rank ids"),
        ({"activities": ["CPU", "GPU"]}, "activities"),
        ({"activities": []}, "activities"),
        ({"experimental_config": {"profiler_level": "Level3"}}, "profiler_level"),
        ({"experimental_config": {"aic_metrics": "Foo"}}, "aic_metrics"),
        ({"experimental_config": {"host_sys": ["cpu", "gpu"]}}, "host_sys"),
        ({"experimental_config": {"export_type": ["csv"]}}, "export_type"),
        ({"experimental_config": {"l2_cache": "no"}}, "l2_cache"),
        ({"experimental_config": {"gc_detect_threshold": -1}}, "gc_detect_threshold"),
        ({"experimental_config": {"unknown": 1}}, "unknown"),
        ({"NPU_MONITOR_START": True}, "NPU_MONITOR_START"),
        ({"is_valid": False}, "is_valid"),
        ({"startstep": 5}, "startstep"),
        ({"metadata": {"k": "x" * 5000}}, "metadata"),
    ],
)
def test_rejects_what_torch_npu_would_reset(bad: dict, match: str) -> None:
    with pytest.raises(InvalidProfilerConfig, match=match):
        ProfilerConfig.parse({"start_step": 7, **bad})


def test_rank_side_validation_agrees_on_core_rules() -> None:
    for bad in ({"start_step": 0}, {"start_step": 3, "active": 0}, {"start_step": 3, "warmup": -1},
                {"start_step": 3, "analyse": 1}, {"start_step": 3, "is_valid": False}, {}):
        assert validate_config(bad)[0] is None
    assert validate_config({"start_step": -1})[0] is not None


def test_accepts_torch_npu_spellings() -> None:
    c = ProfilerConfig.parse(
        {"start_step": -1, "activities": ["cpu", "Npu"], "experimental_config": {"export_type": "db",
                                                                                "gc_detect_threshold": 0}}
    )
    r = c.render()
    assert r["activities"] == ["CPU", "NPU"]
    assert r["experimental_config"]["export_type"] == ["db"]
    assert r["experimental_config"]["gc_detect_threshold"] == 0.0
    assert "NPU_MONITOR_START" not in json.dumps(r) and "is_valid" not in r
    assert not set(r) - set(TEMPLATE) - {"metadata"}


def test_not_a_dict() -> None:
    with pytest.raises(InvalidProfilerConfig, match="object"):
        ProfilerConfig.parse([1, 2])


def test_poll_interval_rule() -> None:
    assert poll_interval_s(5, 30.0) == 2.0
    assert poll_interval_s(11, 0.2) == 1.0
    assert poll_interval_s(11, 7.9) == 7.0
    assert poll_interval_s(100, 500.0) == 50.0
    assert poll_interval_s(100, None) == 2.0


def _job(**kw: object) -> JobProgress:
    base = {"job_id": "j1", "world_size": 4, "furthest_step": 100, "step_time_s": 0.5, "prof_root": "/prof", "now_unix_s": 1_800_000_000.0}
    base.update(kw)
    return JobProgress(**base)  # type: ignore[arg-type]


def test_plan_lead_and_margin_math() -> None:
    s = CaptureSettings(margin_s=2.0, margin_steps=2)
    # after step 11: poll = int(0.5) clamped to 1 s -> ceil((1 + 2) / 0.5) + 2 = 8
    assert lead_steps(100, 0.5, s) == 8
    # before step 11: poll 2 s -> ceil(4 / 0.5) + 2 = 10
    assert lead_steps(5, 0.5, s) == 10
    # slow steps: poll = 20 s -> ceil(22 / 20) + 2 = 4
    assert lead_steps(100, 20.0, s) == 4
    p = plan_capture(CaptureRequest(job_id="j1", reason="slow_rank"), _job(), s)
    assert p.start_step == 108 and p.lead_steps == 8 and p.poll_interval_s == 1.0
    assert (p.warmup, p.active) == (1, 4)
    assert p.prof_dir == f"/prof/j1/{p.capture_id}/"
    cfg = p.config.render()
    assert cfg["start_step"] == 108 and cfg["prof_dir"] == p.prof_dir
    assert cfg["metadata"] == {"profwatch_capture_id": p.capture_id, "profwatch_reason": "slow_rank",
                               "profwatch_job_id": "j1"}
    assert cfg["is_rank"] is False and cfg["rank_list"] == []
    assert cfg["analyse"] is True and cfg["async_mode"] is True
    assert cfg["experimental_config"]["profiler_level"] == "Level1"
    assert cfg["experimental_config"]["export_type"] == ["db"]
    # deadline = now + poll + margin_s + (8 + 3) * 0.5 * factor 3 + grace 120
    assert p.deadline_unix_s == pytest.approx(1_800_000_000.0 + 1 + 2 + 11 * 0.5 * 3 + 120)


def test_plan_overrides() -> None:
    s = CaptureSettings()
    p = plan_capture(CaptureRequest(job_id="j1", reason="r", rank_list=[3, 1, 3], warmup=0, active=4,
                                    capture_id="c-1"), _job(), s)
    assert p.rank_list == [1, 3] and p.config.is_rank and p.config.rank_list == [1, 3]
    assert p.capture_id == "c-1" and (p.warmup, p.active) == (0, 4)
    all_ranks = plan_capture(CaptureRequest(job_id="j1", reason="r", rank_list=[0, 1, 2, 3]), _job(), s)
    assert all_ranks.rank_list is None and not all_ranks.config.is_rank
    assert plan_capture(CaptureRequest(job_id="j1", reason="r", in_steps=50), _job(), s).start_step == 150
    assert plan_capture(CaptureRequest(job_id="j1", reason="r", in_steps=1), _job(), s).start_step == 108
    assert plan_capture(CaptureRequest(job_id="j1", reason="r", start_step=500), _job(), s).start_step == 500


@pytest.mark.parametrize(
    ("req", "job", "match"),
    [
        ({"start_step": 105}, {}, "too close"),
        ({"active": 11}, {}, "max_active"),
        ({"rank_list": [4]}, {}, "rank_list"),
        ({"rank_list": []}, {}, "rank_list"),
        ({}, {"step_time_s": None}, "step time"),
        ({}, {"step_time_s": 0.0}, "step time"),
        ({}, {"prof_root": "rel/dir"}, "absolute"),
        ({"capture_id": "../x"}, {}, "safe path"),
        ({}, {"job_id": "a/b"}, "job"),
    ],
)
def test_plan_refusals(req: dict, job: dict, match: str) -> None:
    j = _job(**job)
    with pytest.raises(CannotPlanCapture, match=match):
        plan_capture(CaptureRequest(job_id=j.job_id, reason="r", **req), j, CaptureSettings())


def test_plan_refuses_negative_warmup_via_config() -> None:
    with pytest.raises(InvalidProfilerConfig, match="warmup"):
        plan_capture(CaptureRequest(job_id="j1", reason="r", warmup=-1), _job())


def test_capture_settings_forbid_extra() -> None:
    with pytest.raises(ValueError):
        CaptureSettings(bogus=1)  # type: ignore[call-arg]


def test_new_capture_id_is_pure_and_safe() -> None:
    a = new_capture_id("j1", 1_800_000_000.123)
    assert a == new_capture_id("j1", 1_800_000_000.123)
    assert a.startswith("c-20270115T") and a != new_capture_id("j2", 1_800_000_000.123)
    assert "/" not in a


@pytest.mark.parametrize(("step_time_s", "limit"), [(0.5, 7200), (3.6, 1000), (10.0, 1000), (0.01, 360_000)])
def test_a_start_step_more_than_an_hour_or_1000_steps_ahead_is_refused(step_time_s: float, limit: int) -> None:
    """max(1000 steps, one hour at the measured step time) ahead of the covered ranks' furthest step (100)."""
    j = _job(step_time_s=step_time_s)
    assert max_steps_ahead(step_time_s) == limit
    assert plan_capture(CaptureRequest(job_id="j1", reason="r", start_step=100 + limit), j).start_step == 100 + limit
    with pytest.raises(CannotPlanCapture, match="would likely outlive the job"):
        plan_capture(CaptureRequest(job_id="j1", reason="r", start_step=100 + limit + 1), j)
    with pytest.raises(CannotPlanCapture, match="steps ahead"):
        plan_capture(CaptureRequest(job_id="j1", reason="r", in_steps=limit + 1), j)
