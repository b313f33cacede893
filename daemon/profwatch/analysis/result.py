"""The outcome of one batch analysis and the rules for its status (``AnalysisResult``, ``overall_status``): data in,
data out, no I/O. The composition that produces it (staging, tools, ranking, report) is ``daemon/profwatch/analysis/facade.py``."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from profwatch.adapters.tools.kineto_reader import RECIPE as KINETO_RECIPE
from profwatch.core.alerts.events import judged_ranks, suspect_alert_data
from profwatch.core.batches.completeness import BatchState
from profwatch.core.batches.prof_layout import parse_rank_dir_name
from profwatch.core.capture.lifecycle import event_type_for
from profwatch.core.capture.report import window_notes
from profwatch.core.changes.reference import REFERENCE_REASON
from profwatch.core.detection.types import AnomalyKind
from profwatch.core.verdict.evidence import ClusterEvidence, RecipeStatus, SlowLink, Suspect
from profwatch.core.verdict.ranking import Verdict

AnalysisStatus = Literal["ok", "weak", "no_suspect", "partial", "incomplete", "not_applicable", "no_data", "failed"]
"""``ok``: suspects or slow links named on strong evidence, every rank judged. ``weak``: named, but the evidence
rests on too few captured steps (fewer than ``RankingSettings.min_strong_steps``) or fewer steps than armed.
``no_suspect``: every rank's data analysed over the armed window, nobody stands out. ``partial``: some ranks
could not be judged (no usable device data, unparseable trace, missing from the time breakdown, steps that
cannot be aligned) or the window was short and nobody stands out: the suspects named (if any) are among the
judged ranks, absence is not proven. ``incomplete``: the batch was not complete (nothing run).
``not_applicable``: the capture cannot answer (text-only export, Level0 / no communication, groups too small
and no time data, a single rank with a time breakdown: no peer to compare it with). ``no_data``: recipes ran but produced nothing usable. ``failed``: staging or a tool failed
(see ``recipes``). Only ``ok`` and ``no_suspect`` make ``profwatch analyze`` exit 0 (docs/verdicts.md)."""

TIME_RECIPES = ("cluster_time_summary", KINETO_RECIPE, "own_tables")


__all__ = ["AnalysisResult", "AnalysisStatus", "ENRICH_ONLY", "hostnames_from_dirs", "overall_status"]

ENRICH_ONLY = ("advisor", "advisor_html", "communication_matrix", "kineto_op_compare", "suspect_compare")
"""Recipes of the enrich phase: what they find refines a verdict, never decides whether there is one."""


@dataclass(slots=True)
class AnalysisResult:
    """Outcome of one batch analysis; ``to_json()`` is the ``profwatch analyze --json`` shape."""

    status: AnalysisStatus
    batch_id: str
    kind: str
    suspects: list[Suspect] = field(default_factory=list)
    recipes: dict[str, RecipeStatus] = field(default_factory=dict)
    report: str | None = None
    evidence: ClusterEvidence | None = None
    detail: str = ""
    world_size: int | None = None
    capture_reason: str | None = None
    job_id: str | None = None
    paths: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    timings_s: dict[str, float] = field(default_factory=dict)
    links: list[SlowLink] = field(default_factory=list)
    impact: dict[str, Any] | None = None
    armed_steps: list[int] | None = None
    captured_steps: list[int] = field(default_factory=list)
    strength: str | None = None
    unjudged_ranks: dict[int, str] = field(default_factory=dict)
    context: dict[str, Any] = field(default_factory=dict)
    pending: list[str] = field(default_factory=list)
    """Recipes of the enrich phase still to run (``analysis_enriched`` follows); [] once enriched or when none."""
    enriched: bool = False
    captured_ranks: list[int] | None = None
    """The ranks the batch holds when they are a subset of the job (a targeted capture), else None."""
    one_offs: list[dict[str, Any]] = field(default_factory=list)
    """Ranks slow in one step only, with the cost (``profwatch.core.verdict.ranking.find_one_offs``)."""
    waited_for: dict[str, Any] | None = None
    """A targeted capture whose ranks wait for uncaptured ranks (``profwatch.core.verdict.subset.wait_outside``)."""
    hardware: list[dict[str, Any]] = field(default_factory=list)
    """Ranks whose AI Core clock ran below their peers' (``profwatch.core.changes.hardware.below_peers``)."""
    op_compare: list[dict[str, Any]] = field(default_factory=list)
    """The drill-down (enrich phase): ``[{"rank", "reference_rank", "steps", "source", "ops": [...]}]``, each suspect
    against its median peer (``core/verdict/drilldown.py``; torch ``kineto_reader.compare_suspects``, Ascend
    ``analysis.drilldown.compare_ascend_suspects``)."""
    comparison: dict[str, Any] | None = None
    """What changed since a healthy reference capture (``profwatch.core.changes.comparison.Comparison.to_json`` plus
    ``reference`` {path, batch_id, steps, step_time_s} and ``impact_accelerator_hours_per_day``); None without one."""
    verdict_source: str | None = None
    """What the verdict was judged on: ``own_tables`` (the first Ascend verdict), ``msprof-analyze``, ``kineto``."""
    agreement: dict[str, Any] | None = None
    """Whether msprof-analyze confirmed the first verdict (``Agreement.to_json``); None until it ran."""
    kept_notes: list[str] = field(default_factory=list, repr=False)
    """Notes added after a judge (a comparison that could not be made, a report not written): :meth:`keep_note`
    puts them in ``notes`` and here, so the enrich phase's judge, which rebuilds ``notes``, keeps them."""
    followup: Any = field(default=None, repr=False)
    """What the enrich phase needs (``profwatch.analysis.facade.Followup``); None once it ran. Not serialised."""
    rank_dirs: dict[int, str] = field(default_factory=dict, repr=False)
    """rank -> rank dir of the ranks analysed (a later capture's enrich phase compares its ranks with these when
    this is its reference, ``profwatch.changes.compare``). Not serialised."""
    groups: dict[str, tuple[int, ...]] = field(default_factory=dict, repr=False)
    """The communication groups smaller than the world its ranks recorded (``BatchState.parallel_groups``): which
    reference rank plays a named rank's role (``changes.same_role_rank``). Not serialised."""

    def keep_note(self, text: str) -> None:
        """Append ``text`` to ``notes`` so that it survives a later judge (:attr:`kept_notes`)."""
        self.notes.append(text)
        self.kept_notes.append(text)

    def verdict_json(self) -> dict[str, Any]:
        """The verdict keys shared by ``to_json()`` and ``alert_data()``: ``links``, ``impact`` (headline: every
        suspect and link fixed), ``armed_steps``, ``captured_steps``, ``strength``, ``unjudged_ranks``
        ``[{"rank", "reason"}]`` (what could not be judged), ``one_offs`` (ranks slow in one step only, with
        their cost: ``find_one_offs``), ``waited_for`` (a targeted capture's ranks wait for uncaptured ranks:
        ``wait_outside``; else None), ``hardware`` (ranks whose AI Core clock ran below their peers':
        ``hardware.below_peers``; [] when none or not recorded), ``changes`` (what changed since the reference capture, ``docs/changes.md``;
        [] without one) and ``comparison`` (the whole comparison, or None)."""
        return {
            "links": [lk.to_json() for lk in self.links],
            "impact": self.impact,
            "armed_steps": self.armed_steps,
            "captured_steps": list(self.captured_steps),
            "strength": self.strength,
            "unjudged_ranks": [{"rank": r, "reason": why} for r, why in sorted(self.unjudged_ranks.items())],
            "one_offs": [dict(o) for o in self.one_offs],
            "waited_for": dict(self.waited_for) if self.waited_for is not None else None,
            "hardware": [dict(h) for h in self.hardware],
            "changes": list((self.comparison or {}).get("changes", [])),
            "comparison": self.comparison,
            "verdict_source": self.verdict_source,
            "agreement": self.agreement,
        }

    @property
    def event_type(self) -> str:
        """CloudEvent type to publish for this result (the one mapping, ``profwatch.core.capture.lifecycle.OUTCOMES``)."""
        return event_type_for(self.status)

    def alert_data(self) -> dict[str, Any]:
        """The verdict payload (``profwatch.core.capture.report.VERDICT_KEYS`` plus the verdict keys of
        :meth:`verdict_json`): ``data`` of the event for this batch and the body of ``report.json``. ``context``
        (the capture's own fields, e.g. ``capture_id``, ``armed_steps``) is merged in, its ``notes`` appended;
        ``analysis_duration_s`` sums staging, tool and ranking times (what the verdict waited for);
        ``enrich_duration_s`` is the enrich phase's wall time (None before it ran); ``pending_recipes`` the
        recipes of the enrich phase still to come (their ``analysis_enriched`` follows), ``follow_up`` whether
        this payload is that follow-up; ``captured_ranks`` the ranks of a targeted capture (None = all)."""
        ev = self.evidence
        data = suspect_alert_data(batch_id=self.batch_id, job_id=self.job_id, kind=self.kind, status=self.status,
                                  suspects=self.suspects, summaries=ev.summaries if ev else [],
                                  recipes=self.recipes, paths=self.paths, capture_reason=self.capture_reason,
                                  world_size=self.world_size, notes=self.notes)
        spent = [self.timings_s[k] for k in ("staging", "tool", "ranking") if k in self.timings_s]
        data.update({"detail": self.detail, "capture_id": None, "report": self.paths.get("report_html")
                     or self.paths.get("report_json"), "missing_ranks": [], "problems": [], "causes": [],
                     "analysis_duration_s": round(sum(spent), 3) if spent else None,
                     "enrich_duration_s": round(self.timings_s["enrich"], 3) if "enrich" in self.timings_s else None,
                     "pending_recipes": list(self.pending), "follow_up": self.enriched,
                     "captured_ranks": list(self.captured_ranks) if self.captured_ranks is not None else None,
                     "op_compare": list(self.op_compare)})
        data.update(self.verdict_json())
        ctx = dict(self.context)
        extra_notes = list(ctx.pop("notes", []))
        ctx.pop("armed_steps", None)  # already in verdict_json (the analysis was handed the same window)
        data.update(ctx)
        data["armed_steps"] = data["armed_steps"] or []
        data["notes"] = [*data["notes"], *extra_notes, *window_notes(data["armed_steps"], data["captured_steps"])]
        return data

    def to_json(self) -> dict[str, Any]:
        """``{"status", "batch_id", "kind", "suspects": [{"rank","score","kind","hostname","evidence","rank_dir"}],
        "recipes": {name: status}, "report": path}`` plus ``detail``, ``world_size``, ``capture_reason``,
        ``recipe_details`` {name: RecipeStatus json}, ``slow_rank_votes``, ``judged_ranks`` (ranks with a time
        breakdown: what the verdict covers), ``paths``, ``notes``, ``timings_s`` and the verdict keys of
        :meth:`verdict_json` (``links``, ``impact``, ``armed_steps``, ``captured_steps``, ``strength``,
        ``unjudged_ranks``, ``changes``, ``comparison``)."""
        return {**self.verdict_json(),
            "status": self.status,
            "batch_id": self.batch_id,
            "kind": self.kind,
            "suspects": [s.to_json() for s in self.suspects],
            "recipes": {name: r.status for name, r in self.recipes.items()},
            "report": self.report,
            "detail": self.detail,
            "world_size": self.world_size,
            "capture_reason": self.capture_reason,
            "recipe_details": {name: r.to_json() for name, r in self.recipes.items()},
            "slow_rank_votes": dict(self.evidence.slow_rank_votes) if self.evidence else {},
            "judged_ranks": judged_ranks(self.evidence.summaries) if self.evidence else [],
            "paths": dict(self.paths),
            "notes": list(self.notes),
            "timings_s": {k: round(v, 4) for k, v in self.timings_s.items()},
            "pending_recipes": list(self.pending),
            "follow_up": self.enriched,
            "captured_ranks": list(self.captured_ranks) if self.captured_ranks is not None else None,
            "op_compare": list(self.op_compare),
        }


def hostnames_from_dirs(rank_dirs: dict[int, str]) -> dict[int, str]:
    """rank -> host from rank dir names ``{host}_{pid}_{ts}_{kind}`` (torch_npu's worker name defaults to the
    hostname); ranks whose dir name does not parse are left out."""
    out = {}
    for rank, path in rank_dirs.items():
        parsed = parse_rank_dir_name(os.path.basename(os.path.normpath(path)))
        if parsed is not None:
            out[rank] = parsed.worker
    return out


def overall_status(ev: ClusterEvidence, verdict: Verdict, expected: int | Sequence[int],
                   unjudged: dict[int, str], *, waited_for: Mapping[str, Any] | None = None,
                   subset: bool = False) -> tuple[AnalysisStatus, str]:
    """Status of a batch whose tools ran (see :data:`AnalysisStatus`); ``unjudged`` is filled with every rank
    that could not be judged and why. ``expected``: the ranks the batch holds (a count means ``0..n-1``; a
    targeted capture gives its rank list, so ranks it never captured are not "unjudged"). Recipes of the enrich
    phase (:data:`ENRICH_ONLY`) never decide whether there is a verdict. ``subset``: the batch is a targeted
    capture (its verdict speaks of the captured ranks only); ``waited_for``: its ranks wait for uncaptured ranks
    (``profwatch.core.verdict.subset.wait_outside``): then nobody standing out is ``partial``, not ``no_suspect``,
    and a suspect's verdict carries the text too. Steps: :func:`_status_without_data` (no breakdown, no votes),
    :func:`_fill_unjudged`, then :func:`_status_of_verdict`."""
    states = {name: r.status for name, r in ev.recipes.items()}
    if not ev.summaries and not ev.slow_rank_votes:
        return _status_without_data(ev, states)
    covered = _fill_unjudged(ev, expected, unjudged)
    suspects, links = verdict.suspects, verdict.links
    named = [f"rank {s.rank} ({s.kind})" for s in suspects[:3]] + [f"link {lk.ranks[0]}<->{lk.ranks[1]}"
                                                                    for lk in links[:3]]
    what = f"{len(suspects)} suspect rank(s), {len(links)} slow link(s); top: {', '.join(named)}" if named else ""
    if unjudged:
        names = "; ".join(f"rank {r}: {why}" for r, why in sorted(unjudged.items())[:8])
        more = f" (+{len(unjudged) - 8} more)" if len(unjudged) > 8 else ""
        lead = what + " among the judged ranks" if what else "nobody stands out among the judged ranks"
        return "partial", f"{lead}; {len(unjudged)} rank(s) could not be judged: {names}{more}"
    if not ev.summaries:
        if suspects:
            return "weak", f"{what}: from slow_rank votes only, no time breakdown"
        return "partial", "no time breakdown (only slow_rank votes, none strong enough): absence not proven"
    if not any(states.get(n) == "ok" for n in TIME_RECIPES):
        return "partial", (f"time recipe status {[states.get(n) for n in TIME_RECIPES if n in states]}: "
                           + (what or "nobody stands out") + "; absence not proven")
    return _status_of_verdict(verdict, what, len(covered), waited_for=waited_for, subset=subset)


def _status_without_data(ev: ClusterEvidence, states: Mapping[str, str]) -> tuple[AnalysisStatus, str]:
    """:func:`overall_status` of a batch with neither a time breakdown nor slow_rank votes: ``failed`` (a recipe
    of the alert phase failed), ``not_applicable`` (every one could not answer or was skipped, one at least
    ``not_applicable``) or ``no_data``."""
    bad = sorted(n for n, s in states.items() if s in ("tool_error", "timeout", "oom", "cancelled")
                 and n not in ENRICH_ONLY)
    if bad:
        return "failed", f"no usable result; failed recipes: {', '.join(bad)}"
    if states and all(s in ("not_applicable", "skipped", "no_data") for n, s in states.items()
                      if n not in ENRICH_ONLY) and any(
            s == "not_applicable" for s in states.values()):
        return "not_applicable", "this capture cannot answer: " + "; ".join(dict.fromkeys(
            r.detail for r in ev.recipes.values() if r.status == "not_applicable"))
    return "no_data", "no recipe produced usable data: " + "; ".join(
        f"{n}={s}" for n, s in sorted(states.items()))


def _fill_unjudged(ev: ClusterEvidence, expected: int | Sequence[int], unjudged: dict[int, str]) -> set[int]:
    """Add to ``unjudged`` the ranks :func:`overall_status` could not judge (unusable data, steps not aligned, and
    with a time breakdown an expected rank missing from it); return the ranks the time breakdown covers."""
    unjudged.update(ev.unusable_ranks)
    covered = {s.rank for s in ev.summaries}
    judged = covered | set(ev.slow_rank_votes) if not ev.summaries else covered
    for rank, why in (ev.alignment.get("unaligned") or {}).items():
        unjudged.setdefault(int(rank), f"steps not aligned with its peers: {why}")
    if ev.summaries:
        for rank in (range(expected) if isinstance(expected, int) else expected):
            if rank not in judged and rank not in unjudged:
                unjudged[rank] = "not in the time breakdown"
    return covered


def _status_of_verdict(verdict: Verdict, what: str, covered: int, *, waited_for: Mapping[str, Any] | None,
                       subset: bool) -> tuple[AnalysisStatus, str]:
    """:func:`overall_status` once every expected rank was judged on a time breakdown the time recipe gave:
    ``ok`` / ``weak`` when ``what`` names suspects or links, else ``partial`` (waits outside a targeted capture,
    a short window), ``not_applicable`` (one rank) or ``no_suspect``. ``covered``: ranks in the breakdown."""
    steps = len(verdict.captured_steps)
    window = (f"{steps} of {len(verdict.armed_steps)} armed steps captured" if verdict.armed_steps
              else f"{steps} step(s) captured")
    once = "".join(f"; {o['text']}" for o in verdict.one_offs[:3])
    if waited_for is not None:
        once = f"; {waited_for['text']}{once}"
        if not what:
            return "partial", f"nobody stands out among the {covered} captured ranks{once}"
    if what:
        if verdict.strength == "weak":
            return "weak", f"{what}; evidence is weak: {window}{once}"
        return "ok", f"{what}; {window}{once}"
    if verdict.compared_ranks < 2:
        return "not_applicable", f"one rank with a time breakdown ({window}): no peer to compare it with"
    if verdict.short_window or not verdict.enough_steps:
        return "partial", f"nobody stands out, but only {window}: absence not proven{once}"
    among = " (a targeted capture: the uncaptured ranks are not judged)" if subset else ""
    return "no_suspect", f"{covered} ranks analysed over {window}: no rank stands out{among}{once}"


_SIGNAL_WORDS = {"own": "own work", "late": "peers' wait for it", "comm": "collective time not explained by waiting",
                 "link": "link time"}


def _named_in_reason(reason: str) -> list[int]:
    """The ranks of ``"... ranks [1, 2]"`` in an arming reason (``[]`` when it names none or cannot be read)."""
    inside = reason.rsplit(" ranks [", 1)[-1].split("]", 1)[0]
    return [int(t) for t in inside.replace(",", " ").split() if t.isdigit()]


def _near_miss_text(near: Mapping[str, Any]) -> str:
    """One named rank's evidence from :func:`~profwatch.core.verdict.ranking.find_near_misses`, e.g. ``rank 1: own
    work +26.6% of the step over 10 steps, z 3.46 where 4.00 is needed (step-to-step noise 26.3% of a step, 8.30%
    on its pooled value)``; in a small group also its step-by-step test (``near["paired"]``, docs/verdicts.md "Small
    groups"), e.g. ``; step by step p 0.016 where 0.005 is needed (its 8 steps give at best 0.0078)``. The text
    names the rule that decided: the z (or p) when it fell short, else the effect-size rule (an excess under
    ``min_effect_frac`` of the step) or the consistency rules; a z or p that passed is never written as short."""
    what = _SIGNAL_WORDS.get(str(near["signal"]), str(near["signal"]))
    z, need = float(near["z"]), float(near["z_needed"])
    effect = float(near["effect_frac"])
    min_effect = near.get("min_effect_frac")
    if z < need:
        verdict = f"z {z:.2f} where {need:.2f} is needed"
    elif min_effect is not None and effect < float(min_effect):
        verdict = (f"z {z:.2f} passed ({need:.2f} needed) but the excess is under the {100 * float(min_effect):.1f}% "
                   "of the step the effect-size rule needs")
    else:
        verdict = f"z {z:.2f} passed ({need:.2f} needed) but not named by the consistency rules"
    text = (f"rank {near['rank']}: {what} +{100 * effect:.1f}% of the step over {near['steps']} "
            f"steps, {verdict} (step-to-step noise {100 * float(near['within_sigma_frac']):.1f}% of a step, "
            f"{100 * float(near['noise_sigma_frac']):.2f}% on its pooled value)")
    paired = near.get("paired")
    if isinstance(paired, Mapping):
        p, alpha = float(paired["p"]), float(paired["alpha"])
        if p > alpha:
            text += f"; step by step p {p:.2g} where {alpha:.2g} is needed"
            if not paired.get("decides", True):
                text += f" (its {paired['steps']} steps give at best {float(paired['min_p']):.2g})"
        elif float(paired["effect_frac"]) < float(paired["delta_frac"]):
            text += (f"; step by step p {p:.2g} passed ({alpha:.2g} needed) but its mean excess "
                     f"{100 * float(paired['effect_frac']):+.1f}% is under the {100 * float(paired['delta_frac']):.1f}% "
                     "of the step the effect-size rule needs")
        elif not paired.get("passed", False):
            text += (f"; step by step p {p:.2g} passed ({alpha:.2g} needed) but its excess is not above "
                     f"{100 * float(paired['delta_frac']):.1f}% of the step once steps within the tie floor count as ties")
        else:
            text += f"; step by step p {p:.2g} passed ({alpha:.2g} needed)"
    return text


def armed_for_note(capture_reason: str | None, near_misses: Sequence[Mapping[str, Any]] = ()) -> str:
    """What a ``no_suspect`` detail adds about why the capture was armed: ``""`` for none or a reference capture;
    ``"; armed for rank_outlier +35% at step 120 ranks [2], which this capture does not confirm ..."`` when
    detection named ranks; ``"; armed for step_regression +25% at step 120: the whole job, no single rank"`` for a
    job-wide one. ``capture_reason`` is the arming policy's text (``profwatch.core.arming.policy.describe_anomaly``);
    any other reason (a manual capture's ``"manual"`` or an operator's own text, a reference capture) adds ``""``:
    detection armed nothing. ``near_misses`` (the verdict's, :func:`~profwatch.core.verdict.ranking.find_near_misses`):
    when a named rank is among them, the note gives its excess, z and the noise it was measured against (a real
    slowdown below the batch's noise, e.g. on CPU-starved ranks) instead of guessing that the slowdown passed."""
    reason = (capture_reason or "").strip()
    if not reason or reason == REFERENCE_REASON or reason.split(" ", 1)[0] not in get_args(AnomalyKind):
        return ""
    if " ranks [" not in reason:
        return f"; armed for {reason}: the whole job, no single rank"
    named = set(_named_in_reason(reason))
    seen = [_near_miss_text(n) for n in near_misses if n.get("rank") in named]
    if seen:
        return f"; armed for {reason}, which this capture does not confirm at its noise: " + "; ".join(seen)
    return (f"; armed for {reason}, which this capture does not confirm (the slowdown may have passed or fall"
            " outside the captured steps)")


def named_elsewhere_note(capture_reason: str | None, suspect_ranks: Sequence[int]) -> str:
    """What an ``ok`` or ``weak`` detail adds when detection armed the capture for named ranks and the capture names
    none of them: ``"; armed for rank_outlier +30% at step 4408 ranks [1], not named by this capture: ..."``, so an
    alert naming another rank says that the detector and the capture disagree. ``""`` when no suspect is named, the
    reason names no rank (a job-wide change, a manual or reference capture) or a named rank is among the suspects.
    Seen live: a 2-rank gloo TP pair on a shared 2-core host, rank 1 with 1.3x the work named on its CPU time per
    step, and its capture's 10 steps, in which rank 0's matmuls ran 3.8x longer under CPU contention, named rank 0."""
    reason = (capture_reason or "").strip()
    if not suspect_ranks or not reason or reason == REFERENCE_REASON \
            or reason.split(" ", 1)[0] not in get_args(AnomalyKind) or " ranks [" not in reason:
        return ""
    named = set(_named_in_reason(reason))
    if not named or named & set(suspect_ranks):
        return ""
    return (f"; armed for {reason}, not named by this capture: the detector and the capture disagree (on a host whose "
            "cores the ranks share, another rank can run slower in the captured steps); see the report and the next "
            "capture")


def not_complete(batch: BatchState, result: AnalysisResult) -> None:
    """Status of a batch that is not complete: ``not_applicable`` when every rank is present but failed for the
    same reason (e.g. a text-only export: the capture itself cannot be analysed), else ``incomplete``. A
    ``completeness`` pseudo-recipe carries the reasons."""
    failed = {r: s for r, s in batch.ranks.items() if s.state == "failed"}
    reasons = {s.reasons[0] if s.reasons else "" for s in failed.values()}
    if batch.ranks and not batch.missing_ranks and len(failed) == len(batch.ranks) and len(reasons) == 1:
        reason = next(iter(reasons))
        result.status = "not_applicable"
        result.detail = f"every rank of the batch is unusable: {reason}"
        result.recipes["completeness"] = RecipeStatus("completeness", "not_applicable", reason)
        return
    result.status = "incomplete"
    result.detail = f"batch is {batch.status}: {batch.describe()}"
    result.recipes["completeness"] = RecipeStatus("completeness", "no_data", result.detail)
