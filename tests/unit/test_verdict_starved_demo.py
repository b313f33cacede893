"""A real capture of the demo's torch scenario on a CPU-starved box (tests/data/demo_cpu_starved/README.md): rank 1
ran 3x compute, yet its pooled excess sat below the between-rank test's 4 sigmas because the step-to-step noise of
every rank was a quarter of the step (and a healthy rank sat as far below its peers). Step by step it is plain: its
peers waited for it in 9 of 10 steps, which the small group's within-step permutation test names (p 0.00025 where
0.0025 is needed; ``daemon/profwatch/core/verdict/paired.py``). Before, the verdict named nobody; the near-miss
evidence its ``no_suspect`` detail gave is still what a capture that cannot confirm a named rank says."""

from __future__ import annotations

from pathlib import Path

import pytest

from profwatch.adapters.tools.kineto_reader import analyze_torch_batch
from profwatch.analysis.result import armed_for_note
from profwatch.core.verdict.ranking import Verdict, find_near_misses, judge_batch

DATA = Path(__file__).resolve().parents[1] / "data" / "demo_cpu_starved"
ARMED = list(range(71, 81))


@pytest.fixture(scope="module")
def verdict() -> Verdict:
    ev = analyze_torch_batch({r: DATA / f"rank{r}" for r in range(4)}, armed_steps=ARMED)
    assert ev.recipes["kineto_breakdown"].status == "ok"
    return judge_batch(ev, armed_steps=ARMED, world_size=4)


def test_a_starved_capture_names_its_3x_rank_step_by_step(verdict: Verdict) -> None:
    assert verdict.captured_steps == ARMED and [s.rank for s in verdict.suspects] == [1]
    top = verdict.suspects[0].evidence
    assert top["test"] == "paired" and top["paired"]["late"]["p"] < top["paired"]["late"]["alpha"] == 0.0025
    # the between-rank test alone did not reach its threshold: that evidence stays in the verdict
    assert top["z"]["late"] == pytest.approx(3.81, abs=0.01) and top["threshold_z"] == 4.0


def test_the_between_rank_evidence_of_the_starved_capture() -> None:
    """What the between-rank test saw (the near misses a capture gives when nobody passes)."""
    from profwatch.core.verdict.ranking import RankingSettings, _noise_tests
    from profwatch.core.verdict.signals import measure_signals

    ev = analyze_torch_batch({r: DATA / f"rank{r}" for r in range(4)}, armed_steps=ARMED)
    table = measure_signals(ev.summaries)
    tests = _noise_tests(table, RankingSettings())
    near = {n["rank"]: n for n in find_near_misses(table, tests, set(), 4.0, 8)}
    one = near[1]
    # own work +26.6 % of the step pooled over 10 steps, peers' wait for it +28.6 %: against a step-to-step noise
    # of ~26 % of a step (8.1-8.3 % on a 10-step mean) that is z 3.46 (own) / 3.81 (late), below 4.00
    assert one["signal"] == "late" and one["steps"] == 10
    assert one["effect_frac"] == pytest.approx(0.2857, abs=1e-3)
    assert one["z"] == pytest.approx(3.81, abs=0.01) and one["z_needed"] == 4.0
    assert one["within_sigma_frac"] == pytest.approx(0.2566, abs=1e-3)
    assert min(near, key=lambda r: -near[r]["z"]) == 1  # the closest: the statistic saw it
    # healthy rank 0 sat as far below its peers (own work -22 % of the step) as rank 1 sat above them: the
    # between-rank noise of pooled values is what the load did to every rank
    assert 0 not in near and tests["own"].sigma == pytest.approx(0.083, abs=1e-3)


def test_the_no_suspect_detail_gives_the_named_ranks_evidence() -> None:
    """A ``no_suspect`` detail built from these near misses (as if the paired test had not named rank 1)."""
    from profwatch.core.verdict.ranking import RankingSettings, _noise_tests
    from profwatch.core.verdict.signals import measure_signals

    ev = analyze_torch_batch({r: DATA / f"rank{r}" for r in range(4)}, armed_steps=ARMED)
    table = measure_signals(ev.summaries)
    misses = find_near_misses(table, _noise_tests(table, RankingSettings()), set(), 4.0, 8)
    note = armed_for_note("rank_outlier +367% at step 50 ranks [1]", misses)
    assert note.startswith("; armed for rank_outlier +367% at step 50 ranks [1], which this capture does not "
                           "confirm at its noise: rank 1: peers' wait for it +28.6% of the step over 10 steps, "
                           "z 3.81 where 4.00 is needed (step-to-step noise 25.7% of a step")
    assert "may have passed" not in note
    # a named rank that is not among the near misses keeps the old wording; another rank's evidence is not borrowed
    assert "may have passed" in armed_for_note("rank_outlier +367% at step 50 ranks [2]", misses[:1])


def test_near_misses_leave_out_named_ranks_and_negative_excess(verdict: Verdict) -> None:
    ev = analyze_torch_batch({r: DATA / f"rank{r}" for r in range(4)}, armed_steps=ARMED)
    from profwatch.core.verdict.ranking import RankingSettings, _noise_tests
    from profwatch.core.verdict.signals import measure_signals
    table = measure_signals(ev.summaries)
    tests = _noise_tests(table, RankingSettings())
    got = find_near_misses(table, tests, {1}, 4.0, 8)
    assert 1 not in {n["rank"] for n in got}
    assert all(n["effect_frac"] > 0 for n in got)
    assert find_near_misses(table, tests, set(), 4.0, 1)[0]["rank"] == 1


def test_the_analysis_detail_of_the_starved_capture(tmp_path: Path) -> None:
    """Through the analysis (scan, stage, Kineto breakdown, verdict, status): the real capture names rank 1, with
    its step-by-step evidence. Before: ``no_suspect`` "... which this capture does not confirm at its noise: rank 1:
    peers' wait for it +28.6% of the step over 10 steps, z 3.81 where 4.00 is needed"."""
    import shutil

    from profwatch.adapters.fs.rank_dir_fs import scan_tree
    from profwatch.analysis.facade import analyze_batch

    for r in range(4):
        shutil.copytree(DATA / f"rank{r}", tmp_path / "prof" / f"vm_{17077 + r}_20261207053424878_torch_pt")
    (batch,) = scan_tree(tmp_path / "prof", world_size=4)
    res = analyze_batch(batch, work_dir=tmp_path / "w", capture_reason="rank_outlier +367% at step 50 ranks [1]",
                        armed_steps=ARMED, enrich=False)
    assert res.status == "ok", res.detail
    assert "top: rank 1 (compute)" in res.detail, res.detail


def test_a_cpu_jobs_impact_is_in_cpu_rank_hours(verdict: Verdict) -> None:
    """The demo's gloo job has no accelerator (no device lane in its traces): its impact lines said
    "accelerator-hours per day"; now every impact of the verdict carries ``hours_unit`` "CPU rank-hours" and the
    texts (the report's, ``profwatch analyze``'s, the alerts') say so. A trace with device work keeps
    accelerator-hours."""
    from profwatch.core.alerts.alertmanager import saving_text
    from profwatch.core.verdict.evidence import hours_unit
    from profwatch.core.verdict.report_view import impact_text, parse_impact

    imp = verdict.suspects[0].impact
    assert imp is not None and verdict.impact is not None
    assert hours_unit(imp) == hours_unit(verdict.impact) == "CPU rank-hours"
    parsed = parse_impact(imp)
    assert parsed is not None and impact_text(parsed).endswith("CPU rank-hours per day")
    assert "CPU rank-hours per day" in saving_text(imp) and "accelerator" not in saving_text(imp)
    assert hours_unit({"saving_s_per_step": 0.1}) == "accelerator-hours"
