"""Attach "what changed since the reference capture" to an analysed batch, and in its enrich phase what is behind
each change (composition; the rules are pure, in ``daemon/profwatch/core/changes/comparison.py`` and
``detail.py``; ``docs/changes.md``)."""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import structlog

from profwatch.adapters.tools.msprof_runner import MsprofRunner, RunTicket
from profwatch.analysis.result import AnalysisResult
from profwatch.changes.msprof_compare import compare_rank
from profwatch.core.changes.comparison import compare_captures, frequency_changes, impact_hours_per_day, same_role_rank
from profwatch.core.changes.detail import (
    DETAILED_COMPONENTS,
    DetailEntry,
    attach_detail,
    entries_from_compare,
    entries_from_op_totals,
    merge_ranks,
    pick_ranks,
)
from profwatch.core.verdict.evidence import RankStepSummary, RecipeStatus, used_steps

log = structlog.get_logger()

REFERENCE_COMPARE = "reference_compare"
"""Recipe name of the enrich phase's per-operator comparison with the reference (its status in ``recipes``)."""
DETAIL_RANKS = 2
"""Ranks compared operator by operator: those whose step time changed most (each costs one compare run)."""


@dataclass(slots=True)
class ReferenceSide:
    """What the enrich phase needs of the reference: its rank dirs, per-(rank, step) rows and capture kind."""

    rank_dirs: dict[int, str]
    summaries: list[RankStepSummary]
    kind: str
    path: str = ""
    ranks: list[int] = field(default_factory=list)
    """The ranks the comparison covered (``ranks_compared``)."""
    paired: dict[int, int] = field(default_factory=dict)
    """A named rank not in the reference -> the reference rank of the same role it is compared with."""
    step_labels: dict[int, dict[int, int]] = field(default_factory=dict)
    """torch traces: rank -> {own ``ProfilerStep#`` label: step} (``ClusterEvidence.step_labels``)."""

    def ref_rank(self, rank: int) -> int:
        """The reference rank ``rank`` is compared with (itself unless paired)."""
        return self.paired.get(rank, rank)


def attach_comparison(res: AnalysisResult, reference: AnalysisResult, *, reference_path: str,
                      telemetry_baseline_step_s: float | None = None, ranks: list[int] | None = None) -> None:
    """Compare ``res`` with ``reference`` (both analysed: their ``evidence.summaries`` are the per-(rank, step)
    breakdowns) and store the comparison in ``res.comparison``; a note says when either has no time breakdown.
    ``ranks`` restricts the comparison (a named-rank regression). When a ``compute`` or ``communication`` change
    stands, the reference's rank dirs are known and ``res`` still has its enrich phase ahead (``res.followup``),
    :data:`REFERENCE_COMPARE` joins ``res.pending``: the enrich phase fills those changes' ``detail``
    (:func:`detail_changes`). Mutates ``res``; raises nothing."""
    ref_ev, now_ev = reference.evidence, res.evidence
    if ref_ev is None or not ref_ev.summaries or now_ev is None or not now_ev.summaries:
        which = "the reference" if ref_ev is None or not ref_ev.summaries else "this capture"
        res.comparison = None
        res.keep_note(f"no comparison with the reference {reference_path}: {which} has no time breakdown "
                         f"(reference status {reference.status})")
        return
    ref_have = {s.rank for s in ref_ev.summaries}
    subs = {r: found for r in (ranks or []) if r not in ref_have
            and (found := same_role_rank(r, res.groups, reference.groups, ref_have)) is not None}
    cmp = compare_captures(ref_ev.summaries, now_ev.summaries, ranks=ranks, baseline_versions=ref_ev.versions,
                           now_versions=now_ev.versions, baseline_world_size=reference.world_size,
                           now_world_size=res.world_size, telemetry_baseline_step_s=telemetry_baseline_step_s,
                           substitutes=subs, baseline_job=reference.job_id, now_job=res.job_id)
    cmp.changes += frequency_changes(ref_ev.aicore, now_ev.aicore, ranks=ranks)  # hardware: after the timed ones
    out = cmp.to_json()
    out["reference"] = {"path": reference_path, "batch_id": reference.batch_id,
                        "steps": sorted({s.step for s in ref_ev.summaries}),
                        "step_time_s": out["step_time_baseline_s"]}
    hours = impact_hours_per_day(cmp, res.world_size or len(cmp.ranks_compared))
    out["impact_accelerator_hours_per_day"] = None if hours is None else round(hours, 2)
    res.comparison = out
    detailed = any(c.component in DETAILED_COMPONENTS and c.delta_s_per_step for c in cmp.changes)
    follow = res.followup
    if detailed and follow is not None and reference.rank_dirs and hasattr(follow, "reference"):
        follow.reference = ReferenceSide(dict(reference.rank_dirs), list(ref_ev.summaries), reference.kind,
                                         reference_path, list(cmp.ranks_compared), dict(cmp.paired),
                                         {r: dict(m) for r, m in ref_ev.step_labels.items()})
        if REFERENCE_COMPARE not in res.pending:
            res.pending.append(REFERENCE_COMPARE)


def detail_changes(res: AnalysisResult, ref: ReferenceSide, *, now_dirs: Mapping[int, str],
                   now_summaries: Sequence[RankStepSummary], runner: MsprofRunner, out_dir: Path,
                   count: int = DETAIL_RANKS, ticket: RunTicket | None = None,
                   now_step_labels: Mapping[int, Mapping[int, int]] | None = None) -> tuple[RecipeStatus, list[str]]:
    """Compare the ``count`` ranks whose step time changed most (among ``ref.ranks``, present in both captures'
    rank dirs) with the same ranks of the reference, operator by operator, and put what is behind each
    ``compute`` / ``communication`` change into its ``detail`` (``core/changes/detail.py: attach_detail``): Ascend rank
    dirs with ``msprof-analyze compare`` through ``runner`` (a ``MsprofRunner``; its timeout and memory cap,
    enrich priority; one rank after the other), torch.profiler traces with their per-operator totals. A rank whose comparison fails is
    left out; after a compare that timed out or was killed at the memory cap (and none succeeded) the remaining
    ranks are not run (each would hold the enrich slot as long), and the notes say so; the changes keep ``detail`` None when every one fails. Returns the recipe's status and the notes
    to add to the verdict (failures). ``ticket``: the analysis's (``Followup.ticket``): once it is cancelled no further
    compare starts and the status is ``cancelled``. torch traces: each side's totals cover the steps its verdict
    used (``evidence.used_steps``, own step labels from ``now_step_labels`` / ``ref.step_labels``: a truncated
    step is left out as in the comparison). Never raises for tool or data problems."""
    t0 = time.monotonic()
    notes: list[str] = []
    if res.comparison is None:
        return RecipeStatus(REFERENCE_COMPARE, "not_applicable", "no comparison with a reference",
                            phase="enrich"), notes
    candidates = [r for r in ref.ranks if r in now_dirs and ref.ref_rank(r) in ref.rank_dirs]
    ref_rows = [*ref.summaries, *(replace(row, rank=r) for r, q in ref.paired.items()
                                  for row in ref.summaries if row.rank == q)]
    ranks = pick_ranks(ref_rows, now_summaries, ranks=candidates, count=count)
    if not ranks:
        return RecipeStatus(REFERENCE_COMPARE, "not_applicable", "no rank has rank dirs in both captures",
                            phase="enrich", duration_s=round(time.monotonic() - t0, 3)), notes
    per_rank: dict[int, list[DetailEntry]] = {}
    failed: list[str] = []
    last_state: str = "tool_error"
    peak = 0
    steps_ref = _steps(ref_rows)
    steps_now = _steps(now_summaries)
    now_used = used_steps(now_summaries, now_step_labels)
    ref_used = used_steps(ref.summaries, ref.step_labels)
    ticket = ticket or runner.ticket(res.batch_id)
    for r in ranks:
        if runner.cancelled(ticket):
            last_state = "cancelled"
            failed.append(f"rank {r}: not compared (the analysis was cancelled: {runner.cancelled(ticket)})")
            continue
        if last_state in ("timeout", "oom") and not per_rank and failed:
            # the same tool on a rank pair of the same capture: a run stuck until the timeout (or killed at the
            # memory cap) would be again, holding the enrich slot another timeout_s each
            failed.append(f"rank {r}: not compared (the compare before it ended {last_state})")
            continue
        try:
            if res.kind == "ascend_pt" and ref.kind == "ascend_pt":
                sheets, status = compare_rank(runner, Path(now_dirs[r]), Path(ref.rank_dirs[ref.ref_rank(r)]), out_dir,
                                              name=f"{REFERENCE_COMPARE}_rank{r}",
                                              ticket=ticket)
                peak = max(peak, status.peak_rss_bytes or 0)
                last_state = status.status
                if sheets is None:
                    failed.append(f"rank {r}: msprof-analyze compare {status.status}: {status.detail}")
                    continue
                per_rank[r] = entries_from_compare(sheets, steps_baseline=steps_ref.get(r, 1),
                                                   steps_now=steps_now.get(r, 1))
            elif res.kind != "ascend_pt" and ref.kind != "ascend_pt":
                per_rank[r] = _kineto_entries(Path(now_dirs[r]), Path(ref.rank_dirs[ref.ref_rank(r)]),
                                              now_used.get(r, set()), ref_used.get(ref.ref_rank(r), set()))
            else:
                failed.append(f"rank {r}: the captures are of different kinds ({ref.kind}, {res.kind})")
        except Exception as exc:  # noqa: BLE001 - a failed detail never loses the verdict
            log.warning("reference_compare_failed", batch_id=res.batch_id, rank=r, error=repr(exc))
            failed.append(f"rank {r}: {exc!r}")
    took = round(time.monotonic() - t0, 3)
    if failed:
        notes.append("what is behind the changes since the reference is incomplete: " + "; ".join(failed))
    if not per_rank:
        state = last_state if last_state in ("timeout", "oom", "cancelled") else "tool_error"
        return RecipeStatus(REFERENCE_COMPARE, state, "; ".join(failed), phase="enrich",  # type: ignore[arg-type]
                            duration_s=took, peak_rss_bytes=peak or None), notes
    source = "msprof-analyze compare" if res.kind == "ascend_pt" else "kineto op totals"
    stand_ins = [f"rank {r} against reference rank {ref.paired[r]}" for r in sorted(per_rank) if r in ref.paired]
    if stand_ins:
        source += f" ({', '.join(stand_ins)}: same role)"
    put = attach_detail(res.comparison, merge_ranks(per_rank), source=source)
    res.comparison.setdefault("detail_ranks", sorted(per_rank))
    return RecipeStatus(REFERENCE_COMPARE, "ok",
                        f"ranks {sorted(per_rank)} against the reference's same ranks ({source}): {put} {'entry' if put == 1 else 'entries'}"
                        + (f"; failed: {'; '.join(failed)}" if failed else ""),
                        rows=put, phase="enrich", duration_s=took, peak_rss_bytes=peak or None), notes


def _steps(rows: Sequence[RankStepSummary]) -> dict[int, int]:
    by: dict[int, set[int]] = {}
    for r in rows:
        by.setdefault(r.rank, set()).add(r.step)
    return {k: len(v) for k, v in by.items()}


def _kineto_entries(now_dir: Path, ref_dir: Path, now_steps: Collection[int],
                    ref_steps: Collection[int]) -> list[DetailEntry]:
    """Per-operator / kernel totals of the newest trace of each rank dir over the given steps (its own
    ``ProfilerStep#`` labels), per step (``kineto_reader.op_totals_by_kind``)."""
    from profwatch.adapters.tools.kineto_reader import TraceFormatError, find_trace_files, op_totals_by_kind
    from profwatch.core.verdict.kineto import collective_class

    kinds: dict[str, str] = {}

    def totals(d: Path, steps: Collection[int]) -> tuple[dict[str, float], int]:
        files = find_trace_files(d)
        if not files:
            raise TraceFormatError(f"no *.pt.trace.json in {d}")
        by_kind, windows = op_totals_by_kind(max(files, key=lambda p: p.stat().st_mtime), steps)
        if not windows:
            raise TraceFormatError(f"{d}: no ProfilerStep window in its trace among the steps its verdict used "
                                   f"{sorted(steps)}")
        out: dict[str, float] = {}
        for (kind, name), us in by_kind.items():
            out[name] = out.get(name, 0.0) + us
            if kinds.get(name) in (None, "operator"):
                kinds[name] = kind
        return out, windows

    now, n_now = totals(now_dir, now_steps)
    ref, n_ref = totals(ref_dir, ref_steps)
    return entries_from_op_totals(now, ref, steps_now=n_now, steps_baseline=n_ref,
                                  is_collective=lambda name: collective_class(name, "") is not None, kinds=kinds)
