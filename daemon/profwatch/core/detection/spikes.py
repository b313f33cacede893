"""Job-wide step-time spikes: transient episodes, and recurring ones with a period learned from the steps (pure).

A GC pause, an unflagged checkpoint, a periodic evaluation or a data loader stall makes one to a few steps of
the whole job several times slower and then is over. :class:`SpikeFilter` keeps such steps out of the
change-point statistics, groups them into episodes, tells when an episode outlasted the time a capture needs to
start (then it is a level change, not a spike), and learns which episodes recur with a fixed period in steps,
so their next occurrence can be predicted (excluded, or captured on purpose).
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from profwatch.core.detection.settings import DetectionSettings

MERGE_GAP_STEPS = 1
"""Normal steps an episode may contain and go on (a 6x checkpoint may have one ordinary step inside)."""
MAX_PATTERNS = 4
"""Periodic spike patterns kept per job (the oldest is dropped)."""
HISTORY = 64
"""Ended episodes remembered for period learning."""
SIMILAR_PEAK_RATIO = 2.0
"""Two episodes are alike when their peak step-time ratios are within this factor ..."""
MAX_MISSES = 2
"""A pattern is dropped after this many predicted occurrences in a row did not happen."""
DIVISORS = (1, 2, 3)
"""Candidate periods are the gaps to earlier alike onsets divided by these (an occurrence may be hidden)."""
MAX_LATTICE_POINTS = 64
"""Most predicted onsets a candidate period is tested on (:func:`_binomial_tail`'s n)."""
EXIT_FRACTION = 0.5
"""Hysteresis: an open episode goes on through steps over this fraction of both spike thresholds."""
MAX_EPISODE_VALUES = 256
"""Relative excesses kept per spike episode (its peak and length are counted beyond)."""


@dataclass(slots=True)
class SpikeEpisode:
    """A job-wide excursion: ``onset`` (first spike step), ``last`` elevated step, ``peak`` relative excess
    (2.0 = 3x), ``rels`` the relative excess of its elevated steps (at most :data:`MAX_EPISODE_VALUES` kept)."""

    onset: int
    last: int
    peak: float
    spike_steps: int = 1
    rels: list[float] = field(default_factory=list)
    periodic: bool = False
    """It contains a predicted occurrence of a known periodic pattern."""

    @property
    def duration(self) -> int:
        """Steps from onset to the last elevated step, inclusive."""
        return self.last - self.onset + 1

    @property
    def level(self) -> float:
        """Median relative excess of the elevated steps (the size of a level change, if it is one)."""
        r = sorted(self.rels) or [self.peak]
        return r[len(r) // 2] if len(r) % 2 else 0.5 * (r[len(r) // 2 - 1] + r[len(r) // 2])

    def add(self, step: int, rel: float, spike: bool) -> None:
        """Extend the episode by one elevated (``spike`` or not) step."""
        self.last = step
        self.peak = max(self.peak, rel)
        self.spike_steps += spike
        if len(self.rels) < MAX_EPISODE_VALUES:
            self.rels.append(rel)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready ``{"first_step", "last_step", "duration_steps", "peak"}``."""
        return {"first_step": self.onset, "last_step": self.last, "duration_steps": self.duration,
                "peak": round(self.peak, 6)}


@dataclass(slots=True)
class PeriodicPattern:
    """Episodes recurring every ``period`` steps (onsets within ``tolerance`` steps of the lattice)."""

    period: int
    tolerance: int
    last_onset: int
    duration: int
    peak: float
    occurrences: int
    misses: int = 0
    unseen: bool = False

    @property
    def next_onset(self) -> int:
        """Predicted onset of the next occurrence."""
        return self.last_onset + self.period

    def covers(self, step: int) -> bool:
        """True when ``step`` lies in the predicted window of the next occurrence, or in the last occurrence."""
        nxt = self.next_onset
        if nxt - self.tolerance <= step <= nxt + self.tolerance + self.duration - 1 + MERGE_GAP_STEPS:
            return True
        return self.last_onset <= step <= self.last_onset + self.duration - 1 + MERGE_GAP_STEPS

    def to_json(self) -> dict[str, Any]:
        """JSON-ready description (steps; ``peak`` relative)."""
        return {"period_steps": self.period, "tolerance_steps": self.tolerance, "last_onset_step": self.last_onset,
                "next_onset_step": self.next_onset, "duration_steps": self.duration, "peak": round(self.peak, 6),
                "occurrences": self.occurrences}


@dataclass(frozen=True, slots=True)
class SpikeOutcome:
    """What one step did: ``held`` = keep it out of the change-point statistics and the baseline; ``ended`` an
    episode that ended, ``ended_periodic`` whether it was a predicted occurrence of a known pattern;
    ``sustained`` an episode that outlasted the hold (a level change); ``new_pattern`` a pattern just learned."""

    held: bool
    ended: SpikeEpisode | None = None
    ended_periodic: bool = False
    sustained: SpikeEpisode | None = None
    new_pattern: PeriodicPattern | None = None


_QUIET = SpikeOutcome(False)


def _alike(a: SpikeEpisode, b: SpikeEpisode) -> bool:
    if abs(a.duration - b.duration) > max(1, min(a.duration, b.duration) // 2):
        return False
    return abs(math.log((1.0 + a.peak) / (1.0 + b.peak))) <= math.log(SIMILAR_PEAK_RATIO)


class SpikeFilter:
    """Spike episodes and periodic spike patterns of one job's step-time series.

    Args:
        settings: ``spike_min_effect``, ``spike_z``, ``periodic_detection``, ``periodic_jitter``,
            ``periodic_alpha``, ``periodic_min_period_steps``.

    Notes:
        Spike step: relative excess over the baseline ``>= spike_min_effect`` and ``>= spike_z`` noise sigmas
        (both; the first keeps a small regression on a quiet job out of this path, the second keeps noise out
        on a noisy one). An episode starts at a spike step and goes on through elevated steps (over
        :data:`EXIT_FRACTION` of both thresholds: hysteresis, so a level right at the threshold is one episode,
        not many), with at most :data:`MERGE_GAP_STEPS` ordinary steps between them; spike steps are held out,
        elevated ones still feed the change-point statistic. An episode still elevated, by a step no known
        periodic pattern explains, more than ``hold_steps`` steps after its onset is *sustained*: it was
        not over before a capture armed at its onset could start (the caller passes the capture planner's lead),
        so it is a level change. An episode that ends within the hold is transient: the caller records it as an
        event and never arms for it.

        Period learning: each ended episode is compared with the alike ones remembered (duration within a
        factor of 2 or 1 step, peak ratio within a factor of :data:`SIMILAR_PEAK_RATIO`). Candidate periods are
        the gaps to earlier alike onsets, and those gaps divided by 2 and 3 (an occurrence may have merged with
        another spike and look different), at least ``periodic_min_period_steps``. For a period ``p`` and a
        tolerance ``t`` (0 first, then ``floor(p * periodic_jitter)``) the lattice ``onset - j * p`` is walked back
        over the observed span (at most :data:`MAX_LATTICE_POINTS` points), counting points with an alike onset
        within ``t``. Under the null hypothesis that alike episodes occur at random with the observed rate
        ``r`` (alike episodes per step), a point is hit by chance with probability ``q = min(1, (2t + 1) r)``;
        leaving out the point that suggested ``p``, ``h`` hits of ``n`` points are significant when
        ``tests * P(Binomial(n, q) >= h) <= periodic_alpha`` (``tests``: every period and tolerance tried, a
        Bonferroni bound on the chance of a false pattern per episode) and at least half the points are hit.
        The shortest significant period wins. With exact step periods this
        learns a checkpoint every 200 steps at its 4th occurrence. A known pattern predicts its next onset; a
        spike step within ``t`` of it starts that occurrence (its episode gives no event, even when it merged
        with a random spike), every step of the predicted window and of the occurrence is held out, and
        :data:`MAX_MISSES` missed predictions in a row drop it (an occurrence hidden by an excluded
        step, e.g. a capture window, is not a miss). Source: CUSUM-style change detection needs outliers kept
        out of its statistic (Hawkins & Olwell 1998, "Cumulative Sum Charts and Charting for Quality
        Improvement", ch. 6 on robustified CUSUMs); the period test is a scan statistic over arithmetic
        progressions, our own, stated here so it can be checked.

        Assumptions: periodic work is periodic in steps (every N steps), or in time with a step time steady
        enough that the onset jitters by at most ``periodic_jitter`` of the period.
    """

    def __init__(self, settings: DetectionSettings) -> None:
        self.settings = settings
        self.patterns: list[PeriodicPattern] = []
        self._history: deque[SpikeEpisode] = deque(maxlen=HISTORY)
        self._open: SpikeEpisode | None = None
        self._observed_from: int | None = None
        self.counters = {"spike_steps": 0, "episodes": 0, "periodic_occurrences": 0, "patterns_learned": 0,
                         "patterns_dropped": 0}

    def reset_episode(self) -> None:
        """Drop the open episode (the caller re-learns its baseline); learned patterns are kept."""
        self._open = None

    def reset(self) -> None:
        """Forget everything (step counter restart: step numbers no longer line up)."""
        self.patterns.clear()
        self._history.clear()
        self._open = None
        self._observed_from = None

    def is_spike(self, rel: float, z: float) -> bool:
        """True when a step with relative excess ``rel`` and ``z`` noise sigmas is a spike step."""
        s = self.settings
        return rel >= s.spike_min_effect and z >= s.spike_z

    @property
    def open_episode(self) -> SpikeEpisode | None:
        """The spike episode open now (None between episodes)."""
        return self._open

    def skip(self, step: int) -> None:
        """An excluded step: an occurrence predicted in it cannot be seen, so it will not count as missed."""
        for p in self.patterns:
            if p.covers(step):
                p.unseen = True

    def observe(self, step: int, rel: float, z: float, hold_steps: int, stride: int = 1,
                extend: Callable[[SpikeEpisode], int] | None = None) -> SpikeOutcome:
        """Classify one non-excluded step (``rel`` relative excess, ``z`` in noise sigmas; ``hold_steps`` >= 1).

        ``stride``: steps per value (a block of fast steps is one value, numbered by its last step): gaps and
        the hold are counted in values, so consecutive blocks continue an episode. ``extend``: called with an
        episode that outlasted ``hold_steps``, returns the hold (values) it may last instead (a longer one for an
        excursion alike to the job's recurring interruptions: ``daemon/profwatch/core/detection/interruptions.py``)."""
        if self._observed_from is None:
            self._observed_from = step
        s = self.settings
        spike = self.is_spike(rel, z)
        elevated = spike or (rel >= EXIT_FRACTION * s.spike_min_effect and z >= EXIT_FRACTION * s.spike_z)
        ended: SpikeEpisode | None = None
        ep = self._open
        stride = max(1, stride)
        if ep is not None and step - ep.last > stride * (MERGE_GAP_STEPS + (1 if elevated else 0)):
            ended, self._open, ep = ep, None, None
        occurrence = spike and self._occurrence_begins(step)
        if spike:
            self.counters["spike_steps"] += 1
        if ep is not None and elevated:
            ep.add(step, rel, spike)
        elif ep is None and spike:
            ep = self._open = SpikeEpisode(step, step, rel, 1, [rel])
        if occurrence and ep is not None:
            ep.periodic = True
        out_pattern: PeriodicPattern | None = None
        ended_periodic = False
        if ended is not None:
            ended_periodic, out_pattern = self._on_ended(ended)
        self._expire(step)
        explained = any(p.covers(step) for p in self.patterns)
        held = spike or explained
        sustained = None
        age = (step - ep.onset) // stride + 1 if ep is not None else 0
        if (ep is not None and elevated and not explained and age > hold_steps
                and (extend is None or age > extend(ep))):
            sustained, self._open = ep, None
        if ended is None and sustained is None and out_pattern is None:
            return SpikeOutcome(held) if held else _QUIET
        return SpikeOutcome(held, ended, ended_periodic, sustained, out_pattern)

    def _occurrence_begins(self, step: int) -> bool:
        """A spike step at a pattern's predicted onset (within its tolerance) is that occurrence's onset."""
        hit = False
        for p in self.patterns:
            if abs(step - p.next_onset) <= p.tolerance:
                p.last_onset = step
                p.occurrences += 1
                p.misses = 0
                p.unseen = False
                self.counters["periodic_occurrences"] += 1
                hit = True
        return hit

    # -- periodic patterns -----------------------------------------------------------------------------------------
    def _on_ended(self, ep: SpikeEpisode) -> tuple[bool, PeriodicPattern | None]:
        self.counters["episodes"] += 1
        if ep.periodic:
            self._history.append(ep)
            return True, None
        new = self._learn(ep) if self.settings.periodic_detection else None
        self._history.append(ep)
        if new is not None:
            if len(self.patterns) >= MAX_PATTERNS:
                self.patterns.pop(0)
            self.patterns.append(new)
            self.counters["patterns_learned"] += 1
        return False, new

    def _expire(self, step: int) -> None:
        """Count predicted occurrences that did not happen; drop patterns that missed too often."""
        keep: list[PeriodicPattern] = []
        for p in self.patterns:
            while step > p.next_onset + p.tolerance + p.duration + MERGE_GAP_STEPS:
                if p.unseen:
                    p.unseen = False
                else:
                    p.misses += 1
                p.last_onset = p.next_onset
                if p.misses >= MAX_MISSES:
                    break
            if p.misses >= MAX_MISSES:
                self.counters["patterns_dropped"] += 1
            else:
                keep.append(p)
        self.patterns = keep

    def _learn(self, ep: SpikeEpisode) -> PeriodicPattern | None:
        """The shortest significant periodic lattice ending at ``ep``, or None (algorithm in the class Notes)."""
        s = self.settings
        alike = [h for h in self._history if _alike(h, ep)]
        if len(alike) < 2:
            return None
        onsets = sorted({h.onset for h in alike})
        start = self._observed_from if self._observed_from is not None else ep.onset
        if len(self._history) == self._history.maxlen:
            start = max(start, self._history[0].onset)
        rate = (len(alike) + 1) / max(1, ep.onset - start + 1)
        periods = sorted({(ep.onset - o) // d for o in onsets for d in DIVISORS
                          if (ep.onset - o) % d == 0 and (ep.onset - o) // d >= s.periodic_min_period_steps})
        tests = 2 * len(periods)  # Bonferroni: every (period, tolerance) pair tried
        for p in periods:
            for tol in sorted({0, int(p * s.periodic_jitter)}):
                points = min(MAX_LATTICE_POINTS, (ep.onset - start) // p)
                hits = self._lattice_hits(onsets, ep.onset, p, tol, points)
                # the point that suggested p is hit by construction: test the others
                if len(hits) < 2 or 2 * len(hits) < points:
                    continue
                q = min(1.0, (2 * tol + 1) * rate)
                if tests * _binomial_tail(points - 1, len(hits) - 1, q) <= s.periodic_alpha:
                    members = [h for h in alike if h.onset in hits]
                    peaks = sorted([ep.peak, *(h.peak for h in members)])
                    return PeriodicPattern(period=p, tolerance=tol, last_onset=ep.onset,
                                           duration=max([ep.duration, *(h.duration for h in members)]),
                                           peak=peaks[len(peaks) // 2], occurrences=len(hits) + 1)
        return None

    @staticmethod
    def _lattice_hits(onsets: list[int], onset: int, period: int, tol: int, points: int) -> set[int]:
        """Onsets found within ``tol`` of ``onset - j * period``, j = 1..points (the walk follows each hit)."""
        hits: set[int] = set()
        expected = onset - period
        for _ in range(points):
            i = bisect.bisect_left(onsets, expected - tol)
            if i < len(onsets) and onsets[i] <= expected + tol:
                hits.add(onsets[i])
                expected = onsets[i] - period
            else:
                expected -= period
        return hits


def _binomial_tail(n: int, k: int, q: float) -> float:
    """P(X >= k) for X ~ Binomial(n, q) (exact sum; n <= MAX_LATTICE_POINTS)."""
    if k <= 0:
        return 1.0
    if q >= 1.0:
        return 1.0
    return min(1.0, sum(math.comb(n, i) * q**i * (1.0 - q) ** (n - i) for i in range(k, n + 1)))
