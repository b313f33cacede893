"""What a capture says: the one verdict payload shape, per-rank explanations, the ``status`` view and the arm
refusal text (pure; the lifecycle in ``daemon/profwatch/core/capture/lifecycle.py`` decides, this module words it)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from profwatch.core.alerts.events import suspect_alert_data
from profwatch.core.batches.completeness import BatchState
from profwatch.core.capture.record import ARM_PENDING, DEADLINE_BOUNDS
from profwatch.core.display import span_text

if TYPE_CHECKING:
    from profwatch.core.capture.planner import CapturePlan
    from profwatch.core.capture.record import Capture
    from profwatch.core.fleet.registry import JobState, NodeState

VERDICT_KEYS = ("batch_id", "job_id", "kind", "status", "detail", "capture_id", "capture_reason", "world_size",
                "suspects", "ranks", "recipes", "paths", "report", "notes", "armed_steps", "captured_steps",
                "missing_ranks", "problems", "causes", "analysis_duration_s", "links", "impact", "strength",
                "unjudged_ranks", "judged_ranks", "pending_recipes", "follow_up", "enrich_duration_s", "captured_ranks",
                "op_compare", "changes", "comparison", "one_offs", "waited_for", "verdict_source", "agreement", "hardware")
"""The one payload shape of every verdict (``suspect_ranks``, ``batch_incomplete``, ``analysis_failed``) and of
``report.json`` (which adds the raw per-step ``summaries`` and the advisor's full ``advisor`` message). The enriched
follow-up (``analysis_enriched``) has the same keys: ``pending_recipes`` (what the follow-up will run; [] in it),
``follow_up`` (true in it), ``enrich_duration_s``, ``captured_ranks`` (a targeted capture's ranks, else null) and
``op_compare`` (torch.profiler: each suspect's ops against a reference rank); ``changes`` and ``comparison`` say what
changed since a healthy reference capture (``docs/changes.md``; [] and null without one); ``one_offs`` (ranks slow
in one step only, with their cost) and ``waited_for`` (a targeted capture whose ranks wait for ranks it did not
capture: what they wait and for whom, else null); ``hardware`` (ranks whose AI Core clock ran below their peers',
from ``AICORE_FREQ``: ``profwatch.core.changes.hardware.below_peers``; [] when none or not recorded);
``verdict_source`` says what the verdict was judged on
(``own_tables``: profwatch's reading of each rank's tables, the first Ascend verdict; ``msprof-analyze``; ``kineto``;
null without an analysis) and ``agreement`` whether msprof-analyze confirmed the first verdict
(``profwatch.core.verdict.agreement.Agreement.to_json``; null until it ran)."""
VERDICT_EVENT_KEYS = ("generation", "job_ended")
"""What the published verdict events add to ``VERDICT_KEYS`` (not in ``report.json``): the job ``generation`` the
capture judged (set by the capture shell) and ``job_ended`` (set by the coordinator: that generation ended and has not
reported since, so the verdict is information only; ``docs/alerts.md``)."""


def plan_notes(plan: CapturePlan, covered: Sequence[int], rank_steps: Mapping[int, int],
               rank_backends: Mapping[int, str]) -> list[str]:
    """Remarks fixed at arm time and carried into every verdict: covered ranks whose step counters are further
    apart than the arm lead (a restart or a resume without ``set_step``), covered ranks without a capture backend,
    and for a targeted capture which ranks it covers and why (``plan.targeting``)."""
    notes = []
    known = {r: s for r, s in rank_steps.items() if r in set(covered)}
    if known and plan.step_spread > plan.lead_steps:
        behind = sorted(r for r, s in known.items() if plan.base_step - s > plan.lead_steps)
        notes.append(f"ranks' step counters were far apart at arm time (covered ranks at steps {min(known.values())}"
                     f"..{max(known.values())}): rank(s) {behind} restarted or resumed their counter and reach "
                     f"start_step {plan.start_step} later than the others; each rank has its own deadline")
    no_backend = sorted(r for r in covered if rank_backends.get(r) == "none")
    if no_backend:
        notes.append(f"rank(s) {no_backend} run no capture backend: they cannot capture")
    if plan.targeting:
        est = plan.targeting.get("estimated_bytes")
        notes.append(str(plan.targeting.get("detail") or "targeted capture")
                     + (f"; estimated {est / 2**30:.2f} GiB" if isinstance(est, (int, float)) and est else ""))
    return notes


def window_notes(armed: Sequence[int], captured: Sequence[int]) -> list[str]:
    """A note when the captured steps are not the armed window (a step counter restarted, or foreign dirs)."""
    if captured and armed and not set(captured) & set(armed):
        return [f"captured steps {list(captured)} are not the armed window {list(armed)}: a rank restarted its "
                "step counter, or the dirs are not this capture's"]
    return []


def verdict_payload(cap: Capture, *, status: str, detail: str, batch: BatchState | None = None,
                    missing_ranks: Sequence[int] = (), problems: Sequence[Mapping[str, Any]] = (),
                    causes: Sequence[str] = ()) -> dict[str, Any]:
    """``VERDICT_KEYS`` for a verdict reached without an analysis result (incomplete batch, failed analysis)."""
    captured = list(batch.steps) if batch is not None and batch.steps else sorted(
        {s for r in cap.ranks.values() for s in r.steps})
    base = suspect_alert_data(batch_id=cap.batch_id or (batch.batch_id if batch else cap.capture_id),
                              job_id=cap.job_id, kind=batch.kind if batch is not None else "", status=status,
                              suspects=[], summaries=[], recipes={}, paths={}, capture_reason=cap.reason,
                              world_size=len(cap.ranks), notes=[*cap.notes, *window_notes(cap.armed_steps, captured)])
    return {**base, "detail": detail, "capture_id": cap.capture_id, "report": None, "armed_steps": cap.armed_steps,
            "captured_steps": captured, "missing_ranks": list(missing_ranks), "problems": [dict(p) for p in problems],
            "causes": list(causes), "analysis_duration_s": None, "links": [], "impact": None, "strength": None,
            "unjudged_ranks": [], "pending_recipes": [], "follow_up": False, "enrich_duration_s": None,
            "captured_ranks": list(cap.rank_list) if cap.rank_list is not None else None, "op_compare": [],
            "changes": [], "comparison": None, "one_offs": [], "waited_for": None, "hardware": [], "verdict_source": None,
            "agreement": None}


def explain_ranks(cap: Capture, ranks: Iterable[int], causes: Mapping[int, str]) -> list[str]:
    """One line per rank saying what it did and did not say, with the known cause (node state, backend)."""
    out = []
    for rank in ranks:
        p = cap.ranks.get(rank)
        if p is None:
            continue
        if p.rejected:
            said = f"refused the arm ({p.rejected})"
        elif p.failure:
            said = f"reported its window failed ({p.failure})"
        elif p.completed_unix_s is not None:
            said = "closed its window, but its rank dir is not complete"
        elif p.started_unix_s is not None:
            said = f"started its window but did not close it by {p.window_end_unix_s:.0f}"
        elif p.acknowledged:
            said = (f"took the arm, but its window never started (step {p.step_at_plan} at arm time; start_step "
                    f"{cap.start_step}; expected done by {p.window_end_unix_s:.0f})")
        elif p.backend == "torch_npu" and p.hook_seen_unix_s is not None:
            said = ("the hook read the config but torch_npu never acknowledged it (no 'Start step will be set to "
                    f"{cap.start_step}' in its dp log)")
        else:
            said = "never acknowledged the arm"
        cause = causes.get(rank, "")
        out.append(f"rank {rank}: {said}" + (f"; cause: {cause}" if cause else ""))
    return out


def describe(cap: Capture, now: float) -> dict[str, Any]:
    """The ``status`` view of one capture: state, its deadline and time left, acknowledgements, outcome."""
    acked = sum(1 for p in cap.ranks.values() if p.acknowledged)
    done = sum(1 for p in cap.ranks.values() if p.completed_unix_s is not None)
    return {"capture_id": cap.capture_id, "job_id": cap.job_id, "state": cap.state.value, "reason": cap.reason,
            "generation": cap.generation, "start_step": cap.start_step, "warmup": cap.warmup, "active": cap.active,
            "prof_dir": cap.prof_dir, "writer": cap.writer, "created_unix_s": cap.created_unix_s,
            "state_since_unix_s": cap.state_since_unix_s, "in_state_s": round(now - cap.state_since_unix_s, 1),
            "deadline_unix_s": cap.deadline_unix_s,
            "deadline_in_s": None if cap.deadline_unix_s is None else round(cap.deadline_unix_s - now, 1),
            "judge_unix_s": cap.judge_unix_s, "expected_ranks": len(cap.ranks), "acknowledged_ranks": acked,
            "completed_ranks": done, "node_writes": {n: (None if w.ok is None else ("ok" if w.ok else w.detail))
                                               for n, w in cap.nodes.items()},
            "arm_settled": cap.state not in ARM_PENDING, "profiler_config_path": cap.profiler_config_path,
            "written_unix_s": cap.written_unix_s, "config_mtime_s": cap.config_mtime_s,
            "batch_id": cap.batch_id, "analysis_status": cap.analysis_status, "outcome": cap.outcome,
            "notes": list(cap.notes), "total_bytes": cap.total_bytes}


def refusal(blocker: Capture, now: float) -> str:
    """Why an arm is refused while ``blocker`` is in flight, naming it and when it ends (its deadline)."""
    when = blocker.deadline_unix_s
    what = DEADLINE_BOUNDS.get(blocker.state.value, blocker.state.value)
    ends = f"its {what} deadline is in {span_text(max(0.0, when - now))}" if when is not None else "no deadline"
    return (f"capture {blocker.capture_id} of job {blocker.job_id} is {blocker.state.value} ({ends}); retry after "
            f"it ends, or stop it: profwatch cancel --job {blocker.job_id} --capture {blocker.capture_id}")


def rank_causes(ranks: Iterable[int], job: JobState | None, nodes: Mapping[str, NodeState], now: float,
                node_timeout_s: float) -> dict[int, str]:
    """What the coordinator knows that explains a rank's silence: the rank left or went quiet, its capture
    backend failed to open, its node daemon is down or reported stale torch_npu state (a leftover
    ``DynamicProfileNpuShm*`` segment, an orphaned monitor; ``docs/capture-lifecycle.md``). Ranks with nothing
    known are left out."""
    out: dict[int, str] = {}
    for rank in ranks:
        r = job.ranks.get(rank) if job is not None else None
        if r is None:
            out[rank] = "the rank never said hello"
            continue
        parts = []
        if r.left:
            parts.append("the rank left the job")
        if r.backend == "none" and r.backend_error:
            parts.append(f"no capture backend ({r.backend_error})")
        node = nodes.get(r.node_id)
        if node is None:
            parts.append(f"node {r.node_id or '?'} unknown to the coordinator")
        else:
            if now - node.last_seen_unix_s > node_timeout_s:
                parts.append(f"node {node.node_id} DOWN (last heard {now - node.last_seen_unix_s:.0f} s ago)")
            if node.stale_state:
                parts.append(f"node {node.node_id} reports stale torch_npu state: {node.stale_state}")
        if parts:
            out[rank] = "; ".join(parts)
    return out
