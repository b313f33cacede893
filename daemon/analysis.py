"""Analyse one complete batch: stage -> msprof-analyze or Kineto -> rank suspects -> report (composition, I/O).

Used by the coordinator (after a batch closes) and by ``profwatch analyze`` (offline), through the same
:func:`analyze_batch`. It never raises for bad data or tool failures: every outcome is an :class:`AnalysisResult`
with a clear status and a status per recipe (``../shared/docs/field-cases.md`` FC-03, FC-05, FC-06).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

import structlog
from pydantic import BaseModel, ConfigDict, Field

from daemon.adapters import staging
from daemon.adapters.kineto_reader import RECIPE as KINETO_RECIPE
from daemon.adapters.kineto_reader import analyze_torch_batch
from daemon.adapters.msprof_runner import MsprofSettings, run_msprof_analysis
from daemon.adapters.report import write_report
from daemon.core.alerts import (
    TYPE_ANALYSIS_FAILED,
    TYPE_BATCH_INCOMPLETE,
    TYPE_SUSPECT_RANKS,
    judged_ranks,
    suspect_alert_data,
)
from daemon.core.completeness import BatchState
from daemon.core.evidence import ClusterEvidence, RecipeStatus, Suspect
from daemon.core.prof_layout import parse_rank_dir_name
from daemon.core.ranking import RankingSettings, rank_suspects, ranking_notes

log = structlog.get_logger()

AnalysisStatus = Literal["ok", "no_suspect", "partial", "incomplete", "not_applicable", "no_data", "failed"]
"""``ok``: suspects named. ``no_suspect``: every rank's time data analysed, nobody stands out. ``partial``: data
for only some ranks or steps and nobody stands out there (absence is not proven). ``incomplete``: the batch
was not complete (nothing run). ``not_applicable``: the capture cannot answer (text-only export, Level0 / no
communication, groups too small and no time data). ``no_data``: recipes ran but produced nothing usable.
``failed``: staging or a tool failed (see ``recipes``)."""

TIME_RECIPES = ("cluster_time_summary", KINETO_RECIPE)


class AnalysisSettings(BaseModel):
    """Settings of :func:`analyze_batch`: msprof-analyze runs, ranking thresholds, report output."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    msprof: MsprofSettings = Field(default_factory=MsprofSettings)
    ranking: RankingSettings = Field(default_factory=RankingSettings)
    report: bool = True
    report_html: bool = True


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

    @property
    def event_type(self) -> str:
        """CloudEvent type to publish for this result (``daemon.core.alerts`` constants)."""
        if self.status in ("ok", "no_suspect", "partial"):
            return TYPE_SUSPECT_RANKS
        if self.status == "incomplete":
            return TYPE_BATCH_INCOMPLETE
        return TYPE_ANALYSIS_FAILED

    def alert_data(self) -> dict[str, Any]:
        """``data`` of the ``io.profwatch.suspect_ranks.v1`` (or failure) event for this batch."""
        ev = self.evidence
        data = suspect_alert_data(batch_id=self.batch_id, job_id=self.job_id, kind=self.kind, status=self.status,
                                  suspects=self.suspects, summaries=ev.summaries if ev else [],
                                  recipes=self.recipes, paths=self.paths, capture_reason=self.capture_reason,
                                  world_size=self.world_size, notes=self.notes)
        data["detail"] = self.detail
        return data

    def to_json(self) -> dict[str, Any]:
        """``{"status", "batch_id", "kind", "suspects": [{"rank","score","kind","hostname","evidence","rank_dir"}],
        "recipes": {name: status}, "report": path}`` plus ``detail``, ``world_size``, ``capture_reason``,
        ``recipe_details`` {name: RecipeStatus json}, ``slow_rank_votes``, ``judged_ranks`` (ranks with a time
        breakdown: what the verdict covers), ``paths``, ``notes``, ``timings_s``."""
        return {
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


def _overall_status(ev: ClusterEvidence, suspects: list[Suspect], expected: int) -> tuple[AnalysisStatus, str]:
    """Status of a batch whose tools ran (see :data:`AnalysisStatus`)."""
    states = {name: r.status for name, r in ev.recipes.items()}
    have_time = bool(ev.summaries)
    have_votes = bool(ev.slow_rank_votes)
    if not have_time and not have_votes:
        bad = sorted(n for n, s in states.items() if s in ("tool_error", "timeout"))
        if bad:
            return "failed", f"no usable result; failed recipes: {', '.join(bad)}"
        if states and all(s in ("not_applicable", "skipped") for n, s in states.items() if n != "advisor") and any(
                s == "not_applicable" for s in states.values()):
            return "not_applicable", "this capture cannot answer: " + "; ".join(dict.fromkeys(
                r.detail for r in ev.recipes.values() if r.status == "not_applicable"))
        return "no_data", "no recipe produced usable data: " + "; ".join(
            f"{n}={s}" for n, s in sorted(states.items()))
    covered = {s.rank for s in ev.summaries}
    time_ok = any(states.get(n) == "ok" for n in TIME_RECIPES)
    if suspects:
        return "ok", f"{len(suspects)} suspect rank(s); top: rank {suspects[0].rank} ({suspects[0].kind})"
    if not have_time:
        return "partial", "no time breakdown (only slow_rank votes, none strong enough): absence not proven"
    if len(covered) < expected or not time_ok:
        return "partial", (f"time breakdown covers {len(covered)} of {expected} ranks"
                           + ("" if time_ok else f"; time recipe status "
                              f"{[states.get(n) for n in TIME_RECIPES if n in states]}")
                           + ": nobody stands out among them")
    return "no_suspect", f"{len(covered)} ranks analysed: no rank stands out"


def _not_complete(batch: BatchState, result: AnalysisResult) -> None:
    """Status of a batch that is not complete: ``not_applicable`` when every rank is present but failed for the
    same reason (e.g. a text-only export: the capture itself cannot be analysed), else ``incomplete``. A
    ``completeness`` pseudo-recipe carries the reasons."""
    failed = {r: s for r, s in batch.ranks.items() if s.state == "failed"}
    reasons = {s.reasons[0] if s.reasons else "" for s in failed.values()}
    problems = "; ".join(f"rank {p.rank}: {p.reason}" for p in batch.problems[:8])
    if batch.ranks and not batch.missing_ranks and len(failed) == len(batch.ranks) and len(reasons) == 1:
        reason = next(iter(reasons))
        result.status = "not_applicable"
        result.detail = f"every rank of the batch is unusable: {reason}"
        result.recipes["completeness"] = RecipeStatus("completeness", "not_applicable", reason)
        return
    result.status = "incomplete"
    result.detail = f"batch is {batch.status}: missing ranks {batch.missing_ranks}; {problems}".rstrip("; ")
    result.recipes["completeness"] = RecipeStatus("completeness", "no_data", result.detail)


def analyze_batch(batch: BatchState, *, work_dir: Path, settings: AnalysisSettings | None = None,
                  hostnames: dict[int, str] | None = None, capture_reason: str | None = None,
                  job_id: str | None = None, limiter: threading.BoundedSemaphore | None = None,
                  now_unix_s: float | None = None) -> AnalysisResult:
    """Analyse one batch found by ``scan_tree``.

    Args:
        batch: a ``BatchState``; anything but ``complete`` gives status ``incomplete`` without running tools.
        work_dir: folder for ``staging/<batch>/`` and ``results/<batch>/{msprof,report.json,report.html}``.
        settings: defaults when ``None``.
        hostnames: rank -> host (default: parsed from the rank dir names).
        capture_reason, job_id: copied into the result and the report.
        limiter: shared semaphore bounding concurrent msprof-analyze commands (coordinator).
        now_unix_s: report timestamp (default: the wall clock).

    Returns:
        :class:`AnalysisResult`. Never raises for data or tool problems (unexpected exceptions become
        ``failed`` with the error in ``detail``).
    """
    settings = settings or AnalysisSettings()
    t0 = time.monotonic()
    world = len(batch.expected_ranks) or len(batch.ranks)
    result = AnalysisResult(status="failed", batch_id=batch.batch_id, kind=batch.kind, world_size=world,
                            capture_reason=capture_reason, job_id=job_id)
    if batch.status != "complete":
        _not_complete(batch, result)
        return result
    safe = staging.staging_dir_for(batch, Path(work_dir) / "results").name
    out_dir = Path(work_dir) / "results" / safe
    try:
        result = _analyze(batch, result, Path(work_dir), out_dir, settings, hostnames, now_unix_s, limiter)
    except Exception as exc:
        log.exception("analysis_crashed", batch_id=batch.batch_id)
        result.status = "failed"
        result.detail = f"analysis crashed: {exc!r}"
    result.timings_s["total"] = time.monotonic() - t0
    log.info("analysis_finished", batch_id=batch.batch_id, status=result.status,
             suspects=[s.rank for s in result.suspects], total_s=round(result.timings_s["total"], 3))
    return result


def _analyze(batch: BatchState, result: AnalysisResult, work_dir: Path, out_dir: Path, settings: AnalysisSettings,
             hostnames: dict[int, str] | None, now_unix_s: float | None,
             limiter: threading.BoundedSemaphore | None) -> AnalysisResult:
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
        ev = run_msprof_analysis(staged, out_dir / "msprof", settings=settings.msprof, world_size=result.world_size
                                 or len(batch.ranks), limiter=limiter)
    else:
        staged_dirs = {r: str(staged / os.path.basename(os.path.normpath(p))) for r, p in batch.rank_dirs.items()}
        ev = analyze_torch_batch({r: Path(p) for r, p in staged_dirs.items()})
    result.timings_s["tool"] = time.monotonic() - t
    result.evidence = ev
    result.recipes = dict(ev.recipes)
    t = time.monotonic()
    hosts = hostnames_from_dirs(batch.rank_dirs)
    hosts.update(hostnames or {})
    result.suspects = rank_suspects(ev, hostnames=hosts, rank_dirs=batch.rank_dirs, settings=settings.ranking)
    result.notes = list(ev.notes) + ranking_notes(ev, settings.ranking)
    result.status, result.detail = _overall_status(ev, result.suspects, result.world_size or len(batch.ranks))
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
            data = result.alert_data()
            data["advisor"] = ev.advisor
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
