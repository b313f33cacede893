"""The analysis steps of the capture shell (``daemon/profwatch/captures/shell.py``): the alert phase on the analysis workers, the
enrich phase on its own worker after the verdict is published, retention (I/O shell; decisions in
``daemon/profwatch/core/capture/lifecycle.py``). A mixin: :class:`profwatch.captures.shell.CaptureShell` provides the attributes below."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from profwatch.core.batches.completeness import BatchState
from profwatch.core.capture import lifecycle as lc

if TYPE_CHECKING:
    from collections.abc import Mapping

    from profwatch.adapters.store.state import StateStore
    from profwatch.captures.ports import AnalyserPort, Clock, Post, ScannerPort
    from profwatch.config import Settings
    from profwatch.core.fleet.registry import JobState

log = structlog.get_logger("profwatch.captures.shell")


class AnalysisSteps:
    """Analysis, enrichment and retention steps of the capture shell (see the module doc)."""

    s: Settings
    ls: lc.LifecycleSettings
    store: StateStore
    jobs: Mapping[str, JobState]
    analyser: AnalyserPort
    scanner: ScannerPort
    post: Post
    clock: Clock
    fs_pool: ThreadPoolExecutor
    _find: Callable[[str], lc.Capture | None]
    _apply: Callable[..., lc.Capture]

    # -- analysis ------------------------------------------------------------------------------------------------------
    def _analyse(self, cap: lc.Capture, batch: BatchState) -> None:
        """Analysis worker: run the analyser, hand the verdict back to the main loop."""
        cid = cap.capture_id
        job = self.jobs.get(cap.job_id)
        hostnames = {r.rank: r.hostname for r in job.ranks.values() if r.hostname} if job is not None else {}
        try:
            status, payload = self.analyser.analyse(
                batch, work_dir=Path(self.s.coordinator.work_dir) / cap.job_id / cid, hostnames=hostnames,
                context=lc.analysis_context(cap), job_id=cap.job_id, capture_reason=cap.reason)
            self.post(lambda: self._on_analysed(cid, batch, status, payload))
        except Exception as exc:  # noqa: BLE001 - a failing analysis is a verdict, never a crash
            err = repr(exc)
            log.exception("analysis_failed", capture_id=cid)
            self.post(lambda: self._on_analysis_error(cid, err))

    def _on_analysed(self, cid: str, batch: BatchState, status: str, payload: dict[str, Any]) -> None:
        cap = self._find(cid)
        if cap is None:
            return
        now = self.clock()
        self.store.save_batch(batch.batch_id, cid, cap.job_id, status, now, payload)
        self._apply(lc.analysis_done(cap, status, payload, now, self.ls))

    def _on_analysis_error(self, cid: str, err: str) -> None:
        cap = self._find(cid)
        if cap is not None:
            self._apply(lc.analysis_raised(cap, err, self.clock(), self.ls))

    def _enrich(self, cid: str) -> None:
        """Enrich worker: the enrich phase of an analysed capture (after its verdict was published)."""
        try:
            status, payload = self.analyser.enrich(cid)
            self.post(lambda: self._on_enriched(cid, status, payload))
        except Exception as exc:  # noqa: BLE001 - a failed follow-up leaves the verdict standing
            err = str(exc) or repr(exc)
            log.warning("enrichment_failed", capture_id=cid, error=err)
            self.post(lambda: self._on_enriched(cid, "", {"enrich_error": err}))

    def _on_enriched(self, cid: str, status: str, payload: dict[str, Any]) -> None:
        cap = self._find(cid)
        if cap is None:
            return
        now = self.clock()
        if status and cap.batch_id:
            self.store.save_batch(cap.batch_id, cid, cap.job_id, status, now, payload)
        self._apply(lc.enrich_done(cap, payload, now, self.ls))

    def _retain(self) -> None:
        w = self.s.watch
        if w.retention_max_bytes is None and w.retention_max_age_s is None:
            return
        analysed = [(c.prof_dir, c.batch_id, c.world_size) for c in self.store.captures(states=[lc.S.ANALYSED,
                                                                                                lc.S.ENRICHED])
                    if c.batch_id and c.prof_dir]
        self.fs_pool.submit(self._retain_worker, analysed, self.clock())

    def _retain_worker(self, analysed: list[tuple[str, str, int]], now: float) -> None:
        for r in self.scanner.retain(analysed, now):
            log.info("batch_retired", batch=repr(r))

