"""Rank-outlier detection: ranks consistently slower than their peers in a compared stage, each rank judged
against its own learned baseline ratio to its peers (structural imbalance) and within its role group (pure).

Implements the ``StepDetector`` Protocol of ``daemon/profwatch/core/detection/types.py``.
"""

from __future__ import annotations

import bisect
import math
import warnings
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from profwatch.core.detection.aggregation import CPU_SERIES
from profwatch.core.detection.regression import ar1_long_run_factor, cusum_threshold, lag1_autocorrelation
from profwatch.core.detection.settings import DetectionSettings
from profwatch.core.detection.types import Anomaly, FinalizedStep
from profwatch.core.verdict.robust import MAD_TO_SIGMA

NUMPY_MIN_RANKS = 256
"""Below this many ranks the per-step cross-rank comparison runs in pure Python (cheaper than numpy)."""
STAGE_SCALE_FLOOR = 0.01
"""A stage's peer median is floored at this fraction of the job step time when a rank's excess over it is made
relative (and when each rank's ratio to its peers is learned): the excess of a stage that takes microseconds reads
as a share of the step (at most 100x), not as millions of percent."""


def median_mad(xs: list[float]) -> tuple[float, float]:
    """Median and MAD (median absolute deviation) of a non-empty list (pure Python; cheap below ~100 values)."""
    s = sorted(xs)
    n = len(s)
    med = s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])
    d = sorted(abs(x - med) for x in s)
    mad = d[n // 2] if n % 2 else 0.5 * (d[n // 2 - 1] + d[n // 2])
    return med, mad


MIN_REFERENCE_RANKS = 2
"""Ranks that must remain in the peers' reference once the ranks already named slow are left out of it; with fewer,
every rank is the reference again (:func:`outlying_ranks`)."""


def _sound(ref: list[float], min_effect: float) -> bool:
    """Whether the values left as the peers' reference can be one: at least :data:`MIN_REFERENCE_RANKS`, and two
    that agree within ``min_effect`` of the smaller (two values have no spread to judge by: a rank faster than its
    peers from the start next to a healthy one would make the healthy one an outlier of their mean)."""
    if len(ref) < MIN_REFERENCE_RANKS:
        return False
    return len(ref) > 2 or abs(ref[0] - ref[1]) < min_effect * min(ref)


def _reference(arr: list[float], exclude: frozenset[int], min_effect: float) -> list[float]:
    """The values of ``arr`` that make the peers' reference: every present value but those of ``exclude`` (ranks
    already named slow) when what remains is :func:`_sound`, else every present one."""
    present = [v for v in arr if not math.isnan(v)]
    if not exclude:
        return present
    healthy = [v for r, v in enumerate(arr) if r not in exclude and not math.isnan(v)]
    return healthy if _sound(healthy, min_effect) else present


def _judgeable(m: float, floor_s: float) -> bool:
    """Whether a stage whose peer median is ``m`` seconds can be judged: a median of 0 (a stage the peers report
    as exactly 0 s, e.g. a prefetching data loader) is judged against ``floor_s`` (the excess must still reach
    ``outlier_min_abs_s``); before, such a stage was skipped and a rank stalling 60 ms in it (16 % of its step) was
    never named, while the same stall next to peers at 1 us was."""
    return m > 0 or (m == 0 and floor_s > 0)


def outlying_ranks(arr: list[float], s: DetectionSettings, floor_s: float = 0.0,
                   exclude: frozenset[int] = frozenset()) -> list[tuple[int, float]]:
    """Ranks whose value is outlying above the peer median: ``[(rank, relative excess)]``.

    ``exclude``: indices of ``arr`` left out of the peers' median and MAD (ranks already named slow: a slow rank is
    not a healthy peer), still tested themselves; ignored unless the values that remain are :func:`_sound` (at least
    :data:`MIN_REFERENCE_RANKS`; two within ``outlier_min_effect`` of each other). Without it, once half the ranks were slow (rank 2 3x next to rank 1's 3x in a 4-rank job) the
    median sat between the slow and the healthy values and neither slow rank was outlying any more.

    ``arr`` has one entry per rank (seconds; NaN = not reported). Rule in :class:`RankOutlierDetector` Notes; with
    two values present (``outlier_min_ranks`` 2: a serving unit of two tensor-parallel ranks) the MAD term is left
    out of the scale (two values' MAD is half their difference, which no excess can pass by ``outlier_z``). The
    relative excess is ``(v - m) / max(m, floor_s)``: a stage that takes its peers almost nothing (a data stage
    of microseconds) is measured against ``floor_s`` (the caller passes :data:`STAGE_SCALE_FLOOR` of the job step
    time), so one stalled rank reads as a bounded share of the step, never as +5,000,000 %. Peers at exactly 0 s
    are judged the same way when ``floor_s`` > 0 (with ``floor_s`` 0, or a negative median, nothing is named).
    """
    if len(arr) < NUMPY_MIN_RANKS:
        if sum(1 for v in arr if not math.isnan(v)) < s.outlier_min_ranks:
            return []
        ref = _reference(arr, exclude, s.outlier_min_effect)
        m, mad = median_mad(ref)
        if not _judgeable(m, floor_s):
            return []
        # two values' MAD is half their difference: a robust z of at most 0.67, so two ranks could never be told
        # apart; their scale is the noise floor alone (the excess still has to reach outlier_min_effect)
        spread = MAD_TO_SIGMA * mad if len(ref) >= 3 else 0.0
        thr = max(s.outlier_z * max(spread, s.noise_floor * m), s.outlier_min_effect * m, s.outlier_min_abs_s)
        return [(r, (v - m) / max(m, floor_s)) for r, v in enumerate(arr) if v - m >= thr]
    a = np.asarray(arr, dtype=np.float64)
    v = a[~np.isnan(a)]
    if v.size < s.outlier_min_ranks:
        return []
    if exclude:
        keep = ~np.isnan(a)
        keep[[r for r in exclude if 0 <= r < a.size]] = False
        if _sound(a[keep].tolist(), s.outlier_min_effect):
            v = a[keep]
    m = float(np.median(v))
    if not _judgeable(m, floor_s):
        return []
    mad = float(np.median(np.abs(v - m)))
    thr = max(s.outlier_z * max(MAD_TO_SIGMA * mad, s.noise_floor * m), s.outlier_min_effect * m, s.outlier_min_abs_s)
    with np.errstate(invalid="ignore"):
        idx = np.flatnonzero(a - m >= thr)
    return [(int(r), (float(a[r]) - m) / max(m, floor_s)) for r in idx.tolist()]


WAIT_STAGES = frozenset({"comm", "communication", "collective", "collectives", "allreduce", "all_reduce",
                         "barrier", "wait", "sync"})
"""Stage names that time waiting in a collective (or at a barrier), left out of the cross-rank comparison unless
``outlier_stages`` names them: waiting is the symptom of someone else being slow, never evidence that the waiter is
slow. When 8 of 13 ranks (one node) became 3x slower, the 5 healthy ranks waited 2x the step at the barrier and
were named by their ``comm`` stage, so the capture named the wrong ranks (``bench/bench_corpus.py`` seed 31,
``steady`` run 14)."""

MAX_LEARNED_STAGES = 4
"""Stages whose per-rank ratios are learned (the first ones seen), besides the CPU series ``cpu/step``, always
learned; others are compared without a baseline."""
CPU_NOISE_OBS = 128
"""Independent CPU observations kept per rank (one per sampled interval, :attr:`FinalizedStep.cpu_iv`: the log
ratio of the rank's interval value to its peers'), the source of its reference level and noise scale."""
CPU_REF_LAG = 24
"""A rank's reference level and noise are taken from its observations but its newest this many (at least its first
:data:`CPU_REF_MIN`): a change is judged against the rank's own past, not against the observations it is made of,
and its noise scale is not widened by it (a +30 % rank is named within about 10-40 observations of a busy host,
``bench/bench_busy_cpu_pair.py``)."""
CPU_REF_MIN = 32
"""Observations a rank's CPU baseline (the median of its log ratios to its peers) is learned from before the rank is
compared on the CPU series from samples: the learning window's 40 steps held one to three CPU values on a busy serving
pair, and the ratio learned from them was off by chance by 7-11 % (1.11 on a simulated run, which then hid most of a
+30 % change from the window)."""
CPU_SIGMA_FLOOR = 0.03
"""Floor of a rank's noise scale on the CPU test (log ratio per interval; at least ``noise_floor``): a quiet
lockstep job's intervals agree within 1 %, and a MAD of such values would turn a few percent into many sigmas."""
CPU_CLIP_Z = 3.0
"""Each observation's excess enters the CUSUM winsorised to +-this many noise scales: one hot interval of a rank
(a second of spinning on a starved core, +30-60 %) counts as at most this much evidence."""
CPU_MAX_RHO = 0.5
"""Upper clamp of the lag-1 autocorrelation that widens a rank's CPU noise scale (:func:`_ar1_factor`)."""
CPU_MIN_ALARM_OBS = 3
"""Observations at the winsorised maximum a rank's CPU CUSUM needs at least to alarm (its threshold is at least this
times :data:`CPU_CLIP_Z`): where the noise is at its floor, the normal threshold is under one observation, and one
hot interval of a quiet rank would name it."""
CPU_ARL_OBS = 5e6
"""Target mean observations between false alarms of one rank's CPU CUSUM (its threshold h from Siegmund's
approximation, :func:`cusum_threshold`); a busy serving pair makes about 0.3 observations a second per rank."""
CPU_MIN_K = 0.05
"""The least CUSUM reference value (noise scales) the CPU threshold is computed for (a rank whose intervals spread
more than 1.9 in log would otherwise ask :func:`~profwatch.core.detection.regression.cusum_threshold` for an
ever larger h)."""
CPU_MAX_EXCESS = 100.0
"""A rank's CPU excess reported by the CPU CUSUM (:meth:`RankOutlierDetector._cpu_outlying`) is at most this (a
ratio less one: magnitudes stay bounded)."""
SHARE_MIN_RANKS = 2 * MIN_REFERENCE_RANKS
"""Ranks with a reference share of the job's step that a step needs for the share test
(:meth:`RankOutlierDetector._share_outlying`): its reference is their lower half, at least
:data:`MIN_REFERENCE_RANKS` ranks whose share did not rise."""
SHARE_REF_STEPS = 4
"""The share test's per-rank reference shares (:meth:`RankOutlierDetector._share_outlying`) are taken again every
this many steps (a median of 40 values per rank a step cost serving TP replays 40 % more CPU); the lag behind the
newest share is then ``outlier_window_steps`` to this many steps more."""
STABLE_FRACTION = 0.5
"""A learned ratio is stable when its first- and second-half medians differ by less than this fraction of
``outlier_min_effect`` (a rank that became slow within the learning window is a change, not a structure)."""


def _pair_peers(a: np.ndarray, med: np.ndarray, groups: list[list[int]] | None) -> None:
    """In the job, or a role group, of exactly two present values, each one's peer reference becomes the other's value (in
    ``med``, in place): the median of two is their mean, so a rank 1.6x its peer by design was learned as 1.23x
    the mean, and after dividing by that it still read 13 % over the new mean at every step (a false
    ``rank_outlier`` of a TP pair whose rank 0 does more CPU work by design, ``tests/unit/test_cpu_time.py``)."""
    present = np.flatnonzero(~np.isnan(a)).tolist()
    pairs = [present] + [[r for r in g if not math.isnan(a[r])] for g in groups or ()]
    for idx in pairs:  # the job's two values (the reference of ranks whose role has too few), each role's two
        if len(idx) == 2:
            i, j = idx
            med[i], med[j] = a[j], a[i]


def _median_without(xs: list[float], v: float) -> float:
    """The median of sorted ``xs`` (at least two values) with one value equal to ``v`` left out (``v`` is in ``xs``),
    O(log n): the peers' median of each rank of a step without building every rank's list of the others (that was
    O(ranks^2) a step, 0.13 s at 1,000 ranks)."""
    i = bisect.bisect_left(xs, v)
    m = len(xs) - 1

    def at(j: int) -> float:
        return xs[j] if j < i else xs[j + 1]

    return at(m // 2) if m % 2 else 0.5 * (at(m // 2 - 1) + at(m // 2))


def _ar1_factor(xs: Sequence[float], m: float) -> float:
    """:func:`~profwatch.core.detection.regression.ar1_long_run_factor` (Bayley & Hammersley 1946) at ``rho``, the
    lag-1 autocorrelation (:func:`~profwatch.core.detection.regression.lag1_autocorrelation`) of ``xs`` about
    ``m`` clamped to [0, :data:`CPU_MAX_RHO`] (consecutive intervals of a rank share a stretch of its host's noise:
    about 0.15 on ``bench/bench_busy_cpu_pair.py``, so a sum of them spreads more than independent values would).
    1.0 for fewer than 3 values or no spread."""
    if len(xs) < 3:
        return 1.0
    rho = lag1_autocorrelation(np.asarray(xs, dtype=np.float64) - m)
    return ar1_long_run_factor(min(CPU_MAX_RHO, max(0.0, rho)))


class RankOutlierDetector:
    """Names ranks that are slower than their peers in most of the recent steps, each measured against its own
    baseline; reports a difference present from the start once, as ``structural_imbalance``.

    Args:
        job_id: copied into every :class:`Anomaly`.
        world_size: ranks of the job.
        settings: the ``outlier_*`` and ``structural_*`` thresholds, ``role_groups`` and ``noise_floor``.
        roles: optional role label per rank (index = rank; None = not sent); see :meth:`set_role`.

    Notes:
        Peers: with ``role_groups`` and role labels, a rank is compared with the ranks of its role (a pipeline
        stage, an expert group) when at least ``outlier_min_ranks`` of them reported the stage in that step;
        otherwise with every rank.

        Own baseline (structural imbalance): over the first ``structural_learn_steps`` non-excluded steps of a
        generation (after warm-up), each rank's ratio ``v / m`` to its peers' median is recorded per stage
        (at most :data:`MAX_LEARNED_STAGES`). A rank whose median ratio ``c`` exceeds 1 by at least half of
        ``outlier_min_effect``, with the medians of the two halves of the window within
        :data:`STABLE_FRACTION` of ``outlier_min_effect`` of each other (it was like that from the start, not a
        change inside the window), gets ``c`` as its baseline: from then on its values are divided by ``c``
        before any comparison, so it is compared with its peers relative to its own normal, and it no longer
        widens the peers' median absolute deviation (the scale of every other rank's test). Ranks with
        ``c >= 1 + outlier_min_effect`` are reported once as ``structural_imbalance`` with, per rank, the
        excess and stage, and the job's cost per step: the largest median excess in seconds (in synchronous
        training every rank waits for it) and that cost as a fraction of the median job step time. In a job whose
        ranks declared no role (or all the same one) and all timed the same stages (no pipeline stage the hook can see), nothing makes
        one rank slower by design: the same ranks are also reported once as ``slow_from_start`` (an alert, with a
        ``text`` such as "rank 2 has been 30 % slower than its peers since the job started: a bad node, or a role
        difference: declare roles to silence"); with roles or visible stages it stays ``structural_imbalance``. No
        ``rank_outlier`` fires while learning; at its end a rank that was not learned as structural and is
        outlying in ``outlier_min_steps`` of the last ``outlier_window_steps`` fires at once.

        Outliers, per non-excluded finalised step and per compared stage (``outlier_stages``; plus
        ``step_time_s`` when ``outlier_on_step_time``): peer median m and MAD over the normalised values
        (at least ``outlier_min_ranks``), leaving out the ranks reported and not cleared while the others make a
        sound reference (:func:`_sound`: at least :data:`MIN_REFERENCE_RANKS`, two that agree within
        ``outlier_min_effect``; a rank named slow is no healthy peer: once half the ranks were
        slow one after another, the median sat between them and the healthy ones, the second slow rank was never
        named and the first cleared). A rank is outlying in that step when
        ``(v - m) / max(1.4826 * MAD, noise_floor * m) >= outlier_z`` and ``v >= m * (1 + outlier_min_effect)``
        and ``v - m >= outlier_min_abs_s``. A rank outlying in ``outlier_min_steps`` of the last
        ``outlier_window_steps`` non-excluded steps fires one ``rank_outlier`` (ranks firing at the same step
        are grouped); it may fire again only after its count fell below half of ``outlier_min_steps``. A rank
        judged on ``cpu/step`` from CPU samples (:attr:`FinalizedStep.cpu_obs`, ``cpu_iv``: one value per sampled
        interval, held for the steps between) is outlying in a step when its one-sided CUSUM over its independent
        per-interval log ratios to its peers is at or over its threshold (:meth:`_cpu_step`): a sequential test
        against its own baseline, learned from :data:`CPU_REF_MIN` intervals (the learning window holds one to
        three), instead of the step value's threshold (a held mean of three intervals: the window's steps hold one
        or two observations).

        Assumptions: only *slower* is tested, so ranks that wait longer at a barrier because a peer is slow are
        not named (their compute stage is normal; a pure wait stage is shorter on the slow rank). Pure wait
        stages (:data:`WAIT_STAGES`: ``comm``, ``barrier``, ...) are left out of the comparison unless
        ``outlier_stages`` names them: when the slow ranks are the majority (a slow node of most of the job, a
        slow half) the healthy minority's wait is the outlying value, and it would name the healthy ranks. A
        slow majority is then not named here (its compute is the peers' median); the job's step time carries it
        (``step_regression``, job-wide). Half the ranks slowing at once where the step does not rise with them (a
        hot expert elsewhere sets it), or a whole role group (a pipeline stage that is not the slowest), are named
        by their share of the step against their own recent share (:meth:`_share_outlying`). Job-wide events (GC pauses, checkpoints on every rank) raise the
        peer median with every rank and are not outliers; a one-step stall of one rank (a data loader hiccup)
        counts one step of ``outlier_min_steps``. Ranks faster than their peers from the start keep the peers'
        median as their reference (normalising them would turn the wait they take up when a peer slows down
        into an outlier). A rank that became slow within the learning window and stays
        stable over both halves of it cannot be told from a structural one: it is reported as structural.

        Source: peer-relative per-rank scores as in NVIDIA Resiliency Extension's straggler detection
        (``nvidia-resiliency-ext``, relative section scores, each rank also against its own history) and
        MegaScale's per-rank timers (Jiang et al., NSDI'24); HolisticTraceAnalysis ranks slow ranks by the wait
        they cause, not by duration. Median/MAD scale: Rousseeuw & Croux 1993.

        Cost: O(world_size) per compared stage per step (numpy from 256 ranks), O(1) window upkeep per rank hit;
        learning keeps ``structural_learn_steps x world_size`` float32 per learned stage.
    """

    def __init__(self, job_id: str, world_size: int, settings: DetectionSettings,
                 roles: Sequence[str | None] | None = None) -> None:
        self.job_id = job_id
        self.world_size = world_size
        self._floor_s = 0.0
        self.settings = settings
        self._roles: list[str | None] = list(roles) if roles is not None else [None] * world_size
        self._groups: list[list[int]] | None = None
        self._groups_stale = True
        self.reset()

    # -- configuration ---------------------------------------------------------------------------------------------
    def set_role(self, rank: int, role: str | None) -> None:
        """Record the role label ``rank`` sent (None = none); ranks of one role are each other's peers."""
        if 0 <= rank < self.world_size and self._roles[rank] != role:
            self._roles[rank] = role
            self._groups_stale = True

    @property
    def baselines(self) -> dict[str, dict[int, float]]:
        """Learned per-rank ratios to the peers, per stage (only ranks that differ from their peers)."""
        return {k: dict(v) for k, v in self._base.items()}

    @property
    def learning(self) -> bool:
        """True while the per-rank baselines are being learned."""
        return self._learn_n < self.settings.structural_learn_steps and self.settings.structural_detection

    def reset(self) -> None:
        """Forget the window and the learned baselines (restart: a new generation learns again)."""
        n = self.world_size
        self._hits: list[int] = [0] * n
        self._excess_sum: list[float] = [0.0] * n
        self._ring: deque[list[tuple[int, float]]] = deque()
        self._reported: set[int] = set()
        self._stage: dict[int, str] = {}
        self._base: dict[str, dict[int, float]] = {}
        self._learn_n = 0
        self._learn: dict[str, np.ndarray] = {}
        self._learn_cost: dict[str, np.ndarray] = {}
        self._learn_seen: dict[str, np.ndarray] = {}  # per learned stage, the ranks that timed it
        self._learn_step_s: list[float] = []
        self._shares: dict[str, np.ndarray] = {}  # per stage, a ring of each rank's value over the job step
        self._shares_n: dict[str, int] = {}  # per stage, the shares the ring took (its next row: n % its length)
        self._share_ref: dict[str, np.ndarray] = {}  # per stage, each rank's reference share (SHARE_REF_STEPS)
        self._cpu_last: list[int] = [-1] * n  # per rank, the CPU interval number of its last observation kept
        self._cpu_hist: list[deque[float]] = [deque(maxlen=CPU_NOISE_OBS) for _ in range(n)]
        self._cpu_cusum: list[float] = [0.0] * n  # per rank, its CPU CUSUM (log units) and its threshold now
        self._cpu_h: list[float] = [math.inf] * n
        self._cpu_ref: list[float | None] = [None] * n  # per rank, its learned log ratio to its peers (None: not yet)
        self._cpu_run: list[int] = [0] * n  # per rank, observations since its CUSUM was last 0
        self._cpu_sampled = False  # the CPU series came from CPU samples (its baseline is learned per interval)

    @property
    def reported_ranks(self) -> frozenset[int]:
        """Ranks reported and not cleared yet (their count has not fallen below half of ``outlier_min_steps``):
        the episode layer's sign that a rank-outlier episode still holds."""
        return frozenset(self._reported)

    def update_settings(self, settings: DetectionSettings) -> None:
        """Swap thresholds; the window restarts when its size or the firing count changes (baselines are kept)."""
        old, self.settings = self.settings, settings
        if (settings.outlier_window_steps, settings.outlier_min_steps) != (old.outlier_window_steps,
                                                                            old.outlier_min_steps):
            n = self.world_size
            self._hits, self._excess_sum, self._ring = [0] * n, [0.0] * n, deque()
            self._reported.clear()
            self._stage.clear()
        if settings.structural_learn_steps != old.structural_learn_steps and self.learning:
            self._learn.clear()
            self._learn_cost.clear()
            self._learn_seen.clear()
            self._learn_n = 0
            self._learn_step_s.clear()

    # -- StepDetector ----------------------------------------------------------------------------------------------
    def on_step(self, step: FinalizedStep) -> list[Anomaly]:
        """Compare the ranks of one finalised step; return a ``rank_outlier`` when a rank's window fills, a
        ``structural_imbalance`` when the learning window ends with ranks slower from the start."""
        if step.excluded is not None or not step.stages:
            return []
        groups = self._peer_groups()
        learning = self.learning
        self._floor_s = STAGE_SCALE_FLOOR * max(0.0, step.time_s)
        best: dict[int, tuple[float, str]] = {}
        wanted = self.settings.outlier_stages
        for name, arr in step.stages.items():
            if wanted is None and name.lower() in WAIT_STAGES:
                continue  # a pure wait: the symptom of a slow peer (WAIT_STAGES)
            if learning:
                self._record(name, arr, groups)
            base = self._base.get(name)
            if base:
                arr = list(arr)
                for r, c in base.items():
                    arr[r] /= c
            sampled = name == CPU_SERIES and step.cpu_obs is not None and step.cpu_iv is not None
            if sampled:
                self._cpu_sampled = True
                self._observe_cpu(step.cpu_iv or (), step.cpu_obs or ())
            # from CPU samples the rank's sequential test over its intervals is the step's verdict (_cpu_step):
            # a pair's step values, means of three intervals, had to differ by 22 % to pass outlier_min_effect
            # over their mean, and a +30 % rank passed in too few steps of the window
            found = self._cpu_outlying() if sampled else self._outlying(arr, groups)
            if name != CPU_SERIES:
                found = [*found, *self._share_outlying(name, step.stages[name], step.time_s)]
            for r, rel in found:
                if r not in best or rel > best[r][0]:
                    best[r] = (rel, name)
        out: list[Anomaly] = []
        if learning:
            self._learn_n += 1
            self._learn_step_s.append(step.time_s)
            if self.learning:
                self._window(step.step, best, fire=False)
                return out
            out.extend(self._finish_learning(step.step))
            for r in {r for ranks in self._base.values() for r in ranks}:
                best.pop(r, None)  # judged from now on against its own baseline
        a = self._window(step.step, best, fire=True)
        if a is not None:
            out.append(a)
        return out

    # -- independent CPU observations -----------------------------------------------------------------------------
    def _observe_cpu(self, iv: Sequence[float], obs: Sequence[int]) -> None:
        """Per rank whose CPU value ends with a new sampled interval (its sequence number in ``obs`` rose), one
        independent observation: the log ratio of that interval's value (``iv``) to the median of the other ranks'
        last interval values (a pair: the other rank's), fed to the rank's CUSUM (:meth:`_cpu_step`) and kept
        (:data:`CPU_NOISE_OBS`)."""
        n = min(len(iv), len(obs), self.world_size)
        vals: list[float] | None = None  # every usable interval value, sorted (once per step)
        for r in range(n):
            o = obs[r]
            if o < 0:
                continue
            if o < self._cpu_last[r]:  # the aggregator started over: a new sequence
                self._clear_cpu(r)
            if o <= self._cpu_last[r]:
                continue
            self._cpu_last[r] = o
            v = iv[r]
            if not (v > 0 and math.isfinite(v)):  # NaN compares False
                continue
            if vals is None:
                vals = sorted(x for x in iv[:n] if x > 0 and math.isfinite(x))
            if len(vals) < 2:
                continue
            x = math.log(v) - math.log(_median_without(vals, v))  # logs apart: a ratio of them could underflow to 0
            self._cpu_step(r, x)
            self._cpu_hist[r].append(x)

    def _cpu_outlying(self) -> list[tuple[int, float]]:
        """Ranks whose CPU CUSUM is at or over its threshold (:meth:`_cpu_evidence`), each with its estimated
        relative excess over its own normal: ``exp(median(x) - ref) - 1`` over the rank's observations ``x`` since
        its CUSUM was last 0 (the newest ``N`` kept, at most :data:`CPU_NOISE_OBS`; ``ref`` its baseline,
        :meth:`_cpu_step`), in [0, :data:`CPU_MAX_EXCESS`]. Not the CUSUM's own estimate ``exp(K + S / N) - 1``
        (Montgomery, sec. 9.1.2): its observations enter winsorised at ``K + CPU_CLIP_Z sigma``, so at a noise
        floor of 0.03 every change read at most +20 % (a rank 1.3x, 2x or 10x its normal: +20.4 %,
        tests/unit/test_cpu_cusum_adversarial.py). O(CPU_NOISE_OBS) per rank over its threshold."""
        out = []
        for r in range(self.world_size):
            if not self._cpu_evidence(r):
                continue
            h, ref = self._cpu_hist[r], self._cpu_ref[r]
            n = min(max(1, self._cpu_run[r]), len(h))
            e = median_mad(list(h)[-n:])[0] - ref if h and ref is not None else 0.0
            out.append((r, min(CPU_MAX_EXCESS, math.expm1(max(0.0, min(math.log1p(CPU_MAX_EXCESS), e))))))
        return out

    def _clear_cpu(self, r: int) -> None:
        self._cpu_hist[r].clear()
        self._cpu_last[r] = -1
        self._cpu_cusum[r] = 0.0
        self._cpu_h[r] = math.inf
        self._cpu_ref[r] = None
        self._cpu_run[r] = 0

    def _cpu_step(self, r: int, x: float) -> None:
        """One observation ``x`` (log ratio to the peers) of rank ``r`` into its one-sided CUSUM (Page 1954):
        ``S = min(2 h sigma, max(0, S + sigma * min(z, k + CPU_CLIP_Z) - K))`` with ``z = (x - ref) / sigma``,
        ``K = log(1 + outlier_min_effect)`` (an excess under the least effect accumulates nothing), ``k = K /
        sigma`` and ``h`` = :func:`~profwatch.core.detection.regression.cusum_threshold` ``(max(k, CPU_MIN_K), CPU_ARL_OBS)``, at least ``CPU_MIN_ALARM_OBS x
        CPU_CLIP_Z``. ``ref``, ``sigma``: the median and 1.4826 x MAD times :func:`_ar1_factor` (at least
        :data:`CPU_SIGMA_FLOOR` and ``noise_floor``) of the rank's observations but its newest :data:`CPU_REF_LAG`
        (at least its first :data:`CPU_REF_MIN`); ``ref`` is the rank's learned CPU baseline (``_cpu_ref``). Nothing
        (no baseline, no CUSUM) before :data:`CPU_REF_MIN` observations. ``x``: log ratio, unitless."""
        h = self._cpu_hist[r]
        if len(h) < CPU_REF_MIN:
            return
        xs = list(h)
        old = xs[:max(CPU_REF_MIN, len(xs) - CPU_REF_LAG)]
        ref, mad = median_mad(old)
        self._cpu_ref[r] = ref
        sigma = max(MAD_TO_SIGMA * mad * _ar1_factor(old, ref), CPU_SIGMA_FLOOR, self.settings.noise_floor)
        big_k = math.log1p(self.settings.outlier_min_effect)
        k = big_k / sigma
        thr = max(cusum_threshold(max(k, CPU_MIN_K), CPU_ARL_OBS), CPU_MIN_ALARM_OBS * CPU_CLIP_Z) * sigma
        z = max(-k - CPU_CLIP_Z, min((x - ref) / sigma, k + CPU_CLIP_Z))
        self._cpu_cusum[r] = min(2.0 * thr, max(0.0, self._cpu_cusum[r] + sigma * z - big_k))
        self._cpu_run[r] = self._cpu_run[r] + 1 if self._cpu_cusum[r] > 0 else 0
        self._cpu_h[r] = thr

    def _cpu_evidence(self, r: int) -> bool:
        """Whether rank ``r``'s CPU CUSUM is at or over its threshold (:meth:`_cpu_step`): its independent CPU
        observations, one per sampled interval, hold a sustained excess over its own normal."""
        return self._cpu_cusum[r] >= self._cpu_h[r]

    # -- peers -----------------------------------------------------------------------------------------------------
    def _peer_groups(self) -> list[list[int]] | None:
        """Role groups (every rank in exactly one), or None when every rank is compared with every other."""
        if self._groups_stale:
            self._groups_stale = False
            self._groups = None
            if self.settings.role_groups and any(r is not None for r in self._roles):
                by_role: dict[str | None, list[int]] = {}
                for r, role in enumerate(self._roles):
                    by_role.setdefault(role, []).append(r)
                if len(by_role) > 1:
                    self._groups = list(by_role.values())
        return self._groups

    def _outlying(self, arr: list[float], groups: list[list[int]] | None) -> list[tuple[int, float]]:
        """Outlying ranks of one stage's values, each against its peers (role groups) with the ranks named slow and
        not cleared left out of the peers' reference (:func:`outlying_ranks`' ``exclude``)."""
        slow = frozenset(self._reported)
        if groups is None:
            return outlying_ranks(arr, self.settings, self._floor_s, slow)
        out: list[tuple[int, float]] = []
        rest: list[int] = []
        for g in groups:
            sub = [arr[r] for r in g]
            if sum(1 for v in sub if not math.isnan(v)) < self.settings.outlier_min_ranks:
                rest.extend(g)
                continue
            mine = frozenset(i for i, r in enumerate(g) if r in slow)
            out.extend((g[i], rel) for i, rel in outlying_ranks(sub, self.settings, self._floor_s, mine))
        if rest:
            pool = [math.nan] * len(arr)
            for r in rest:
                pool[r] = arr[r]
            if sum(1 for v in pool if not math.isnan(v)) >= self.settings.outlier_min_ranks:
                out.extend(outlying_ranks(pool, self.settings, self._floor_s, slow))
            elif len(rest) < len(arr):  # too few to compare among themselves: against everyone
                out.extend((r, rel) for r, rel in outlying_ranks(arr, self.settings, self._floor_s, slow)
                           if r in set(rest))
        return out

    def _peer_median(self, a: np.ndarray, groups: list[list[int]] | None) -> np.ndarray:
        """Per rank, the median of its peers' values (NaN where too few peers reported)."""
        med = np.full(a.shape, np.nan)
        if groups is not None:
            for g in groups:
                sub = a[g]
                if int(np.count_nonzero(~np.isnan(sub))) >= self.settings.outlier_min_ranks:
                    med[g] = float(np.nanmedian(sub))
        todo = np.isnan(med)
        if todo.any() and int(np.count_nonzero(~np.isnan(a))) >= self.settings.outlier_min_ranks:
            med[todo] = float(np.nanmedian(a))
        return med

    # -- learning the per-rank baselines ---------------------------------------------------------------------------
    def _record(self, name: str, arr: list[float], groups: list[list[int]] | None) -> None:
        ratios = self._learn.get(name)
        if ratios is None:
            # the CPU series is learned besides the stages: unlearned, a rank whose CPU time differs by design
            # (1.6x, rank 0 of a job timing 4 stages) was named at the first full window of the comparison
            if name != CPU_SERIES and sum(1 for k in self._learn if k != CPU_SERIES) >= MAX_LEARNED_STAGES:
                return
            shape = (self.settings.structural_learn_steps, self.world_size)
            ratios = self._learn[name] = np.full(shape, np.nan, dtype=np.float32)
            self._learn_cost[name] = np.full(shape, np.nan, dtype=np.float32)
        a = np.asarray(arr, dtype=np.float64)
        seen = self._learn_seen.get(name)
        if seen is None:
            seen = self._learn_seen[name] = np.zeros(self.world_size, dtype=bool)
        seen |= ~np.isnan(a)
        med = self._peer_median(a, groups)
        if name == CPU_SERIES:
            _pair_peers(a, med, groups)
        i = self._learn_n
        if i < ratios.shape[0]:
            with np.errstate(invalid="ignore", divide="ignore"):
                ratios[i] = np.where(med > 0, a / np.maximum(med, self._floor_s), np.nan)
            self._learn_cost[name][i] = a - med

    def _finish_learning(self, step: int) -> list[Anomaly]:
        s = self.settings
        half_tol = STABLE_FRACTION * s.outlier_min_effect
        slow: dict[int, tuple[float, str, float]] = {}
        reporting = {frozenset(np.flatnonzero(seen).tolist()) for seen in self._learn_seen.values()}
        for name, ratios in self._learn.items():
            n = ratios.shape[0]
            if not np.any(~np.isnan(ratios)):
                continue
            if name == CPU_SERIES and self._cpu_sampled:
                continue  # learned per rank from its independent intervals instead (_cpu_step, CPU_REF_MIN)
            if name == CPU_SERIES:
                # from CPU samples the series begins some steps into the window (its first value needs two samples
                # CPU_SAMPLE_MIN_STEPS apart): its stability is judged on the halves of the steps that carry it
                ratios = ratios[~np.all(np.isnan(ratios), axis=1)]
                n = ratios.shape[0]
                if n < s.outlier_window_steps:
                    continue
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns: ranks that never reported
                c = np.nanmedian(ratios, axis=0)
                first = np.nanmedian(ratios[: n // 2], axis=0)
                second = np.nanmedian(ratios[n // 2:], axis=0)
                cost = np.nanmedian(self._learn_cost[name], axis=0)
            # the halves' agreement relative to the ratio for the CPU series (a 2x rank's ratio moves twice as far
            # for the same relative noise: from CPU samples, medians of a few intervals, 1.98 and 2.04 were unlearned)
            tol = half_tol * np.maximum(c, 1.0) if name == CPU_SERIES else half_tol
            learned = (c - 1.0 >= s.outlier_min_effect / 2.0) & (np.abs(first - second) < tol)
            base: dict[int, float] = {}
            for r in np.flatnonzero(learned).tolist():
                base[int(r)] = float(c[r])
                if name != CPU_SERIES and c[r] >= 1.0 + s.outlier_min_effect and (r not in slow or c[r] - 1.0 > slow[r][0]):
                    slow[int(r)] = (float(c[r]) - 1.0, name, max(0.0, float(cost[r])))
            if base:
                self._base[name] = base
        for r in {r for ranks in self._base.values() for r in ranks}:
            self._drop_from_window(r)
        self._learn.clear()
        self._learn_cost.clear()
        self._learn_seen.clear()
        step_s = sorted(self._learn_step_s)
        self._learn_step_s = []
        if not slow:
            return []
        job_step_s = step_s[len(step_s) // 2] if step_s else 0.0
        cost_s = max(v[2] for v in slow.values())
        ranks = tuple(sorted(slow))
        detail: dict[str, Any] = {
            "excess": {r: round(slow[r][0], 6) for r in ranks}, "stage": {r: slow[r][1] for r in ranks},
            "cost_s_per_step": round(cost_s, 6),
            "cost_fraction": round(cost_s / job_step_s, 6) if job_step_s > 0 else None,
            "learn_steps": s.structural_learn_steps, "role_groups": self._peer_groups() is not None}
        out = [Anomaly("structural_imbalance", self.job_id, step, ranks, max(v[0] for v in slow.values()), detail)]
        staged = len(reporting) > 1  # ranks time different stages: pipeline stages the hook can see
        if staged or len(set(self._roles)) > 1:
            return out  # declared different roles (or visible stages) explain a difference present from the start
        bad = sorted(slow, key=lambda r: (-slow[r][0], r))
        shown = bad[:8]
        who = (f"rank {shown[0]} has" if len(bad) == 1 else
               "ranks " + ", ".join(map(str, shown)) + (", ..." if len(bad) > len(shown) else "") + " have")
        pct = ", ".join(f"{slow[r][0]:.0%}".replace("%", " %") for r in shown)
        text = (f"{who} been {pct} slower than {'its' if len(bad) == 1 else 'their'} peers since the job started: a "
                "bad node, or a role difference: declare roles to silence")
        out.append(Anomaly("slow_from_start", self.job_id, step, tuple(sorted(bad)), slow[bad[0]][0],
                           {**detail, "text": text, "min_effect": s.outlier_min_effect}))
        return out

    def _share_outlying(self, name: str, arr: list[float], step_s: float) -> list[tuple[int, float]]:
        """Ranks whose share of the job's step rose against their own recent share: ``[(rank, relative excess)]``
        for one stage's values ``arr`` (s, one per rank; NaN = not reported) in a step of ``step_s`` s, the step's
        shares ``v / step_s`` kept per rank (a ring of ``structural_learn_steps + outlier_window_steps`` steps, the
        first :data:`MAX_LEARNED_STAGES` stages). A rank's ratio ``q`` is its share now over its reference share:
        the median of its ring's ``structural_learn_steps`` oldest shares, at least :data:`STAGE_SCALE_FLOOR` (a
        stage of microseconds: at most 100x; a rank that never reported has none), taken every
        :data:`SHARE_REF_STEPS` steps, lagged by the outlier window (as
        :data:`CPU_REF_LAG`: a change is judged against the rank's past, and fires before the reference takes it
        in). The reference ratio is the larger of 1 (the rank's own past) and the lower median of the ranks' ``q``
        (a job-wide rise of the shares lifts them all); a rank is outlying when its ``q`` exceeds it by
        ``outlier_z`` robust scales of the lower half (``1.4826 MAD`` about its top, the lower median: a step that rose
        with the slowed ranks leaves the others' ``q`` under 1 together; at least ``noise_floor`` of the reference) and
        by ``outlier_min_effect`` of it, and its excess in seconds reaches ``outlier_min_abs_s``. The peers' median
        cannot name half the ranks slowing at once (a node of 4 of 8): it sits between the two halves; the step
        time can where it did not rise with them (a hot expert elsewhere sets it): their share of it rose, while a
        half that got faster leaves the others' share where it was (``bench/bench_corpus.py`` seed 36, ``moe`` run
        1: ranks 4-7 1.3x at step 274 beside a 1.42x hot expert on rank 0 were never named). Needs
        :data:`SHARE_MIN_RANKS` ranks with a reference. Source: each rank against its own history and its peers, as
        NVIDIA Resiliency Extension's straggler detection (class Notes)."""
        s = self.settings
        if self.world_size < SHARE_MIN_RANKS or not step_s > 0.0 or len(arr) != self.world_size:
            return []
        ring = self._shares.get(name)
        if ring is None:
            if len(self._shares) >= MAX_LEARNED_STAGES:
                return []
            shape = (s.structural_learn_steps + s.outlier_window_steps, self.world_size)
            ring = self._shares[name] = np.full(shape, np.nan, dtype=np.float64)
        n = self._shares_n.get(name, 0)
        size = ring.shape[0]
        a = np.asarray(arr, dtype=np.float64)
        base = self._share_ref.get(name)
        if n >= size and (base is None or n % SHARE_REF_STEPS == 0):
            old = ring[(n + np.arange(s.structural_learn_steps)) % size]  # all but the newest outlier window
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns: ranks that never reported
                mid = np.nanmedian(old, axis=0) if np.isnan(old).any() else np.median(old, axis=0)
            # a stage of microseconds is measured against STAGE_SCALE_FLOOR of the step, as outlying_ranks does
            base = self._share_ref[name] = np.maximum(mid, STAGE_SCALE_FLOOR)
        ring[n % size] = a / step_s
        self._shares_n[name] = n + 1
        if base is None:
            return []
        with np.errstate(all="ignore"):
            q = a / step_s / base
        present = np.sort(q[np.isfinite(q)])
        if present.size < SHARE_MIN_RANKS:
            return []
        low = present[: (present.size + 1) // 2]
        ref = max(1.0, float(low[-1]))
        spread = MAD_TO_SIGMA * float(np.median(np.abs(low - low[-1])))  # the lower half's own, not about ref
        thr = max(s.outlier_z * max(spread, s.noise_floor * ref), s.outlier_min_effect * ref)
        out: list[tuple[int, float]] = []
        with np.errstate(invalid="ignore"):
            idx = np.flatnonzero(q - ref >= thr)
        for r in idx.tolist():
            if (float(q[r]) - ref) * float(base[r]) * step_s >= s.outlier_min_abs_s:
                out.append((int(r), (float(q[r]) - ref) / ref))
        return out

    def _drop_from_window(self, r: int) -> None:
        for entry in self._ring:
            entry[:] = [(q, rel) for q, rel in entry if q != r]
        self._hits[r] = 0
        self._excess_sum[r] = 0.0
        self._stage.pop(r, None)

    # -- the outlier window ----------------------------------------------------------------------------------------
    def _window(self, step: int, flagged: dict[int, tuple[float, str]], *, fire: bool) -> Anomaly | None:
        s = self.settings
        hits, excess_sum = self._hits, self._excess_sum
        for r, (rel, name) in flagged.items():
            hits[r] += 1
            excess_sum[r] += rel
            self._stage[r] = name
        self._ring.append([(r, rel) for r, (rel, _) in flagged.items()])
        if len(self._ring) > s.outlier_window_steps:
            for r, rel in self._ring.popleft():
                hits[r] -= 1
                excess_sum[r] -= rel
                if hits[r] == 0:
                    self._stage.pop(r, None)
        if not fire:
            return None
        if self._reported:
            for r in [r for r in self._reported if hits[r] * 2 < s.outlier_min_steps]:
                self._reported.discard(r)
        new = sorted(r for r in flagged if hits[r] >= s.outlier_min_steps and r not in self._reported
                     and (flagged[r][1] != CPU_SERIES or self._cpu_last[r] < 0 or self._cpu_evidence(r)))
        if not new:
            return None
        self._reported.update(new)
        per_rank = {r: excess_sum[r] / hits[r] for r in new}
        detail: dict[str, Any] = {"window_steps": len(self._ring), "outlying_steps": {r: hits[r] for r in new},
                                  "excess": per_rank, "stage": {r: self._stage.get(r, "") for r in new}}
        own = {r: round(self._base[self._stage[r]][r], 6) for r in new
               if self._stage.get(r) in self._base and r in self._base[self._stage[r]]}
        if own:
            detail["baseline_ratio"] = own
        return Anomaly("rank_outlier", self.job_id, step, tuple(new), max(per_rank.values()), detail)
