"""A serving unit's one level: every work band shares it, and a lasting change of it is found on minutes (pure).

The load-band references of :class:`~profwatch.core.detection.serving.LoadNormaliser` each learn their own level,
so a change that sets in while they form (a unit's first minutes, or a slow unit whose bands take a quarter of an
hour to fill) is learned band by band as each one's normal, and a rolling reference follows a lasting change within
minutes. :class:`UnitLevel` is the second line that cannot learn a change that way: every step is
``log time = level + offset(band)``, one level for the unit (its host load and its health), one fixed offset per
work band (what the batch costs). A new band's offset is learned against the level the unit's known bands show at
that moment, so a band that forms after a change carries the change in the level, never in its offset.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from statistics import median

import numpy as np

from profwatch.core.detection.regression import ar1_long_run_factor, serial_rho
from profwatch.core.detection.settings import DetectionSettings
from profwatch.core.detection.types import Anomaly

LEVEL_BAND_RATIO = 1.1
"""Work bands of the level model are powers of this ratio (as the load normaliser's work bands)."""
OFFSET_VALUES = 8
"""Values a band needs, each taken while the unit's level was fresh, before its offset (their median residual to
the level) is learned."""
FIRST_BAND_VALUES = 3
"""Values the first band needs to set the scale: the level model starts within the unit's first seconds of steps (at
8, a unit whose batch wandered over many bands first had a band 60 s in, after a 3x change, and learned it as its
scale: bench_corpus seed 32 serving_work run 2); its offset's error is one constant for every band."""
LEVEL_VALUES = 8
"""Residuals of known bands whose median is the unit's current level (a new band's offsets are learned against it)."""
LEVEL_FRESH_STEPS = 64
"""The current level is fresh when a known band stepped within this many of the unit's steps; a new band's value
taken when it is not waits for nothing and is dropped (its level would be an old one)."""
LEVEL_BLOCK_S = 60.0
"""Seconds of the unit's own time (steps and idle gaps) per block of the level series."""
LEVEL_BLOCK_MIN = 8
"""Residuals a block needs (fewer: its time joins the next block)."""
LEVEL_RUN = 5
"""Fewest blocks after a split: a change must hold for about five minutes of the unit's time before it is judged."""
LEVEL_BASE_MIN = 5
"""Blocks before a split it needs to report a change of ``min_effect`` (fewer: see :data:`YOUNG_EFFECT`)."""
YOUNG_EFFECT = 0.5
"""With fewer than :data:`LEVEL_BASE_MIN` blocks before a split (a slow unit's first minutes: one block of a
0.3 s unit idle most of the time took 5 minutes), the change must be at least ``1 +`` this: more than a shared
host's load moves a block (1.0-1.5x), so one or two blocks are a reference only for a change that large."""
LEVEL_HISTORY = 60
"""Blocks kept, among which the split is searched (up to the last hour of the unit's time)."""
LEVEL_Z = 5.5
"""Standard errors the difference of the two parts' means must clear at the best split (a maximum over splits of
blocks that a host's load makes correlated: well above the 2-3 of a single test). At 4.5 a healthy replica's +25 %
at z 4.7 armed and at 5.0 the same replica at +25.7 % (z 5.13) still did (bench_corpus seed 32 serving_dp run 7);
at 5.5 none in seeds 31 and 32 and the same changes found in seed 31, while a 1.3x change of seed 31 serving_work
run 5 read z 4.85: 1.3x under a host load of 1.0-1.5x is at the edge of what ten blocks before it can tell."""
LEVEL_CLIP = 3.0
"""Blocks are winsorised at this many sigmas from their part's median before the means are taken."""
LEVEL_MIN_NOISE = 0.1
"""Floor of the block noise (log): blocks of a shared host wander about 10 % with its load, in runs of several
blocks that a MAD of a few blocks does not see (at 0.05, a healthy unit's 5 blocks at +17-26 % were reported twice
in 51 minutes: bench_corpus seed 31 serving_work run 7)."""
NOWORK_MIN_NOISE = 0.2
"""Floor of the block noise (log) of a unit without ``work`` (:class:`UnitLevel` ``without_work``): its blocks'
level follows the batch, which nothing there measures, and a shared host's load; healthy 60 s blocks of
bench_corpus serving_nowork (seeds 31-34, 32 runs) wander with a median standard deviation of 0.19 (up to 0.26), in
runs of minutes (the batch wanders slowly). At 0.1 or 0.15, 1-3 healthy units of 40 (seeds 31-35) read +55-67 %
at z 5.6-8 (seed 32 run 2, seed 34 run 1); at 0.2 none, the 3x and 2.6x changes found."""
NOWORK_EFFECT = 0.5
"""Smallest rise (``1 +`` this) reported on a unit without ``work``: the batch and the host's load move a block
up to 2.5x on healthy traffic (bench_corpus serving_nowork, range of 60 s block levels 0.6-0.9 in log), so only a
change well beyond what five blocks of them average to is told from them; at 0.3 a 3x change was reported as +35 %
from a split in its first blocks (seed 32 run 6)."""
FAST_STEPS = 24
"""Fewest residuals of known bands in the fast test's window (see :data:`FAST_EFFECT`); it holds more while they
span less than :data:`FAST_MIN_S` seconds, at most :data:`FAST_MAX_STEPS`."""
FAST_MAX_STEPS = 1024
"""Most residuals in the fast test's window (bounds memory)."""
FAST_MIN_S = 5.0
"""Seconds of the unit's steps the fast test's window spans at least (a burst of a few fast steps is no evidence; at
24 steps alone, 24 steps of 0.17 s made 4.1 s and a 3x change waited for a longer burst)."""
FAST_EFFECT = 2.5
"""Least rise (a ratio) the fast test reports on a unit with ``work`` (at 2.0 a +50 % change under a host load
of 1.0-1.5x read 2.0x, over the median block and was reported as +100 %: the window holds one load, the blocks a
median of many; tests/unit/test_serving_unit_level.py): the median of its last :data:`FAST_STEPS`
residuals over the median of its blocks (at least :data:`FAST_BASE_MIN` of them), also :data:`FAST_Z` block noise
sigmas. More than a shared host's load moves a unit (1.0-1.5x): a change that large is told from it in seconds,
where the block test needs :data:`LEVEL_RUN` blocks of 60 s (3x changes of bench_corpus serving_work found 444-1,242
steps after their onset). On a unit without ``work`` the window spans :data:`NOWORK_FAST_MIN_S` (its batch
moves a few seconds of steps far more than it moves a block)."""
NOWORK_FAST_MIN_S = LEVEL_BLOCK_S
"""Seconds of the unit's steps the fast test's window spans at least on a unit without ``work``
(:class:`UnitLevel` ``without_work``; up to :data:`FAST_MAX_STEPS` residuals): a window of one block's time,
whose median the batch and the host's load move no more than they move a block (healthy 60 s blocks of
bench_corpus serving_nowork span 0.6-0.9 in log, so at most about ``exp(0.45)`` = 1.6x off their median, under
:data:`FAST_EFFECT`). A 3x change of such a unit then waits one block's time, not the block test's
:data:`LEVEL_RUN` blocks (bench_corpus seed 35 serving_nowork: 3x found a median of 344 steps after its onset)."""
FAST_BASE_MIN = 2
"""Blocks the fast test needs before it judges (the 2x least change already clears a host's load; at
:data:`LEVEL_BASE_MIN` a 3x change 7 minutes into a unit that idles most of the time waited for the block test:
bench_corpus seed 31 serving_work run 4)."""
FAST_Z = 4.0
"""Block noise sigmas the fast test's change must also reach (one window against the blocks' spread; at
:data:`LEVEL_Z` a 3x change, 2.4x over the median block under a host load of 1.0-1.5x with a block noise of ~0.15,
waited 200 steps: bench_corpus seed 31 serving_work run 2)."""
WITHIN_MIN_BLOCKS = 2
"""Blocks a work band needs on each side of a split to join the within-band check (:meth:`UnitLevel._within`)."""
WITHIN_MIN_BANDS = 3
"""Work bands (each with :data:`WITHIN_MIN_BLOCKS` blocks on each side of a split) the within-band check needs;
fewer: it does not judge (the split's change stands)."""
MAX_LEVEL_BANDS = 256
"""Bands kept (the least recently used is dropped and learned again when it comes back): bounds memory."""
MAX_LOG = math.log(100.0)
"""A block's level is clamped to [1 / 100, 100] of the band offsets' scale (magnitudes stay bounded)."""


def level_serial_factor(before: list[float], after: list[float], mb: float, ma: float) -> float:
    """The factor (1 to 3) the block test's standard error is multiplied by for serially correlated blocks: the
    long-run standard deviation of an AR(1) series over its marginal one, ``sqrt((1 + rho) / (1 - rho))`` (Bayley
    & Hammersley 1946, J. R. Stat. Soc. Suppl. 8:184), ``rho`` the lag-1 autocorrelation of the blocks' deviations
    from their own part's median (``before`` about ``mb``, ``after`` about ``ma``, log; so a change between the
    parts adds nothing to it), bias-corrected and bounded to ``[0, SERIAL_RHO_MAX]`` as
    :func:`~profwatch.core.detection.regression.serial_rho` does (Kendall 1954). Floor 1 (independent blocks),
    bound 3 (``rho`` 0.8). A shared host's load and a slowly wandering batch move blocks in runs of several
    minutes, so the blocks of one part are not independent and ``sigma * sqrt(1 / k + 1 / (n - k))`` understated
    the error of their means: a healthy unit read z 6.03 (+94 %, without ``work``: 25 blocks before at an
    autocorrelation of 0.40, ``bench/bench_corpus.py --healthy-hours`` seed 33 serving_nowork healthy run 0) and
    z 7.15 (+60 %, with ``work``: 9 blocks in runs of three, seed 38 serving_work run 2), and both armed
    (tests/unit/test_false_arms_replayed.py). Used only once the history holds ``LEVEL_BASE_MIN + LEVEL_RUN``
    (10) blocks, the fewest a full-size split is judged on: the autocorrelation of fewer is hardly an estimate (its
    small-sample correction alone is 0.17 at 6 blocks) and a split that young must be 1.5x (:data:`YOUNG_EFFECT`,
    :data:`NOWORK_EFFECT`), beyond a host's load; with it there, a 3x change 51 s into a unit without ``work``
    (1 block before, 5 after, z 5.53) was lost (bench_corpus seed 32 serving_nowork run 1). Pure."""
    dev = np.asarray([v - mb for v in before] + [v - ma for v in after], dtype=np.float64)
    return ar1_long_run_factor(serial_rho(dev))


@dataclass
class _Block:
    first_step: int
    last_step: int
    value: float
    bands: dict[int, float] = field(default_factory=dict)
    """Per work band of the block, the median of its residuals (the within-band check, :meth:`UnitLevel._within`)."""


class UnitLevel:
    """Judges one serving unit's level, shared by all its work bands, on blocks of :data:`LEVEL_BLOCK_S` seconds.

    Args:
        job_id: copied into every :class:`Anomaly`.
        settings: ``min_effect``.
        without_work: the unit reports no ``work`` (its steps are given one by one, one band): the block noise's
            floor is :data:`NOWORK_MIN_NOISE` and a rise must be at least ``1 +`` :data:`NOWORK_EFFECT` (the
            blocks follow the batch, which nothing measures).

    Notes:
        Model: ``log t = level(time) + offset(band)``, band ``floor(log(work) / log(1.1))`` (one band without
        ``work``). The first band with :data:`FIRST_BAND_VALUES` values sets the scale (its offset is their median log
        time); every later band learns its offset as the median of ``log t - level`` over its first
        :data:`OFFSET_VALUES` values taken while the level is fresh (a known band stepped within
        :data:`LEVEL_FRESH_STEPS` steps); the level is the median residual ``log t - offset`` of the last
        :data:`LEVEL_VALUES` steps of known bands. Offsets are then fixed. So a change of the unit (every band
        slower) shows in the level whether it set in before or after a band formed.

        Test: the residuals of known bands form blocks of at least :data:`LEVEL_BLOCK_S` seconds of the unit's
        time (steps and idle gaps, :meth:`elapse`) and :data:`LEVEL_BLOCK_MIN` residuals; a block's value is their
        median. At each block the history (up to :data:`LEVEL_HISTORY` blocks) is split in two at every ``k`` with
        at least :data:`LEVEL_RUN` blocks after (a change must have held about five minutes of the unit's time);
        with ``sigma = max(1.4826 * MAD, LEVEL_MIN_NOISE)`` (the blocks' deviations from their part's median) and
        each part's mean winsorised at :data:`LEVEL_CLIP` sigmas, the split is a change when the difference ``e``
        of the means is at least :data:`LEVEL_Z` standard errors ``f * sigma * sqrt(1 / k + 1 / (n - k))`` (``f``
        the serial factor of the blocks, 1 to 3, from ``LEVEL_BASE_MIN + LEVEL_RUN`` blocks on, else 1:
        :func:`level_serial_factor`) and at
        least ``log(1 + min_effect)`` (``log(1 + YOUNG_EFFECT)`` with fewer than :data:`LEVEL_BASE_MIN` blocks
        before it; ``without_work``: the floor is :data:`NOWORK_MIN_NOISE` and the least change
        ``log(1 + NOWORK_EFFECT)`` whatever the blocks before). The best split by ``z`` wins, if the work bands both
        parts use show it too (:meth:`_within`); its onset is its first
        later block at least ``|e| / 2`` off the
        earlier part's median, and the change is the median of the blocks from there over that median. A rise is a
        ``step_regression`` (``detail.detector "unit_level"``, magnitude ``exp(e) - 1``, ``first_step`` the onset
        block's first step); a fall is learned silently. Either way the blocks before the onset are shifted to the
        new level (the new normal at once; the spread is kept), as :meth:`rebase` does for a change another
        detector reported. A two-sample change-point test on block levels: the first split of binary segmentation with a
        robust scale (our own rule, stated here so it can be checked). Cost: O(1) per step, O(history^2 log
        history) per block (60 blocks, once a minute of the unit's time); memory:
        :data:`MAX_LEVEL_BANDS` bands, :data:`LEVEL_VALUES` residuals, :data:`LEVEL_HISTORY` blocks.
    """

    def __init__(self, job_id: str, settings: DetectionSettings, *, without_work: bool = False) -> None:
        self.job_id = job_id
        self.settings = settings
        self.without_work = without_work
        self.reset()

    @property
    def min_noise(self) -> float:
        """Floor of the block noise (log): :data:`NOWORK_MIN_NOISE` without ``work``, else :data:`LEVEL_MIN_NOISE`."""
        return NOWORK_MIN_NOISE if self.without_work else LEVEL_MIN_NOISE

    @property
    def fast_min_s(self) -> float:
        """Seconds the fast test's window spans at least: :data:`NOWORK_FAST_MIN_S` without ``work``, else
        :data:`FAST_MIN_S`."""
        return NOWORK_FAST_MIN_S if self.without_work else FAST_MIN_S

    def least_effect(self, blocks_before: int) -> float:
        """Smallest change (``1 +`` this) reported after a split with ``blocks_before`` blocks before it."""
        if self.without_work:
            return max(NOWORK_EFFECT, self.settings.min_effect)
        if blocks_before >= LEVEL_BASE_MIN:
            return self.settings.min_effect
        return max(YOUNG_EFFECT, self.settings.min_effect)

    def reset(self) -> None:
        """Forget everything (a restart)."""
        self._offsets: dict[int, float] = {}
        self._learning: dict[int, list[float]] = {}
        self._level: deque[float] = deque(maxlen=LEVEL_VALUES)
        self._count = 0
        self._known_at = -LEVEL_FRESH_STEPS - 1
        self._open: list[float] = []
        self._open_keys: list[int] = []
        self._open_first: int | None = None
        self._open_s = 0.0
        self._blocks: deque[_Block] = deque(maxlen=LEVEL_HISTORY)
        self._fast: deque[tuple[int, float, float]] = deque()
        self._fast_s = 0.0

    @property
    def blocks(self) -> int:
        """Blocks in the history."""
        return len(self._blocks)

    @staticmethod
    def band_of(work: float | None) -> int:
        """The band key of a step with ``work`` (None, not finite or not > 0: one band, 0)."""
        if work is None or not (work > 0 and math.isfinite(work)):
            return 0
        return 1 + int(math.floor(math.log(work) / math.log(LEVEL_BAND_RATIO)))

    def elapse(self, seconds: float) -> None:
        """Count ``seconds`` of the unit's time (a finalised step's time, idle gaps included; not finite or
        negative: 0)."""
        self._open_s += max(0.0, seconds) if math.isfinite(seconds) else 0.0

    def add(self, step: int, time_s: float, work: float | None) -> list[Anomaly]:
        """One judged step of the unit (``time_s`` seconds > 0, its ``work`` or None); returns what the block it
        closes found (usually nothing). A time not finite and > 0 is ignored."""
        if not (time_s > 0 and math.isfinite(time_s)):
            return []
        self._count += 1
        key, x = self.band_of(work), math.log(time_s)
        off = self._offsets.get(key)
        if off is None:
            self._learn(key, x)
            return []
        self._offsets[key] = self._offsets.pop(key)  # most recently used last
        r = x - off
        self._level.append(r)
        self._known_at = self._count
        if self._open_first is None:
            self._open_first = step
        self._open.append(r)
        self._open_keys.append(key)
        self._fast.append((step, r, time_s))
        self._fast_s += time_s
        while len(self._fast) > FAST_STEPS and (self._fast_s - self._fast[0][2] >= self.fast_min_s
                                                or len(self._fast) > FAST_MAX_STEPS):
            self._fast_s -= self._fast.popleft()[2]
        fast = self._judge_fast(step)
        if fast:
            return fast
        if self._open_s < LEVEL_BLOCK_S or len(self._open) < LEVEL_BLOCK_MIN:
            return []
        value = max(-MAX_LOG, min(MAX_LOG, median(self._open)))
        by: dict[int, list[float]] = {}
        for k, x in zip(self._open_keys, self._open, strict=True):
            by.setdefault(k, []).append(x)
        bands = {k: max(-MAX_LOG, min(MAX_LOG, median(v))) for k, v in by.items()}
        self._blocks.append(_Block(self._open_first, step, value, bands))
        self._open, self._open_keys, self._open_first, self._open_s = [], [], None, 0.0
        return self._judge(step)

    def _learn(self, key: int, x: float) -> None:
        """One value of a band without an offset yet (see Notes)."""
        if not self._offsets:  # no known band: the first to fill sets the scale
            vals = self._learning.setdefault(key, [])
            vals.append(x)
            if len(vals) >= FIRST_BAND_VALUES:
                self._offsets[key] = median(vals)
                self._learning.clear()
            return
        if self._count - self._known_at > LEVEL_FRESH_STEPS or not self._level or not self._steady():
            return
        vals = self._learning.setdefault(key, [])
        vals.append(x - median(list(self._level)))
        if len(vals) >= OFFSET_VALUES:
            self._offsets[key] = median(vals)
            del self._learning[key]
            if len(self._offsets) > MAX_LEVEL_BANDS:
                del self._offsets[next(iter(self._offsets))]
        if len(self._learning) > MAX_LEVEL_BANDS:
            del self._learning[next(iter(self._learning))]

    def _steady(self) -> bool:
        """Whether the current level is not itself moving: the median of the newer half of its residuals is within
        ``log(1 + max(YOUNG_EFFECT, min_effect))`` of the older half's (the host-load range; at a 1.1x bound a
        healthy replica was armed on at z 5.61: bench_corpus seed 32 serving_dp run 7). A band's offset learned against a level that a change was
        still moving (the level lags it by half of :data:`LEVEL_VALUES` residuals of known bands) took part of the
        change into the offset, and bands learned against those carried it on: a 3x change 50 s into a unit's
        first minute read 1.2-1.5x in every later block (bench_corpus seed 32 serving_work run 2, never
        reported). Values of new bands are dropped while it moves."""
        r = list(self._level)
        if len(r) < LEVEL_VALUES:
            return True
        h = len(r) // 2
        return abs(median(r[h:]) - median(r[:h])) < math.log1p(max(YOUNG_EFFECT, self.settings.min_effect))

    def _judge(self, step: int) -> list[Anomaly]:
        """The best split of the history into a level before and after (see Notes); a rise is reported."""
        vals = [b.value for b in self._blocks]
        n = len(vals)
        if n < LEVEL_RUN + 1:
            return []
        best: tuple[float, int, float, float, float] | None = None
        for k in range(1, n - LEVEL_RUN + 1):
            before, after = vals[:k], vals[k:]
            mb, ma = median(before), median(after)
            dev = [abs(v - mb) for v in before] + [abs(v - ma) for v in after]
            sigma = max(1.4826 * median(dev), self.min_noise)
            lo, hi = mb - LEVEL_CLIP * sigma, mb + LEVEL_CLIP * sigma
            la, ha = ma - LEVEL_CLIP * sigma, ma + LEVEL_CLIP * sigma
            e = (sum(min(ha, max(la, v)) for v in after) / len(after)
                 - sum(min(hi, max(lo, v)) for v in before) / k)
            serial = level_serial_factor(before, after, mb, ma) if n >= LEVEL_BASE_MIN + LEVEL_RUN else 1.0
            z = abs(e) / (serial * sigma * math.sqrt(1.0 / k + 1.0 / len(after)))
            least = math.log1p(self.least_effect(k))
            if z >= LEVEL_Z and abs(e) >= least and (best is None or z > best[0]):
                best = (z, k, e, sigma, abs(e) / z)
        if best is None:
            return []
        z, k, e, sigma, se = best
        # the onset: the split's first block at least half the change off the earlier level (a block straddling
        # it, or winsorised into the later part, is no part of the new level); the change measured from there
        mb, sign = median(vals[:k]), 1.0 if e > 0 else -1.0
        j = next((i for i in range(k, n) if (vals[i] - mb) * sign >= abs(e) / 2.0), k)
        e = median(vals[j:]) - mb
        if e * sign < math.log1p(self.least_effect(k) if self.without_work and e > 0 else self.settings.min_effect):
            return []
        within = self._within(k)
        if within is not None and within * sign < min(abs(e), max(LEVEL_Z * se, math.log1p(self.least_effect(k)))):
            return []  # the bands' offsets differ, not the unit's level: the work mix moved (see _within)
        first = self._blocks[j].first_step
        self._shift(e, first)
        if e < 0:
            return []
        detail = {"detector": "unit_level", "first_step": first, "level_ratio": round(math.exp(e), 4),
                  "noise": round(sigma, 4), "z": round(z, 2), "blocks_before": k, "blocks_after": n - k,
                  "block_s": LEVEL_BLOCK_S, "bands": len(self._offsets)}
        if self.without_work:
            detail["without_work"] = True
        return [Anomaly("step_regression", self.job_id, step, (), math.expm1(e), detail)]

    def _within(self, k: int) -> float | None:
        """The within-band check of a split of the history before block ``k``: the median, over the work bands
        with at least :data:`WITHIN_MIN_BLOCKS` blocks on each side, of each band's change (the median of its
        block medians after the split over the one before); None with fewer than :data:`WITHIN_MIN_BANDS` such
        bands. A change of the unit moves every band alike; a split of the blocks' values that no band shows is
        the work mix moving between bands whose offsets disagree: each new band's offset is learned against the
        level its neighbours show at the time (a chain over the bands the batch walks through, each link with the
        host load's error of the seconds it was learned in), and a healthy unit whose offsets drifted 0.3 in log
        from its smallest to its largest batches read +27 % at z 5.58 when its batch moved from 1-20 to 15-30
        (``bench_corpus.py --healthy-hours`` seed 103 serving_work healthy run 1, armed;
        tests/unit/test_serving_unit_level.py; its bands' own change was +15 %, z 3.3). A split is reported only
        when its within-band change, in the split's direction, also clears what the split must (:data:`LEVEL_Z`
        standard errors and the least effect), or the split's own change if that is smaller (or nothing can be
        said)."""
        before: dict[int, list[float]] = {}
        after: dict[int, list[float]] = {}
        for i, b in enumerate(self._blocks):
            side = before if i < k else after
            for key, x in b.bands.items():
                side.setdefault(key, []).append(x)
        ds = [median(after[key]) - median(xs) for key, xs in before.items()
              if len(xs) >= WITHIN_MIN_BLOCKS and len(after.get(key, ())) >= WITHIN_MIN_BLOCKS]
        return median(ds) if len(ds) >= WITHIN_MIN_BANDS else None

    def _judge_fast(self, step: int) -> list[Anomaly]:
        """The fast test: the median of the last :data:`FAST_STEPS` residuals (spanning :attr:`fast_min_s`
        seconds, more residuals if need be, at most :data:`FAST_MAX_STEPS`) at least ``log(FAST_EFFECT)`` and :data:`FAST_Z` block sigmas over the median
        of the blocks (at least :data:`FAST_BASE_MIN`). Reported as the block test's rise (``detail.test
        "fast"``), onset the window's first residual at least half the change over the blocks' median; the blocks
        and the open block's residuals before it are shifted to the new level."""
        if len(self._fast) < FAST_STEPS or len(self._blocks) < FAST_BASE_MIN:
            return []
        if self._fast_s < self.fast_min_s and len(self._fast) < FAST_MAX_STEPS:
            return []
        vals = [b.value for b in self._blocks]
        mb = median(vals)
        sigma = max(1.4826 * median([abs(v - mb) for v in vals]), self.min_noise)
        e = median([r for _, r, _ in self._fast]) - mb
        if e < max(math.log(FAST_EFFECT), FAST_Z * sigma, math.log1p(self.settings.min_effect)):
            return []
        first = next(st for st, r, _ in self._fast if r - mb >= e / 2.0)
        # the change measured from its onset on (a window of a minute holds steps from before it)
        e = max(e, median([r for st, r, _ in self._fast if st >= first]) - mb)
        self._shift(e, first)
        n_new = sum(1 for st, _, _ in self._fast if st >= first)
        keep = len(self._open) - n_new
        self._open = [x + e if i < keep else x for i, x in enumerate(self._open)]
        self._fast.clear()
        self._fast_s = 0.0
        detail = {"detector": "unit_level", "test": "fast", "first_step": first, "level_ratio": round(math.exp(e), 4),
                  "noise": round(sigma, 4), "z": round(e / sigma, 2), "blocks_before": len(vals),
                  "fast_steps": FAST_STEPS, "bands": len(self._offsets)}
        return [Anomaly("step_regression", self.job_id, step, (), math.expm1(e), detail)]

    def rebase(self, log_factor: float, first_step: int | None) -> None:
        """A change of ``exp(log_factor)`` from the unit's step ``first_step`` on (None: the newest block's first
        step) is the unit's new normal: blocks that ended before it are shifted by ``log_factor`` (another
        detector reported it; not finite: ignored)."""
        if math.isfinite(log_factor) and self._blocks:
            self._shift(log_factor, self._blocks[-1].first_step if first_step is None else first_step)

    def _shift(self, delta: float, first_step: int) -> None:
        for b in self._blocks:
            if b.last_step < first_step:
                b.value = max(-MAX_LOG, min(MAX_LOG, b.value + delta))
                b.bands = {key: max(-MAX_LOG, min(MAX_LOG, x + delta)) for key, x in b.bands.items()}
