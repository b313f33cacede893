"""What-if impact (profwatch.core.verdict.impact) checked against generated pairs of batches with and without the slowdown.

The generator draws the same noise for a given seed whatever the slowdown, so the measured step-time difference
of a pair is the slowdown's true cost; the predicted saving must be within 10 % of it (issue 11, impact).
"""

from __future__ import annotations

import pytest

from profwatch.core.verdict.evidence import ClusterEvidence, RankStepSummary
from profwatch.core.verdict.impact import impact_of, single_rank_impacts, step_savings_us
from profwatch.core.verdict.kineto import RankTrace, summarize_traces
from profwatch.core.verdict.ranking import judge_batch
from profwatch.simulate.ascend_tree import build_timelines, cluster_time_summary


def _mean_step_s(timelines) -> float:
    steps = timelines[0].steps
    return sum(s.end_ns - s.start_ns for s in steps) / len(steps) / 1e9


@pytest.mark.parametrize("world,slow,noise", [
    (8, {3: 1.2}, 0.02), (8, {3: 1.5}, 0.03), (16, {1: 1.3, 9: 1.15}, 0.02), (32, {5: 1.25}, 0.02),
    (64, {7: 1.2}, 0.01), (4, {2: 1.4}, 0.02), (2, {1: 1.3}, 0.02), (32, {5: 1.1}, 0.02), (16, {4: 1.1}, 0.03),
    (8, {6: 1.08}, 0.01),
])
@pytest.mark.parametrize("seed", [0, 1])
def test_predicted_saving_matches_the_measured_difference(world: int, slow: dict[int, float], noise: float,
                                                          seed: int):
    base = build_timelines(world_size=world, steps=5, seed=seed, noise=noise)
    slowed = build_timelines(world_size=world, steps=5, seed=seed, noise=noise, slow_ranks=slow)
    # 4 collectives per step, as msprof_runner reads it from COMMUNICATION_OP / STEP_TIME
    ev = ClusterEvidence(kind="ascend_pt", summaries=cluster_time_summary(slowed), collectives_per_step=4)
    v = judge_batch(ev, world_size=world)
    measured = _mean_step_s(slowed) - _mean_step_s(base)
    assert sorted(s.rank for s in v.suspects) == sorted(slow)
    assert v.impact is not None
    assert v.impact["saving_s_per_step"] == pytest.approx(measured, rel=0.10)
    assert v.impact["saving_pct_of_step"] == pytest.approx(100 * measured / _mean_step_s(slowed), rel=0.12)
    assert v.impact["accelerator_hours_per_day"] == pytest.approx(v.impact["saving_pct_of_step"] / 100 * world * 24,
                                                                  rel=1e-3)
    if len(slow) == 1:  # one suspect: "this rank alone fixed" is the headline
        assert v.suspects[0].impact == v.impact


def test_without_the_collective_count_the_estimate_errs_on_the_large_side():
    base = build_timelines(world_size=32, steps=5, seed=4, noise=0.03)
    slowed = build_timelines(world_size=32, steps=5, seed=4, noise=0.03, slow_ranks={5: 1.1})
    measured = _mean_step_s(slowed) - _mean_step_s(base)
    rows = cluster_time_summary(slowed)
    unknown = judge_batch(ClusterEvidence(kind="ascend_pt", summaries=rows)).impact["saving_s_per_step"]
    known = judge_batch(ClusterEvidence(kind="ascend_pt", summaries=rows, collectives_per_step=4)).impact
    assert unknown > known["saving_s_per_step"] and unknown > measured
    assert known["saving_s_per_step"] == pytest.approx(measured, rel=0.10)


def test_each_suspect_alone_vs_all_fixed():
    slowed = build_timelines(world_size=16, steps=5, seed=3, noise=0.02, slow_ranks={1: 1.3, 9: 1.15})
    v = judge_batch(ClusterEvidence(kind="ascend_pt", summaries=cluster_time_summary(slowed), collectives_per_step=4))
    first, second = v.suspects
    assert first.rank == 1 and second.rank == 9
    # rank 1 alone: the step then waits for rank 9 (0.15 of the 15 ms chunks); rank 9 alone: nothing changes
    assert first.impact["saving_s_per_step"] == pytest.approx(0.15 * 60e-3, rel=0.15)
    assert second.impact["saving_s_per_step"] < 0.1 * first.impact["saving_s_per_step"]
    assert v.impact["saving_s_per_step"] == pytest.approx(0.30 * 60e-3, rel=0.12)


def test_single_rank_shortcut_equals_the_general_what_if():
    rows = cluster_time_summary(build_timelines(world_size=8, steps=4, seed=5, noise=0.03, slow_ranks={2: 1.2, 5: 1.1}))
    by_step: dict[int, dict[int, RankStepSummary]] = {}
    for r in rows:
        by_step.setdefault(r.step, {})[r.rank] = r
    fast = single_rank_impacts(by_step, [2, 5], world_size=8, collectives_per_step=4)
    for rank in (2, 5):
        slow_way = impact_of(by_step, {rank}, world_size=8, suspects={2, 5}, collectives_per_step=4)
        assert fast[rank].saving_s_per_step == pytest.approx(slow_way.saving_s_per_step, rel=1e-6, abs=1e-9)
    assert step_savings_us(by_step[1], set()) == 0.0 and impact_of({}, {1}, world_size=8) is None


def _torch_traces(work_us: dict[int, list[float]], *, steps: int = 4, transmit_us: float = 50.0,
                  jitter: float = 0.01) -> tuple[dict[int, RankTrace], float]:
    """Host-only gloo-shaped traces of one synchronous job: per step, chunks of compute (``work_us[rank][chunk]``,
    jittered deterministically), each followed by an all_reduce that every rank leaves when the last one has
    arrived plus ``transmit_us``. Returns the traces and the mean step time (µs)."""
    traces = {r: RankTrace(r) for r in work_us}
    chunks = len(next(iter(work_us.values())))
    t = 1_000.0
    step_times = []
    for s in range(steps):
        start = t
        for c in range(chunks):
            arrive = {r: t + w[c] * (1 + jitter * ((r + s + c) % 3)) for r, w in work_us.items()}
            end = max(arrive.values()) + transmit_us
            for r, tr in traces.items():
                tr.add_event("aten::mm", "cpu_op", t, arrive[r] - t)
                tr.add_event("gloo:all_reduce", "user_annotation", arrive[r], end - arrive[r])
            t = end + 5.0
        for tr in traces.values():
            tr.add_event(f"ProfilerStep#{1 + s}", "user_annotation", start, t - start)
        step_times.append(t - start)
        t += 20.0
    return traces, sum(step_times) / len(step_times)


def test_impact_is_defined_for_torch_profiler_captures_too():
    base = {r: [400.0, 400.0, 400.0] for r in range(6)}
    slowed = {**base, 2: [520.0, 520.0, 520.0]}
    traces, t_base = _torch_traces(base)
    v = judge_batch(ClusterEvidence(kind="torch_pt", summaries=summarize_traces(traces).summaries), world_size=6)
    assert v.suspects == [] and v.impact is None
    traces, t_slow = _torch_traces(slowed)
    v = judge_batch(ClusterEvidence(kind="torch_pt", summaries=summarize_traces(traces).summaries), world_size=6)
    assert [s.rank for s in v.suspects] == [2]
    assert v.impact["saving_s_per_step"] == pytest.approx((t_slow - t_base) / 1e6, rel=0.10)
