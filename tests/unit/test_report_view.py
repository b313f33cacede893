"""Unit tests for profwatch.core.verdict.report_view (pure: data in, view out)."""

from __future__ import annotations

import random
from statistics import median
from types import SimpleNamespace

import pytest

from profwatch.core.verdict.evidence import RankStepSummary
from profwatch.core.verdict.report_view import (
    Impact,
    build_view,
    files_of,
    grade_of,
    headline_of,
    loo_medians,
    measure_ranks,
    parse_comparison,
    parse_impact,
    parse_links,
    shorten_paths,
    step_list_text,
)
from tests.unit.test_ranking import make_evidence


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8, 33])
@pytest.mark.parametrize("seed", [0, 1])
def test_loo_medians_match_the_definition(n: int, seed: int) -> None:
    rng = random.Random(seed)
    vals = [rng.choice([1.0, 2.0, 2.0, 5.0]) + rng.random() * (seed % 2) for _ in range(n)]
    want = [median(vals[:i] + vals[i + 1:]) if n > 1 else None for i in range(n)]
    assert loo_medians(vals) == pytest.approx(want) if n > 1 else loo_medians(vals) == [None]


@pytest.mark.parametrize(("world", "slow", "factor"), [(2, 1, 1.5), (3, 0, 1.3), (4, 2, 1.4), (64, 40, 1.2),
                                                      (8, 7, 0.7)])
def test_slow_rank_has_the_largest_own_work_difference_at_every_scale(world: int, slow: int, factor: float) -> None:
    ev = make_evidence(world, slow={slow: factor}, noise=0.01, steps=5)
    ranks, matrix, step_ms = measure_ranks(ev.summaries)
    by = {r.rank: r for r in ranks}
    target = by[slow]
    # compute (40 ms) x factor against peers at 40 ms: the difference is the extra compute, for 2 ranks as for 64
    assert target.own_delta_ms == pytest.approx(40.0 * (factor - 1), rel=0.1)
    others = [r for r in ranks if r.rank != slow]
    if world >= 4:
        assert all(abs(r.own_delta_ms) < 0.25 * abs(target.own_delta_ms) for r in others)
    else:  # 2-3 ranks: a peer's reference holds the slow rank, so it shows the opposite sign, never the same
        assert all(r.own_delta_ms * target.own_delta_ms < 0 for r in others)
    if factor > 1:  # peers wait for it; it causes wait, nobody else does
        assert target.wait_caused_ms == pytest.approx(40.0 * (factor - 1), rel=0.15)
        assert all(r.wait_caused_ms < 0.2 * target.wait_caused_ms for r in others)
        assert max(range(world), key=lambda j: matrix.delta_ms[0][j] or 0.0) == matrix.ranks.index(slow)
    else:  # a fast rank: the largest negative difference, and it causes no wait
        assert target.own_delta_ms < 0 and target.wait_caused_ms == 0.0
    assert matrix.steps == [1, 2, 3, 4, 5] and len(matrix.delta_ms[0]) == world
    assert step_ms > 40


def test_zero_filled_rows_and_lonely_steps_are_left_out() -> None:
    rows = [RankStepSummary(0, 1, 100, 50, 10, 0, 10, 1), RankStepSummary(1, 1, 100, 60, 10, 0, 10, 1),
            RankStepSummary(2, 1, 0, 0, 0, 0, 0, 0),  # zero-filled
            RankStepSummary(0, -1, 100, 50, 10, 0, 10, 1), RankStepSummary(0, 2, 100, 50, 10, 0, 10, 1)]
    ranks, matrix, _ = measure_ranks(rows)
    assert [r.rank for r in ranks] == [0, 1] and matrix.steps == [1]
    assert ranks[1].own_delta_ms == pytest.approx(0.01)


def test_many_steps_are_capped_in_the_matrix_but_not_in_the_medians() -> None:
    ev = make_evidence(4, slow={1: 1.5}, steps=70)
    view = build_view({"status": "ok", "suspects": []}, ev.summaries)
    assert len(view.matrix.steps) == 64 and view.matrix.steps[0] == 7 and view.matrix.dropped_steps == 6
    assert view.ranks[1].steps == 70 and any("last 64 of 70 steps" in n for n in view.notes)


def test_grades_and_headlines() -> None:
    assert grade_of(0.95, {}) == "strong" and grade_of(0.5, {}) == "weak"
    assert grade_of(0.95, {"strength": "weak"}) == "weak" and grade_of(0.3, {"strength": "strong"}) == "strong"
    assert grade_of(0.9, {"strength": "bogus"}) == "strong"
    ev = make_evidence(8, slow={5: 1.4})
    data = {"status": "ok", "suspects": [
        {"rank": 5, "score": 0.9, "kind": "compute", "hostname": "n0", "evidence": {"summary": "why"},
         "impact": {"saving_s_per_step": 0.02, "saving_pct_of_step": 25.0, "accelerator_hours_per_day": 48.0}},
        {"rank": 2, "score": 0.3, "kind": "host", "evidence": {}}]}
    view = build_view(data, ev.summaries)
    h = view.headline
    assert (h.state, h.badge, h.rank, h.subject) == ("found", "slow rank found", 5, "rank 5 on n0 (compute)")
    # the verdict's figure, under its one name: 25 % of the mean step (not re-based on the median step)
    assert h.sentence == "why. Fixing this rank alone saves 20.0 ms/step (25% of the mean step), about 48 " \
                         "accelerator-hours per day"
    assert ("mean step time (the savings' base)", "80.0 ms") in view.meta  # 20 ms is 25 % of it
    assert [s.grade for s in view.suspects] == ["strong", "weak"] and view.suspects[1].hostname is None
    assert view.suspects[0].row is not None and view.suspects[0].row.own_delta_ms > 10
    weak_only = headline_of("ok", "", view.suspects[1:])
    assert weak_only.state == "possible" and weak_only.rank == 2
    assert headline_of("no_suspect", "8 ranks analysed", []).badge == "no slow rank"
    assert headline_of("incomplete", "missing ranks [3]", []).badge == "could not judge: missing ranks [3]"
    assert headline_of("failed", "", []).badge == "could not judge: analysis status failed"
    # suspects on a status that is not ok (should not happen): the status wins, never "found"
    assert headline_of("partial", "3 of 4 ranks", view.suspects).state == "unknown"


def test_colour_scale_keeps_a_balanced_cluster_pale() -> None:
    ev = make_evidence(8, noise=0.01)
    view = build_view({"status": "no_suspect"}, ev.summaries)
    biggest = max(abs(v) for line in view.matrix.delta_ms for v in line if v is not None)
    assert view.colour_limit_ms >= 0.1 * view.median_step_ms > 2 * biggest
    slow = build_view({"status": "ok"}, make_evidence(8, slow={1: 2.0}).summaries)
    assert slow.colour_limit_ms == pytest.approx(max(v for line in slow.matrix.delta_ms for v in line if v))


def test_optional_contract_keys_parse_or_are_ignored() -> None:
    assert parse_impact({"saving_s_per_step": 1, "saving_pct_of_step": 2.5, "accelerator_hours_per_day": 3}) == \
        Impact(1.0, 2.5, 3.0)
    bads: list[object] = [None, [], {"saving_s_per_step": 1}, {"saving_s_per_step": float("nan"), "saving_pct_of_step": 1,
                                                    "accelerator_hours_per_day": 1},
            {"saving_s_per_step": True, "saving_pct_of_step": 1, "accelerator_hours_per_day": 1}]
    for bad in bads:
        assert parse_impact(bad) is None
    links = parse_links([{"ranks": [1, 2], "group": "dp", "bandwidth_gbps": 10, "peer_median_gbps": 40.0},
                         {"ranks": [1], "bandwidth_gbps": 1, "peer_median_gbps": 1}, "x",
                         {"ranks": [1, 2], "bandwidth_gbps": "fast", "peer_median_gbps": 1}])
    assert [(lk.ranks, lk.group, lk.bandwidth_gbps) for lk in links] == [((1, 2), "dp", 10.0)]
    assert parse_links(None) == []
    view = build_view({"status": "ok", "suspects": [{"rank": "x"}, "junk", {"rank": 3, "score": "high"},
                                                    {"rank": 4, "score": 0.8}]}, [])
    assert [(s.position, s.rank) for s in view.suspects] == [(1, 4)]
    for bad in (None, [], "x", 3):
        assert parse_comparison(bad) is None
    cmp = parse_comparison({"headline": "+8.0 ms/step", "step_time_baseline_s": 0.1, "step_time_now_s": 0.108,
                            "step_delta_s": 0.008, "step_time_changed": True, "ranks_compared": [0, 1, 2],
                            "ranks_only_now": [3], "reference": {"batch_id": "c-1", "steps": [5, 6, 7]},
                            "components": [{"component": "communication", "baseline_s_per_step": 0.01,
                                            "now_s_per_step": 0.018, "delta_s_per_step": 0.008, "share": 1.0,
                                            "noise_s_per_step": 0.0002}, "junk",
                                           {"component": "compute", "baseline_s_per_step": "x"}],
                            "changes": [{"component": "communication", "delta_s_per_step": 0.008},
                                        {"component": "software", "delta_s_per_step": None,
                                         "detail": [{"key": "cann", "baseline": "8.0", "now": "8.1"}]}]})
    assert cmp is not None and cmp.step.delta_ms == pytest.approx(8.0) and cmp.step.changed
    assert [(r.component, r.changed) for r in cmp.rows] == [("communication", True)]  # junk and unmeasured left out
    assert cmp.other == [("software", "key cann, baseline 8.0, now 8.1")]
    assert cmp.reference == "c-1 steps 5-7" and cmp.ranks_text == "3 ranks in both captures; 1 only in this capture: 3"
    assert build_view({"status": "no_suspect", "comparison": {"headline": "h"}}, []).changes is not None


def test_steps_meta_and_mismatch_note() -> None:
    assert step_list_text([64, 62, 63, 70, 72, 71, 80]) == "62-64, 70-72, 80"
    assert step_list_text([]) == ""
    ev = make_evidence(4, steps=3)
    view = build_view({"status": "no_suspect", "armed_steps": [62, 63, 64], "captured_steps": [1, 2, 3],
                       "world_size": 5}, ev.summaries)
    meta = dict(view.meta)
    assert meta["steps"] == "1-3" and meta["armed steps"] == "62-64" and meta["ranks"] == "4 of 5"
    assert view.notes[0] == "captured steps 1-3 are not the armed steps 62-64"


def test_paths_are_listed_once() -> None:
    adv = "/w/out/msprof/advisor_html-x/mstt_advisor_1.html"
    xlsx = "/w/out/msprof/advisor_html-x/log/mstt_advisor_1.xlsx"
    data = {"status": "no_suspect", "paths": {"advisor_html": adv, "report_json": "/w/out/report.json"},
            "recipes": {"advisor_html": {"status": "ok", "detail": f"{xlsx} {adv}"},
                        "x": {"status": "ok", "detail": "bandwidth 12 GB/s, ratio 1/2 </b>"}},
            "notes": [f"advisor report: {xlsx}, {adv}", f"advisor report: {xlsx}, {adv}", "kept: /a/b/c.db used"]}
    view = build_view(data, [])
    assert view.files == [("report.json (all numbers)", "/w/out/report.json"), ("advisor report (HTML)", adv),
                          ("advisor report (xlsx)", xlsx), ("db output", "/a/b/c.db")]
    assert view.recipes[0]["detail"] == "mstt_advisor_1.xlsx mstt_advisor_1.html"
    assert view.recipes[1]["detail"] == "bandwidth 12 GB/s, ratio 1/2 </b>"
    assert view.notes == ["kept: c.db used"]
    assert files_of({}, ["see /one"]) == []  # a single segment is not taken for a path
    assert shorten_paths("at /x/y/z.txt.", {}) == "at z.txt."


@pytest.mark.parametrize("odd", [{"changes": 5}, {"components": 5}, {"notes": 5}, {"notes": {"a": 1}},
                                 {"step_time_now_s": 10**400},
                                 {"components": [{"component": "compute", "delta_s_per_step": 10**400}]}])
def test_comparison_of_odd_types_renders_without_them(odd: dict) -> None:
    """A hand-edited report.json: a list that is a number, an integer past the float range: left out, never raised."""
    from profwatch.adapters.outputs.report import render_html

    cmp = parse_comparison({"headline": "h", "step_time_baseline_s": 0.1, **odd})
    assert cmp is not None and cmp.step.baseline_ms == pytest.approx(100.0)
    assert "What changed" in render_html({"comparison": {"headline": "h", **odd}}, [])


def test_a_suspect_whose_ai_core_clock_ran_low_says_so_in_the_headline_and_its_row() -> None:
    ev = make_evidence(8, slow={5: 1.5})
    data = {"status": "ok", "suspects": [{"rank": 5, "score": 0.9, "kind": "compute", "evidence": {"summary": "why"}},
                                         {"rank": 2, "score": 0.3, "kind": "host", "evidence": {}}],
            "hardware": [{"rank": 5, "mean_mhz": 1200.0, "peers_mhz": 1800.0}, {"rank": "x"}, "junk",
                         {"rank": 2, "mean_mhz": None, "peers_mhz": 1800.0}]}
    view = build_view(data, ev.summaries)
    assert view.headline.subject == "rank 5 (compute; AI Core 1200 MHz, peers 1800 MHz (hardware))"
    assert view.suspects[1].kind == "host"  # a malformed entry adds nothing
    assert build_view({**data, "hardware": "bad"}, ev.summaries).suspects[0].kind == "compute"


def test_the_percent_of_step_is_the_verdicts_figure_and_the_page_shows_its_base() -> None:
    """One figure, one name: the page showed the saving's share of its median step ("% of the median step") where
    the alerts and the demo showed the verdict's share of the mean step ("% of the mean step", "% of step"). The
    page now shows the verdict's figure, and the mean step it is a share of (so its numbers agree: 72 % was shown
    where the page's own saving and median step gave 73.7 %)."""
    from statistics import median

    from profwatch.core.verdict.ranking import judge_batch

    ev = make_evidence(4, slow={2: 3.0}, steps=5, noise=0.2, seed=7)
    v = judge_batch(ev)
    data = {"status": "ok", "suspects": [s.to_json() if hasattr(s, "to_json") else {
        "rank": s.rank, "score": s.score, "kind": s.kind, "evidence": s.evidence, "impact": s.impact}
        for s in v.suspects], "impact": v.impact}
    view = build_view(data, ev.summaries)
    top, raw = view.suspects[0].impact, v.suspects[0].impact
    assert top is not None and view.impact_total is not None
    assert (top.saving_s_per_step, top.saving_pct_of_step, top.accelerator_hours_per_day) == (
        raw["saving_s_per_step"], raw["saving_pct_of_step"], raw["accelerator_hours_per_day"])
    assert view.impact_total.saving_pct_of_step == v.impact["saving_pct_of_step"]
    steps: dict[int, list[float]] = {}
    for r in ev.summaries:
        steps.setdefault(r.step, []).append(r.step_time_us)
    mean_ms = sum(median(t) for t in steps.values()) / len(steps) / 1e3  # the impact model's base
    base = dict(view.meta)["mean step time (the savings' base)"]
    assert base == f"{mean_ms:.1f} ms", (base, mean_ms)
    assert abs(mean_ms - view.median_step_ms) > 0.05  # the two step times differ here: the name says which


def test_a_drill_down_that_explains_little_of_the_excess_says_so() -> None:
    """Tried by a new user: "why it is slow" listed ``aten::matmul +3.7 ms/step`` under a +35.8 ms own-work excess,
    as if it were the cause. The row now says how much of the excess the entries listed explain."""
    ev = make_evidence(4, slow={2: 3.0}, steps=5, noise=0.0, seed=7)
    data = {"status": "ok", "suspects": [{"rank": 2, "score": 0.45, "kind": "unknown", "evidence": {}}]}
    row = build_view(data, ev.summaries).suspects[0].row
    assert row is not None and row.own_delta_ms > 10
    small = 0.1 * row.own_delta_ms * 1e3  # us per step: a tenth of the excess
    ops = [{"name": "aten::matmul", "kind": "operator", "excess_us_per_step": small,
            "reference_us_per_step": 100.0, "suspect_us_per_step": 100.0 + small}]
    cmp = [{"rank": 2, "reference_rank": 1, "source": "op totals", "ops": ops}]
    top = build_view({**data, "op_compare": cmp}, ev.summaries).suspects[0]
    assert top.why_share.startswith(f"the entries listed explain {small / 1e3:.1f} ms of the {row.own_delta_ms:.1f} "
                                    "ms/step this rank's own work exceeds its peers' by (10%)")
    most = [{**ops[0], "excess_us_per_step": 0.8 * row.own_delta_ms * 1e3}]
    assert build_view({**data, "op_compare": [{**cmp[0], "ops": most}]}, ev.summaries).suspects[0].why_share == ""
    from profwatch.adapters.outputs.report import render_html

    html = render_html({**data, "op_compare": cmp}, ev.summaries)
    assert html.index("why it is slow") < html.index("the entries listed explain")


def test_a_drill_down_share_of_a_small_excess_keeps_its_digits() -> None:
    """An excess under a millisecond read "explain 0.0 of the 0.1 ms/step ... the other 0.1 ms/step": the share
    keeps 2-3 significant digits, as every excess shown (``drilldown.delta_text``)."""
    from profwatch.core.verdict.report_view import SuspectRow

    row = SuspectRow.__new__(SuspectRow)
    object.__setattr__(row, "why", [SimpleNamespace(delta_ms=0.02)])
    object.__setattr__(row, "row", SimpleNamespace(own_delta_ms=0.12))
    assert SuspectRow.why_share.fget(row).startswith(  # type: ignore[attr-defined]
        "the entries listed explain 20 us of the 0.12 ms/step this rank's own work exceeds its peers' by (17%); "
        "the other 100 us/step"), SuspectRow.why_share.fget(row)  # type: ignore[attr-defined]
