"""The analysis steps of the capture shell (``daemon/profwatch/captures/shell.py``): the alert phase on the analysis
workers, the enrich phase on its own worker after the verdict is published, retention (I/O shell; decisions in
``core/capture/lifecycle.py``)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from profwatch.core.batches.completeness import BatchState
from profwatch.core.batches.prof_layout import NAMED_RANKS_KEY, decode_rank_list
from profwatch.core.capture import lifecycle as lc

if TYPE_CHECKING:
    from profwatch.adapters.store.state import StateStore
    from profwatch.captures.ports import AnalyserPort, Clock, Post, ScannerPort
    from profwatch.core.batches.settings import WatchSettings
    from profwatch.core.fleet.registry import JobState

log = structlog.get_logger("profwatch.captures.shell")

_ANALYSING, _ENRICHING = lc.CaptureState.ANALYSING.value, lc.CaptureState.ENRICHING.value
_ON_WORKER = {"analysis_queued": _ANALYSING, "enrich_queued": _ENRICHING}
"""A queued stage -> the stage of the captures its worker(s) hold."""


class AnalysisSteps:
    """Runs the analyses, enrichments and retention of the capture shell (see the module doc). Owns its workers:
    ``analysis_workers`` analysis threads and one enrich thread (the enrich phase of one capture at a time, apart
    from the alert phases of the others).

    Args:
        store: the state store (batch results, the analysed captures retention may thin).
        jobs: the registry's job map (read only: each rank's hostname for the report).
        analyser, scanner: the analysis and the rank-dir scanner (retention) (``captures/ports.py``).
        work_dir: the coordinator's work dir (``<work_dir>/<job_id>/<capture_id>/`` per analysis).
        watch: the retention caps (``[watch] retention_max_bytes`` / ``retention_max_age_s``).
        analysis_workers: analysis threads (``[coordinator] analysis_workers``).
        settings: the lifecycle deadlines.
        fs_pool: the shell's one file system worker (retention runs there).
        find, apply: the shell's capture in flight by id (None when no longer in flight) and how a transition is
            applied (persist, publish, act).
        post, clock: hand work to the main loop; wall clock (unix s).
        reference_for: the reference a capture's analysis compares with (``ReferenceDesk.for_analysis``; None:
            none), read on the main thread when the analysis is queued.
        protected: batch ids retention keeps whatever the caps (each job's newest reference).
    """

    def __init__(self, *, store: StateStore, jobs: Mapping[str, JobState], analyser: AnalyserPort,
                 scanner: ScannerPort, work_dir: str | Path, watch: WatchSettings, analysis_workers: int,
                 settings: lc.LifecycleSettings, fs_pool: ThreadPoolExecutor,
                 find: Callable[[str], lc.Capture | None], apply: Callable[[lc.Transition], lc.Capture],
                 post: Post, clock: Clock, reference_for: Callable[[lc.Capture], dict[str, Any] | None] | None = None,
                 protected: Callable[[], set[str]] | None = None) -> None:
        self.store, self.jobs, self.analyser, self.scanner = store, jobs, analyser, scanner
        self.work_dir, self.watch, self.ls = Path(work_dir), watch, settings
        self.fs_pool, self.find, self.apply, self.post, self.clock = fs_pool, find, apply, post, clock
        self.analysis_pool = ThreadPoolExecutor(analysis_workers, thread_name_prefix="profwatch-analysis")
        self.enrich_pool = ThreadPoolExecutor(1, thread_name_prefix="profwatch-enrich")
        self._workers = analysis_workers
        self._shut = False
        self._stage_lock = threading.Lock()
        self._stages: dict[str, str] = {}  # capture id -> its STAGES word, in the order each was queued
        self.reference_for = reference_for or (lambda cap: None)
        self.protected = protected or set

    STAGES = ("analysis_queued", _ANALYSING, "enrich_queued", _ENRICHING)
    """Where a capture's analysis is (``stage_of``): queued for an analysis worker, on one, queued for the one
    enrich worker, on it. A capture not held here has none (e.g. restored in flight after a restart)."""

    def _set_stage(self, cid: str, stage: str | None) -> None:
        with self._stage_lock:
            self._stages.pop(cid, None)  # re-inserted last: the dict's order is the queue's
            if stage is not None:
                self._stages[cid] = stage

    def _leave_stage(self, cid: str, stage: str) -> None:
        """A worker is done with ``cid``: forget its stage if it is still ``stage``. The analysis worker leaves
        after it posted the verdict, and the main loop may have queued (or the enrich worker started) the enrich
        phase by then: clearing it whatever it was showed an enriching capture as in no stage."""
        with self._stage_lock:
            if self._stages.get(cid) == stage:
                del self._stages[cid]

    def stage_of(self, cid: str) -> dict[str, Any] | None:
        """``{"stage": one of STAGES, "ahead": [capture ids]}`` for ``cid``'s analysis, or None when no worker
        holds or queues it. ``ahead``: for a queued capture, the captures on the workers of its phase and those
        queued before it (oldest first), i.e. what it waits for; [] for a capture on a worker."""
        with self._stage_lock:
            stage = self._stages.get(cid)
            if stage is None:
                return None
            ahead: list[str] = []
            on_worker = _ON_WORKER.get(stage)
            if on_worker is not None:  # queued: behind the captures on its workers and those queued before it
                ahead = [o for o, st in self._stages.items() if st == on_worker]
                for other, st in self._stages.items():
                    if other == cid:
                        break
                    if st == stage:
                        ahead.append(other)
        return {"stage": stage, "ahead": ahead}

    def workers_up(self) -> tuple[bool, str]:
        """``(up, detail)`` for the coordinator's ``/readyz``: the analysis and enrich pools accept work (not shut
        down). A busy worker is up: the pools queue."""
        if self._shut:
            return False, "analysis workers shut down"
        return True, f"{self._workers} analysis worker(s) and 1 enrich worker accepting work"

    def shutdown(self) -> None:
        """Join the analysis and enrich workers (queued work is dropped; running tools were cancelled first)."""
        self._shut = True
        self.analysis_pool.shutdown(wait=True, cancel_futures=True)
        self.enrich_pool.shutdown(wait=True, cancel_futures=True)

    # -- analysis ------------------------------------------------------------------------------------------------------
    def analyse(self, cap: lc.Capture, batch: BatchState) -> None:
        """Queue the analysis of ``cap``'s complete ``batch`` on an analysis worker (with the reference it is
        compared with, if any)."""
        self._set_stage(cap.capture_id, "analysis_queued")
        self.analysis_pool.submit(self._analyse, cap, batch, self.reference_for(cap))

    def prefetch(self, cid: str, batch: BatchState) -> None:
        """A scan of capture ``cid`` saw ``batch``: let the analyser read its parsed rank dirs now (own tables)."""
        try:
            self.analyser.prefetch(cid, batch)
        except Exception as exc:  # noqa: BLE001 - a hint: the analysis reads what was not read
            log.warning("prefetch_failed", capture_id=cid, error=repr(exc))

    def _analyse(self, cap: lc.Capture, batch: BatchState, reference: dict[str, Any] | None = None) -> None:
        """Analysis worker: run the analyser, hand the verdict back to the main loop."""
        cid = cap.capture_id
        self._set_stage(cid, _ANALYSING)
        job = self.jobs.get(cap.job_id)
        hostnames = {r.rank: r.hostname for r in job.ranks.values() if r.hostname} if job is not None else {}
        context = lc.analysis_context(cap)
        if reference is not None:  # compared on the ranks the capture's anomaly named (None: every rank both hold)
            meta = cap.config.get("metadata") if isinstance(cap.config, Mapping) else None
            named = decode_rank_list(meta.get(NAMED_RANKS_KEY)) if isinstance(meta, Mapping) else None
            context["reference"] = {**reference, "named_ranks": list(named) if named else None}
        try:
            status, payload = self.analyser.analyse(
                batch, work_dir=self.work_dir / cap.job_id / cid, hostnames=hostnames,
                context=context, job_id=cap.job_id, capture_reason=cap.reason)
            self.post(lambda: self._on_analysed(cid, batch, status, payload))
        except Exception as exc:  # noqa: BLE001 - a failing analysis is a verdict, never a crash
            err = repr(exc)
            log.exception("analysis_failed", capture_id=cid)
            self.post(lambda: self._on_analysis_error(cid, err))
        finally:
            self._leave_stage(cid, _ANALYSING)

    def _on_analysed(self, cid: str, batch: BatchState, status: str, payload: dict[str, Any]) -> None:
        cap = self.find(cid)
        if cap is None:
            return
        now = self.clock()
        self.store.save_batch(batch.batch_id, cid, cap.job_id, status, now, payload)
        self.apply(lc.analysis_done(cap, status, payload, now, self.ls))

    def _on_analysis_error(self, cid: str, err: str) -> None:
        cap = self.find(cid)
        if cap is not None:
            self.apply(lc.analysis_raised(cap, err, self.clock(), self.ls))

    def enrich(self, cid: str) -> None:
        """Queue the enrich phase of analysed capture ``cid`` on the enrich worker."""
        self._set_stage(cid, "enrich_queued")
        self.enrich_pool.submit(self._enrich, cid)

    def _enrich(self, cid: str) -> None:
        """Enrich worker: the enrich phase of an analysed capture (after its verdict was published)."""
        self._set_stage(cid, _ENRICHING)
        try:
            status, payload = self.analyser.enrich(cid)
            self.post(lambda: self._on_enriched(cid, status, payload))
        except Exception as exc:  # noqa: BLE001 - a failed follow-up leaves the verdict standing
            err = str(exc) or repr(exc)
            log.warning("enrichment_failed", capture_id=cid, error=err)
            self.post(lambda: self._on_enriched(cid, "", {"enrich_error": err}))
        finally:
            self._leave_stage(cid, _ENRICHING)

    def _on_enriched(self, cid: str, status: str, payload: dict[str, Any]) -> None:
        cap = self.find(cid)
        if cap is None:
            return
        now = self.clock()
        if status and cap.batch_id:
            self.store.save_batch(cap.batch_id, cid, cap.job_id, status, now, payload)
        self.apply(lc.enrich_done(cap, payload, now, self.ls))

    def retain(self) -> None:
        """Apply the retention caps to the analysed batches on the file system worker (none set: nothing)."""
        w = self.watch
        if w.retention_max_bytes is None and w.retention_max_age_s is None:
            return
        keep = self.protected()  # each job's newest reference: deletable only once a newer one exists
        analysed = [(c.prof_dir, c.batch_id, c.world_size) for c in self.store.captures(states=[lc.S.ANALYSED,
                                                                                                lc.S.ENRICHED])
                    if c.batch_id and c.prof_dir and c.batch_id not in keep]
        self.fs_pool.submit(self._retain_worker, analysed, self.clock())

    def _retain_worker(self, analysed: list[tuple[str, str, int]], now: float) -> None:
        for r in self.scanner.retain(analysed, now):
            log.info("batch_retired", batch=repr(r))
