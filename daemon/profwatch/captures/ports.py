"""The narrow collaborators of the capture shell (``daemon/profwatch/captures/shell.py``) as Protocols, and their default
implementations over the adapters (I/O: file system scans, msprof-analyze through ``analyze_batch``).

The shell never sees the coordinator: the composition root (``daemon/profwatch/coordinator.py``) builds these and hands
them over. Tests pass fakes with the same methods.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from profwatch.core.batches.completeness import BatchState, CaptureHint
from profwatch.core.status_text import run_label
from rankhook import wire

if TYPE_CHECKING:
    from profwatch.adapters.fs.incremental_scan import IncrementalScan
    from profwatch.analysis.facade import AnalysisSettings
    from profwatch.core.batches.settings import WatchSettings


class ConfigWriterPort(Protocol):
    """Writes ``profiler_config.json`` (``profwatch.adapters.fs.config_writer.ConfigWriter``); returns an object with
    ``path`` and ``mtime_s``; raises on refusal or I/O error. Called on the shell's file system worker.
    ``idle_for="<capture id>"``: ``content`` is the idle config (start_step 0) taking that capture's arm back,
    written only while the file still holds it (else raises ``ConfigIdleNotNeeded``)."""

    def write(self, config_dir: str, content: dict[str, Any], *, not_before_unix_s: float,
              allowed_roots: Sequence[str], idle_for: str | None = None) -> Any: ...


class WatcherPort(Protocol):
    """Watches prof_dirs and wakes the shell (``profwatch.adapters.fs.prof_watch.ProfWatcher``)."""

    def watch(self, prof_dir: str) -> Any: ...

    def unwatch(self, prof_dir: str) -> None: ...

    def close(self) -> None: ...


class ScannerPort(Protocol):
    """Reads a prof_dir into batches, and applies retention to analysed batches (file system worker only).

    ``scan(..., rank_dirs=None)`` is a full look; ``rank_dirs`` (paths) reads only those rank dirs, ``()`` resumes
    a reconcile pass in progress. It returns the batches to judge, or None while nothing can be decided yet;
    ``reconciling(prof_dir)`` says whether a pass has rank dirs left (then call ``scan(..., rank_dirs=())``)."""

    def scan(self, prof_dir: str, *, world_size: int, capture_id: str, hint: CaptureHint,
             rank_dirs: Collection[str] | None = None) -> list[BatchState] | None: ...

    def reconciling(self, prof_dir: str) -> bool: ...

    def retain(self, analysed: Sequence[tuple[str, str, int]], now_unix_s: float) -> list[Any]: ...


class AnalyserPort(Protocol):
    """Analyses one complete batch in two phases. ``analyse`` runs the alert phase and returns ``(status, verdict
    payload)`` (``VERDICT_KEYS``, also ``report.json``); the payload's ``pending_recipes`` names what
    ``enrich(capture_id)`` will run afterwards (it returns the verdict payload again, judged on the fuller
    evidence; raises ``LookupError`` when nothing is pending for the capture). ``running(capture_id)`` says what
    runs now (for ``status``; every run when None); ``cancel(capture_id)`` stops the runs of one capture that left
    ``analysing`` / ``enriching`` without a result (cancelled, superseded, past its deadline);
    ``cancel_all()`` stops every run (shutdown; the capture is redone after a restart); ``close()`` once the
    analysis workers are joined."""

    def analyse(self, batch: BatchState, *, work_dir: Path, hostnames: Mapping[int, str], context: dict[str, Any],
                job_id: str, capture_reason: str) -> tuple[str, dict[str, Any]]: ...

    def enrich(self, capture_id: str) -> tuple[str, dict[str, Any]]: ...

    def prefetch(self, capture_id: str, batch: BatchState) -> None:
        """A scan saw ``batch`` (complete or not): read what the analysis will need of its parsed rank dirs now,
        off the caller's thread (a hint: an analyser may do nothing)."""

    def running(self, capture_id: str | None = None) -> list[str]: ...

    def cancel(self, capture_id: str) -> None: ...

    def cancel_all(self) -> None: ...

    def close(self) -> None: ...


class DetectorsPort(Protocol):
    """What the shell asks of the job's detector: keep the captured window out of the baseline, stalled ranks, the
    step time, and the ranks each kind still names (episodes hold while their detector names their ranks)."""

    def exclude_steps(self, job_id: str, first: int, last: int, reason: str) -> None: ...

    def exclude_until_closed(self, job_id: str, first: int, reason: str) -> None:
        """Keep the steps from ``first`` on out of detection until :meth:`close_exclusion` (``JobDetector``)."""
        ...

    def close_exclusion(self, job_id: str, reason: str) -> None: ...

    def stalled_ranks(self, job_id: str) -> frozenset[int]: ...

    def baseline_step_time_s(self, job_id: str) -> float | None:
        """The detector's step time of the job (the one definition replay uses too), None while unknown."""
        ...

    def ongoing(self, job_id: str) -> dict[str, frozenset[int]]:
        """Per anomaly kind, the ranks the job's detector still names (``JobDetector.ongoing``; {} when none)."""
        ...

    def unit_steps(self, job_id: str) -> dict[int, int] | None:
        """Per rank, its unit's furthest step (``JobDetector.unit_steps``; None: the job is one unit)."""
        ...

    def excursion_returned(self, job_id: str, first_step: int) -> dict[str, Any] | None:
        """The evidence (JSON) that the job-wide excursion reported from ``first_step`` came back to the level
        before it (``JobDetector.excursion_returned``); None when it did not, or for an unknown job."""
        ...


SendNodeCommand = Callable[[str, wire.NodeCommand], None]
"""Send a command to one node daemon by its identity (the coordinator's ingest socket; never blocks)."""
Emit = Callable[..., Any]
"""``emit(type_, job_id, data, event_id=None)``: store and publish one CloudEvent (the coordinator's sinks too)."""
Post = Callable[[Callable[[], None]], None]
"""Hand a callable to the main loop (results of worker threads come back this way)."""
Clock = Callable[[], float]


class RankDirScanner:
    """:class:`ScannerPort` over ``profwatch.adapters.fs.incremental_scan.IncrementalScan`` (one per prof_dir, the
    :attr:`MAX_TREES` most recently scanned kept) and ``profwatch.adapters.fs.retention``. One long-lived reader
    (its DB checks are cached); use from one thread. With ``allowed_roots`` every prof_dir is re-checked before
    each scan and deletion (``profwatch.adapters.fs.paths``: no symlink below its root), so a folder swapped for a
    link after the hello is refused (:class:`~profwatch.adapters.fs.paths.PathRefused`), not followed."""

    MAX_TREES = 64

    def __init__(self, settings: WatchSettings, allowed_roots: Sequence[str | os.PathLike[str]] | None = None) -> None:
        from profwatch.adapters.fs.rank_dir_fs import RankDirReader

        self.settings = settings
        self.allowed_roots = None if allowed_roots is None else list(allowed_roots)
        self._reader = RankDirReader()
        self._trees: OrderedDict[str, IncrementalScan] = OrderedDict()  # prof_dir -> its IncrementalScan

    def _checked(self, prof_dir: str) -> Path:
        from profwatch.adapters.fs.paths import check_inside

        return Path(prof_dir) if self.allowed_roots is None else check_inside(prof_dir, self.allowed_roots)

    def scan(self, prof_dir: str, *, world_size: int, capture_id: str, hint: CaptureHint,
             rank_dirs: Collection[str] | None = None) -> list[BatchState] | None:
        """See :class:`ScannerPort`; the reads and the decision are ``IncrementalScan.update``'s.

        Raises:
            PathRefused: ``prof_dir`` fails its re-check against ``allowed_roots``.
            TreeUnavailable: a full look cannot list ``prof_dir``.
        """
        from profwatch.adapters.fs.incremental_scan import IncrementalScan  # noqa: F811 (lazy: import weight)

        root = os.path.abspath(self._checked(prof_dir))
        key = os.path.abspath(prof_dir)
        tree = self._trees.pop(key, None)
        if tree is None or tree.root != root:
            tree = IncrementalScan(root, settings=self.settings, reader=self._reader)
        self._trees[key] = tree
        while len(self._trees) > self.MAX_TREES:
            self._trees.popitem(last=False)
        return tree.update(rank_dirs, capture_id=capture_id, world_size=world_size, hint=hint)

    def reconciling(self, prof_dir: str) -> bool:
        tree = self._trees.get(os.path.abspath(prof_dir))
        return tree is not None and tree.reconciling

    def retain(self, analysed: Sequence[tuple[str, str, int]], now_unix_s: float) -> list[Any]:
        """Apply the byte/age caps to ``(prof_dir, batch_id, world_size)`` of analysed captures only; an unreadable
        prof_dir is neither counted nor deleted."""
        from profwatch.adapters.fs.paths import PathRefused
        from profwatch.adapters.fs.rank_dir_fs import TreeUnavailable, scan_tree
        from profwatch.adapters.fs.retention import enforce_retention

        s = self.settings
        if s.retention_max_bytes is None and s.retention_max_age_s is None:
            return []
        batches, ids = [], set()
        for prof_dir, batch_id, world_size in analysed:
            try:
                found = scan_tree(self._checked(prof_dir), world_size=world_size, settings=s, reader=self._reader)
            except (TreeUnavailable, OSError, PathRefused):
                continue
            for b in found:
                if b.batch_id == batch_id:
                    batches.append(b)
                    ids.add(batch_id)
        return enforce_retention(batches, analysed=ids, max_bytes=s.retention_max_bytes,
                                 max_age_s=s.retention_max_age_s, now_unix_s=now_unix_s,
                                 allowed_roots=self.allowed_roots)


class BatchAnalyser:
    """:class:`AnalyserPort` over ``profwatch.analysis.facade.analyze_batch`` / ``enrich_analysis`` and one
    :class:`MsprofRunner` owned by this analyser (the coordinator's only runner). Runs are labelled with the batch
    id; ``cancel(capture_id)`` maps the capture to the batch it is analysing or enriching. Results waiting for
    their enrich phase are kept here (at most :attr:`MAX_PENDING`, oldest dropped: its enrichment then fails
    with the reason, the verdict stands)."""

    MAX_PENDING = 16
    MAX_REFERENCES = 8
    """Analysed reference captures kept in memory (the newest jobs' baselines; an older one is analysed again)."""
    REFERENCE_WAIT_S = 900.0
    """How long a capture's comparison waits for its reference's analysis running on another worker."""

    def __init__(self, settings: AnalysisSettings, assets_dir: Path | None = None) -> None:
        """``assets_dir``: the folder of every report page's shared chart script (the coordinator's work dir; None:
        each analysis's ``results`` folder)."""
        import threading

        from profwatch.adapters.tools.kineto_reader import TracePrefetcher
        from profwatch.adapters.tools.msprof_runner import MsprofRunner
        from profwatch.adapters.tools.own_tables_reader import TablePrefetcher

        self.settings = settings
        self.assets_dir = assets_dir
        self.runner = MsprofRunner(settings.msprof)
        self.tables = TablePrefetcher(settings.own_tables_workers)  # Ascend ranks' own tables, read as each completes
        self.traces = TracePrefetcher(settings.own_tables_workers)  # torch.profiler ranks' traces, parsed likewise
        self._lock = threading.Lock()
        self._batch_of: dict[str, str] = {}  # capture_id -> batch_id while it is analysed or enriched
        self._pending: dict[str, Any] = {}  # capture_id -> AnalysisResult waiting for its enrich phase
        self._references: dict[str, Any] = {}  # reference capture_id -> its AnalysisResult
        self._ref_running: dict[str, Any] = {}  # reference capture_id -> threading.Event set when its analysis ends

    def analyse(self, batch: BatchState, *, work_dir: Path, hostnames: Mapping[int, str], context: dict[str, Any],
                job_id: str, capture_reason: str) -> tuple[str, dict[str, Any]]:
        """See :class:`AnalyserPort`. A reference capture (``capture_reason == "reference"``) is analysed for its
        time breakdown only (``AnalysisSettings.for_reference``) and kept in memory (:attr:`MAX_REFERENCES`) for the captures
        compared with it. ``context["reference"]`` (``ReferenceInfo.to_json`` plus ``telemetry_baseline_step_s``;
        taken out of the payload's context) asks for the comparison with that reference (``docs/reference.md``):
        attached in the alert phase, so the verdict event carries ``changes``; a reference still being analysed on
        another worker is waited for (at most :attr:`REFERENCE_WAIT_S`); one no longer in memory (a restart) is
        analysed again from its prof_dir first."""
        import threading

        from profwatch.analysis.facade import analyze_batch
        from profwatch.core.changes.reference import REFERENCE_REASON

        context = dict(context)
        ref = context.pop("reference", None)
        capture_id = str(context.get("capture_id") or "")
        is_reference = capture_reason == REFERENCE_REASON
        with self._lock:
            if capture_id:
                self._batch_of[capture_id] = batch.batch_id
            if is_reference and capture_id:
                self._ref_running.setdefault(capture_id, threading.Event())
        try:
            result = analyze_batch(batch, work_dir=work_dir, settings=self.settings.for_reference() if is_reference
                                   else self.settings, hostnames=dict(hostnames) or None,
                                   capture_reason=capture_reason, job_id=job_id, runner=self.runner, context=context,
                                   enrich=False, prefetched=self.tables.take(capture_id) if capture_id else None,
                                   prefetched_traces=self.traces.take(capture_id) if capture_id else None,
                                   assets_dir=self.assets_dir)
            if is_reference and capture_id:
                with self._lock:
                    self._references[capture_id] = result
                    while len(self._references) > self.MAX_REFERENCES:
                        self._references.pop(next(iter(self._references)))
            elif isinstance(ref, Mapping) and result.status != "incomplete":
                self._compare(result, ref, work_dir)
        finally:
            with self._lock:
                self._batch_of.pop(capture_id, None)
                done = self._ref_running.pop(capture_id, None) if is_reference else None
            if done is not None:
                done.set()
        if result.pending and capture_id and not is_reference:
            with self._lock:
                self._pending[capture_id] = result
                while len(self._pending) > self.MAX_PENDING:
                    self._pending.pop(next(iter(self._pending)))
        return result.status, result.alert_data()

    def _compare(self, result: Any, ref: Mapping[str, Any], work_dir: Path) -> None:
        """Attach the comparison with the reference ``ref`` to ``result`` and rewrite its report; a reference that
        cannot be read or analysed is a note."""
        import time

        from profwatch.analysis.facade import rewrite_report
        from profwatch.changes.compare import attach_comparison

        cid = str(ref.get("capture_id") or "")
        with self._lock:
            running = self._ref_running.get(cid)
        if running is not None:  # the reference is being analysed on another worker: its result is due
            running.wait(self.REFERENCE_WAIT_S)
        with self._lock:
            reference = self._references.get(cid)
        if reference is None:
            reference = self._reanalyse_reference(ref, work_dir)
        if reference is None:
            result.keep_note(f"no comparison with the reference capture {cid}: its batch {ref.get('batch_id')} "
                                f"could not be read again from {ref.get('prof_dir')}")
            return
        tele = ref.get("telemetry_baseline_step_s")
        named = ref.get("named_ranks")
        ranks = sorted({r for r in named if isinstance(r, int) and not isinstance(r, bool) and r >= 0}) \
            if isinstance(named, list) else []
        attach_comparison(result, reference, reference_path=str(ref.get("prof_dir") or ""),
                          telemetry_baseline_step_s=float(tele) if isinstance(tele, (int, float)) else None,
                          ranks=ranks or None)
        if result.comparison is not None:
            result.comparison["reference"].update(
                {k: ref.get(k) for k in ("capture_id", "generation", "created_unix_s", "age_s")})
            result.comparison["notes"].append(
                f"reference capture {cid} (generation {ref.get('generation')}) taken {float(ref.get('age_s') or 0):.0f}"
                f" s before this analysis, its step time {float(result.comparison['step_time_baseline_s'] or 0):.4g} s")
        rewrite_report(result, time.time())

    def _reanalyse_reference(self, ref: Mapping[str, Any], work_dir: Path) -> Any:
        """Analyse a reference again from its prof_dir (after a restart); None when its batch is not found."""
        from profwatch.adapters.fs.rank_dir_fs import TreeUnavailable, scan_tree
        from profwatch.analysis.facade import analyze_batch

        cid = str(ref.get("capture_id") or "")
        try:
            world = int(ref.get("world_size") or 0) or None
            found = [b for b in scan_tree(Path(str(ref.get("prof_dir") or "")), world_size=world)
                     if b.batch_id == ref.get("batch_id")]
        except (TreeUnavailable, OSError, ValueError):
            return None
        if not found:
            return None
        reference = analyze_batch(found[0], work_dir=work_dir.parent / f"reference-{cid}",
                                  settings=self.settings.for_reference(), runner=self.runner, enrich=False)
        with self._lock:
            self._references[cid] = reference
        return reference

    def enrich(self, capture_id: str) -> tuple[str, dict[str, Any]]:
        """Run the enrich phase of the capture's analysed batch (advisor at low priority, slow links, html report);
        returns ``(status, verdict payload)``. Raises LookupError when no analysed result waits for it."""
        from profwatch.analysis.facade import enrich_analysis

        with self._lock:
            result = self._pending.pop(capture_id, None)
            if result is None:
                raise LookupError(f"no analysed result of capture {capture_id} waits for enrichment (dropped, or "
                                  "the coordinator restarted)")
            self._batch_of[capture_id] = result.batch_id
        try:
            enrich_analysis(result, runner=self.runner)
        finally:
            with self._lock:
                self._batch_of.pop(capture_id, None)
        return result.status, result.alert_data()

    def running(self, capture_id: str | None = None) -> list[str]:
        """The msprof-analyze commands running now (of ``capture_id``'s batch, or all): ``"<recipe> (<elapsed> s)"``
        (the recipe in words: ``core/status_text.py: run_label``),
        `` [enrich]`` added for the enrich phase."""
        return [f"{run_label(r['recipe'])} ({r['elapsed_s']:.0f} s)" + (" [enrich]" if r["phase"] == "enrich" else "")
                for r in self.running_recipes(capture_id)]

    def running_recipes(self, capture_id: str | None = None) -> list[dict[str, Any]]:
        """``[{"recipe", "phase", "elapsed_s", "started_unix_s", "rss_bytes", "batch_id"}]`` running now."""
        with self._lock:
            batch_id = self._batch_of.get(capture_id) if capture_id is not None else None
        if capture_id is not None and batch_id is None:
            return []
        return [{"recipe": r.name, "phase": r.phase, "elapsed_s": round(r.elapsed_s, 1),
                 "started_unix_s": r.started_unix_s, "rss_bytes": r.rss_bytes, "batch_id": r.owner}
                for r in self.runner.running() if batch_id is None or r.owner == batch_id]

    def cancel(self, capture_id: str) -> None:
        """Kill the runs of the batch this capture is analysing or enriching (its late result is dropped by the
        lifecycle); a result waiting for enrichment is dropped."""
        with self._lock:
            batch_id = self._batch_of.get(capture_id)
            self._pending.pop(capture_id, None)
        if batch_id is not None:
            self.runner.cancel(batch_id)

    def cancel_all(self) -> None:
        self.runner.cancel_all()

    def prefetch(self, capture_id: str, batch: BatchState) -> None:
        """Queue the reads of the batch's parsed rank dirs, each read once: an Ascend rank's own tables
        (docs/msprof-analyze.md#own-tables), a torch.profiler rank's Kineto trace (``TracePrefetcher``)."""
        done = {r: s.path for r, s in batch.ranks.items() if s.state == "parsed"}
        if not done:
            return
        if batch.kind != "ascend_pt":
            self.traces.submit(capture_id, done)
        elif self.settings.own_tables:
            self.tables.submit(capture_id, done)

    def close(self) -> None:
        self.tables.close()
        self.traces.close()
        self.runner.close()
