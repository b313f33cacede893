"""Step-time anomaly detection for one job (pure: data in, anomalies out; time is passed in).

:class:`JobDetector` consumes every :class:`rankhook.wire.StepReport` of one job and returns
:class:`Anomaly` findings of three kinds: ``step_regression`` (the job got slower and stayed slower),
``rank_outlier`` (ranks consistently slower than their peers in a stage) and ``stalled_rank`` (a rank stopped
reporting while its peers go on; FC-11). Thresholds live in :class:`DetectionSettings` and can be swapped at
runtime with :meth:`JobDetector.update_settings`.

Cost model: ``observe`` is O(1) per report (a few list/dict operations; no numpy over windows). Work over a
whole step (one median over the baseline window, one numpy median over the ranks' stage times) runs once per
finalised step, i.e. amortised over ``world_size`` reports. Memory is bounded: at most ``finalize_lag_steps``
+ 1 open steps, fixed-size windows, and per-rank lists of ``world_size`` entries.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np

from daemon.core.detection_settings import DetectionSettings

AnomalyKind = Literal["step_regression", "rank_outlier", "stalled_rank"]
_NEVER = -(2**62)
_MAD_TO_SIGMA = 1.4826
"""MAD * 1.4826 estimates the standard deviation of normal data (Rousseeuw & Croux 1993)."""


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


class StepReportLike(Protocol):
    """The fields of :class:`rankhook.wire.StepReport` the detector reads."""
    rank: int
    step: int
    step_time_s: float
    ts_unix_s: float
    stages: dict[str, float] | None
    flags: tuple[str, ...]
    capturing: bool


class _StepAgg:
    """Aggregate of one open step: report count, slowest rank, exclusion, per-rank stage arrays."""
    __slots__ = ("excluded", "max_rank", "max_t", "n", "vals")

    def __init__(self) -> None:
        self.n = 0
        self.max_t = -1.0
        self.max_rank = -1
        self.excluded: str | None = None
        self.vals: dict[str, list[float]] | None = None


def _median_mad(xs: list[float]) -> tuple[float, float]:
    """Median and MAD of a non-empty list (pure Python: cheaper than numpy below ~100 values)."""
    s = sorted(xs)
    n = len(s)
    med = s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])
    d = sorted(abs(x - med) for x in s)
    mad = d[n // 2] if n % 2 else 0.5 * (d[n // 2 - 1] + d[n // 2])
    return med, mad


_STATS_EVERY = 4  # baseline median/MAD recomputed every this many accepted steps (saves a sort per step)
_NUMPY_MIN_RANKS = 256  # below this, the per-step cross-rank comparison runs in pure Python (cheaper)


def _outlying(arr: list[float], s: DetectionSettings) -> list[tuple[int, float]]:
    """Ranks whose value is outlying above the peer median: ``[(rank, relative excess)]``.

    ``arr`` has one entry per rank (NaN = not reported). Rule in :class:`JobDetector` Notes (rank outlier).
    """
    if len(arr) < _NUMPY_MIN_RANKS:
        present = [v for v in arr if not math.isnan(v)]
        if len(present) < s.outlier_min_ranks:
            return []
        m, mad = _median_mad(present)
        if m <= 0:
            return []
        thr = max(s.outlier_z * max(_MAD_TO_SIGMA * mad, s.noise_floor * m), s.outlier_min_effect * m,
                  s.outlier_min_abs_s)
        return [(r, (v - m) / m) for r, v in enumerate(arr) if v - m >= thr]
    a = np.asarray(arr, dtype=np.float64)
    v = a[~np.isnan(a)]
    if v.size < s.outlier_min_ranks:
        return []
    m = float(np.median(v))
    if m <= 0:
        return []
    mad = float(np.median(np.abs(v - m)))
    thr = max(s.outlier_z * max(_MAD_TO_SIGMA * mad, s.noise_floor * m), s.outlier_min_effect * m, s.outlier_min_abs_s)
    with np.errstate(invalid="ignore"):
        idx = np.flatnonzero(a - m >= thr)
    return [(int(r), (float(a[r]) - m) / m) for r in idx.tolist()]


class JobDetector:
    """All detectors of one job.

    Args:
        job_id: the job (copied into every :class:`Anomaly`).
        world_size: number of ranks; reports with ``rank`` outside ``[0, world_size)`` are counted and ignored.
        settings: thresholds; see :class:`DetectionSettings`.

    Notes:
        Job step time: the job's time for step k is the slowest rank's ``step_time_s`` at step k (in synchronous
        training everyone waits for it). Reports are aggregated per step as they arrive; a step is finalised, in
        step order, when all ``world_size`` ranks reported it or when the furthest rank is more than
        ``finalize_lag_steps`` ahead (so a stalled rank never blocks detection). Reports for finalised steps are
        counted as ``late`` and dropped.

        Step regression (rolling robust baseline + sustained change): baseline = median and MAD of
        ``baseline_steps`` accepted job step times, lagging the newest ``confirm_steps`` steps (so a fresh change
        cannot leak into its own reference). A step is slow when ``x / median - 1 >= min_effect`` and
        ``(x - median) / max(1.4826 * MAD, noise_floor * median) >= robust_z``. Fire one ``step_regression``
        (``pattern "step"``) after ``sustain_steps`` consecutive slow steps, or (``pattern "window"``) when the
        median of the last ``confirm_steps`` steps exceeds the baseline by ``min_effect`` and by ``robust_z``
        standard errors of a median (1.2533 * sigma / sqrt(n)); single spikes move neither. Magnitude = median
        excess of the firing window. After firing the baseline is cleared and re-learned from
        ``min_baseline_steps`` new steps (debounce: the new level becomes normal). Drift: when the rolling median
        exceeds the median it had when first learned by ``min_effect``, fire once with ``pattern "drift"`` and
        take the current median as the new reference. Source: Greyhound / Falcon (ATC'25): change point on
        iteration time plus a >= 10 % effect filter; consecutive steps stand in for ByteRobust-style repetition.
        Assumes comparable steps (same work per step). Statistical limit: with step-time noise CV sigma a shift
        right at ``min_effect`` needs ~ (2 * robust_z * sigma / min_effect)^2 steps to confirm; large shifts fire
        after ``sustain_steps`` (see ``bench/bench_detection.py``).

        Rank outlier: per finalised step and per compared stage (``outlier_stages``; plus ``step_time_s`` when
        ``outlier_on_step_time``), peer median m and MAD over the ranks that reported it (>= ``outlier_min_ranks``).
        A rank is outlying when ``(v - m) / max(1.4826 * MAD, noise_floor * m) >= outlier_z`` and
        ``v >= m * (1 + outlier_min_effect)`` and ``v - m >= outlier_min_abs_s``. A rank outlying in
        ``outlier_min_steps`` of the last ``outlier_window_steps`` finalised steps fires one ``rank_outlier``
        (ranks firing at the same step are grouped); it may fire again only after its count fell below half.
        Only *slower* is tested, so ranks that wait longer at a barrier because a peer is slow are not named
        (their compute stage is normal; a pure wait stage is shorter on the slow rank). Source: NVRx straggler
        scores (peer-relative medians), MegaScale per-rank timers; HTA: wait time, not duration, ranks slow ranks.

        Stalled rank (``tick``): a rank that has reported at least once, did not send ``bye`` (``mark_left``), is
        ``>= stall_steps_behind`` steps behind the furthest rank and silent for ``>= stall_after_s`` seconds is
        reported once as ``stalled_rank`` (not as slow: FC-11); it is re-armed when it reports again. A job
        where every rank stops is not reported here (nobody is ahead).

        Exclusions (not in the baseline, not counted in or breaking a slow run, not compared across ranks): the
        first ``warmup_steps`` steps of the job and after each restart, steps any rank reported with
        ``capturing`` true and the ``parse_steps`` steps after them, steps any rank flagged with one of
        ``excluded_flags``, and ranges given to :meth:`exclude_steps`.

        Restarts: a rank whose step goes backwards starts a new epoch. The first rank to do so resets the job
        state (open steps, baseline, runs, outlier counts, exclusions, warm-up); ranks still in the old epoch are
        kept alive for stall checks but their reports are not aggregated until they restart too.
    """

    def __init__(self, job_id: str, world_size: int, settings: DetectionSettings | None = None) -> None:
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        self.job_id = job_id
        self.world_size = world_size
        self.settings = settings or DetectionSettings()
        n = world_size
        self._last_step: list[int] = [_NEVER] * n
        self._last_ts: list[float] = [-math.inf] * n
        self._rank_epoch: list[int] = [0] * n
        self._left: set[int] = set()
        self._stalled: set[int] = set()
        self._epoch = 0
        self.counters: dict[str, int] = {"reports": 0, "late": 0, "duplicate": 0, "bad_rank": 0, "old_epoch": 0,
                                         "restarts": 0, "finalized": 0, "excluded": 0}
        self._reset_job_state()

    # ----------------------------------------------------------------------------------------------- state
    def _reset_job_state(self) -> None:
        s = self.settings
        self._pending: dict[int, _StepAgg] = {}
        self._cursor: int | None = None
        self._furthest: int | None = None
        self._first_step: int | None = None
        self._epoch_start_ts = -math.inf
        self._exclusions: deque[tuple[int, int, str]] = deque(maxlen=s.max_exclusions)
        self._baseline: deque[float] = deque(maxlen=s.baseline_steps)
        self._stats: tuple[float, float] | None = None
        self._stale = 0
        self._run = 0
        self._recent: deque[tuple[int, float, int]] = deque()
        self._reference: float | None = None
        self._last_job_step_s: float | None = None
        self._reset_outliers()

    def _reset_outliers(self) -> None:
        n = self.world_size
        self._hits: list[int] = [0] * n
        self._excess_sum: list[float] = [0.0] * n
        self._ring: deque[list[tuple[int, float]]] = deque()
        self._outlier_reported: set[int] = set()
        self._outlier_stage: dict[int, str] = {}

    @property
    def furthest_step(self) -> int | None:
        """The highest step any rank of the current epoch reported (None before the first report)."""
        return self._furthest

    @property
    def baseline_step_time_s(self) -> float | None:
        """Median job step time of the baseline window in seconds, else the last finalised one, else None."""
        if self._baseline:
            return self._stats_now()[0]
        return self._last_job_step_s

    def update_settings(self, settings: DetectionSettings) -> None:
        """Swap thresholds without losing learned state (windows are resized; outlier counts restart)."""
        old, self.settings = self.settings, settings
        if settings.baseline_steps != old.baseline_steps:
            self._baseline = deque(self._baseline, maxlen=settings.baseline_steps)
            self._stats = None
        if settings.max_exclusions != old.max_exclusions:
            self._exclusions = deque(self._exclusions, maxlen=settings.max_exclusions)
        if (settings.outlier_window_steps, settings.outlier_min_steps) != (old.outlier_window_steps,
                                                                            old.outlier_min_steps):
            self._reset_outliers()

    def mark_left(self, rank: int) -> None:
        """Record that ``rank`` left on purpose (``bye``): it is never reported as stalled until it reports again."""
        if 0 <= rank < self.world_size:
            self._left.add(rank)
            self._stalled.discard(rank)

    def exclude_steps(self, first: int, last: int, reason: str, *, pad_parse_steps: bool = True) -> None:
        """Exclude steps ``first..last`` (inclusive; plus ``parse_steps`` after ``last`` unless ``pad_parse_steps``
        is false) from all detectors, e.g. a capture window planned by the coordinator. ``reason`` is counted."""
        if last < first:
            raise ValueError(f"exclude_steps: last ({last}) < first ({first})")
        pad = self.settings.parse_steps if pad_parse_steps else 0
        self._exclusions.append((first, last + pad, reason))

    # ----------------------------------------------------------------------------------------------- ingest
    def observe(self, report: StepReportLike) -> list[Anomaly]:
        """Ingest one step report; return the anomalies finalising steps produced (usually none).

        O(1) amortised per report. Invalid ranks, duplicates and late reports are counted in ``counters``.
        """
        self.counters["reports"] += 1
        r = report.rank
        if not 0 <= r < self.world_size:
            self.counters["bad_rank"] += 1
            return []
        step = report.step
        last = self._last_step[r]
        self._last_ts[r] = report.ts_unix_s
        if self._stalled and r in self._stalled:
            self._stalled.discard(r)
        if self._left and r in self._left:
            self._left.discard(r)
        if step <= last:
            if step == last:
                self.counters["duplicate"] += 1
                return []
            self._restart_rank(r)
        self._last_step[r] = step
        if self._rank_epoch[r] != self._epoch and not self._join_epoch(r, step, last):
            self.counters["old_epoch"] += 1
            return []
        cursor = self._cursor
        if cursor is None:
            self._cursor = cursor = step
            self._first_step = step
            self._epoch_start_ts = report.ts_unix_s
            self._furthest = step
        elif step < cursor:
            self.counters["late"] += 1
            return []
        e = self._pending.get(step)
        if e is None:
            e = self._pending[step] = _StepAgg()
        e.n += 1
        t = report.step_time_s
        if t > e.max_t:
            e.max_t = t
            e.max_rank = r
        s = self.settings
        if report.flags and e.excluded is None:
            for f in report.flags:
                if f in s.excluded_flags:
                    e.excluded = f
                    break
        if report.capturing:
            self._exclude_capturing(step)
        if report.stages:
            self._add_stages(e, r, report.stages)
        if s.outlier_on_step_time:
            self._add_value(e, r, "step_time_s", t)
        if step > self._furthest:  # type: ignore[operator]
            self._furthest = step
            return self._advance()
        if e.n >= self.world_size and step == cursor:
            return self._advance()
        return []

    def _add_stages(self, e: _StepAgg, r: int, stages: dict[str, float]) -> None:
        wanted = self.settings.outlier_stages
        for name, v in stages.items():
            if wanted is None or name in wanted:
                self._add_value(e, r, name, v)

    def _add_value(self, e: _StepAgg, r: int, name: str, v: float) -> None:
        vals = e.vals
        if vals is None:
            vals = e.vals = {}
        arr = vals.get(name)
        if arr is None:
            if len(vals) >= 32:
                return
            arr = vals[name] = [math.nan] * self.world_size
        arr[r] = v

    def _exclude_capturing(self, step: int) -> None:
        end = step + self.settings.parse_steps
        ex = self._exclusions
        if ex:
            first, last, reason = ex[-1]
            if reason == "capturing" and first <= step <= last + 1:
                if end > last:
                    ex[-1] = (first, end, reason)
                return
        ex.append((step, end, "capturing"))

    def _join_epoch(self, r: int, step: int, last: int) -> bool:
        """Move an old-epoch rank into the current epoch when it never reported before, or its step lies within
        the current run (it restarted but its old counter was low, e.g. it stalled early)."""
        f = self._furthest
        if last == _NEVER or f is None or step <= f + self.settings.finalize_lag_steps + 1:
            self._rank_epoch[r] = self._epoch
            return True
        return False

    def _restart_rank(self, r: int) -> None:
        self._rank_epoch[r] += 1
        if self._rank_epoch[r] > self._epoch:
            self._epoch = self._rank_epoch[r]
            self.counters["restarts"] += 1
            self._reset_job_state()

    # ----------------------------------------------------------------------------------------------- finalise
    def _advance(self) -> list[Anomaly]:
        """Finalise open steps in order while complete or older than the lag; return what fired."""
        out: list[Anomaly] = []
        pending = self._pending
        limit = self._furthest - self.settings.finalize_lag_steps  # type: ignore[operator]
        c = self._cursor
        assert c is not None
        while pending:
            e = pending.get(c)
            if e is None:
                if c > limit:
                    break
                c = min(pending)
                continue
            if e.n < self.world_size and c > limit:
                break
            del pending[c]
            self._finalize(c, e, out)
            c += 1
        if c <= limit:
            c = limit + 1
        self._cursor = c
        return out

    def _excluded_reason(self, step: int, e: _StepAgg) -> str | None:
        if e.excluded is not None:
            return e.excluded
        if self._first_step is not None and step < self._first_step + self.settings.warmup_steps:
            return "warmup"
        ex = self._exclusions
        while ex and ex[0][1] < step:
            ex.popleft()
        for first, last, reason in ex:
            if first <= step <= last:
                return reason
        return None

    def _finalize(self, step: int, e: _StepAgg, out: list[Anomaly]) -> None:
        self.counters["finalized"] += 1
        if self._excluded_reason(step, e) is not None:
            self.counters["excluded"] += 1
            return
        self._last_job_step_s = e.max_t
        a = self._regression(step, e.max_t, e.max_rank)
        if a is not None:
            out.append(a)
        if e.vals:
            a = self._outliers(step, e.vals)
            if a is not None:
                out.append(a)

    def _stats_now(self) -> tuple[float, float]:
        if self._stats is None:
            self._stats = _median_mad(list(self._baseline))
        return self._stats

    def _accept(self, x: float) -> None:
        self._baseline.append(x)
        self._stale += 1
        if self._stale >= _STATS_EVERY or len(self._baseline) <= self.settings.min_baseline_steps:
            self._stats = None
            self._stale = 0

    def _regression(self, step: int, x: float, slowest_rank: int) -> Anomaly | None:
        s = self.settings
        recent = self._recent
        recent.append((step, x, slowest_rank))
        if len(recent) > s.confirm_steps:
            self._accept(recent.popleft()[1])  # the baseline lags the newest confirm_steps steps
        if len(self._baseline) < s.min_baseline_steps:
            return None
        med, mad = self._stats_now()
        if med <= 0:
            return None
        scale = max(_MAD_TO_SIGMA * mad, s.noise_floor * med, 1e-12)
        if x / med - 1.0 >= s.min_effect and (x - med) / scale >= s.robust_z:
            self._run += 1
        else:
            self._run = 0
        fired = None
        if self._run >= s.sustain_steps:
            fired = "step"
            window = list(recent)[-self._run:]
        elif s.confirm_steps >= 2 and len(recent) >= s.confirm_steps:
            window = list(recent)
            wmed = _median_mad([v for _, v, _ in window])[0] if len(window) else med
            if wmed / med - 1.0 >= s.min_effect and (wmed - med) * math.sqrt(len(window)) / (1.2533 * scale) \
                    >= s.robust_z:
                fired = "window"
        if fired is not None:
            xs = [v for _, v, _ in window]
            run_med = _median_mad(xs)[0]
            detail = {"pattern": fired, "first_step": window[0][0], "baseline_s": med, "baseline_mad_s": mad,
                      "step_time_s": run_med, "robust_z": (run_med - med) / scale, "sustain_steps": len(window),
                      "slowest_ranks": sorted({rk for _, _, rk in window})[:16]}
            self._relearn()
            return Anomaly("step_regression", self.job_id, step, (), run_med / med - 1.0, detail)
        if not s.drift_detection or len(self._baseline) < s.min_baseline_steps:
            return None
        med_now = self._stats_now()[0]
        if self._reference is None:
            self._reference = med_now
        elif med_now / self._reference - 1.0 >= s.min_effect:
            ref, self._reference = self._reference, med_now
            detail = {"pattern": "drift", "first_step": None, "baseline_s": ref, "step_time_s": med_now,
                      "sustain_steps": len(self._baseline)}
            return Anomaly("step_regression", self.job_id, step, (), med_now / ref - 1.0, detail)
        return None

    def _relearn(self) -> None:
        """Debounce after a fire: forget the old level; detection resumes after min_baseline_steps new steps."""
        self._baseline.clear()
        self._recent.clear()
        self._stats = None
        self._run = 0
        self._reference = None

    def _outliers(self, step: int, vals: dict[str, list[float]]) -> Anomaly | None:
        s = self.settings
        best: dict[int, tuple[float, str]] = {}
        for name, arr in vals.items():
            for r, rel in _outlying(arr, s):
                if r not in best or rel > best[r][0]:
                    best[r] = (rel, name)
        return self._outlier_window(step, best)

    def _outlier_window(self, step: int, flagged: dict[int, tuple[float, str]]) -> Anomaly | None:
        s = self.settings
        hits, excess_sum = self._hits, self._excess_sum
        for r, (rel, name) in flagged.items():
            hits[r] += 1
            excess_sum[r] += rel
            self._outlier_stage[r] = name
        self._ring.append([(r, rel) for r, (rel, _) in flagged.items()])
        if len(self._ring) > s.outlier_window_steps:
            for r, rel in self._ring.popleft():
                hits[r] -= 1
                excess_sum[r] -= rel
                if hits[r] == 0:
                    self._outlier_stage.pop(r, None)
        if self._outlier_reported:
            for r in [r for r in self._outlier_reported if hits[r] * 2 < s.outlier_min_steps]:
                self._outlier_reported.discard(r)
        new = sorted(r for r in flagged if hits[r] >= s.outlier_min_steps and r not in self._outlier_reported)
        if not new:
            return None
        self._outlier_reported.update(new)
        per_rank = {r: excess_sum[r] / hits[r] for r in new}
        detail = {"window_steps": len(self._ring), "outlying_steps": {r: hits[r] for r in new},
                  "excess": per_rank, "stage": {r: self._outlier_stage.get(r, "") for r in new}}
        return Anomaly("rank_outlier", self.job_id, step, tuple(new), max(per_rank.values()), detail)

    # ----------------------------------------------------------------------------------------------- stalls
    def tick(self, now_unix_s: float) -> list[Anomaly]:
        """Check for stalled ranks at wall time ``now_unix_s`` (seconds, same clock as ``ts_unix_s``).

        O(world_size) with numpy; call it about once a second, not per report.
        """
        furthest = self._furthest
        if furthest is None:
            return []
        s = self.settings
        last_step = np.asarray(self._last_step, dtype=np.int64)
        last_ts = np.asarray(self._last_ts, dtype=np.float64)
        epoch = np.asarray(self._rank_epoch, dtype=np.int64)
        seen = np.isfinite(last_ts)
        behind = furthest - last_step
        current = epoch == self._epoch
        # Old-epoch ranks get stall_after_s from the restart to rejoin (the restart gap is not a stall).
        since = np.where(current, last_ts, np.maximum(last_ts, self._epoch_start_ts))
        silent = (now_unix_s - since) >= s.stall_after_s
        cand = seen & silent & ((current & (behind >= s.stall_steps_behind)) | ~current)
        idx = [int(r) for r in np.flatnonzero(cand).tolist() if r not in self._left and r not in self._stalled]
        if not idx:
            return []
        self._stalled.update(idx)
        detail = {"last_step": {r: int(last_step[r]) for r in idx},
                  "steps_behind": {r: int(behind[r]) if current[r] else None for r in idx},
                  "silent_s": {r: round(float(now_unix_s - last_ts[r]), 3) for r in idx},
                  "furthest_step": furthest}
        return [Anomaly("stalled_rank", self.job_id, furthest, tuple(idx), 1.0, detail)]

    @property
    def stalled_ranks(self) -> frozenset[int]:
        """Ranks currently reported as stalled (cleared when they report again or leave)."""
        return frozenset(self._stalled)
