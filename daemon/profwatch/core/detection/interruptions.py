"""Recurring job-wide interruptions: an excursion that outlasted the spike hold, was reported as a level change, and
then came back; once seen, an alike one is the job's own pattern, not a new finding (pure).

A periodic evaluation or checkpoint the job does not flag makes the whole job several times slower for a few to
tens of steps, then the job runs at its old level again. When it lasts longer than the spike hold (the capture
planner's lead), the regression detector reports it as a level change (``pattern "level"``) and a capture is
armed: correct the first time (nothing said it would end), wrong every time after. :class:`RecurringInterruptions`
watches each level report for its return to the level before it, remembers the ones that returned, and gives the
spike filter a longer hold for an episode alike to them, so a recurrence that ends as they did is a transient
(``step_spike``, never armed) and one that does not end is still a level change (found, later by at most that hold).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from statistics import median
from typing import Any

from profwatch.core.detection.spikes import EXIT_FRACTION, MERGE_GAP_STEPS, SIMILAR_PEAK_RATIO

MAX_INTERRUPTION_STEPS = 60
"""Steps an excursion may always last and still be an interruption: a change lasting 60 steps *and* 5 minutes
(:data:`MAX_INTERRUPTION_S`) is a persistent one (the corpus' definition) and is never learned as the job's
pattern."""
MAX_INTERRUPTION_S = 300.0
"""Seconds (the excursion's own step times) an excursion longer than :data:`MAX_INTERRUPTION_STEPS` may last and
still be an interruption, up to :data:`MAX_TIMED_INTERRUPTION_STEPS`: a slow regime of 60-120 steps at 2-5x of a
0.1-0.3 s job (an RL rollout, 1-2 minutes) alternating with the training steps was reported as a level change
each time it came back (``bench/bench_new_shapes.py`` ``alternating``, seed 31: 10.4 false arms per healthy hour)."""
MAX_TIMED_INTERRUPTION_STEPS = 4 * MAX_INTERRUPTION_STEPS
"""The most steps an interruption lasts however fast its steps (a bounded hold: a persistent change that starts at an
alike excursion of a fast-step job is reported at most this many steps late)."""
REVERT_STEPS = 8
"""Steps after a reported excursion's last elevated step that must be back at the level before it (all but
:data:`REVERT_STRAYS` of them) for the excursion to count as an interruption that ended."""
REVERT_STRAYS = 2
"""Elevated steps (a GC pause, a loader stall) tolerated among those :data:`REVERT_STEPS`."""
MAX_OCCURRENCES = 8
"""Interruptions remembered per job (the oldest forgotten first)."""
SEEN_FACTOR = 1.5
"""An episode alike to a remembered interruption is held up to this many times the longest alike one ..."""
LATTICE_FACTOR = 2.0
"""... or this many times when its onset falls on the interval learned from two or more of them (a pattern seen
recurring: its duration may vary more before it is called a change)."""
HOLD_SLACK_STEPS = 2
"""Steps added to either hold (a one-step interruption is held 3-4 steps, not 1-2)."""
MAX_HOLD_STEPS = 1 * MAX_INTERRUPTION_STEPS
"""The longest hold an interruption gives (steps) when the excursion's step time is not known, or its
:data:`MAX_INTERRUPTION_S` are fewer steps (:func:`max_interruption_steps`): a persistent change that starts at an
alike excursion is reported at most this late. Never above the interruption's bound: a longer hold let a 100-step
2x excursion of a 3 s job (10 minutes: a persistent change) end inside it, as a ``"recurring"`` spike, never
reported, after 50-step ones had been learned."""
INTERVAL_JITTER = 0.15
"""Relative tolerance of a recurrence's onset around the learned interval (and of the intervals among themselves
for the interval to be regular); at least :data:`MIN_TOLERANCE_STEPS`."""
NEW_LEVEL_STEPS = 32
"""Steps after a reported excursion's end that its return is judged on at most: a level between the one before and
``min_effect`` over it that is not yet clear of its standard error by then is neither learned nor reported."""
NEW_LEVEL_Z = 2.0
"""Standard errors (``noise * sqrt(pi / (2 k) + 1 / BEFORE_VALUES)``: a median of k steps against a baseline) a
level after an excursion must clear ``min_effect`` by to be a new level."""
BEFORE_VALUES = 30
"""Values the level before an excursion is taken to rest on (the baseline's ``min_baseline_steps`` default)."""
TRANSIENTS_SEEN = 2
"""Alike multi-step transient excursions (spike episodes that ended within the hold, :meth:`RecurringInterruptions.transient`)
that give an alike episode a longer hold when no alike interruption is learned yet: a job whose unflagged checkpoint
ran 4 steps against a 4-step hold five times and then 5 steps once had that one reported as a level change (3 of 3
seeds, 3 % noise, gaps of 100-300 steps: a false arm)."""
MAX_REGIME_S = 1800.0
"""Seconds a persistent excursion (over :data:`MAX_INTERRUPTION_STEPS` and :data:`MAX_INTERRUPTION_S`, at most
:data:`MAX_TIMED_INTERRUPTION_STEPS`) may last and still be watched for its return: one that came back is a
*regime* the job visits (an RL rollout of 87 steps at 6 s: 9 minutes), learned as its pattern once
:data:`REGIMES_SEEN` alike ones came back."""
REGIMES_SEEN = 2
"""Alike regimes (level, :func:`alike_level`, and duration) that must have come back before one is learned: each is
a persistent change by the corpus' definition, reported while nothing said the job returns from it; a level the
job has visited and left twice is its own (a 1.2 s job alternating 5x regimes of 87 steps and 72 fast steps was
reported at every return: 8 reports, 6 arms in 27 minutes, ``bench/bench_new_shapes.py`` alternating seed 31
run 10)."""
MIN_LEFT_LEVEL = 0.5
"""The least relative excess of a level a speedup left (:meth:`RecurringInterruptions.left`) that is remembered as a
regime the job may return to: 1.5x, five times ``min_effect``, so that a job that got 10-30 % faster (a contended
host freed) holds no return of that size as its pattern (it stays a change: CUSUM)."""
MIN_TOLERANCE_STEPS = 2
"""The fewest steps a recurrence's onset may be off the learned interval."""
MAX_SKIPPED = 3
"""An onset 1..this many intervals after the last occurrence is on the interval (occurrences hidden by excluded
steps, or too short to be reported, are skipped)."""
RETURN_STEPS = 2
"""Steps after a reported excursion's last elevated step, none of them elevated and their median under
``min_effect`` over the level before it, that show it came back (:meth:`RecurringInterruptions.returned`: the
arming layer withdraws a capture of it whose window has not opened). Two: a 1.8 s job's 5-step checkpoint held
4 steps leaves 3 steps between the report and its capture's start_step, and the idle config needs one of them to
reach the ranks. A lasting change of ``spike_min_effect`` (1.3x) or more keeps its steps elevated (over
``EXIT_FRACTION`` of it); a smaller change after the excursion keeps their median over ``min_effect``."""


@dataclass(frozen=True, slots=True)
class Interruption:
    """One excursion that came back: ``onset`` (step), ``duration`` (steps, onset to last elevated step inclusive),
    ``level`` (median relative excess over the level before it; 6.0 = 7x)."""

    onset: int
    duration: int
    level: float
    before_s: float = 0.0
    """The level (s) before it, when it was watched from a report (0 for a recognised recurrence)."""

    def to_json(self) -> dict[str, Any]:
        """JSON-ready ``{"first_step", "duration_steps", "level"}``."""
        return {"first_step": self.onset, "duration_steps": self.duration, "level": round(self.level, 6)}


@dataclass(frozen=True, slots=True)
class NewLevel:
    """A reported excursion ended on another level than the one before it: from ``first_step`` on, the job runs
    ``level`` (relative excess, the median of ``steps`` steps on log step time) over ``before_s`` (s)."""

    first_step: int
    before_s: float
    level: float
    steps: int


@dataclass(frozen=True, slots=True)
class Returned:
    """A reported excursion came back to the level before it: reported from ``first_step``, its last elevated step
    ``last_step``, then ``steps`` steps none of them elevated whose median is ``level`` (relative) over
    ``before_s`` (s). The evidence of a withdrawn capture (``daemon/profwatch/core/arming/episodes.py``)."""

    first_step: int
    last_step: int
    steps: int
    level: float
    before_s: float

    def to_json(self) -> dict[str, Any]:
        """JSON-ready evidence: ``{"first_step", "last_elevated_step", "steps_back", "level_back", "before_s"}``."""
        return {"first_step": self.first_step, "last_elevated_step": self.last_step, "steps_back": self.steps,
                "level_back": round(self.level, 6), "before_s": round(self.before_s, 6)}


@dataclass(slots=True)
class _Watch:
    """A reported excursion being watched for its return: ``before_s`` the level before it (s), ``noise`` relative."""

    onset: int
    before_s: float
    noise: float
    last: int
    rels: list[float] = field(default_factory=list)
    seen_s: float = 0.0
    """Seconds since the onset (the steps before the report at the reported level, then the steps' own times)."""
    span_s: float = 0.0
    """:attr:`seen_s` at the excursion's last elevated step: how long it lasted (s)."""
    prev: int = 0
    """The last step observed (a value may stand for several steps: a block's per-step time times its steps)."""
    regime: bool = False
    """It outlasted an interruption's bounds (:func:`persistent`) within :data:`MAX_REGIME_S`: a regime if it
    comes back."""
    back: int = 0
    strays: int = 0
    after: list[float] = field(default_factory=list)
    """Log ratios to ``before_s`` of the steps since the excursion's last step (the level it ended on)."""
    after_start: int | None = None
    vouched: bool = False
    """:meth:`RecurringInterruptions.returned` said it came back (a capture of it may have been withdrawn)."""
    stray_rels: list[float] = field(default_factory=list)
    """Relative excesses of the elevated steps after it came back (strays), oldest first."""
    stray_start: int | None = None


def persistent(steps: int, seconds: float) -> bool:
    """Whether an excursion of ``steps`` steps lasting ``seconds`` s is a persistent change, never an interruption:
    over :data:`MAX_INTERRUPTION_STEPS` and over :data:`MAX_INTERRUPTION_S` (or :data:`MAX_TIMED_INTERRUPTION_STEPS`)."""
    return steps > MAX_INTERRUPTION_STEPS and (not seconds <= MAX_INTERRUPTION_S or steps > MAX_TIMED_INTERRUPTION_STEPS)


def max_interruption_steps(step_s: float, seconds: float = MAX_INTERRUPTION_S) -> int:
    """The most steps an interruption whose steps take ``step_s`` seconds each may last: :data:`MAX_INTERRUPTION_STEPS`,
    or as many as :data:`MAX_INTERRUPTION_S` hold at that step time when more, at most
    :data:`MAX_TIMED_INTERRUPTION_STEPS` (``step_s`` not > 0 or not finite: :data:`MAX_INTERRUPTION_STEPS`);
    ``seconds`` another time bound (:data:`MAX_REGIME_S` for a learned regime). Our own
    bound, from the corpus' definition of a persistent change (60 steps and 5 minutes)."""
    if not (step_s > 0.0 and math.isfinite(step_s)):
        return MAX_INTERRUPTION_STEPS
    return max(MAX_INTERRUPTION_STEPS, min(MAX_TIMED_INTERRUPTION_STEPS, int(seconds / step_s)))


def alike_level(a: float, b: float) -> bool:
    """Whether two relative excesses are the same kind of excursion: ``1 + a`` and ``1 + b`` within a factor of
    :data:`~profwatch.core.detection.spikes.SIMILAR_PEAK_RATIO` (2)."""
    return abs(math.log((1.0 + max(a, -0.99)) / (1.0 + max(b, -0.99)))) <= math.log(SIMILAR_PEAK_RATIO)


def _overlap(a: Interruption, b: Interruption) -> bool:
    return a.onset < b.onset + b.duration and b.onset < a.onset + a.duration


def _alike_duration(a: int, b: int) -> bool:
    return max(a, b) <= 2 * min(a, b) + HOLD_SLACK_STEPS


class RecurringInterruptions:
    """The interruptions of one job's step-time series (steps, relative excesses; no clock).

    Notes:
        Watch: after a level report (:meth:`reported`: its first step, the level before it, the relative noise),
        each measured step (:meth:`observe`) is elevated when it is over the level before by
        :data:`~profwatch.core.detection.spikes.EXIT_FRACTION` of ``spike_min_effect`` and of ``spike_z`` noise
        sigmas (the spike filter's hysteresis). The excursion goes on through elevated steps (at most
        :data:`~profwatch.core.detection.spikes.MERGE_GAP_STEPS` ordinary steps between them); it ended when the
        :data:`REVERT_STEPS` steps after its last one are below it (:data:`REVERT_STRAYS` strays allowed; a
        step counts as the excursion's only when it is also nearer its level than the level before, on log step
        time). The median of the steps since then (log ratios to the level before) decides: under
        ``min_effect``, it came back and is remembered as an :class:`Interruption` when it lasted at most
        :data:`MAX_INTERRUPTION_STEPS`; ``min_effect`` or more by :data:`NEW_LEVEL_Z` standard errors, it ended
        on a new level (:class:`NewLevel`: a change that started during or right after it, which the baseline
        re-learned after the report would otherwise take for the job's level); in between, it waits up to
        :data:`NEW_LEVEL_STEPS` steps. One that lasts longer, or does not come back, is a change (reported
        already) and is forgotten.

        Hold (:meth:`hold`): an open spike episode whose level (median relative excess so far) is alike
        (:func:`alike_level`) to remembered interruptions may last ``SEEN_FACTOR`` (1.5) times the longest alike
        one plus :data:`HOLD_SLACK_STEPS`, ``LATTICE_FACTOR`` (2) times when its onset is on their interval, and
        at most :data:`MAX_HOLD_STEPS`. Interval: with two or more alike interruptions whose consecutive onset gaps
        agree within :data:`INTERVAL_JITTER` of their median ``p``, an onset ``k * p`` (k = 1..:data:`MAX_SKIPPED`)
        after the last one, within ``max(MIN_TOLERANCE_STEPS, INTERVAL_JITTER * p)`` steps, is on it.
        A recurrence that ends within its hold is recorded too (:meth:`recognised`), so the pattern follows the
        job; durations stay bounded by :data:`MAX_INTERRUPTION_STEPS`.

        What it never does: hold a step that is not a spike step (the change-point test still sees the elevated
        ones), or hold anything longer than :data:`MAX_HOLD_STEPS`: a persistent change that starts during or
        right after an interruption is reported when the episode outlasts the hold. Our own rule, stated here so
        it can be checked; the analogue of the arming layer's rotation, which is recognised from what episodes
        named across episodes (``daemon/profwatch/core/arming/episodes.py``).
    """

    def __init__(self) -> None:
        self.seen: deque[Interruption] = deque(maxlen=MAX_OCCURRENCES)
        self.regimes: deque[Interruption] = deque(maxlen=MAX_OCCURRENCES)
        """Persistent excursions that came back (:data:`MAX_REGIME_S`), newest last; learned into :attr:`seen`
        from the :data:`REGIMES_SEEN`-th alike one."""
        self.transients: deque[Interruption] = deque(maxlen=MAX_OCCURRENCES)
        """Multi-step spike episodes that ended within their hold (:meth:`transient`), newest last."""
        self._watch: _Watch | None = None
        self._returned: Returned | None = None
        """The last watched excursion that came back (kept after the watch ends: :meth:`returned`)."""
        self.counters = {"interruptions_learned": 0, "interruptions_recognised": 0, "interruptions_not_ended": 0,
                         "new_levels": 0, "regimes_returned": 0, "levels_left": 0}

    def reset(self) -> None:
        """Forget everything (step counter restart: step numbers no longer line up)."""
        self.seen.clear()
        self.regimes.clear()
        self.transients.clear()
        self._watch = None
        self._returned = None

    def reported(self, onset: int, step: int, level: float, before_s: float, noise: float) -> None:
        """A level change of relative excess ``level`` was reported at ``step`` from step ``onset`` over a level of
        ``before_s`` (s) at relative noise ``noise``: watch whether it comes back. Ignored for a level or noise not
        > 0 and finite, or a ``step`` before ``onset``."""
        if (before_s > 0.0 and math.isfinite(before_s) and noise > 0.0 and math.isfinite(noise)
                and math.isfinite(level) and step >= onset):
            # the steps up to the report were not watched: taken at the reported level
            seen_s = (step - onset + 1) * before_s * (1.0 + max(level, 0.0))
            self._watch = _Watch(onset, before_s, noise, step, [level], seen_s=seen_s, span_s=seen_s, prev=step)
            self._returned = None

    def observe(self, step: int, x: float, spike_min_effect: float, spike_z: float,
                min_effect: float) -> Interruption | NewLevel | None:
        """One measured step time ``x`` (s, > 0) at ``step``. Returns the interruption this step showed to have
        ended back at the level before it (and remembers it), the new level it ended on (``min_effect`` or more
        over the level before, by :data:`NEW_LEVEL_Z` standard errors), or None (still watching, or nothing)."""
        w = self._watch
        if w is None or not x > 0.0:
            return None
        lr = math.log(x / w.before_s)
        rel = math.expm1(lr)
        w.seen_s += x * max(1, step - w.prev)
        w.prev = step
        at = (rel >= EXIT_FRACTION * spike_min_effect and rel / w.noise >= EXIT_FRACTION * spike_z
              and lr >= 0.5 * math.log1p(max(w.rels[0], 0.0)))  # nearer the excursion's level than the one before
        if at and w.back <= MERGE_GAP_STEPS:
            w.last, w.back, w.strays, w.after_start = step, 0, 0, None
            w.span_s = w.seen_s
            w.rels.append(rel)
            w.after.clear()
        elif at:
            w.strays += 1
            w.back += 1
            w.stray_rels.append(rel)
            w.stray_start = step if w.stray_start is None else w.stray_start
        else:
            w.back += 1
            w.after_start = step if w.after_start is None else w.after_start
            w.after.append(lr)
        duration = w.last - w.onset + 1
        w.regime = w.regime or persistent(duration, w.span_s)
        if (w.regime and (duration > MAX_TIMED_INTERRUPTION_STEPS or not w.span_s <= MAX_REGIME_S)) \
                or w.strays > REVERT_STRAYS:
            self._drop()
            if w.vouched and w.strays > REVERT_STRAYS and w.stray_start is not None:
                # it was said to have come back (its capture may be withdrawn) and went on: a change, reported
                # again so that it is captured (a lasting 2x change that dipped for 2 steps was never captured)
                rels = sorted(w.stray_rels)
                self.counters["new_levels"] += 1
                return NewLevel(w.stray_start, w.before_s, rels[len(rels) // 2], len(rels))
            return None
        if w.back < REVERT_STEPS or not w.after:
            return None
        k = len(w.after)
        med = median(w.after)
        if math.expm1(med) < min_effect:  # back at the level before it: an interruption
            self._returned = self._back(w, min_effect)
            self._watch = None
            rels = sorted(w.rels)
            ended = Interruption(w.onset, duration, rels[len(rels) // 2], w.before_s)
            if w.regime:  # learned once the job has come back from REGIMES_SEEN alike ones
                # the same visit, remembered already when the baseline re-learned on it and its end was a speedup
                kept = [o for o in self.regimes if not _overlap(o, ended)]
                self.regimes.clear()
                self.regimes.extend(kept)
                self.regimes.append(ended)
                alike = [o for o in self.regimes if alike_level(o.level, ended.level)
                         and _alike_duration(o.duration, ended.duration)]
                self.counters["regimes_returned"] += 1
                if len(alike) < REGIMES_SEEN:
                    return ended
            kept = [o for o in self.seen if not _overlap(o, ended)]  # the same visit once (as for regimes)
            self.seen.clear()
            self.seen.extend(kept)
            self.seen.append(ended)
            self.counters["interruptions_learned"] += 1
            return ended
        se = w.noise * math.sqrt(math.pi / (2.0 * k) + 1.0 / BEFORE_VALUES)
        if math.expm1(med - NEW_LEVEL_Z * se) >= min_effect and w.after_start is not None:
            self._watch = None
            self.counters["new_levels"] += 1
            return NewLevel(w.after_start, w.before_s, math.expm1(med), k)
        if w.back >= NEW_LEVEL_STEPS:
            self._drop()
        return None

    def returned(self, first_step: int, min_effect: float) -> Returned | None:
        """Whether the excursion reported from ``first_step`` came back to the level before it: at least
        :data:`RETURN_STEPS` steps since its last elevated step, none of them elevated (no stray), with a median
        under ``min_effect`` over that level (log step time). None while it goes on, when it ended on another
        level, or for an excursion not watched (not a spike-held ``pattern "level"`` report of this series).
        An excursion said to have come back while still watched that then goes on (more than
        :data:`REVERT_STRAYS` elevated steps after it) is reported again by :meth:`observe` as a :class:`NewLevel`
        from its first such step: the capture withdrawn on this answer must not lose a change that lasts."""
        w = self._watch
        if w is not None and w.onset == first_step:
            back = self._back(w, min_effect)
            w.vouched = w.vouched or back is not None
            return back
        r = self._returned
        return r if r is not None and r.first_step == first_step else None

    @staticmethod
    def _back(w: _Watch, min_effect: float) -> Returned | None:
        k = len(w.after)
        if w.strays or k < RETURN_STEPS or w.back != k:
            return None
        med = median(w.after)
        if not math.expm1(med) < min_effect:
            return None
        return Returned(w.onset, w.last, k, math.expm1(med), w.before_s)

    def _drop(self) -> None:
        """The watched excursion did not come back within the bounds: a change (already reported), forgotten."""
        self._watch = None
        self.counters["interruptions_not_ended"] += 1

    def left(self, onset: int, duration: int, level: float, step_s: float) -> Interruption | None:
        """The job ran ``duration`` steps from ``onset`` at a level ``level`` (relative) over the one it now runs at
        (a speedup), at ``step_s`` s per step: a level it visited and left, remembered as an excursion that came
        back (an interruption within :func:`persistent`'s bounds, else a regime, :data:`REGIMES_SEEN`) when it
        lasted at most :data:`MAX_TIMED_INTERRUPTION_STEPS` steps, its level is at least :data:`MIN_LEFT_LEVEL`
        and no remembered one overlaps it (a reported excursion watched to its return is not counted twice). Returns
        it, or None. A job whose slow regime (an RL rollout) came first took the first fast one for a speedup, and
        the slow one's first return was reported (``bench_new_shapes`` alternating seed 31: every job starts
        slow, one arm each)."""
        if not (1 <= duration <= MAX_TIMED_INTERRUPTION_STEPS and math.isfinite(level) and math.isfinite(step_s)
                and level >= MIN_LEFT_LEVEL and step_s > 0.0):
            return None
        occ = Interruption(onset, duration, level)
        if any(_overlap(o, occ) for o in (*self.seen, *self.regimes)):
            return None  # the same visit, watched from its report and remembered when it came back
        if persistent(duration, duration * step_s):
            if duration * step_s > MAX_REGIME_S:
                return None
            self.regimes.append(occ)
            self.counters["regimes_returned"] += 1
            return occ
        self.seen.append(occ)
        self.counters["levels_left"] += 1
        return occ

    def recognised(self, onset: int, duration: int, level: float) -> Interruption:
        """A spike episode held by :meth:`hold` ended within it: remember it as one more occurrence."""
        occ = Interruption(onset, max(1, min(duration, MAX_TIMED_INTERRUPTION_STEPS)), level)
        self.seen.append(occ)
        self.counters["interruptions_recognised"] += 1
        return occ

    def transient(self, onset: int, duration: int, level: float) -> None:
        """A spike episode from ``onset`` that lasted ``duration`` steps at relative excess ``level`` ended within
        its hold: remembered when it lasted 2 steps or more (a one-step pause says nothing about a length), at most
        :data:`MAX_OCCURRENCES`, each at most :data:`MAX_INTERRUPTION_STEPS` long."""
        if duration >= 2 and math.isfinite(level):
            self.transients.append(Interruption(onset, min(duration, MAX_INTERRUPTION_STEPS), level))

    def alike(self, level: float) -> list[Interruption]:
        """The remembered interruptions alike in level to ``level``, oldest first."""
        return [o for o in self.seen if alike_level(o.level, level)]

    def interval(self, level: float) -> int | None:
        """The regular interval (steps) of the interruptions alike to ``level``, or None (fewer than two, or gaps
        that disagree by more than :data:`INTERVAL_JITTER` of their median)."""
        alike = self.alike(level)
        if len(alike) < 2:
            return None
        ref = alike[-1]
        onsets = sorted({o.onset for o in alike if _alike_duration(o.duration, ref.duration)})
        gaps = sorted(b - a for a, b in zip(onsets, onsets[1:], strict=False) if b > a)
        if not gaps:
            return None
        p = gaps[len(gaps) // 2]
        if p < 1:
            return None
        # a gap that is a multiple of p (an occurrence skipped) agrees too
        for g in gaps:
            k = max(1, round(g / p))
            if abs(g - k * p) > max(MIN_TOLERANCE_STEPS, INTERVAL_JITTER * p):
                return None
        return p

    def on_interval(self, onset: int, level: float) -> bool:
        """Whether ``onset`` falls on the learned interval of the interruptions alike to ``level``."""
        p = self.interval(level)
        if p is None:
            return False
        last = max(o.onset for o in self.alike(level))
        tol = max(MIN_TOLERANCE_STEPS, INTERVAL_JITTER * p)
        return any(abs(onset - last - k * p) <= tol for k in range(1, MAX_SKIPPED + 1))

    def hold(self, onset: int, level: float, base_hold: int, stride: int = 1, step_s: float = 0.0) -> int:
        """The hold (values of ``stride`` steps) for an open spike episode from ``onset`` at median relative excess
        ``level`` whose steps take ``step_s`` s each (0: not known): ``base_hold`` unless it is alike to remembered
        interruptions (class Notes); never below ``base_hold``, never above :data:`MAX_HOLD_STEPS` steps, or
        :func:`max_interruption_steps` at ``step_s`` when more (an interruption of that length at that step time
        is not yet a persistent change)."""
        cap = max(MAX_HOLD_STEPS, max_interruption_steps(step_s))
        alike = self.alike(level)
        if any(o.duration > cap for o in alike):  # a regime learned (REGIMES_SEEN): as long as MAX_REGIME_S allows
            cap = max(cap, max_interruption_steps(step_s, MAX_REGIME_S))
        if not alike:
            # no interruption learned: the job's own transients of that kind, when they recurred
            near = [o for o in self.transients if alike_level(o.level, level)]
            if len(near) < TRANSIENTS_SEEN:
                return base_hold
            steps = min(cap, math.ceil(SEEN_FACTOR * max(o.duration for o in near)) + HOLD_SLACK_STEPS)
            return max(base_hold, -(-steps // max(1, stride)))
        longest = max(o.duration for o in alike)
        factor = LATTICE_FACTOR if self.on_interval(onset, level) else SEEN_FACTOR
        steps = min(cap, math.ceil(factor * longest) + HOLD_SLACK_STEPS)
        return max(base_hold, -(-steps // max(1, stride)))

    def describe(self, level: float) -> dict[str, Any]:
        """JSON-ready evidence for a recognised recurrence: the alike interruptions seen (count, longest, the
        newest) and the interval when one is learned (steps)."""
        alike = self.alike(level)
        near = [o for o in self.transients if alike_level(o.level, level)]
        return {"seen": len(alike), "longest_steps": max((o.duration for o in alike), default=0),
                "interval_steps": self.interval(level),
                "last": alike[-1].to_json() if alike else None,
                "transients_seen": len(near), "longest_transient_steps": max((o.duration for o in near), default=0)}
