"""Serving mode: idle gaps, step times made comparable across loads, and independent replicas (pure).

An inference server steps only while requests are queued: between bursts it idles for seconds to minutes, the
time of one iteration depends on its batch and prefill tokens, and several data-parallel replicas under one job
id step independently (their step counters do not line up). Three small parts handle that for
:class:`~profwatch.core.detection.job_detector.JobDetector`: :func:`is_idle_gap` tells an idle gap from a step,
:class:`LoadNormaliser` turns each step time into its ratio to the usual time of steps of the same load, and
:class:`UnitSplitter` finds the groups of ranks that step together (a replica), judged as independent units.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import replace
from statistics import median

import numpy as np

from profwatch.core.detection.baseline import theil_sen
from profwatch.core.detection.regression import ar1_long_run_factor, serial_rho
from profwatch.core.detection.settings import SERVING_BLOCK_MIN, DetectionSettings
from profwatch.core.detection.types import Anomaly, FinalizedStep
from profwatch.core.verdict.robust import MAD_TO_SIGMA

WORK_BAND_RATIO = 1.1
"""Work bands are powers of this ratio (work within 10 % is one band)."""
BAND_WINDOW = 512
"""Values per band in its reference (rolling median). A band's values come in runs (the batch wanders in and out of
it), so its window spans only a few of a shared host's load periods (20-90 s, up to 1.5x) and its reference carries
their load: with 128, about +-10 %, which the regression detector read as a change of the unit while the references
were held (``UnitPipeline._follow_blocks``): a false +17 % after 19 held blocks on a healthy unit (bench_corpus
``--healthy-hours`` seed 104 serving_work run 2), and a real +30 % read as +17 %, found after 26 minutes
(tests/unit/test_serving_rescale.py seed 2). 512 spans more load periods."""
BAND_LAG = 32
"""The newest values of a band enter its reference only this late (a change cannot hide in it at once)."""
BAND_MIN = 8
"""Values a band needs before its steps are judged."""
LOAD_BAND_WINDOW = 32
"""Blocks in a load band's rolling reference without ``work`` (see :data:`LOAD_BAND_LAG`)."""
LOAD_BAND_LAG = 8
"""Without ``work``, a load band's reference is the rolling median of its last :data:`LOAD_BAND_WINDOW` blocks, the
newest :data:`LOAD_BAND_LAG` held back: the iteration time follows the batch size, which follows the load within a
band too, so the reference must be recent (blocks of 16 steps: 128 to 640 steps back); a lasting change of a few
blocks is still judged before it enters it."""
LOAD_BAND_STALE = 64
"""Without ``work``, a load band not used for this many of the unit's blocks is learned afresh when it is entered
again (its reference was the load of another hour)."""
MAX_HELD = 4096
"""Values a band holds back at most while they wait for ``LoadNormaliser.cutoff_step`` (then the oldest enter):
bounds memory."""
MAX_BANDS = 128
"""Work or load bands kept per unit (the least recently used is dropped): bounds memory."""
MAX_SCALE = 4.0
"""A band's reference is never rescaled by more than this factor either way from the median of its own values (2
held a 3x change reported while the unit learned at 2x: it was reported again every two minutes, 5-12 times, until
the bands' windows turned over; tests/unit/test_serving_provisional.py)."""
BLOCK_STEPS_WITHOUT_WORK = 16
"""Smallest block of a serving unit that reports no ``work`` (its median: a prefill among decode iterations does not move it)."""
LOAD_WINDOW_S = 600.0
"""Seconds (of the unit's own step and idle time) over which the busy fraction, the load band without ``work``,
is measured: several bursts and idle gaps, so one idle gap does not move a step to another band (over the last 64
steps it did: the steps right after each gap fell in a band whose reference was hours old, about 0.5 false
pages an hour of healthy traffic)."""


SERVING_BLOCK_S = 60.0
"""A serving unit's regression detector judges blocks of at least this many seconds of the unit's own time (its
steps and idle gaps) holding at least :data:`SERVING_BLOCK_MIN` records (the median of their ratios,
:class:`RatioBlocks`): a shared host's load moves every iteration by tens of percent for tens of seconds at a
time, a real level change of the steps that is no regression of the server; judged step by step it fired the
change-point test several times an hour (bench_corpus serving classes: 3-5 false arms per healthy hour on a host
whose load changes every 20-90 s by up to 1.5x). A change that lasts minutes moves every block. (Busy time alone
made too few blocks: a server idle most of the time made 5 blocks in 41 minutes.)"""


def is_idle_gap(step_time_s: float, usual_step_s: float | None, settings: DetectionSettings) -> bool:
    """True when a step of ``step_time_s`` seconds is mostly an idle gap: at least ``serving_idle_gap_s`` and
    ``idle_gap_factor`` times the usual step (``usual_step_s``; without one, the absolute bound alone)."""
    if step_time_s < settings.serving_idle_gap_s:
        return False
    return usual_step_s is None or step_time_s >= settings.idle_gap_factor * usual_step_s


class _Band:
    __slots__ = ("gain", "held", "lag", "last", "raw", "ref", "steps", "values")

    def __init__(self, window: int = BAND_WINDOW, lag: int = BAND_LAG) -> None:
        self.values: deque[float] = deque(maxlen=window)
        """Step times of the window, each divided by :attr:`gain` as it was when the value entered."""
        self.raw: deque[float] = deque(maxlen=window)
        """The same step times as measured (the bound of :data:`MAX_SCALE` is taken from their median)."""
        self.steps: deque[int] = deque(maxlen=window)
        """The unit's step of each value in the window (:meth:`rescale` leaves those of a change's steps as they
        are)."""
        self.held: deque[tuple[float, float, int]] = deque()
        """Step times not yet in the window: ``(time_s, gain the time was measured under, step)``."""
        self.ref: float | None = None
        self.lag = lag
        self.last = 0
        self.gain = 1.0
        """Product of the changes reported since the band was made (see :meth:`LoadNormaliser.rescale`)."""

    def hold(self, v: float, step: int, cutoff: int | None) -> None:
        """Take one step time of this band: it enters the window :attr:`lag` values later, and with a ``cutoff``
        step not before that step is reached (at most :data:`MAX_HELD` values wait)."""
        self.held.append((v, self.gain, step))
        while len(self.held) > self.lag and (cutoff is None or self.held[0][2] <= cutoff
                                             or len(self.held) > MAX_HELD):
            self.enter(*self.held.popleft())

    def enter(self, v: float, gain: float, step: int = -1) -> None:
        """Move one held step time (measured under ``gain`` at the unit's ``step``) into the window and re-estimate
        the reference."""
        self.values.append(v / gain)
        self.raw.append(v)
        self.steps.append(step)
        if len(self.values) < BAND_MIN:
            self.ref = None
            return
        raw = median(list(self.raw))
        ref = self.gain * median(list(self.values))
        self.ref = min(max(ref, raw / MAX_SCALE), raw * MAX_SCALE)

    def rescale(self, factor: float, since_step: int | None) -> None:
        """Every value in the window and held times ``factor``, except those of ``since_step`` or later, held or
        already in the window (they were measured at the new level already: a change reported minutes after its
        onset, by the level's block test, had entered the windows of the bands formed since, and rescaling those
        too read its steps at ``1 / factor`` and the older bands' at the rest of the change; the regression
        detector then reported one 3x change three more times: bench_corpus seed 32 serving_work run 2)."""
        if since_step is not None:
            self.held = deque((v, g * factor if st >= since_step else g, st) for v, g, st in self.held)
            self.values = deque((x / factor if st >= since_step else x for x, st in zip(self.values, self.steps,
                                                                                          strict=True)),
                                maxlen=self.values.maxlen)
        self.gain *= factor
        if not 1e-6 <= self.gain <= 1e6:  # renormalise the stored values (floats stay far from over/underflow)
            self.values = deque((v * self.gain for v in self.values), maxlen=self.values.maxlen)
            self.held = deque((v, g / self.gain, st) for v, g, st in self.held)
            self.gain = 1.0
        if self.ref is not None:
            raw = median(list(self.raw))
            self.ref = min(max(self.gain * median(list(self.values)), raw / MAX_SCALE), raw * MAX_SCALE)


class LoadNormaliser:
    """Maps a serving unit's finalised steps to their ratio to the usual time of a step of the same load.

    Args:
        settings: ``serving_load_bands``.

    Notes:
        Band: with ``work`` (tokens, requests: what the rank reported for the step), the band is
        ``floor(log(work) / log(1.1))``: steps of similar work; without it, the load band is the busy fraction
        over the last :data:`LOAD_WINDOW_S` seconds (busy time / (busy + idle time)) cut into
        ``serving_load_bands`` equal bands, and the unit is judged in blocks of at least
        :data:`BLOCK_STEPS_WITHOUT_WORK` steps (their median: a prefill among decode iterations does not move
        it); such a band's reference is short and recent (:data:`LOAD_BAND_WINDOW`, :data:`LOAD_BAND_LAG`) and
        learned afresh when the band comes back after :data:`LOAD_BAND_STALE` blocks. Each band keeps a rolling median of the last :data:`BAND_WINDOW`
        step times, the newest :data:`BAND_LAG` held back. A step becomes ``time_s / reference`` (dimensionless,
        about 1.0); a step of a band with fewer than :data:`BAND_MIN` values is excluded (``"load_band"``).
        The regression detector then judges one series of ratios, all loads pooled, so its change-point test
        keeps its power; a change that lasts is found before it enters the band references (lag), and once the
        regression detector reported it (or found the unit faster), :meth:`rescale` makes it the new normal of
        every band at once (exact bookkeeping, bounded: see there). Idle steps
        (excluded ``"idle"``) only count
        for the busy fraction. Memory: at most :data:`MAX_BANDS` bands (the least recently used is dropped).
        Assumption: at one load, iteration time does not depend on what came before (no queue effects).
    """

    def __init__(self, settings: DetectionSettings) -> None:
        self.settings = settings
        self.cutoff_step: int | None = None
        """Set by the owner (``UnitPipeline``): values of later steps stay out of the band windows (None: only
        the band's lag): the regression detector judges blocks of :data:`SERVING_BLOCK_S`, and a change must not
        leak into the references it is judged against before the test decides (``BAND_LAG`` values of a busy
        band pass within one block)."""
        self.reset()

    def reset(self) -> None:
        """Forget every band."""
        self._bands: dict[int, _Band] = {}
        self._busy: deque[tuple[float, bool]] = deque()
        self._busy_s = self._total_s = 0.0
        self._raw: deque[float] = deque(maxlen=BAND_WINDOW)
        self._usual: float | None = None
        self._pushed = 0
        self._count = 0

    @property
    def usual_step_s(self) -> float | None:
        """Median raw step time of the recent non-idle steps (seconds; re-estimated every 16 steps), for
        planning and for telling idle gaps; None before any."""
        return self._usual

    def rescale(self, factor: float, since_step: int | None = None) -> None:
        """Every band's reference times ``factor``: a lasting change the regression detector just reported (a rise,
        or a fall: ``factor`` < 1) becomes the new normal of every load at once, not band by band as each band's
        window turns over.

        Exact bookkeeping: each value is kept with the band's ``gain`` (the product of the factors so far) it was
        measured under, and enters the window divided by it, so the reference ``gain * median(kept)`` counts a
        value measured before the change at the new level and one measured after it once (the window's median
        takes the new level in without any factor left over). Values of ``since_step`` (the change's first step)
        or later, held or already in the window (a change reported minutes after its onset), count as measured
        after it. The reference stays within
        [1 / :data:`MAX_SCALE`, :data:`MAX_SCALE`] of the median of the window's measured step times. Before, the
        factor faded by ``1 / window`` of its log per value entered, faster than the median took the new level in:
        one +30 % replica was reported (and armed) 3-4 times as its reference faded (bench_workloads serving_tp and
        serving_dp). Multiplying the stored values on rises only (falls learned silently) ratcheted the ratios'
        baseline from 0.67 to 1e-42 on a host whose load came and went (docs/detection.md): falls are rescaled
        too (``UnitPipeline``). ``factor`` not > 0 or not finite: ignored."""
        if not (factor > 0 and math.isfinite(factor)):
            return
        for band in self._bands.values():
            band.rescale(factor, since_step)

    def band_of(self, fs: FinalizedStep) -> int:
        """The band key of ``fs`` (rules in Notes)."""
        if fs.work is not None and fs.work > 0:
            return int(math.floor(math.log(fs.work) / math.log(WORK_BAND_RATIO)))
        frac = self._busy_s / self._total_s if self._total_s > 0 else 1.0
        n = self.settings.serving_load_bands
        return -1 - min(n - 1, int(frac * n))

    def note_step(self, fs: FinalizedStep) -> None:
        """Count one finalised step (before any block) for the busy fraction and the usual step time."""
        idle = fs.excluded == "idle"
        t = max(0.0, fs.time_s)
        if not idle and self._busy and not self._busy[-1][1] and self._busy[-1][0] < 1.0:
            self._busy[-1] = (self._busy[-1][0] + t, False)  # busy steps kept per second at most (memory)
        else:
            self._busy.append((t, idle))
        self._total_s += t
        self._busy_s += 0.0 if idle else t
        while len(self._busy) > 1 and self._total_s - self._busy[0][0] >= LOAD_WINDOW_S:
            old, was_idle = self._busy.popleft()
            self._total_s -= old
            self._busy_s -= 0.0 if was_idle else old
        if fs.excluded is not None:
            return
        self._raw.append(fs.time_s)
        self._pushed += 1
        if self._usual is None or self._pushed % 16 == 0:
            self._usual = median(list(self._raw))

    def normalise(self, fs: FinalizedStep) -> FinalizedStep:
        """Return ``fs`` (a step or a block) with ``time_s`` as a ratio to its band's reference, or excluded
        (``"load_band"``)."""
        if fs.excluded is not None:
            return fs
        key = self.band_of(fs)
        self._count += 1
        band = self._bands.pop(key, None)
        if band is not None and key < 0 and self._count - band.last > LOAD_BAND_STALE:
            band = None
        band = band or (_Band(LOAD_BAND_WINDOW, LOAD_BAND_LAG) if key < 0 else _Band())
        band.last = self._count
        self._bands[key] = band  # most recently used last
        if len(self._bands) > MAX_BANDS:
            del self._bands[next(iter(self._bands))]
        ref = band.ref
        band.hold(fs.time_s, fs.step, self.cutoff_step)
        if ref is None or ref <= 0:
            return replace(fs, excluded="load_band")
        return replace(fs, time_s=fs.time_s / ref)


SPLIT_S = 5.0
"""Seconds of a unit's usual step time that two ranks' step counters must be apart (at two checks in a row) to be
judged independent replicas, when fewer steps than ``serving_unit_split_steps`` (:meth:`UnitSplitter.gap_steps`)."""
SPLIT_MIN_STEPS = 16
"""Fewest steps two ranks' counters must be apart to be cut (a unit of slow steps: a few steps are no evidence)."""


class UnitSplitter:
    """Splits a serving job's ranks into units that step together (a replica), by their step counters.

    Args:
        world_size: ranks of the job.
        settings: ``serving_unit_split_steps``.

    Notes:
        Every rank starts in one unit. At each :meth:`check` the ranks of a unit are sorted by their last step;
        where two neighbours differ by more than the unit's gap the unit is cut there, if the same cut was seen
        at the previous check too (two checks in a row: a rank whose reports are merely delayed is not cut off).
        The gap is ``serving_unit_split_steps``, or, when the caller knows the unit's usual step time, the steps
        of :data:`SPLIT_S` seconds of it if fewer (at least :data:`SPLIT_MIN_STEPS`): bursty replicas of a
        0.1 s step drifted 200 steps apart only 12-30 minutes into ``bench_corpus`` serving_dp runs, and each
        replica's own learning began only then (a 1.61x replica from 563 s, split at 973 s, learned as its usual
        level); tensor-parallel ranks of one replica step in lock-step and are never seconds of steps apart at
        two checks in a row. Units are only ever split, never merged, within a generation: the ranks of
        one replica (tensor parallel) step in lock-step and never drift that far apart, independent replicas
        do within minutes (bursts and idle gaps differ). Ranks that never reported stay where they are.
        Cost: O(world_size log world_size) per check.
    """

    def __init__(self, world_size: int, settings: DetectionSettings) -> None:
        self.world_size = world_size
        self.settings = settings
        self.units: list[list[int]] = [list(range(world_size))]
        self._pending: set[tuple[int, ...]] = set()

    def gap_steps(self, usual_step_s: float | None) -> int:
        """Steps two ranks' counters must differ by to be cut apart, for a unit whose usual step is
        ``usual_step_s`` seconds (None, not finite or not > 0: unknown): ``serving_unit_split_steps``, or the steps
        of :data:`SPLIT_S` seconds if fewer, at least :data:`SPLIT_MIN_STEPS`."""
        gap = self.settings.serving_unit_split_steps
        if usual_step_s is None or not (usual_step_s > 0 and math.isfinite(usual_step_s)):
            return gap
        return min(gap, max(SPLIT_MIN_STEPS, math.ceil(SPLIT_S / usual_step_s)))

    def check(self, last_step: list[int | None], usual_step_s: Sequence[float | None] | None = None) -> bool:
        """Refine the units from each rank's last step (None = never reported); ``usual_step_s``: per unit of
        :attr:`units` (in order), its usual step time in seconds or None (see :meth:`gap_steps`). True when they
        changed."""
        new_units: list[list[int]] = []
        cuts_now: set[tuple[int, ...]] = set()
        changed = False
        for u, unit in enumerate(self.units):
            gap = self.gap_steps(usual_step_s[u] if usual_step_s is not None and u < len(usual_step_s) else None)
            seen = sorted((s, r) for r in unit if (s := last_step[r]) is not None)
            groups: list[list[int]] = [[]]
            prev: int | None = None
            for s, r in seen:
                if prev is not None and s - prev > gap:
                    groups.append([])
                groups[-1].append(r)
                prev = s
            if len(groups) == 1:
                new_units.append(unit)
                continue
            key = tuple(sorted(g[0] for g in groups))
            cuts_now.add(key)
            if key not in self._pending:
                new_units.append(unit)
                continue
            silent = [r for r in unit if last_step[r] is None]
            groups[0].extend(silent)
            new_units.extend(sorted(g) for g in groups)
            changed = True
        self._pending = cuts_now
        if changed:
            self.units = sorted(new_units)
        return changed


class RatioBlocks:
    """Groups a serving unit's normalised records (ratios) into blocks of at least ``block_s`` seconds of busy time.

    Args:
        block_s: seconds of the unit's own time per block, its records' measured step times and idle gaps
            (:data:`SERVING_BLOCK_S`); a block also holds at least :data:`SERVING_BLOCK_MIN` judged records.

    Notes:
        :meth:`elapse` counts the unit's time (each finalised step's, idle gaps included), :meth:`push` takes each
        record as :meth:`LoadNormaliser.normalise` returned it (``time_s`` a ratio, or excluded). A block becomes one
        record: ``time_s`` the median ratio, ``step`` its last step, ``steps`` the steps it holds,
        ``slowest_rank`` the rank slowest most often, ``ranks_reported`` the least, ``work`` the median work, no
        stages. A record excluded for its load band (``"load_band"``: not learned yet) is left out; one excluded
        for another reason (an idle gap, a capture window, a flagged step) is passed on at once (the detectors
        skip it) and the open block goes on; its time counts for the block's length. Cost: O(records per block) per
        block; memory: one block.
    """

    def __init__(self, block_s: float = SERVING_BLOCK_S) -> None:
        self.block_s = block_s
        self.reset()

    def reset(self) -> None:
        """Drop the open block."""
        self._open: list[FinalizedStep] = []
        self._busy_s = 0.0
        self._firsts: deque[tuple[int, int]] = deque(maxlen=BAND_WINDOW)

    def first_step_of(self, step: int) -> int:
        """The first step of the block whose record has ``step`` (``step`` itself for a record no longer known):
        a change found on blocks began at the first step of its first block."""
        for last, first in reversed(self._firsts):
            if last == step:
                return first
            if last < step:
                break
        return step

    def elapse(self, seconds: float) -> None:
        """Count ``seconds`` of the unit's time (a finalised step's ``time_s``; not finite or negative: 0)."""
        self._busy_s += max(0.0, seconds) if math.isfinite(seconds) else 0.0

    def rescale(self, factor: float, since_step: int | None) -> None:
        """The load bands' references were just multiplied by ``factor`` (a change from step ``since_step`` on,
        None: all, made the new normal): the open block's ratios of records that end at ``since_step`` or later
        were taken against the old references and are divided by it, so the block does not report the change
        again (a 3x change of a unit without ``work`` reported by its level was reported again by the regression
        detector 21 s later, from the rest of the open block). ``factor`` not > 0 or not finite: ignored."""
        if not (factor > 0 and math.isfinite(factor)):
            return
        self._open = [replace(r, time_s=r.time_s / factor) if since_step is None or r.step >= since_step else r
                      for r in self._open]

    def push(self, ratio: FinalizedStep) -> list[FinalizedStep]:
        """One normalised record; returns the records for the regression detector (often none)."""
        if ratio.excluded is not None:
            return [] if ratio.excluded == "load_band" else [ratio]
        self._open.append(ratio)
        if self._busy_s < self.block_s or len(self._open) < SERVING_BLOCK_MIN:
            return []
        block, self._open, self._busy_s = self._open, [], 0.0
        self._firsts.append((block[-1].step, block[0].step - block[0].steps + 1))
        works = [b.work for b in block if b.work is not None]
        slowest = Counter(b.slowest_rank for b in block).most_common(1)[0][0]
        return [FinalizedStep(step=block[-1].step, time_s=median([b.time_s for b in block]), slowest_rank=slowest,
                              ranks_reported=min(b.ranks_reported for b in block), stages=None, excluded=None,
                              work=median(works) if works else None, steps=sum(b.steps for b in block))]


PEER_BLOCK_S = 10.0
"""Seconds of wall time (the arrival clock passed to ``JobDetector.observe``) per block in which
:class:`ReplicaPeers` compares the replicas of a serving job."""
PEER_MIN_VALUES = 8
"""Steps a replica needs counted in one block (in work bands with a shared reference) to be compared in it (fewer:
it sits that block out)."""
PEER_BLOCK_VALUES = 1024
"""Values one replica keeps per block at most (later ones are counted in ``replica_values_skipped``): bounds memory."""
PEER_HISTORY = 64
"""Blocks of each replica's log ratio to its peers kept (its baseline is their median, the newest
:data:`PEER_LAG` held back)."""
PEER_LAG = 6
"""The newest blocks enter a replica's baseline ratio only this late (a change is judged before it is learned)."""
PEER_MIN_BASELINE = 8
"""Blocks a replica's baseline ratio needs before it is judged."""
PEER_RUN = 3
"""Blocks in a row (of those the replica stepped in) its ratio must stay above its baseline by the threshold
before it is named: a change that lasts at least ``PEER_RUN * PEER_BLOCK_S`` seconds of its busy time."""
PEER_STRONG_RUN = 2
"""Blocks in a row (of those the replica stepped in) that name it sooner than :data:`PEER_RUN` when each is at least
:data:`PEER_STRONG_FACTOR` times the run test's threshold over its baseline (see :meth:`ReplicaPeers._judge`)."""
PEER_STRONG_FACTOR = 2.0
"""Multiple of the run test's threshold (``max(outlier_z * sigma, log(1 + outlier_min_effect))``) each of the last
:data:`PEER_STRONG_RUN` blocks must clear to name a replica on them alone: twice the threshold, eight noise sigmas
and at least 1.21x. Replicas of bursty traffic step together in few blocks (a 1.3x replica of a job of three read
1.27-1.33x in every block it was judged in, and the run test's third such block came 164 s after the onset:
bench_corpus seed 35 serving_dp run 6 at 1.3x), so each block a run needs costs minutes; healthy replicas read
two blocks in a row over 1.5 times the threshold once in 8,334 judged blocks of 32 runs replayed without their
change (bench_corpus serving_dp seeds 101-104, runs 0-7; at most 1.71 times it), never over twice it."""
PEER_YOUNG_RUN = 6
"""Blocks of the young test's window rule: a replica without a baseline yet (fewer than :data:`PEER_MIN_BASELINE`)
whose last this many blocks' median is over the threshold is named; its last :data:`PEER_RUN` blocks each over it
name it sooner when each is at least ``1 +`` :data:`PEER_YOUNG_EFFECT` over (see :meth:`ReplicaPeers._judge_young`)."""
PEER_YOUNG_EFFECT = 0.2
"""Least rise (``1 +`` this) over its peers' level in each of a young replica's last :data:`PEER_RUN` blocks that
names it on them alone (:meth:`ReplicaPeers._judge_young`); a smaller rise waits for the :data:`PEER_YOUNG_RUN`
blocks' median. It was 0.5 while a band's reference pooled every replica's steps: a healthy replica whose batches
had bands of their own read up to about +17 % next to its peers for several blocks. Compared with the other
replicas' cost curve (:class:`PeerCurve`), a 1.3x replica reads 1.27-1.40 from its first judged block and is named
on three of them (bench_corpus seed 38 serving_dp run 1: at 325 s instead of 1,115 s)."""
PEER_WINDOW = 6
"""Blocks (of those the replica stepped in) of the longer window test: a change smaller than ``outlier_z`` of the
ratio's noise per block, but persistent (see :data:`PEER_WINDOW_Z`)."""
PEER_WINDOW_Z = 2.5
"""Noise sigmas the median excess of the last :data:`PEER_WINDOW` blocks must reach, every one of them above the
baseline (a replica 1.15x slower with ``work``, a block noise of 0.04 in log, was never 4 sigmas over it in three
blocks in a row: bench_corpus seed 31 serving_dp run 7), times the serial factor of the baseline's blocks: a
ratio that wanders in runs of minutes moves a six-block median further than independent blocks would (a healthy
replica of two read +10.5 % over 6 blocks at a block noise of 0.040, 2.6 sigmas, its baseline's autocorrelation
giving a factor of 1.46: ``--healthy-hours`` seed 37 serving_dp healthy run 0, armed)."""
PEER_RECENT_S = 20.0
"""Seconds back (blocks that ended within them) that another replica's newest block median stands in for its level
in a block it did not step in (:meth:`ReplicaPeers._peer_level`): this block and the one before. A shared host's
load holds 20-90 s at a time; at 30 s a healthy replica of two read +23-28 % against its peer's blocks of 20-30 s
before, under another load, three blocks in a row (bench_corpus seed 32 serving_dp run 13, a false arm)."""
PEER_WORK_BAND = 1.25
"""Work bands of this ratio (powers of it): each step is divided by its band's reference from the other replicas
(:class:`PeerCurve`) before replicas are compared: the time of an iteration follows its batch, and independent
replicas run different batches at the same moment."""
PEER_REF_BLOCKS = 64
"""Block medians kept per work band and replica (:class:`PeerCurve`; a reference is the median of the other
replicas'), each replica's step times of the band per block, entering :data:`PEER_LAG` blocks late; 64 blocks of 10 s of the band's use span many of a shared host's load periods (a reference of the last 128 step
times was the load of the last half minute, a different load for each replica's own batch sizes: a healthy
replica read +23 % next to its peers)."""
PEER_REF_MIN_BLOCKS = 4
"""Block medians (of the other replicas) a band's reference needs before steps of it are compared
(:class:`PeerCurve`)."""


PEER_CURVE_SPAN = 8.0
"""Work ratio either way of a step's work within which the other replicas' bands make the cost-per-work curve that
gives its reference when they have none of its own band (:class:`PeerCurve`): a decode batch and a prefill of
thousands of tokens are two regimes, never one line."""
PEER_CURVE_REACH = 2.5
"""Work ratio a step's work may lie beyond the other replicas' nearest band on the curve (:class:`PeerCurve`):
farther out, no reference (the step is not compared)."""
PEER_BEYOND_SHARE = 0.25
"""Share of a replica's values in a block whose references were extrapolated (:meth:`PeerCurve.beyond`) over which
the young test does not name it on that block (:meth:`ReplicaPeers._judge_young`): a quarter of the values biased
by a line's error moves the block's median by a part of it."""
BARE_BAND = -(10**9)
"""The band key of steps without a usable ``work`` in :class:`PeerCurve` (its own band, never on the curve)."""


class PeerCurve:
    """Each replica's cost-per-work reference, learned from the other replicas only (pure).

    Notes:
        Per work band (powers of :data:`PEER_WORK_BAND` of ``work``; steps without one in :data:`BARE_BAND`) and
        per unit (its ranks), the last :data:`PEER_REF_BLOCKS` block medians of its step times in the band, each
        divided by its block's shared load (:meth:`learn`). The reference of a step of replica ``u`` in band
        ``k`` (:meth:`ref`, seconds) is the median of the block medians of band ``k`` of every unit, once the
        units that share no rank with ``u`` hold at least :data:`PEER_REF_MIN_BLOCKS` of them (a band the others
        use too: the peer comparison cancels a reference they all share, where one from the others alone moved
        with their traffic mix, one replica's apart from another's, and named a healthy replica +12 % by the
        window test, tests/unit/test_serving_replica_peers.py); when the others have none in ``k``, it is read
        off their cost-per-work curve: a Theil-Sen line (Theil 1950, Sen 1968: the median of the pairwise slopes,
        at least 0, and the median intercept) of time against work through the others' band references whose
        work lies within :data:`PEER_CURVE_SPAN` of the step's band centre, at least two of them, the step's band
        within :data:`PEER_CURVE_REACH` of the nearest (else None: the step only teaches), kept within
        [1 / :data:`MAX_SCALE`, :data:`MAX_SCALE`] of the nearest band's reference; between its points, within
        ``[max(t_b, t_a w / w_a), min(t_a, t_b w / w_b)]`` of the nearest point below ``(w_b, t_b)`` and the nearest
        above ``(w_a, t_a)`` (a line through a cost flat to 12 requests and linear after it read a healthy replica
        of 6-9 requests +16-27 % and named it, tests/unit/test_serving_replica_peers.py); beyond the work its points span
        (:meth:`beyond`), within ``[t_n min(1, w / w_n), t_n max(1, w / w_n)]`` of the nearest point ``(w_n, t_n)``
        (a cost that never falls with work nor rises faster than it), and a young replica is named on such blocks
        only over :data:`PEER_CURVE_REACH` more (:meth:`ReplicaPeers._judge_young`). Linear in work, not in log
        work: an iteration costs a fixed part plus a part per token, a curve in log-log. Limit: read off a few
        neighbouring bands of one replica, the slope is mostly noise (batches of 4-6 extrapolated to 12 read a
        1.3x replica 1.7-1.9x, tests/unit/test_serving_replica_peers.py's centres 4, 12, 28). A band only one
        replica uses is thus never its reference: before, a band pooled whichever replicas used it, so a band only
        the changed replica used learned the change as its reference (bench_corpus seed 37 serving_dp run 1, a 3x
        replica read +16 %).
        Memory: :data:`PEER_REF_BLOCKS` medians per band and unit, at most :data:`MAX_BANDS` bands (the least
        recently used is dropped). Cost: O(values) per learned block, a reference computed once per block and
        (band, unit), O(bands^2) for a curve point.
    """

    def __init__(self) -> None:
        self._bands: dict[int, dict[tuple[int, ...], deque[float]]] = {}
        self._cache: dict[tuple[int, tuple[int, ...]], tuple[float | None, bool]] = {}
        """(band, unit ranks) -> its reference (:meth:`ref`) and whether it was read off the curve outside its
        points' work (:meth:`beyond`)."""

    def touch(self, key: int) -> None:
        """Band ``key`` was used now (the least recently used band is the one dropped)."""
        band = self._bands.pop(key, None)
        if band is not None:
            self._bands[key] = band

    def _direct(self, key: int, ranks: tuple[int, ...], pooled: bool = False) -> float | None:
        band = self._bands.get(key)
        if band is None:
            return None
        own = set(ranks)
        vals = [x for u, d in band.items() if own.isdisjoint(u) for x in d]
        if len(vals) < PEER_REF_MIN_BLOCKS:
            return None
        return median([x for d in band.values() for x in d]) if pooled else median(vals)

    def _curve(self, key: int, ranks: tuple[int, ...]) -> tuple[float | None, bool]:
        span = math.log(PEER_CURVE_SPAN) / math.log(PEER_WORK_BAND)
        reach = math.log(PEER_CURVE_REACH) / math.log(PEER_WORK_BAND)
        pts = []
        for j in self._bands:
            if j != BARE_BAND and j != key and abs(j - key) <= span:
                r = self._direct(j, ranks)
                if r is not None and r > 0:
                    pts.append((PEER_WORK_BAND ** (j + 0.5), r, abs(j - key)))
        if len(pts) < 2 or min(d for _, _, d in pts) > reach:
            return None, False
        slope = max(0.0, theil_sen(np.array([t for _, t, _ in pts]), np.array([w for w, _, _ in pts])))
        cut = median([t - slope * w for w, t, _ in pts])
        near_w, near, _ = min(pts, key=lambda x: x[2])
        w = PEER_WORK_BAND ** (key + 0.5)
        if not min(p[0] for p in pts) <= w <= max(p[0] for p in pts):
            # beyond its points, within what a cost that never falls with work, nor rises faster than it, allows
            return min(max(cut + slope * w, near * min(1.0, w / near_w)), near * max(1.0, w / near_w)), True
        # between its points: within what that cost allows between the nearest point below and the nearest above
        w_b, t_b = max(((p[0], p[1]) for p in pts if p[0] < w), default=(near_w, near))
        w_a, t_a = min(((p[0], p[1]) for p in pts if p[0] > w), default=(near_w, near))
        lo, hi = sorted((max(t_b, t_a * w / w_a), min(t_a, t_b * w / w_b)))
        return min(max(cut + slope * w, lo, near / MAX_SCALE), hi, near * MAX_SCALE), False

    def ref(self, key: int, ranks: tuple[int, ...]) -> float | None:
        """Reference (seconds, at the shared load 1) of a step of band ``key`` of the unit of job ranks ``ranks``,
        from the other units only; None: none yet (rules in the class Notes)."""
        ck = (key, ranks)
        if ck not in self._cache:
            r, beyond = self._direct(key, ranks, pooled=True), False
            if r is None and key != BARE_BAND:
                r, beyond = self._curve(key, ranks)
            self._cache[ck] = (r if r is not None and r > 0 and math.isfinite(r) else None, beyond)
        return self._cache[ck][0]

    def beyond(self, key: int, ranks: tuple[int, ...]) -> bool:
        """Whether the reference :meth:`ref` gave for band ``key`` of unit ``ranks`` was extrapolated: read off the
        curve at a work outside the work its points span (below the smallest or above the largest). Such a
        reference holds the error of a straight line beyond its data: an iteration's cost is flat over small
        batches and then linear, or bends, and a line through the others' bands of 2-3 requests (flat) read a
        healthy replica of 6-7 +24-28 %, one through 5-14 read a healthy replica of 2-2.5 +127-165 %
        (tests/unit/test_serving_replica_peers.py); a replica's own baseline cancels it, its first blocks next to
        its peers do not (:meth:`ReplicaPeers._judge_young`)."""
        cached = self._cache.get((key, ranks))
        return cached is not None and cached[1]

    def learn(self, block: list[tuple[int, tuple[int, ...], float]], load: float) -> None:
        """One block's steps ``(band, unit ranks, seconds)``: each band's and unit's median, over ``load`` (> 0),
        joins its window."""
        by: dict[tuple[int, tuple[int, ...]], list[float]] = {}
        for key, ranks, t in block:
            by.setdefault((key, ranks), []).append(t)
        for (key, ranks), ts in by.items():
            band = self._bands.pop(key, None) or {}
            band.setdefault(ranks, deque(maxlen=PEER_REF_BLOCKS)).append(median(ts) / load)
            self._bands[key] = band
            if len(self._bands) > MAX_BANDS:
                del self._bands[next(iter(self._bands))]
        self._cache.clear()


MAX_PEER_RATIO = 100.0
"""A replica's ratio to its peers is clamped to [1 / this, this] (magnitudes stay bounded)."""


class ReplicaPeers:
    """Judges each independent replica of a serving job against its peers over the same wall-clock blocks.

    Args:
        job_id: the job (copied into every :class:`Anomaly`).
        units: the job ranks of each replica (``UnitSplitter.units``); at least two.
        settings: ``outlier_z``, ``outlier_min_effect``, ``noise_floor``.

    Notes:
        Replicas have unrelated step counters but share the host and its load, so they are compared on time:
        every :data:`PEER_BLOCK_S` seconds of arrival time. Each step time is first divided by its reference from
        the other replicas' cost per work (:class:`PeerCurve`: their block medians of the step's work band, powers
        of :data:`PEER_WORK_BAND` of ``work``, one band without ``work``, or their cost curve at its work where
        they have none of that band), the block medians each divided by its block's shared load
        (:meth:`_block_load`: every band's reference in one unit, not the host load of the minutes the band was in
        use), entering :data:`PEER_LAG` blocks late (:meth:`_learn_refs`); a step without a reference yet only
        teaches. A replica with at least :data:`PEER_MIN_VALUES` such ratios in the block has ``m_q``,
        their median: each one's ``r = log(m_q / level)``, clamped to ±log :data:`MAX_PEER_RATIO`, the level the
        median of the replicas' when three (both, in a job of two) have one, else taken from the other replicas'
        newest blocks of the last :data:`PEER_RECENT_S` seconds (:meth:`_peer_level`), else, in a job of three
        or more, the other replicas in the block each over its own baseline ratio (:meth:`_pair_level`: such a block
        may name a rise, never lower a baseline). Load the replicas share
        cancels in ``r``, and so does the batch: independent replicas run different batches at the same moment (bench_corpus serving_dp, batch a free random walk: the
        median time per token of a block swung 2x between healthy replicas and paged 5 times in 3.5 healthy
        hours). Before, replicas were compared within a work band only, so a block was judged only when three
        replicas had 8 steps each in one band: with batches that wander apart that never happened
        (bench_corpus serving_dp run 1: 0 blocks judged in 42 minutes, a 1.47x replica lost). The median of all,
        not of the others: with three replicas the others'
        median is the mean of two, and one replica 2x faster made a healthy one read 1.33x; three at least,
        not two: with two, a healthy replica read 0.77 next to a +30 % one, took that as its lower level, and
        was named once the third came back. Each replica keeps its own baseline of ``r`` (median of its last
        :data:`PEER_HISTORY` blocks, the newest :data:`PEER_LAG` held back; judged once
        :data:`PEER_MIN_BASELINE` are in; before that it is judged once against its peers' level, ratio 1) and its noise
        ``sigma = max(1.4826 * MAD, noise_floor)``. A replica whose excess ``r - baseline`` is at least
        ``max(outlier_z * sigma, log(1 + outlier_min_effect))`` in :data:`PEER_RUN` blocks in a row (blocks it
        sat out do not break the run; :data:`PEER_STRONG_RUN` when each is :data:`PEER_STRONG_FACTOR` times the
        threshold over it), or whose median excess over its last :data:`PEER_WINDOW` blocks is
        :data:`PEER_WINDOW_Z` sigmas times the serial factor ``sqrt((1 + rho) / (1 - rho))`` (``rho`` the lag-1
        autocorrelation of its baseline's blocks, :func:`~profwatch.core.detection.regression.serial_rho`; 1 to 3:
        the long-run deviation of an AR(1) series over its marginal one, Bayley & Hammersley 1946) and
        ``log(1 + outlier_min_effect)`` with every one of them above its baseline
        (``detail.test`` "run" or "window"; before its baseline forms: :meth:`_judge_young`, "young"), is named
        once as a ``step_regression`` of its ranks
        (``detail.detector == "replica_peers"``, magnitude ``exp(median excess) - 1``, at most
        :data:`MAX_PEER_RATIO`); the new level is then its baseline (its history is shifted by the run's median
        excess). As many blocks at least the threshold below its baseline make the lower level its baseline
        silently (a fall is never reported). With two replicas, a speedup of one reads as a slowdown of the other
        (nothing tells them apart). Reports of an idle gap, flagged or taken while capturing are left out. This
        is the robust-z peer comparison of :func:`~profwatch.core.detection.rank_outliers.outlying_ranks`, on
        blocks of wall time instead of steps. Cost: O(1) per report but the first of a band and unit in a block
        (see :class:`PeerCurve`), O(values) per block; memory: :data:`PEER_BLOCK_VALUES` values per replica for :data:`PEER_LAG` + 1 blocks,
        :data:`PEER_HISTORY` ratios per replica, :data:`PEER_REF_BLOCKS` medians per band and unit (:data:`MAX_BANDS`
        bands).
    """

    def __init__(self, job_id: str, units: list[list[int]], settings: DetectionSettings) -> None:
        self.job_id = job_id
        self.units = [list(u) for u in units]
        self.settings = settings
        self._unit_of = {r: q for q, u in enumerate(self.units) for r in u}
        n = len(self.units)
        self._vals: list[list[float]] = [[] for _ in range(n)]
        """Per replica, the open block's step times divided by their band's shared reference."""
        self._curve = PeerCurve()
        self._new: list[tuple[int, tuple[int, ...], float]] = []
        self._pending: deque[list[tuple[int, tuple[int, ...], float]]] = deque()
        self._count = [0] * n
        self._first: list[int | None] = [None] * n
        self._last: list[int] = [0] * n
        self._hist: list[deque[float]] = [deque(maxlen=PEER_HISTORY) for _ in range(n)]
        self._paired: list[deque[bool]] = [deque(maxlen=PEER_HISTORY) for _ in range(n)]
        """Per replica, beside each ratio of :attr:`_hist`, whether its level came from :meth:`_pair_level` (the
        young test's noise is measured on the others' ratios to a level of three, as before: a pair's ratio is
        noisier, and one side of it is left out of the history)."""
        self._up: list[list[tuple[float, float, int]]] = [[] for _ in range(n)]
        self._down: list[list[tuple[float, float, int]]] = [[] for _ in range(n)]
        self._recent: deque[tuple[float, dict[int, float]]] = deque()
        self._win: list[deque[tuple[float, int]]] = [deque(maxlen=PEER_WINDOW) for _ in range(n)]
        self._firsts: list[deque[int]] = [deque(maxlen=PEER_YOUNG_RUN) for _ in range(n)]
        self._beyond: list[list[bool]] = [[] for _ in range(n)]
        """Per replica, beside each value of :attr:`_vals`, whether its reference was extrapolated
        (:meth:`PeerCurve.beyond`; the young test judges a block on the others when it has enough: :meth:`_inside`)."""
        self._young: list[deque[float]] = [deque(maxlen=PEER_YOUNG_RUN) for _ in range(n)]
        """Per replica, beside the newest ratios of :attr:`_hist`, each block's ratio as the young test judges it (of
        its values on references within the other replicas' works, :meth:`_inside`)."""
        self._beyond_blocks: list[deque[bool]] = [deque(maxlen=PEER_YOUNG_RUN) for _ in range(n)]
        """Per replica, whether each of its last judged blocks had more than :data:`PEER_BEYOND_SHARE` of its values
        on extrapolated references (the young test does not name on such blocks)."""
        self._young_named: set[tuple[int, ...]] = set()
        self._bare: list[int] = [0] * n
        """Per replica, its steps without a usable ``work``: the young test judges only replicas whose steps all
        carry it (:meth:`_judge_young`)."""
        self._settle: list[list[tuple[float, float, int]] | None] = [None] * n
        """Per replica, the blocks judged since its own unit reported a rise (:meth:`adopt_unit`; None: none)."""
        self._end: float | None = None
        self._load = 1.0
        """The shared load of the last block learned that had steps in bands with a reference (1 before any)."""
        self.counters = {"replica_blocks": 0, "replica_values_skipped": 0}

    def inherit(self, old: ReplicaPeers) -> None:
        """Take over what ``old`` (the same job before its units were split further) learned: the work bands'
        shared references (every replica's steps pooled: they do not depend on the units), the block clock, and the
        open block, history and runs of each replica that is a unit of both. A split used to start the comparison
        afresh, and replicas of bench_corpus serving_dp split one by one over 4-17 minutes (counters apart by
        seconds of steps): the references took :data:`PEER_LAG` + :data:`PEER_REF_MIN_BLOCKS` blocks again and each
        baseline :data:`PEER_LAG` + :data:`PEER_MIN_BASELINE` of the replica's blocks, so a replica 1.15x slower
        from 353 s after the last split was never judged against a baseline (seed 31 run 7)."""
        self._curve, self._pending, self._new, self._end = old._curve, old._pending, old._new, old._end
        self._load = old._load
        self._young_named = old._young_named
        before = {tuple(u): q for q, u in enumerate(old.units)}
        for q, u in enumerate(self.units):
            o = before.get(tuple(u))
            if o is None:
                continue
            self._vals[q], self._count[q], self._first[q], self._last[q] = (
                old._vals[o], old._count[o], old._first[o], old._last[o])
            self._hist[q], self._up[q], self._down[q], self._win[q], self._firsts[q] = (
                old._hist[o], old._up[o], old._down[o], old._win[o], old._firsts[o])
            self._paired[q] = old._paired[o]
            self._bare[q] = old._bare[o]
            self._beyond[q], self._beyond_blocks[q] = old._beyond[o], old._beyond_blocks[o]
            self._young[q] = old._young[o]
            self._settle[q] = old._settle[o]

    def adopt_unit(self, ranks: Sequence[int]) -> None:
        """The replica of job ranks ``ranks`` reported a rise of its own (its unit's level or regression test): its
        next :data:`PEER_RUN` judged blocks are its new level next to its peers (its history is shifted to their
        median excess, as after a report of its own) and none of them names it. Before, a 2.75x replica its unit
        had found at 2.54x (the fast test's window holds some steps from before the onset) read +11 % over that
        next to its peers, and was named again 218 s later, a second arm for one change (bench_corpus seed 31
        serving_dp run 6). A rank list that is no replica: ignored."""
        key = sorted(ranks)
        for q, u in enumerate(self.units):
            if sorted(u) == key:
                self._settle[q] = []
                self._up[q].clear()
                self._down[q].clear()
                self._win[q].clear()

    def add(self, rank: int, step: int, time_s: float, work: float | None, now_unix_s: float) -> list[Anomaly]:
        """One step report of job rank ``rank`` (its replica's ``step``, ``time_s`` seconds, ``work`` or None)
        that arrived at ``now_unix_s``; returns what the blocks it closes found (usually nothing). A rank of no
        replica, or a time not finite and > 0, is ignored."""
        out = self.close(now_unix_s)
        if self._end is None:
            self._end = now_unix_s + PEER_BLOCK_S
        q = self._unit_of.get(rank)
        if q is None or not (time_s > 0 and math.isfinite(time_s)):
            return out
        has_work = work is not None and work > 0 and math.isfinite(work)
        key = (int(math.floor(math.log(work) / math.log(PEER_WORK_BAND))) if has_work and work is not None
               else BARE_BAND)
        if not has_work:
            self._bare[q] += 1
        if self._count[q] >= PEER_BLOCK_VALUES:
            self.counters["replica_values_skipped"] += 1
            return out
        self._count[q] += 1
        ranks = tuple(self.units[q])
        self._new.append((key, ranks, time_s))
        self._curve.touch(key)
        ref = self._curve.ref(key, ranks)
        if ref is None:
            return out  # no reference for this step from the others yet: it only teaches (PEER_LAG blocks later)
        self._vals[q].append(time_s / ref)
        self._beyond[q].append(self._curve.beyond(key, ranks))
        if self._first[q] is None:
            self._first[q] = step
        self._last[q] = max(self._last[q], step)
        return out

    def close(self, now_unix_s: float) -> list[Anomaly]:
        """Judge the open block if ``now_unix_s`` is past its end (called per report and from ``tick``)."""
        if self._end is None or now_unix_s < self._end:
            return []
        closed = self._end
        self._end += PEER_BLOCK_S * (1 + math.floor((now_unix_s - self._end) / PEER_BLOCK_S))
        firsts = list(self._first)
        vals, (inside, beyond) = self._vals, self._inside(self._vals, self._beyond)
        self._beyond = [[] for _ in self.units]
        self._vals = [[] for _ in self.units]
        self._count = [0] * len(self.units)
        self._first = [None] * len(self.units)
        self._learn_refs()
        meds = {q: median(v) for q, v in enumerate(vals) if len(v) >= PEER_MIN_VALUES}
        self._recent.append((closed, meds))
        while self._recent and self._recent[0][0] <= closed - PEER_RECENT_S:
            self._recent.popleft()
        if not meds:
            return []
        self.counters["replica_blocks"] += 1
        lim = math.log(MAX_PEER_RATIO)
        levels: dict[int, tuple[float, bool]] = {}
        for q in meds:  # every level before any judgement (a pair's level reads its peer's baseline)
            ref = self._peer_level(q, meds)
            if ref is not None:
                levels[q] = (ref, False)
            elif (pair := self._pair_level(q, meds)) is not None:
                levels[q] = (pair, True)
        out: list[Anomaly] = []
        for q, (ref, pair) in levels.items():
            m = meds[q]
            if not (m > 0 and ref > 0):
                continue
            r = max(-lim, min(lim, math.log(m / ref)))
            first = firsts[q]
            self._beyond_blocks[q].append(beyond[q])
            young = max(-lim, min(lim, math.log(median(inside[q]) / ref))) if inside[q] else r
            out.extend(self._judge(q, r, self._last[q] if first is None else first, len(meds) - 1, pair=pair,
                                   young=young))
        return out

    @staticmethod
    def _inside(vals: list[list[float]], flags: list[list[bool]]) -> tuple[list[list[float]], list[bool]]:
        """The values of each replica's block (``vals``, beside ``flags``: each one's reference extrapolated,
        :meth:`PeerCurve.beyond`) that the young test judges it on (:meth:`_judge_young`), and whether that block
        is on extrapolated references (then the young test names on it only over :data:`PEER_CURVE_REACH` more).
        A block with more than :data:`PEER_BEYOND_SHARE` of its values extrapolated is judged on the others, when
        at least :data:`PEER_MIN_VALUES` of them are left (their references lie within the work the other
        replicas' bands span, free of a line's error beyond its data); else on all of them, and it is on
        extrapolated references. Before, such a block was on extrapolated references whatever it held within
        them: a replica whose batches wandered past its peers' for minutes had every block flagged, and its 1.3x
        change 52 s into a job of four replicas read 1.14-1.46x next to its peers in 15 blocks and was never named
        (bench_corpus seed 41 serving_dp run 6 at 1.3x; tests/unit/test_serving_replica_peers.py). Only the
        young test, which compares a replica with its peers' level: the baseline tests compare it with its own
        history, which holds the same line's error (judged on a part of its values in some blocks and on all of
        them in others, a healthy replica of batches below its peers' read +20 % over its baseline three blocks
        in a row and was named). O(values)."""
        out: list[list[float]] = []
        beyond: list[bool] = []
        for v, f in zip(vals, flags, strict=True):
            inside = [x for x, b in zip(v, f, strict=True) if not b] if sum(f) > PEER_BEYOND_SHARE * len(v) else v
            keep = len(inside) >= PEER_MIN_VALUES
            out.append(inside if keep else v)
            beyond.append(not keep)
        return out, beyond

    def _peer_level(self, q: int, meds: dict[int, float]) -> float | None:
        """The level replica ``q``'s block median is compared with: the median of every replica's median in the
        block (the other one's, in a job of two) when three (both) stepped in it; else each other replica's newest
        block median of the last :data:`PEER_RECENT_S` seconds stands in for it, and the level is the median of
        the others' with three or more, the nearer of two others (None: fewer than two others, one in a job of
        two). Not a median that holds ``q`` itself: it read exactly 0 whenever ``q`` was the middle of three, the
        noise of its history came out at the floor and a healthy replica was named at +13 %
        (tests/unit/test_serving_replica_peers.py); not the mean of two others: next to a 2.75x replica a healthy
        one read 0.53, learned that as its level and was named at +87 % once its peers were healthy again
        (bench_corpus seed 31 serving_dp run 6). Replicas of bursty traffic rarely step together: bench_corpus serving_dp run 7 of seed
        31 had 15 blocks in an hour with three of four replicas in one, and its 1.15x replica was judged in 4."""
        need = min(3, len(self.units))
        if len(meds) >= need:
            have = meds
        else:
            have = {}
            for _, block in self._recent:
                have.update(block)  # the newest block of each replica wins
            have.update(meds)
            if len(have) < need:
                return None
        if have is meds and len(have) >= 3:
            return median(list(have.values()))
        others = [x for o, x in have.items() if o != q]
        if len(others) == 2 and q in meds and meds[q] > 0 and min(others) > 0:  # the nearer one
            return min(others, key=lambda x: abs(math.log(x / meds[q])))
        return median(others)

    def _pair_level(self, q: int, meds: dict[int, float]) -> float | None:
        """The level of a block :meth:`_peer_level` has none for in a job of three replicas or more: the median
        of each other replica's block median in this very block (the same host load), over its own baseline ratio
        to the level (``exp`` of the median of its history less the newest :data:`PEER_LAG`; 1 while it has
        fewer than :data:`PEER_MIN_BASELINE`: replicas are alike by design), a peer in a run over its baseline
        too (one that moved reads as ``q``'s fall, which a pair's block never judges; as the median of three, two
        replicas that agree outvote the third). None: none such, or a job of two (there the other's block
        is the level already). Bursty replicas of three or four rarely step three in 20 s: replica 0 of
        bench_corpus seed 32 serving_dp run 11 had a block median in 46 blocks of an hour and a level in 16,
        never formed its baseline and its 1.3x change was named by the young test 1,348 s after the onset; in
        seed 34 run 3 (three replicas) it had a level in 9 of 48 and its 1.3x change was lost. Such a pair's
        block is judged with ``pair`` (:meth:`_judge`): it may name a rise, never lower a baseline."""
        if len(self.units) < 3:
            return None
        lv = []
        for o, m in meds.items():
            # a peer in a run over its baseline is not left out: a pair's ratio says that two replicas differ,
            # never which one moved, and leaving it out let replica 0 turned 0.7x name both healthy peers +43 %
            # (each read a rise against 0, and its blocks with the other, "up" too, were never judged)
            if o == q or not m > 0:
                continue
            hist = list(self._hist[o])
            base_vals = hist[:-PEER_LAG] if len(hist) > PEER_LAG else []
            lv.append(m / math.exp(median(base_vals)) if len(base_vals) >= PEER_MIN_BASELINE else m)
        return median(lv) if lv else None

    def _learn_refs(self) -> None:
        """The closed block's step times wait :data:`PEER_LAG` blocks; then each work band's and replica's median of
        them, divided by the block's shared load (:meth:`_block_load`), joins :class:`PeerCurve` (a change is
        compared before any of it is learned; the host load of minutes is averaged out of it)."""
        self._pending.append(self._new)
        self._new = []
        while len(self._pending) > PEER_LAG:
            block = self._pending.popleft()
            self._curve.learn(block, self._block_load(block))

    def _block_load(self, block: list[tuple[int, tuple[int, ...], float]]) -> float:
        """The shared load of one block learned (its steps' ``(band, unit ranks, seconds)``): the median of its step
        times over their references (:meth:`PeerCurve.ref`), of the steps that have one (none: the last block's that had one; before any,
        1). Each band's block median is divided by it before it joins the band's reference, so the references
        of all bands are in one unit, whatever the host's load while each band was in use. Before, each band's
        reference was the host load of the minutes its batches ran: a replica whose batch wandered into bands
        learned under a lighter load read +12-21 % next to its peers for 30-90 s in the same block's load (one
        block of bench_corpus seed 40 serving_dp run 2: 1.07x in one band, 1.30x in another), and two healthy
        replicas were named (runs 2 and 7)."""
        ratios = []
        for key, ranks, t in block:
            ref = self._curve.ref(key, ranks)
            if ref is not None:
                ratios.append(t / ref)
        if ratios:
            load = median(ratios)
            if load > 0 and math.isfinite(load):
                self._load = load
        return self._load

    def _judge(self, q: int, r: float, first: int, peers: int, pair: bool = False,
               young: float | None = None) -> list[Anomaly]:
        """Replica ``q``'s block: its ratio ``r`` (log) to the level, ``first`` its first step in the block;
        ``pair``: the level came from :meth:`_pair_level` (one peer's block, over its baseline). Such a block
        feeds the run test's rise only: it never starts or extends a fall (a peer's change not named yet reads
        as ``q``'s fall, and a lowered baseline was named once the peer was healthy again: the class Notes), never
        the window test, and a ratio under ``-log(1 + outlier_min_effect)`` does not enter ``q``'s history.
        ``young``: the block's ratio as the young test judges it (on the values :meth:`_inside` keeps; None: ``r``)."""
        hist = self._hist[q]
        base_vals = list(hist)[:-PEER_LAG] if len(hist) > PEER_LAG else []
        if pair and r <= -math.log1p(self.settings.outlier_min_effect):
            return []
        hist.append(r)
        self._young[q].append(r if young is None else young)
        self._paired[q].append(pair)
        self._firsts[q].append(first)
        settle = self._settle[q]
        if settle is not None and len(base_vals) < PEER_MIN_BASELINE:
            self._young_named.add(tuple(self.units[q]))  # its unit found it: the young test does not name it
            self._settle[q] = None
        if len(base_vals) < PEER_MIN_BASELINE:
            return self._judge_young(q, peers)
        s = self.settings
        base = median(base_vals)
        if settle is not None:
            settle.append((r, r - base, first))
            if len(settle) >= PEER_RUN:
                self._settle[q] = None
                self._adopt(q, settle)
            return []
        mad = median([abs(x - base) for x in base_vals])
        sigma = max(MAD_TO_SIGMA * mad, s.noise_floor)
        thr = max(s.outlier_z * sigma, math.log1p(s.outlier_min_effect))
        e = r - base
        up, down = self._up[q], self._down[q]
        if e >= thr:
            up.append((r, e, first))
            down.clear()
        elif e <= -thr and not pair:
            down.append((r, e, first))
            up.clear()
        else:
            up.clear()
            down.clear()
        strong = len(up) >= PEER_STRONG_RUN and min(x[1] for x in up[-PEER_STRONG_RUN:]) >= PEER_STRONG_FACTOR * thr
        if pair:
            return self._report(q, r, up, {"baseline_ratio": round(math.exp(base), 4), "noise": round(sigma, 4),
                                           "threshold": round(math.expm1(thr), 4), "blocks": len(up),
                                           "test": "run", "pair": True}, peers) if len(up) >= PEER_RUN or strong else []
        win = self._win[q]
        win.append((e, first))
        if len(down) >= PEER_RUN:
            self._adopt(q, down)
            return []
        if len(up) < PEER_RUN and not strong:
            rho = serial_rho(np.asarray(base_vals, dtype=np.float64))
            serial = ar1_long_run_factor(rho)
            wthr = max(PEER_WINDOW_Z * sigma * serial, math.log1p(s.outlier_min_effect))
            es = [x for x, _ in win]
            if len(win) < PEER_WINDOW or min(es) <= 0 or median(es) < wthr:
                return []
            run = [(x + base, x, f) for x, f in win]  # persistent, under the per-block threshold
            return self._report(q, r, run, {"baseline_ratio": round(math.exp(base), 4), "noise": round(sigma, 4),
                                            "threshold": round(math.expm1(wthr), 4), "blocks": PEER_WINDOW,
                                            "serial_factor": round(serial, 3), "test": "window"}, peers)
        return self._report(q, r, up, {"baseline_ratio": round(math.exp(base), 4), "noise": round(sigma, 4),
                                       "threshold": round(math.expm1(thr), 4), "blocks": len(up),
                                       "test": "run"}, peers)

    def _judge_young(self, q: int, peers: int) -> list[Anomaly]:
        """Replica ``q`` before its own baseline forms: judged against its peers' level (log ratio 0; replicas of
        one job with no declared roles are alike by design, so a replica slower than its peers from its first
        judged block is named, as a rank slower from the start is). Its last :data:`PEER_RUN` ratios each at least
        ``max(thr, log(1 + PEER_YOUNG_EFFECT))``, ``thr = max(outlier_z * sigma, log(1 + outlier_min_effect))``
        (the run test's rule for a large rise, :data:`PEER_YOUNG_EFFECT`; ``detail.blocks`` 3; its last
        :data:`PEER_STRONG_RUN` each at least that and :data:`PEER_STRONG_FACTOR` times ``thr``, as the run test's
        ``detail.blocks`` 2: 991 pairs of blocks in a row of young healthy replicas of three or four never both read
        over +13 %, bench_corpus serving_dp seeds 101-104, runs 0-7 replayed without their change), or its last
        :data:`PEER_YOUNG_RUN` ratios with a median of at least ``thr`` and each at least half that
        (``detail.blocks`` 6), ``sigma = max(1.4826 * median(|x|), noise_floor)`` of the other replicas' ratios ``x`` (not a pair's, :meth:`_pair_level`)
        (at least :data:`PEER_RUN` of them; fewer: not judged. It was :data:`PEER_MIN_BASELINE`: a 3x replica of
        bursty peers, judged in three blocks by 550 s, waited for them until 1,690 s: bench_corpus seed 37
        serving_dp run 1): their spread about the peers' level that
        ``q`` is compared with, 0, not about their own median (healthy replicas whose bands' references sit apart
        read off 0 for minutes: that offset is the noise of this comparison). With the six-block rule alone, a
        bursty replica waited for six judged blocks whatever its rise: a 3x replica of bench_corpus seed 38
        serving_dp run 6 was named 179 s after its onset (159 s with the run rule). Only in a job of three replicas
        or more: in a job of two the other's ratio is the mirror of ``q``'s (``-r``), so it holds no noise of its
        own, and two healthy replicas of disjoint batch sizes read 1.15-1.25x apart for 80 s and one was named
        (bench_corpus seed 40 serving_dp run 7; its noise, taken from the mirror, 0.015). So a replica of a
        two-replica job slower from its first block is never named, and no other test here can name it soundly:
        the pair's ratio says that the replicas differ, never which one is off (a slow ``q`` and a fast peer read
        alike, ``r`` and ``-r``); each replica's own cost per unit of work is flat from its first block, so its
        history holds no change to find (the baseline and run tests judge a replica against its own history; a
        replica slower from the start has no healthier history of its own); and healthy replicas of one job differ
        by 15-25 % for minutes by traffic mix alone (above). Naming one would need a reference from outside the
        pair: a third replica (this test), or the job's previous generation (a requeue's ``previous_generation``
        reference, job-wide). A replica changed before its baseline formed (36 s
        and 57 s into bench_corpus serving_dp runs, or soon after a split) learned the change as its baseline
        and was never named. Only a replica whose steps all carry ``work``: without it, a replica that serves
        larger batches is slower than its peers by its traffic mix alone (a balancer's doing, not a bad node),
        and was named +24-26 % within 171-207 s of healthy traffic
        (tests/unit/test_serving_replica_peers.py)."""
        hist = self._hist[q]
        if (len(hist) < PEER_STRONG_RUN or tuple(self.units[q]) in self._young_named or self._bare[q]
                or len(self.units) < 3):
            return []
        pooled = [x for o, h in enumerate(self._hist) if o != q
                  for x, paired in zip(h, self._paired[o], strict=True) if not paired]
        if len(pooled) < PEER_RUN:
            return []
        s = self.settings
        sigma = max(MAD_TO_SIGMA * median([abs(x) for x in pooled]), s.noise_floor)
        thr = max(s.outlier_z * sigma, math.log1p(s.outlier_min_effect))
        last = list(self._young[q])
        beyond = list(self._beyond_blocks[q])
        big = max(thr, math.log1p(PEER_YOUNG_EFFECT)) + (math.log(PEER_CURVE_REACH) if any(beyond[-PEER_RUN:]) else 0.0)
        if min(last[-PEER_STRONG_RUN:]) >= max(big, PEER_STRONG_FACTOR * thr):  # far over it: two blocks
            last = last[-PEER_STRONG_RUN:]
        elif len(last) >= PEER_RUN and min(last[-PEER_RUN:]) >= big:  # the run test's rule, a large rise
            last = last[-PEER_RUN:]
        elif (len(last) < PEER_YOUNG_RUN or median(last) < thr or min(last) < thr / 2.0
              or any(beyond[-PEER_YOUNG_RUN:])):
            return []
        firsts = list(self._firsts[q])[-len(last):]
        run = [(x, x, f) for x, f in zip(last, firsts, strict=True)]
        self._young_named.add(tuple(self.units[q]))
        return self._report(q, last[-1], run, {"baseline_ratio": 1.0, "noise": round(sigma, 4),
                                                "threshold": round(math.expm1(thr), 4), "blocks": len(last),
                                                "test": "young"}, peers)

    def _report(self, q: int, r: float, run: list[tuple[float, float, int]], extra: dict[str, object],
                peers: int) -> list[Anomaly]:
        """Name replica ``q`` for ``run`` (its blocks' ``(ratio, excess, first step)``; ``r`` the newest ratio) and
        make the new level its baseline."""
        excess = median([x[1] for x in run])
        first_step = run[0][2]
        self._adopt(q, run)
        self._up[q].clear()
        self._down[q].clear()
        ranks = tuple(self.units[q])
        detail = {"detector": "replica_peers", "unit": list(ranks), "first_step": first_step,
                  "ratio_to_peers": round(math.exp(r), 4), **extra, "block_s": PEER_BLOCK_S, "peers": peers}
        return [Anomaly("step_regression", self.job_id, self._last[q], ranks,
                        min(MAX_PEER_RATIO, math.expm1(excess)), detail)]

    def _adopt(self, q: int, run: list[tuple[float, float, int]]) -> None:
        """Replica ``q``'s new level (the run's) is its baseline at once: its history before the run is shifted by
        the run's median excess (its spread, the noise, is kept; re-learning from the run alone left it unjudged
        for :data:`PEER_LAG` + :data:`PEER_MIN_BASELINE` blocks)."""
        lim = math.log(MAX_PEER_RATIO)
        delta = median([x[1] for x in run])
        hist = list(self._hist[q])
        n = len(run)
        self._hist[q] = deque([max(-lim, min(lim, x + delta)) for x in hist[:-n]] + hist[-n:], maxlen=PEER_HISTORY)
        run.clear()
        self._win[q].clear()
