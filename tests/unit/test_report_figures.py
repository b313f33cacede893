"""Every figure of a report keeps the invariants written in docs/report.md (issue 22 item 5): wait <= communication
<= step time per row, each per-rank difference equals the two figures shown beside it, the evidence line and the
report give the same "each peer waits" figure, savings stay within a step; on generated Ascend batches of every
shape and on torch.profiler traces whose collectives run concurrently (DDP buckets on several gloo threads)."""

from __future__ import annotations

import re

import pytest

from profwatch.core.verdict.evidence import ClusterEvidence, RankStepSummary
from profwatch.core.verdict.figures import figure_violations
from profwatch.core.verdict.kineto import summarize_traces
from profwatch.core.verdict.ranking import judge_batch
from profwatch.core.verdict.report_view import build_view, measure_ranks
from profwatch.simulate.ascend_tree import build_timelines, cluster_time_summary
from tests.unit.test_kineto_align import job_events, traces_of

SHAPES = {
    "balanced": {},
    "one slow": {"slow_ranks": {3: 1.3}},
    "two slow": {"slow_ranks": {1: 1.1, 6: 1.25}},
    "host-bound": {"host_bound_ranks": {2: 0.2}},
    "one-off": {"step_delays": {(5, 1): 2.4}},
    "slow link": {"slow_links": {(0, 1): 3.0}},
}


def _check(ev: ClusterEvidence) -> tuple[list[str], object]:
    verdict = judge_batch(ev)
    data = {"status": "ok", "suspects": [s.to_json() for s in verdict.suspects]}
    view = build_view(data, ev.summaries)
    bad = figure_violations(ev.summaries, view.ranks, data["suspects"])
    assert not [n for n in view.notes if n.startswith("figure check")]
    return bad, (verdict, view)


@pytest.mark.parametrize("steps", [3, 4, 8])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_generated_batches_keep_every_invariant(shape: str, steps: int) -> None:
    for world in (4, 8, 16):
        kw = dict(SHAPES[shape])
        if world == 4 and shape in ("two slow", "one-off"):
            kw = {k: {r: f for r, f in v.items() if (r if isinstance(r, int) else r[0]) < 4} for k, v in kw.items()}
        ev = ClusterEvidence(kind="ascend_pt", summaries=cluster_time_summary(
            build_timelines(world_size=world, steps=steps, seed=world + steps, noise=0.03, **kw)))
        bad, (verdict, view) = _check(ev)
        assert bad == [], (shape, world, bad)
        rows = {r.rank: r for r in view.ranks}
        for s in verdict.suspects:  # the evidence line's "each peer waits X ms/step" is the report's column
            m = re.search(r"each peer waits ([\d.]+) ms/step", s.evidence["summary"])
            if m:
                assert float(m.group(1)) == pytest.approx(rows[s.rank].wait_caused_ms, abs=0.051)


def test_concurrent_collectives_never_wait_longer_than_they_communicate() -> None:
    """Two gloo threads running the same all_reduce buckets at once: summed per instance, the waits of the
    ranks that arrive early double-count the overlap (the real gloo job's 1,674 ms in a 940 ms step); as the
    union of wait intervals they stay within the collectives' union."""
    events = job_events(4, steps=4, work={2: 1.8})
    for evs in events.values():
        extra = [dict(e, tid=3) for e in evs if e["name"] == "gloo:all_reduce"]
        evs.extend(extra)
    brk = summarize_traces(traces_of(events))
    assert brk.summaries and figure_violations(brk.summaries) == []
    waits = [r.wait_us for r in brk.summaries if r.rank != 2]
    assert min(waits) > 0.5 * 8_000  # they still wait ~8 ms per chunk for rank 2 (3 chunks)
    verdict = judge_batch(ClusterEvidence(kind="torch_pt", summaries=brk.summaries))
    assert [s.rank for s in verdict.suspects] == [2]


def test_broken_rows_are_named() -> None:
    rows = [RankStepSummary(0, 1, 940_000, 60_000, 874_000, 1_674_000, 0, 6_000),
            RankStepSummary(1, 1, 940_000, 60_000, 880_000, 0, 880_000, 0)]
    bad = figure_violations(rows, measure_ranks(rows)[0],
                            [{"rank": 1, "impact": {"saving_s_per_step": 2.0, "saving_pct_of_step": 212.0}}])
    assert any("rank 0 step 1: wait > communication" in b for b in bad)
    assert any(b.startswith("rank 1: saving 2000.0 ms/step") for b in bad)
    view = build_view({"status": "ok", "suspects": []}, rows)
    assert any(n.startswith("figure check: rank 0 step 1: wait > communication") for n in view.notes)
