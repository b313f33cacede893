"""Types shared by the step aggregator and the detectors it feeds (pure; no I/O).

:class:`Anomaly` is what every detector returns; :class:`FinalizedStep` is what the step aggregator hands to the
step detectors; :class:`StepDetector` and :class:`StallDetector` are the small Protocols a
:class:`profwatch.core.detection.job_detector.JobDetector` composes, so each detector can be swapped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from profwatch.core.detection.settings import DetectionSettings

AnomalyKind = Literal["step_regression", "step_spike", "periodic_spike", "rank_outlier", "stalled_rank",
                      "structural_imbalance", "drift", "slow_from_start"]
"""``step_regression``: the job got slower and stayed slower; ``step_spike``: a job-wide excursion that was over
before any capture could start (an event, never armed); ``periodic_spike``: recurring spikes with a learned
period (armed only when the arming policy asks for it, to cover the next occurrence); ``rank_outlier``: ranks
consistently slower than their peers (or than their own learned baseline); ``stalled_rank``: a rank stopped
reporting while its peers go on; ``structural_imbalance``: ranks slower than their peers from the start of the
generation, learned as their baseline (reported once per generation, never armed by default); ``drift``: the job's
step time rises slowly and steadily (reported once per ``drift_threshold`` it grows); ``slow_from_start``: of those,
the ranks at least ``outlier_min_effect`` slower in a job that declares no roles and shows no pipeline stages (a bad
node, or an undeclared role: an alert once per generation, captured once)."""



@dataclass(frozen=True, slots=True)
class Anomaly:
    """One detection finding.

    ``step`` is the step at which it fired (for stalls: the furthest step of the job then); ``ranks`` the ranks
    involved (empty = job-wide); ``magnitude`` is relative (0.25 = 25 % slower; 1.0 for a stall, which is a full
    stop); ``detail`` holds detector-specific JSON-ready evidence.
    """

    kind: AnomalyKind
    job_id: str
    step: int
    ranks: tuple[int, ...]
    magnitude: float
    detail: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """Return ``{"kind", "job_id", "step", "ranks", "magnitude", "detail"}`` (JSON-ready)."""
        return {"kind": self.kind, "job_id": self.job_id, "step": self.step, "ranks": list(self.ranks),
                "magnitude": round(self.magnitude, 6), "detail": self.detail}


@dataclass(frozen=True, slots=True)
class FinalizedStep:
    """One step of the job, aggregated over the ranks that reported it.

    ``time_s`` is the job step time (seconds): the slowest reporting rank's ``step_time_s`` (in synchronous
    training every rank waits for it); ``slowest_rank`` that rank; ``ranks_reported`` how many ranks reported;
    ``stages`` per compared stage one value per rank (seconds, NaN = not reported), or None; ``excluded`` the
    reason the step is excluded from detection (warm-up, capture, a flag, idle, ...) or None; ``work`` the work
    the step did (the largest ``work`` any rank reported: tokens, requests; None = not reported); ``steps`` how
    many steps this record stands for (> 1 for a block of fast steps, ``step`` is then its last step);
    ``cpu_obs`` per rank the sequence number of the last sampled CPU interval its ``cpu/step`` value ends with
    (``aggregation.StepAggregator``: one number per valid interval between CPU samples, rising; -1 = none, e.g. an
    older hook's per-step ``cpu_s``), or None: steps that carry one held value repeat one observation; ``cpu_iv``
    (with ``cpu_obs``) per rank the value of that last interval alone, in the unit of its ``cpu/step`` value before
    the step's scaling (CPU seconds per step, or per unit of work; NaN = none): one independent observation per
    interval. ``work_split``: ranks reported different ``work`` values for this step (the ranks of one
    tensor-parallel group run one batch and report one; ranks that differ are independent replicas whose counters
    happen to meet, and their steps of one number are no common step).
    """

    step: int
    time_s: float
    slowest_rank: int
    ranks_reported: int
    stages: dict[str, list[float]] | None
    excluded: str | None
    work: float | None = None
    steps: int = 1
    cpu_obs: tuple[int, ...] | None = None
    cpu_iv: tuple[float, ...] | None = None
    work_split: bool = False


class StepDetector(Protocol):
    """A detector fed one :class:`FinalizedStep` at a time, in step order (excluded steps included, flagged)."""

    def on_step(self, step: FinalizedStep) -> list[Anomaly]:
        """Consume one finalised step; return what fired (usually nothing)."""
        ...

    def reset(self) -> None:
        """Forget everything learned (the job's step counter restarted)."""
        ...

    def update_settings(self, settings: DetectionSettings) -> None:
        """Swap thresholds, keeping learned state where the new settings allow it."""
        ...


class RankProgress(Protocol):
    """What a stall detector reads from the step aggregator about each rank (index = rank)."""

    @property
    def furthest_step(self) -> int | None: ...

    @property
    def last_step(self) -> Sequence[int]: ...

    @property
    def rank_epoch(self) -> Sequence[int]: ...

    @property
    def epoch(self) -> int: ...

    @property
    def epoch_start_arrival_s(self) -> float: ...


class StallDetector(Protocol):
    """A detector of ranks that stopped reporting, judged from arrival times on the coordinator's clock."""

    def on_arrival(self, rank: int, arrival_unix_s: float) -> None:
        """A report of ``rank`` arrived at ``arrival_unix_s`` (seconds, coordinator clock)."""
        ...

    def mark_left(self, rank: int) -> None:
        """``rank`` said bye: never stalled until it reports again."""
        ...

    def check(self, progress: RankProgress, now_unix_s: float) -> list[Anomaly]:
        """Return newly stalled ranks at ``now_unix_s`` (same clock as the arrivals)."""
        ...

    @property
    def stalled_ranks(self) -> frozenset[int]: ...

    def update_settings(self, settings: DetectionSettings) -> None: ...
