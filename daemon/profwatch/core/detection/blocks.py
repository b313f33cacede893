"""Blocks of fast steps: at high step rates the step detectors judge one record per block of steps (pure).

At 5 ms per step a job makes 200 steps a second; judging each one costs the coordinator CPU for nothing and lets
host jitter (a few slow steps now and then) reach the detectors one step at a time. :class:`StepBlocks` sits
between the step aggregator and the step detectors and hands them one
:class:`~profwatch.core.detection.types.FinalizedStep` per block of about ``block_target_s`` seconds.
"""

from __future__ import annotations

import math
import warnings
from collections import Counter
from statistics import median

import numpy as np

from profwatch.core.detection.settings import DetectionSettings
from profwatch.core.detection.types import FinalizedStep
from profwatch.core.verdict.robust import MAD_TO_SIGMA

NUMPY_MIN_RANKS = 64
"""Per-rank block medians in pure Python below this many ranks (numpy's overhead dominates there)."""
LEARN_STEPS = 32
"""Non-excluded steps whose median step time sets the block size."""
MAX_PERIOD = 4
"""Longest step-time period (steps) judged as whole periods (e.g. a hook called once per micro-batch)."""
PERIOD_SEPARATION = 6.0
"""A period is used when its phase medians span at least this many of the widest phase's noise sigmas."""
MIN_PHASE_VALUES = 4
"""Values every phase of a candidate step-time period needs before the period is judged (:func:`step_period`)."""
RESIZE_FACTOR = 4.0
"""See :data:`RESIZE_STEPS`: how far (a factor) the records' step time must move for the block size to be learned again."""
RESIZE_STEPS = 8
"""The block size is learned again when the records' step time stayed this factor off the learned one over at
least this many steps (a level jump: 10 ms blocks of 5 steps would become 2.5 s records after a 50x jump)."""


def step_period(steps: list[FinalizedStep], min_amplitude: float) -> int:
    """The shortest period p in 2..:data:`MAX_PERIOD` (steps) of a series of step times, or 1 when there is none.

    ``steps``: non-excluded finalised steps; phase of a step = ``step % p``. A period is found when every phase
    holds at least :data:`MIN_PHASE_VALUES` values, the phase medians span at least ``min_amplitude`` of their
    mean (relative), and that span is at least :data:`PERIOD_SEPARATION` times the largest within-phase noise
    (1.4826 MAD): two or more clearly separate modes that take turns, as when the step hook runs once per
    micro-batch of a gradient accumulation (0.1 s, 1.0 s, 0.1 s, ...). Our own rule (a comb test on phase
    medians), stated here so it can be checked.
    """
    for p in range(2, MAX_PERIOD + 1):
        phases: list[list[float]] = [[] for _ in range(p)]
        for fs in steps:
            phases[fs.step % p].append(fs.time_s)
        if min(len(v) for v in phases) < MIN_PHASE_VALUES:
            break
        meds = [median(v) for v in phases]
        span = max(meds) - min(meds)
        mean = sum(meds) / p
        if mean <= 0 or span < min_amplitude * mean:
            continue
        noise = max(MAD_TO_SIGMA * median([abs(x - m) for x in v]) for v, m in zip(phases, meds, strict=True))
        if span >= PERIOD_SEPARATION * noise:
            return p
    return 1


class StepBlocks:
    """Groups finalised steps into blocks for the step detectors.

    Args:
        settings: ``block_target_s`` (0 = off) and ``max_block_steps``.

    Notes:
        Block size: after warm-up, the first :data:`LEARN_STEPS` non-excluded steps of a generation are held and
        their median job step time ``t`` sets ``B = clamp(round(block_target_s / t), 1, max_block_steps)`` for the
        rest of the generation (1 = every step is passed on as it comes; the usual case at 0.1 s per step and
        more). When those steps take turns between separate levels with a short period p (:func:`step_period`;
        training units only), B is rounded to a multiple of p (at least p) and a block's ``time_s`` is the median
        of its periods' mean step times: a job whose hook runs once per micro-batch is judged per period, where
        it is steady, not per step, where its times form two modes. A block of B consecutive finalised steps becomes one record: ``step`` its last step, ``time_s``
        the median job step time, ``slowest_rank`` the rank slowest most often, ``ranks_reported`` the least,
        ``stages`` per stage and rank the median (NaN where a rank never reported), ``cpu_obs`` per rank the
        latest CPU interval's sequence number (``cpu_iv`` that interval's value), ``work`` the median work, ``steps`` B (at least ``min_steps_without_work`` when none of those steps reported ``work``: a serving
        unit without work judges block medians). When the step time of the records (training units) stays
        :data:`RESIZE_FACTOR` or more off the learned one over :data:`RESIZE_STEPS` steps, the block size is set
        again for the new step time (a level jump must not leave one record per many seconds). A block with any excluded step is excluded with that step's reason (a capture window, a
        flagged step). Medians make a block insensitive to a few jittery steps, so host jitter does not reach
        the detectors, while a sustained change moves every block; the detectors' thresholds (``min_effect``,
        ``outlier_*``) keep their meaning and their step counts (``outlier_window_steps``, ``baseline_steps``,
        ``spike_event_gap_steps``) count blocks. Cost: O(world_size) per stage per block, nothing per report.
    """

    def __init__(self, settings: DetectionSettings, *, min_steps_without_work: int = 1) -> None:
        self.settings = settings
        self.min_steps_without_work = min_steps_without_work
        self.reset()

    def reset(self) -> None:
        """Forget the block size and the open block (a new generation)."""
        self.size: int | None = None if self.settings.block_target_s > 0 or self.min_steps_without_work > 1 else 1
        self.period = 1
        """Steps of the step-time period that blocks are made of (1: none; see :func:`step_period`)."""
        self._t = 0.0
        self._moved_steps = 0
        self._held: list[FinalizedStep] = []
        self._open: list[FinalizedStep] = []

    def update_settings(self, settings: DetectionSettings) -> None:
        """Swap settings; the block size is learned again when ``block_target_s`` or ``max_block_steps`` change."""
        old, self.settings = self.settings, settings
        if (old.block_target_s, old.max_block_steps) != (settings.block_target_s, settings.max_block_steps):
            pending = self._held + self._open
            self.reset()
            self._held = pending if self.size is None else []

    def push(self, fs: FinalizedStep) -> list[FinalizedStep]:
        """Take one finalised step (in step order); return the records ready for the detectors (often none)."""
        if self.size is None:
            self._held.append(fs)
            ok = [h.time_s for h in self._held if h.excluded is None]
            if len(ok) < LEARN_STEPS:
                return []
            t = median(ok)
            if self.min_steps_without_work == 1:
                p = step_period([h for h in self._held if h.excluded is None], self.settings.min_effect)
                if 1 < p <= self.settings.max_block_steps:
                    self.period, t = p, sum(ok) / len(ok)
            self._t = t
            self.size = self._ideal(t)
            if all(h.work is None for h in self._held):
                self.size = max(self.size, self.min_steps_without_work)
            held, self._held = self._held, []
            out: list[FinalizedStep] = []
            for h in held:
                out += self._add(h)
            return out
        return self._add(fs)

    def _ideal(self, t: float) -> int:
        """Block size for a step time of ``t`` seconds (a multiple of :attr:`period`)."""
        cap = self.settings.max_block_steps
        size = max(1, min(cap, round(self.settings.block_target_s / t) if t > 0 else 1))
        if self.period > 1:
            size = self.period * max(1, min(cap // self.period, round(size / self.period)))
        return size

    def _add(self, fs: FinalizedStep) -> list[FinalizedStep]:
        if self.size == 1:
            rec = fs
        else:
            self._open.append(fs)
            if len(self._open) < (self.size or 1):
                return []
            block, self._open = self._open, []
            rec = merge_block(block, self.period)
        self._follow(rec)
        return [rec]

    def _follow(self, rec: FinalizedStep) -> None:
        """Re-size after the step time moved by :data:`RESIZE_FACTOR` or more for :data:`RESIZE_STEPS` steps."""
        if self.min_steps_without_work > 1 or self.settings.block_target_s <= 0 or rec.excluded is not None:
            return
        t = rec.time_s
        moved = t >= RESIZE_FACTOR * self._t or t * RESIZE_FACTOR <= self._t
        ideal = self._ideal(t)
        if not moved or ideal == self.size:
            self._moved_steps = 0
            return
        self._moved_steps += rec.steps
        if self._moved_steps >= RESIZE_STEPS:
            self.size, self._t, self._moved_steps = ideal, t, 0


def _block_cpu(block: list[FinalizedStep]) -> tuple[tuple[int, ...] | None, tuple[float, ...] | None]:
    """A block's ``cpu_obs`` (per rank the latest CPU interval's sequence number over its steps) and ``cpu_iv`` (per
    rank the value of that interval, from a step that carries it; NaN: none); both None when its steps carry none."""
    obs = [b.cpu_obs for b in block if b.cpu_obs is not None]
    cpu_obs = tuple(max(col) for col in zip(*obs, strict=True)) if obs and len({len(o) for o in obs}) == 1 else None
    if cpu_obs is None:
        return None, None
    ivs = [math.nan] * len(cpu_obs)
    for b in block:
        if b.cpu_obs is not None and b.cpu_iv is not None and len(b.cpu_obs) == len(b.cpu_iv) == len(cpu_obs):
            for r, (o, val) in enumerate(zip(b.cpu_obs, b.cpu_iv, strict=True)):
                if o == cpu_obs[r] and not math.isnan(val):
                    ivs[r] = val
    return cpu_obs, tuple(ivs)


def merge_block(block: list[FinalizedStep], period: int = 1) -> FinalizedStep:
    """One record for consecutive finalised steps (rules in :class:`StepBlocks` Notes); with ``period`` > 1 (the
    block holds whole periods) ``time_s`` is the median over the block's periods of their mean step time."""
    last = block[-1]
    excluded = next((b.excluded for b in block if b.excluded is not None), None)
    slowest = Counter(b.slowest_rank for b in block).most_common(1)[0][0]
    works = [b.work for b in block if b.work is not None]
    stages: dict[str, list[float]] | None = None
    names = {k for b in block if b.stages for k in b.stages}
    if names and excluded is None:
        stages = {}
        width = max(len(v) for b in block if b.stages for v in b.stages.values())
        for name in names:
            rows = [v for b in block if b.stages and (v := b.stages.get(name)) is not None and len(v) == width]
            if width < NUMPY_MIN_RANKS:
                cols = [[x for x in col if not math.isnan(x)] for col in zip(*rows, strict=True)]
                stages[name] = [median(c) if c else math.nan for c in cols]
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # a rank that reported no step of the block
                stages[name] = [float(x) for x in np.nanmedian(np.asarray(rows, dtype=np.float64), axis=0)]
    if period > 1 and len(block) % period == 0:
        times = [sum(b.time_s for b in block[i:i + period]) / period for i in range(0, len(block), period)]
    else:
        times = [b.time_s for b in block]
    cpu_obs, cpu_iv = _block_cpu(block)
    return FinalizedStep(step=last.step, time_s=median(times), slowest_rank=slowest,
                         ranks_reported=min(b.ranks_reported for b in block), stages=stages, excluded=excluded,
                         work=median(works) if works else None, steps=sum(b.steps for b in block), cpu_obs=cpu_obs,
                         cpu_iv=cpu_iv)


__all__ = ["LEARN_STEPS", "StepBlocks", "merge_block", "step_period"]
