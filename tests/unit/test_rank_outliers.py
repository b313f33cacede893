"""Rank outliers (daemon/profwatch/core/detection/rank_outliers.py) on generated telemetry."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
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


def test_a_slow_rank_of_a_three_rank_job_is_named() -> None:
    """Three ranks, 12-20 % job-wide noise: rank 1 +30 % from step 200 is named as a ``rank_outlier`` within 20
    steps (the median of three is a healthy peer's value); 3,000 healthy steps name nobody. Before, a stage was
    compared only when four ranks reported it, so a 3-rank job's slow rank was never named and waited for the job's
    step time (bench_corpus seed 38 levels run 15: 321 steps after a speedup)."""
    for seed in (0, 1, 2):
        for cv in (0.12, 0.2):
            sc = TelemetryScenario(world_size=3, steps=400, cv=cv, step_time_s=0.05, seed=seed, slow_rank=1,
                                   slow_rank_factor=1.3, slow_rank_from_step=200)
            found, _ = run(generate_telemetry(sc), 3)
            outliers = of_kind(found, "rank_outlier")
            assert outliers and outliers[0].ranks == (1,) and outliers[0].step <= 220, (seed, cv, found)
            healthy, _ = run(generate_telemetry(TelemetryScenario(world_size=3, steps=3000, cv=cv, step_time_s=0.05,
                                                                  seed=seed)), 3)
            assert not of_kind(healthy, "rank_outlier"), (seed, cv, healthy)


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
    assert outlying_ranks([0.40, 0.60], s) == []  # fewer than outlier_min_ranks reported
    big = [0.4] * 300
    big[7] = 0.6
    assert [r for r, _ in outlying_ranks(big, s)] == [7]  # the numpy path
    d = RankOutlierDetector("j", 8, s)
    d.update_settings(DetectionSettings(outlier_window_steps=6, outlier_min_steps=4))
    assert d.settings.outlier_window_steps == 6


def _barrier_job(world: int, slow: tuple[int, ...], factor: float, *, onset: int = 45, steps: int = 200,
                 per_node: int = 0, seed: int = 14) -> list[dict[str, object]]:
    """A synchronous job with a barrier every step: each rank's ``compute`` (0.8 of the step, 0.5 % spread
    across ranks, 2 % job noise), then ``comm`` = the wait for the slowest rank plus the collective (0.2). From
    step ``onset`` the ``slow`` ranks compute ``factor`` times longer; the others wait for them. ``per_node``
    ranks share a ``node`` (0 = no node field). As ``bench/bench_corpus.py`` writes its training jobs."""
    rng = np.random.default_rng(seed)
    out: list[dict[str, object]] = []
    t = 1.7e9
    for i in range(steps):
        base = 0.5 * max(0.2, 1.0 + 0.02 * float(rng.standard_normal()))
        compute = base * 0.8 * np.maximum(0.2, 1.0 + 0.005 * rng.standard_normal(world))
        if i + 1 >= onset:
            compute[list(slow)] *= factor
        st = float(compute.max()) + 0.2 * base
        t += st
        for r in range(world):
            rec: dict[str, object] = {"job_id": "bar", "rank": r, "world_size": world, "step": i + 1,
                                      "step_time_s": st, "ts_unix_s": t,
                                      "stages": {"compute": float(compute[r]), "comm": st - float(compute[r])}}
            if per_node:
                rec["node"] = f"n-{r // per_node}"
            out.append(rec)
    return out


@pytest.mark.parametrize(("world", "slow", "per_node"), [
    (13, tuple(range(8)), 8),  # one node of 8 ranks is most of a 13-rank job (bench_corpus seed 31, steady run 14)
    (8, (0, 1, 2, 3), 4),  # a slow node in a 2-node job: a slow half
    (10, (2, 3, 5, 7, 9), 0),  # a slow half, not a node
    (9, (0, 1, 2, 3, 4, 5, 6), 0),  # most of the job
])
def test_waiting_at_the_barrier_never_names_the_healthy_ranks(world: int, slow: tuple[int, ...],
                                                             per_node: int) -> None:
    """When the slow ranks are half of the job or more, the healthy ones wait for them at the barrier: their
    ``comm`` stage is the outlying value, and it once named the 5 healthy ranks of 13 as outliers (the capture
    named the wrong ranks). A wait is the symptom of a slow peer, never evidence: no healthy rank is named, and
    the job-wide slowdown is still reported."""
    found, _ = run(_barrier_job(world, slow, 3.0, per_node=per_node), world)
    healthy = set(range(world)) - set(slow)
    named = {r for a in of_kind(found, "rank_outlier") for r in a.ranks}
    assert not named & healthy, [(a.ranks, a.detail) for a in of_kind(found, "rank_outlier")]
    assert "step_regression" in kinds(found)


@pytest.mark.parametrize(("world", "slow"), [(13, (4,)), (16, (8, 9)), (8, (0, 1, 2))])
def test_a_slow_minority_is_still_named_while_the_majority_waits(world: int, slow: tuple[int, ...]) -> None:
    """The usual case, with the same barrier: the slow minority's compute is outlying, the waiting majority's
    ``comm`` is not compared; the slow ranks, and only they, are named."""
    found, _ = run(_barrier_job(world, slow, 3.0), world)
    named = {r for a in of_kind(found, "rank_outlier") for r in a.ranks}
    assert named == set(slow), [(a.ranks, a.detail) for a in of_kind(found, "rank_outlier")]


def test_a_wait_stage_is_compared_when_outlier_stages_names_it() -> None:
    """``outlier_stages`` is the user's word: a wait stage it names is compared (the default leaves it out)."""
    recs = _barrier_job(13, tuple(range(8)), 3.0, per_node=8)
    found, _ = run(recs, 13, DetectionSettings(outlier_stages=("compute", "comm")))
    assert {r for a in of_kind(found, "rank_outlier") for r in a.ranks} == set(range(8, 13))


def _zero_stage_job(peer_value_s: float) -> list[dict[str, object]]:
    """8 ranks in lock-step; a ``dataloader`` stage the peers report as ``peer_value_s``; rank 3's data loader
    stalls 60 ms a step from step 200 (the others wait for it at the barrier: every rank's step time rises)."""
    rng = np.random.default_rng(5)
    out: list[dict[str, object]] = []
    ts = 1_764_500_000.0
    for step in range(400):
        dl = [0.06 if (r == 3 and step >= 200) else peer_value_s for r in range(8)]
        comp = [0.3 * (1 + 0.01 * float(rng.standard_normal())) for _ in range(8)]
        st = max(d + c for d, c in zip(dl, comp, strict=True)) + 0.02
        for r in range(8):
            out.append({"job_id": "dl8", "rank": r, "world_size": 8, "step": step, "step_time_s": st,
                        "ts_unix_s": ts, "stages": {"dataloader": dl[r], "compute": comp[r],
                                                    "comm": st - dl[r] - comp[r]}})
        ts += st
    return out


@pytest.mark.parametrize("peer_value_s", [0.0, 1e-6])
def test_a_stall_in_a_stage_the_peers_report_as_zero_names_the_rank(peer_value_s: float) -> None:
    # peers at exactly 0 s were skipped (median <= 0): only a job-wide step_regression came, naming no rank
    found, _ = run(_zero_stage_job(peer_value_s), 8)
    outliers = of_kind(found, "rank_outlier")
    assert [a.ranks for a in outliers] == [(3,)]
    assert outliers[0].detail["stage"][3] == "dataloader"
    # the excess is measured against 1 % of the step (STAGE_SCALE_FLOOR): 60 ms of a ~0.38 s step, about 16x
    assert 10 < outliers[0].magnitude < 20


def test_peers_at_zero_without_a_floor_name_nobody() -> None:
    s = DetectionSettings()
    vals = [0.0, 0.0, 0.0, 0.06, 0.0, 0.0, 0.0, 0.0]
    assert outlying_ranks(vals, s, floor_s=0.0) == []  # no scale to measure against
    assert [r for r, _ in outlying_ranks(vals, s, floor_s=0.004)] == [3]
    assert outlying_ranks([0.0005 if r == 3 else 0.0 for r in range(8)], s, floor_s=0.004) == []  # < min_abs_s
    big = [0.0] * 300
    big[7] = 0.06
    assert [r for r, _ in outlying_ranks(big, s, floor_s=0.004)] == [7]  # the numpy path
