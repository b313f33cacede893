"""Detectors on the job shapes of issue 20 (generated telemetry, fake clock from the records): pipeline stages
with a structural imbalance, serving traffic with idle gaps and independent replicas, drift with a sudden change,
5 ms steps. Detection quality (delays, false pages per hour) is measured in bench/bench_workloads.py."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import numpy as np
import pytest

from profwatch.core.detection.blocks import StepBlocks, merge_block
from profwatch.core.detection.drift import DriftTracker
from profwatch.core.detection.job_detector import DetectionSettings, JobDetector
from profwatch.core.detection.rank_outliers import outlying_ranks
from profwatch.core.detection.serving import LoadNormaliser, UnitSplitter, is_idle_gap
from profwatch.core.detection.types import FinalizedStep
from profwatch.simulate.telemetry import (
    ServingScenario,
    TelemetryScenario,
    generate_telemetry,
    iter_serving_telemetry,
)
from rankhook.wire import StepReport
from tests.unit.detection_helpers import of_kind, run

PIPELINE = TelemetryScenario(world_size=8, steps=700, cv=0.02, rank_compute_factors=(1, 1, 1, 1, 1, 1, 1.15, 1.15))


def _first(found: list, kind: str, ranks: tuple[int, ...] | None = None) -> int | None:
    hits = [a.step for a in found if a.kind == kind and (ranks is None or a.ranks == ranks)]
    return hits[0] if hits else None


# -- pipeline stages: structural imbalance ---------------------------------------------------------------------------
def test_stage_slower_from_step_0_is_one_structural_imbalance_and_a_later_slow_rank_is_found_as_fast() -> None:
    change = replace(PIPELINE, slow_rank=3, slow_rank_factor=1.25, slow_rank_from_step=400)
    found, _ = run(generate_telemetry(change), 8)
    [si] = of_kind(found, "structural_imbalance")
    assert si.ranks == (6, 7)
    assert si.magnitude == pytest.approx(0.15, abs=0.02)
    assert si.detail["stage"] == {6: "compute", 7: "compute"}
    assert si.detail["cost_s_per_step"] == pytest.approx(0.15 * 0.4, rel=0.2)  # 15 % of the 0.4 s compute stage
    assert not [a for a in of_kind(found, "rank_outlier") if set(a.ranks) & {6, 7}], "never pages again"
    delay = _first(found, "rank_outlier", (3,))
    plain, _ = run(generate_telemetry(replace(change, rank_compute_factors=None)), 8)
    usual = _first(plain, "rank_outlier", (3,))
    assert delay is not None and usual is not None
    assert delay - 400 <= usual - 400 + 2, "the structural ranks do not slow down the others' test"


def test_structural_rank_that_grows_pages_again_against_its_own_baseline() -> None:
    grows = replace(PIPELINE, slow_rank=6, slow_rank_factor=1.25, slow_rank_from_step=400)
    found, _ = run(generate_telemetry(grows), 8)
    assert len(of_kind(found, "structural_imbalance")) == 1
    [out] = [a for a in of_kind(found, "rank_outlier") if 6 in a.ranks]
    assert out.step >= 400 and out.detail["baseline_ratio"][6] == pytest.approx(1.15, abs=0.02)
    assert out.magnitude == pytest.approx(0.25, abs=0.05)


def test_rank_slow_from_the_middle_of_the_learning_window_is_not_structural() -> None:
    sc = replace(PIPELINE, rank_compute_factors=None, slow_rank=2, slow_rank_factor=1.4, slow_rank_from_step=30)
    found, _ = run(generate_telemetry(sc), 8)
    assert of_kind(found, "structural_imbalance") == []
    assert [a.ranks for a in of_kind(found, "rank_outlier")] == [(2,)]


def test_role_groups_compare_ranks_within_their_role() -> None:
    # two roles of 4 ranks: the embedding stage ranks 0-3 are 30 % faster than the others by construction
    sc = replace(PIPELINE, world_size=8, rank_compute_factors=(0.7, 0.7, 0.7, 0.7, 1, 1, 1, 1),
                 roles=("first",) * 4 + ("last",) * 4, slow_rank=1, slow_rank_factor=1.3, slow_rank_from_step=300)
    found, det = run(generate_telemetry(sc), 8)
    assert of_kind(found, "structural_imbalance") == []  # each rank is like its role's peers
    outliers = of_kind(found, "rank_outlier")
    assert [a.ranks for a in outliers] == [(1,)]
    assert det.units[0].outliers is not None and det.units[0].outliers.learning is False


# -- serving ---------------------------------------------------------------------------------------------------------
def test_healthy_serving_tp_with_idle_gaps_gives_no_regression() -> None:
    sc = ServingScenario(replicas=1, tp=4, duration_s=1500, seed=3)
    found, det = run(iter_serving_telemetry(sc), 4)
    assert det.mode == "serving"
    assert det.counters["idle_steps"] > 10
    assert Counter(a.kind for a in found) == Counter(), found[:5]


def test_healthy_dp_replicas_are_independent_units_never_late_or_stalled() -> None:
    sc = ServingScenario(replicas=4, tp=1, duration_s=1200, seed=4)
    found, det = run(iter_serving_telemetry(sc), 4)
    assert sorted(u.ranks for u in det.units) == [[0], [1], [2], [3]]
    assert of_kind(found, "stalled_rank") == []
    assert of_kind(found, "step_regression") == []
    assert det.counters["late"] < 0.05 * det.counters["reports"]  # only before the replicas were told apart
    steps = det.unit_steps()  # each replica's own counter: what its episodes' quiet steps are counted on
    assert steps is not None and steps == {r: u.aggregator.furthest_step for u in det.units for r in u.ranks}


def test_slow_tp_rank_and_slow_replica_are_found_in_serving() -> None:
    tp = ServingScenario(replicas=1, tp=4, duration_s=1200, slow_rank=2, slow_from_s=800, seed=5)
    found, _ = run(iter_serving_telemetry(tp), 4)
    assert [a.ranks for a in of_kind(found, "rank_outlier")] == [(2,)]
    dp = ServingScenario(replicas=4, tp=1, duration_s=1200, slow_replica=1, slow_from_s=800, seed=6)
    found, _ = run(iter_serving_telemetry(dp), 4)
    regs = of_kind(found, "step_regression")
    assert regs and {a.ranks for a in regs} == {(1,)}
    assert regs[0].detail["unit"] == [1] and regs[0].magnitude >= 0.15


@pytest.mark.parametrize("with_work", [True, False])
def test_slow_rank_of_a_two_rank_tp_group_is_named_and_unsplit_replicas_are_never_compared_as_ranks(
        with_work: bool) -> None:
    """A TP group of 2 ranks (lock-step) is compared rank against rank: a +30 % rank from 300 s (inside the unit's
    load-band learning, where the unit's step time lost it) is a ``rank_outlier`` of that rank; before, groups under
    ``outlier_min_ranks`` (4) were never compared. Two independent replicas (not in lock-step) are not."""
    tp = ServingScenario(replicas=1, tp=2, duration_s=900, slow_rank=1, slow_factor=1.3, slow_from_s=300,
                         with_work=with_work, seed=11)
    found, det = run(iter_serving_telemetry(tp), 2)
    outliers = of_kind(found, "rank_outlier")
    assert outliers and {a.ranks for a in outliers} == {(1,)}
    assert outliers[0].magnitude == pytest.approx(0.15 / 1.15, abs=0.03)  # (1.3 - m) / m, m the pair's mean 1.15
    healthy, _ = run(iter_serving_telemetry(replace(tp, slow_rank=None)), 2)
    assert of_kind(healthy, "rank_outlier") == [] and of_kind(healthy, "slow_from_start") == []
    dp = ServingScenario(replicas=2, tp=1, duration_s=900, with_work=with_work, seed=12)
    found, det = run(iter_serving_telemetry(dp), 2)
    assert of_kind(found, "rank_outlier") == [] and of_kind(found, "slow_from_start") == []
    assert all(u.outliers is not None and u.outliers.settings.outlier_min_ranks == DetectionSettings().outlier_min_ranks
               for u in det.units)


def test_two_ranks_are_compared_on_the_noise_floor_not_their_mad() -> None:
    s = DetectionSettings(outlier_min_ranks=2)
    assert outlying_ranks([1.0, 1.3], s) == [(1, pytest.approx(0.15 / 1.15))]  # MAD 0.15: robust z 0.67 before
    assert outlying_ranks([1.0, 1.1], s) == []  # (1.1 - 1.05) / 1.05 < outlier_min_effect
    assert outlying_ranks([1.0, 1.3], DetectionSettings()) == []  # two values: under outlier_min_ranks (3)


def test_idle_gaps_switch_a_job_without_mode_to_serving() -> None:
    sc = ServingScenario(replicas=1, tp=2, duration_s=600, with_mode=False, seed=7)
    found, det = run(iter_serving_telemetry(sc), 2)
    assert det.mode == "serving" and det.counters["mode_switches"] == 1
    never = JobDetector("serve", 2, DetectionSettings(serving_detect_gaps=0))
    run(iter_serving_telemetry(sc), 2, det=never)
    assert never.mode == "training"


def test_idle_gap_rule_and_load_normaliser() -> None:
    s = DetectionSettings()
    assert is_idle_gap(30.0, 0.05, s) and not is_idle_gap(0.9, 0.04, s) and not is_idle_gap(3.0, 0.5, s)
    norm = LoadNormaliser(s)
    out = []
    for k in range(200):
        work = 8.0 if k % 2 else 2048.0  # two loads, 0.05 s and 0.5 s
        fs = FinalizedStep(k, 0.05 if k % 2 else 0.5, 0, 1, None, None, work)
        norm.note_step(fs)
        out.append(norm.normalise(fs))
    judged = [f.time_s for f in out if f.excluded is None]
    assert judged and all(t == pytest.approx(1.0) for t in judged)  # each compared within its own band
    assert out[0].excluded == "load_band"
    norm.rescale(1.2)
    assert norm.normalise(FinalizedStep(999, 0.06, 0, 1, None, None, 8.0)).time_s == pytest.approx(1.0)


def test_unit_splitter_needs_the_same_cut_twice() -> None:
    sp = UnitSplitter(4, DetectionSettings(serving_unit_split_steps=50))
    assert not sp.check([100, 100, 400, 401])
    assert sp.check([110, 111, 500, 502])
    assert sp.units == [[0, 1], [2, 3]]
    assert not sp.check([120, 121, 130, 131])  # never merged again


def test_unit_splitter_gap_is_seconds_of_the_units_usual_step_at_most_the_setting() -> None:
    sp = UnitSplitter(4, DetectionSettings())  # serving_unit_split_steps 200
    assert sp.gap_steps(None) == 200 and sp.gap_steps(0.1) == 50  # 5 s of 0.1 s steps
    assert sp.gap_steps(0.001) == 200 and sp.gap_steps(2.0) == 16 and sp.gap_steps(float("nan")) == 200
    assert not sp.check([100, 100, 160, 160], [0.1])  # 60 steps apart (6 s of steps): seen once
    assert sp.check([110, 110, 175, 175], [0.1])
    assert sp.units == [[0, 1], [2, 3]]
    assert not sp.check([120, 121, 130, 131], [0.1, 0.1])  # never merged again
    tp = UnitSplitter(2, DetectionSettings())
    assert not tp.check([100, 140], [0.1]) and not tp.check([150, 190], [0.1])  # 40 < 50 steps: one replica
    assert not tp.check([100, 160])  # without a usual step the setting's 200 steps


def _replica_reports(job: str, world: int, steps: list[int], t: float) -> list[StepReport]:
    return [StepReport(job_id=job, rank=r, step=s, step_time_s=0.1, ts_unix_s=t, mode="serving")
            for r, s in enumerate(steps)]


def test_serving_replicas_split_within_seconds_of_steps_and_an_uncut_replica_keeps_what_it_learned() -> None:
    """Three replicas of 0.1 s steps whose counters drift apart by 10 steps a second: cut at 50 steps apart (5 s of
    steps), not 200 (20 s here; 12-30 minutes of bursty traffic in bench_corpus serving_dp); a replica a later cut
    does not touch keeps its pipeline (its bands and baseline), only the unit that was cut starts afresh."""
    det = JobDetector("serve", 3, mode="serving")
    rates = [10, 20, 10]  # replica 1 steps twice as often (its peers idle half of each second)
    splits: list[tuple[float, list[list[int]]]] = []
    for sec in range(1, 40):
        t = 1000.0 + sec
        for k in range(20):
            steps = [1 + (sec * 20 + k) * r // 20 for r in rates]
            for rep in _replica_reports("serve", 3, steps, t - 1 + k / 20):
                det.observe(rep, t - 1 + k / 20)
        before = [list(u.ranks) for u in det.units]
        det.tick(t)
        if [list(u.ranks) for u in det.units] != before:
            splits.append((t - 1000.0, [list(u.ranks) for u in det.units]))
    assert splits and splits[0][1] == [[0, 2], [1]] and splits[0][0] <= 8  # 50 steps apart after 5 s
    unit_1 = det.units[1]
    assert unit_1.aggregator.counters["finalized"] > 100
    # rank 2 now runs ahead of rank 0 by 10 steps a second: the unit [0, 2] is cut, [1] stays as it was
    for sec in range(40, 60):
        t = 1000.0 + sec
        for k in range(20):
            steps = [1 + 800 + (sec - 40) * 20 + k, 1 + 1600 + (sec - 40) * 40 + 2 * k, 1 + 800 + (sec - 40) * 40 + 2 * k]
            for rep in _replica_reports("serve", 3, steps, t - 1 + k / 20):
                det.observe(rep, t - 1 + k / 20)
        det.tick(t)
    assert [list(u.ranks) for u in det.units] == [[0], [1], [2]]
    assert det.units[1] is unit_1 and unit_1.aggregator.counters["finalized"] > 500
    assert det.counters["unit_splits"] == 2


# -- drift -----------------------------------------------------------------------------------------------------------
def test_drift_is_one_report_per_threshold_and_a_sudden_change_during_it_is_found() -> None:
    sc = TelemetryScenario(world_size=4, steps=1400, cv=0.03, drift_per_step=0.0005, slowdown=0.11,
                           slowdown_from_step=1000, seed=3)
    found, _ = run(generate_telemetry(sc), 4)
    drifts = of_kind(found, "drift")
    before = [a for a in drifts if a.step < 1000]
    assert [round(a.detail["threshold"], 2) for a in before] == [0.1, 0.2, 0.3, 0.4][: len(before)]
    assert len(before) >= 3  # +0.05 %/step: about 0.45 by step 1000, reported at 10, 20, 30, (40) %
    assert all(a.detail["slope_per_step"] == pytest.approx(0.0005, rel=0.3) for a in before)
    regs = of_kind(found, "step_regression")
    assert [a.step for a in regs if a.step < 1000] == []
    assert regs and 1000 <= regs[0].step <= 1015 and regs[0].magnitude == pytest.approx(0.11, abs=0.04)
    thresholds = [round(a.detail["threshold"], 2) for a in drifts]
    assert len(thresholds) == len(set(thresholds)), "at most one report per threshold"


def test_drift_tracker_counts_each_threshold_once() -> None:
    t = DriftTracker(0.1)
    t.learned(1.0, 10)
    assert t.observe(1.05, 0.001, 1.0) is None
    first = t.observe(1.10, 0.001, 1.0, 110)
    assert first is not None and first["threshold"] == pytest.approx(0.1)
    assert t.observe(1.11, 0.001, 1.0) is None and t.observe(1.09, 0.001, 1.0) is None
    assert t.observe(1.10, 0.001, 1.0) is None  # back at the same threshold: not again
    jump = t.observe(1.35, 0.001, 1.0)
    assert jump is not None and jump["threshold"] == pytest.approx(0.3)
    t.suspend(1.35)
    t.learned(1.35 * 1.2, 500)  # a 20 % change re-learned: not drift
    assert t.observe(1.35 * 1.2, 0.0, 1.0) is None



def test_a_fall_takes_back_the_drift_it_undoes() -> None:
    # a healthy job whose level wanders: each small rise followed by the baseline, each fall re-learned. The drift
    # was carried across the falls as across rises: the reference sank cycle by cycle below any level the job ran
    # at (0.36 s -> 0.29 s in a replay) and drift +10 %, +20 %, +30 % was reported at a slope of 0
    t = DriftTracker(0.1)
    t.learned(0.36, 50)
    for k in range(6):
        assert t.observe(0.39, 0.0, 0.39) is None  # +8 % over the reference: below the first threshold
        t.suspend(0.39)
        t.learned(0.355, 400 * (k + 1))  # a speed-up, re-learned lower
        assert t.reference_s == pytest.approx(0.355)  # a level the job ran at, never below
    assert t.observe(0.39, 0.0, 0.39) is None
    # a real drift survives a later speed-up only as far as the level still stands above the reference
    d = DriftTracker(0.1)
    d.learned(1.0, 10)
    assert d.observe(1.15, 0.001, 1.0, 200) is not None  # +15 %: reported at 10 %
    d.suspend(1.15)
    d.learned(1.05, 300)  # a sudden speed-up: 5 % above the first level remain
    assert d.reference_s == pytest.approx(1.0)
    assert d.observe(1.05, 0.0, 1.0) is None
    assert d.observe(1.21, 0.001, 1.0) is not None  # drifting on to +21 %: the 20 % report
    # a sudden rise is still not drift: the drift so far is carried across it
    u = DriftTracker(0.1)
    u.learned(1.0, 10)
    assert u.observe(1.15, 0.001, 1.0, 200) is not None
    u.suspend(1.15)
    u.learned(1.15 * 1.3, 300)
    assert u.reference_s == pytest.approx(1.3)
    assert u.observe(1.15 * 1.3, 0.0, 1.0) is None

# -- 5 ms steps: blocks ----------------------------------------------------------------------------------------------
def test_five_ms_steps_with_jitter_stay_quiet_and_a_slowdown_is_still_found() -> None:
    sc = TelemetryScenario(world_size=4, steps=12000, step_time_s=0.005, cv=0.05, gc_prob=0.02,
                           loader_stall_prob=0.01, seed=5)
    found, det = run(generate_telemetry(sc), 4)
    assert det.units[0].blocks.size == 10  # 0.05 s / 5 ms
    assert len(found) <= 1, Counter(a.kind for a in found)  # 60 s of jitter: at most one event
    slow, _ = run(generate_telemetry(replace(sc, slowdown=0.15, slowdown_from_step=9000)), 4)
    regs = of_kind(slow, "step_regression")
    assert regs and 9000 <= regs[0].step <= 9000 + 10 * 10


def test_merge_block_medians_and_exclusion() -> None:
    steps = [FinalizedStep(k, t, k % 2, 2, {"compute": [t, 2 * t]}, None) for k, t in enumerate([1.0, 9.0, 1.2])]
    b = merge_block(steps)
    assert (b.step, b.time_s, b.steps, b.excluded) == (2, 1.2, 3, None)
    assert b.stages == {"compute": [1.2, 2.4]}
    assert merge_block([*steps, FinalizedStep(3, 1.0, 0, 2, None, "capture")]).excluded == "capture"
    blocks = StepBlocks(DetectionSettings(block_target_s=0))
    assert blocks.size == 1 and blocks.push(steps[0]) == [steps[0]]


# -- a rank slower from the start in a job without roles -------------------------------------------------------------
DP = TelemetryScenario(world_size=4, steps=200, cv=0.02, rank_compute_factors=(1, 1, 1.3, 1))


def test_a_rank_slower_from_the_start_without_roles_is_one_slow_from_start_saying_why() -> None:
    found, _ = run(generate_telemetry(DP), 4)
    [slow] = of_kind(found, "slow_from_start")
    [si] = of_kind(found, "structural_imbalance")  # the learned baseline, as before
    assert slow.ranks == si.ranks == (2,) and slow.step == si.step
    assert slow.magnitude == pytest.approx(0.3, abs=0.03) and slow.detail["min_effect"] == 0.1
    assert slow.detail["text"] == ("rank 2 has been 30 % slower than its peers since the job started: a bad node, "
                                   "or a role difference: declare roles to silence")
    assert not [a for a in of_kind(found, "rank_outlier") if 2 in a.ranks]  # one report per generation


def test_declared_different_roles_or_visible_pipeline_stages_keep_a_rank_slow_from_the_start_quiet() -> None:
    roles = replace(DP, roles=("a", "a", "b", "b"))
    found, _ = run(generate_telemetry(roles), 4)
    assert of_kind(found, "slow_from_start") == [] and len(of_kind(found, "structural_imbalance")) == 1
    same = replace(DP, roles=("dp",) * 4)  # one role for all: as without roles
    assert len(of_kind(run(generate_telemetry(same), 4)[0], "slow_from_start")) == 1

    def last_stage_times_its_loss(rec: dict) -> dict:  # rank 2 is the pipeline's last stage: it times one more stage
        if rec["rank"] == 2 and rec.get("stages"):
            rec = {**rec, "stages": {**rec["stages"], "loss": 0.01}}
        return rec

    found, _ = run((last_stage_times_its_loss(r) for r in generate_telemetry(DP)), 4)
    assert of_kind(found, "slow_from_start") == [] and len(of_kind(found, "structural_imbalance")) == 1
    below = replace(DP, rank_compute_factors=(1, 1, 1.07, 1))  # under outlier_min_effect: nothing to say
    assert of_kind(run(generate_telemetry(below), 4)[0], "slow_from_start") == []


def _checkpointing_job(gap_steps: list[int], steps: int = 1200, step_s: float = 0.25) -> list[dict[str, object]]:
    """A 2-rank training job (no ``mode``) at ``step_s`` with 2 % jitter whose steps in ``gap_steps`` take 60 s
    longer (a checkpoint both ranks wait for)."""
    rng = np.random.default_rng(3)
    recs: list[dict[str, object]] = []
    ts = 1_764_500_000.0
    for step in range(1, steps + 1):
        t = step_s * float(1.0 + 0.02 * rng.standard_normal()) + (60.0 if step in gap_steps else 0.0)
        ts += t
        recs += [{"job_id": "ckpt", "rank": r, "world_size": 2, "step": step, "step_time_s": round(t, 6),
                  "ts_unix_s": ts} for r in range(2)]
    return recs


def test_a_checkpoint_every_n_steps_never_switches_a_training_job_to_serving() -> None:
    """A 60 s checkpoint every 200 steps of a 0.25 s job (3 within ``DETECT_WINDOW_S``) is the job's own periodic
    pause, on a step lattice: the job stays in training mode and nothing is reported (base: switched to serving
    mode; ``bench_new_shapes`` eval_ckpt seed 31, 6 of 12 jobs, one evaluation then armed as a serving unit's level
    change). The same gaps off a lattice still switch it."""
    found, det = run(_checkpointing_job(list(range(200, 1200, 200))), 2)
    assert det.mode == "training" and det.counters["mode_switches"] == 0
    assert of_kind(found, "step_regression") == []
    _, det = run(_checkpointing_job([200, 330, 520, 610]), 2)
    assert det.mode == "serving" and det.counters["mode_switches"] == 1


def _two_ranks_in_step(work_of_rank_1: int, n: int = 600) -> list[dict]:
    """A serving job of two ranks whose counters stay exactly together (same step, same arrival), rank 0 running
    batches of 4 and rank 1 ``work_of_rank_1``, rank 1's compute 1.3x rank 0's from step 300 (0.2 s steps,
    0.6 % noise, seeded)."""
    rng = np.random.default_rng(5)
    recs, t = [], 1.0e9
    for step in range(1, n + 1):
        base = 0.2 * (1.0 + 0.006 * float(rng.standard_normal()))
        t += base * 1.3 + 0.02
        for rank, (work, f) in enumerate(((4, 1.0), (work_of_rank_1, 1.3 if step >= 300 else 1.0))):
            compute = base * f
            recs.append({"job_id": "sim", "rank": rank, "step": step, "step_time_s": compute + 0.02,
                         "ts_unix_s": t, "stages": {"compute": compute, "comm": 0.02}, "work": work,
                         "mode": "serving"})
    return recs


def test_ranks_of_one_step_number_with_different_work_are_replicas_never_compared_as_ranks() -> None:
    """Two independent replicas whose counters happen to stay together pass the lock-step check, but their steps
    of one number ran different batches (work 4 and 16): the slower batch is no slow rank (bench_corpus
    --healthy-hours serving_dp seed 103 run 11: replicas at step 125 with batches 2 and 16 were compared and one named
    +14 %). The same 1.3x rank with the same work is a tensor-parallel rank and is still named."""
    found, det = run(_two_ranks_in_step(16), 2)
    assert of_kind(found, "rank_outlier") == []
    assert all(u.outliers is not None and u.outliers.settings.outlier_min_ranks == DetectionSettings().outlier_min_ranks
               for u in det.units)
    tp, _ = run(_two_ranks_in_step(4), 2)
    assert {a.ranks for a in of_kind(tp, "rank_outlier")} == {(1,)}


def test_two_detect_gaps_never_read_as_a_lattice_by_a_single_interval() -> None:
    """With ``serving_detect_gaps = 2`` the gaps in view give one interval, trivially "all equal": base of this
    check (57f44b3) read any two idle gaps 10+ steps apart as a checkpoint lattice, so a server with gaps at steps
    200, 330, 520, 610 never switched to serving mode. A lattice needs two equal intervals to be claimed; a
    checkpoint every 200 steps still stays in training mode."""
    settings = DetectionSettings(serving_detect_gaps=2)
    _, det = run(_checkpointing_job([200, 330, 520, 610]), 2, settings)
    assert det.mode == "serving" and det.counters["mode_switches"] == 1
    _, det = run(_checkpointing_job(list(range(200, 1200, 200))), 2, settings)
    assert det.mode == "training" and det.counters["mode_switches"] == 0


@pytest.mark.xfail(strict=True, reason="found in review, not fixed: a step lattice alone cannot tell a server fed "
                                       "fixed-size bursts from a checkpointing training job")
def test_a_server_fed_fixed_size_bursts_switches_to_serving() -> None:
    """A client that sends exactly 16 requests per burst, 60 s idle between bursts (4 s of work in every 64 s: 94 %
    idle): its idle gaps lie on a 16-step lattice, so at 57f44b3 the job never switches to serving mode (a
    checkpoint every 16 steps that takes 15x the work between is not a training job's own pause)."""
    _, det = run(_checkpointing_job(list(range(200, 1200, 16))), 2)
    assert det.mode == "serving" and det.counters["mode_switches"] == 1
