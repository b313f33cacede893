"""The status of an analysed batch (profwatch.analysis.result.overall_status) from its evidence and verdict: every status
that rates the evidence (issue 11 items 2, 4, 5, 10), without running any tool."""

from __future__ import annotations

from profwatch.analysis.result import overall_status as _overall_status
from profwatch.core.verdict.evidence import ClusterEvidence, RecipeStatus
from profwatch.core.verdict.ranking import judge_batch
from profwatch.simulate.ascend_tree import build_timelines, cluster_time_summary


def _ev(steps: int = 4, **kw) -> ClusterEvidence:
    ev = ClusterEvidence(kind="ascend_pt", summaries=cluster_time_summary(
        build_timelines(world_size=8, steps=steps, seed=3, noise=0.02, **kw)))
    ev.recipes["cluster_time_summary"] = RecipeStatus("cluster_time_summary", "ok")
    return ev


def _status(ev: ClusterEvidence, armed: list[int] | None = None) -> tuple[str, str, dict[int, str]]:
    unjudged: dict[int, str] = {}
    status, detail = _overall_status(ev, judge_batch(ev, armed_steps=armed), 8, unjudged)
    return status, detail, unjudged


def test_ok_and_no_suspect_need_the_whole_window():
    assert _status(_ev(slow_ranks={4: 1.3}), [1, 2, 3, 4])[0] == "ok"
    assert _status(_ev(), [1, 2, 3, 4])[0] == "no_suspect"
    assert _status(_ev())[0] == "no_suspect"  # armed window unknown (offline): rated on the 4 steps captured


def test_short_window_is_weak_with_suspects_and_partial_without():
    status, detail, _ = _status(_ev(steps=2, slow_ranks={4: 1.3}), [1, 2, 3, 4])
    assert status == "weak" and "2 of 4 armed steps captured" in detail
    status, detail, _ = _status(_ev(steps=2), [1, 2, 3, 4])
    assert status == "partial" and "absence not proven" in detail
    assert _status(_ev(steps=1))[0] == "partial"  # one step, armed unknown: still not a proof of absence


def test_unusable_or_unaligned_ranks_make_it_partial_even_with_suspects():
    ev = _ev(slow_ranks={4: 1.3})
    ev.unusable_ranks = {6: "no usable device data: ascend_pytorch_profiler_6.db has empty TASK"}
    status, detail, unjudged = _status(ev)
    assert status == "partial" and unjudged == ev.unusable_ranks and "rank 4 (compute)" in detail
    ev = _ev()
    ev.summaries = [s for s in ev.summaries if s.rank != 2]
    ev.alignment = {"method": "collective_ends", "unaligned": {"2": "it recorded other steps"}}
    status, detail, unjudged = _status(ev)
    assert status == "partial" and "nobody stands out among the judged ranks" in detail
    assert "steps not aligned" in unjudged[2]


def test_a_rank_missing_from_the_time_breakdown_is_not_judged():
    ev = _ev()
    ev.summaries = [s for s in ev.summaries if s.rank != 7]
    status, _, unjudged = _status(ev)
    assert status == "partial" and unjudged == {7: "not in the time breakdown"}


def test_a_no_suspect_detail_says_what_the_capture_was_armed_for():
    """A no_suspect verdict says what detection saw: a named rank the capture does not confirm, or a job-wide
    slowdown (no single rank); a reference capture or an unknown reason adds nothing."""
    from profwatch.analysis.result import armed_for_note

    named = armed_for_note("rank_outlier +35% at step 120 ranks [2]")
    assert named.startswith("; armed for rank_outlier +35% at step 120 ranks [2], which this capture does not confirm")
    assert armed_for_note("step_regression +25% at step 300") == (
        "; armed for step_regression +25% at step 300: the whole job, no single rank")
    assert armed_for_note("reference") == armed_for_note(None) == armed_for_note("  ") == ""
    # a manual capture (the control command's default reason, or an operator's text) was armed by no detector: it
    # is neither "the whole job" nor a named rank the capture failed to confirm
    assert armed_for_note("manual") == armed_for_note("check ranks [3, 4] after the fix") == ""


def test_a_verdict_naming_another_rank_than_detection_says_they_disagree():
    """Live (a 2-rank gloo TP pair on a shared 2-core host): detection named rank 1 on its CPU time per step, the
    capture's 10 steps named rank 0 (its matmuls ran 3.8x longer there under CPU contention) and the alert said only
    "ok: suspects rank 0". The detail now says the capture was armed for rank 1 and does not name it."""
    from profwatch.analysis.result import named_elsewhere_note

    note = named_elsewhere_note("rank_outlier +30% at step 4408 ranks [1]", [0])
    assert note.startswith("; armed for rank_outlier +30% at step 4408 ranks [1], not named by this capture: "
                           "the detector and the capture disagree")
    # a named rank among the suspects, a job-wide change, a manual or reference capture, no suspect: nothing to say
    assert named_elsewhere_note("rank_outlier +30% at step 4408 ranks [1, 3]", [3, 0]) == ""
    assert named_elsewhere_note("step_regression +25% at step 300", [2]) == ""
    assert named_elsewhere_note("manual", [2]) == named_elsewhere_note("reference", [2]) == ""
    assert named_elsewhere_note(None, [2]) == named_elsewhere_note("rank_outlier +30% at step 9 ranks [1]", []) == ""
