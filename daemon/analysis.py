"""Analyse one complete batch: stage -> msprof-analyze or Kineto -> rank suspects -> report (composition, I/O).

Used by the coordinator (after a batch closes) and by ``profwatch analyze`` (offline), through the same
:func:`analyze_batch`. It never raises for bad data or tool failures: every outcome is an :class:`AnalysisResult`
with a clear status and a status per recipe (docs/field-cases.md#fc-03, #fc-05, #fc-06).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

import structlog

from daemon.adapters import staging
from daemon.adapters.kineto_reader import RECIPE as KINETO_RECIPE
from daemon.adapters.kineto_reader import analyze_torch_batch
from daemon.adapters.msprof_runner import MsprofRunner, run_msprof_analysis
from daemon.adapters.report import write_report
from daemon.core.alerts import judged_ranks, suspect_alert_data
from daemon.core.analysis_settings import AnalysisSettings
from daemon.core.capture_report import window_notes
from daemon.core.completeness import BatchState
from daemon.core.display import printable
from daemon.core.evidence import ClusterEvidence, RecipeStatus, SlowLink, Suspect
from daemon.core.lifecycle import event_type_for
from daemon.core.prof_layout import parse_rank_dir_name
from daemon.core.ranking import Verdict, judge_batch

log = structlog.get_logger()

AnalysisStatus = Literal["ok", "weak", "no_suspect", "partial", "incomplete", "not_applicable", "no_data", "failed"]
"""``ok``: suspects or slow links named on strong evidence, every rank judged. ``weak``: named, but the evidence
rests on too few captured steps (fewer than ``RankingSettings.min_strong_steps``) or fewer steps than armed.
``no_suspect``: every rank's data analysed over the armed window, nobody stands out. ``partial``: some ranks
could not be judged (no usable device data, unparseable trace, missing from the time breakdown, steps that
cannot be aligned) or the window was short and nobody stands out: the suspects named (if any) are among the
judged ranks, absence is not proven. ``incomplete``: the batch was not complete (nothing run).
``not_applicable``: the capture cannot answer (text-only export, Level0 / no communication, groups too small
and no time data). ``no_data``: recipes ran but produced nothing usable. ``failed``: staging or a tool failed
(see ``recipes``). Only ``ok`` and ``no_suspect`` make ``profwatch analyze`` exit 0 (docs/verdicts.md)."""

TIME_RECIPES = ("cluster_time_summary", KINETO_RECIPE)


__all__ = ["AnalysisResult", "AnalysisSettings", "AnalysisStatus", "analyze_batch", "hostnames_from_dirs"]


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
    impact: dict[str, float] | None = None
    armed_steps: list[int] | None = None
    captured_steps: list[int] = field(default_factory=list)
    strength: str | None = None
    unjudged_ranks: dict[int, str] = field(default_factory=dict)
    context: dict[str, Any] = field(default_factory=dict)

    def verdict_json(self) -> dict[str, Any]:
        """The verdict keys shared by ``to_json()`` and ``alert_data()``: ``links``, ``impact`` (headline: every
        suspect and link fixed), ``armed_steps``, ``captured_steps``, ``strength`` and ``unjudged_ranks``
        ``[{"rank", "reason"}]`` (what could not be judged)."""
        return {
            "links": [lk.to_json() for lk in self.links],
            "impact": self.impact,
            "armed_steps": self.armed_steps,
            "captured_steps": list(self.captured_steps),
            "strength": self.strength,
            "unjudged_ranks": [{"rank": r, "reason": why} for r, why in sorted(self.unjudged_ranks.items())],
        }

    @property
    def event_type(self) -> str:
        """CloudEvent type to publish for this result (the one mapping, ``daemon.core.lifecycle.OUTCOMES``)."""
        return event_type_for(self.status)

    def alert_data(self) -> dict[str, Any]:
        """The verdict payload (``daemon.core.capture_report.VERDICT_KEYS`` plus the verdict keys of
        :meth:`verdict_json`): ``data`` of the event for this batch and the body of ``report.json``. ``context``
        (the capture's own fields, e.g. ``capture_id``, ``armed_steps``) is merged in, its ``notes`` appended;
        ``analysis_duration_s`` sums staging, tool and ranking times (what the verdict waited for)."""
        ev = self.evidence
        data = suspect_alert_data(batch_id=self.batch_id, job_id=self.job_id, kind=self.kind, status=self.status,
                                  suspects=self.suspects, summaries=ev.summaries if ev else [],
                                  recipes=self.recipes, paths=self.paths, capture_reason=self.capture_reason,
                                  world_size=self.world_size, notes=self.notes)
        spent = [self.timings_s[k] for k in ("staging", "tool", "ranking") if k in self.timings_s]
        data.update({"detail": self.detail, "capture_id": None, "report": self.paths.get("report_html")
                     or self.paths.get("report_json"), "missing_ranks": [], "problems": [], "causes": [],
                     "analysis_duration_s": round(sum(spent), 3) if spent else None})
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
        ``unjudged_ranks``)."""
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


def _overall_status(ev: ClusterEvidence, verdict: Verdict, expected: int,
                    unjudged: dict[int, str]) -> tuple[AnalysisStatus, str]:
    """Status of a batch whose tools ran (see :data:`AnalysisStatus`); ``unjudged`` is filled with every rank
    that could not be judged and why."""
    states = {name: r.status for name, r in ev.recipes.items()}
    suspects, links = verdict.suspects, verdict.links
    have_time = bool(ev.summaries)
    have_votes = bool(ev.slow_rank_votes)
    if not have_time and not have_votes:
        bad = sorted(n for n, s in states.items() if s in ("tool_error", "timeout"))
        if bad:
            return "failed", f"no usable result; failed recipes: {', '.join(bad)}"
        if states and all(s in ("not_applicable", "skipped", "no_data") for n, s in states.items()
                          if n not in ("advisor", "advisor_html", "communication_matrix")) and any(
                s == "not_applicable" for s in states.values()):
            return "not_applicable", "this capture cannot answer: " + "; ".join(dict.fromkeys(
                r.detail for r in ev.recipes.values() if r.status == "not_applicable"))
        return "no_data", "no recipe produced usable data: " + "; ".join(
            f"{n}={s}" for n, s in sorted(states.items()))
    unjudged.update(ev.unusable_ranks)
    covered = {s.rank for s in ev.summaries}
    judged = covered | set(ev.slow_rank_votes) if not have_time else covered
    for rank, why in (ev.alignment.get("unaligned") or {}).items():
        unjudged.setdefault(int(rank), f"steps not aligned with its peers: {why}")
    if have_time:
        for rank in range(expected):
            if rank not in judged and rank not in unjudged:
                unjudged[rank] = "not in the time breakdown"
    time_ok = any(states.get(n) == "ok" for n in TIME_RECIPES)
    steps = len(verdict.captured_steps)
    window = (f"{steps} of {len(verdict.armed_steps)} armed steps captured" if verdict.armed_steps
              else f"{steps} step(s) captured")
    named = [f"rank {s.rank} ({s.kind})" for s in suspects[:3]] + [f"link {lk.ranks[0]}<->{lk.ranks[1]}"
                                                                    for lk in links[:3]]
    what = f"{len(suspects)} suspect rank(s), {len(links)} slow link(s); top: {', '.join(named)}" if named else ""
    if unjudged:
        names = "; ".join(f"rank {r}: {why}" for r, why in sorted(unjudged.items())[:8])
        more = f" (+{len(unjudged) - 8} more)" if len(unjudged) > 8 else ""
        lead = what + " among the judged ranks" if what else "nobody stands out among the judged ranks"
        return "partial", f"{lead}; {len(unjudged)} rank(s) could not be judged: {names}{more}"
    if not have_time:
        if suspects:
            return "weak", f"{what}: from slow_rank votes only, no time breakdown"
        return "partial", "no time breakdown (only slow_rank votes, none strong enough): absence not proven"
    if not time_ok:
        return "partial", (f"time recipe status {[states.get(n) for n in TIME_RECIPES if n in states]}: "
                           + (what or "nobody stands out") + "; absence not proven")
    if named:
        if verdict.strength == "weak":
            return "weak", f"{what}; evidence is weak: {window}"
        return "ok", f"{what}; {window}"
    if verdict.short_window or not verdict.enough_steps:
        return "partial", f"nobody stands out, but only {window}: absence not proven"
    return "no_suspect", f"{len(covered)} ranks analysed over {window}: no rank stands out"


def _not_complete(batch: BatchState, result: AnalysisResult) -> None:
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


def analyze_batch(batch: BatchState, *, work_dir: Path, settings: AnalysisSettings | None = None,
                  hostnames: dict[int, str] | None = None, capture_reason: str | None = None,
                  job_id: str | None = None, runner: MsprofRunner | None = None,
                  now_unix_s: float | None = None, armed_steps: Sequence[int] | None = None,
                  context: dict[str, Any] | None = None) -> AnalysisResult:
    """Analyse one batch found by ``scan_tree``.

    Args:
        batch: a ``BatchState``; anything but ``complete`` gives status ``incomplete`` without running tools.
        work_dir: folder for ``staging/<batch>/`` and ``results/<batch>/{msprof,report.json,report.html}``;
            made absolute first (tools run from their own folders), so a relative one is relative to the cwd.
        settings: defaults when ``None``.
        hostnames: rank -> host (default: parsed from the rank dir names).
        capture_reason, job_id: copied into the result and the report.
        runner: the :class:`MsprofRunner` that runs msprof-analyze (its settings govern the runs; the
            coordinator shares one across analyses); default: a runner made from ``settings.msprof`` for this
            call and closed after it. The runs are labelled with the batch id (``runner.cancel(batch_id)``).
        now_unix_s: report timestamp (default: the wall clock).
        armed_steps: the steps the capture was armed to record (``[start + warmup, start + warmup + active)``);
            the verdict rates its evidence against them (``None``: ``context["armed_steps"]`` if given, else
            unknown: rated on the captured steps alone).
        context: the capture's fields for the verdict payload (``daemon.core.lifecycle.analysis_context``).

    Returns:
        :class:`AnalysisResult`. Never raises for data or tool problems (unexpected exceptions become
        ``failed`` with the error in ``detail``).
    """
    settings = settings or AnalysisSettings()
    work_dir = Path(work_dir).absolute()
    context = dict(context or {})
    if not armed_steps and context.get("armed_steps"):
        armed_steps = list(context["armed_steps"])
    t0 = time.monotonic()
    world = len(batch.expected_ranks) or len(batch.ranks)
    result = AnalysisResult(status="failed", batch_id=batch.batch_id, kind=batch.kind, world_size=world,
                            capture_reason=capture_reason, job_id=job_id, context=context,
                            armed_steps=list(armed_steps) if armed_steps else None, captured_steps=list(batch.steps))
    unusable = batch.unusable_ranks()
    if batch.status != "complete" and not batch.judgeable():
        _not_complete(batch, result)
        return result
    if unusable:  # every rank present and finished, some without usable data: judge the others (partial)
        result.unjudged_ranks.update(unusable)
        batch = dataclasses.replace(batch, ranks={r: s for r, s in batch.ranks.items() if r not in unusable},
                                    status="complete")
    safe = staging.staging_dir_for(batch, Path(work_dir) / "results").name
    out_dir = Path(work_dir) / "results" / safe
    own_runner = runner is None
    active_runner = runner if runner is not None else MsprofRunner(settings.msprof)
    try:
        result = _analyze(batch, result, work_dir, out_dir, settings, hostnames, now_unix_s, active_runner,
                          world_size=world)
    except Exception as exc:
        log.exception("analysis_crashed", batch_id=batch.batch_id)
        result.status = "failed"
        result.detail = f"analysis crashed: {exc!r}"
    finally:
        if own_runner:
            active_runner.close()
    result.timings_s["total"] = time.monotonic() - t0
    log.info("analysis_finished", batch_id=batch.batch_id, status=result.status,
             suspects=[s.rank for s in result.suspects], total_s=round(result.timings_s["total"], 3))
    return result


def _analyze(batch: BatchState, result: AnalysisResult, work_dir: Path, out_dir: Path, settings: AnalysisSettings,
             hostnames: dict[int, str] | None, now_unix_s: float | None,
             runner: MsprofRunner, *, world_size: int) -> AnalysisResult:
    t = time.monotonic()
    try:
        staged = staging.stage_batch(batch, work_dir / "staging")
    except (staging.StagingError, OSError) as exc:
        result.recipes["staging"] = RecipeStatus("staging", "tool_error", str(exc))
        result.detail = f"staging failed: {exc}"
        return result
    result.paths["staging"] = str(staged)
    result.timings_s["staging"] = time.monotonic() - t
    out_dir.mkdir(parents=True, exist_ok=True)
    t = time.monotonic()
    if batch.kind == "ascend_pt":
        result.paths["outputs"] = str(out_dir / "msprof")
        ev = run_msprof_analysis(staged, out_dir / "msprof", runner=runner, world_size=result.world_size
                                 or len(batch.ranks), owner=batch.batch_id, expected_ranks=sorted(batch.ranks))
    else:
        staged_dirs = {r: str(staged / os.path.basename(os.path.normpath(p))) for r, p in batch.rank_dirs.items()}
        ev = analyze_torch_batch({r: Path(p) for r, p in staged_dirs.items()})
    result.timings_s["tool"] = time.monotonic() - t
    result.evidence = ev
    result.recipes = dict(ev.recipes)
    t = time.monotonic()
    hosts = hostnames_from_dirs(batch.rank_dirs)
    hosts.update(hostnames or {})
    verdict = judge_batch(ev, hostnames=hosts, rank_dirs=batch.rank_dirs, settings=settings.ranking,
                          armed_steps=result.armed_steps, world_size=world_size)
    result.suspects, result.links, result.impact = verdict.suspects, verdict.links, verdict.impact
    result.captured_steps = list(verdict.captured_steps) or result.captured_steps
    result.strength = verdict.strength
    result.notes = list(ev.notes) + verdict.notes
    if ev.alignment:
        result.notes.append(f"step alignment: {ev.alignment.get('method')}"
                            + "".join(f"; {n}" for n in ev.alignment.get("notes", [])))
    result.status, result.detail = _overall_status(ev, verdict, world_size, result.unjudged_ranks)
    result.timings_s["ranking"] = time.monotonic() - t
    for name in ("advisor_html", "advisor"):  # only this run's output dirs (re-runs leave older ones)
        run_dir = ev.recipes[name].output_dir if name in ev.recipes else None
        html_files = sorted(Path(run_dir).rglob("mstt_advisor_*.html")) if run_dir else []
        if html_files:
            result.paths["advisor_html"] = str(html_files[-1])
            break
    if settings.report:
        t = time.monotonic()
        now = time.time() if now_unix_s is None else now_unix_s
        result.paths["report_json"] = str(out_dir / "report.json")
        if settings.report_html:
            result.paths["report_html"] = str(out_dir / "report.html")
        try:
            # printable(): file names as text a UTF-8 file can hold, whatever bytes the OS gave (docs/paths.md)
            data = printable({**result.alert_data(), "advisor": ev.advisor})
            json_path, html_path = write_report(
                out_dir, data, ev.summaries, html_enabled=settings.report_html,
                generated=datetime.fromtimestamp(now, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"))
            result.report = str(html_path or json_path)
        except OSError as exc:
            result.notes.append(f"report not written: {exc}")
            result.paths.pop("report_json", None)
            result.paths.pop("report_html", None)
        result.timings_s["report"] = time.monotonic() - t
    return result
