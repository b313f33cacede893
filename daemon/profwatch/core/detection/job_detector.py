"""Step-time anomaly detection for one job (pure: data in, anomalies out; time is passed in).

:class:`JobDetector` is the facade the coordinator and ``profwatch replay`` use. It composes a
:class:`~profwatch.core.detection.aggregation.StepAggregator` (per-step cross-rank aggregation and exclusions) with
swappable detectors behind two small Protocols (``daemon/profwatch/core/detection/types.py``):

* ``StepDetector`` (fed each finalised step): :class:`~profwatch.core.detection.regression.StepTimeRegressionDetector`
  (``step_regression``, ``step_spike``, ``periodic_spike``) and :class:`~profwatch.core.detection.rank_outliers.RankOutlierDetector`
  (``rank_outlier``);
* ``StallDetector`` (fed arrival times, checked by :meth:`JobDetector.tick`):
  :class:`~profwatch.core.detection.stalls.ArrivalStallDetector` (``stalled_rank``).

Each detector documents its algorithm, thresholds and sources in its ``Notes:``. Thresholds live in
:class:`DetectionSettings` and can be swapped at runtime with :meth:`JobDetector.update_settings`.
"""

from __future__ import annotations

from collections.abc import Sequence

from profwatch.core.capture.planner import CaptureSettings, lead_steps
from profwatch.core.detection.aggregation import StepAggregator, StepReportLike
from profwatch.core.detection.rank_outliers import RankOutlierDetector
from profwatch.core.detection.regression import StepTimeRegressionDetector
from profwatch.core.detection.settings import DetectionSettings
from profwatch.core.detection.stalls import ArrivalStallDetector
from profwatch.core.detection.types import Anomaly, AnomalyKind, FinalizedStep, StallDetector, StepDetector

__all__ = ["Anomaly", "AnomalyKind", "DetectionSettings", "FinalizedStep", "JobDetector", "StepReportLike"]


class JobDetector:
    """All detectors of one job.

    Args:
        job_id: the job (copied into every :class:`Anomaly`).
        world_size: number of ranks; reports with ``rank`` outside ``[0, world_size)`` are counted and ignored.
        settings: thresholds; see :class:`DetectionSettings`.
        capture: the capture planner's settings; a spike counts as transient while it is shorter than the
            planner's lead (``profwatch.core.capture.planner.lead_steps``) unless ``spike_hold_steps`` is set.
        step_detectors: replaces the default ``[StepTimeRegressionDetector, RankOutlierDetector]``.
        stall_detector: replaces the default :class:`ArrivalStallDetector`.

    Raises:
        ValueError: ``world_size < 1``.

    Notes:
        Reports go to the aggregator; every step it finalises (in step order, excluded ones flagged) goes to
        each step detector in turn; a step-counter restart resets them all. Arrival times go to the stall
        detector, which :meth:`tick` checks. Nothing here reads a rank host's clock: stalls use the arrival time
        the caller passes to :meth:`observe`. Cost: O(1) amortised per report; the step detectors' work runs
        once per finalised step (amortised over ``world_size`` reports); ``tick`` is O(world_size).
    """

    def __init__(self, job_id: str, world_size: int, settings: DetectionSettings | None = None, *,
                 capture: CaptureSettings | None = None, step_detectors: Sequence[StepDetector] | None = None,
                 stall_detector: StallDetector | None = None) -> None:
        s = settings or DetectionSettings()
        self.job_id = job_id
        self.world_size = world_size
        self.settings = s
        self.aggregator = StepAggregator(world_size, s)
        cap = capture or CaptureSettings()
        self._regression: StepTimeRegressionDetector | None = None
        if step_detectors is None:
            self._regression = StepTimeRegressionDetector(
                job_id, s, hold_steps=lambda step, step_time_s: lead_steps(step, step_time_s, cap))
            step_detectors = [self._regression, RankOutlierDetector(job_id, world_size, s)]
        self.step_detectors: list[StepDetector] = list(step_detectors)
        self.stall_detector: StallDetector = stall_detector or ArrivalStallDetector(job_id, world_size, s)

    @property
    def counters(self) -> dict[str, int]:
        """The aggregator's report/step counters (``reports``, ``late``, ``duplicate``, ``bad_rank``,
        ``old_epoch``, ``restarts``, ``finalized``, ``excluded``), plus the regression detector's."""
        out = dict(self.aggregator.counters)
        if self._regression is not None:
            out.update(self._regression.counters)
            out.update(self._regression.spikes.counters)
        return out

    @property
    def furthest_step(self) -> int | None:
        """The highest step any rank of the current epoch reported (None before the first report)."""
        return self.aggregator.furthest_step

    @property
    def baseline_step_time_s(self) -> float | None:
        """The job step time (s) for planning: the regression baseline once learned, else the last
        non-excluded job step time, else None. The one step-time definition the coordinator and replay use."""
        if self._regression is not None:
            v = self._regression.baseline_step_time_s
            if v is not None:
                return v
        return self.aggregator.last_job_step_s

    @property
    def stalled_ranks(self) -> frozenset[int]:
        """Ranks currently reported as stalled (cleared when they report again or leave)."""
        return self.stall_detector.stalled_ranks

    def ongoing(self) -> dict[str, frozenset[int]]:
        """Per anomaly kind, the ranks its detector still names now (``rank_outlier``: reported and not cleared;
        ``stalled_rank``: stalled): what tells the episode layer (``daemon/profwatch/core/capture/episodes.py``) that an
        episode still holds between reports."""
        out = {"stalled_rank": self.stall_detector.stalled_ranks}
        for d in self.step_detectors:
            if isinstance(d, RankOutlierDetector):
                out["rank_outlier"] = out.get("rank_outlier", frozenset()) | d.reported_ranks
        return out

    def update_settings(self, settings: DetectionSettings) -> None:
        """Swap thresholds without losing learned state (windows are resized; outlier counts may restart)."""
        self.settings = settings
        self.aggregator.update_settings(settings)
        for d in self.step_detectors:
            d.update_settings(settings)
        self.stall_detector.update_settings(settings)

    def mark_left(self, rank: int) -> None:
        """Record that ``rank`` left on purpose (``bye``): it is never reported as stalled until it reports again."""
        self.stall_detector.mark_left(rank)

    def exclude_steps(self, first: int, last: int, reason: str, *, pad_parse_steps: bool = True) -> None:
        """Exclude steps ``first..last`` (inclusive; plus ``parse_steps`` after ``last`` unless ``pad_parse_steps``
        is false) from all detectors, e.g. a capture window planned by the coordinator. Raises ``ValueError``
        when ``last < first``."""
        self.aggregator.exclude_steps(first, last, reason, pad_parse_steps=pad_parse_steps)

    def observe(self, report: StepReportLike, now_unix_s: float) -> list[Anomaly]:
        """Ingest one step report that arrived at ``now_unix_s`` (seconds, the caller's clock: the coordinator's
        receive time, or a record's time in replay); return the anomalies it produced (usually none)."""
        if 0 <= report.rank < self.world_size:
            self.stall_detector.on_arrival(report.rank, now_unix_s)
        steps, restarted = self.aggregator.observe(report, now_unix_s)
        if restarted:
            for d in self.step_detectors:
                d.reset()
        if not steps:
            return []
        out: list[Anomaly] = []
        for fs in steps:
            for d in self.step_detectors:
                found = d.on_step(fs)
                if found:
                    out.extend(found)
        return out

    def tick(self, now_unix_s: float) -> list[Anomaly]:
        """Check for stalled ranks at ``now_unix_s`` (same clock as the arrival times given to :meth:`observe`).
        O(world_size); call it about once a second, not per report."""
        return self.stall_detector.check(self.aggregator, now_unix_s)
