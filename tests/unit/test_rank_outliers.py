"""Rank outliers (daemon/profwatch/core/detection/rank_outliers.py) on generated telemetry."""

from __future__ import annotations

from dataclasses import replace

import pytest

from profwatch.core.detection.job_detector import DetectionSettings
from profwatch.core.detection.rank_outliers import RankOutlierDetector, outlying_ranks
from profwatch.simulate.telemetry import TelemetryScenario, generate_telemetry
from tests.unit.detection_helpers import kinds, of_kind, run

BASE = TelemetryScenario(world_size=8, steps=300, cv=0.01, step_time_s=0.5)


def test_slow_compute_rank_named_as_outlier() -> None:
    found, _ = run(generate_telemetry(replace(BASE, slow_rank=5, slow_rank_factor=1.3, slow_rank_from_step=100)), 8)
    [out] = of_kind(found, "rank_outlier")
    assert out.ranks == (5,)
    assert out.detail["stage"][5] == "compute"
    assert out.magnitude == pytest.approx(0.3, abs=0.05)
    # in synchronous training every rank waits: the job's step time rose too (a genuine regression)
    assert "step_regression" in kinds(found)


def test_inference_step_time_outlier() -> None:
    sc = replace(BASE, sync=False, with_stages=False, slow_rank=2, slow_rank_factor=1.5, slow_rank_from_step=50)
    found, _ = run(generate_telemetry(sc), 8, DetectionSettings(outlier_on_step_time=True))
    outliers = of_kind(found, "rank_outlier")
    assert [a.ranks for a in outliers] == [(2,)]
    assert outliers[0].detail["stage"][2] == "step_time_s"


def test_peer_comparison_rule_and_window_reset() -> None:
    s = DetectionSettings()
    vals = [0.40, 0.41, 0.40, 0.39, 0.40, 0.60, float("nan"), 0.40]
    assert [r for r, _ in outlying_ranks(vals, s)] == [5]
    assert outlying_ranks(vals[:3], s) == []  # fewer than outlier_min_ranks reported
    big = [0.4] * 300
    big[7] = 0.6
    assert [r for r, _ in outlying_ranks(big, s)] == [7]  # the numpy path
    d = RankOutlierDetector("j", 8, s)
    d.update_settings(DetectionSettings(outlier_window_steps=6, outlier_min_steps=4))
    assert d.settings.outlier_window_steps == 6
