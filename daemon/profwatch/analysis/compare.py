"""Attach "what changed since the reference capture" to an analysed batch (composition; the rules are pure, in
``daemon/profwatch/core/verdict/changes.py``; ``docs/changes.md``)."""

from __future__ import annotations

from profwatch.analysis.result import AnalysisResult
from profwatch.core.verdict.changes import compare_captures, impact_hours_per_day
from profwatch.core.verdict.hardware import frequency_changes


def attach_comparison(res: AnalysisResult, reference: AnalysisResult, *, reference_path: str,
                      telemetry_baseline_step_s: float | None = None, ranks: list[int] | None = None) -> None:
    """Compare ``res`` with ``reference`` (both analysed: their ``evidence.summaries`` are the per-(rank, step)
    breakdowns) and store the comparison in ``res.comparison``; a note says when either has no time breakdown.
    ``ranks`` restricts the comparison (a named-rank regression). Mutates ``res``; raises nothing."""
    ref_ev, now_ev = reference.evidence, res.evidence
    if ref_ev is None or not ref_ev.summaries or now_ev is None or not now_ev.summaries:
        which = "the reference" if ref_ev is None or not ref_ev.summaries else "this capture"
        res.comparison = None
        res.notes.append(f"no comparison with the reference {reference_path}: {which} has no time breakdown "
                         f"(reference status {reference.status})")
        return
    cmp = compare_captures(ref_ev.summaries, now_ev.summaries, ranks=ranks, baseline_versions=ref_ev.versions,
                           now_versions=now_ev.versions, baseline_world_size=reference.world_size,
                           now_world_size=res.world_size, telemetry_baseline_step_s=telemetry_baseline_step_s)
    cmp.changes += frequency_changes(ref_ev.aicore, now_ev.aicore, ranks=ranks)  # hardware: after the timed ones
    out = cmp.to_json()
    out["reference"] = {"path": reference_path, "batch_id": reference.batch_id,
                        "steps": sorted({s.step for s in ref_ev.summaries}),
                        "step_time_s": out["step_time_baseline_s"]}
    hours = impact_hours_per_day(cmp, res.world_size or len(cmp.ranks_compared))
    out["impact_accelerator_hours_per_day"] = None if hours is None else round(hours, 2)
    res.comparison = out
