"""The detectors of one unit of a job: every rank of a training job, or one replica of a serving job (pure).

:class:`UnitPipeline` wires, for a set of ranks: the step aggregator, blocks of fast steps, the serving load
normaliser (serving units only), the step detectors and the stall detector; it maps the unit's rank indices
back to the job's ranks in every :class:`~profwatch.core.detection.types.Anomaly` it returns.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from profwatch.core.detection.aggregation import NEVER, StepAggregator, StepReportLike
from profwatch.core.detection.blocks import StepBlocks
from profwatch.core.detection.rank_outliers import RankOutlierDetector
from profwatch.core.detection.regression import EFFECT_Z, StepTimeRegressionDetector
from profwatch.core.detection.serving import BLOCK_STEPS_WITHOUT_WORK, SERVING_BLOCK_S, LoadNormaliser, RatioBlocks
from profwatch.core.detection.settings import DetectionSettings
from profwatch.core.detection.stalls import ArrivalStallDetector
from profwatch.core.detection.types import Anomaly, FinalizedStep, StallDetector, StepDetector
from profwatch.core.detection.unit_level import UnitLevel

HoldSteps = Callable[[int, float], int]
SERVING_FALSE_ALARM_FACTOR = 1.0
"""A serving unit's mean run between false alarms is this many times ``false_alarm_steps`` blocks of
``SERVING_BLOCK_S`` (a host's load moves its blocks in runs: they are less independent than a training loop's
steps; the delay grows with the log only)."""
SERVING_BASELINE_BLOCKS = 60
"""A serving unit's regression baseline holds at most this many blocks (``baseline_steps`` counts steps of a
training loop; at :data:`~profwatch.core.detection.serving.SERVING_BLOCK_S` per block: the last hour of busy time)."""
SERVING_MIN_BASELINE_BLOCKS = 10
"""Blocks a serving unit's regression baseline needs before its change-point test runs (before: the learning
path, rises of ``spike_min_effect`` that last two blocks)."""
SERVING_LAG_BLOCKS = 8
"""The newest blocks enter a serving unit's regression baseline only this late."""
LOCKSTEP_STEPS = 4
"""A serving unit's ranks whose last steps are at most this many apart at a check are in lock-step (see
:meth:`UnitPipeline.note_lockstep`; or :data:`LOCKSTEP_S` of steps if more)."""
LOCKSTEP_S = 1.0
"""Seconds of a serving unit's usual step its ranks may be apart at a check and still be in lock-step (reports of
one tensor-parallel group arrive in batches)."""
LOCKSTEP_CHECKS = 10
"""Checks in a row (about a second apart) that see a serving unit's ranks in lock-step before they are compared
with each other from :data:`SERVING_OUTLIER_MIN_RANKS` ranks on."""
SERVING_OUTLIER_MIN_RANKS = 2
"""A serving unit's ranks (a replica's tensor-parallel group, 2-8 ranks) are compared with each other from this many
on (``outlier_min_ranks`` when smaller): the ranks of one TP group run the same shapes, so one rank slower than
its peers is a fault, and at the default of 4 a group of 2 or 3 was never compared; its change was left to the
unit's step time, judged against load bands that a change in the unit's first minutes enters (bench_corpus
serving_work and serving_nowork seed 31: a 1.25x and a 3x rank of a TP-2 group, lost)."""


class UnitPipeline:
    """Detectors of one unit (``ranks``: the job's ranks of the unit, in order; index i is rank ``ranks[i]``).

    Args:
        job_id: copied into every anomaly.
        ranks: the unit's ranks.
        settings: thresholds.
        hold_steps: ``(step, step_time_s) -> steps`` the capture planner's lead (the spike hold).
        serving: judge step times through a :class:`LoadNormaliser` (idle gaps excluded, loads compared apart).
        roles: role label per job rank (None = not sent).
        whole_job: the unit is the whole job (a job-wide regression then names no ranks).
        step_detectors / stall_detector: replace the defaults (then no normaliser is applied).

    Notes:
        Finalised steps go through :class:`~profwatch.core.detection.blocks.StepBlocks`; the regression detector
        gets them normalised in a serving unit (ratios to the usual time at that load) and raw otherwise; the
        other step detectors get them raw (a serving unit's rank comparison through its own blocks,
        :attr:`outlier_blocks`, without the 16-step floor of steps without ``work``). A serving unit's shared
        levels (:class:`~profwatch.core.detection.unit_level.UnitLevel`) get its blocks with ``work`` and, in
        another model, its finalised steps without ``work`` one by one. The spike hold is converted from steps to blocks. In a unit that is
        not the whole job, a ``step_regression`` or ``drift`` names the unit's ranks (``detail["unit"]``). A
        serving unit checks no stalls and detects no drift (its ratios follow the load by construction). A serving
        unit whose ranks step in lock-step (:meth:`note_lockstep`: a tensor-parallel group) compares them from
        :data:`SERVING_OUTLIER_MIN_RANKS` ranks on.
        Without ``work``, a ``step_regression`` of a serving unit needs the run's mean excess itself to reach
        ``min_effect`` (the regression detector's ``effect_z`` is 0 there, 2 otherwise): the ratios then still
        follow the batch size, which the busy fraction does not see and which wanders for tens of steps (a batch
        30 % over its usual size for 45 steps made 3 blocks of +8 %, and mean + 2 standard errors passed 10 %:
        a false page on healthy traffic); a change of at least ``min_effect`` still fires on the same block.
    """

    def __init__(self, job_id: str, ranks: Sequence[int], settings: DetectionSettings, hold_steps: HoldSteps, *,
                 serving: bool = False, roles: Sequence[str | None] | None = None, whole_job: bool = True,
                 step_detectors: Sequence[StepDetector] | None = None,
                 stall_detector: StallDetector | None = None) -> None:
        self.ranks = list(ranks)
        self.index = {r: i for i, r in enumerate(self.ranks)}
        self.whole_job = whole_job
        self._identity = self.ranks == list(range(len(self.ranks)))
        n = len(self.ranks)
        self.aggregator = StepAggregator(n, settings)
        self.blocks = StepBlocks(settings, min_steps_without_work=BLOCK_STEPS_WITHOUT_WORK if serving else 1)
        self.outlier_blocks = StepBlocks(settings) if serving and step_detectors is None else None
        """A serving unit's rank comparison gets its own blocks, without the 16-step floor of steps without ``work``
        (see :meth:`_judge`)."""
        self._hold_steps = hold_steps
        self.normaliser = LoadNormaliser(settings) if serving and step_detectors is None else None
        self.ratio_blocks = RatioBlocks() if self.normaliser is not None else None
        self.level = UnitLevel(job_id, settings) if self.normaliser is not None else None
        self.level_nowork = UnitLevel(job_id, settings, without_work=True) if self.normaliser is not None else None
        """The shared level of a serving unit's steps without ``work``, given step by step (see :meth:`_judge`)."""
        self._block_ends: deque[int] = deque(maxlen=SERVING_LAG_BLOCKS + 1)
        self.regression: StepTimeRegressionDetector | None = None
        self.outliers: RankOutlierDetector | None = None
        if step_detectors is None:
            self.regression = StepTimeRegressionDetector(job_id, self._regression_settings(settings),
                                                         hold_steps=self._hold,
                                                         first_learning_checks=self.normaliser is None,
                                                         high_noise_confirm=self.normaliser is None,
                                                         serial_noise=self.normaliser is not None)
            local_roles = [roles[r] for r in self.ranks] if roles is not None else None
            self.outliers = RankOutlierDetector(job_id, n, settings, roles=local_roles)
            step_detectors = [self.regression, self.outliers]
        self.step_detectors: list[StepDetector] = list(step_detectors)
        self._settings = settings
        self._lockstep: int | None = 0
        """Checks in a row that saw this serving unit's ranks in lock-step (None: seen apart once, never again)."""
        self._replicas = False
        """Whether this serving unit's ranks reported different ``work`` for one step (:attr:`FinalizedStep.work_split`):
        they are independent replicas not split yet, whose steps of one number ran different batches at different
        times, and they are never compared as ranks again (lock-step counters alone let two such replicas of
        bench_corpus --healthy-hours serving_dp seed 103 run 11, batches of 2 and 16 at step 125, be compared and
        one named +14 %)."""
        self.stall: StallDetector = stall_detector or ArrivalStallDetector(job_id, n, settings)
        self.serving = serving

    def _regression_settings(self, settings: DetectionSettings) -> DetectionSettings:
        """A serving unit's regression detector judges ratios to load-band references that follow the load:
        their level carries no drift, so drift detection is off there; it judges blocks of
        :data:`~profwatch.core.detection.serving.SERVING_BLOCK_S` seconds (:class:`RatioBlocks`), so its baseline
        counts blocks (:data:`SERVING_BASELINE_BLOCKS`, :data:`SERVING_MIN_BASELINE_BLOCKS`,
        :data:`SERVING_LAG_BLOCKS`, each at most the setting), and its mean run between false alarms is
        :data:`SERVING_FALSE_ALARM_FACTOR` times ``false_alarm_steps`` blocks."""
        if self.normaliser is None:
            return settings
        base = min(settings.baseline_steps, SERVING_BASELINE_BLOCKS)
        return settings.model_copy(update={
            "drift_detection": False, "false_alarm_steps": settings.false_alarm_steps * SERVING_FALSE_ALARM_FACTOR,
            "baseline_steps": base, "min_baseline_steps": min(base, settings.min_baseline_steps,
                                                              SERVING_MIN_BASELINE_BLOCKS),
            "baseline_lag_steps": min(settings.baseline_lag_steps, SERVING_LAG_BLOCKS)})

    def _outlier_settings(self, settings: DetectionSettings) -> DetectionSettings:
        """A serving unit whose ranks were seen in lock-step (:meth:`note_lockstep`: a replica's tensor-parallel
        group) compares them from :data:`SERVING_OUTLIER_MIN_RANKS` ranks on, at most ``outlier_min_ranks``;
        other units: the settings."""
        if not self._small_groups or settings.outlier_min_ranks <= SERVING_OUTLIER_MIN_RANKS:
            return settings
        return settings.model_copy(update={"outlier_min_ranks": SERVING_OUTLIER_MIN_RANKS})

    def note_lockstep(self, last_steps: Sequence[int]) -> None:
        """One check of a serving unit's ranks' last steps (the ranks that reported; called about once a second by
        ``JobDetector.tick``): they are in lock-step when at most :data:`LOCKSTEP_STEPS` apart, or the steps of
        :data:`LOCKSTEP_S` seconds of the unit's usual step if more. After :data:`LOCKSTEP_CHECKS` such checks in
        a row the unit's ranks are compared with each other from :data:`SERVING_OUTLIER_MIN_RANKS` on; one check
        that sees them further apart ends that for this unit for good (independent replicas not split yet: their
        steps of one number ran different batches at different times, and compared as ranks they were named on
        healthy traffic, bench_corpus serving_dp). No-op outside serving mode or when nothing changes."""
        if self.normaliser is None or self.outliers is None or self._lockstep is None or len(last_steps) < 2:
            return
        usual = self.normaliser.usual_step_s
        allowed = max(LOCKSTEP_STEPS, math.ceil(LOCKSTEP_S / usual) if usual is not None and usual > 0 else 0)
        was = self._small_groups
        self._lockstep = self._lockstep + 1 if max(last_steps) - min(last_steps) <= allowed else None
        if self._small_groups != was:
            self.outliers.update_settings(self._outlier_settings(self._settings))

    @property
    def _small_groups(self) -> bool:
        """Whether this serving unit's ranks were seen in lock-step for :data:`LOCKSTEP_CHECKS` checks in a row."""
        return self.normaliser is not None and self._lockstep is not None and self._lockstep >= LOCKSTEP_CHECKS

    def _hold(self, step: int, step_time_s: float) -> int:
        if self.normaliser is not None:  # blocks of SERVING_BLOCK_S: the lead in seconds, in blocks
            step_time_s = self.normaliser.usual_step_s or step_time_s
            lead_s = self._hold_steps(step, step_time_s) * step_time_s
            return max(1, math.ceil(lead_s / SERVING_BLOCK_S))
        lead = self._hold_steps(step, step_time_s)
        size = self.blocks.size or 1
        return max(1, -(-lead // size))

    @property
    def usual_step_s(self) -> float | None:
        """The unit's usual step time (seconds): the regression baseline (raw units) or the recent median (serving),
        else the last job step time, else None."""
        if self.normaliser is not None:
            v = self.normaliser.usual_step_s
            if v is not None:
                return v
        elif self.regression is not None:
            v = self.regression.baseline_step_time_s
            if v is not None:
                return v
        return self.aggregator.last_job_step_s

    @property
    def idle_reference_s(self) -> float | None:
        """The usual step (seconds) that idle gaps are judged against: a serving unit's median of its non-idle
        steps (None until it has one: never the last step, which may itself be a gap), else
        :attr:`usual_step_s`."""
        if self.normaliser is not None:
            return self.normaliser.usual_step_s
        return self.usual_step_s

    def update_settings(self, settings: DetectionSettings) -> None:
        """Swap thresholds in every part."""
        self._settings = settings
        self.aggregator.update_settings(settings)
        self.blocks.update_settings(settings)
        if self.outlier_blocks is not None:
            self.outlier_blocks.update_settings(settings)
        if self.normaliser is not None:
            self.normaliser.settings = settings
        for d in self.step_detectors:
            d.update_settings(self._regression_settings(settings) if d is self.regression
                              else self._outlier_settings(settings) if d is self.outliers else settings)
        self.stall.update_settings(settings)

    def set_role(self, rank: int, role: str | None) -> None:
        """Record the role label of job rank ``rank``."""
        i = self.index.get(rank)
        if i is not None and self.outliers is not None:
            self.outliers.set_role(i, role)

    def observe(self, report: StepReportLike, now_unix_s: float, *, idle: bool = False,
                work: float | None = None) -> list[Anomaly]:
        """Ingest one report of a rank of this unit (see ``JobDetector.observe``)."""
        i = self.index[report.rank]
        self.stall.on_arrival(i, now_unix_s)
        steps, restarted = self.aggregator.observe(report, now_unix_s, rank=i, idle=idle, work=work)
        if not steps and not restarted:
            return []  # the common report: no step finalised
        return self._judge(steps, restarted)

    def observe_run(self, reports: Sequence[StepReportLike], now_unix_s: float, start: int, end: int
                    ) -> tuple[int, list[Anomaly]]:
        """:meth:`observe` for ``reports[start:end]``, reports of this unit that are no idle gap (``idle``
        false, each report's own ``work``), in order, up to and including the first that produced anomalies:
        returns ``(next, anomalies)`` (``next == end`` when all were taken). The unit's ranks must be the job's
        ranks themselves (:attr:`identity`)."""
        stall = self.stall
        many = getattr(stall, "on_arrivals", None)  # the built-in detector's: one call per run (a custom: per report)
        agg = self.aggregator
        k = start
        while k < end:
            j, steps, restarted = agg.observe_run(reports, now_unix_s, k, end)
            if many is not None:
                many(reports, k, j, now_unix_s)
            else:
                for x in range(k, j):
                    stall.on_arrival(reports[x].rank, now_unix_s)
            k = j
            if steps or restarted:
                out = self._judge(steps, restarted)
                if out:
                    return k, out
        return end, []

    @property
    def identity(self) -> bool:
        """True when the unit's rank indices are the job's ranks (a training job's one unit)."""
        return self._identity

    def _judge(self, steps: list[FinalizedStep], restarted: bool) -> list[Anomaly]:
        """Reset the detectors after a restart, then hand them the finalised steps; return their anomalies."""
        if restarted:
            self.blocks.reset()
            if self.outlier_blocks is not None:
                self.outlier_blocks.reset()
            if self.normaliser is not None:
                self.normaliser.reset()
            if self.ratio_blocks is not None:
                self.ratio_blocks.reset()
                self._block_ends.clear()
            if self.normaliser is not None:
                self.normaliser.cutoff_step = None
            for lv in self._levels:
                lv.reset()
            for d in self.step_detectors:
                d.reset()
        out: list[Anomaly] = []
        for fs0 in steps:
            if self.normaliser is not None:
                self.normaliser.note_step(fs0)
            if self.ratio_blocks is not None:
                self.ratio_blocks.elapse(fs0.time_s)
            for lv in self._levels:
                lv.elapse(fs0.time_s)
            if self.level_nowork is not None and fs0.excluded is None and fs0.work is None:
                out.extend(self._level_found(self.level_nowork, fs0))
            if self.outlier_blocks is not None and self.outliers is not None:
                if fs0.work_split and not self._replicas:
                    self._replicas = True
                    self._lockstep = None
                    self.outliers.update_settings(self._outlier_settings(self._settings))
                for fb in self.outlier_blocks.push(fs0):
                    if not self._replicas:
                        out.extend(self._to_job(a) for a in self.outliers.on_step(fb))
            for fs in self.blocks.push(fs0):
                if self.level is not None and fs.excluded is None and fs.work is not None:
                    out.extend(self._level_found(self.level, fs))
                rf = self.normaliser.normalise(fs) if self.normaliser is not None else fs
                if self.normaliser is not None and self.regression is not None:
                    self.regression.effect_z = EFFECT_Z if fs.work is not None else 0.0
                    self.regression.provisional = fs.work is not None
                judged = self.ratio_blocks.push(rf) if self.ratio_blocks is not None else [rf]
                for d in self.step_detectors:
                    if d is self.outliers and self.outlier_blocks is not None:
                        continue
                    if d is not self.regression:
                        out.extend(self._to_job(a) for a in d.on_step(fs))
                        continue
                    for rec in judged:
                        out.extend(self._to_job(a) for a in self._regress(rec))
        return out

    def _regress(self, rec: FinalizedStep) -> list[Anomaly]:
        """The regression detector's findings on ``rec``; in a serving unit a reported change (a rise) and a
        speedup (a fall) become the new normal of every load band at once."""
        assert self.regression is not None
        found = self.regression.on_step(rec)
        if self.normaliser is not None and rec.excluded is None:
            self._follow_blocks(rec.step)
        if found and self.normaliser is not None:
            self._rebase_loads(found)
        if self.regression.speedup_ratio is not None:
            ratio, self.regression.speedup_ratio = self.regression.speedup_ratio, None
            if self.normaliser is not None:  # a fall is the new normal of every band too
                self.normaliser.rescale(ratio, self._first_step(self.regression.speedup_first_step))
                self.regression.rebase(ratio)
        return found

    @property
    def _levels(self) -> list[UnitLevel]:
        """The serving unit's shared levels (with and without ``work``; none outside serving mode)."""
        return [lv for lv in (self.level, self.level_nowork) if lv is not None]

    def _level_found(self, level: UnitLevel, fs: FinalizedStep) -> list[Anomaly]:
        """A shared level's findings on one judged record: ``self.level`` gets the blocks of steps with ``work``;
        ``self.level_nowork`` every finalised step without ``work``, one by one (not the 16-step blocks the load
        bands judge: blocks of 60 s then held 8 of those, 2 minutes of a slowed unit's steps, and a 3x change
        was found 10-17 minutes after its onset instead of 5-8), with a noise floor and a least change that the
        batch, which nothing there measures, cannot reach on healthy traffic (``unit_level.NOWORK_*``). A rise
        it reports is the new normal of the load bands, the regression detector (as :meth:`adopt_rise`) and the
        other level, so none reports it again."""
        found = level.add(fs.step, fs.time_s, fs.work)
        for a in found:
            first = a.detail.get("first_step")
            first_step = first if isinstance(first, int) else None
            for other in self._levels:
                if other is not level:
                    other.rebase(math.log1p(a.magnitude), first_step)
            self._adopt_rise(1.0 + a.magnitude, first_step)
        return [self._to_job(a) for a in found]

    def adopt_rise(self, factor: float, first_step: int | None) -> None:
        """A rise of ``factor`` (> 1: new time / old) of this serving unit from its step ``first_step`` on, found
        and reported by another detector (``ReplicaPeers``), is its new normal: every load band is rescaled
        (:meth:`LoadNormaliser.rescale`) and the regression detector drops the evidence it gathered for it, so the
        unit's own test does not report (and arm) the same change again minutes later (bench_workloads
        serving_dp: 2 arms for one +30 % replica). No-op outside serving mode."""
        if factor > 0:
            for lv in self._levels:
                lv.rebase(math.log(factor), first_step)
        self._adopt_rise(factor, first_step)

    def _adopt_rise(self, factor: float, first_step: int | None) -> None:
        if self.normaliser is None or self.regression is None:
            return
        self.normaliser.rescale(factor, first_step)
        if self.ratio_blocks is not None:
            self.ratio_blocks.rescale(factor, first_step)
        self.regression.forget_rise()

    def _follow_blocks(self, step: int) -> None:
        """The load bands take in values only :data:`SERVING_LAG_BLOCKS` blocks late, and none while the regression
        detector gathers evidence of a rise (the references a change is judged against hold none of it until the
        test decides; before, a busy band took a +30 % replica in within one block and it was never found)."""
        assert self.normaliser is not None and self.regression is not None
        self._block_ends.append(step)
        if len(self._block_ends) > SERVING_LAG_BLOCKS and not self.regression.rising:
            self.normaliser.cutoff_step = self._block_ends[0]

    def _rebase_loads(self, found: list[Anomaly]) -> None:
        assert self.normaliser is not None and self.regression is not None
        for a in found:
            if a.kind == "step_regression" and a.detail.get("pattern") in ("cusum", "level"):
                first = a.detail.get("first_step")
                self.normaliser.rescale(1.0 + a.magnitude, self._first_step(first) if isinstance(first, int) else None)
                if a.magnitude > -1.0:
                    for lv in self._levels:
                        lv.rebase(math.log1p(a.magnitude), self._first_step(first) if isinstance(first, int) else None)
                self.regression.rebase(1.0 + a.magnitude)  # the reported level it judges against, in the new scale

    def _first_step(self, step: int) -> int:
        return self.ratio_blocks.first_step_of(step) if self.ratio_blocks is not None else step

    def watch_state(self) -> dict[str, Any]:
        """What a serving unit is judged on now (for ``status``): ``{"ranks": [job ranks], "state": ...}`` with
        ``state`` one of ``"no_busy_step"`` (every finalised step so far was an idle gap or excluded: nothing is
        judged), ``"no_step"`` (nothing finalised yet), ``"learning"`` (its regression baseline is not formed:
        only rises of ``spike_min_effect`` that outlast the hold are found; ``blocks`` the blocks of
        :data:`~profwatch.core.detection.serving.SERVING_BLOCK_S` taken, ``blocks_needed`` the count at which its
        change-point test starts) or ``"watched"`` (the change-point test runs). A unit whose bands learn reads
        ``learning`` with 0 blocks (its steps are not judged yet). Outside serving mode: ``"watched"`` or
        ``"learning"`` likewise, counting steps (or blocks of fast steps)."""
        out: dict[str, Any] = {"ranks": list(self.ranks)}
        finalized = self.aggregator.counters.get("finalized", 0)
        if finalized == 0:
            out["state"] = "no_step"
        elif self.normaliser is not None and self.normaliser.usual_step_s is None:
            out["state"] = "no_busy_step"
        elif self.regression is not None and (p := self.regression.learning_progress) is not None:
            out.update(state="learning", blocks=p[0], blocks_needed=p[1])
        else:
            out["state"] = "watched"
        return out

    def check_stalls(self, now_unix_s: float) -> list[Anomaly]:
        """The stall detector's check, mapped to job ranks; none in a serving unit (see ``JobDetector`` Notes)."""
        if self.serving:
            return []
        return [self._to_job(a) for a in self.stall.check(self.aggregator, now_unix_s)]

    def _to_job(self, a: Anomaly) -> Anomaly:
        if self._identity and self.whole_job:
            return a
        ranks = tuple(self.ranks[i] for i in a.ranks)
        detail = {k: ([self.ranks[i] for i in v] if k == "slowest_ranks" else self._map(v))
                  for k, v in a.detail.items()}
        if not a.ranks and not self.whole_job:
            ranks = tuple(self.ranks)
            detail["unit"] = list(ranks)
        return replace(a, ranks=ranks, detail=detail)

    def _map(self, v: Any) -> Any:
        """Rank-keyed dicts and rank lists of a detail, mapped from unit indices to job ranks."""
        if isinstance(v, dict) and v and all(isinstance(k, int) and 0 <= k < len(self.ranks) for k in v):
            return {self.ranks[k]: x for k, x in v.items()}
        return v

    @property
    def stalled_ranks(self) -> frozenset[int]:
        """The unit's stalled ranks, as job ranks."""
        return frozenset(self.ranks[i] for i in self.stall.stalled_ranks)

    def ongoing(self) -> dict[str, frozenset[int]]:
        """Per anomaly kind, the job ranks the unit's step detectors still name (``rank_outlier``: reported and
        not cleared)."""
        out: dict[str, frozenset[int]] = {}
        for d in self.step_detectors:
            if isinstance(d, RankOutlierDetector):
                out["rank_outlier"] = out.get("rank_outlier", frozenset()) | frozenset(
                    self.ranks[i] for i in d.reported_ranks)
        return out

    def mark_left(self, rank: int) -> None:
        """Job rank ``rank`` said bye."""
        i = self.index.get(rank)
        if i is not None:
            self.stall.mark_left(i)

    def last_steps(self) -> dict[int, int | None]:
        """Job rank -> the last step it reported in this unit (None = never)."""
        return {r: (s if s != NEVER else None) for r, s in zip(self.ranks, self.aggregator.last_step, strict=True)}

    def counters(self) -> dict[str, int]:
        """The aggregator's counters plus the regression detector's and its spike filter's."""
        out = dict(self.aggregator.counters)
        if self.regression is not None:
            out.update(self.regression.counters)
            out.update(self.regression.spikes.counters)
        return out
