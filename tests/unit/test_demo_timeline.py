"""The demo timeline: pipeline order, durations, slowdown time from status samples, event times."""

from __future__ import annotations

import json

import pytest

from profwatch.commands.demo_timeline import STAGES, Timeline, event_time


def test_stages_render_in_pipeline_order_whatever_the_arrival_order() -> None:
    tl = Timeline("ascend", "demo-ascend")
    # arrival order as seen in the field: the verdict first, the batch before the last rank's completion event
    tl.add("first_alert", 141.7, None, "rank 2 compute")
    tl.add("analysis", 104.9, None, "36.8 s")
    tl.add("batch_complete", 104.8, 76, "c-1")
    tl.add("capture", 104.85, 77, "every rank wrote its rank dir")
    tl.add("detection", 100.8, 47, "rank_outlier")
    tl.add("arm", 101.6, 51, "config written")
    tl.add("slowdown", 100.0, 40, "rank 2 x3")
    rows = tl.ordered()
    assert [r[0] for r in rows] == ["slowdown", "detection", "arm", "capture", "batch_complete", "analysis",
                                    "first_alert"]
    took = {r[0]: r[2] for r in rows}
    assert took["slowdown"] is None
    assert took["detection"] == pytest.approx(0.8) and took["first_alert"] == pytest.approx(36.8)
    # the capture cannot have completed after the batch it belongs to was found complete
    assert took["capture"] == pytest.approx(3.2) and took["batch_complete"] == pytest.approx(0.0)
    text = tl.render()
    assert text.index("detection") < text.index("batch_complete") < text.index("analysis") < text.index("first_alert")
    assert "-0.0" not in text and " 36.8 " in text


def test_an_estimated_slowdown_after_the_detection_is_shown_at_the_detection() -> None:
    tl = Timeline("torch", "demo-torch")
    tl.add("detection", 50.0, 47)
    tl.add("slowdown", 50.3, 40)
    rows = tl.ordered()
    assert rows[0][:3] == ("slowdown", 50.0, None) and rows[1][2] == 0.0


def test_time_of_step_interpolates_between_status_samples() -> None:
    tl = Timeline("torch", "demo-torch")
    tl.samples = [(10.0, 30), (11.0, 38), (12.0, 46)]
    assert tl.time_of_step(42) == pytest.approx(11.5)
    assert tl.time_of_step(30) == 10.0
    assert tl.time_of_step(47) is None
    assert tl.step_at(11.9) == 38 and tl.step_at(9.0) is None


def test_first_mark_wins_and_unknown_stages_are_refused() -> None:
    tl = Timeline("torch", "demo-torch")
    assert tl.add("arm", 1.0) and not tl.add("arm", 2.0)
    assert tl.t("arm") == 1.0
    with pytest.raises(ValueError):
        tl.add("alert", 1.0)
    assert set(STAGES) >= {"first_alert", "enriched_update"}


def test_event_time_reads_rfc3339_and_falls_back() -> None:
    assert event_time({"time": "2026-12-01T01:13:05.250Z"}, 0.0) == pytest.approx(1796087585.25)
    assert event_time({}, 7.0) == 7.0 and event_time({"time": "yesterday"}, 8.0) == 8.0


def test_demo_without_torch_says_how_to_install_the_cpu_build(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    import importlib.util

    from click.testing import CliRunner

    from profwatch.commands.demo import TORCH_CPU_INSTALL, demo

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    res = CliRunner().invoke(demo, ["--workdir", str(tmp_path)])
    assert res.exit_code == 2 and TORCH_CPU_INSTALL in res.stderr and "CUDA build" in res.stderr
    assert not list(tmp_path.iterdir())  # nothing started, nothing written


def test_published_events_fold_into_the_stages() -> None:
    from profwatch.commands.demo import _expects_enrichment, on_event
    from profwatch.core.alerts.events import rfc3339

    def ev(typ: str, t: float, **data: object) -> dict:
        return {"type": f"io.profwatch.{typ}", "time": rfc3339(t), "data": data}

    tl = Timeline("ascend", "demo-ascend")
    seen: list[str] = []
    events = [ev("anomaly.v1", 100.8, kind="rank_outlier", magnitude=6.03, step=46),
              ev("arm_decision.v1", 101.0, action="suppress", reason="capture_in_flight"),
              ev("arm.v1", 101.3, status="written", start_step=68, warmup=1, active=3),
              ev("batch.v1", 104.7, batch={"batch_id": "c-1"}),
              ev("capture.v1", 104.8, event="all_ranks_completed"),
              ev("suspect_ranks.v1", 110.0, status="ok", analysis_duration_s=5.0, pending_recipes=["advisor"],
                 suspects=[{"rank": 2, "kind": "compute", "score": 0.9}], recipes={"slow_rank": {"status": "ok", "duration_s": 3.25},
                                                                         "kineto_breakdown": "ok"}),
              ev("analysis_enriched.v1", 150.0, capture_id="c-1", status="ok", enrich_duration_s=39.5,
                 suspects=[{"rank": 2, "kind": "compute", "score": 0.9}], recipes={"advisor": {"status": "ok"}})]
    for e in events:
        on_event(tl, e, 0.0, lambda stage, t, detail: seen.append(stage))
    assert seen == ["detection", "arm", "batch_complete", "capture", "analysis", "first_alert", "enriched_update"]
    assert tl.suppressed == {"suppress (capture_in_flight)": 1}
    rows = {r[0]: r for r in tl.ordered()}
    assert rows["analysis"][1] == pytest.approx(105.0) and rows["first_alert"][2] == pytest.approx(5.0)
    assert rows["enriched_update"][2] == pytest.approx(40.0) and rows["detection"][3] == 46
    assert _expects_enrichment(tl) and tl.enriched is not None and "rank 2 compute" in rows["first_alert"][4]
    assert "recipes: slow_rank=ok (3.2s), kineto_breakdown=ok" in rows["analysis"][4]  # durations where reported


def test_the_reference_row_says_what_the_capture_is_not_an_alert_name() -> None:
    """A user read ``reference capture c-1 (suspect_ranks): steps 102-107`` as an alert that went out; a reference
    is never alerted on: the row names the baseline, its ranks and its outcome in words."""
    from profwatch.commands.demo import on_event
    from profwatch.core.alerts.events import rfc3339

    tl = Timeline("reference", "demo-reference", after_slowdown_only=True)
    rows: list[str] = []
    ev = {"type": "io.profwatch.reference_captured.v1", "time": rfc3339(112.0),
          "data": {"capture_id": "c-1", "outcome": "suspect_ranks", "judged_ranks": [0, 1, 2, 3], "world_size": 4,
                   "captured_steps": [102, 103, 104, 105, 106, 107]}}
    on_event(tl, ev, 0.0, lambda stage, t, detail: rows.append(detail))
    assert rows == ["reference capture c-1: healthy baseline of all 4 ranks, analysis done (never alerted on): "
                    "steps 102-107"]


def test_a_missed_scenario_prints_what_the_analysis_saw(tmp_path):
    from profwatch.commands.demo import miss_evidence

    rows = [{"rank": r, "step": s, "computation_us": 70_000.0 * (2 if r == 1 else 1), "wait_us": 0.0 if r == 1 else
             69_000.0, "free_us": 1_500.0} for s in (78, 79) for r in range(4)]
    (tmp_path / "report.json").write_text(json.dumps({
        "notes": ["step alignment: labels"], "summaries": rows + [{"rank": "x"}, "junk"],
        "recipes": {"kineto_breakdown": {"status": "ok", "detail": "4 of 4 ranks, 2 steps"}}}))
    lines = miss_evidence({"status": "no_suspect", "detail": "no rank stands out", "report": str(tmp_path / "report.html")})
    assert lines[0] == "status no_suspect: no rank stands out"
    assert "note: step alignment: labels" in lines and "recipe kineto_breakdown: ok: 4 of 4 ranks, 2 steps" in lines
    head = next(line for line in lines if line.startswith("per step"))
    assert head.split()[-2:] == ["rank", "3"]
    step78 = next(line for line in lines if line.startswith("step 78"))
    assert step78.split()[2:] == ["70.0/69.0/1.5", "140.0/0.0/1.5", "70.0/69.0/1.5", "70.0/69.0/1.5"]
    # no report, or one that cannot be read: the status line, and why
    assert miss_evidence({"status": "failed", "detail": "x"}) == ["status failed: x"]
    (tmp_path / "bad.json").write_text("{")
    assert miss_evidence({"status": "failed", "detail": "x", "report": str(tmp_path / "bad.html")})[1].startswith(
        "report JSON not readable")


def test_the_timeout_counts_from_the_slowdown_then_from_the_first_alert() -> None:
    """Issue 35: 164 s of the 240 went before the slowdown; the bound is now counted from it."""
    tl = Timeline("torch", "demo-torch")
    end, what = tl.deadline(1000.0, 600.0, 240.0, False)
    assert (end, what) == (1600.0, "slowdown within 600 s of the job's start (--start-timeout-s)")
    tl.add("slowdown", 1164.0, 40)
    end, what = tl.deadline(1000.0, 600.0, 240.0, False)
    assert (end, what) == (1404.0, "first alert within 240 s of the slowdown")
    tl.add("first_alert", 1300.0, None, "ok")
    tl.alert = {"type": "x", "data": {"pending_recipes": ["advisor"]}}
    assert tl.deadline(1000.0, 600.0, 240.0, True) == (1540.0, "enriched update within 240 s of the first alert")
    ref = Timeline("reference", "demo-reference", after_slowdown_only=True)
    assert ref.waiting_for() == "reference" and ref.deadline(0.0, 600.0, 240.0, False)[1].startswith("reference")


def test_every_wait_says_what_it_waits_for_and_what_was_seen() -> None:
    tl = Timeline("torch", "demo-torch")
    assert tl.progress_line(1010.0, 12, 1600.0, "slowdown within 600 s of the job's start") == (
        "[torch] waiting for the slowdown; seen: nothing yet; the job at step 12; 590 s left of slowdown within "
        "600 s of the job's start")
    # a new user's trial: "waiting for the reference; seen: nothing yet" while the reference's capture was enriching
    ref = Timeline("reference", "demo-reference", after_slowdown_only=True)
    busy = ref.progress_line(1010.0, 106, 1600.0, "reference within 600 s of the job's start", ["c-1 enriching"])
    assert "nothing yet" not in busy and "seen: no stage yet, capture c-1 enriching being analysed;" in busy, busy
    tl.add("slowdown", 1164.0, 40)
    tl.add("detection", 1170.0, 45, "step_regression +200%")
    line = tl.progress_line(1200.0, None, 1404.0, "first alert within 240 s of the slowdown")
    assert line.startswith("[torch] waiting for the first alert; seen: slowdown +0s, detection +6s; no step")
    assert tl.waiting_for() == "arm"
    tl.add("reference", 1163.6, 39)  # just before the slowdown: it read "reference +-0s"
    seen = tl.progress_line(1200.0, None, 1404.0, "x within 1 s").split("seen: ")[1]
    assert seen.startswith("reference +0s, slowdown +0s, detection +6s;")
    early = Timeline("torch", "demo-torch")
    early.add("reference", 1100.0, 20)
    early.add("slowdown", 1164.0, 40)
    assert "seen: reference -64s, slowdown +0s;" in early.progress_line(1200.0, None, 1404.0, "x within 1 s")


def test_a_timed_out_scenario_says_so_with_what_it_saw_never_none() -> None:
    from profwatch.commands.demo import report

    tl = Timeline("torch", "demo-torch")
    tl.add("slowdown", 1164.0, 40)
    tl.add("detection", 1170.0, 45, "step_regression +200%")
    tl.timed_out = "no first alert within 240 s of the slowdown"
    out: list[str] = []
    assert report(tl, 2, out.append) is False
    text = "\n".join(out)
    assert "result: TIMED OUT: no first alert within 240 s of the slowdown; seen so far: slowdown, detection" in text
    assert "None" not in text and "--timeout-s" in text
    assert json.loads(json.dumps(tl.to_json()))["timed_out"] == tl.timed_out


def test_the_help_says_where_the_timeout_counts_from() -> None:
    from click.testing import CliRunner

    from profwatch.commands.demo import demo

    out = CliRunner().invoke(demo, ["--help"]).output
    assert "counted from the slowdown" in " ".join(out.split()) and "--start-timeout-s" in out


def test_progress_lines_come_in_pipeline_order_at_the_tables_times() -> None:
    """The batch found complete before the last rank's completion event arrived: its line waits for the capture's,
    and both read the time the final table shows (the capture clamped to the batch's)."""
    tl = Timeline("ascend", "demo-ascend")
    tl.add("slowdown", 100.0, 40)
    tl.add("detection", 102.6, 50, "rank_outlier")
    assert [s for s, *_ in tl.release()] == ["slowdown", "detection"]
    tl.add("batch_complete", 112.3, None, "c-1")
    assert tl.release() == []  # held: the capture comes first in the pipeline
    tl.add("arm", 102.8, 50, "config written")
    assert [s for s, *_ in tl.release()] == ["arm"]
    tl.add("capture", 112.4, None, "every rank wrote its rank dir")
    out = tl.release()
    table = {s: t for s, t, *_ in tl.ordered()}
    assert [s for s, *_ in out] == ["capture", "batch_complete"]
    assert [t for _s, t, _d in out] == [table["capture"], table["batch_complete"]] == [112.3, 112.3]
    assert tl.release() == []  # each stage once


def test_a_stage_whose_predecessor_never_comes_is_released_by_a_later_one_or_at_the_end() -> None:
    tl = Timeline("torch", "demo-torch")
    tl.add("slowdown", 100.0, 40)
    tl.release()
    tl.add("arm", 103.0, 51)  # no detection event seen (e.g. it was missed)
    assert tl.release() == []
    assert [s for s, *_ in tl.release(final=True)] == ["arm"]
    tl.add("capture", 110.0)
    tl.add("first_alert", 115.0)  # a batch_incomplete verdict: no batch_complete, no analysis
    assert [s for s, *_ in tl.release()] == ["capture", "first_alert"]
