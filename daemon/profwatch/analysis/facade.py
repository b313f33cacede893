"""Analyse one complete batch in two phases (composition, I/O).

1. **Alert** (:func:`analyze_batch`): stage -> the per-rank breakdown the verdict needs (Ascend: profwatch's own
   reading of each rank's tables, ``own_tables``, docs/msprof-analyze.md#own-tables; when those cannot carry it,
   msprof-analyze cluster_time_summary and slow_rank, concurrently where the runner allows; or the Kineto
   breakdown of torch.profiler captures) -> rank suspects -> ``report.json`` + ``report.html``. Its result is
   what ``suspect_ranks`` publishes at once.
2. **Enrich** (:func:`enrich_analysis`): after a first verdict on the own tables, msprof-analyze cluster_time_summary
   and slow_rank as its confirmation (the agreement stated in ``result.agreement``); then the rest
   (msprof-analyze communication_matrix_sum for slow links, the
   advisor under its size rule; for torch.profiler captures each suspect's ops against a reference rank's) -> the
   verdict judged again on the fuller evidence -> ``report.json`` and ``report.html`` rewritten. Its result is
   what ``analysis_enriched`` publishes.

Used by the coordinator (the capture shell runs the phases apart, the alert first) and by ``profwatch analyze``
(offline, both in a row). It never raises for bad data or tool failures: every outcome is an
:class:`AnalysisResult` with a clear status and a status per recipe (docs/field-cases.md#fc-03, #fc-05, #fc-06); a
recipe that fails, times out or is killed at its memory cap is a status, never a lost verdict.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import structlog

from profwatch.adapters.fs import staging
from profwatch.adapters.outputs.report import write_report
from profwatch.adapters.outputs.report_charts import PLOTLY_ASSET
from profwatch.adapters.tools.kineto_reader import OP_COMPARE, TraceRead, analyze_torch_batch, compare_suspects
from profwatch.adapters.tools.kineto_reader import RECIPE as KINETO_RECIPE
from profwatch.adapters.tools.msprof_analysis import (
    MsprofSession,
    Progress,
    advisor_commands,
    prepare_msprof,
    run_phase,
)
from profwatch.adapters.tools.msprof_db import own_comm_waits
from profwatch.adapters.tools.msprof_runner import MsprofRunner, RunTicket
from profwatch.adapters.tools.own_tables_reader import Signature, read_batch_aicore, read_batch_tables
from profwatch.analysis.drilldown import DRILL_SUSPECTS, SUSPECT_COMPARE, compare_ascend_suspects
from profwatch.analysis.result import (
    AnalysisResult,
    AnalysisStatus,
    armed_for_note,
    hostnames_from_dirs,
    named_elsewhere_note,
    not_complete,
    overall_status,
)
from profwatch.changes.compare import REFERENCE_COMPARE, ReferenceSide, detail_changes
from profwatch.core.alerts.events import per_rank_summary
from profwatch.core.batches.completeness import BatchState
from profwatch.core.batches.prof_layout import PROFILER_OUTPUT_DIR
from profwatch.core.changes.hardware import below_peers
from profwatch.core.display import printable
from profwatch.core.verdict.agreement import compare_verdicts
from profwatch.core.verdict.drilldown import median_peer
from profwatch.core.verdict.evidence import ClusterEvidence, RecipeStatus, used_steps
from profwatch.core.verdict.link_rows import LinkRows
from profwatch.core.verdict.msprof_plan import ALERT_RECIPES, advisor_ranks, enrich_recipe_names
from profwatch.core.verdict.own_tables import RankTables, combine_rank_tables, unusable_reason
from profwatch.core.verdict.ranking import Verdict, judge_batch
from profwatch.core.verdict.settings import AnalysisSettings
from profwatch.core.verdict.subset import wait_outside

log = structlog.get_logger()

OWN_TABLES = "own_tables"
"""Recipe name and ``verdict_source`` of the first Ascend verdict, judged on profwatch's own reading of each rank's
tables (docs/msprof-analyze.md#own-tables)."""

__all__ = ["AnalysisResult", "AnalysisSettings", "AnalysisStatus", "Followup", "Progress", "analyze_batch",
           "enrich_analysis", "hostnames_from_dirs"]


@dataclass(slots=True)
class Followup:
    """What the enrich phase of one analysis needs from its alert phase (kept on the result, not serialised)."""

    batch: BatchState
    work_dir: Path
    out_dir: Path
    settings: AnalysisSettings
    hostnames: dict[int, str]
    job_world: int
    base_unjudged: dict[int, str] = field(default_factory=dict)
    now_unix_s: float | None = None
    session: MsprofSession | None = None
    staged: Path | None = None
    prefetched: Mapping[str, tuple[Signature, RankTables]] | None = None
    reference: ReferenceSide | None = None
    """The reference to compare operator by operator (set by ``compare.attach_comparison``; ``reference_compare``)."""
    prefetched_traces: Mapping[str, TraceRead] | None = None
    ticket: RunTicket | None = None
    """Issued with the analysis (owner: the batch id), used by every enrich run: once the analysis (or every
    analysis, at shutdown) is cancelled, no further tool run starts and each step reports ``cancelled``."""
    temp_staging: Path | None = None
    """The staging root under the system's temporary folder when ``work_dir/staging`` is not a path
    msprof-analyze takes (``staging.fresh_staging_root``); removed when the analysis is over."""
    assets_dir: Path | None = None
    """Where the report pages' shared chart script goes (``write_report``'s ``assets_dir``); None: ``out_dir``'s
    parent."""

    def staging_root(self) -> Path:
        """Where this analysis stages its batch: ``work_dir/staging``, or (an odd ``work_dir``) a fresh folder of
        the system's temporary folder, made on first use and kept until :meth:`release`. Raises OSError."""
        if self.temp_staging is not None:
            return self.temp_staging
        root, temporary = staging.fresh_staging_root(self.work_dir / "staging")
        if temporary:
            self.temp_staging = root
        return root

    def stage(self, batch: BatchState) -> Path:
        """``staging.stage_batch`` of ``batch`` under :meth:`staging_root`. Raises StagingError, OSError."""
        return staging.stage_batch(batch, self.staging_root())

    def release(self) -> None:
        """Remove a temporary staging root (links and our folders only); nothing for one under ``work_dir``."""
        if self.temp_staging is not None:
            staging.release_staging(self.temp_staging)
            self.temp_staging = None

    def hosts(self) -> dict[int, str]:
        """rank -> host: parsed from the rank dir names, overridden by the hostnames the ranks reported."""
        hosts = hostnames_from_dirs(self.batch.rank_dirs)
        hosts.update(self.hostnames)
        return hosts

    def judge(self, ev: ClusterEvidence, armed_steps: Sequence[int] | None) -> Verdict:
        """:func:`judge_batch` on ``ev`` with this batch's hosts, rank dirs, ranking settings and job world size."""
        return judge_batch(ev, hostnames=self.hosts(), rank_dirs=self.batch.rank_dirs, settings=self.settings.ranking,
                           armed_steps=armed_steps, world_size=self.job_world)


def analyze_batch(batch: BatchState, *, work_dir: Path, settings: AnalysisSettings | None = None,
                  hostnames: dict[int, str] | None = None, capture_reason: str | None = None,
                  job_id: str | None = None, runner: MsprofRunner | None = None,
                  now_unix_s: float | None = None, armed_steps: Sequence[int] | None = None,
                  context: dict[str, Any] | None = None, enrich: bool = True,
                  progress: Progress | None = None,
                  prefetched: Mapping[str, tuple[Signature, RankTables]] | None = None,
                  prefetched_traces: Mapping[str, TraceRead] | None = None,
                  assets_dir: Path | None = None) -> AnalysisResult:
    """Analyse one batch found by ``scan_tree``: the alert phase, then (``enrich``) the enrich phase.

    Args:
        batch: a ``BatchState``; anything but ``complete`` (or judgeable) gives status ``incomplete`` without
            running tools.
        work_dir: folder for ``staging/<batch>/`` and ``results/<batch>/{msprof,report.json,report.html}``;
            made absolute first (tools run from their own folders), so a relative one is relative to the cwd.
        settings: defaults when ``None``.
        hostnames: rank -> host (default: parsed from the rank dir names).
        capture_reason, job_id: copied into the result and the report.
        runner: the :class:`MsprofRunner` that runs msprof-analyze (its settings govern the runs; the
            coordinator shares one across analyses); default: a runner made from ``settings.msprof`` for this
            call and closed after it (then the enrich phase, if wanted, runs here too). The runs are labelled
            with the batch id (``runner.cancel(batch_id)``).
        now_unix_s: report timestamp (default: the wall clock).
        armed_steps: the steps the capture was armed to record (``[start + warmup, start + warmup + active)``);
            the verdict rates its evidence against them (``None``: ``context["armed_steps"]`` if given, else
            unknown: rated on the captured steps alone).
        context: the capture's fields for the verdict payload (``profwatch.core.capture.lifecycle.analysis_context``);
            ``job_world_size`` there is the job's size when the batch holds a subset (a targeted capture).
        enrich: run the enrich phase before returning (offline); ``False`` returns after the alert phase with
            ``result.pending`` naming what :func:`enrich_analysis` would run (the coordinator publishes first).
        progress: called per recipe (``Progress``), and with ``("verdict", status, None)`` once the alert
            phase's verdict stands.
        prefetched: rank dir path -> (DB signature, tables) read as each rank dir completed
            (``own_tables_reader.TablePrefetcher``); the own-tables read uses those still valid.
        prefetched_traces: rank dir path -> torch.profiler trace parsed as each rank dir finished
            (``kineto_reader.TracePrefetcher``); the Kineto breakdown uses those whose file is unchanged.
        assets_dir: the folder of the report pages' shared chart script (``plotly-<version>.min.js``; the
            coordinator's work dir, shared by every capture); default ``work_dir/results`` (the folder of this
            batch's report folder).

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
    # the job's size: the capture's context, else what the rank dirs' metadata say (profwatch_world_size or the
    # world group's members), so a targeted capture re-read offline is still a subset
    said = max((s.world_size or 0 for s in batch.ranks.values()), default=0)
    job_world = int(context.pop("job_world_size", 0) or 0) or max(said, world)
    expected = sorted(batch.expected_ranks)
    # a subset (targeted capture) whenever the job has more ranks than the batch, also a prefix such as 0-3 of 8
    subset = expected if expected and (job_world > len(expected) or expected != list(range(len(expected)))) \
        else None
    result = AnalysisResult(status="failed", batch_id=batch.batch_id, kind=batch.kind, world_size=job_world,
                            capture_reason=capture_reason, job_id=job_id, context=context,
                            armed_steps=list(armed_steps) if armed_steps else None, captured_steps=list(batch.steps),
                            captured_ranks=subset, rank_dirs=dict(batch.rank_dirs),
                            groups=batch.parallel_groups())
    unusable = batch.unusable_ranks()
    if batch.status != "complete" and not batch.judgeable():
        not_complete(batch, result)
        return result
    if unusable:  # every rank present and finished, some without usable data: judge the others (partial)
        result.unjudged_ranks.update(unusable)
        batch = dataclasses.replace(batch, ranks={r: s for r, s in batch.ranks.items() if r not in unusable},
                                    status="complete")
    safe = staging.staging_dir_for(batch, Path(work_dir) / "results").name
    out_dir = Path(work_dir) / "results" / safe
    own_runner = runner is None
    active_runner = runner if runner is not None else MsprofRunner(settings.msprof)
    follow = Followup(batch, work_dir, out_dir, settings, dict(hostnames or {}), job_world, dict(unusable),
                      now_unix_s, prefetched=prefetched, prefetched_traces=prefetched_traces,
                      ticket=active_runner.ticket(batch.batch_id), assets_dir=assets_dir)
    try:
        try:
            result = _alert_phase(result, follow, active_runner, progress)
        except Exception as exc:
            log.exception("analysis_crashed", batch_id=batch.batch_id)
            result.status = "failed"
            result.detail = f"analysis crashed: {exc!r}"
            result.pending, result.followup = [], None
        result.timings_s["total"] = time.monotonic() - t0
        log.info("analysis_finished", batch_id=batch.batch_id, status=result.status, phase="alert",
                 suspects=[s.rank for s in result.suspects], total_s=round(result.timings_s["total"], 3),
                 pending=result.pending)
        if progress is not None:
            progress("verdict", result.status, None)
        if enrich and result.pending:
            enrich_analysis(result, runner=active_runner, progress=progress)
    finally:
        if own_runner:
            active_runner.close()
            follow.ticket = None  # a later enrich_analysis runs on another runner: its tickets, its serials
        if not result.pending:  # nothing left to read the staged links (a later enrich stages again)
            _release_staging(result, follow)
    return result


def _release_staging(result: AnalysisResult, f: Followup) -> None:
    """Remove the analysis's temporary staging root, if it had one (an odd ``work_dir``), and its path from the
    result (what is gone is not shown)."""
    root = f.temp_staging
    if root is None:
        return
    try:
        f.release()
    except OSError as exc:
        log.warning("staging_release_failed", batch_id=result.batch_id, error=str(exc))
    if result.paths.get("staging", "").startswith(f"{root}{os.sep}"):
        result.paths.pop("staging", None)


def _alert_phase(result: AnalysisResult, f: Followup, runner: MsprofRunner,
                 progress: Progress | None) -> AnalysisResult:
    batch, settings = f.batch, f.settings
    own: ClusterEvidence | None = None
    t = time.monotonic()
    if batch.kind == "ascend_pt" and settings.own_tables:
        # the first verdict on the ranks' own tables, read in place (no staging: msprof-analyze, which needs it,
        # runs after the alert and stages then)
        own = _own_tables_evidence(batch, settings, progress, f.prefetched)
        f.prefetched = None
    t_own = time.monotonic() - t
    staged: Path | None = None
    if own is None:
        t = time.monotonic()
        try:
            staged = f.stage(batch)
        except (staging.StagingError, OSError) as exc:
            result.recipes["staging"] = RecipeStatus("staging", "tool_error", str(exc))
            result.detail = f"staging failed: {exc}"
            return result
        result.paths["staging"] = str(staged)
        f.staged = staged
        result.timings_s["staging"] = time.monotonic() - t
    f.out_dir.mkdir(parents=True, exist_ok=True)
    t = time.monotonic() - t_own
    pending: list[str] = []
    if batch.kind == "ascend_pt":
        result.paths["outputs"] = str(f.out_dir / "msprof")
        if own is not None:  # msprof-analyze confirms the first verdict after the alert
            ev = own
            result.verdict_source = OWN_TABLES
            pending = [*ALERT_RECIPES, *enrich_recipe_names(settings.msprof)]
        else:
            assert staged is not None
            ev, f.session = prepare_msprof(staged, f.out_dir / "msprof", runner=runner, world_size=len(batch.ranks),
                                           owner=batch.batch_id, expected_ranks=sorted(batch.ranks),
                                           progress=progress, settings=settings.msprof, ticket=f.ticket)
            run_phase(f.session, ev, "alert", runner=runner, progress=progress)
            ev.aicore = read_batch_aicore(batch.rank_dirs, workers=settings.own_tables_workers)
            result.verdict_source = "msprof-analyze"
            pending = f.session.plan.recipe_names("enrich")
        if result.captured_ranks is not None:  # a subset: its ranks' own waits show waits for uncaptured ranks
            ev.own_waits = {r: w for r, p in batch.rank_dirs.items() if (w := own_comm_waits(
                Path(p) / PROFILER_OUTPUT_DIR / "analysis.db"))}
    else:
        assert staged is not None
        result.verdict_source = "kineto"
        staged_dirs = {r: str(staged / staging.staged_name(p)) for r, p in batch.rank_dirs.items()}
        if progress is not None:
            progress("started", KINETO_RECIPE, None)
        ahead = {r: got for r, p in batch.rank_dirs.items() if (got := (f.prefetched_traces or {}).get(p)) is not None}
        f.prefetched_traces = None
        ev = analyze_torch_batch({r: Path(p) for r, p in staged_dirs.items()}, armed_steps=result.armed_steps,
                                 prefetched=ahead)
        if progress is not None and KINETO_RECIPE in ev.recipes:
            progress("finished", KINETO_RECIPE, ev.recipes[KINETO_RECIPE])
    result.timings_s["tool"] = time.monotonic() - t
    result.evidence = ev
    t = time.monotonic()
    _judge(result, ev, f)
    result.timings_s["ranking"] = time.monotonic() - t
    if batch.kind != "ascend_pt" and settings.kineto_op_compare and result.suspects and len(batch.ranks) > 1:
        pending.append(OP_COMPARE)
    if batch.kind == "ascend_pt" and settings.suspect_compare and result.suspects and len(batch.ranks) > 1:
        pending.append(SUSPECT_COMPARE)
    result.pending = pending
    result.followup = f  # kept without pending too: a comparison with a reference may add reference_compare
    _write_report(result, f, html=settings.report_html)
    return result


def enrich_analysis(result: AnalysisResult, *, runner: MsprofRunner,
                    progress: Progress | None = None) -> AnalysisResult:
    """The enrich phase of ``result`` (from :func:`analyze_batch` with ``enrich=False``), in place: msprof-analyze
    ``communication_matrix`` and ``advisor`` (``advisor_html`` when asked for) at low priority through ``runner``,
    the advisor under its size rule (``msprof_plan.advisor_ranks``: on a batch above ``advisor_max_ranks`` ranks
    it reads a staging of the suspects and reference ranks only, or is skipped, the reason in its status); then
    the verdict is judged again on the fuller evidence (slow links, the advisor's per-rank link times) and
    ``report.json`` + ``report.html`` are rewritten. ``result.enriched`` is set, ``result.pending`` cleared,
    ``timings_s["enrich"]`` measured. A result with nothing pending is returned unchanged.

    Never raises for tool failures (statuses) or crashes (noted; the alert-phase verdict stands): returns the
    result with ``enrich_error`` in ``context`` in that case.
    """
    f: Followup | None = result.followup
    if f is None or not result.pending:
        return result
    t0 = time.monotonic()
    ev = result.evidence or ClusterEvidence(kind="ascend_pt")
    f.ticket = f.ticket or runner.ticket(result.batch_id)
    try:
        if result.verdict_source == OWN_TABLES and f.session is None:
            ev = _confirm_first_verdict(result, ev, f, runner, progress)
        if f.session is not None:
            _enrich_msprof(result, ev, f, runner, progress)
        if REFERENCE_COMPARE in result.pending and f.reference is not None:
            _enrich_reference(result, ev, f, runner, progress)
        result.evidence = ev
        _judge(result, ev, f)
        if _drill_down(result, ev, f, runner, progress):
            result.recipes = dict(ev.recipes)
        result.timings_s["enrich"] = time.monotonic() - t0
        result.enriched = True
        result.pending = []
        _write_report(result, f, html=f.settings.report_html)
        # the links are judged and reported: the rows (a million pairs take ~150 MiB) stay in the result DB, not
        # in a result that the caller keeps (the CLI while it analyses the next batch)
        ev.link_rows = LinkRows()
    except Exception as exc:
        log.exception("enrichment_crashed", batch_id=result.batch_id)
        result.context["enrich_error"] = repr(exc)
        result.pending = []
        result.timings_s["enrich"] = time.monotonic() - t0
    finally:
        result.followup = None
        _release_staging(result, f)
    log.info("analysis_enriched", batch_id=result.batch_id, status=result.status,
             recipes={k: v.status for k, v in result.recipes.items()}, enrich_s=round(result.timings_s["enrich"], 3))
    if progress is not None:
        progress("follow_up", result.status, None)
    return result


def _own_tables_evidence(batch: BatchState, settings: AnalysisSettings, progress: Progress | None,
                         prefetched: Mapping[str, tuple[Signature, RankTables]] | None = None,
                         ) -> ClusterEvidence | None:
    """The first verdict's evidence from each rank's own tables (docs/msprof-analyze.md#own-tables), read by a pool of
    ``settings.own_tables_workers`` threads; None when they cannot carry it (``own_tables.unusable_reason``: the
    caller runs msprof-analyze's alert recipes instead, whose statuses name the problem)."""
    if progress is not None:
        progress("started", OWN_TABLES, None)
    t = time.monotonic()
    tables, read_s = read_batch_tables(batch.rank_dirs, workers=settings.own_tables_workers, prefetched=prefetched)
    own = combine_rank_tables(tables)
    why = unusable_reason(tables, own)
    took = time.monotonic() - t
    if why is not None:
        log.info("own_tables_unusable", batch_id=batch.batch_id, reason=why, read_s=round(read_s, 3))
        if progress is not None:
            progress("finished", OWN_TABLES, RecipeStatus(OWN_TABLES, "no_data", why, duration_s=took))
        return None
    status = RecipeStatus(OWN_TABLES, "ok", f"{len(own.summaries)} rank-step rows from {len(tables)} rank dirs' own "
                          f"tables ({own.instances} collective instances); msprof-analyze confirms after the alert",
                          tables=["STEP_TIME", "COMMUNICATION_OP", "StepTraceTime"], rows=len(own.summaries),
                          duration_s=took)
    ev = ClusterEvidence(kind="ascend_pt", summaries=own.summaries, collectives_per_step=own.collectives_per_step,
                         recipes={OWN_TABLES: status},
                         aicore={r: t.aicore for r, t in tables.items() if t.aicore is not None})
    ev.notes += own.notes
    log.info("own_tables_read", batch_id=batch.batch_id, ranks=len(tables), rows=len(own.summaries),
             prefetched=len(prefetched or {}), read_s=round(read_s, 3), total_s=round(took, 3))
    if progress is not None:
        progress("finished", OWN_TABLES, status)
    return ev


def _confirm_first_verdict(result: AnalysisResult, first_ev: ClusterEvidence, f: Followup, runner: MsprofRunner,
                           progress: Progress | None) -> ClusterEvidence:
    """msprof-analyze's alert recipes (cluster_time_summary, slow_rank) after a first verdict on the own tables; the
    verdict judged on their evidence is compared with the first (``compare_verdicts``) and the outcome stated in
    ``result.agreement``, the notes and, for a disagreement, the detail. Returns the evidence the enriched verdict is
    judged on: msprof-analyze's, or the own rows again when cluster_time_summary gave none (said in the notes)."""
    batch = f.batch
    try:
        f.staged = f.stage(batch)
    except (staging.StagingError, OSError) as exc:
        first_ev.recipes["staging"] = RecipeStatus("staging", "tool_error", str(exc), phase="enrich")
        result.agreement = {"agree": None, "sentence": f"msprof-analyze could not confirm the first verdict: staging "
                            f"failed: {exc}"}
        return first_ev
    result.paths["staging"] = str(f.staged)
    ev, f.session = prepare_msprof(f.staged, f.out_dir / "msprof", runner=runner, world_size=len(batch.ranks),
                                   owner=batch.batch_id, expected_ranks=sorted(batch.ranks), progress=progress,
                                   settings=f.settings.msprof, ticket=f.ticket)
    run_phase(f.session, ev, "alert", runner=runner, progress=progress)
    ev.recipes[OWN_TABLES] = first_ev.recipes[OWN_TABLES]
    ev.own_waits = first_ev.own_waits
    ev.aicore = first_ev.aicore
    first_suspects = list(result.suspects)
    if not ev.summaries:
        ev.summaries = list(first_ev.summaries)
        ev.collectives_per_step = ev.collectives_per_step or first_ev.collectives_per_step
        state = ev.recipes.get("cluster_time_summary")
        result.agreement = {"agree": None, "sentence": "msprof-analyze could not confirm the first verdict: "
                            f"cluster_time_summary {state.status if state else 'did not run'}; the verdict stands "
                            "on profwatch's own reading of the rank tables"}
        return ev
    confirmed = f.judge(ev, result.armed_steps)
    agreement = compare_verdicts(first_ev.summaries, first_suspects, ev.summaries, confirmed.suspects)
    result.agreement = agreement.to_json()
    result.verdict_source = "msprof-analyze"
    log.info("first_verdict_checked", batch_id=batch.batch_id, agree=agreement.agree,
             first=agreement.first_suspects, confirmed=agreement.confirmed_suspects,
             max_diff_frac=round(agreement.max_diff_frac, 5))
    return ev


def _drill_down(result: AnalysisResult, ev: ClusterEvidence, f: Followup, runner: MsprofRunner,
                progress: Progress | None) -> bool:
    """The drill-down (docs/verdicts.md#drill-down) of the FINAL ranking's suspects (judged on the enrich phase's
    evidence: msprof-analyze's confirmation of an Ascend first verdict, slow links, the advisor), not of the alert
    phase's: ``kineto_op_compare`` (torch) or ``suspect_compare`` (Ascend) when its setting is on and the batch has
    peers. One that the alert phase announced (``pending``) but whose final ranking names nobody is ``skipped``,
    with the reason. Returns whether a recipe status was set."""
    ascend = f.batch.kind == "ascend_pt"
    name = SUSPECT_COMPARE if ascend else OP_COMPARE
    if not (f.settings.suspect_compare if ascend else f.settings.kineto_op_compare) or len(f.batch.ranks) < 2:
        return False
    if not result.suspects:
        if name not in result.pending:
            return False
        ev.recipes[name] = RecipeStatus(name, "skipped", "the final verdict names no suspect rank", phase="enrich")
        if progress is not None:
            progress("finished", name, ev.recipes[name])
        return True
    if ascend:
        _enrich_ascend_suspects(result, ev, f, runner, progress)
    else:
        _enrich_kineto(result, ev, f, progress)
    return True


def _enrich_kineto(result: AnalysisResult, ev: ClusterEvidence, f: Followup, progress: Progress | None) -> None:
    """torch.profiler follow-up: the top suspects' ops against the rank nearest the median step time."""
    if progress is not None:
        progress("started", OP_COMPARE, None)
    staged = f.staged or Path(".")
    dirs = {r: staged / staging.staged_name(p) for r, p in f.batch.rank_dirs.items()}
    named = [s.rank for s in result.suspects[:DRILL_SUSPECTS]]
    reference = median_peer({row["rank"]: row["step_time_us"] for row in per_rank_summary(ev.summaries)}, named)
    if reference is None:
        ev.recipes[OP_COMPARE] = RecipeStatus(OP_COMPARE, "not_applicable", "no rank to compare with", phase="enrich")
    else:
        result.op_compare, ev.recipes[OP_COMPARE] = compare_suspects(
            dirs, named, reference, used_steps(ev.summaries, ev.step_labels))
    if progress is not None:
        progress("finished", OP_COMPARE, ev.recipes[OP_COMPARE])


def _enrich_ascend_suspects(result: AnalysisResult, ev: ClusterEvidence, f: Followup, runner: MsprofRunner,
                            progress: Progress | None) -> None:
    """Ascend drill-down: each of the top suspects against its median peer with ``msprof-analyze compare``
    (``analysis.drilldown``); a failure is the recipe's status, the verdict stands."""
    if progress is not None:
        progress("started", SUSPECT_COMPARE, None)
    named = [s.rank for s in result.suspects[:DRILL_SUSPECTS]]
    peer = median_peer({row["rank"]: row["step_time_us"] for row in per_rank_summary(ev.summaries)}, named)
    if peer is None:
        ev.recipes[SUSPECT_COMPARE] = RecipeStatus(SUSPECT_COMPARE, "not_applicable", "no rank to compare with",
                                                   phase="enrich")
    else:
        result.op_compare, ev.recipes[SUSPECT_COMPARE] = compare_ascend_suspects(
            runner, f.batch.rank_dirs, named, peer, ev.summaries, f.out_dir / SUSPECT_COMPARE,
            batch_id=result.batch_id, ticket=f.ticket)
    if progress is not None:
        progress("finished", SUSPECT_COMPARE, ev.recipes[SUSPECT_COMPARE])


def _enrich_reference(result: AnalysisResult, ev: ClusterEvidence, f: Followup, runner: MsprofRunner,
                      progress: Progress | None) -> None:
    """What is behind each change since the reference: the ranks that changed most against the reference's same
    ranks, operator by operator (``compare.detail_changes``); a failure is a status and a note."""
    assert f.reference is not None
    if progress is not None:
        progress("started", REFERENCE_COMPARE, None)
    status, notes = detail_changes(result, f.reference, now_dirs=f.batch.rank_dirs, now_summaries=ev.summaries,
                                   runner=runner, out_dir=f.out_dir / REFERENCE_COMPARE, ticket=f.ticket,
                                   now_step_labels=ev.step_labels)
    ev.recipes[REFERENCE_COMPARE] = status
    ev.notes += notes
    if progress is not None:
        progress("finished", REFERENCE_COMPARE, status)


def _enrich_msprof(result: AnalysisResult, ev: ClusterEvidence, f: Followup, runner: MsprofRunner,
                   progress: Progress | None) -> None:
    """The msprof-analyze commands of the enrich phase, the advisor under its size rule."""
    session = f.session
    assert session is not None
    cmds = [c for c in session.plan.phase("enrich") if c.name not in ("advisor", "advisor_html")]
    advisor = advisor_commands(session, None)
    why = ""
    if advisor:
        times = {row["rank"]: row["step_time_us"] for row in per_rank_summary(ev.summaries)}
        subset, why = advisor_ranks(sorted(f.batch.ranks), [s.rank for s in result.suspects], times, f.hosts(),
                                    f.settings.msprof)
        if subset == []:
            for c in advisor:
                ev.recipes[c.name] = RecipeStatus(c.name, "skipped", why, phase="enrich")
                if progress is not None:
                    progress("finished", c.name, ev.recipes[c.name])
            advisor = []
        elif subset is not None:
            part = dataclasses.replace(f.batch, batch_id=f"{f.batch.batch_id}-advisor-subset",
                                       ranks={r: s for r, s in f.batch.ranks.items() if r in set(subset)})
            try:
                advisor = advisor_commands(session, f.stage(part))
            except (staging.StagingError, OSError) as exc:
                for c in advisor:
                    ev.recipes[c.name] = RecipeStatus(c.name, "tool_error", f"{why}; staging failed: {exc}",
                                                      phase="enrich")
                advisor = []
    run_phase(session, ev, "enrich", runner=runner, commands=[*cmds, *advisor], progress=progress)
    if why:
        for c in advisor:
            if c.name in ev.recipes:
                ev.recipes[c.name].detail = f"{why}; {ev.recipes[c.name].detail}"


def _judge(result: AnalysisResult, ev: ClusterEvidence, f: Followup) -> None:
    """Judge the batch on ``ev`` (again, after the enrich phase) and set the verdict fields of ``result``."""
    batch = f.batch
    verdict = f.judge(ev, result.armed_steps)
    result.recipes = dict(ev.recipes)
    result.suspects, result.links, result.impact = verdict.suspects, verdict.links, verdict.impact
    result.one_offs = list(verdict.one_offs)
    result.captured_steps = list(verdict.captured_steps) or result.captured_steps
    result.strength = verdict.strength
    result.notes = list(ev.notes) + verdict.notes + result.kept_notes
    if ev.alignment:
        result.notes.append(f"step alignment: {ev.alignment.get('method')}"
                            + "".join(f"; {n}" for n in ev.alignment.get("notes", [])))
    unjudged = dict(f.base_unjudged)
    result.waited_for = wait_outside(ev.summaries, ev.own_waits, result.captured_ranks, f.job_world,
                                     min_effect_frac=f.settings.ranking.min_effect_frac) \
        if result.captured_ranks is not None else None
    result.status, result.detail = overall_status(ev, verdict, sorted(batch.expected_ranks) or len(batch.ranks),
                                                  unjudged, waited_for=result.waited_for,
                                                  subset=result.captured_ranks is not None)
    if result.status == "no_suspect":
        result.detail += armed_for_note(result.capture_reason, verdict.near_misses)
    elif result.status in ("ok", "weak"):
        result.detail += named_elsewhere_note(result.capture_reason, [s.rank for s in result.suspects])
    result.unjudged_ranks = unjudged
    result.hardware = below_peers(ev.aicore)
    if result.hardware:
        result.notes += [h["text"] for h in result.hardware[:8]]
        named = {s.rank for s in result.suspects}
        slow_clock = [h for h in result.hardware if h["rank"] in named]
        if slow_clock:
            result.detail = (f"{result.detail}; " + "; ".join(
                f"rank {h['rank']}'s AI Core ran at {h['busy_mhz']:.0f} MHz against its peers' {h['peers_mhz']:.0f}"
                " MHz (hardware)" for h in slow_clock[:4]))
    if result.verdict_source == OWN_TABLES:
        result.notes.append("first verdict: judged on profwatch's own reading of each rank's tables "
                            "(docs/msprof-analyze.md#own-tables); msprof-analyze confirms it in the follow-up")
    if result.agreement:
        result.notes.append(str(result.agreement.get("sentence", "")))
        if result.agreement.get("agree") is False:
            result.detail = f"{result.detail}; {result.agreement.get('sentence')}"
    for name in ("advisor_html", "advisor"):  # only this run's output dirs (re-runs leave older ones)
        run_dir = ev.recipes[name].output_dir if name in ev.recipes else None
        html_files = sorted(Path(run_dir).rglob("mstt_advisor_*.html")) if run_dir else []
        if html_files:
            result.paths["advisor_html"] = str(html_files[-1])
            break


def rewrite_report(result: AnalysisResult, now_unix_s: float) -> None:
    """Rewrite the ``report.json`` (and ``report.html``) already written for ``result`` from the result as it stands
    (``analyze --baseline`` attaches its comparison after the analysis); nothing when no report was written. An
    unwritable folder is a note, never a failure."""
    json_path = result.paths.get("report_json")
    if not json_path:
        return
    ev = result.evidence
    try:
        write_report(Path(json_path).parent, printable({**result.alert_data(), "advisor": ev.advisor if ev else {}}),
                     ev.summaries if ev else [], html_enabled="report_html" in result.paths,
                     inline_plotly="plotly_js" not in result.paths,
                     assets_dir=Path(result.paths["plotly_js"]).parent if "plotly_js" in result.paths else None,
                     generated=datetime.fromtimestamp(now_unix_s, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"))
    except OSError as exc:
        result.keep_note(f"report not rewritten with the comparison: {exc}")


def _write_report(result: AnalysisResult, f: Followup, *, html: bool) -> None:
    """``report.json`` (and ``report.html`` when ``html``) from the result as it stands (rewritten by the enrich
    phase). An unwritable folder is a note, never a failure."""
    if not f.settings.report:
        return
    t = time.monotonic()
    now = time.time() if f.now_unix_s is None else f.now_unix_s
    result.paths["report_json"] = str(f.out_dir / "report.json")
    assets = f.assets_dir if f.assets_dir is not None else f.out_dir.resolve().parent
    shared = assets.resolve() / PLOTLY_ASSET
    if html:
        result.paths["report_html"] = str(f.out_dir / "report.html")
        if not f.settings.report_html_inline:  # the page's chart script, shared: copy it along with the page
            result.paths["plotly_js"] = str(shared)
    ev = result.evidence
    try:
        # printable(): file names as text a UTF-8 file can hold, whatever bytes the OS gave (docs/paths.md)
        data = printable({**result.alert_data(), "advisor": ev.advisor if ev else {}})
        json_path, html_path = write_report(
            f.out_dir, data, ev.summaries if ev else [], html_enabled=html, inline_plotly=f.settings.report_html_inline,
            assets_dir=assets,
            generated=datetime.fromtimestamp(now, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"))
        if not shared.is_file():
            result.paths.pop("plotly_js", None)
        result.report = str(html_path or json_path)
    except OSError as exc:
        result.notes.append(f"report not written: {exc}")
        result.paths.pop("report_json", None)
        result.paths.pop("report_html", None)
        result.paths.pop("plotly_js", None)
    result.timings_s["report_html" if html else "report"] = time.monotonic() - t
