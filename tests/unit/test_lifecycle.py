"""The capture lifecycle with a fake clock: every transition, every state's deadline and its expiry (pure)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

import pytest

from profwatch.core.alerts.events import (
    TYPE_ANALYSIS_ENRICHED,
    TYPE_ANALYSIS_FAILED,
    TYPE_ARM,
    TYPE_BATCH,
    TYPE_BATCH_INCOMPLETE,
    TYPE_CAPTURE,
    TYPE_SUSPECT_RANKS,
)
from profwatch.core.batches.completeness import BatchState, Problem, RankDirState
from profwatch.core.capture import lifecycle as lc
from profwatch.core.capture.lifecycle import Action, CaptureState
from profwatch.core.capture.planner import CaptureRequest, CaptureSettings, JobProgress, plan_capture
from profwatch.core.capture.report import VERDICT_KEYS, refusal
from profwatch.core.display import span_text
from rankhook import wire

T0 = 1_800_000_000.0
SET = lc.LifecycleSettings(write_timeout_s=30, ack_timeout_s=60, parse_allowance_s=100, final_scan_grace_s=50,
                           analysis_timeout_s=1000, enrich_timeout_s=500)
CS = CaptureSettings(margin_s=2.0, margin_steps=2, deadline_factor=3.0, deadline_grace_s=120.0)


def _plan(world: int = 4, steps: Mapping[int, int] | None = None, rank_list: list[int] | None = None,
          times: Mapping[int, float] | None = None, now: float = T0):
    steps = dict(steps or dict.fromkeys(range(world), 100))
    job = JobProgress(job_id="j1", world_size=world, furthest_step=max(steps.values()), step_time_s=0.5,
                      prof_root="/prof", now_unix_s=now, rank_steps=steps, rank_step_time_s=dict(times or {}))
    return plan_capture(CaptureRequest(job_id="j1", reason="test", rank_list=rank_list), job, CS), steps


def _open(world: int = 4, backend: str = "torch_npu", nodes: tuple[str, ...] = (), **kw) -> lc.Capture:
    plan, steps = _plan(world, **kw)
    t = lc.open_capture(plan, world_size=world, profiler_config_path="/cfg/j1", writer="node" if nodes else "coordinator",
                        rank_steps=steps, rank_step_time_s={}, rank_backends=dict.fromkeys(range(world), backend),
                        nodes=list(nodes), now=T0, settings=SET, step_time_s=0.5)
    return t.capture


def _written(cap: lc.Capture, now: float = T0 + 1) -> lc.Capture:
    return lc.config_written(cap, {"path": "/cfg/j1/profiler_config.json", "mtime_s": int(now)}, now, SET).capture


def _ev(rank: int, event: str, *, source: str = "dp_log", ts: float = T0 + 2, **kw) -> wire.CaptureEvent:
    return wire.CaptureEvent(job_id="j1", rank=rank, event=event, ts_unix_s=ts, source=source, **kw)  # type: ignore[arg-type]


def _acked(cap: lc.Capture, now: float = T0 + 2) -> lc.Capture:
    for r in cap.ranks:
        cap = lc.rank_event(cap, _ev(r, "arm_seen", start_step=cap.start_step), now, SET).capture
    return cap


def _batch(cap: lc.Capture, status: str = "complete", ranks: tuple[int, ...] = (0, 1, 2, 3),
           missing: tuple[int, ...] = ()) -> BatchState:
    states = {r: RankDirState(path=f"{cap.prof_dir}h_{r}_x_ascend_pt", kind="ascend_pt", rank=r, state="parsed")
              for r in ranks}
    problems = [Problem(rank=r, path=cap.prof_dir, reason="rank dir missing") for r in missing]
    return BatchState(batch_id=f"b-{cap.capture_id}", status=status, kind="ascend_pt",  # type: ignore[arg-type]
                      expected_ranks=sorted(cap.ranks), ranks=states, missing_ranks=list(missing), problems=problems,
                      steps=[1, 2, 3], capture_id=cap.capture_id)


def _types(t: lc.Transition) -> list[str]:
    return [e.type for e in t.events]


# -- planned -----------------------------------------------------------------------------------------------------
def test_open_capture_is_planned_with_the_write_deadline_and_asks_for_the_write() -> None:
    plan, steps = _plan()
    t = lc.open_capture(plan, world_size=4, profiler_config_path="/cfg/j1", writer="coordinator", rank_steps=steps,
                        rank_step_time_s={}, rank_backends=dict.fromkeys(range(4), "torch_npu"), nodes=[], now=T0,
                        settings=SET)
    cap = t.capture
    assert cap.state is CaptureState.PLANNED and cap.deadline_unix_s == T0 + 30
    assert t.actions == {Action.WRITE_CONFIG, Action.WATCH}
    assert cap.expected_ranks == [0, 1, 2, 3] and cap.config["start_step"] == plan.start_step
    assert cap.judge_unix_s == pytest.approx(plan.deadline_unix_s + 100)
    assert cap.armed_steps == [plan.start_step + plan.warmup + i for i in range(plan.active)]
    assert [e.data["event"] for e in t.events] == ["planned"]
    assert not lc.is_due(cap, T0 + 29.9) and lc.is_due(cap, T0 + 30)


def test_written_by_the_coordinator_then_a_write_failure_is_ignored() -> None:
    cap = _open()
    t = lc.config_written(cap, {"path": "/cfg/j1/profiler_config.json", "mtime_s": int(T0 + 1)}, T0 + 1, SET)
    assert t.capture.state is CaptureState.WRITTEN and t.capture.config_mtime_s == int(T0 + 1)
    assert t.capture.deadline_unix_s == T0 + 1 + 60  # the ack timeout
    (arm,) = t.events
    assert arm.type == TYPE_ARM and arm.event_id == f"arm-{cap.capture_id}" and arm.data["status"] == "written"
    assert arm.data["mtime_s"] == int(T0 + 1) and arm.data["start_step"] == cap.start_step
    assert lc.config_write_failed(t.capture, "late error", T0 + 2, SET).capture is t.capture


def test_write_refused_fails_the_capture_with_the_error() -> None:
    t = lc.config_write_failed(_open(), "config dir not allowed", T0 + 1, SET)
    assert t.capture.state is CaptureState.FAILED and t.capture.deadline_unix_s is None
    assert "config dir not allowed" in t.capture.outcome and Action.UNWATCH in t.actions
    assert t.events[0].type == TYPE_ARM and t.events[0].data["status"] == "failed"


def test_node_writer_needs_every_node_and_fails_on_the_first_no() -> None:
    cap = _open(nodes=("n1", "n2"))
    assert cap.writer == "node" and sorted(cap.nodes) == ["n1", "n2"]
    assert cap.nodes["n1"].command_id == f"w-{cap.capture_id}-n1"
    t = lc.node_write_result(cap, "n1", True, "", {"mtime_s": 5}, T0 + 1, SET)
    assert t.capture.state is CaptureState.PLANNED and not t.events
    t2 = lc.node_write_result(t.capture, "n2", True, "", {"mtime_s": 6}, T0 + 2, SET)
    assert t2.capture.state is CaptureState.WRITTEN and t2.events[0].data["nodes_confirmed"] == ["n1", "n2"]
    bad = lc.node_write_result(t.capture, "n2", False, "config dir not allowed", {}, T0 + 2, SET)
    assert bad.capture.state is CaptureState.FAILED and "node n2: config dir not allowed" in bad.capture.outcome
    assert lc.node_write_result(cap, "stranger", True, "", {}, T0 + 1, SET).capture is cap


def test_planned_expires_to_failed_naming_the_silent_node_and_its_cause() -> None:
    cap = lc.node_write_result(_open(nodes=("n1", "n2")), "n1", True, "", {}, T0 + 1, SET).capture
    assert lc.expire(cap, T0 + 29, SET).capture is cap  # not due yet
    t = lc.expire(cap, T0 + 30, SET, causes={2: "node n2 DOWN (last heard 40 s ago)"})
    assert t.capture.state is CaptureState.FAILED
    assert "node(s) ['n2'] did not confirm" in t.capture.outcome and "n2 DOWN" in t.capture.outcome
    assert t.events[0].type == TYPE_ARM and t.events[0].data["status"] == "failed"


# -- written -> acknowledged -> collecting ---------------------------------------------------------------------------
def test_torch_npu_acknowledgement_rests_on_torch_npus_dp_log_not_the_hook() -> None:
    cap = _written(_open(world=2))
    for r in (0, 1):  # the hook read the file: not torch_npu's word
        cap = lc.rank_event(cap, _ev(r, "arm_seen", source="hook", capture_id=cap.capture_id), T0 + 2, SET).capture
    assert cap.state is CaptureState.WRITTEN and cap.ranks[0].hook_seen_unix_s is not None
    cap = lc.rank_event(cap, _ev(0, "arm_seen", start_step=cap.start_step), T0 + 3, SET).capture
    assert cap.state is CaptureState.WRITTEN
    t = lc.rank_event(cap, _ev(1, "arm_seen", start_step=cap.start_step), T0 + 4, SET)
    assert t.capture.state is CaptureState.ACKNOWLEDGED
    assert t.capture.deadline_unix_s == t.capture.judge_unix_s
    assert t.events[-1].data["event"] == "acknowledged" and t.events[-1].data["ranks"] == [0, 1]


def test_torch_backend_is_acknowledged_by_its_hook() -> None:
    cap = _written(_open(world=2, backend="torch"))
    for r in (0, 1):
        cap = lc.rank_event(cap, _ev(r, "arm_seen", source="hook", capture_id=cap.capture_id), T0 + 2, SET).capture
    assert cap.state is CaptureState.ACKNOWLEDGED


def test_window_start_moves_to_collecting_and_completion_asks_for_a_scan() -> None:
    cap = _acked(_written(_open(world=2)))
    t = lc.rank_event(cap, _ev(0, "started", step=cap.start_step), T0 + 10, SET)
    assert t.capture.state is CaptureState.COLLECTING and t.capture.deadline_unix_s == cap.judge_unix_s
    t = lc.rank_event(t.capture, _ev(0, "completed", source="hook", capture_id=cap.capture_id, total_bytes=10,
                                     steps=(5, 6), rank_dir="/d0"), T0 + 11, SET)
    assert Action.SCAN in t.actions and t.capture.ranks[0].total_bytes == 10 and t.capture.ranks[0].steps == (5, 6)
    assert not any(e.data.get("event") == "all_ranks_completed" for e in t.events)
    t = lc.rank_event(t.capture, _ev(1, "completed", source="hook", capture_id=cap.capture_id, total_bytes=5),
                      T0 + 12, SET)
    (done,) = [e for e in t.events if e.data.get("event") == "all_ranks_completed"]
    assert done.event_id == f"captured-{cap.capture_id}" and done.data["total_bytes"] == 15


def test_inflated_or_repeated_byte_claims_are_capped_per_rank() -> None:
    """Adversarial finding: four ``completed`` events at 2**61 bytes after the capture ended made the job's total
    2**63 (beyond SQLite's integers); the byte history gates automatic arms."""
    cap = _acked(_written(_open(world=4)))
    for repeat in range(3):
        for r in range(4):
            cap = lc.rank_event(cap, _ev(r, "completed", source="hook", capture_id=cap.capture_id,
                                         total_bytes=2**61), T0 + 20 + repeat, SET).capture
    assert all(p.total_bytes == lc.MAX_RANK_CAPTURE_BYTES for p in cap.ranks.values())
    assert cap.total_bytes == 4 * lc.MAX_RANK_CAPTURE_BYTES < 2**62
    later = lc.rank_event(cap, _ev(0, "completed", source="hook", capture_id=cap.capture_id, total_bytes=-5),
                          T0 + 30, SET).capture
    assert later.ranks[0].total_bytes == lc.MAX_RANK_CAPTURE_BYTES  # a negative claim lowers nothing


def test_rejections_are_recorded_and_published_and_uncovered_ranks_ignored() -> None:
    cap = _written(_open(world=4, rank_list=[1, 3]))
    assert cap.expected_ranks == [1, 3]
    assert lc.rank_event(cap, _ev(0, "arm_rejected", detail="rank not in rank_list"), T0 + 2, SET).capture is cap
    t = lc.rank_event(cap, _ev(3, "arm_rejected", detail="start_step 0: torn config"), T0 + 2, SET)
    assert t.capture.ranks[3].rejected.startswith("start_step 0") and t.events[0].data["event"] == "arm_rejected"


def test_written_expires_to_collecting_and_names_each_unacknowledged_rank_with_its_cause() -> None:
    cap = _written(_open(world=3))
    cap = lc.rank_event(cap, _ev(1, "arm_seen", start_step=cap.start_step), T0 + 2, SET).capture
    cap = lc.rank_event(cap, _ev(2, "arm_seen", source="hook", capture_id=cap.capture_id), T0 + 2, SET).capture
    assert lc.expire(cap, T0 + 60, SET).capture is cap  # written at T0 + 1: due at T0 + 61
    t = lc.expire(cap, T0 + 61, SET, causes={0: "node n1: stale torch_npu state: orphan DynMonitorProc pid 77"})
    assert t.capture.state is CaptureState.COLLECTING and Action.SCAN in t.actions
    (ack,) = [e for e in t.events if e.data.get("event") == "ack_missing"]
    assert ack.data["ranks"] == [0, 2] and ack.event_id == f"ack_missing-{cap.capture_id}"
    assert "orphan DynMonitorProc pid 77" in ack.data["causes"][0]
    assert "the hook read the config but torch_npu never acknowledged it" in ack.data["causes"][1]


# -- the batch -------------------------------------------------------------------------------------------------------
def test_complete_batch_starts_the_analysis_with_its_deadline() -> None:
    cap = _acked(_written(_open()))
    t = lc.scan_result(cap, _batch(cap), T0 + 20, SET)
    assert t.capture.state is CaptureState.ANALYSING and t.actions == {Action.ANALYSE}
    assert t.capture.deadline_unix_s == T0 + 20 + 1000 and t.capture.batch_id == f"b-{cap.capture_id}"
    assert _types(t)[0] == TYPE_BATCH and t.events[0].event_id == f"batch_complete-{cap.capture_id}"


def test_complete_batch_is_taken_even_before_every_acknowledgement() -> None:
    cap = _written(_open())
    assert lc.scan_result(cap, _batch(cap), T0 + 20, SET).capture.state is CaptureState.ANALYSING


def test_incomplete_batch_waits_until_the_judgement_time_then_names_the_missing_ranks() -> None:
    cap = _acked(_written(_open()))
    part = _batch(cap, "incomplete", ranks=(0, 1, 2), missing=(3,))
    t = lc.scan_result(cap, part, T0 + 20, SET)
    assert t.capture.state is CaptureState.COLLECTING and not t.actions  # rank dirs appeared
    t2 = lc.scan_result(t.capture, part, cap.judge_unix_s - 1, SET)
    assert t2.capture is t.capture  # before the judgement time nothing is decided
    t3 = lc.scan_result(t.capture, part, cap.judge_unix_s, SET, causes={3: "node n2 DOWN"})
    assert t3.capture.state is CaptureState.INCOMPLETE and Action.UNWATCH in t3.actions
    (inc,) = [e for e in t3.events if e.type == TYPE_BATCH_INCOMPLETE]
    assert inc.event_id == f"batch_incomplete-{cap.capture_id}"
    assert tuple(inc.data) == VERDICT_KEYS or set(inc.data) == set(VERDICT_KEYS)
    assert inc.data["missing_ranks"] == [3] and inc.data["status"] == "incomplete"
    assert "rank 3: took the arm, but its window never started" in inc.data["causes"][0]
    assert "cause: node n2 DOWN" in inc.data["causes"][0]


def test_an_incomplete_batch_with_every_rank_present_says_what_is_wrong_not_missing_ranks_empty() -> None:
    """Issue 33 #8: one incomplete batch's message read "missing ranks []" (every rank had a dir, one unusable)."""
    cap = _acked(_written(_open()))
    part = _batch(cap, "incomplete")
    part.problems.append(Problem(rank=2, path=cap.prof_dir, reason="analysis.db unreadable"))
    t = lc.scan_result(cap, part, cap.judge_unix_s, SET)
    (inc,) = [e for e in t.events if e.type == TYPE_BATCH_INCOMPLETE]
    assert "missing ranks []" not in inc.data["detail"] and "rank 2: analysis.db unreadable" in inc.data["detail"]
    t = lc.scan_result(cap, _batch(cap, "incomplete", ranks=(0, 1), missing=(2, 3)), cap.judge_unix_s, SET)
    assert "missing ranks [2, 3]" in t.capture.outcome, t.capture.outcome


def test_collecting_expiry_asks_for_the_final_scan_then_closes_without_one() -> None:
    cap = lc.rank_event(_acked(_written(_open())), _ev(0, "started", step=0), T0 + 5, SET).capture
    assert cap.state is CaptureState.COLLECTING
    d = cap.deadline_unix_s
    assert d is not None
    assert lc.expire(cap, d - 1, SET).capture is cap
    t = lc.expire(cap, d, SET)
    assert t.capture is cap and t.actions == {Action.SCAN}
    t = lc.expire(cap, d + 50, SET)
    assert t.capture.state is CaptureState.INCOMPLETE and "no scan of" in t.capture.outcome
    assert _types(t)[0] == TYPE_BATCH_INCOMPLETE


def test_acknowledged_expires_like_collecting() -> None:
    cap = _acked(_written(_open()))
    assert cap.state is CaptureState.ACKNOWLEDGED
    assert lc.expire(cap, cap.judge_unix_s, SET).actions == {Action.SCAN}
    assert lc.expire(cap, cap.judge_unix_s + 50, SET).capture.state is CaptureState.INCOMPLETE


def test_pick_batch_prefers_our_stamp_and_never_takes_a_foreign_one() -> None:
    cap = _open()
    ours, foreign = _batch(cap, "incomplete"), _batch(cap)
    foreign.capture_id = "c-other"
    unstamped = _batch(cap)
    unstamped.capture_id = None
    assert lc.pick_batch(cap, [foreign, ours]) is ours
    assert lc.pick_batch(cap, [foreign, unstamped]) is unstamped
    assert lc.pick_batch(cap, [foreign]) is None


# -- analysis ---------------------------------------------------------------------------------------------------------
def _analysing() -> lc.Capture:
    cap = _acked(_written(_open()))
    return lc.scan_result(cap, _batch(cap), T0 + 20, SET).capture


@pytest.mark.parametrize(("status", "etype", "state"), [
    ("ok", TYPE_SUSPECT_RANKS, CaptureState.ANALYSED), ("no_suspect", TYPE_SUSPECT_RANKS, CaptureState.ANALYSED),
    ("partial", TYPE_SUSPECT_RANKS, CaptureState.ANALYSED), ("weak", TYPE_SUSPECT_RANKS, CaptureState.ANALYSED),
    ("not_applicable", TYPE_SUSPECT_RANKS, CaptureState.ANALYSED),
    ("incomplete", TYPE_BATCH_INCOMPLETE, CaptureState.INCOMPLETE),
    ("no_data", TYPE_ANALYSIS_FAILED, CaptureState.FAILED),
    ("failed", TYPE_ANALYSIS_FAILED, CaptureState.FAILED), ("something_new", TYPE_ANALYSIS_FAILED, CaptureState.FAILED),
])
def test_one_mapping_from_analysis_status_to_event_and_state(status: str, etype: str, state: CaptureState) -> None:
    cap = _analysing()
    payload = {"status": status, "detail": f"detail of {status}", "capture_id": cap.capture_id}
    t = lc.analysis_done(cap, status, payload, T0 + 30, SET)
    assert t.capture.state is state and t.capture.analysis_status == status and t.capture.deadline_unix_s is None
    assert t.events[0].type == etype and dict(t.events[0].data) == payload  # published exactly as report.json has it
    assert lc.event_type_for(status) == etype
    assert (Action.RETAIN in t.actions) == (state is CaptureState.ANALYSED)
    assert Action.UNWATCH in t.actions


def test_every_analysis_status_has_its_own_row() -> None:
    """No status the analysis returns falls through to ``failed``: a weak or not-applicable verdict is a verdict."""
    from typing import get_args

    from profwatch.analysis.result import AnalysisStatus
    assert set(get_args(AnalysisStatus)) == set(lc.OUTCOMES)


def test_a_one_rank_verdict_is_published_as_it_reads() -> None:
    cap = _analysing()
    detail = "this capture cannot answer: one rank with a time breakdown (4 of 4 steps): no peer to compare it with"
    payload = {"status": "not_applicable", "detail": detail, "capture_id": cap.capture_id, "suspects": []}
    t = lc.analysis_done(cap, "not_applicable", payload, T0 + 30, SET)
    assert t.capture.state is CaptureState.ANALYSED and t.capture.analysis_status == "not_applicable"
    assert [e.type for e in t.events if e.type != TYPE_CAPTURE] == [TYPE_SUSPECT_RANKS]
    assert t.events[0].data["status"] == "not_applicable" and "no peer" in t.events[0].data["detail"]
    assert t.events[1].data["event"] == "analysed" and t.events[1].data["analysis_status"] == "not_applicable"


def test_a_result_for_a_capture_that_left_analysing_is_dropped() -> None:
    cap = lc.cancel(_analysing(), T0 + 25, SET).capture
    assert lc.analysis_done(cap, "ok", {}, T0 + 30, SET).capture is cap
    assert lc.analysis_raised(cap, "boom", T0 + 30, SET).capture is cap


def test_a_crashed_analysis_fails_with_the_one_payload_shape() -> None:
    t = lc.analysis_raised(_analysing(), "RuntimeError('x')", T0 + 30, SET)
    assert t.capture.state is CaptureState.FAILED
    ev = t.events[0]
    assert ev.type == TYPE_ANALYSIS_FAILED and set(ev.data) == set(VERDICT_KEYS)
    assert "RuntimeError('x')" in ev.data["detail"] and ev.data["status"] == "failed"


def test_analysing_expires_to_failed() -> None:
    cap = _analysing()
    assert lc.expire(cap, T0 + 20 + 999, SET).capture is cap
    t = lc.expire(cap, T0 + 20 + 1000, SET)
    assert t.capture.state is CaptureState.FAILED and t.events[0].type == TYPE_ANALYSIS_FAILED
    assert Action.STOP_ANALYSIS in t.actions
    assert "did not finish within 1000 s" in t.events[0].data["detail"]


# -- enrichment ---------------------------------------------------------------------------------------------------------
def _analysed() -> lc.Capture:
    return lc.analysis_done(_analysing(), "ok", {"status": "ok"}, T0 + 30, SET).capture


def test_enrichment_publishes_a_follow_up_with_the_same_ids() -> None:
    t = lc.begin_enrich(_analysed(), T0 + 31, SET)
    assert t.capture.state is CaptureState.ENRICHING and t.actions == {Action.ENRICH}
    assert t.capture.deadline_unix_s == T0 + 31 + 500
    t2 = lc.enrich_done(t.capture, {"advisor": {"problems": []}}, T0 + 40, SET)
    assert t2.capture.state is CaptureState.ENRICHED
    ev = t2.events[0]
    assert ev.type == TYPE_ANALYSIS_ENRICHED and ev.event_id == f"enriched-{t.capture.capture_id}"
    assert ev.data["capture_id"] == t.capture.capture_id and ev.data["batch_id"] == t.capture.batch_id


def test_enrichment_failure_or_expiry_leaves_the_verdict_standing() -> None:
    enriching = lc.begin_enrich(_analysed(), T0 + 31, SET).capture
    failed = lc.enrich_failed(enriching, "advisor oom", T0 + 35, SET).capture
    assert failed.state is CaptureState.ANALYSED and "advisor oom" in failed.outcome
    assert lc.expire(enriching, T0 + 31 + 499, SET).capture is enriching
    t = lc.expire(enriching, T0 + 31 + 500, SET)
    assert t.capture.state is CaptureState.ANALYSED and "enrichment did not finish" in t.capture.outcome
    assert Action.STOP_ANALYSIS in t.actions  # the advisor still running is stopped
    with pytest.raises(lc.TransitionRefused):
        lc.begin_enrich(_analysing(), T0, SET)
    crashed = lc.enrich_done(enriching, {"enrich_error": "staging vanished"}, T0 + 36, SET)
    assert crashed.capture.state is CaptureState.ANALYSED and not any(
        e.type == TYPE_ANALYSIS_ENRICHED for e in crashed.events)


def test_a_verdict_with_a_follow_up_is_published_before_the_enrichment_starts() -> None:
    payload = {"status": "ok", "suspects": [{"rank": 1}], "pending_recipes": ["advisor", "report_html"]}
    t = lc.analysis_done(_analysing(), "ok", payload, T0 + 30, SET)
    assert t.capture.state is CaptureState.ENRICHING and {Action.ENRICH, Action.UNWATCH, Action.RETAIN} <= t.actions
    assert [e.type for e in t.events] == [TYPE_SUSPECT_RANKS, TYPE_CAPTURE, TYPE_CAPTURE]
    assert [e.data["event"] for e in t.events[1:]] == ["analysed", "enriching"]
    assert t.events[2].data["pending_recipes"] == ["advisor", "report_html"]
    # nothing to follow, or not a verdict: no enrichment
    assert lc.analysis_done(_analysing(), "ok", {"status": "ok"}, T0 + 30, SET).capture.state is CaptureState.ANALYSED
    failed = lc.analysis_done(_analysing(), "failed", {"pending_recipes": ["advisor"]}, T0 + 30, SET)
    assert failed.capture.state is CaptureState.FAILED and Action.ENRICH not in failed.actions


# -- endings from outside ----------------------------------------------------------------------------------------------
def _each_in_flight() -> list[lc.Capture]:
    planned = _open()
    written = _written(planned)
    acked = _acked(written)
    collecting = lc.rank_event(acked, _ev(0, "started", step=0), T0 + 5, SET).capture
    return [planned, written, acked, collecting, _analysing()]


def test_every_in_flight_state_can_be_cancelled_and_nothing_else() -> None:
    caps = _each_in_flight()
    assert {c.state for c in caps} == set(lc.IN_FLIGHT)
    for cap in caps:
        t = lc.cancel(cap, T0 + 50, SET, by="cli")
        assert t.capture.state is CaptureState.CANCELLED and t.capture.deadline_unix_s is None
        assert f"while {cap.state.value}" in t.capture.outcome and Action.UNWATCH in t.actions
        analysing = cap.state is CaptureState.ANALYSING
        assert (Action.STOP_ANALYSIS in t.actions) == analysing
        # before analysis the arm may still wait on ranks that have not started the window: the idle config
        # (start_step 0) goes over it; an analysing capture's window is long over
        assert (Action.IDLE_CONFIG in t.actions) == (not analysing) == (cap.state in lc.WINDOW_PENDING)
        assert t.events[0].data["note"].startswith("data kept; nothing deleted")
        assert ("idle config (start_step 0)" in t.events[0].data["note"]) == (not analysing)
        with pytest.raises(lc.TransitionRefused):
            lc.cancel(t.capture, T0 + 51, SET)
    with pytest.raises(lc.TransitionRefused):
        lc.cancel(_analysed(), T0 + 51, SET)


def test_the_idle_config_result_is_one_event_per_writer() -> None:
    cap = lc.cancel(_written(_open()), T0 + 50, SET, by="cli").capture
    ok = lc.idle_config_result(cap, "node-a", "written", "/cfg/profiler_config.json (mtime 7)", T0 + 51)
    bad = lc.idle_config_result(cap, "node-b", "failed", "x" * 900, T0 + 51)
    skip = lc.idle_config_result(cap, "node-c", "skipped", "holds capture c-2 now", T0 + 51)
    assert ok.data["event"] == "idle_config_written" and ok.data["writer"] == "node-a"
    assert ok.data["state"] == "cancelled" and ok.data["capture_id"] == cap.capture_id
    assert bad.data["event"] == "idle_config_failed" and len(bad.data["detail"]) == 500
    assert skip.data["event"] == "idle_config_skipped"
    assert len({ok.event_id, bad.event_id, skip.event_id,
                lc.idle_config_result(cap, "node-b", "written", "", T0).event_id}) == 4
    with pytest.raises(ValueError, match="'ok' is not a valid IdleOutcome"):
        lc.idle_config_result(cap, "node-a", "ok", "", T0)  # type: ignore[arg-type]


def test_every_ending_that_can_leave_an_arm_behind_asks_for_the_idle_config() -> None:
    planned = _open()
    failed = lc.config_write_failed(planned, "ro fs", T0 + 1, SET)  # another node may hold the arm
    expired = lc.expire(planned, T0 + SET.write_timeout_s + 1, SET)  # a slow write may still land
    for t in (failed, expired):
        assert t.capture.state is CaptureState.FAILED and Action.IDLE_CONFIG in t.actions
    for cap in _each_in_flight():
        t = lc.supersede(cap, 1, T0 + 50, SET)
        assert (Action.IDLE_CONFIG in t.actions) == (t.capture.state is CaptureState.SUPERSEDED)
    # after a restart the idle config is written again while the window is still ahead, and only then
    for t in (failed, lc.cancel(_written(planned), T0 + 2, SET), lc.supersede(planned, 1, T0 + 2, SET)):
        assert lc.owes_idle(t.capture, T0 + 3) and not lc.owes_idle(t.capture, t.capture.judge_unix_s)
    assert not lc.owes_idle(_analysed(), T0) and not lc.owes_idle(planned, T0)
    # endings the live rules do not idle are not idled after a restart either: the window ran, a verdict came
    crashed = lc.analysis_raised(_analysing(), "boom", T0 + 20, SET).capture
    cancelled_late = lc.cancel(_analysing(), T0 + 20, SET).capture
    assert crashed.state is CaptureState.FAILED and cancelled_late.state is CaptureState.CANCELLED
    assert not lc.owes_idle(crashed, T0 + 21) and not lc.owes_idle(cancelled_late, T0 + 21)
    assert crashed.judge_unix_s > T0 + 21  # (so it is the ending, not the time, that says no)


def test_a_capture_resumed_from_analysing_then_cancelled_owes_the_idle_config() -> None:
    """The restart's rule is the live one: the cancel that asked for the idle config is what a restart reads."""
    resumed = lc.resume(_analysing(), T0 + 40, SET).capture  # the batch it had is kept: the analysis is redone
    assert resumed.state is CaptureState.COLLECTING and resumed.batch_id is not None
    t = lc.cancel(resumed, T0 + 41, SET)
    assert Action.IDLE_CONFIG in t.actions and t.capture.idle_owed
    assert t.capture.judge_unix_s > T0 + 42 and lc.owes_idle(t.capture, T0 + 42)


def test_idle_owed_is_set_by_exactly_the_transitions_that_ask_for_the_idle_config() -> None:
    planned = _open()
    endings = [lc.config_write_failed(planned, "ro fs", T0 + 1, SET),
               lc.expire(planned, T0 + SET.write_timeout_s + 1, SET),
               lc.node_write_result(_open(nodes=("n1",)), "n1", False, "refused", {}, T0 + 1, SET),
               lc.analysis_raised(_analysing(), "boom", T0 + 21, SET),
               lc.analysis_done(_analysing(), "failed", {"detail": "x"}, T0 + 21, SET),
               lc.expire(_analysing(), T0 + 20 + SET.analysis_timeout_s, SET)]
    for cap in _each_in_flight():
        endings += [lc.cancel(cap, T0 + 30, SET), lc.supersede(cap, 1, T0 + 30, SET)]
    assert {t.capture.state for t in endings} == set(lc.IDLE_ENDINGS) | {CaptureState.ANALYSING}
    for t in endings:
        assert t.capture.idle_owed == (Action.IDLE_CONFIG in t.actions), t.capture
    assert sum(t.capture.idle_owed for t in endings) == 3 + 4 + 4  # writes failed; cancels; supersedes
    assert not _open().idle_owed and not _analysed().idle_owed


def test_a_new_generation_supersedes_older_captures_that_still_wait_for_ranks_only() -> None:
    for cap in _each_in_flight():
        t = lc.supersede(cap, 1, T0 + 50, SET)
        if cap.state is CaptureState.ANALYSING:  # its batch is complete: the analysis of the old generation stands
            assert t.capture is cap and not t.events and not t.actions
            continue
        assert t.capture.state is CaptureState.SUPERSEDED and t.events[0].data["generation"] == 1
        assert Action.UNWATCH in t.actions and Action.STOP_ANALYSIS not in t.actions
        assert "data kept" in t.events[0].data["note"]
        assert lc.supersede(cap, 0, T0 + 50, SET).capture is cap  # same generation
    analysed = _analysed()
    assert lc.supersede(analysed, 1, T0 + 50, SET).capture is analysed


# -- restart ----------------------------------------------------------------------------------------------------------
def test_resume_after_a_restart() -> None:
    planned = _open()
    assert lc.resume(planned, T0 + 5, SET).actions == {Action.WRITE_CONFIG, Action.WATCH}
    written = _written(planned)
    assert lc.resume(written, T0 + 5, SET).actions == {Action.WATCH, Action.SCAN}
    late = cap_late = lc.rank_event(_acked(written), _ev(0, "started", step=0), T0 + 5, SET).capture
    after = late.judge_unix_s + 1000  # the coordinator was down past the judgement time
    t = lc.resume(cap_late, after, SET)
    stage = cap_late.deadline_unix_s - cap_late.state_since_unix_s
    grace = min(stage, SET.parse_allowance_s)  # a fresh grace for the final scan (issue 33 #3: never expired at once)
    assert t.capture.deadline_unix_s == after + grace and t.actions == {Action.WATCH, Action.SCAN}
    assert t.capture.judge_unix_s - t.capture.deadline_unix_s == cap_late.judge_unix_s - cap_late.deadline_unix_s
    assert lc.expire(t.capture, after + grace + 49, SET).actions == {Action.SCAN}
    redo = lc.resume(_analysing(), T0 + 40, SET)
    assert redo.capture.state is CaptureState.COLLECTING and "redone" in redo.capture.outcome
    assert redo.actions == {Action.WATCH, Action.SCAN}
    enriching = lc.begin_enrich(_analysed(), T0 + 31, SET).capture
    assert lc.resume(enriching, T0 + 40, SET).capture.state is CaptureState.ANALYSED


@pytest.mark.parametrize("step_s", [3600.0, -3600.0])
def test_a_restart_after_a_wall_clock_step_rebases_deadlines_within_their_stage(step_s: float) -> None:
    """Issue 33 #3: persisted deadlines are wall times; a restart after the clock moved +1 h expired the capture at
    once, and -1 h would hold it an hour longer than its stage."""
    cap = lc.rank_event(_acked(_written(_open())), _ev(0, "started", step=0), T0 + 5, SET).capture
    stage = cap.deadline_unix_s - cap.state_since_unix_s
    now = T0 + 6 + step_s  # restarted a second later, by a clock that moved by step_s
    t = lc.resume(cap, now, SET)
    left = t.capture.deadline_unix_s - now
    assert min(stage, SET.parse_allowance_s) <= left <= stage
    assert lc.expire(t.capture, now + 0.5, SET).actions == frozenset() or left < 0.5
    unchanged = lc.resume(cap, T0 + 6, SET).capture  # no step: the deadline stands as stored
    assert unchanged.deadline_unix_s == cap.deadline_unix_s


def test_every_waiting_state_has_a_finite_deadline_and_final_states_none() -> None:
    cap = _open()
    for state in CaptureState:
        d = lc.deadline_for(cap, state, T0, SET)
        if state in lc.ACTIVE:
            assert d is not None and T0 <= d < T0 + 10**7, state
        else:
            assert d is None, state


# -- matching a rank's event to its capture ----------------------------------------------------------------------------
def test_match_capture_by_id_then_by_torch_npu_step_lines() -> None:
    a = _written(_open())
    b = _written(lc.open_capture(_plan(steps=dict.fromkeys(range(4), 500))[0], world_size=4, profiler_config_path="/c",
                                 writer="coordinator", rank_steps={}, rank_step_time_s={}, rank_backends={}, nodes=[],
                                 now=T0, settings=SET).capture)
    caps = [a, b]
    assert lc.match_capture(caps, _ev(0, "arm_seen", source="hook", capture_id=a.capture_id)) is a
    assert lc.match_capture(caps, _ev(0, "arm_seen", source="hook", capture_id="c-unknown")) is None
    assert lc.match_capture(caps, _ev(0, "arm_seen", start_step=a.start_step)) is a
    assert lc.match_capture(caps, _ev(0, "started", step=b.start_step)) is b
    assert lc.match_capture(caps, _ev(0, "completed", step=a.start_step + a.warmup + a.active)) is a
    assert lc.match_capture(caps, _ev(0, "started", step=7)) is b  # no step matches: the newest scanned capture
    assert lc.match_capture(caps, _ev(0, "arm_seen", start_step=7)) is None


# -- a rank that restarted its step counter -----------------------------------------------------------------------------
def test_a_lagging_rank_gets_its_own_deadline_and_the_verdict_says_steps_are_far_apart() -> None:
    steps = {0: 362, 1: 362, 2: 362, 3: 2}
    cap = _open(steps=steps)
    plan, _ = _plan(steps=steps)
    assert plan.start_step == 362 + plan.lead_steps and plan.step_spread == 360
    # rank 3 needs ~360 more steps to reach start_step: its deadline is that much later than its peers'
    assert cap.ranks[3].window_end_unix_s - cap.ranks[0].window_end_unix_s == pytest.approx(360 * 0.5 * 3)
    assert cap.judge_unix_s == pytest.approx(cap.ranks[3].window_end_unix_s + 100)
    assert any("far apart" in n and "[3]" in n for n in cap.notes)
    cap = _acked(_written(cap))
    part = _batch(cap, "incomplete", ranks=(0, 1, 2), missing=(3,))
    # the peers' data is in, rank 3's is not: at its peers' deadline nothing is judged yet (late data is awaited)
    peers_done = cap.ranks[0].window_end_unix_s + 100
    assert lc.scan_result(cap, part, peers_done, SET).capture.state is not CaptureState.INCOMPLETE
    assert lc.scan_result(cap, _batch(cap), peers_done + 15, SET).capture.state is CaptureState.ANALYSING
    inc = lc.scan_result(cap, part, cap.judge_unix_s, SET).events[0]
    assert any("far apart" in n for n in inc.data["notes"])


def test_a_capture_of_the_lagging_rank_alone_plans_from_that_rank() -> None:
    steps = {0: 362, 1: 2, 2: 362, 3: 362}
    plan, _ = _plan(steps=steps, rank_list=[1])
    assert plan.base_step == 2 and plan.start_step == 2 + plan.lead_steps and plan.rank_list == [1]
    assert list(plan.rank_deadlines_unix_s) == [1]


def test_refusal_names_the_blocking_capture_and_when_it_ends() -> None:
    collecting = lc.rank_event(_acked(_written(_open())), _ev(0, "started", step=0), T0 + 5, SET).capture
    done = _analysed()
    assert lc.blocking_capture([done, collecting]) is collecting
    assert lc.blocking_capture([done]) is None
    text = refusal(collecting, T0 + 10)
    assert collecting.capture_id in text and "collecting" in text and collecting.deadline_unix_s is not None
    # the status view's duration format and deadline name, not "its collecting deadline is in 738 s"
    assert f"its judgement deadline is in {span_text(collecting.deadline_unix_s - (T0 + 10))}" in text
    assert not re.search(r"\d s\b", text), text
    assert "deadline is in 12m18s" in refusal(dataclasses.replace(collecting, deadline_unix_s=T0 + 10 + 738), T0 + 10)
    assert f"profwatch cancel --job j1 --capture {collecting.capture_id}" in text


def test_progress_events_carry_state_and_deadline() -> None:
    t = lc.rank_event(_acked(_written(_open())), _ev(0, "started", step=0), T0 + 5, SET)
    ev = next(e for e in t.events if e.type == TYPE_CAPTURE)
    assert ev.data["state"] == "collecting" and ev.data["deadline_unix_s"] == t.capture.deadline_unix_s


@pytest.mark.parametrize(("step_time_s", "step", "window_s"), [
    (None, 100, 60.0),  # no step time known: ack_timeout_s
    (0.5, 100, 60.0),  # fast steps: ack_timeout_s
    (19.0, 100, 76.0),  # 3 x 19 + 19 s poll: just over the default
    (40.0, 100, 160.0),  # 3 x 40 + 40 s poll
    (100.0, 100, 350.0),  # the poll interval is capped at 50 s
    (40.0, 5, 122.0),  # before step 11 torch_npu polls every 2 s
])
def test_the_ack_deadline_grows_with_the_step_time(step_time_s: float | None, step: int, window_s: float) -> None:
    plan, steps = _plan(steps=dict.fromkeys(range(4), step), times=dict.fromkeys(range(4), step_time_s or 0.5))
    cap = lc.open_capture(plan, world_size=4, profiler_config_path="/cfg/j1", writer="coordinator", rank_steps=steps,
                          rank_step_time_s=dict.fromkeys(range(4), step_time_s) if step_time_s else {},
                          rank_backends=dict.fromkeys(range(4), "torch_npu"), nodes=[], now=T0, settings=SET,
                          step_time_s=step_time_s).capture
    assert lc.ack_window_s(cap, SET) == window_s
    written = _written(cap)
    assert written.deadline_unix_s == T0 + 1 + window_s < cap.judge_unix_s  # the window ends later still


def test_job_end_cancels_captures_whose_window_has_not_started_and_lets_the_others_run() -> None:
    planned, written = _open(), _written(_open())
    acked = _acked(_written(_open()))
    collecting = lc.rank_event(acked, _ev(0, "started", step=acked.start_step), T0 + 5, SET).capture
    for cap in (planned, written, acked):
        t = lc.job_ended(cap, T0 + 700, SET)
        assert t is not None and t.capture.state is CaptureState.CANCELLED, cap.state
        assert "job ended" in t.capture.outcome and t.capture.deadline_unix_s is None
        assert Action.IDLE_CONFIG in t.actions  # a later run in the same folder must not fire the old arm
        assert t.events[0].data["reason"] == "job ended"
    assert collecting.state is CaptureState.COLLECTING
    for cap in (collecting, _analysing(), _analysed()):  # torch_npu may still be parsing: run to the deadline
        assert lc.job_ended(cap, T0 + 700, SET) is None, cap.state


def test_an_older_generations_analysing_capture_does_not_block_a_new_runs_arms() -> None:
    """A new run (``docs/generations.md``) is never held back by the old run's capture: an ``analysing`` capture of
    an older generation has its window behind it; one of the current generation still blocks, as does any older
    capture still waiting for ranks (those are superseded when the generation opens)."""
    collecting = lc.rank_event(_acked(_written(_open())), _ev(0, "started", step=0), T0 + 5, SET).capture
    analysing = dataclasses.replace(collecting, state=lc.CaptureState.ANALYSING)
    assert lc.blocking_capture([analysing], generation=1) is None
    assert lc.blocking_capture([analysing], generation=0) is analysing
    assert lc.blocking_capture([analysing]) is analysing
    assert lc.blocking_capture([collecting], generation=1) is collecting
