"""Per-step cross-rank aggregation of one job's step reports, with exclusions (pure; time passed in).

:class:`StepAggregator` turns the job's stream of step reports (any order across ranks, one rank's steps in
order) into :class:`~profwatch.core.detection.types.FinalizedStep` records in step order, each carrying the job
step time, the slowest rank, the per-rank stage values to compare and the reason it is excluded from detection
(warm-up, a capture window and the steps after it, a flagged step, a range the coordinator excluded).

Cost: ``observe`` is O(1) per report (a few list/dict operations). Memory is bounded: at most
``finalize_lag_steps`` + 1 open steps, per-rank lists of ``world_size`` entries, ``max_exclusions`` ranges.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import Protocol

from profwatch.core.detection.settings import DetectionSettings
from profwatch.core.detection.types import FinalizedStep
from rankhook.wire import MAX_CPU_CORES

NEVER = -(2**62)
"""``last_step`` of a rank that never reported."""
MAX_STAGES_PER_STEP = 32
"""Distinct stage names kept per step (more are not recorded for that step): bounds memory per open step whatever a rank sends."""
MAX_OPEN_EXCLUSIONS = 16
"""Open post-capture exclusions (:meth:`StepAggregator.exclude_until_closed`) kept per aggregator; a job has one
capture in flight at a time, so more means their closes were lost."""


CPU_SERIES = "cpu/step"
"""Name of the compared series of the process CPU time per step (``cpu_s`` of the reports), among the stages of a
:class:`FinalizedStep` (a ``/`` no stage name may hold, so it never mixes with a user's stage): seconds of CPU per
step, or per unit of work scaled to the step's work when the ranks report ``work``."""
CPU_MIN_SHARE = 0.1
"""The CPU series of a step is compared only when its median over the ranks is at least this share of the job
step time (wall): a rank whose host only launches device work (a device job, NCCL or HCCL) spends a few percent
of the step on CPU, and its CPU time then says nothing about which rank is slow (``docs/detection.md``)."""


CPU_SAMPLE_MIN_STEPS = 16
"""A rank's CPU time per step from its CPU samples (``cpu_at_step``, ``cpu_total_s``) is taken over at least this
many steps. Samples fall on step boundaries, so the mean is exact, but it stands for each of the rank's steps until
the next value: a mean over one step (a sample after an idle gap, or each step of a slow loop) held over the next
interval counted its one step's noise as many outlying steps of the window (a simulated serving pair: a false
``rank_outlier`` 60 steps before the onset); over 16 steps its noise is a quarter of one step's. A later sample
closer than this to the base is ignored (the next one is measured from the same base)."""
CPU_SAMPLE_SPAN = 3
"""A rank's CPU time per step from samples is the mean over its last this many intervals between samples, all
valid and in a row (fewer after the first sample, a restart or a broken interval: no value yet). The mean stands for
each of the rank's steps until the next sample, so the rank comparison's window (``outlier_min_steps`` of
``outlier_window_steps`` steps) saw one interval's mean, a single observation, as many outlying steps: on a live
2-rank serving loop at a load average of 4-19 on 2 cores, two healthy ranks were named +13 % on ``cpu/step`` 35 s
apart (both captures found nobody; they then read as a rotating culprit and held the real +30 % rank's episode,
``bench/bench_live_serving.py``). Over three intervals one interval's excursion moves the mean a third as much; a
change is seen fully two intervals later (about 0.5 s, or 32 steps of a slow loop)."""
CPU_SAMPLE_HOLD = 3
"""A rank's CPU time per step from samples stands for its steps up to this many of its sampled intervals past the
last sample (a rank whose samples stop, e.g. its process was replaced by an older hook, drops out of the series
instead of repeating an old value)."""


class _CpuRate:
    """One rank's CPU samples (:meth:`StepAggregator._cpu_from_sample`): the base sample, the reports since it, the
    CPU time per step (or per unit of work) of the last interval and the last step it stands for."""

    __slots__ = ("at_step", "broken", "excluded_until", "interval", "last_step", "n", "per_work", "pid", "span",
                 "total_s", "until", "value", "wall_s", "work", "work_n")

    def __init__(self, at_step: int, total_s: float, pid: int | None = None) -> None:
        self.at_step = at_step  # the base sample: step count and CPU seconds
        self.total_s = total_s
        self.pid = pid  # the process the samples come from (the node's attested peer_pid; None: not said)
        self.n = 0  # reports since the base sample, their step times and work (and how many had work)
        self.wall_s = 0.0
        self.work = 0.0
        self.work_n = 0
        self.value: float | None = None  # CPU seconds per step (per unit of work when per_work) of the last interval
        self.per_work = False
        self.interval: float | None = None  # the same for the last interval alone (an independent observation)
        self.until = -1  # the last step the value stands for
        self.last_step = at_step  # the rank's last report counted (the first to carry a sample read at S is S + 1)
        self.broken = False  # a report's step did not follow the last one's since the base (set_step, a lost report)
        # or one of its steps is excluded for this rank (up to excluded_until: capturing and parse_steps after, a flag)
        self.excluded_until = -1
        self.span: deque[tuple[int, float, int, float, int]] = deque(maxlen=CPU_SAMPLE_SPAN)
        """The last valid intervals in a row: (steps, CPU s, reports, their work, reports with work)."""

    def invalidate(self) -> None:
        """No value from this interval, and the span of valid intervals in a row starts over."""
        self.value = None
        self.interval = None
        self.span.clear()

    def rebase(self, at_step: int, total_s: float) -> None:
        self.at_step, self.total_s = at_step, total_s
        self.n, self.wall_s, self.work, self.work_n, self.broken = 0, 0.0, 0.0, 0, False


def _span_value(st: _CpuRate) -> float | None:
    """The CPU time per step of a rank's last :data:`CPU_SAMPLE_SPAN` intervals (``st.span``; sets
    ``st.per_work``): per unit of work when every report of them carried work (their CPU over their mean work per
    report times their steps), else per step; None until the span is full. Sets ``st.interval``: the last
    interval's own value in the same unit (the sequential CPU test's independent observation,
    :attr:`FinalizedStep.cpu_iv`)."""
    if len(st.span) < CPU_SAMPLE_SPAN:
        st.interval = None
        return None
    steps = sum(x[0] for x in st.span)
    cpu = sum(x[1] for x in st.span)
    n = sum(x[2] for x in st.span)
    work = sum(x[3] for x in st.span)
    d_steps, d_cpu, last_n, last_work, _ = st.span[-1]
    if n and all(x[2] and x[4] == x[2] for x in st.span) and work > 0 and last_work > 0:
        st.per_work = True
        st.interval = d_cpu / (last_work / last_n * d_steps)
        return cpu / (work / n * steps)
    st.per_work = False
    st.interval = d_cpu / d_steps
    return cpu / steps


def judge_cpu_series(vals: dict[str, list[float]], step_time_s: float, step_work: float | None,
                     per_work: int, raw: int) -> None:
    """Keep or drop the CPU series of one finalised step's ``vals`` (in place).

    ``per_work``/``raw``: how many ranks' values are CPU seconds per unit of their own work / per step. A step
    whose ranks mix the two is dropped (not comparable); per-work values are scaled by the step's ``work`` (back
    to seconds per step: the same number as the CPU time when the ranks did the same work, so the absolute floors
    of the rank comparison keep their meaning); the series is dropped when its median is under
    :data:`CPU_MIN_SHARE` of ``step_time_s``. A value (scaled) over ``wire.MAX_CPU_CORES * max(step_time_s,
    0.001)`` s, or infinite, is left out (NaN: that rank has no value in this step).
    """
    arr = vals.get(CPU_SERIES)
    if arr is None:
        return
    if per_work and raw:
        del vals[CPU_SERIES]
        return
    if per_work:
        scale = step_work if step_work is not None and step_work > 0 else 1.0
        arr = vals[CPU_SERIES] = [v * scale for v in arr]
    # a value beyond every core busy for the step is no measurement (the bound of cpu_time_ok): a rank reporting a
    # tiny ``work`` (1e-300) read 1.5e300 s per step scaled back, and was named a rank_outlier of +1e302
    cap = MAX_CPU_CORES * max(step_time_s, 0.001)
    if any(not v <= cap for v in arr if not math.isnan(v)):
        arr = vals[CPU_SERIES] = [v if v <= cap else math.nan for v in arr]
    present = sorted(v for v in arr if not math.isnan(v))
    n = len(present)
    if n == 0:
        del vals[CPU_SERIES]
        return
    med = present[n // 2] if n % 2 else 0.5 * (present[n // 2 - 1] + present[n // 2])
    if med < CPU_MIN_SHARE * step_time_s:
        del vals[CPU_SERIES]


class StepReportLike(Protocol):
    """The fields of :class:`rankhook.wire.StepReport` the detectors read (``ts_unix_s``, the rank host's clock,
    is not among them: arrival times are passed separately)."""

    @property
    def rank(self) -> int: ...

    @property
    def step(self) -> int: ...

    @property
    def step_time_s(self) -> float: ...

    @property
    def stages(self) -> dict[str, float] | None: ...

    @property
    def flags(self) -> tuple[str, ...]: ...

    @property
    def capturing(self) -> bool: ...


class _OwnWork:
    """The type of :data:`OWN_WORK`."""


OWN_WORK = _OwnWork()
"""``work`` of :meth:`StepAggregator.observe_run`: each report's own ``work`` field (a number, else None)."""


class _OpenStep:
    """One step not yet finalised: report count, slowest rank, exclusion, per-rank stage values."""

    __slots__ = ("cpu_iv", "cpu_obs", "cpu_per_work", "cpu_raw", "excluded", "max_rank", "max_t", "n", "vals",
                 "work", "work_split")

    def __init__(self) -> None:
        self.work: float | None = None
        self.work_split = False  # ranks reported different work values (FinalizedStep.work_split)
        self.cpu_per_work = 0  # ranks whose CPU series value is per unit of their work
        self.cpu_raw = 0  # ranks whose CPU series value is per step
        self.cpu_obs: list[int] | None = None  # per rank, the sequence number of its CPU value's last interval
        self.cpu_iv: list[float] | None = None  # per rank, that last interval's own value (NaN: none)
        self.n = 0
        self.max_t = -1.0
        self.max_rank = -1
        self.excluded: str | None = None
        self.vals: dict[str, list[float]] | None = None

    def note_work(self, wk: float) -> None:
        """One rank's ``work`` for this step: the largest is the step's; one that differs from another is a split."""
        if self.work is not None and wk != self.work:
            self.work_split = True
        if self.work is None or wk > self.work:
            self.work = wk


class StepAggregator:
    """Aggregates one job's step reports per step and finalises steps in order.

    Args:
        world_size: ranks of the job; reports with ``rank`` outside ``[0, world_size)`` are counted and ignored.
        settings: thresholds (``warmup_steps``, ``finalize_lag_steps``, ``parse_steps``, ``excluded_flags``,
            ``max_exclusions``, ``outlier_stages``, ``outlier_on_step_time``).

    Notes:
        Job step time: the job's time for step k is the slowest reporting rank's ``step_time_s`` at step k (in
        synchronous training everyone waits for it). A step is finalised, in step order, when all
        ``world_size`` ranks reported it or when the furthest rank is more than ``finalize_lag_steps`` ahead (so
        a stalled rank never blocks detection). Reports for finalised steps are counted as ``late`` and dropped;
        a repeated step of a rank as ``duplicate``.

        Exclusions (the step is still finalised, with ``excluded`` set, so detectors can keep their step
        bookkeeping): the first ``warmup_steps`` steps of the job and after each restart; steps any rank
        reported with ``capturing`` true and the ``parse_steps`` steps after them (profiler start, flush and
        parse slow them); steps any rank flagged with one of ``excluded_flags``; ranges given to
        :meth:`exclude_steps` (the coordinator's planned capture windows) and by :meth:`exclude_until_closed`
        (the steps after such a window while its rank dirs are written and parsed).

        Restarts: a rank whose step goes backwards starts a new epoch. The first rank to do so resets the job
        state (open steps, exclusions, warm-up) and :meth:`observe` returns ``restarted=True`` so the caller
        resets its detectors; ranks still in the old epoch are kept for stall checks but their reports are not
        aggregated until they restart too (or their step falls within the new run).
    """

    def __init__(self, world_size: int, settings: DetectionSettings) -> None:
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        self.world_size = world_size
        self.settings = settings
        n = world_size
        self._last_step: list[int] = [NEVER] * n
        self._rank_epoch: list[int] = [0] * n
        self._epoch = 0
        self._cpu_rates: dict[int, _CpuRate] = {}
        """Per rank that sent CPU samples, its :class:`_CpuRate` (created at its first sample)."""
        self._cpu_seq: dict[int, int] = {}
        """Per rank, valid intervals between its CPU samples so far (never reset with a rank's samples: the
        sequence number of an interval, :attr:`FinalizedStep.cpu_obs`)."""
        self.counters: dict[str, int] = {"reports": 0, "late": 0, "duplicate": 0, "bad_rank": 0, "old_epoch": 0,
                                         "restarts": 0, "finalized": 0, "excluded": 0}
        self._reset_job_state()

    def _reset_job_state(self) -> None:
        self._pending: dict[int, _OpenStep] = {}
        self._cursor: int | None = None
        self._furthest: int | None = None
        self._first_step: int | None = None
        self._epoch_start_arrival_s = -math.inf
        self._exclusions: deque[tuple[int, int, str]] = deque(maxlen=self.settings.max_exclusions)
        self._open: dict[str, tuple[int, int]] = {}  # reason -> (first, bound): ranges whose end is not known yet
        self.last_job_step_s: float | None = None

    # -- read-only views (RankProgress) ----------------------------------------------------------------------------
    @property
    def furthest_step(self) -> int | None:
        """The highest step any rank of the current epoch reported (None before the first report)."""
        return self._furthest

    @property
    def last_step(self) -> list[int]:
        """Per rank, the last step it reported (:data:`NEVER` if none). Do not modify."""
        return self._last_step

    @property
    def rank_epoch(self) -> list[int]:
        """Per rank, the epoch (restart count) its reports belong to. Do not modify."""
        return self._rank_epoch

    @property
    def epoch(self) -> int:
        """The job's current epoch (0 until the first step-counter restart)."""
        return self._epoch

    @property
    def epoch_start_arrival_s(self) -> float:
        """Arrival time (coordinator clock, s) of the first report of the current epoch (-inf before any)."""
        return self._epoch_start_arrival_s

    @property
    def open_steps(self) -> int:
        """Steps aggregated but not yet finalised (bounded by ``finalize_lag_steps`` + 1)."""
        return len(self._pending)

    @property
    def exclusion_ranges(self) -> int:
        """Excluded ranges currently kept (bounded by ``max_exclusions``)."""
        return len(self._exclusions)

    # -- control ---------------------------------------------------------------------------------------------------
    def update_settings(self, settings: DetectionSettings) -> None:
        """Swap thresholds; the exclusion list is resized when ``max_exclusions`` changes."""
        old, self.settings = self.settings, settings
        if settings.max_exclusions != old.max_exclusions:
            self._exclusions = deque(self._exclusions, maxlen=settings.max_exclusions)

    def exclude_steps(self, first: int, last: int, reason: str, *, pad_parse_steps: bool = True) -> None:
        """Exclude steps ``first..last`` (inclusive; plus ``parse_steps`` after ``last`` unless
        ``pad_parse_steps`` is false). Raises ``ValueError`` when ``last < first``."""
        if last < first:
            raise ValueError(f"exclude_steps: last ({last}) < first ({first})")
        pad = self.settings.parse_steps if pad_parse_steps else 0
        self._exclusions.append((first, last + pad, reason))

    def exclude_until_closed(self, first: int, reason: str) -> None:
        """Exclude steps from ``first`` on until :meth:`close_exclusion` of ``reason``, at most
        ``parse_max_steps`` of them (so a close that never comes cannot blind detection): a capture's rank-side
        write and parse after its window, whose end the coordinator learns only when the batch is complete. Open
        ranges are kept apart from the closed ones (``max_exclusions`` never evicts one), at most
        :data:`MAX_OPEN_EXCLUSIONS` (the oldest dropped first)."""
        if self.settings.parse_max_steps > 0:
            self._open[reason] = (first, first + self.settings.parse_max_steps - 1)
            while len(self._open) > MAX_OPEN_EXCLUSIONS:
                del self._open[next(iter(self._open))]  # the oldest: its close is long overdue

    def close_exclusion(self, reason: str) -> None:
        """End the range :meth:`exclude_until_closed` began for ``reason`` at the furthest step reported so far
        plus ``parse_steps`` (the steps reported while it was open, and those just after; never past its bound);
        a range that has not begun by then is dropped. Unknown reasons are ignored. O(1)."""
        got = self._open.pop(reason, None)
        if got is None:
            return
        first, bound = got
        last = min(bound, (self._furthest if self._furthest is not None else -1) + self.settings.parse_steps)
        if last >= first:
            self._exclusions.append((first, last, reason))

    # -- ingest ----------------------------------------------------------------------------------------------------
    def observe(self, report: StepReportLike, arrival_unix_s: float, *, rank: int | None = None,
                idle: bool = False, work: float | None = None) -> tuple[list[FinalizedStep], bool]:
        """Ingest one report that arrived at ``arrival_unix_s``; return ``(finalised steps, restarted)``.

        ``rank`` replaces ``report.rank`` (the rank's index within a unit of a serving job); ``idle`` marks the
        step as mostly an idle gap (excluded ``"idle"``); ``work`` is the work the rank reported for the step
        (the step's ``work`` is the largest reported). ``restarted`` is true when this report started a new
        epoch (the caller resets its detectors). O(1) amortised. Invalid ranks, duplicates, late and old-epoch
        reports are counted in ``counters``.
        """
        _next, steps, restarted = self.observe_run((report,), arrival_unix_s, rank=rank, idle=idle, work=work)
        return steps, restarted

    def observe_run(self, reports: Sequence[StepReportLike], arrival_unix_s: float, start: int = 0,
                    end: int | None = None, *, rank: int | None = None, idle: bool = False,
                    work: float | None | _OwnWork = OWN_WORK) -> tuple[int, list[FinalizedStep], bool]:
        """:meth:`observe` for ``reports[start:end]`` (all arrived at ``arrival_unix_s``), in order, up to and
        including the first report that finalised steps or started a new epoch: returns ``(next, finalised
        steps, restarted)``, ``next`` the index of the first report not taken (``end`` when all were taken). The
        caller hands the steps to its detectors (or resets them) before it calls again from ``next``.

        ``rank``, ``idle`` and ``work`` as in :meth:`observe`, for every report; ``work`` left at
        :data:`OWN_WORK` takes each report's own ``work`` (a number, else None). The one implementation of the
        aggregation rules (:meth:`observe` is a run of one).
        """
        counters = self.counters
        ws = self.world_size
        last_step = self._last_step
        rank_epoch = self._rank_epoch
        s = self.settings
        on_step_time = s.outlier_on_step_time
        own_work = isinstance(work, _OwnWork)
        cpu_rates = self._cpu_rates
        end = len(reports) if end is None else end
        # the job state a report may change is held here and written back (a restart resets it: read again)
        epoch, cursor, furthest, pending = self._epoch, self._cursor, self._furthest, self._pending
        i = start
        while i < end:
            report = reports[i]
            i += 1
            r = report.rank if rank is None else rank
            if not 0 <= r < ws:
                counters["bad_rank"] += 1
                continue
            step = report.step
            last = last_step[r]
            restarted = False
            if step <= last:
                if step == last:
                    counters["duplicate"] += 1
                    continue
                restarted = self._restart_rank(r)
                epoch, cursor, furthest, pending = self._epoch, self._cursor, self._furthest, self._pending
            last_step[r] = step
            if rank_epoch[r] != epoch and not self._join_epoch(r, step, last):
                counters["old_epoch"] += 1
                if restarted:
                    break
                continue
            if cursor is None:
                self._cursor = cursor = step
                self._first_step = step
                self._epoch_start_arrival_s = arrival_unix_s
                self._furthest = furthest = step
            elif step < cursor:
                counters["late"] += 1
                if restarted:
                    break
                continue
            e = pending.get(step)
            if e is None:
                e = pending[step] = _OpenStep()
            e.n += 1
            t = report.step_time_s
            if t > e.max_t:
                e.max_t = t
                e.max_rank = r
            wk = getattr(report, "work", None) if own_work else work
            if wk is not None and isinstance(wk, (int, float)):
                e.note_work(wk)
            if idle and e.excluded is None:
                e.excluded = "idle"
            if report.flags and e.excluded is None:
                for f in report.flags:
                    if f in s.excluded_flags:
                        e.excluded = f
                        break
            if report.capturing:
                self._exclude_capturing(step)
            if report.stages:
                wanted = s.outlier_stages
                for name, v in report.stages.items():
                    if wanted is None or name in wanted:
                        self._add_value(e, r, name, v)
            if on_step_time:
                self._add_value(e, r, "step_time_s", t)
            cpu = getattr(report, "cpu_s", None)
            if cpu is not None:  # an older hook: the CPU time of this step
                self._add_cpu(e, r, cpu, wk)
            elif cpu_rates or getattr(report, "cpu_at_step", None) is not None:
                self._cpu_from_sample(e, r, report, wk)
            if step > furthest:  # type: ignore[operator]
                self._furthest = step
                counters["reports"] += i - start
                return i, self._advance(), restarted
            if e.n >= ws and step == cursor:
                counters["reports"] += i - start
                return i, self._advance(), restarted
            if restarted:
                break
        else:
            counters["reports"] += end - start
            return end, [], False
        counters["reports"] += i - start  # stopped at a restart
        return i, [], True

    def _add_cpu(self, e: _OpenStep, r: int, cpu_s: float, work: object) -> None:
        """Record rank ``r``'s CPU time of the step in the CPU series (:data:`CPU_SERIES`): per unit of its
        ``work`` when that is a positive number, else per step (unless ``outlier_stages`` leaves the series out)."""
        if isinstance(work, (int, float)) and work > 0:
            self._add_cpu_value(e, r, cpu_s / work, per_work=True)
        else:
            self._add_cpu_value(e, r, cpu_s, per_work=False)

    def _add_cpu_value(self, e: _OpenStep, r: int, value: float, *, per_work: bool) -> None:
        wanted = self.settings.outlier_stages
        if wanted is not None and CPU_SERIES not in wanted:
            return
        if per_work:
            e.cpu_per_work += 1
        else:
            e.cpu_raw += 1
        self._add_value(e, r, CPU_SERIES, value)

    def _cpu_from_sample(self, e: _OpenStep, r: int, report: StepReportLike, work: object) -> None:
        """Rank ``r``'s CPU time per step from its CPU samples (the current hook: ``cpu_at_step``, ``cpu_total_s``;
        its sampler thread asks for one every ``rankhook.hook.CPU_SAMPLE_S``, read at the end of a step), recorded
        in the CPU series of this report's step.

        Between two samples ``(S0, C0)`` and ``(S1, C1)`` of one process (read at the ends of steps ``S0`` and
        ``S1``) at least :data:`CPU_SAMPLE_MIN_STEPS` apart, the rank's CPU time per step is
        ``(C1 - C0) / (S1 - S0)``; per unit of work when every report of the rank between them carried a positive
        ``work`` (divided by their mean work per step: the reports of steps ``S0 + 1 .. S1``). It stands for the
        rank's steps from the report that carried ``S1`` on, up to :data:`CPU_SAMPLE_HOLD` intervals past ``S1``
        (the comparison lags a change by up to one interval). A closer sample is ignored (the base stays). A
        sample with fewer steps or less CPU time than the base (another process: a restart), or more CPU time
        than ``wire.MAX_CPU_CORES`` cores for the step times reported since the base (at least 1 ms per step;
        counted in ``counters["cpu_bad_sample"]``), becomes the new base and yields no value; so does one whose
        interval holds a gap in the rank's report steps (``rankhook.set_step`` moved the counter: the steps between
        the samples are not the steps done; or a report was lost), or one of this rank's own excluded steps (a
        ``capturing`` report and the ``parse_steps`` after it, a report flagged with one of ``excluded_flags``: the
        profiler's, a trace export's or a checkpoint's CPU time, which a per-step ``cpu_s`` kept on the excluded steps,
        would be spread over the interval's mean and stand for the steps after them). A report from another process (its ``peer_pid``,
        where the node attested it, differs from the base's: a process replaced without a step repeated) drops the
        rank's samples, and that process's first sample is the new base. A report repeating the base's sample
        changes nothing. O(1)."""
        at = getattr(report, "cpu_at_step", None)
        total = getattr(report, "cpu_total_s", None)
        st = self._cpu_rates.get(r)
        step = report.step
        pid = getattr(report, "peer_pid", None)
        if st is not None and pid is not None and st.pid is not None and pid != st.pid:
            # another process (replaced without a step repeated: no restart seen): its CPU time since it started
            # is not the old process's since its sample; its first sample is the new base
            st = None
            del self._cpu_rates[r]
        if st is None:
            if at is None or total is None:
                return
            st = self._cpu_rates[r] = _CpuRate(at, total, pid)
        if at is not None and total is not None and at != st.at_step:
            d_steps = at - st.at_step
            d_cpu = total - st.total_s
            if d_steps < 0 or d_cpu < 0:
                st.invalidate()
            elif d_steps < CPU_SAMPLE_MIN_STEPS:
                at, total = st.at_step, st.total_s  # too close: the base stays
            elif st.broken:  # the steps between the samples are not the reports counted: no value
                st.invalidate()
            elif d_cpu > MAX_CPU_CORES * max(st.wall_s, 0.001 * d_steps):
                self.counters["cpu_bad_sample"] = self.counters.get("cpu_bad_sample", 0) + 1
                st.invalidate()
            else:
                st.span.append((d_steps, d_cpu, st.n, st.work, st.work_n))
                st.value = _span_value(st)
                self._cpu_seq[r] = self._cpu_seq.get(r, -1) + 1
            if at != st.at_step:
                if st.value is not None:
                    st.until = at + CPU_SAMPLE_HOLD * d_steps
                st.rebase(at, total)
        # this report counts for the interval after the sample it carries: the report that carries a sample read
        # at the end of step S is S + 1's, so the reports counted for an interval are its steps
        if step != st.last_step + 1:
            st.broken = True
        if report.capturing:  # the profiler's CPU time, then its trace export's in the parse_steps after
            st.excluded_until = max(st.excluded_until, step + self.settings.parse_steps)
        elif report.flags and any(f in self.settings.excluded_flags for f in report.flags):
            st.excluded_until = max(st.excluded_until, step)  # a checkpoint's serialisation, an evaluation
        if step <= st.excluded_until:
            st.broken = True
        st.last_step = step
        st.n += 1
        st.wall_s += report.step_time_s
        if isinstance(work, (int, float)) and work > 0:
            st.work += work
            st.work_n += 1
        if st.value is not None and step <= st.until:
            self._add_cpu_value(e, r, st.value, per_work=st.per_work)
            if e.cpu_obs is None:
                e.cpu_obs = [-1] * self.world_size
                e.cpu_iv = [math.nan] * self.world_size
            if r < len(e.cpu_obs):
                e.cpu_obs[r] = self._cpu_seq.get(r, -1)
                if e.cpu_iv is not None and st.interval is not None:
                    e.cpu_iv[r] = st.interval

    def _add_value(self, e: _OpenStep, r: int, name: str, v: float) -> None:
        vals = e.vals
        if vals is None:
            vals = e.vals = {}
        arr = vals.get(name)
        if arr is None:
            if len(vals) >= MAX_STAGES_PER_STEP:
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
        if last == NEVER or f is None or step <= f + self.settings.finalize_lag_steps + 1:
            self._rank_epoch[r] = self._epoch
            return True
        return False

    def _restart_rank(self, r: int) -> bool:
        self._cpu_rates.pop(r, None)  # a new process: its CPU samples start afresh
        self._rank_epoch[r] += 1
        if self._rank_epoch[r] > self._epoch:
            self._epoch = self._rank_epoch[r]
            self.counters["restarts"] += 1
            self._reset_job_state()
            return True
        return False

    # -- finalise --------------------------------------------------------------------------------------------------
    def _advance(self) -> list[FinalizedStep]:
        """Finalise open steps in order while complete or older than the lag."""
        out: list[FinalizedStep] = []
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
            out.append(self._finalize(c, e))
            c += 1
        if c <= limit:
            c = limit + 1
        self._cursor = c
        return out

    def _excluded_reason(self, step: int, e: _OpenStep) -> str | None:
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
        if self._open:
            for reason, (first, last) in list(self._open.items()):
                if last < step:
                    del self._open[reason]  # ended by its bound (parse_max_steps): the close never came
                elif first <= step:
                    return reason
        return None

    def _finalize(self, step: int, e: _OpenStep) -> FinalizedStep:
        self.counters["finalized"] += 1
        reason = self._excluded_reason(step, e)
        if reason is not None:
            self.counters["excluded"] += 1
        else:
            self.last_job_step_s = e.max_t
        if e.cpu_per_work or e.cpu_raw:
            judge_cpu_series(e.vals or {}, e.max_t, e.work, e.cpu_per_work, e.cpu_raw)
        obs = tuple(e.cpu_obs) if e.cpu_obs is not None and e.vals and CPU_SERIES in e.vals else None
        iv = tuple(e.cpu_iv) if obs is not None and e.cpu_iv is not None else None
        return FinalizedStep(step, e.max_t, e.max_rank, e.n, e.vals, reason, e.work, cpu_obs=obs, cpu_iv=iv,
                             work_split=e.work_split)
