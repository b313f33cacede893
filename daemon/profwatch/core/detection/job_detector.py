"""Step-time anomaly detection for one job (pure: data in, anomalies out; time is passed in).

:class:`JobDetector` is the facade the coordinator and ``profwatch replay`` use. A training job is one unit; a
serving job (``mode="serving"`` from the rank, or detected from idle gaps) is split into the units that step
together (its replicas, ``daemon/profwatch/core/detection/serving.py``). Each unit is a
:class:`~profwatch.core.detection.pipeline.UnitPipeline`: a
:class:`~profwatch.core.detection.aggregation.StepAggregator` (per-step cross-rank aggregation and exclusions),
:class:`~profwatch.core.detection.blocks.StepBlocks` (blocks of fast steps) and swappable detectors behind two
small Protocols (``daemon/profwatch/core/detection/types.py``):

* ``StepDetector`` (fed each finalised step or block): :class:`~profwatch.core.detection.regression.StepTimeRegressionDetector`
  (``step_regression``, ``step_spike``, ``periodic_spike``, ``drift``) and
  :class:`~profwatch.core.detection.rank_outliers.RankOutlierDetector` (``rank_outlier``, ``structural_imbalance``);
* ``StallDetector`` (fed arrival times, checked by :meth:`JobDetector.tick`):
  :class:`~profwatch.core.detection.stalls.ArrivalStallDetector` (``stalled_rank``).

Each detector documents its algorithm, thresholds and sources in its ``Notes:``. Thresholds live in
:class:`DetectionSettings` and can be swapped at runtime with :meth:`JobDetector.update_settings`.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import Any, Literal

from profwatch.core.detection.aggregation import StepAggregator, StepReportLike
from profwatch.core.detection.interruptions import Returned
from profwatch.core.detection.pipeline import HoldSteps, UnitPipeline
from profwatch.core.detection.regression import DEFAULT_HOLD_STEPS
from profwatch.core.detection.serving import SERVING_BLOCK_S, ReplicaPeers, UnitSplitter, is_idle_gap
from profwatch.core.detection.settings import DetectionSettings
from profwatch.core.detection.types import Anomaly, AnomalyKind, FinalizedStep, StallDetector, StepDetector

__all__ = ["Anomaly", "AnomalyKind", "DetectionSettings", "FinalizedStep", "JobDetector", "JobMode",
           "StepReportLike"]

JobMode = Literal["training", "serving"]
DETECT_WINDOW_S = 900.0
"""Idle gaps switch a job to serving mode only when ``serving_detect_gaps`` of them fall within this many
seconds on one rank (a checkpoint every half hour is not a server)."""
MIN_LATTICE_STEPS = 10
"""Steps between consecutive idle gaps of one rank, all of them equal and at least this many, that make the gaps a
training job's own periodic pause (a checkpoint every N steps), never a switch to serving mode: a server's idle gaps
follow its traffic, not a step lattice. Ten: a server with one request per burst leaves gaps 1-2 steps apart, on a
lattice too. ``bench/bench_new_shapes.py`` ``eval_ckpt`` seed 31: 6 of 12 training jobs whose 10-120 s checkpoint
came every 200-800 steps (3 within :data:`DETECT_WINDOW_S`) were switched to serving mode, and run 6's evaluation
of 38 steps was then reported as a serving unit's level change (``unit_level``, step 1360) and armed."""
SERVING_VIEW_UNITS = 16
"""Units (replicas) listed one by one in :meth:`JobDetector.serving_view` at most (the counts cover all)."""


def _default_hold(step: int, step_time_s: float) -> int:
    """The spike hold without a planner: :data:`DEFAULT_HOLD_STEPS` steps at any step and step time."""
    return DEFAULT_HOLD_STEPS


class JobDetector:
    """All detectors of one job.

    Args:
        job_id: the job (copied into every :class:`Anomaly`).
        world_size: number of ranks; reports with ``rank`` outside ``[0, world_size)`` are counted and ignored.
        settings: thresholds; see :class:`DetectionSettings`.
        hold: ``(step, step_time_s) -> steps`` a spike may last and stay transient: the capture planner's lead,
            handed in by the composition root (``profwatch.core.capture.planner.spike_hold``; detection does not
            import the planner). None: :data:`~profwatch.core.detection.regression.DEFAULT_HOLD_STEPS` steps.
            ``spike_hold_steps``, when set, overrides either.
        step_detectors: replaces the default ``[StepTimeRegressionDetector, RankOutlierDetector]`` (the job then
            stays one training unit).
        stall_detector: replaces the default :class:`ArrivalStallDetector` (idem).
        mode: ``"training"`` or ``"serving"`` when known (the hello's ``mode``); None = training until a rank
            says ``mode="serving"`` in a report or idle gaps show it.
        roles: role label per rank when known (the hello's ``role``; a report's ``role`` updates it).

    Raises:
        ValueError: ``world_size < 1``.

    Notes:
        Reports go to their unit's aggregator; every step it finalises (in step order, excluded ones flagged)
        goes, in blocks at high step rates, to each step detector in turn; a step-counter restart resets them
        all. Arrival times go to the stall detector, which :meth:`tick` checks. Nothing here reads a rank host's
        clock: stalls use the arrival time the caller passes to :meth:`observe`.

        Optional report fields (read with ``getattr``, absent on older hooks): ``mode``, ``role``, ``work``.
        Serving mode: a step of at least ``serving_idle_gap_s`` and ``idle_gap_factor`` times the unit's usual
        step is an idle gap (:func:`~profwatch.core.detection.serving.is_idle_gap`): excluded from detection
        (``"idle"``), neither step time nor a stall. Without a ``mode``, ``serving_detect_gaps`` idle gaps on
        one rank within :data:`DETECT_WINDOW_S` switch the job to serving mode (0 = never), unless they are
        :data:`MIN_LATTICE_STEPS` or more steps apart, all alike (a periodic checkpoint). In serving mode the
        detectors start afresh, the regression detector judges step times normalised by load
        (:class:`~profwatch.core.detection.serving.LoadNormaliser`), and at each :meth:`tick` the ranks are
        split into units whose step counters stay together
        (:class:`~profwatch.core.detection.serving.UnitSplitter`); each unit is judged on its own (its own
        steps, baseline and outliers), so replicas are never late to each other. No ``stalled_rank`` is judged in
        serving mode: an idle replica is not stalled, a tensor-parallel peer that hangs blocks its unit (nobody
        goes on without it), and a replica that stops with queued work cannot be told from an idle one from
        step reports and keepalives alone (the hook sends no queue depth).

        Cost: O(1) amortised per report; the step detectors' work runs once per finalised step or block
        (amortised over the unit's ranks); ``tick`` is O(world_size log world_size) in serving mode, else
        O(world_size).
    """

    def __init__(self, job_id: str, world_size: int, settings: DetectionSettings | None = None, *,
                 hold: HoldSteps | None = None, step_detectors: Sequence[StepDetector] | None = None,
                 stall_detector: StallDetector | None = None, mode: JobMode | None = None,
                 roles: Sequence[str | None] | None = None) -> None:
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        s = settings or DetectionSettings()
        self.job_id = job_id
        self.world_size = world_size
        self.settings = s
        self._hold: HoldSteps = hold or _default_hold
        self._custom = step_detectors is not None or stall_detector is not None
        self._roles: list[str | None] = list(roles) if roles is not None else [None] * world_size
        if len(self._roles) != world_size:
            raise ValueError("roles needs one entry per rank")
        self.mode: JobMode = mode or "training"
        self._mode_given = mode is not None
        self._gaps: dict[int, deque[tuple[float, int]]] = {}
        self._splitter: UnitSplitter | None = None
        self._retired: dict[str, int] = {}
        self.job_counters = {"bad_rank_reports": 0, "idle_steps": 0, "mode_switches": 0, "unit_splits": 0}
        self.units: list[UnitPipeline] = []
        self._unit_of: list[int] = [0] * world_size
        self._peers: ReplicaPeers | None = None
        self._build([list(range(world_size))], step_detectors, stall_detector)
        if self.mode == "serving" and not self._custom:  # a mode given here splits replicas as a declared one does
            self._splitter = UnitSplitter(world_size, s)

    # -- units -----------------------------------------------------------------------------------------------------
    def _build(self, units: list[list[int]], step_detectors: Sequence[StepDetector] | None = None,
               stall_detector: StallDetector | None = None) -> None:
        serving = self.mode == "serving"
        # a replica the split left as it was keeps its pipeline (what it learned); only a unit that was cut starts
        # afresh (its steps mixed replicas)
        keep = {tuple(u.ranks): u for u in self.units
                if serving and u.serving and len(units) > 1 and not u.whole_job}
        for u in self.units:
            if keep.get(tuple(u.ranks)) is u and list(u.ranks) in units:
                continue
            for k, v in u.counters().items():
                self._retired[k] = self._retired.get(k, 0) + v
        self.units = [keep.get(tuple(ranks)) or UnitPipeline(
            self.job_id, ranks, self.settings, self._hold, serving=serving, roles=self._roles,
            whole_job=len(units) == 1, step_detectors=step_detectors, stall_detector=stall_detector)
            for ranks in units]
        for i, ranks in enumerate(units):
            for r in ranks:
                self._unit_of[r] = i
        if self._peers is not None:
            for k, v in self._peers.counters.items():
                self._retired[k] = self._retired.get(k, 0) + v
        peers = ReplicaPeers(self.job_id, units, self.settings) if serving and len(units) > 1 else None
        if peers is not None and self._peers is not None:
            peers.inherit(self._peers)
        self._peers = peers

    def _switch_to_serving(self) -> None:
        self.mode = "serving"
        self.job_counters["mode_switches"] += 1
        self._splitter = UnitSplitter(self.world_size, self.settings)
        self._build([list(range(self.world_size))])

    @property
    def counters(self) -> dict[str, int]:
        """Report/step counters of every unit, summed (``reports``, ``late``, ``duplicate``, ``bad_rank``,
        ``old_epoch``, ``restarts``, ``finalized``, ``excluded``, the regression detector's), plus the job's
        (``bad_rank_reports``, ``idle_steps``, ``mode_switches``, ``unit_splits``)."""
        out = dict(self._retired)
        for u in self.units:
            for k, v in u.counters().items():
                out[k] = out.get(k, 0) + v
        for k, v in (self._peers.counters.items() if self._peers is not None else ()):
            out[k] = out.get(k, 0) + v
        out["bad_rank"] = out.get("bad_rank", 0) + self.job_counters["bad_rank_reports"]
        out.update(self.job_counters)
        return out

    @property
    def unlearned_units(self) -> list[list[int]]:
        """The ranks of each serving unit that has finalised steps but no usual step yet: every step so far was
        excluded (an idle gap: at least ``serving_idle_gap_s``, e.g. a server with one request a minute, or a
        capture): it is not watched for regressions or spikes until a busy step comes. Empty in training mode."""
        return [list(u.ranks) for u in self.units
                if u.normaliser is not None and u.normaliser.usual_step_s is None
                and u.aggregator.counters.get("finalized", 0) > 0]

    def serving_view(self) -> dict[str, Any] | None:
        """For ``profwatch status``: how many of a serving job's units (replicas) are judged by their own
        change-point test yet; None in training mode. Shape: ``{"units": n, "watched": n, "learning": n,
        "no_busy_step": n, "no_step": n, "block_s": SERVING_BLOCK_S, "replica_peers": bool (the replicas are also
        compared with each other), "replica_blocks": blocks of that comparison judged so far, "detail": [the first
        SERVING_VIEW_UNITS units' :meth:`UnitPipeline.watch_state`, those not watched first]}``."""
        if self.mode != "serving":
            return None
        states = [u.watch_state() for u in self.units]
        out: dict[str, Any] = {"units": len(states), "block_s": SERVING_BLOCK_S}
        for key in ("watched", "learning", "no_busy_step", "no_step"):
            out[key] = sum(1 for st in states if st["state"] == key)
        out["replica_peers"] = self._peers is not None
        out["replica_blocks"] = self._peers.counters["replica_blocks"] if self._peers is not None else 0
        out["detail"] = sorted(states, key=lambda st: st["state"] == "watched")[:SERVING_VIEW_UNITS]
        return out

    @property
    def aggregator(self) -> StepAggregator:
        """The first unit's step aggregator (the whole job's in training mode)."""
        return self.units[0].aggregator

    @property
    def furthest_step(self) -> int | None:
        """The highest step any rank of the current epoch reported (None before the first report)."""
        vals = [f for u in self.units if (f := u.aggregator.furthest_step) is not None]
        return max(vals) if vals else None

    def unit_steps(self) -> dict[int, int] | None:
        """Per job rank, the furthest step of its unit (its replica's own step counter), or None when the job is
        one unit (then every rank's is :attr:`furthest_step`). Replicas of a serving job have unrelated counters:
        how long an episode of a replica has been quiet is counted on that replica's (``episodes.py: advance``)."""
        if len(self.units) == 1:
            return None
        out: dict[int, int] = {}
        for u in self.units:
            f = u.aggregator.furthest_step
            if f is not None:
                out.update((r, f) for r in u.ranks)
        return out

    @property
    def baseline_step_time_s(self) -> float | None:
        """The job step time (s) for planning: the regression baseline once learned, else the last
        non-excluded job step time, else None (serving: the slowest unit's usual step). The one step-time
        definition the coordinator and replay use."""
        vals = [v for u in self.units if (v := u.usual_step_s) is not None]
        return max(vals) if vals else None

    def generation_level(self) -> tuple[float, int] | None:
        """``(level_s, world_size)``: the job step time this generation's regression baseline learned (s, > 0) and
        its world size, handed to the next generation of the job (:meth:`inherit`: a requeue or restart under the
        same job id); None while the baseline learns, in serving mode, or when the job is not one unit."""
        if self.mode != "training" or len(self.units) != 1:
            return None
        reg = self.units[0].regression
        if reg is None or reg.learning_progress is not None:
            return None
        level = reg.baseline_step_time_s
        return (level, self.world_size) if level is not None and level > 0.0 and math.isfinite(level) else None

    def inherit(self, previous: tuple[float, int] | None) -> None:
        """Take the previous generation's :meth:`generation_level` as the reference the end of this generation's first
        learning judges its learned steps against too (``StepTimeRegressionDetector.prior``, ``reference
        "previous_generation"``): a change a few steps into a requeued generation's learning is found. No-op for
        None, a level not > 0, or a job that is not one training unit."""
        if previous is None or self.mode != "training" or len(self.units) != 1:
            return
        level, world = previous
        reg = self.units[0].regression
        if reg is not None and level > 0.0 and math.isfinite(level):
            reg.prior = (level, world == self.world_size)

    @property
    def stalled_ranks(self) -> frozenset[int]:
        """Ranks currently reported as stalled (cleared when they report again or leave)."""
        out: frozenset[int] = frozenset()
        for u in self.units:
            out |= u.stalled_ranks
        return out

    def set_role(self, rank: int, role: str | None) -> None:
        """Record ``rank``'s role label (from its hello); ranks of one role are each other's peers."""
        if 0 <= rank < self.world_size and self._roles[rank] != role:
            self._roles[rank] = role
            self.units[self._unit_of[rank]].set_role(rank, role)

    def set_mode(self, mode: JobMode) -> None:
        """The job's mode as a rank declared it (its hello): serving switches once, training stops detection."""
        self._mode_given = True
        if mode == "serving" and self.mode != "serving" and not self._custom:
            self._switch_to_serving()

    def excursion_returned(self, first_step: int) -> Returned | None:
        """Whether the job-wide excursion a spike-held ``step_regression`` (``pattern "level"``) reported from
        ``first_step`` came back to the level before it (:meth:`RecurringInterruptions.returned
        <profwatch.core.detection.interruptions.RecurringInterruptions.returned>`): the arming layer withdraws its
        capture when the window has not opened (``daemon/profwatch/core/arming/episodes.py``). None otherwise, and
        for a job of several units (serving replicas: their reports name ranks)."""
        if len(self.units) != 1:
            return None
        reg = self.units[0].regression
        return reg.recurring.returned(first_step, reg.settings.min_effect) if reg is not None else None

    def ongoing(self) -> dict[str, frozenset[int]]:
        """Per anomaly kind, the ranks its detector still names now (``rank_outlier``: reported and not cleared;
        ``stalled_rank``: stalled): what tells the episode layer (``daemon/profwatch/core/arming/episodes.py``) that an
        episode still holds between reports."""
        out: dict[str, frozenset[int]] = {"stalled_rank": self.stalled_ranks}
        for u in self.units:
            for kind, ranks in u.ongoing().items():
                out[kind] = out.get(kind, frozenset()) | ranks
        return out

    def update_settings(self, settings: DetectionSettings) -> None:
        """Swap thresholds without losing learned state (windows are resized; outlier counts may restart)."""
        self.settings = settings
        for u in self.units:
            u.update_settings(settings)
        if self._splitter is not None:
            self._splitter.settings = settings
        if self._peers is not None:
            self._peers.settings = settings

    def mark_left(self, rank: int) -> None:
        """Record that ``rank`` left on purpose (``bye``): it is never reported as stalled until it reports again."""
        if 0 <= rank < self.world_size:
            self.units[self._unit_of[rank]].mark_left(rank)

    def exclude_steps(self, first: int, last: int, reason: str, *, pad_parse_steps: bool = True) -> None:
        """Exclude steps ``first..last`` (inclusive; plus ``parse_steps`` after ``last`` unless ``pad_parse_steps``
        is false) from all detectors, e.g. a capture window planned by the coordinator. Raises ``ValueError``
        when ``last < first``."""
        for u in self.units:
            u.aggregator.exclude_steps(first, last, reason, pad_parse_steps=pad_parse_steps)

    def exclude_until_closed(self, first: int, reason: str) -> None:
        """Exclude steps from ``first`` on from all detectors until :meth:`close_exclusion` of ``reason`` (at most
        ``parse_max_steps``; ``StepAggregator.exclude_until_closed``)."""
        for u in self.units:
            u.aggregator.exclude_until_closed(first, reason)

    def close_exclusion(self, reason: str) -> None:
        """End what :meth:`exclude_until_closed` began for ``reason`` (``StepAggregator.close_exclusion``)."""
        for u in self.units:
            u.aggregator.close_exclusion(reason)

    # -- ingest ----------------------------------------------------------------------------------------------------
    def observe(self, report: StepReportLike, now_unix_s: float) -> list[Anomaly]:
        """Ingest one step report that arrived at ``now_unix_s`` (seconds, the caller's clock: the coordinator's
        receive time, or a record's time in replay); return the anomalies it produced (usually none)."""
        r = report.rank
        if not 0 <= r < self.world_size:
            self.job_counters["bad_rank_reports"] += 1
            return []
        role = getattr(report, "role", None)
        if role is not None and role != self._roles[r]:
            self.set_role(r, role)
        if not self._mode_given and getattr(report, "mode", None) == "serving":
            self.set_mode("serving")
        unit = self.units[self._unit_of[r]]
        idle = False
        t = report.step_time_s
        if t >= self.settings.serving_idle_gap_s:  # shorter is never an idle gap: no usual step needed (hot path)
            usual = unit.idle_reference_s
            # serving without a usual step yet: the absolute bound alone, so gaps never enter the usual step
            # (learned from a gap, it stuck at ~30 s and a 60 s gap was never idle again: false pages); training
            # without one: no gap (a long first step must not switch the job to serving)
            idle = (is_idle_gap(t, usual, self.settings) if usual is not None or self.mode == "serving"
                    else False)
            if idle and self.mode != "serving" and self._count_gap(r, now_unix_s, report.step):
                self._switch_to_serving()
                unit = self.units[self._unit_of[r]]
            idle = idle and self.mode == "serving"
            if idle:
                self.job_counters["idle_steps"] += 1
        work = getattr(report, "work", None)
        work = work if isinstance(work, (int, float)) else None
        found = unit.observe(report, now_unix_s, idle=idle, work=work)
        self._unit_rose(unit.ranks, found)
        if self._peers is not None and not idle:
            found = found + self._to_peers(report, work, now_unix_s)
        return found

    def _to_peers(self, report: StepReportLike, work: float | None, now_unix_s: float) -> list[Anomaly]:
        """Hand one non-idle report of a split serving job to :class:`ReplicaPeers` (left out: flagged, or taken
        while its rank captured)."""
        assert self._peers is not None
        if getattr(report, "capturing", False) or getattr(report, "flags", ()):
            found = self._peers.close(now_unix_s)
        else:
            found = self._peers.add(report.rank, report.step, report.step_time_s, work, now_unix_s)
        self._adopt(found)
        return found

    def _unit_rose(self, ranks: Sequence[int], found: list[Anomaly]) -> None:
        """A replica's own unit reported a rise (``found``): its peer comparison takes it as its new level
        (``ReplicaPeers.adopt_unit``), so the same change is not named again next to its peers."""
        if self._peers is not None and any(a.kind == "step_regression" and a.magnitude > 0 for a in found):
            self._peers.adopt_unit(ranks)

    def _adopt(self, found: list[Anomaly]) -> None:
        """A replica its peers named: its rise is its unit's new normal (``UnitPipeline.adopt_rise``)."""
        for a in found:
            first = a.detail.get("first_step")
            self.units[self._unit_of[a.ranks[0]]].adopt_rise(1.0 + a.magnitude, first if isinstance(first, int) else None)

    def observe_many(self, reports: Sequence[StepReportLike], now_unix_s: float, start: int = 0
                     ) -> tuple[int, list[Anomaly]]:
        """:meth:`observe` for ``reports[start:]`` (reports that arrived together at ``now_unix_s``, e.g. a node
        batch's), in order, up to and including the first that produced anomalies: returns ``(next, anomalies)``,
        ``next`` the index of the first report not taken (``len(reports)`` when all were). The caller acts on the
        anomalies (an exclusion it adds applies to the steps finalised after them, as with :meth:`observe`) and
        calls again from ``next``.

        Same results as :meth:`observe` report by report; the common report (a valid rank, no new role or mode,
        too short to be an idle gap) skips the per-report checks of :meth:`observe` and goes to its unit at once.
        """
        ws = self.world_size
        roles = self._roles
        gap_s = self.settings.serving_idle_gap_s
        n = len(reports)
        i = start
        while i < n:
            # the plain reports from i: a rank of the job, no new role or mode, too short to be an idle gap
            check_mode = not self._mode_given
            j = i
            while j < n:
                m = reports[j]
                r = m.rank
                if not 0 <= r < ws or m.step_time_s >= gap_s:
                    break
                role = getattr(m, "role", None)
                if (role is not None and role != roles[r]) or (check_mode and getattr(m, "mode", None) == "serving"):
                    break
                j += 1
            if j > i:
                units = self.units
                if len(units) == 1 and units[0].identity:
                    i, found = units[0].observe_run(reports, now_unix_s, i, j)
                    if found:
                        return i, found
                    continue
                unit_of = self._unit_of
                while i < j:
                    m = reports[i]
                    i += 1
                    work = getattr(m, "work", None)
                    work = work if isinstance(work, (int, float)) else None
                    unit = units[unit_of[m.rank]]
                    found = unit.observe(m, now_unix_s, work=work)
                    self._unit_rose(unit.ranks, found)
                    if self._peers is not None:
                        found = found + self._to_peers(m, work, now_unix_s)
                    if found:
                        return i, found
                continue
            found = self.observe(reports[i], now_unix_s)  # may change the mode, the units or the roles
            i += 1
            if found:
                return i, found
        return n, []

    def _count_gap(self, rank: int, now_unix_s: float, step: int) -> bool:
        """Count an idle gap of ``rank`` at its ``step``; True when the job should switch to serving mode: the last
        ``serving_detect_gaps`` gaps within :data:`DETECT_WINDOW_S`, unless the last ``max(serving_detect_gaps, 3)``
        gaps lie on a step lattice (equal intervals of at least :data:`MIN_LATTICE_STEPS` steps: a periodic
        checkpoint; a single such interval, before a third gap, is not yet told apart from one and waits)."""
        n = self.settings.serving_detect_gaps
        if n == 0 or self._mode_given or self._custom:
            return False
        # at least 3 gaps kept: one interval alone is always "all equal" (serving_detect_gaps = 2 read any two
        # gaps 10+ steps apart as a lattice); with one interval of a lattice's size the switch waits for the next
        q = self._gaps.setdefault(rank, deque(maxlen=max(n, 3)))
        q.append((now_unix_s, step))
        recent = list(q)[-n:]
        if len(recent) < n or now_unix_s - recent[0][0] > DETECT_WINDOW_S:
            return False
        gaps = {b[1] - a[1] for a, b in zip(q, list(q)[1:], strict=False)}
        return not (len(gaps) == 1 and min(gaps) >= MIN_LATTICE_STEPS)

    def tick(self, now_unix_s: float) -> list[Anomaly]:
        """Check for stalled ranks at ``now_unix_s`` (same clock as the arrival times given to :meth:`observe`);
        in serving mode, split the units first. Call it about once a second, not per report."""
        if self._splitter is not None:
            last: list[int | None] = [None] * self.world_size
            for u in self.units:
                for r, s in u.last_steps().items():
                    last[r] = s
            if self._splitter.check(last, [u.idle_reference_s for u in self.units]):
                self.job_counters["unit_splits"] += 1
                self._build(self._splitter.units)
            for u in self.units:
                u.note_lockstep([s for r in u.ranks if (s := last[r]) is not None])
        out: list[Anomaly] = self._peers.close(now_unix_s) if self._peers is not None else []
        self._adopt(out)
        for u in self.units:
            out.extend(u.check_stalls(now_unix_s))
        return out
