"""Job step-time regression: a two-sided CUSUM change-point detector on the robust-standardised job step time,
with spikes held out (pure; implements the ``StepDetector`` Protocol of ``daemon/profwatch/core/detection/types.py``).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from profwatch.core.detection.baseline import RobustBaseline, theil_sen
from profwatch.core.detection.drift import (
    DriftTracker,
    ramp_evidence,
    rise_on_fall,
    trend_z,
    warm_up_split_null,
    warm_up_sse,
    warm_up_step,
)
from profwatch.core.detection.interruptions import NewLevel, RecurringInterruptions
from profwatch.core.detection.settings import DetectionSettings
from profwatch.core.detection.spikes import EXIT_FRACTION, MERGE_GAP_STEPS, SpikeEpisode, SpikeFilter
from profwatch.core.detection.types import Anomaly, FinalizedStep
from profwatch.core.verdict.robust import MAD_TO_SIGMA

EFFECT_Z = 2.0
"""A fire needs the run's mean excess to be within this many standard errors of ``min_effect`` or above it."""
SMALL_SAMPLE_C = 1.0
"""The noise estimate is inflated by ``1 + SMALL_SAMPLE_C * sqrt(1.1 / (2 n))`` (one standard error of the
biweight scale over n steps), so a short baseline does not make the detector trigger-happy."""
PROVISIONAL_MIN = 5
"""While learning, steps are screened for spikes once the baseline holds this many values."""
DEFAULT_HOLD_STEPS = 8
"""Steps a spike may last and stay transient when neither ``spike_hold_steps`` nor the capture planner's lead is given."""
LARGE_JUMP = 10.0
"""A step this many times the baseline or more is held for the capture lead at its own step time, with no floor (see
:meth:`StepTimeRegressionDetector._spike_hold`)."""
HOLD_FLOOR_STEPS = 16
"""A rise under :data:`LARGE_JUMP` is held for the capture lead at its own step time, but never for fewer steps than
this (nor than the lead at the baseline's step time, when that is shorter): an unflagged checkpoint of a few steps
at 3-8x in a 0.1 s job (a lead of 32 steps at the baseline, 6 at its own step time) stays a transient. See
:meth:`StepTimeRegressionDetector._spike_hold`."""
MAX_SLOWEST_RANKS = 16
"""Slowest ranks remembered per run (named in a step_regression's detail)."""


TREND_EXPLAINS = 0.75
"""A rise of the baseline is a drift when its trend explains at least this fraction of it."""
RAMP_WINDOW = 128
"""Newest accepted values (since the last re-learn) a fire is checked against for a ramp."""
RAMP_EVIDENCE = 12.0
"""A fire is the onset of a drift when a ramp explains the newest values better than a step by this much
(residual sums of squares in noise variances: a log-likelihood ratio of 6, Gaussian noise)."""
RAMP_DEFER = 0.0
"""A fire waits for more steps while a ramp explains the newest values better than a step by more than this (and
less than :data:`RAMP_EVIDENCE`): neither is clear yet."""
RAMP_MAX_DEFER = 32
"""Steps a fire waits at most for a ramp or a step to become clear (then it fires)."""
MIN_STEP_S = 1e-6
"""A job step time under this (0 s, sub-microsecond, or not a number) is no measurement (a warm-up the hook did not
time, a clock that did not move): it never enters the baseline nor is judged; the baseline keeps learning until
it holds real steps. Zeros once formed a baseline of 1e-9 s and a ``step_regression`` of +3e10 % at the first
real step (counted in ``counters["unmeasured"]``)."""
MIN_NOISE = 0.002
"""The relative noise never goes below this (0.2 % of the level), whatever ``noise_floor`` says: a perfectly
steady series must not make every 0.1 % jitter a many-sigma event (``noise_floor`` is bounded below by it too)."""
RECENT_FLOOR_VALUES = 16
"""A falling trend never extrapolates the level below the lower quartile of this many newest accepted values: a trend fitted to a warm-up that only got faster cannot carry the level to zero, and one noisy low step cannot set it (the smallest value did: a 0.1 s step at a 0.5 s level made a 15x step read as 105x)."""
RECENT_LEVEL_VALUES = 32
"""Newest accepted values whose median must itself show a rise before a ``drift`` or a ``pattern "baseline"``
regression is reported (:meth:`StepTimeRegressionDetector._recent_above`): the data, not only the baseline's line."""
INTERIM_SE = 1.0
"""After a speedup, the level its own run showed is raised by this many standard errors to make the interim
reference a slowdown is judged against while the baseline re-learns (see ``_interim_cusum``)."""
SPEEDUP_NOISE_Z = 1.645
"""After a speedup, the relative noise of the re-learned baseline is raised towards the noise of the baseline before
the speedup, as far as this one-sided upper confidence bound (a chi-square one, on its own values) allows
(:meth:`StepTimeRegressionDetector._noise`)."""
SPEEDUP_CONFIRM_Z = 2.0
"""A speedup is *confirmed* when the steps after its fire and before a later rise's run (none of them chose the
speedup's run) sit below the level before the speedup by this many standard errors (``noise / sqrt(n)``); a slowdown
after an unconfirmed speedup is judged against the level before it (see ``_speedup_reference``)."""
MARGINAL_CONFIRM_Z = 2.0
"""A CUSUM fire whose run's mean is under ``min_effect`` (let through by the :data:`EFFECT_Z` leniency) waits until
the steps after the run first crossed the threshold (steps that did not select the run) are over the baseline by
this many standard errors of their own mean (see ``_cusum``)."""
CONFIRM_DELTA = 1.5
"""At noise over ``min_effect / CONFIRM_DELTA`` (6.7 % for 10 %), a CUSUM run whose mean clears ``min_effect`` by
fewer than :data:`EFFECT_Z` standard errors of the run's mean against the baseline's (``_high_noise_margin``) waits
for confirmation as a marginal one does (:data:`MARGINAL_CONFIRM_Z`). There the design's shift is under 1.5 sigmas,
the run long (15-25 steps) and the baseline's own error a sizeable part of the run's: ``bench/bench_corpus.py`` seed
32 fired plain CUSUM runs at +10.4 % (``interrupts`` run 11, 13.9 % noise, 21 steps) and +10.5 % (``moe`` run 15,
9.2 % noise, 16 steps) on healthy jobs. At 5 % noise (a shift of 2 sigmas) nothing changes, so a real +10 % keeps
its Lorden delay (asking every run within 2 standard errors to confirm took it from 6 to 9 steps). Simulated, 40
series a size at 6-20 % noise: +30 % found 40 of 40 with the median delay 9.5 steps either way; +2 sigmas 40 of 40,
median 9 -> 10 steps, p90 15 -> 17."""
REPORTED_SE = 2.0
"""After a ``step_regression``, the level the report measured is raised by this many standard errors
(``noise / sqrt(steps)``) to make the interim reference a further rise is judged against while the baseline
re-learns (see ``_interim_cusum``). A report's level rests on as few as 2-4 steps: at 1 standard error, +35 % at 8 %
noise measured from 4 steps as +21 % was reported again as +8.5 % 20 steps later (1 of 160 single changes of
10-60 % at 3-8 % noise); at 2, none, and a further +30 % is still found in the steady job's delay."""
REPORT_FOLLOW_STEPS = 4
"""Steps after a ``step_regression`` whose CUSUM run still rose at the fire (:meth:`StepTimeRegressionDetector._rising`
on the run's own values) during which the interim reference follows the steps (their geometric mean, raised by
:data:`REPORTED_SE` standard errors, never lowered): a change that sets in over a few steps (a load that builds up)
fired on its first 2-4 steps and measured a level it had not reached, and the rest of its rise was reported again
against that level (a +66 % change that ramps in over 5 steps, 5 % heavy-tailed noise: a second report in 8 of 20
seeds). A run that was flat at the fire (a sudden change) keeps the level it measured: a further change soon after is
still its own report."""
_NOT_EXCURSIONS = ("provisional", "learned_steps", "warm_up_line", "previous_generation", "warm_up_steps",
                   "warm_up_fall")
"""``detail.reference`` of the level reports that rest on no spike steps held out: never watched for their return
(:class:`~profwatch.core.detection.interruptions.RecurringInterruptions`). A +12-15 % change during the first
learning, reported from the learned steps, was reported again 12-20 steps later as a new level over the one before
it (10 of 72 series of 3 % noise; 0 before the watch)."""
FOLLOW_MAX_RATIO = 1.5
"""The most the interim reference may follow the steps after a report (:data:`REPORT_FOLLOW_STEPS`): this many times
the level the report measured. Without it a 2x or 3x slowdown starting on the step after a +20 % CUSUM report (3 %
noise) was taken for the first change's rest and never reported (0 of 8 seeds; 8 of 8 before the follow, and now).
A change's rest after a report still fits under it: +66 % and 2x changes ramped in over 5 steps (heavy-tailed
noise) were reported twice in 3 of 80 series at 1.5 as without a bound (6 at 1.25, 14 at 1.1). A further change
of less than ~1.8x starting within a step or two of a report is still taken for the first one's rest (it cannot be
told from a ramp)."""
WARMUP_EVIDENCE = 0.0
"""At the end of a generation's first learning, a rise from the first learned steps that then stays flat is a
warm-up when it explains them at least this much better than a step (noise variances; see
:meth:`StepTimeRegressionDetector._settled`). Simulated (46 learned steps, 5-20 % noise): 0 takes 79 % of linear
warm-ups visible in them and 1 % of sudden changes of 1.1-1.4x with their onset there (12 takes 50 % and 0 %)."""
OFF_LINE_STEPS = 8
"""Steps after a warm-up's rise whose median is compared with the warm-up's extrapolated line
(:meth:`StepTimeRegressionDetector._off_line`): the first few, before a line extrapolated further drifts off."""
WARM_UP_JUMP_MIN = 4
"""Later steps a split of a warm-up's learned steps needs (:meth:`StepTimeRegressionDetector._line_jump`): fewer are
not yet a level."""
WARM_UP_JUMP_Z = 4.0
"""Standard errors a jump off a warm-up's line must clear 0 by (:meth:`StepTimeRegressionDetector._line_jump`):
one-sided 3e-5 per split, the splits of some 46 learned steps being tried and the noise read from them. At 3 a
0.64 -> 1.0 warm-up at 16 % noise (its noise read 12.7 %) jumped +27 % off the line of its first 26 steps
(``bench/bench_corpus.py`` seed 31, ``warmup_up`` run 7: a false arm)."""
SETTLE_Z = 1.645
"""At the end of a generation's first learning, the learned steps still rise (a warm-up not over: caches and
allocators filling, a job that starts fast and settles slower) when their Mann-Kendall trend statistic
(:func:`~profwatch.core.detection.drift.trend_z`) is at least this many standard deviations and no sudden change
explains the rise (:meth:`StepTimeRegressionDetector._split`); learning then waits for a stable level (see
:meth:`StepTimeRegressionDetector._settled`). One-sided 1 %: a flat start waits one learning window in 100."""
SETTLE_MAX_STEPS = 150
"""Steps from a generation's first measured step during which a rise of the first learned steps found by the rank
test (:data:`SETTLE_Z`) or continuing their line (:meth:`StepTimeRegressionDetector._warming`) is taken for a
warm-up: start-up warm-ups last tens of steps (the corpus draws 5-60); a rise that starts later, or goes on, is a drift or
a change. Without it a drift from step 202 of 6.5 ms steps (8 steps per value) kept the first learning waiting for
some 500 steps and a 1.3x change during it was found 380 steps late instead of 28 (``bench/bench_corpus.py`` seed
31, ``drift`` run 1). A split of the first learned steps is judged young at its own step (:meth:`_split`), not
at the end of the learning: a 13 ms job's first learning of 49 blocks of 4 steps spans 180 steps, and a warm-up
rising 0.6 -> 1.0x over its first 25 steps at 14.5 % noise, never tried against the warm-up curve there, was
reported +46 % (``bench/bench_corpus.py --healthy-hours``, seed 101 ``warmup_up`` healthy run 4: a false arm)."""
EARLIER_RISE_Z = 2.33
"""A split of the first learned steps (:meth:`StepTimeRegressionDetector._split`) is no sudden change when its earlier
part rises by the Mann-Kendall statistic at least this much (one-sided 1 %): a warm-up still rising, whose best split
the least-squares slope test (:meth:`StepTimeRegressionDetector._rising`) does not tell from a step over 8-20 steps.
Stricter than :data:`SETTLE_Z`: here a chance rise of a flat earlier part loses a real change (5 % lost 2 of 30
changes of 1.2x at step 20, 5 % noise)."""
LEARNED_STEP_EVIDENCE = 25.0
"""A split of a generation's first learned steps into two levels is a change when it explains them better than one
level by this many noise variances (a log-likelihood ratio of 12.5, Gaussian noise: about 2 ln(1e5), the
``false_alarm_steps`` default, so a flat series' best split of some 50 steps passes it far less than once per
1e5 steps; see :meth:`StepTimeRegressionDetector._learned_step`)."""
WARM_UP_SHAPE_EVIDENCE = 1.0
"""A split of a generation's first learned steps (within :data:`SETTLE_MAX_STEPS` of its start) is a change only when
it explains them better than the best warm-up curve (a straight rise from the first learned step, flat from its knee
on, or one straight line: :func:`~profwatch.core.detection.drift.warm_up_sse`) by this many noise variances
(:meth:`StepTimeRegressionDetector._warm_up_curve`). ``bench/bench_corpus.py`` seed 32, ``warmup_up`` run 8 (0.74
-> 1.0 over 51 steps, 9 % noise) was split at step 31 and reported as +16 %: the split beat one line by 0.4.
Simulated (200 series a kind, 1-20 % noise, no steps dropped): warm-ups (linear 5-60 steps from 0.3-0.9x, saturating,
3-10-step short ones) reported 56 times without the test, 29 with it; changes of 1.1-1.5x found: onset 12-60 136 of
142 either way, during a warm-up 104 -> 102 of 131, onset 5-19 129 -> 126 of 142 (0: 28 false, 1 + 2 lost; 2: 21
false, 3 + 6 lost). A step and a warm-up that saturates cannot be told apart at high noise: the rest of the
ambiguity."""
WARM_UP_NULL_REPS = 100
"""Series simulated from the best warm-up curve of a generation's first learned steps to learn how much better a
two-level split explains such a curve by chance (:meth:`StepTimeRegressionDetector._warm_up_curve`)."""
WARM_UP_NULL_QUANTILE = 0.90
"""The quantile of that chance gain a split must exceed to be a change, not the warm-up (one-sided 10 %). At 0.95
a 1.3x change from the 12th learned step at 9.4 % noise (tests/unit/test_regression.py; gain 4.5 noise variances,
the curve's 95th percentile 5.4) was learned as normal; at 0.99 so were 1.3-1.4x changes 16 steps into the learning
at 14-19 % noise (gains 4-10). Simulated (tests/unit/test_warm_up_noise.py): rising warm-ups at 10-20 % noise, 2 x
160 series, ``learned_steps`` reports 11 + 7 with the fixed margin alone, 5 + 5 at 0.90, 5 + 4 at 0.95; 60 early
1.2-1.5x changes at 1-20 % noise found 40, 38 and 37. The overlap that remains is the step/warm-up ambiguity: some
warm-ups beat their own curve by 6-12 variances, some changes by only 4."""
WARM_UP_SHORT_EVIDENCE = 2.0
"""With fewer than :data:`LEARNED_STEP_MIN_AFTER` steps before the split (:data:`LEARNED_STEP_MIN_BEFORE`), the
warm-up curve must explain the learned steps better than the split by this many noise variances to overrule it:
5-7 flat steps and a jump fit a curve rising over them almost as well as the step (1.3x after 5 steps at 8 % noise:
within 0.5-1.9 in 2 of 20 seeds), while a 5-step saturating warm-up (0.80-0.97x, 5 % noise, seed 47, read +17.7 %)
is explained better by the curve by 4."""
LEARNED_STEP_MIN_AFTER = 8
"""Steps the later part of such a split needs (a few high steps at the end are a spike, or not yet a level), and the
earlier part to be judged within :data:`EFFECT_Z` standard errors of ``min_effect``: a few low steps at the start are
a short warm-up as often as a change (5 rising steps at 3 % noise were reported as +11 %); fewer before the split:
:data:`LEARNED_STEP_MIN_BEFORE`."""
LEARNED_STEP_MIN_BEFORE = 5
"""Fewest steps before a split of a generation's first learned steps (:meth:`StepTimeRegressionDetector._split`).
A change a few steps into the learning left fewer than :data:`LEARNED_STEP_MIN_AFTER` steps at the level before it
and was learned as normal (``bench/bench_corpus.py`` seed 32, ``steady`` run 15: 1.3x at step 18, 7 learned steps
before it at 4 % noise, never reported). A split with fewer than :data:`LEARNED_STEP_MIN_AFTER` steps before it
must clear ``min_effect`` by :data:`EFFECT_Z` standard errors (no leniency) besides every other rule of the split:
a short warm-up's few rising steps (5 at 3 % noise read +11 %) stay under it."""
WARM_UP_BEFORE_MIN = 5
"""Fewest warm-up steps (excluded from detection, the newest :data:`PRIOR_WARM_VALUES`) that a generation's first
learned steps are split against when their own split finds no change
(:meth:`StepTimeRegressionDetector._warm_split`): a change fewer than :data:`LEARNED_STEP_MIN_BEFORE` steps into the
learning has no "before" side among the learned steps, and was learned as normal (3x from step 12 of a job whose
first 10 steps are warm-up, 1 learned step before it: 0 of 12 series found, 1.5-15 % noise)."""
WARM_UP_BEFORE_VALUES = 2
"""Fewest warm-up values (each a block of steps at high step rates) those steps must span besides
:data:`WARM_UP_BEFORE_MIN` steps: before, at least :data:`WARM_UP_BEFORE_MIN` *values* were required, so a job of
fast steps (judged in blocks of 3, 4 warm-up values) never had its short first part tested with its warm-up: a
0.38 -> 1.0x warm-up of 21 ms steps at 16 % noise over 33 steps left 6 learned blocks at 0.7x, split there and
reported as +45 % (``bench/bench_corpus.py --healthy-hours``, seed 101 ``warmup_up`` healthy run 3: a false arm)."""
WARM_UP_STEPS_EVIDENCE = 4.0
"""A split of a generation's warm-up steps and first learned steps (:meth:`StepTimeRegressionDetector._warm_split`)
must explain them better than the best warm-up curve rising from the first warm-up step by this many noise
variances (instead of :data:`WARM_UP_SHAPE_EVIDENCE`): 8 warm-up steps at 8-15 % noise do not show a slow rise, and
warm-ups rising from 0.6-0.74x over 15-45 steps (13-15 % noise) beat the curve by 1.5-2.8 (3 of 530 simulated
warm-ups). Measured on 1.3x and 3x changes from steps 12-18 (1.5-15 % noise): 1.3x at 8-15 % noise beat it by
1.9-3.0 in 4 of 72 and stays unreported (it cannot be told from such a warm-up); 3x and 1.3x at up to 5 % noise by
more than 8."""
MAX_SETTLE_RESTARTS = 3
"""Times the first learning of a generation may start again because the job was still warming up (a rise from the
first learned steps that then settled, :meth:`StepTimeRegressionDetector._settled`): bounds the delay a warm-up
longer than the learning window adds (each restart costs at most ``min_baseline_steps`` plus the lag)."""
CURVE_LAST_STEPS = 3
"""Measured steps just before a step on a warm-up curve that the steps after it must exceed by ``min_effect`` (their
medians; :meth:`StepTimeRegressionDetector._curve_split`): a change right at a warm-down's end has only the line's
last steps before it, and they are above the plateau, never below it."""
PROVISIONAL_BEFORE = 2
"""Fewest values before a provisional split (:meth:`StepTimeRegressionDetector._provisional_step`): one was too few,
the first block after a serving unit's bands formed is often far off (bench_corpus serving_dp run 5: a healthy
replica's blocks 0.73, then 1.33, 1.34, 1.18 fired at +76 %, 4 false arms in 32 runs a class)."""
PROVISIONAL_AFTER = 3
"""Fewest values after a provisional split: a change must outlast this many values (a serving unit's 60 s blocks:
3 minutes) before it is reported from a baseline still learning."""
PROVISIONAL_EFFECT = 0.5
"""A provisional split is a change when every value after it is at least ``1 +`` this times every value before it
(and ``1 + min_effect``): a threshold on the extremes, widened for the small samples instead of a noise estimate
that 1-5 values cannot give (see :meth:`StepTimeRegressionDetector._provisional_step`)."""
PRIOR_VALUES = 8
"""Pseudo-values at the previous generation's level that a requeued generation's first learned steps are split
against (:meth:`StepTimeRegressionDetector._prior_split`): the previous level counts as
:data:`LEARNED_STEP_MIN_AFTER` steps before the first one, so a change a few steps into the new generation's
learning has its "before" side (a 1.3x change 5 steps into a requeued generation's learning was learned as its
normal: the split of the learned steps needs 8 steps per side; ``bench/bench_corpus.py`` seed 31, ``requeue``
run 33)."""
PRIOR_CONFIRM_VALUES = 4
"""Fewest of the new generation's own values before such a split for the previous level to count as confirmed:
they must agree with it (:meth:`StepTimeRegressionDetector._prior_split`). A split before them is a change at the
generation's start, judged by :data:`PRIOR_MARGIN` and only for the same world size."""
PRIOR_WARM_VALUES = 8
"""The newest steps of a generation's warm-up (excluded from detection: ``warmup_steps``) kept as evidence of the
level it starts at (:meth:`StepTimeRegressionDetector._warm_agrees`): a requeue onto another world size with a
1.72x change at its 12th step had one measured step at the old level (10 warm-up steps excluded), short of
:data:`PRIOR_CONFIRM_VALUES`, and the change was learned as its normal (``bench/bench_corpus.py`` seed 32,
``requeue`` run 14)."""
CURVE_RECHECK_NEAR = 0.9
"""A first learning's stepped warm-up curve (:meth:`StepTimeRegressionDetector._curve_split`) whose step explained the
steps within this fraction of :data:`LEARNED_STEP_EVIDENCE` (and no other split was a change) is tried again on the
next :data:`CURVE_RECHECK_VALUES` values (:meth:`StepTimeRegressionDetector._curve_recheck_step`). Floor 0.9 (a few
more looks at the same evidence, only where the step was nearly shown), bound 1."""
CURVE_RECHECK_VALUES = 8
"""Values after the end of a first learning over which a nearly shown step on the warm-up curve is tried again
(:data:`CURVE_RECHECK_NEAR`); floor 1, bound :data:`LEARNED_STEP_MIN_AFTER` (as many as a split's later part needs:
more looks would test a level the baseline has since learned)."""
SCREEN_HALF_WINDOW = 4
"""Half the window of the running median that screens interruptions out of a generation's first learned steps before
their split against the warm-up steps (:meth:`StepTimeRegressionDetector._unscreened`): runs of at most this many
values far over it are held out (a checkpoint or evaluation: 1-5 steps in ``bench/bench_corpus.py``); longer ones are
a level. Floor 1 (a window of 3), bound ``LEARNED_STEP_MIN_AFTER / 2`` (a level the split may report is never
screened)."""
FALL_JUMP_EVIDENCE = 25.0
"""A jump up inside a generation's first steps that otherwise fall (warm-up steps and first learned steps,
:meth:`StepTimeRegressionDetector._fall_split`) is a change when two falling curves, one each side of it, explain the
log step times better than one falling curve by this many noise variances (as :data:`LEARNED_STEP_EVIDENCE`: a
log-likelihood ratio of 12.5). Floor 25, bound none needed: the isotonic fits' own chance gain over one curve is about
the harmonic sum (``ln n``, under 6 variances for 128 values; Barlow et al. 1972, ch. 3), and the best of up to 120
splits of a healthy warm-down (1.5-20x, 5-60 steps, 1-20 % noise, tests/unit/test_warm_up_changes.py) stays under it.
A 1.3x slowdown 2-30 steps into a 2x -> 1x fall (1-10 % noise) was learned as part of the warm-down: 20 of 24 lost."""
FALL_JUMP_SIDE_STEPS = 4
"""Measured steps each side of a jump up inside a warm-down whose medians must differ by ``min_effect`` plus
:data:`EFFECT_Z` standard errors (:meth:`StepTimeRegressionDetector._fall_split`): the isotonic fits' boundary blocks
may be single steps, and one chance low step before a healthy warm-down's end (16 % noise) was read as a jump of
+111 % (``tests/unit/test_regression.py``, warm-downs alone, seed 59). Floor 3 (a median of fewer is one step), bound
``LEARNED_STEP_MIN_AFTER`` (the later part's least size); 4: the 1.3x changes of
``tests/unit/test_warm_up_changes.py`` keep 16 of 24 found (17 with the fitted blocks alone)."""
FALL_JUMP_NOISE_MAX = 0.15
"""Bound on the relative noise (of log step time, from successive differences) at which
:meth:`StepTimeRegressionDetector._fall_split` judges a jump: above it some 50 first steps cannot tell a jump from a
steep fall's own wobble (simulated healthy warm-downs, 350 series at 1-20 % noise, linear, exponential and stepped:
the chance jumps that passed every other rule were at 16-19 % noise; 0 of 350 pass with this bound, while 1.3x
changes at up to 10 % noise are found)."""
FALL_JUMP_MIN_FALL = 0.1
"""Least fall (log step time: the median of a series' first :data:`LEARNED_STEP_MIN_AFTER` steps over its last's,
beyond :data:`EFFECT_Z` standard errors; floor: ``min_effect`` when larger) for steps with a jump up inside them to
count as a warm-down (:meth:`StepTimeRegressionDetector._fall_split`): a flat level's jump is the two-level split's
(:meth:`StepTimeRegressionDetector._split`), with its own rules (a flat series at 5 % noise, its isotonic fit's first
block a chance high, was read as a fall with a jump: ``tests/unit/test_regression.py`` seed 29, +24 %)."""
FALL_SPLIT_BEFORE = 3
"""Most values before the fall that a speedup's lower CUSUM run may begin with (:func:`fallen_level`): the chance
low steps before the speedup that started it. A split anywhere in a run down a slow decline picked its last,
lowest step (a step -47 % at 17 % noise in ``bench/bench_corpus.py`` seed 32, ``faster`` run 9) as the level."""
SPLIT_Z = 3.0
"""Standard errors by which the later part of a level report's risen steps must exceed the earlier for it to be the
level the report measured (``StepTimeRegressionDetector._level_later``)."""
MEDIAN_SE = math.sqrt(math.pi / 2.0)
"""Standard error of a sample median over the mean's, on Gaussian noise (asymptotic)."""
PRIOR_MARGIN = 0.25
"""A requeued generation of the same world size that is slower than the previous one from its first steps is a
change only when it is at least this much slower (relative; and ``min_effect``): a requeue onto other nodes may
legitimately run a few percent off the old level; another world size never reports it (strong scaling
changes the step time by design)."""
PRIOR_AGREE_Z = 3.0
"""The generation's own first values agree with the previous generation's level when their mean log step time is
within ``max(min_effect / 2,`` this many standard errors``)`` of its log (:meth:`StepTimeRegressionDetector._prior_split`):
two-sided 0.3 %; at 2 the first 5 values of a requeue at the old level read 11 % low by chance at 7.7 % noise (1 of
20 seeds) and its 1.3x change was lost."""
SIEGMUND_RHO = 0.583
"""Expected overshoot of a Gaussian random walk over a boundary, in sigmas: Siegmund's correction is 2 * 0.583."""


SERIAL_SIGMA_Z = 1.2816
"""Serial noise (:func:`serial_noise_factor`): the scale is read at its one-sided 90 % upper confidence bound, the
chi-square bound ``sqrt((n - 1) / chi2_{0.10, n-1})`` (1.9x at 5 values, 1.5x at 10, 1.14x at 60; the
inflation it replaces where larger, ``1 + sqrt(1.1 / 2n)``, is 1.33x, 1.23x, 1.10x)."""
SERIAL_RHO_Z = 1.2816
"""While a baseline learns (fewer than ``min_baseline_steps`` values, judged one at a time by the learning path),
the lag-1 autocorrelation is read this many standard errors ``sqrt((1 - rho^2) / n)`` over its estimate
(:func:`serial_noise_factor`): 5-9 values cannot tell rho 0 from 0.6 (a healthy unit's 6th block read +44 % at a
noise of 0.026 from 5 blocks and armed). The change-point test, from 10 values on, uses the estimate itself: a
bound of 0.5-1 standard errors there slowed a +30 % change past the baseline's lag in 3-5 of 8 AR(1) series at
rho 0.3 (1 of 8 with the estimate, 0 without the factor; tests/unit/test_serving_serial_noise.py)."""
SERIAL_RHO_MAX = 0.8
"""The lag-1 autocorrelation :func:`serial_noise_factor` uses is at most this (a long-run factor of 3)."""


def _chi2_lower(df: int, z: float) -> float:
    """The ``Phi(-z)`` quantile of a chi-square with ``df`` degrees of freedom, by the Wilson-Hilferty cube-root
    approximation (Wilson & Hilferty 1931, PNAS 17:684; within 2 % of the exact quantile from 4 degrees of
    freedom on at z 1.28); positive for ``df >= 1``."""
    a = 2.0 / (9.0 * df)
    return df * max(1.0 - a - z * math.sqrt(a), 0.2) ** 3


def serial_noise_factor(values: np.ndarray, rho_z: float = 0.0, rho: float | None = None) -> float:
    """The factor (>= 1; at most 9.6, with fewer than 3 values: 3 from rho, 3.2 from 2 degrees of freedom) a scale
    measured on ``values`` (a baseline of block values, oldest first)
    is multiplied by for a CUSUM that assumes independent values when they are serially correlated and few.

    Two parts, both standard: the long-run standard deviation of an AR(1) series, ``sqrt((1 + rho) / (1 - rho))``
    times its marginal one (Bayley & Hammersley 1946, "The effective number of independent observations in an
    autocorrelated time series", J. R. Stat. Soc. Suppl. 8:184; used to set a CUSUM on autocorrelated data by
    e.g. Lu & Reynolds 2001, J. Quality Technology 33:316), and a one-sided upper confidence bound on a scale from
    ``n`` values (chi-square, :data:`SERIAL_SIGMA_Z`). ``rho`` is the lag-1 autocorrelation of the values'
    residuals about their median (winsorised at 3 MADs: one block far off does not decide it), corrected for its
    small-sample bias ``-(1 + 3 rho) / n`` (Kendall 1954, Biometrika 41:403), raised by ``rho_z`` standard errors
    ``sqrt((1 - rho^2) / n)`` (:data:`SERIAL_RHO_Z`) and bounded to ``[0, SERIAL_RHO_MAX]`` (:func:`serial_rho`; ``rho`` given: that one).
    With fewer than 3 values: the factor at ``rho = SERIAL_RHO_MAX`` and 2 degrees of freedom. Pure."""
    n = int(values.size)
    r = serial_rho(values, rho_z) if rho is None else min(max(rho, 0.0), SERIAL_RHO_MAX)
    return ar1_long_run_factor(r) * math.sqrt(max(n - 1, 2) / _chi2_lower(max(n - 1, 2), SERIAL_SIGMA_Z))


def ar1_long_run_factor(rho: float) -> float:
    """``sqrt((1 + rho) / (1 - rho))``: the long-run standard deviation of an AR(1) series with lag-1
    autocorrelation ``rho`` over its marginal one (Bayley & Hammersley 1946, J. R. Stat. Soc. Suppl. 8:184), the
    factor a scale of serially correlated values is widened by for a sum or mean of them. ``rho`` in ``[0, 1)``
    (callers bound it: :data:`SERIAL_RHO_MAX`, rank_outliers' ``CPU_MAX_RHO``); >= 1. Pure."""
    return math.sqrt((1.0 + rho) / (1.0 - rho))


def lag1_autocorrelation(dev: np.ndarray) -> float:
    """The lag-1 sample autocorrelation ``sum(d[t] d[t-1]) / sum(d[t]^2)`` of deviations ``dev`` (1-D, oldest
    first, already centred by the caller: about a median, a part's median, a given reference), unbounded and not
    bias-corrected (the callers bound it); 0.0 with no spread or fewer than 2 values. Pure."""
    ss = float(np.dot(dev, dev))
    return float(np.dot(dev[1:], dev[:-1])) / ss if ss > 0.0 and dev.size >= 2 else 0.0


def serial_rho(values: np.ndarray, rho_z: float = 0.0) -> float:
    """The lag-1 autocorrelation :func:`serial_noise_factor` uses for ``values`` (oldest first), in
    ``[0, SERIAL_RHO_MAX]``; ``SERIAL_RHO_MAX`` for fewer than 3 values. Pure."""
    n = int(values.size)
    if n < 3:
        return SERIAL_RHO_MAX
    r = values - float(np.median(values))
    mad = MAD_TO_SIGMA * float(np.median(np.abs(r)))
    if mad > 0.0:
        r = np.clip(r, -3.0 * mad, 3.0 * mad)
    rho = lag1_autocorrelation(r)
    rho += (1.0 + 3.0 * rho) / n
    rho += rho_z * math.sqrt(max(1.0 - rho * rho, 0.0) / n)
    return min(max(rho, 0.0), SERIAL_RHO_MAX)


def cusum_threshold(k: float, arl0_steps: float) -> float:
    """Threshold h (sigmas) of a one-sided CUSUM with reference ``k`` whose mean run between false alarms is
    ``arl0_steps`` on N(0, 1) data, by Siegmund's approximation ``ARL0 = (e^{2kb} - 2kb - 1) / (2k^2)`` with
    ``b = h + 1.166`` (Siegmund 1985, "Sequential Analysis", eq. 2.57). Solved by fixed-point iteration on
    ``x = 2kb``: ``x = ln(2 k^2 ARL0 + x + 1)``. Returns at least 0.05. Raises ``ValueError`` for ``k <= 0``.
    """
    if k <= 0:
        raise ValueError(f"CUSUM reference must be > 0, got {k}")
    c = 2.0 * k * k * arl0_steps
    x = math.log(c + 1.0)
    for _ in range(50):
        nx = math.log(c + x + 1.0)
        if abs(nx - x) < 1e-12:
            break
        x = nx
    return max(0.05, x / (2.0 * k) - 2.0 * SIEGMUND_RHO)


def log_ratio_magnitude(mean_log_ratio: float) -> float:
    """Relative change ``exp(mean log(x / mu)) - 1`` from the mean log ratio of a run (a geometric mean): a fall is
    bounded at -1 (-100 %) by construction, a 50x rise reads +49 (+4900 %); never clipped. Finite for finite input
    (``math.exp`` overflows to ``OverflowError`` only past +709, i.e. a ratio of 1e308, which a floored level
    cannot produce)."""
    return math.expm1(mean_log_ratio)


def cusum_design(min_effect: float, noise_rel: float, false_alarm_steps: float) -> tuple[float, float, float]:
    """``(k, h, clip)`` of the CUSUM in noise-sigma units for a shift of ``min_effect`` at noise ``noise_rel``.

    ``delta = min_effect / noise_rel`` (the shift to detect, in sigmas); reference ``k = delta / 2`` (optimal for
    that shift); threshold ``h`` from :func:`cusum_threshold` for a mean run of ``false_alarm_steps`` between
    false alarms; increments are clipped at ``k + h / 2`` so, from ``S = 0``, no fewer than three steps fire. Lorden's bound
    on the detection delay at that false-alarm rate is ``ln(false_alarm_steps) / (delta^2 / 2)`` steps.
    """
    delta = min_effect / noise_rel
    k = delta / 2.0
    h = cusum_threshold(k, false_alarm_steps)
    return k, h, k + h / 2.0


def rise_split(y: np.ndarray) -> int | None:
    """The index of the best two-level split of ``y`` (a run's log step times, oldest first) where the later part
    (at least 2 values) is above the earlier (least squares; a change a rise's run found is a rise: never split a
    fall off its end); None when ``y`` has fewer than 3 values or no such split fits better than one level."""
    m = y.size
    if m < 3:
        return None
    c1, c2 = np.cumsum(y), np.cumsum(y * y)
    left = np.arange(1, m - 1)  # the later part keeps >= 2 values
    sse = (c2[left - 1] - c1[left - 1] ** 2 / left + (c2[-1] - c2[left - 1])
           - (c1[-1] - c1[left - 1]) ** 2 / (m - left))
    flat = float(c2[-1] - c1[-1] ** 2 / m)
    rise = (c1[-1] - c1[left - 1]) / (m - left) > c1[left - 1] / left
    sse = np.where(rise, sse, np.inf)
    j = int(np.argmin(sse))
    return int(left[j]) if float(sse[j]) < flat else None


def fallen_level(values: list[float], noise: float) -> tuple[float, int]:
    """``(level_s, n)``: the level a lower CUSUM run ``values`` (its step times, s, > 0, oldest first, at least one)
    fell to and the steps it rests on. The run begins when the lower CUSUM leaves 0, which a chance low step before
    the speedup does, so the run's geometric mean holds steps from before it (0.32 s for a level of 0.25 s after a
    -50 % speedup: a +30 % slowdown 6 steps later then sat at the reference and was lost). The log step times are
    split at the best two-level split (least squares, the earlier part at most :data:`FALL_SPLIT_BEFORE` values, the
    later part at least 1 and below the earlier) and
    the later part's geometric mean is the level when the parts differ by :data:`SPLIT_Z` standard errors
    (``noise``, relative, per step: a run down a slow decline at 17 % noise was otherwise split at its last, lowest
    step); the whole run's otherwise. Mirrors the rise's split of ``StepTimeRegressionDetector._reported_level``."""
    y = np.log(np.asarray(values, dtype=np.float64))
    m = y.size
    whole = float(math.exp(y.mean()))
    if m < 2:
        return whole, m
    c1, c2 = np.cumsum(y), np.cumsum(y * y)
    left = np.arange(1, min(m, FALL_SPLIT_BEFORE + 1))  # the earlier part keeps 1-3 values, the later part >= 1
    sse = (c2[left - 1] - c1[left - 1] ** 2 / left + (c2[-1] - c2[left - 1])
           - (c1[-1] - c1[left - 1]) ** 2 / (m - left))
    fall = (c1[-1] - c1[left - 1]) / (m - left) < c1[left - 1] / left
    sse = np.where(fall, sse, np.inf)
    j = int(np.argmin(sse))
    flat = float(c2[-1] - c1[-1] ** 2 / m)
    if not float(sse[j]) < flat:
        return whole, m
    cut = int(left[j])
    lo, hi = float(y[cut:].mean()), float(y[:cut].mean())
    if hi - lo < SPLIT_Z * max(noise, MIN_NOISE) * math.sqrt(1.0 / cut + 1.0 / (m - cut)):
        return whole, m
    return float(math.exp(lo)), m - cut


class StepTimeRegressionDetector:
    """Finds lasting changes of a job's step time; reports transient and periodic spikes as such.

    Args:
        job_id: copied into every :class:`Anomaly`.
        settings: thresholds (see Notes).
        hold_steps: ``(step, step_time_s) -> steps`` a spike may last and still be over before a capture armed at
            its onset could start: the capture planner's lead. Used when ``spike_hold_steps`` is None.

    Notes:
        Series: the job step time of each non-excluded finalised step (the slowest rank's; in synchronous
        training all ranks wait for it, so their noise is common, and pooling ranks cannot sharpen this series).

        Baseline: Tukey biweight location ``mu`` and scale ``sigma`` over the last ``baseline_steps`` accepted
        steps, lagging the newest ``baseline_lag_steps`` (see ``daemon/profwatch/core/detection/baseline.py``); detection starts
        when it holds ``min_baseline_steps``; while it fills, spike steps are kept out of it unless they last
        longer than the hold (the job changed level while learning: learning restarts there). Noise ``s = max(sigma * (1 + sqrt(1.1 / 2n)), noise_floor * mu) / mu``
        (relative; inflated by one standard error of the scale at n values; with ``serial_noise``, by
        :func:`serial_noise_factor` where larger). Standardised step:
        ``z = (x / mu - 1) / s``.

        Spikes first (``daemon/profwatch/core/detection/spikes.py``): a step ``>= spike_min_effect`` and ``>= spike_z`` sigmas
        over ``mu`` is a spike step, held out of the CUSUM and the baseline. An episode of spike steps that
        ends within the hold (``spike_hold_steps``, default the capture planner's lead at the current step
        time; at the step's own time for a step :data:`LARGE_JUMP` times the baseline or more) is reported as ``step_spike`` (at most one event per ``spike_event_gap_steps``; the others are
        counted in the next event) and never arms; one that lasts longer is a sustained level change:
        ``step_regression`` with ``pattern "level"``. Recurring episodes are learned as periodic: reported once
        as ``periodic_spike`` (with the next onset), their predicted windows held out.

        Change point (Page 1954 CUSUM, two-sided): with ``delta = min_effect / s``, ``k = delta / 2`` and h
        such that the mean run between false alarms is ``false_alarm_steps`` (Siegmund's approximation, see
        :func:`cusum_threshold`), ``S+ = max(0, S+ + min(z, c) - k)`` and
        ``S- = max(0, S- - max(z, -c) - k)``, ``c = k + h / 2`` (one outlier moves S by at most h / 2, so from
        ``S = 0`` it takes three steps to fire).
        ``S+ > h`` fires ``step_regression`` (``pattern "cusum"``) when the mean relative excess of the run since
        ``S+`` last was 0 (the change-point estimate, ``first_step``) is not significantly below ``min_effect``:
        ``mean + 2 * s / sqrt(run) >= min_effect`` (``effect_z``, 2 by default; otherwise ``S+`` is capped at h: a shift smaller than
        ``min_effect`` is never reported, it is absorbed by the baseline). ``S- > h`` (the job got faster)
        re-learns the baseline silently. After a fire the baseline is re-learned (debounce: the new level
        becomes normal). Magnitude = mean relative excess of the run.

        Guarantees with known mu and s (Gaussian noise): mean run between false alarms about
        ``false_alarm_steps`` per side, and a mean delay for a shift of ``delta`` sigmas close to Lorden's bound
        ``ln(false_alarm_steps) / (delta^2 / 2)`` (Lorden 1971, Ann. Math. Statist. 42:1897; CUSUM is optimal in
        his sense, Moustakides 1986). For 10 % at 5 % noise: delta = 2, bound 5.8 steps.
        ``bench/bench_detection.py`` prints the bound beside the measured delays and the false alarms measured with
        estimated mu and s.

        Drift: with ``drift_detection`` the baseline estimates a steady trend (Theil-Sen over block medians,
        used when significant; ``daemon/profwatch/core/detection/baseline.py``) and ``mu`` is the level extrapolated
        to the current step, so a drift never moves S+ and a sudden change during a drift is found as on a flat
        job. :class:`~profwatch.core.detection.drift.DriftTracker` reports ``drift`` (slope, total since the
        reference) once per ``drift_threshold`` grown; a ``step_regression`` re-learns the baseline without
        counting its jump as drift.

        Source: Page, "Continuous inspection schemes", Biometrika 41 (1954); minimum effect 10 % as in Greyhound /
        Falcon (Wu et al., ATC'25; arXiv 2410.12588), which pairs a change-point test on iteration time with a
        >= 10 % mean-change filter. Assumes comparable steps (the same work per step) and noise that is
        independent from step to step.
    """

    def __init__(self, job_id: str, settings: DetectionSettings,
                 hold_steps: Callable[[int, float], int] | None = None, *,
                 first_learning_checks: bool = True, provisional: bool = False,
                 high_noise_confirm: bool = True, serial_noise: bool = False) -> None:
        self.job_id = job_id
        self.serial_noise = serial_noise
        self._serial: float | None = None
        self._s_hi = 0.0
        """Whether the noise is scaled by :func:`serial_noise_factor` of the baseline's values (set by
        ``UnitPipeline`` for a serving unit's 60 s blocks: a shared host's load moves them in runs of minutes, and
        a baseline of 5-30 blocks read a noise the blocks did not keep; off for training steps). Its autocorrelation
        is held while a rise builds up (``S+ > 0``): a change whose first blocks entered the baseline read as
        correlation and inflated the noise 5x (a +30 % change was never found). The small-sample bound is not
        held: held from a run's young baseline of 17 blocks, it kept a +30 % change unreported for 41 minutes
        (tests/unit/test_serving_rescale.py)."""
        self.high_noise_confirm = high_noise_confirm
        """Whether a CUSUM run at high noise that clears ``min_effect`` by fewer than its standard errors waits for
        confirmation (:meth:`_high_noise_margin`). Off for a serving unit's 60 s blocks (``UnitPipeline``): each
        confirming value is a minute there (a +30 % rank in tests/unit/test_serving_rescale.py was found at 2,388 s
        instead of by 2,100 s)."""
        self.provisional = provisional
        """Whether values are judged by :meth:`_provisional_step` while the baseline learns (set per block by
        ``UnitPipeline`` for a serving unit's 60 s blocks with ``work``: its baseline takes 18 blocks, and a change
        in them was learned as normal)."""
        self.first_learning_checks = first_learning_checks
        """Whether the end of a generation's first learning checks its steps for a warm-up (:meth:`_settled`) and
        for a change among them (:meth:`_learned_step`). Off for a serving unit's series of 60 s blocks of ratios
        to load-band references that learn at the same time (``UnitPipeline``): there a level change among the
        first blocks is the shared host's load, which the bands absorb (a replica's flickering load read as a
        +21 % ``learned_steps`` change in tests/unit/test_serving_rescale.py)."""
        self.settings = settings
        self._hold_steps = hold_steps
        self.effect_z = EFFECT_Z
        self.speedup_ratio: float | None = None
        """At the last speedup (the lower CUSUM fired), the fallen level over the baseline (a ratio in (0, 1]),
        until the owner takes it (``UnitPipeline``: a serving unit's load bands follow the fall at once, see
        :meth:`rebase`); None otherwise."""
        self.speedup_first_step = 0
        """The first step of the last speedup's run (its change-point estimate)."""
        """Standard errors the run's mean excess may fall short of ``min_effect`` at a fire (:data:`EFFECT_Z`; a
        serving unit without ``work`` sets 0: see ``UnitPipeline``)."""
        self._base = RobustBaseline(settings.baseline_steps, settings.baseline_lag_steps,
                                    trend=settings.drift_detection)
        self.drift = DriftTracker(settings.drift_threshold or settings.min_effect)
        self._steps_per_value = 1
        self.spikes = SpikeFilter(settings)
        self.recurring = RecurringInterruptions()
        """Level reports that came back (a job-wide interruption the job does not flag): an alike excursion gets
        a longer hold (see ``daemon/profwatch/core/detection/interruptions.py``)."""
        self.counters = {"regressions": 0, "spike_events": 0, "spikes_not_reported": 0, "speedups": 0, "held": 0,
                         "relearn_while_learning": 0, "drift_reports": 0, "drift_onsets": 0, "unmeasured": 0,
                         "warmup_restarts": 0, "warmup_rebases": 0}
        self._checked_learned = not first_learning_checks
        self._curve_recheck = 0  # values left to try the stepped warm-up curve again (_curve_recheck_step)
        self._curve_near = 0.0
        """Whether this generation's first learned steps were checked for a change (:meth:`_learned_step`)."""
        self._settle_restarts: int | None = 0 if first_learning_checks else None
        """Warm-up restarts of this generation's first learning (:meth:`_settled`); None once it settled."""
        self._recent: deque[float] = deque(maxlen=RAMP_WINDOW)
        # the learned steps with the steps held out as a fall while learning (_fall_split)
        self._fall_seq: deque[float] = deque(maxlen=RAMP_WINDOW)
        self._recent_steps: deque[int] = deque(maxlen=RAMP_WINDOW)
        """The step of each value :meth:`_learn` pushed as measured since the last (re-)learn: when it is as long as
        :attr:`_recent` (nothing else pushed), the steps of the learned values, whatever the screen held out."""
        self._ramp_step: int | None = None
        self._learn_since = 0
        self._interim: tuple[float, float, str] | None = None
        """``(level_s, noise_rel, reference)`` a step is judged against while the baseline re-learns after a
        speedup (``"before_speedup"``) or a report (``"reported_level"``); None otherwise (:meth:`_interim_cusum`)."""
        self._interim_spikes: list[float] = []
        self._interim_spike_start = 0
        self._interim_spike_last = 0
        """The last step held in :attr:`_interim_spikes` (an episode goes on through :data:`MERGE_GAP_STEPS`
        ordinary steps, as the spike filter's does)."""
        self._speedup_from: float | None = None
        """The baseline level (s) when the last speedup fired: the reference a slowdown after it is judged against
        while the speedup is not confirmed (:meth:`_speedup_reference`)."""
        self._after_speedup: deque[tuple[int, float]] = deque(maxlen=RAMP_WINDOW)
        """``(step, step_time_s)`` judged against the ``"before_speedup"`` interim reference since the speedup fired."""
        self._follow: list[float] = []
        """Step times (s) after a report that the interim reference follows (:data:`REPORT_FOLLOW_STEPS`)."""
        self._follow_left = 0
        self._follow_from = 0.0
        self._level_vals: list[float] = []
        """The risen steps (s, oldest first) of the ``pattern "level"`` report being fired (:meth:`_level_later`)."""
        self._jump: tuple[int, float, float] | None = None
        """A change during a warm-up found at the end of a first learning (:meth:`_line_jump`), to report."""
        """The interim reference the report set (s), before it followed any step."""
        self._last_job_step_s: float | None = None
        self._first_step: int | None = None
        self._level_since: int | None = None
        """The step of the first value the baseline learned since it last started again (:meth:`_relearn`): how
        long the job ran at the level a speedup leaves (:meth:`RecurringInterruptions.left`)."""
        self._first_level = True
        """The baseline learning now is the generation's first level (no speedup and no report since the start or
        :meth:`reset`): only a speedup from it says how long the job ran there (a job that started in its slow
        regime, :meth:`_left_level`). A level learned after a speedup or a report began before
        :attr:`_level_since` (a report watches its excursion for its return, ``recurring.reported``): a 3x rank
        healed after 900 steps, re-learned at a host-load speedup 198 steps before, was remembered as a 198-step
        visit and a later 1.6x job-wide change was held 240 steps as its return
        (``test_a_change_after_the_slow_rank_healed_is_captured``)."""
        self._first_learned: int | None = None
        """The step of the generation's first value learned as measured (:meth:`_learn`): whether its learned steps
        begin where its warm-up's end (:meth:`_warm_split`)."""
        """The generation's first measured step (the age bound of the warm-up rules, :data:`SETTLE_MAX_STEPS`)."""
        self._step_now = 0
        self.prior: tuple[float, bool] | None = None
        """``(level_s, same_world_size)``: the previous generation's learned job step time (a requeue or elastic
        restart under the same job id, handed over by ``JobDetector.inherit``) and whether this generation has the
        same world size; the reference of :meth:`_prior_split` at the end of this generation's first learning, then
        dropped. None: none known."""
        self._warm_values: deque[float] = deque(maxlen=PRIOR_WARM_VALUES)
        """The newest step times (s) of the generation's warm-up (steps excluded as ``"warmup"``)."""
        self._warm_dropped: deque[float] = deque(maxlen=RAMP_WINDOW)
        """The learned step times (s, oldest first) that this generation's warm-up restarts (:meth:`_restart_learning`)
        dropped: the warm-up's rise before the values learned now, which :meth:`_dropped_curve_split` judges them
        with."""
        self._first_values: list[float] = []
        """The generation's first :data:`PRIOR_CONFIRM_VALUES` measured values (s): whether it started at the
        previous generation's level (:meth:`_past_prior`)."""
        self._design_key: tuple[float, float, float] | None = None
        self._design_val = (0.0, 0.0, 0.0)
        self._speedup_noise = 0.0
        """The relative noise of the baseline before this generation's speedups since its last report (the largest;
        0 for none): the noise a baseline re-learned after a speedup is raised towards (:meth:`_noise`)."""
        self._relearn()
        self._from_start = True
        """Whether the values learned began at the generation's first learned step (no restart since: a split with
        fewer than :data:`LEARNED_STEP_MIN_AFTER` steps before it is judged only then)."""
        self._last_spike_event: int | None = None
        self._spikes_since_event = 0
        self._gen_reported = False
        """Whether this generation reported a ``step_regression`` (:meth:`_warm_up_continues` judges only before)."""

    # -- StepDetector ----------------------------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget everything (the step counter restarted)."""
        self._relearn()
        self._first_level = True
        self._from_start = True
        self._settle_restarts = 0 if self.first_learning_checks else None
        self._checked_learned = not self.first_learning_checks
        self._curve_recheck = 0
        self.drift.reset()
        self.spikes.reset()
        self.recurring.reset()
        self._last_spike_event = None
        self._spikes_since_event = 0
        self._last_job_step_s = None
        self._first_step = None
        self._first_learned = None
        self._first_values = []
        self._warm_values.clear()
        self._warm_dropped.clear()
        self._gen_reported = False
        self._speedup_noise = 0.0

    def update_settings(self, settings: DetectionSettings) -> None:
        """Swap thresholds keeping the learned baseline (resized) and the learned periodic patterns."""
        self.settings = settings
        self.spikes.settings = settings
        self.drift.threshold = settings.drift_threshold or settings.min_effect
        self._base.resize(settings.baseline_steps, settings.baseline_lag_steps)

    @property
    def baseline_step_time_s(self) -> float | None:
        """The baseline job step time (s) once learned, else the last accepted job step time, else None."""
        if len(self._base) >= self.settings.min_baseline_steps:
            mu0 = self._base.stats()[0]
            if self._base.slope < 0.0:  # a falling line's level: never below the recent steps' lower quartile
                mu0 = max(mu0, self._recent_low())
            return mu0 if mu0 > 0.0 else self._last_job_step_s
        return self._last_job_step_s

    @property
    def learning_progress(self) -> tuple[int, int] | None:
        """While the baseline learns, ``(values taken, values needed)``: the accepted values it holds (held-back ones
        included) and ``min_baseline_steps`` plus the lag, the count at which the change-point test starts (until
        then only rises of ``spike_min_effect`` are judged, the learning path of :meth:`_learn`); None once it
        judges. A value is a step, a block of fast steps, or a serving unit's 60 s block."""
        need = self.settings.min_baseline_steps
        if len(self._base) >= need:
            return None
        return len(self._base) + self._base.held, need + self._base.lag

    @property
    def rising(self) -> bool:
        """True while the detector gathers evidence of a rise: its upper CUSUM is above 0, or risen steps wait
        out the hold while the baseline learns."""
        return self._s_hi > 0.0 or bool(self._learn_rise)

    def forget_rise(self) -> None:
        """Drop the evidence gathered for a rise (the upper CUSUM, its run, the learning path's risen values, the
        provisional rule's values): the rise was reported by another detector and made the new normal of the series
        (a serving replica named by its peers, ``ReplicaPeers``, or a unit's shared level, ``UnitLevel``), so this
        detector must not report it again (the provisional rule reported a 3x change 8 s after ``UnitLevel`` had:
        tests/unit/test_serving_provisional.py)."""
        self._s_hi = 0.0
        self._learn_rise.clear()
        self._prov.clear()
        self._run_reset()

    def rebase(self, factor: float) -> None:
        """The series' scale changed by ``factor`` (> 0) from the next step on (a serving unit's load bands took a
        speedup or a reported rise in: its ratios are divided by ``factor``): the interim reference a slowdown after
        the speedup or the report is judged against is divided by it too, so it stays the same step time. No-op without an interim reference
        or for a ``factor`` not > 0."""
        if self._interim is not None and factor > 0 and math.isfinite(factor):
            self._interim = (self._interim[0] / factor, *self._interim[1:])
            self._follow = [v / factor for v in self._follow]
            self._follow_from /= factor
            if self._speedup_from is not None:
                self._speedup_from /= factor
            self._after_speedup = deque(((st, v / factor) for st, v in self._after_speedup), maxlen=RAMP_WINDOW)

    def _relearn(self) -> None:
        self._level_since = None
        self._left_pending: tuple[int, int, float] | None = None
        self._from_start = False
        self._curve_recheck = 0
        self._base.clear()
        self._recent.clear()
        self._fall_seq.clear()
        self._recent_steps.clear()
        self._ramp_step = None
        self._trending = False
        self._s_hi = self._s_lo = 0.0
        self._interim = None
        self._interim_spikes = []
        self._speedup_from = None
        self._after_speedup.clear()
        self._follow = []
        self._follow_left = 0
        self._lo_vals: deque[float] = deque(maxlen=RAMP_WINDOW)
        self._learn_rise: list[float] = []
        self._learn_fall: list[float] = []
        self._prov: list[tuple[int, float]] = []
        self._run_reset()
        self.spikes.reset_episode()

    def _end_interim(self) -> None:
        """The re-learned baseline takes over from the interim reference: a CUSUM run built against that reference
        starts again from 0, as its sums and mean were measured against another level (a run begun against a
        speedup's level read too low went on against the baseline with its old mean, +15.7 % over 47 steps on a
        series back at its level, and fired)."""
        if self._interim is not None:
            self._s_hi = 0.0
            self._run_reset()
        self._interim = None

    def _run_reset(self) -> None:
        self._run_start: int | None = None
        self._run_n = 0
        self._run_log = 0.0
        self._run_slowest: set[int] = set()
        self._run_vals: deque[float] = deque(maxlen=RAMP_WINDOW)
        self._deferred = 0
        self._crossed = False
        """Whether the run's S+ crossed the threshold h already (its fire held back by the effect test)."""
        self._post_n, self._post_log = 0, 0.0
        """Steps of the run after it first crossed h and the sum of their log ratios to the baseline: the
        unselected evidence a marginal fire waits for (:meth:`_confirmed`)."""

    def on_step(self, step: FinalizedStep) -> list[Anomaly]:
        """Consume one finalised step (excluded steps only advance the periodic bookkeeping)."""
        if step.excluded is not None:
            if step.excluded == "warmup" and step.time_s >= MIN_STEP_S and math.isfinite(step.time_s):
                self._warm_values.append(step.time_s)
            self.spikes.skip(step.step)
            return []
        x = step.time_s
        if not x >= MIN_STEP_S:  # no measurement: never a baseline value, never judged (MIN_STEP_S)
            self.counters["unmeasured"] += 1
            self.spikes.skip(step.step)
            return []
        self._steps_per_value = max(1, step.steps)
        self._last_job_step_s = x
        back = self.recurring.observe(step.step, x, self.settings.spike_min_effect, self.settings.spike_z,
                                      self.settings.min_effect)
        if isinstance(back, NewLevel):
            return [self._new_level(step, back), *self._judge(step, x)]
        if back is not None and self._interim is not None and self._interim[2] == "reported_level":
            # the reported excursion came back: a rise while the baseline re-learns is judged against the level
            # before it, not the excursion's (a +30 % change 10 steps after a 7x one was learned as normal)
            self._interim = (back.before_s, self._interim[1], "before_interruption")
        return self._judge(step, x)

    def _judge(self, step: FinalizedStep, x: float) -> list[Anomaly]:
        """Judge one measured step (``x`` its job step time, s): against the interim reference, while learning,
        or by the spike filter and the CUSUM (:meth:`on_step`)."""
        self._step_now = step.step
        if self._first_step is None:
            self._first_step = step.step
        if len(self._first_values) < PRIOR_CONFIRM_VALUES:
            self._first_values.append(x)
        s = self.settings
        n = len(self._base)
        if self._interim is not None and (n < s.min_baseline_steps or self._interim_spikes):
            a = self._interim_cusum(step, x)
            if a is not None:
                return [a]
            if n >= s.min_baseline_steps:  # a spike episode held against the interim reference outlasts the
                if not self._interim_spikes:  # re-learning: judged to its end there, then the baseline takes over
                    self._end_interim()
                return []
            if self._interim_spikes and self._interim[2] in ("before_interruption", "before_speedup"):
                # a step of an excursion held against the level before a learned interruption is not the job's
                # level: learned by a young baseline of 4 steps it made a 3.6x slow regime part of it, and the next
                # fast steps a speedup (bench_new_shapes alternating seed 31 run 0). Nor is one held after a speedup
                # (alike to a level the job left): the young baseline learned 36 held steps of a +30 % change, the
                # episode broke on one low step, and that baseline took over (bench_corpus seed 31 levels run 14)
                return []
        if n < s.min_baseline_steps:
            a = self._learn(step, x)
            return [a] if a is not None else []
        if self._curve_recheck > 0:
            a = self._curve_recheck_step(step, x)
            if a is not None:
                return [a]
        mu, noise = self._noise()
        if (self._base.slope != 0.0) != self._trending:  # the baseline's line now follows a trend (or no more):
            self._trending = self._base.slope != 0.0       # what S+ and S- summed was measured against another line
            self._s_hi = self._s_lo = 0.0
            self._run_reset()
        rel = x / mu - 1.0
        z = rel / noise
        out: list[Anomaly] = []
        hold = self._spike_hold(step.step, mu, x)
        stride = self._steps_per_value

        def extend(ep: SpikeEpisode) -> int:
            return self.recurring.hold(ep.onset, ep.level, hold, stride, mu * (1.0 + max(ep.level, 0.0)))

        sp = self.spikes.observe(step.step, rel, z, hold, stride, extend)
        if sp.ended is not None and not sp.ended_periodic:
            self._spike_event(step.step, sp.ended, mu, hold, out)
        if sp.new_pattern is not None:
            detail = {"pattern": "periodic", **sp.new_pattern.to_json(), "baseline_s": mu}
            out.append(Anomaly("periodic_spike", self.job_id, step.step, (), sp.new_pattern.peak, detail))
        if sp.sustained is not None:
            ep = sp.sustained
            detail = {"pattern": "level", "first_step": ep.onset, "baseline_s": mu, "noise": noise,
                      "step_time_s": mu * (1.0 + ep.level), "peak": ep.peak, "steps": ep.duration,
                      "hold_steps": hold, "slowest_ranks": [step.slowest_rank]}
            self._level_vals = [mu * (1.0 + r) for r in ep.rels]
            out.append(self._fire(step.step, ep.level, detail))
            return out
        ep_open = self.spikes.open_episode
        # an excursion alike to the job's recurring interruptions is judged by its (longer) hold alone: its elevated
        # steps under the spike test, and the leading step the CUSUM took before the episode opened, fired the CUSUM
        # 4 steps into the second occurrence of a 1.5x evaluation at 4.7 % noise
        recurring = ep_open is not None and (sp.held or (rel >= EXIT_FRACTION * s.spike_min_effect
                                                         and z >= EXIT_FRACTION * s.spike_z)) \
            and bool(self.recurring.alike(ep_open.level))
        if recurring and ep_open is not None and ep_open.onset == step.step:
            self._s_hi = 0.0
            self._run_reset()
        if sp.held or recurring:
            self.counters["held"] += 1
            # held steps just before or inside a run are part of the level a report measures (_reported_level): a
            # rise straddling the spike threshold once left a run of its 2 lowest steps (+28 % for +35 %)
            self._run_vals.append(x)
            return out
        a = self._cusum(step, x, rel, z, mu, noise)
        if a is not None:
            out.append(a)
        return out

    # -- internals -------------------------------------------------------------------------------------------------
    def _spike_hold(self, step: int, mu: float, x: float) -> int:
        """The spike hold (values: steps, or blocks of fast steps) for a step of ``x`` s against a baseline of
        ``mu`` s: the capture planner's lead at the step's own time when it is over the baseline, else at the
        baseline's; ``spike_hold_steps``, when set, as it is.

        The hold asks whether an excursion was over before a capture armed at its onset could start, which is
        ``poll + margin_s`` seconds of the job's time (``profwatch.core.capture.planner.lead_steps``): counted at
        the baseline's step time, a 3x rise at 8 ms steps was held for 392 steps, 9 s of its own 23 ms steps
        instead of the lead's 3 s, and every rise at fast steps for ``x / mu`` times the lead in seconds (bench
        ``bench_corpus`` seed 31, ``noisy`` run 5: 403 steps, 9.2 s). Bounded in both units: a rise of
        :data:`LARGE_JUMP` or more takes the lead at its own time as it is (a lead of hundreds of fast steps would
        otherwise hold a 50x level jump for minutes); a smaller one never less than :data:`HOLD_FLOOR_STEPS` steps
        (in values: divided by the steps per value, rounded up) or the baseline's lead when that is shorter, so
        slow-step jobs, whose lead is a few steps, hold as before and a checkpoint of a few steps stays a
        transient. Under :data:`LARGE_JUMP`, never more than the lead at the baseline's step time (the rule before;
        the planner's poll interval, a whole number of seconds, can make the lead at a longer step time a step
        longer), never under 1. Our own rule (the planner's lead is
        ``ceil((poll + margin_s) / step_time_s) + margin_steps``)."""
        at_base = self._hold(step, mu)
        if self.settings.spike_hold_steps or not x > mu:
            return at_base
        at_own = self._hold(step, x)
        if x >= LARGE_JUMP * mu:
            return at_own
        floor = max(1, -(-HOLD_FLOOR_STEPS // max(1, self._steps_per_value)))
        return min(at_base, max(at_own, floor))

    def _hold(self, step: int, step_time_s: float) -> int:
        s = self.settings
        hold = s.spike_hold_steps or (self._hold_steps(step, step_time_s) if self._hold_steps else DEFAULT_HOLD_STEPS)
        return max(1, hold)

    def _noise(self) -> tuple[float, float]:
        """``(mu_s, noise_rel)``: the level (s) extrapolated along the baseline's trend over the held-back values,
        a falling one never below the lower quartile of the :data:`RECENT_FLOOR_VALUES` newest accepted values (a warm-up
        that only got faster cannot carry the level to zero: such a warm-up once read ``baseline_s`` 1e-12 and a
        magnitude of 5e10, docs/detection.md); and the relative noise, inflated by one standard error of the scale and floored at
        ``max(noise_floor, MIN_NOISE)`` of the level. After a speedup (since the generation's last report) the relative
        noise is raised towards the noise of the baseline before it, :attr:`_speedup_noise`, as far as the baseline's own
        one-sided upper confidence bound ``sigma / mu * sqrt((n - 1) / chi2_{n-1}(Phi(-SPEEDUP_NOISE_Z)))`` allows
        (:func:`_chi2_lower`): the job getting faster does not make it relatively calmer unless its new steps show it.
        Both are > 0 and finite for positive step times."""
        mu0, sigma = self._base.stats()
        mu = mu0 + self._base.slope * (self._base.lag + 1)
        if self._base.slope < 0.0:  # a falling trend: the level at most down to the recent values' lower quartile
            mu = max(mu, self._recent_low())
        if not mu > 0.0:
            mu = max(mu0, 1e-9)  # only with non-positive step times in the window (bad input)
        n = len(self._base)
        small = 1.0 + SMALL_SAMPLE_C * math.sqrt(1.1 / (2.0 * n))
        if self.serial_noise:
            values = self._base.values()
            if self._s_hi == 0.0 or self._serial is None:  # a rise's own values never raise its bar
                learning = n < self.settings.min_baseline_steps
                self._serial = serial_rho(values, SERIAL_RHO_Z if learning else 0.0)
            small = max(small, serial_noise_factor(values, rho=self._serial))
        noise = sigma * small / mu
        if self._speedup_noise > noise and n >= 2:
            # re-learned after a speedup: the relative noise does not fall because the job got faster, unless the
            # new baseline shows it did (its noise's upper confidence bound is lower). A young baseline of 34 steps
            # that read 11 % on a stretch of chance calm, at a true 16 % (17 % before the speedup), set the
            # reference of a +22 % cusum on a series that only got faster (bench_corpus faster seed 38 run 12)
            ucb = sigma / mu * math.sqrt((n - 1) / _chi2_lower(n - 1, SPEEDUP_NOISE_Z))
            noise = max(noise, min(self._speedup_noise, ucb))
        return mu, max(noise, self.settings.noise_floor, MIN_NOISE)

    def _recent_low(self) -> float:
        """Lower quartile of the newest :data:`RECENT_FLOOR_VALUES` accepted values (0 when none): robust to one
        noisy low step, and above zero for positive step times."""
        k = min(RECENT_FLOOR_VALUES, len(self._recent))
        newest = sorted(self._recent[-1 - i] for i in range(k))
        return newest[len(newest) // 4] if newest else 0.0

    def _learn(self, fs: FinalizedStep, x: float) -> Anomaly | None:
        """Fill the baseline. Once it holds :data:`PROVISIONAL_MIN` values, a step is judged against it as a spike
        step would be: a rise (``spike_min_effect`` and ``spike_z`` over it) or a fall (as far under it: a ratio
        of ``1 / (1 + spike_min_effect)``) is kept out of it. A rise that outlasts the hold is a level change
        while learning: ``step_regression`` with ``pattern "level"`` and ``detail.learning`` true (its magnitude
        the median ratio of the risen steps, on log step time), and learning starts again from the risen steps.
        A fall that outlasts the hold (a start-up level that ended: caches warm, a busy host freed) restarts
        learning from the fallen steps, silently: a change soon after is then judged against the level the job
        runs at, not the start-up one. With :attr:`provisional` (a serving unit's blocks with ``work``) a rise is
        left to :meth:`_provisional_step` alone: a young unit's block ratios wander by tens of percent while its
        load bands form, and the spike rule over the median of its first blocks reported +37 % on a healthy replica
        (bench_corpus serving_dp seed 32 run 13: blocks 0.84-1.13, then 1.195, 1.223) and armed."""
        step = fs.step
        if self.provisional:
            found = self._provisional_step(fs, x)
            if found is not None:
                return found
        if len(self._base) >= PROVISIONAL_MIN:
            mu, noise = self._noise()
            rel = x / mu - 1.0
            z = rel / noise
            hold = self._spike_hold(step, mu, x)
            if self.spikes.is_spike(rel, z) and not self.provisional:
                self._learn_fall.clear()
                if not self._learn_rise:
                    self._learn_since = step
                self._learn_rise.append(x)
                if len(self._learn_rise) > hold:  # alike to an interruption that came back: its own hold
                    hold = self._recurring_hold(self._learn_since, mu, self._learn_rise, hold)
                if len(self._learn_rise) <= hold:
                    return None
                self.counters["relearn_while_learning"] += 1
                return self._risen(fs, list(self._learn_rise), mu, noise, hold)
            if rel <= 1.0 / (1.0 + self.settings.spike_min_effect) - 1.0 and z <= -self.settings.spike_z:
                self._learn_rise.clear()
                self._learn_fall.append(x)
                self._fall_seq.append(x)
                if len(self._learn_fall) <= hold:
                    return None
                self.counters["relearn_while_learning"] += 1
                fallen = list(self._learn_fall)
                # a warm-down with a jump up inside it: the fall below the young baseline came after the jump (a
                # 1.3x change at a stepped warm-down's last block, the fall then restarted learning past it)
                jumped = self._fall_split()
                if jumped is not None:
                    k, mag, noise_k, before_s = jumped
                    return self._fire_split(fs, list(self._fall_seq), k, mag, before_s, noise_k, "warm_up_fall")
                self._relearn()
                for v in fallen:
                    self._base.push(v)
                    self._recent.append(v)
                    self._fall_seq.append(v)
                return None
        self._learn_rise.clear()
        self._learn_fall.clear()
        if self._first_learned is None:
            self._first_learned = step
        if self._level_since is None:
            self._level_since = step
        self._base.push(x)
        self._recent.append(x)
        self._fall_seq.append(x)
        self._recent_steps.append(step)
        if len(self._base) >= self.settings.min_baseline_steps:
            if self._left_pending is not None:
                self._left_level()
            if not self._interim_spikes:  # else it ends with the episode held against it (on_step)
                self._end_interim()
            if not self._settled():
                return self._warm_up_jump(fs)
            change = self._learned_step(fs)
            if change is not None:
                return change
        if len(self._base) >= self.settings.min_baseline_steps and self.drift.reference_s is None:
            self.drift.learned(self._noise()[0], step, len(self._base))
        return None

    def _left_level(self) -> None:
        """The baseline re-learned after a speedup is whole: the level the speedup left (``_left_pending``: the step
        the baseline before it began learning, the steps until the fall, its level in s), against the level learned
        now, is one the job visited and left (:meth:`RecurringInterruptions.left`). Judged on the whole new
        baseline, not the speedup's own run: 2 heavy-tailed dips (0.30 s among 0.50 s steps) fired a speedup whose
        run read the level left 1.65x, and the job's own steps were then held as a return to it."""
        assert self._left_pending is not None
        onset, duration, before_s = self._left_pending
        self._left_pending = None
        mu = self._noise()[0]
        if mu > 0.0:
            self.recurring.left(onset, duration, before_s / mu - 1.0, before_s)

    def _risen(self, fs: FinalizedStep, risen: list[float], mu: float, noise: float, hold: int) -> Anomaly | None:
        """Steps that rose over the young baseline (level ``mu`` s, relative ``noise``) for longer than ``hold`` while
        it learns (``risen``, s, oldest first; :meth:`_learn`). During a warm-up still rising
        (:meth:`_jump_off_warm_up`), a change is measured against the warm-up's line, where the job was heading,
        not the young baseline its first steps made (a 1.15x change during a 0.3 -> 1.0 warm-up read +62 %):
        ``reference "warm_up_line"``; a rise along that line restarts learning (:meth:`_warming`); otherwise the
        level change is reported against the young baseline (``detail.learning`` true, its magnitude the median
        ratio of the risen steps, on log step time)."""
        jumped = self._jump_off_warm_up(risen, noise)
        if jumped is not None:
            k, jump, line_s = jumped
            return self._fire_split(fs, [*self._recent, *risen], k, jump, line_s, noise, "warm_up_line")
        if self._warming(risen):
            self._restart_learning(risen)
            return None
        logs = sorted(math.log(v / mu) for v in risen)
        k = len(logs)
        mag = log_ratio_magnitude(logs[k // 2] if k % 2 else 0.5 * (logs[k // 2 - 1] + logs[k // 2]))
        detail = {"pattern": "level", "learning": True, "first_step": self._learn_since, "baseline_s": mu,
                  "noise": noise, "step_time_s": mu * (1.0 + mag), "steps": k, "hold_steps": hold,
                  "baseline_values": len(self._base), "slowest_ranks": [fs.slowest_rank]}
        a = self._fire(fs.step, mag, detail)
        for v in risen:
            self._base.push(v)
            self._recent.append(v)
            self._fall_seq.append(v)
        return a

    def _jump_off_warm_up(self, risen: list[float], noise: float) -> tuple[int, float, float] | None:
        """While a generation's first learning still rises (its learned steps by the rank test, :data:`SETTLE_Z`,
        within :data:`SETTLE_MAX_STEPS` steps of its start): a change among the learned steps and ``risen`` (s,
        oldest first) that jumped off the warm-up's line, ``(k, jump, line_s)`` as :meth:`_line_jump` (``k`` an
        index into the learned steps followed by ``risen``), or the risen steps' own jump off the learned steps'
        line (:meth:`_off_line`, ``k`` where they begin); else None. A jump inside the learned steps, a few steps
        before the spike screen held the risen ones, pulled the line up with it, so the risen steps continued it and
        the change was learned as the warm-up's end (1.15x at step 30 of a 0.3 -> 1.0 rise over 40 steps, 2 %
        noise: found in 0 of 10 seeds)."""
        if self._settle_restarts is None or not self._young():
            return None
        pre = np.fromiter(self._recent, dtype=np.float64, count=len(self._recent))
        if pre.size < LEARNED_STEP_MIN_AFTER or trend_z(pre) < SETTLE_Z:
            return None
        after = np.asarray(risen, dtype=np.float64)
        found = self._line_jump(np.concatenate([pre, after]))
        if found is not None:
            return found
        off = self._off_line(pre, after, noise)
        return (pre.size, *off) if off is not None else None

    def _provisional_step(self, fs: FinalizedStep, x: float) -> Anomaly | None:
        """While the baseline learns (``provisional`` only): a rise among the values learned since the last
        (re-)learn, ``x`` included. A serving unit's baseline forms after 18 blocks of 60 s; a change in its first
        minutes entered it and was learned as normal (bench_corpus serving classes: 12 of 23 lasting changes lost
        that way, the test formed 21-41 minutes into the run). The values ``y`` (oldest first) are split at every
        k with at least :data:`PROVISIONAL_BEFORE` values before and :data:`PROVISIONAL_AFTER` after (the newest
        always after: the change still lasts); a split is a change when ``min(y[k:]) >= (1 + e) * max(y[:k])``,
        ``e = max(PROVISIONAL_EFFECT, min_effect)``: a rule on the extremes, since 2-5 values give no noise
        estimate; a healthy replica's blocks wander up to about 1.5x within the learning window (bench_corpus
        serving_dp: 0.77-0.9, then 1.16-1.36; 25 % made 3 false arms in 8 runs), so ``e`` is 0.5: a 3x change is
        reported minutes after its onset, a +30 % one is left to the change-point test. The first qualifying split (the earliest change point) is
        reported: ``step_regression`` with ``pattern "level"``, ``detail.learning`` true, ``detail.reference
        "provisional"``, magnitude the ratio of the parts' geometric means (``log_ratio_magnitude``: bounded by
        the values' ratio, > ``e``); learning then starts again from the later part. Falls are never reported.
        Our own rule (an order-statistics split test), stated here so it can be checked."""
        self._prov.append((fs.step, x))
        del self._prov[:-RAMP_WINDOW]  # memory: the newest values at most
        y = [v for _, v in self._prov]
        n = len(y)
        e = max(PROVISIONAL_EFFECT, self.settings.min_effect)
        for k in range(PROVISIONAL_BEFORE, n - PROVISIONAL_AFTER + 1):
            before, after = y[:k], y[k:]
            if min(after) < (1.0 + e) * max(before):
                continue
            lb = sum(math.log(v) for v in before) / k
            la = sum(math.log(v) for v in after) / (n - k)
            mag = log_ratio_magnitude(la - lb)
            level = math.exp(lb)
            detail = {"pattern": "level", "learning": True, "reference": "provisional",
                      "first_step": self._prov[k][0], "baseline_s": level, "noise": MIN_NOISE,
                      "step_time_s": level * (1.0 + mag), "steps": n - k, "baseline_values": k,
                      "threshold": e, "slowest_ranks": [fs.slowest_rank]}
            a = self._fire(fs.step, mag, detail)
            for v in after:
                self._base.push(v)
                self._recent.append(v)
                self._fall_seq.append(v)
            self._prov = [(st, v) for st, v in self._prov[k:]]
            return a
        return None

    def _settled(self) -> bool:
        """At the end of a generation's first learning: is the job past its warm-up? A warm-up that rises (caches
        and allocators filling, a second stream starting) makes the first learned steps lower than the job's level;
        learned as normal, the young baseline then read the settled level as a regression (``bench/bench_corpus.py``,
        ``warmup_up``: 8 false arms in 20 runs at 10-20 % noise, ``pattern "baseline"`` at steps 74-160 and
        ``"cusum"`` at 99-105). The steps learned so far (window and held-back) are a warm-up when a rise from the
        first of them that then stays flat explains them better than a step by :data:`WARMUP_EVIDENCE` noise
        variances (:func:`~profwatch.core.detection.drift.ramp_evidence` on the reversed series: a sudden change
        while learning is a step and is still judged as one) and the flat part's median is above the learned level
        by :data:`EFFECT_Z` standard errors; learning then starts again from the flat part, silently, at most
        :data:`MAX_SETTLE_RESTARTS` times, unless a step on the warm-up's plateau explains them with the values
        earlier restarts dropped (:meth:`_dropped_curve_split`: settled, :meth:`_learned_step` reports it). Returns
        True when settled (or no longer checked)."""
        if self._settle_restarts is None or self._settle_restarts >= MAX_SETTLE_RESTARTS:
            self._settle_restarts = None
            return True
        y = np.fromiter(self._recent, dtype=np.float64, count=len(self._recent))
        mu, noise = self._noise()
        if y.size < 2 * RECENT_FLOOR_VALUES or not mu > 0.0:
            self._settle_restarts = None
            return True
        rel = y / mu - 1.0
        gain, knee, _ = ramp_evidence(-rel[::-1])  # rise-then-flat, reversed and negated: flat-then-rise
        # the flat part, at least the newest RECENT_FLOOR_VALUES (a warm-up still rising at the window's end); the
        # newer half when no rise-then-flat fits at all
        flat = y[min(y.size - 1 - knee, y.size - RECENT_FLOOR_VALUES):] if knee >= 0 else y[y.size // 2:]
        warm = (gain >= WARMUP_EVIDENCE * noise * noise and float(np.median(flat)) / mu - 1.0
                >= EFFECT_Z * noise * math.sqrt(math.pi / (2.0 * flat.size) + 1.0 / y.size))
        if self._young() and self._fall_split() is not None:
            self._settle_restarts = None  # a jump up inside a warm-down: _learned_step reports it
            return True
        if not warm and self._young():
            fell = self._fallen_flat(y, rel, noise)
            if fell is not None:  # a warm-up that fell: the level is its flat end's, not the learned steps'
                self._restart_learning(fell.tolist(), from_recent=True)
                return False
        # still rising by a rank test, and no sudden change explains the rise (that one is _learned_step's to report)
        if (not warm and not (self._young() and trend_z(y) >= SETTLE_Z and self._split(y) is None)) \
                or self._past_prior(flat.tolist()) or self._warm_split(y) is not None:
            # a jump off flat warm-up steps is a change, not the warm-up's end (_learned_step reports it)
            self._settle_restarts = None
            return True
        self._jump = self._line_jump(y)
        if self._jump is None and self._dropped_curve_split(y) is not None:
            self._settle_restarts = None  # a step on the plateau of the whole warm-up: _learned_step reports it
            return True
        if self._jump is None:  # else the jump is reported (_warm_up_jump) and learning starts again after it
            self._restart_learning(flat.tolist(), from_recent=True)
        return False

    @staticmethod
    def _fallen_flat(y: np.ndarray, rel: np.ndarray, noise: float) -> np.ndarray | None:
        """The flat end of a warm-up that fell among a first learning's steps ``y`` (s, oldest first; ``rel`` their
        excess over the learned level, ``noise`` relative), as :meth:`_settled` finds a rising one mirrored: a fall
        from the first of them that then stays flat explains them better than a step by :data:`WARMUP_EVIDENCE`
        noise variances (:func:`~profwatch.core.detection.drift.ramp_evidence` on the reversed series) and the
        flat part (at least the newest :data:`RECENT_FLOOR_VALUES`) is under the learned level by :data:`EFFECT_Z`
        standard errors. A warm-down too gradual for the fall rule of :meth:`_learn` (an 11x exponential fall at
        8 % noise) left the level learned over the fall, 3x the flat end's, and a 3x change 18 steps after the
        fall was learned as normal. None otherwise."""
        gain, knee, _ = ramp_evidence(rel[::-1])  # fall-then-flat, reversed: flat-then-rise
        if knee < 0 or not gain >= WARMUP_EVIDENCE * noise * noise:
            return None
        flat = y[min(y.size - 1 - knee, y.size - RECENT_FLOOR_VALUES):]
        below = 1.0 - float(np.median(flat)) / float(np.median(y))
        return flat if below >= EFFECT_Z * noise * math.sqrt(math.pi / (2.0 * flat.size) + 1.0 / y.size) else None

    def _line_jump(self, y: np.ndarray) -> tuple[int, float, float] | None:
        """Among learned steps ``y`` (s, oldest first) taken for a warm-up, a change during it: ``(k, jump, line_s)``
        for the split whose later part jumps furthest off the earlier part's line, else None. Restarting learning
        from the warm-up's flat part learned such a change as the level the warm-up settled at (1.15x at step 20-50
        of a 40-60 step 0.6 -> 1.0 rise, 3-5 % noise: found in 0-7 of 10 seeds).

        For each split ``k`` (at least :data:`LEARNED_STEP_MIN_AFTER` steps before, :data:`WARM_UP_JUMP_MIN` after),
        the earlier part's Theil-Sen line (Theil 1950, Sen 1968), never below its median, is extrapolated over the
        first ``m <= OFF_LINE_STEPS`` later steps; ``jump`` is their median over it minus 1. It counts when it is at
        least ``min_effect`` (no leniency: a warm-up's own curvature read +8 % off the line of its first steps) and
        :data:`WARM_UP_JUMP_Z` standard errors above 0, in standard errors of the two estimates compared (the median's,
        ``1.2533 s / sqrt(m)``, and the line's at ``h`` steps past its centre, ``s sqrt(1 / k + 12 h^2 / k^3)``,
        least-squares variances). The noise ``s`` is the steps' own, from their successive differences
        (``1.4826 MAD / sqrt(2)``, robust to the rise and to one jump; a baseline's scale over a rising window
        counts the rise as noise: 3 % read 10 %), floored as :meth:`_noise`'s."""
        rel = y / float(np.median(y))
        d = np.diff(rel)
        own = MAD_TO_SIGMA * float(np.median(np.abs(d - np.median(d)))) / math.sqrt(2.0) if d.size else 0.0
        noise = max(own, self.settings.noise_floor, MIN_NOISE)
        best: tuple[int, float, float] | None = None
        for k in range(LEARNED_STEP_MIN_AFTER, y.size - WARM_UP_JUMP_MIN + 1):
            before, after = y[:k], y[k:]
            m = min(OFF_LINE_STEPS, after.size)
            t = np.arange(k, dtype=np.float64)
            slope = theil_sen(before, t)
            icpt = float(np.median(before - slope * t))
            line = np.maximum(icpt + slope * np.arange(k, k + m, dtype=np.float64), float(np.median(before)))
            jump = float(np.median(after[:m] / line)) - 1.0
            h = (k - 1) / 2.0 + (m + 1) / 2.0
            se = noise * math.sqrt(1.2533**2 / m + 1.0 / k + 12.0 * h * h / k**3)
            if jump >= max(WARM_UP_JUMP_Z * se, self.settings.min_effect) and (best is None or jump > best[1]):
                best = (k, jump, float(line[0]))
        return best

    def _warm_up_jump(self, fs: FinalizedStep) -> Anomaly | None:
        """Report the change :meth:`_line_jump` found at the end of a first learning (``step_regression``,
        ``pattern "level"``, ``detail.learning`` true, ``detail.reference "warm_up_line"``: ``baseline_s`` the
        warm-up's line where the change began, the magnitude the later steps' excess over it); learning starts
        again from the later steps. None when none was found."""
        if self._jump is None:
            return None
        k, jump, line_s = self._jump
        self._jump = None
        return self._fire_split(fs, list(self._recent), k, jump, line_s, self._noise()[1], "warm_up_line")

    def _restart_learning(self, values: list[float], from_recent: bool = False) -> None:
        """The job is still warming up: learning starts again from ``values`` (the newest steps), silently; one of
        the :data:`MAX_SETTLE_RESTARTS` of this generation's first learning (counted in ``warmup_restarts``).
        ``from_recent``: ``values`` are the newest learned values themselves (else they follow them). The learned
        values not kept are added to :attr:`_warm_dropped`."""
        recent = list(self._recent)
        self._warm_dropped.extend(recent[:len(recent) - len(values)] if from_recent else recent)
        restarts = (self._settle_restarts or 0) + 1
        self.counters["warmup_restarts"] += 1
        self._relearn()
        self._settle_restarts = restarts
        for v in values:
            self._base.push(v)
            self._recent.append(v)
            self._fall_seq.append(v)

    def _young(self, values_back: int = 0) -> bool:
        """Whether the generation was at most :data:`SETTLE_MAX_STEPS` steps old (steps, not values: blocks of fast
        steps count every step) ``values_back`` values before the newest (0: now): the rank-test and line rules take
        a rise for a warm-up only this early."""
        if self._first_step is None:
            return False
        return self._step_now - max(0, values_back) * self._steps_per_value - self._first_step <= SETTLE_MAX_STEPS

    def _warming(self, risen: list[float]) -> bool:
        """Whether steps that rose over the young baseline for longer than the hold during a generation's first
        learning (``risen``, step times oldest first) continue a warm-up instead of starting a change: restarts are
        left (:data:`MAX_SETTLE_RESTARTS`), the steps learned before them rise by the rank test
        (:func:`~profwatch.core.detection.drift.trend_z` at least :data:`SETTLE_Z`) and the risen steps did not
        jump off those steps' Theil-Sen line (:meth:`_off_line`), and rise-then-flat explains them: a job that
        starts at 0.3x and rises over 60 steps crosses the spike threshold of a baseline learned from its first
        steps (reported as a level change while learning, +40-90 %) without jumping off its own line, while a 3x
        change during the warm-up does jump (found as before)."""
        if (self._settle_restarts is None or self._settle_restarts >= MAX_SETTLE_RESTARTS or not risen
                or not self._young() or self._past_prior(risen)):
            return False
        pre = np.fromiter(self._recent, dtype=np.float64, count=len(self._recent))
        if pre.size < LEARNED_STEP_MIN_AFTER or trend_z(pre) < SETTLE_Z:
            return False
        noise = self._noise()[1]
        if self._off_line(pre, np.asarray(risen, dtype=np.float64), noise) is not None:
            return False  # the risen steps jumped off the warm-up's line
        y = np.concatenate([pre, np.asarray(risen, dtype=np.float64)])
        # a rise that then stays flat explains them as well as a step (a change that entered the young baseline
        # before the spike screen began makes the learned steps rise too, and their line steep)
        return ramp_evidence(-(y / float(np.median(y)) - 1.0)[::-1])[0] >= WARMUP_EVIDENCE * noise * noise

    def _off_line(self, before: np.ndarray, after: np.ndarray, noise: float) -> tuple[float, float] | None:
        """Whether ``after`` (step times, oldest first, following ``before``) jumped off the line of a warm-up still
        rising in ``before``: ``(jump, line_s)`` when the median of ``after``'s first :data:`OFF_LINE_STEPS` over
        ``before``'s Theil-Sen line (Theil 1950, Sen 1968), extrapolated over them and never below ``before``'s
        median, exceeds 1 by ``min_effect`` (a smaller change is never reported anyway) plus :data:`EFFECT_Z`
        standard errors of that median (``noise`` relative; a median's error ~1.25 noise / sqrt(m)), at most
        ``spike_min_effect``; ``jump`` is that relative excess, ``line_s`` the line where ``after`` begins; else
        None. A warm-up that rises and then stays flat falls under its own line; a slowdown during the warm-up jumps
        above it (a bound of ``spike_min_effect`` alone let a 1.2x slowdown during a 0.6 -> 1.0 warm-up at 3 % noise
        be learned as the warm-up's end in 8 of 10 seeds)."""
        m = min(OFF_LINE_STEPS, after.size)
        if before.size < 3 or m < 1:
            return None
        t = np.arange(before.size, dtype=np.float64)
        slope = theil_sen(before, t)
        icpt = float(np.median(before - slope * t))
        line = icpt + slope * np.arange(before.size, before.size + m, dtype=np.float64)
        line = np.maximum(line, float(np.median(before)))  # never below the learned level (a line that fell)
        jump = float(np.median(after[:m] / line)) - 1.0
        bound = min(self.settings.spike_min_effect,
                    self.settings.min_effect + EFFECT_Z * 1.2533 * noise / math.sqrt(m))
        return (jump, float(line[0])) if jump >= bound else None

    def _learned_step(self, fs: FinalizedStep) -> Anomaly | None:
        """At the end of a generation's first learning (after :meth:`_settled`): a sudden change among the steps
        learned so far. A change of 10-30 % at 5-20 % noise is no spike step, so it entered the young baseline, which
        then learned the changed level as normal (``bench/bench_corpus.py``, class ``noisy``: +30 % from step 22 at 9 % noise, never
        reported). The best split of the learned steps into two levels (least squares on ``x / level - 1``) is a
        change when it explains them better than one level by :data:`LEARNED_STEP_EVIDENCE` noise variances (the
        pooled noise of the two parts, floored as :meth:`_noise`'s), each part holds at least
        :data:`LEARNED_STEP_MIN_AFTER` steps, it rises by ``min_effect`` within :data:`EFFECT_Z` standard errors,
        a ramp does not explain them as well (a drift is the drift detector's) and the earlier part does not rise
        along its own steps (:meth:`_rising`: a warm-up still rising, which :meth:`_settled` did not tell from a
        step at high noise). Then ``step_regression`` with
        ``pattern "level"``, ``detail.learning`` true and ``detail.reference "learned_steps"``, its magnitude the
        ratio of the parts' geometric means, and learning starts again from the later part."""
        if self._checked_learned:
            return None
        self._checked_learned = True
        y = np.fromiter(self._recent, dtype=np.float64, count=len(self._recent))
        split = self._split(y)
        reference = "learned_steps"
        if split is None:
            split, reference = self._prior_split(y), "previous_generation"
        if split is None:
            split, reference = self._warm_split(y), "warm_up_steps"
        first: int | None = None
        if split is None:
            keep = self._unscreened(y)
            if keep is not None:  # interruptions the spike screen could not yet hold out hide no change before them
                split = self._warm_split(y[keep])
                if split is not None:
                    kept = np.flatnonzero(keep)
                    steps = self._recent_steps
                    first = steps[int(kept[split[0]])] if len(steps) == y.size < RAMP_WINDOW else None
                    y = y[keep]
        if split is None:
            split, reference = self._curve_split(y), "warm_up_curve"
        if split is None:
            near = self._curve_near
            split = self._dropped_curve_split(y)
            if split is not None:
                y = np.concatenate([np.asarray(self._warm_dropped, dtype=np.float64), y])
            self._curve_near = near  # the recheck (_curve_recheck_step) judges the learned steps alone
        if split is None:
            split, reference = self._fall_split(), "warm_up_fall"
            if split is not None:  # an index into the learned steps with the falls held out while learning
                y = np.fromiter(self._fall_seq, dtype=np.float64, count=len(self._fall_seq))
        self.prior = None
        if split is None:
            if self._curve_near >= CURVE_RECHECK_NEAR:  # the stepped curve was close: more values after the step
                self._curve_recheck = CURVE_RECHECK_VALUES
            return None
        k, mag, noise, before = split
        return self._fire_split(fs, y.tolist(), k, mag, before, noise, reference, first)

    def _curve_recheck_step(self, fs: FinalizedStep, x: float) -> Anomaly | None:
        """One of the :data:`CURVE_RECHECK_VALUES` values after a first learning whose stepped warm-up curve
        (:meth:`_curve_split`) came within :data:`CURVE_RECHECK_NEAR` of its evidence: the learned steps with ``x``
        (s) are tried again under every rule of :meth:`_curve_split` (its evidence unchanged), and a change is
        reported as there (``reference "warm_up_curve"``, ``first_step`` counted back at the values' steps each). The
        values after the step are what the evidence grows with: ``bench/bench_corpus.py`` seed 35, ``warmup_up`` run
        6 (1.3x at step 66, 18 ms steps in blocks of 4) read 24.1 noise variances against the 25 needed at the end
        of the learning, and was learned as normal."""
        self._curve_recheck -= 1
        y = np.asarray([*self._recent, x], dtype=np.float64)
        split = self._curve_split(y)
        if split is None:
            return None
        self._curve_recheck = 0
        k, mag, noise, before = split
        first = fs.step - (y.size - 1 - k) * self._steps_per_value
        return self._fire_split(fs, y.tolist(), k, mag, before, noise, "warm_up_curve", first)

    def _unscreened(self, y: np.ndarray) -> np.ndarray | None:
        """The learned steps ``y`` (s, oldest first) that are no interruption: a mask keeping all but the runs of at
        most :data:`SCREEN_HALF_WINDOW` values each at least ``1 + spike_min_effect`` times the median of the
        ``2 * SCREEN_HALF_WINDOW + 1`` values around it (fewer at the ends) and ``spike_z`` noise deviations over it
        (the noise: ``1.4826 MAD / sqrt(2)`` of successive differences of their logs, floored as :meth:`_noise`'s):
        the spike screen of :meth:`_learn` starts only once the baseline holds :data:`PROVISIONAL_MIN` values, so a
        checkpoint's 1-3 steps at 3-8x before it entered the learned steps, and a change at the first learned steps
        was never split from the warm-up steps (1.3x and 3x from steps 12-13 with such an interruption at steps
        22-30: 0 of 24 found). None when nothing is screened out. A running median of 9 values follows a step
        change (a level lasting 5 values or more is no spike) and stays at the level under a run of 4 or fewer.
        Pure. Tukey's running median (Tukey, "Exploratory Data Analysis", 1977), as a spike screen."""
        n = y.size
        if n < 2 * SCREEN_HALF_WINDOW + 1 or not np.all(y > 0.0):
            return None
        logs = np.log(y)
        d = np.diff(logs)
        noise = max(MAD_TO_SIGMA * float(np.median(np.abs(d - np.median(d)))) / math.sqrt(2.0), self.settings.noise_floor,
                    MIN_NOISE)
        h = SCREEN_HALF_WINDOW
        med = np.asarray([float(np.median(logs[max(0, i - h):i + h + 1])) for i in range(n)])
        rel = np.exp(logs - med) - 1.0
        spike = (rel >= self.settings.spike_min_effect) & (rel / noise >= self.settings.spike_z)
        if not spike.any():
            return None
        keep = ~spike
        i = 0
        while i < n:  # a run longer than the window's half is a level, not an interruption: kept
            if spike[i]:
                j = i
                while j < n and spike[j]:
                    j += 1
                if j - i > h:
                    keep[i:j] = True
                i = j
            else:
                i += 1
        return keep if not keep.all() else None

    def _warm_split(self, y: np.ndarray) -> tuple[int, float, float, float] | None:
        """A generation's first learned steps ``y`` (s, oldest first) split against the steps of its warm-up before
        them (excluded from detection, the newest :data:`PRIOR_WARM_VALUES`, at least :data:`WARM_UP_BEFORE_MIN`):
        the test of :meth:`_split` on the warm-up steps followed by ``y``, its split at or after the first learned
        step, so a change a few steps into the learning has a level before it. Every rule of the split applies to
        the warm-up steps as to measured steps: the part before the split must not rise (by the least-squares slope
        and the rank test) and the split must explain the steps better than a warm-up curve rising from the first
        warm-up step (:meth:`_warm_up_curve`), so a flat warm-up followed by a jump is a change and a rising one
        stays a warm-up. Only from the generation's start, without a previous generation's level, and when the
        first learned step is the first measured one (the learned steps begin where the warm-up's end) and none
        left the window: steps held out later (an unflagged interruption held as a spike while learning) do not
        matter, and a value may be a block of steps (requiring every step since the first measured one to be a
        learned value lost a 3x change from step 12 after one 3x interruption at step 41, ``bench/bench_corpus.py``
        seed 35, ``interrupts`` run 12). Returns
        ``(k, magnitude, noise, before_s)`` as :meth:`_split` (``k`` an index into ``y``, 0 = a change from the
        first learned step), else None. Pure."""
        warm = self._warm_before()
        if warm is None:
            return None
        found = self._split(np.concatenate([warm, y]), first_k=warm.size)
        if found is None:
            return None
        k, mag, noise, before = found
        return k - len(warm), mag, noise, before

    def _curve_split(self, y: np.ndarray) -> tuple[int, float, float, float] | None:
        """A generation's first learned steps ``y`` (s, oldest first) that a warm-up curve with a level step on its
        plateau explains (:func:`~profwatch.core.detection.drift.warm_up_step`: a line rising or falling from the
        first learned step to a knee, flat from there, a step from ``k >= knee`` on): the steps of a warm-up that
        only just ended give :meth:`_split` no flat level before a change, so a 2x step 2 steps after a 4.26x
        warm-down was learned as normal (tests/unit/test_regression.py). A change when the step explains the steps
        better than the curve alone by :data:`LEARNED_STEP_EVIDENCE` noise variances (the stepped curve's residual
        noise, five parameters, floored as :meth:`_noise`'s), rises by ``min_effect`` plus :data:`EFFECT_Z` standard
        errors over the plateau, holds :data:`LEARNED_STEP_MIN_AFTER` steps, and, after a curve that rose (a warm-up
        that saturates continues upwards, as a step would), follows at least :data:`LEARNED_STEP_MIN_BEFORE`
        plateau steps that do not rise by the rank test (:data:`EARLIER_RISE_Z`). Within
        :data:`SETTLE_MAX_STEPS` of the generation's start only. The line spans at least
        :data:`LEARNED_STEP_MIN_BEFORE` steps, and the later steps' median is over the median of the
        :data:`CURVE_LAST_STEPS` steps just before the step by ``min_effect`` (on log step time) as measured: a
        curve's line through a few first steps, one of them a leftover slow one, put a fitted plateau 48 % under
        the flat steps after it and read +108 % (tests/unit/test_regression.py, a 20x warm-down). Returns ``(k, magnitude, noise, before_s)`` as
        :meth:`_split` (``before_s`` the plateau's level; the magnitude the later steps' geometric mean over it, on
        log step time), else None. Pure."""
        self._curve_near = 0.0
        if y.size < 2 * LEARNED_STEP_MIN_AFTER or not np.all(y > 0.0):
            return None
        med = float(np.median(y))
        fit = warm_up_step(y / med - 1.0, LEARNED_STEP_MIN_AFTER, LEARNED_STEP_MIN_BEFORE - 1)
        if fit is None or not fit.step > 0.0 or not 1.0 + fit.plateau > 0.0:
            return None
        # the warm-up must have ended young (its knee within SETTLE_MAX_STEPS steps of the generation's start), not
        # the learning: 46 blocks of 4 fast steps span 184 steps, so a block job's first learning never was young
        knee_step = self._step_now - (y.size - 1 - fit.knee) * self._steps_per_value
        if self._first_step is None or knee_step - self._first_step > SETTLE_MAX_STEPS:
            return None
        last = y[max(0, fit.k - CURVE_LAST_STEPS):fit.k]  # the steps just before, as measured (not the fit's line)
        if math.log(float(np.median(y[fit.k:])) / float(np.median(last))) < self.settings.min_effect:
            return None
        level = 1.0 + fit.plateau
        noise = max(math.sqrt(fit.sse / max(1, y.size - 5)), self.settings.noise_floor, MIN_NOISE)
        self._curve_near = fit.gain / (LEARNED_STEP_EVIDENCE * noise * noise)
        mag = log_ratio_magnitude(float(np.log(y[fit.k:] / med).mean()) - math.log(level))
        se = noise * fit.step_se / level
        if (fit.gain < LEARNED_STEP_EVIDENCE * noise * noise or mag - EFFECT_Z * se < self.settings.min_effect):
            return None
        if fit.slope > 0.0 and (fit.k - fit.knee < LEARNED_STEP_MIN_BEFORE
                                or trend_z(y[fit.knee:fit.k]) >= EARLIER_RISE_Z):
            return None
        return fit.k, mag, noise, med * level

    def _dropped_curve_split(self, y: np.ndarray) -> tuple[int, float, float, float] | None:
        """:meth:`_curve_split` on the learned values this generation's warm-up restarts dropped
        (:attr:`_warm_dropped`) followed by the learned steps ``y`` (s, oldest first), when a restart dropped some:
        ``k`` an index into that series. A restart keeps only the newest steps of a warm-up still rising, so a
        change on its plateau soon after was judged with only the warm-up's tail before it, which a slower rise
        explains about as well as a step: a 1.3x change 16 steps after a 0.3 -> 1.0x warm-up of 40 steps ended was
        learned as the warm-up's end (``bench/bench_corpus.py`` seed 39, ``warmup_up`` run 15; the stepped curve
        gained 10 noise variances of the 25 needed on the kept steps, 34 with the rise before them;
        tests/unit/test_warm_up_changes.py). None when nothing was dropped. Pure but for
        :attr:`_curve_near`."""
        if not self._warm_dropped:
            return None
        return self._curve_split(np.concatenate([np.asarray(self._warm_dropped, dtype=np.float64), y]))

    def _fall_split(self) -> tuple[int, float, float, float] | None:
        """A jump up inside a warm-up that falls: a generation's first learned steps (s, oldest first, with the steps
        :meth:`_learn` held out as a fall below the young baseline: :attr:`_fall_seq`; a stepped warm-down's last
        block fell under it and the jump back up after it was learned as flat) after its warm-up steps (excluded from detection, the newest :data:`PRIOR_WARM_VALUES`), fitted on log step time by
        one non-increasing curve and by two with a jump up between them (:func:`~profwatch.core.detection.drift.
        rise_on_fall`, isotonic regression: any falling shape, linear, exponential or stepped). A slowdown during a
        warm-down leaves no flat level before it (:meth:`_split`) and no plateau (:meth:`_curve_split`), so it was
        learned as part of the fall (1.3x 2-30 steps into a 2x -> 1x fall: 20 of 24 lost). A change when the jump is
        at or after the first learned step with :data:`LEARNED_STEP_MIN_AFTER` steps after it, the median of the series'
        last :data:`LEARNED_STEP_MIN_AFTER` steps is under that of its first as many by ``max(FALL_JUMP_MIN_FALL,
        min_effect)`` plus :data:`EFFECT_Z` standard errors of the two medians (on log step time: the job ends
        faster than it began, a warm-down; a flat level's best split is :meth:`_split`'s), the two curves beat one by :data:`FALL_JUMP_EVIDENCE` noise
        variances, the fitted jump exceeds ``log(1 + min_effect)`` by :data:`EFFECT_Z` standard errors of the two
        fitted blocks it joins, and the median of the :data:`FALL_JUMP_SIDE_STEPS` steps after it is over that of
        as many steps before it by ``min_effect`` plus :data:`EFFECT_Z` standard errors of the two medians, as measured
        (a fitted block of one chance low step read a jump of +111 % on a healthy warm-down at 16 % noise). The noise is the steps' own, from successive differences of
        their logs: the larger of ``1.4826 MAD / sqrt(2)`` and their root mean square over ``sqrt(2)`` without the
        largest (the jump's), floored as :meth:`_noise`'s; above :data:`FALL_JUMP_NOISE_MAX` nothing is judged. Within :data:`SETTLE_MAX_STEPS` of the generation's start only. Returns
        ``(k, magnitude, noise, before_s)`` as :meth:`_split` (``k`` an index into :attr:`_fall_seq`, ``before_s`` the fall's
        fitted level just before the jump, the magnitude the fitted jump as a ratio on log step time), else None.
        Pure. Our own rule (a likelihood-ratio split of order-restricted fits), stated here so it can be checked."""
        y = np.fromiter(self._fall_seq, dtype=np.float64, count=len(self._fall_seq))
        if not self._young() or y.size < LEARNED_STEP_MIN_AFTER + 1 or not np.all(y > 0.0):
            return None
        warm = np.asarray([v for v in self._warm_values if v > 0.0], dtype=np.float64)
        logs = np.log(np.concatenate([warm, y]))
        if not np.all(np.isfinite(logs)):
            return None
        d = np.diff(logs)
        dev = np.sort(np.abs(d - np.median(d)))
        own = MAD_TO_SIGMA * float(dev[dev.size // 2]) / math.sqrt(2.0)
        # the plain deviation without the largest difference (the jump): the MAD alone read 7 % on a stepped
        # warm-down at 14 % noise, and its chance jumps then beat one curve by 42 "variances"
        plain = math.sqrt(float(np.mean(dev[:-1] ** 2)) / 2.0) if dev.size > 1 else own
        noise = max(own, plain, self.settings.noise_floor, MIN_NOISE)
        if noise > FALL_JUMP_NOISE_MAX:
            return None
        w = warm.size
        found = rise_on_fall(logs, max(w, 2), logs.size - LEARNED_STEP_MIN_AFTER)
        if found is None:
            return None
        need = math.log1p(self.settings.min_effect)
        se = noise * math.sqrt(1.0 / found.n_before + 1.0 / found.n_after)
        side = FALL_JUMP_SIDE_STEPS
        last = logs[max(0, found.k - side):found.k]
        first = logs[found.k:found.k + side]
        measured = float(np.median(first) - np.median(last))
        m = LEARNED_STEP_MIN_AFTER  # the series ends lower than it began: a warm-down, not a flat level's noise
        fell = float(np.median(logs[:m]) - np.median(logs[-m:]))
        if (fell < max(FALL_JUMP_MIN_FALL, need) + EFFECT_Z * MEDIAN_SE * noise * math.sqrt(2.0 / m)
                or found.gain < FALL_JUMP_EVIDENCE * noise * noise
                or found.jump - EFFECT_Z * se < need
                or measured < need + EFFECT_Z * MEDIAN_SE * noise * math.sqrt(1.0 / last.size + 1.0 / first.size)):
            return None
        return found.k - w, log_ratio_magnitude(found.jump), noise, math.exp(found.before)

    def _past_prior(self, values: list[float]) -> bool:
        """Whether ``values`` (s) rose past the previous generation's level (:attr:`prior`) by ``min_effect`` (their
        median) after a start at it (the generation's first :data:`PRIOR_CONFIRM_VALUES` values agree with it as in
        :meth:`_prior_split`): no warm-up then, a change (a warm-up rises to the level the job ran at; 1.3x 5
        values into a requeued generation was taken for a warm-up's end and learned, 7 of 20 seeds at 7.7 %
        noise). False without a prior or before those values."""
        if self.prior is None or not values or len(self._first_values) < PRIOR_CONFIRM_VALUES:
            return False
        level = self.prior[0]
        noise = self._noise()[1] if len(self._base) else MIN_NOISE
        agree = abs(sum(math.log(v) for v in self._first_values) / len(self._first_values) - math.log(level))
        if agree > max(0.5 * self.settings.min_effect, PRIOR_AGREE_Z * noise / math.sqrt(len(self._first_values))):
            return False
        return float(np.median(values)) >= level * (1.0 + self.settings.min_effect)

    def _prior_split(self, y: np.ndarray) -> tuple[int, float, float, float] | None:
        """A requeued generation's first learned steps ``y`` (s, oldest first) against the previous generation's
        level (:attr:`prior`): the test of :meth:`_split` on ``y`` preceded by :data:`PRIOR_VALUES` values at that
        level, so a change fewer than :data:`LEARNED_STEP_MIN_AFTER` steps into the learning still has a level
        before it. A split after at least :data:`PRIOR_CONFIRM_VALUES` of the generation's own values counts only
        when those values agree with the previous level (their geometric mean within ``max(min_effect / 2,``
        :data:`PRIOR_AGREE_Z` ``standard errors)`` of it: the new shape runs as the old one did, whatever its world
        size); a split before them (the generation slower from its start) only for the same world size and a
        magnitude of at least :data:`PRIOR_MARGIN`. Returns ``(k, magnitude, noise, before_s)`` as :meth:`_split`
        (``k`` an index into ``y``, ``before_s`` the previous level), else None. Pure."""
        if self.prior is None:
            return None
        level, same_shape = self.prior
        if not (level > 0.0 and math.isfinite(level)) or y.size < LEARNED_STEP_MIN_AFTER:
            return None
        found = self._split(np.concatenate([np.full(PRIOR_VALUES, level), y]), pseudo=PRIOR_VALUES)
        if found is None:
            return None
        k, mag, noise, _ = found
        own = k - PRIOR_VALUES
        if own < PRIOR_CONFIRM_VALUES:
            if self._warm_agrees(y[:own], level, noise):
                return own, mag, noise, level
            if not same_shape or mag < max(PRIOR_MARGIN, self.settings.min_effect):
                return None
            return 0, mag, noise, level
        agree = abs(float(np.log(y[:own]).mean()) - math.log(level))
        if agree > max(0.5 * self.settings.min_effect, PRIOR_AGREE_Z * noise / math.sqrt(own)):
            return None  # the new generation's own first steps are not at the previous level: not comparable
        return own, mag, noise, level

    def _warm_agrees(self, own: np.ndarray, level: float, noise: float) -> bool:
        """Whether the generation's warm-up steps (the newest :data:`PRIOR_WARM_VALUES`, excluded from detection)
        with ``own`` (its measured steps before a change, s) show it started at the previous generation's
        ``level`` (s): at least :data:`PRIOR_CONFIRM_VALUES` of them, one from the warm-up at least, and the median of
        their log step times within ``max(min_effect / 2,`` :data:`PRIOR_AGREE_Z` ``* 1.2533 * noise / sqrt(n))`` of its
        log (the median: a warm-up's first steps may still be slow; its standard error is ``sqrt(pi / 2)`` times the
        mean's on Gaussian noise), and so the median of their older and of their newer half each (``n`` the half's
        size): a warm-up rising through the old level on a slope had its median there and no step at it. A warm-up runs at the new shape's step time, so
        steps at the old level there are evidence of it whatever the world size; a slower warm-up (compilation, a
        new shape's other step time) gives none. ``noise``: relative, of the learned steps."""
        warm = list(self._warm_values)
        n = len(warm) + own.size
        if not warm or n < PRIOR_CONFIRM_VALUES:
            return False
        logs = np.log(np.asarray([*warm, *own.tolist()], dtype=np.float64))
        half = n // 2
        for part in (logs, logs[:half], logs[half:]):  # at the level throughout, not passing it on a slope
            off = abs(float(np.median(part)) - math.log(level))
            if off > max(0.5 * self.settings.min_effect, PRIOR_AGREE_Z * MEDIAN_SE * noise / math.sqrt(part.size)):
                return False
        return True

    def _fire_split(self, fs: FinalizedStep, y: list[float], k: int, magnitude: float, before_s: float,
                    noise: float, reference: str, first_step: int | None = None) -> Anomaly:
        """Report a change found while learning at ``y[k]`` (``y``: the learned steps, oldest first; ``before_s`` the
        level before it, s) as a ``pattern "level"`` report with ``reference``, then learn again from ``y[k:]``.
        ``first_step``: the step of ``y[k]`` where the learned values' steps are known (:attr:`_recent_steps`), else
        counted back from ``fs`` (one step a value)."""
        after = y[k:]
        steps = self._recent_steps  # the learned values' own steps when y is they (held-out steps between them)
        first = steps[k] if len(steps) == len(y) == len(self._recent) < RAMP_WINDOW else fs.step - (len(y) - 1 - k)
        if first_step is not None:  # the caller's (steps were screened out of ``y``)
            first = first_step
        detail = {"pattern": "level", "learning": True, "reference": reference,
                  "first_step": first, "baseline_s": before_s, "noise": noise,
                  "step_time_s": before_s * (1.0 + magnitude), "steps": len(after), "baseline_values": k,
                  "slowest_ranks": [fs.slowest_rank]}
        a = self._fire(fs.step, magnitude, detail)
        for v in after:
            self._base.push(v)
            self._recent.append(v)
            self._fall_seq.append(v)
        return a

    def _split(self, y: np.ndarray, pseudo: int = 0,
               first_k: int = 0) -> tuple[int, float, float, float] | None:
        """The test of :meth:`_learned_step` on ``y`` (step times, oldest first): ``(k, magnitude, noise,
        before_s)`` when the best split into ``y[:k]`` and ``y[k:]`` is a sudden change (the criteria there), else
        None. ``pseudo``: the first values of ``y`` are a reference level, not measured steps (:meth:`_prior_split`):
        they carry no noise (not counted in its degrees of freedom) and no trend (the earlier part's rise is
        tested on its measured steps). ``first_k``: the first values of ``y`` are warm-up steps
        (:meth:`_warm_split`), measured but never the changed level: the split is at ``first_k`` or later. Pure:
        nothing is learned or reported."""
        n = y.size
        if n < 2 * LEARNED_STEP_MIN_AFTER or not np.all(y > 0.0):
            return None
        mu = float(np.median(y))
        rel = y / mu - 1.0
        c1, c2 = np.cumsum(rel), np.cumsum(rel * rel)
        left = np.arange(1, n)
        sse = c2[:-1] - c1[:-1] ** 2 / left + (c2[-1] - c2[:-1]) - (c1[-1] - c1[:-1]) ** 2 / (n - left)
        sse[n - LEARNED_STEP_MIN_AFTER:] = np.inf  # a few high last steps are a spike, or not yet a level
        # a few low first steps are a short warm-up as often as a change (pseudo-values: a level, never short)
        # after a restart, the first values follow a warm-up's end or a change just reported: its tail, not a level;
        # a requeued generation's few first steps are judged against the previous level (_prior_split)
        short = (LEARNED_STEP_MIN_BEFORE if self._from_start and not pseudo and self.prior is None
                 else LEARNED_STEP_MIN_AFTER)
        sse[:max(short, first_k) - 1] = np.inf
        k = int(np.argmin(sse)) + 1
        sse_flat = float(c2[-1] - c1[-1] ** 2 / n)
        sse_k = max(0.0, float(sse[k - 1]))  # cumulative sums may cancel below 0 on a noiseless series
        noise = max(math.sqrt(sse_k / max(1, n - pseudo - 2)), self.settings.noise_floor, MIN_NOISE)
        logs = np.log(y)
        mag = log_ratio_magnitude(float(logs[k:].mean() - logs[:k].mean()))
        se = noise * math.sqrt(1.0 / k + 1.0 / (n - k))
        # few steps before, or warm-up steps before (a warm-up's level, not the job's): be sure
        lenient = -EFFECT_Z * se if k < LEARNED_STEP_MIN_AFTER or first_k else EFFECT_Z * se
        if (sse_flat - sse_k < LEARNED_STEP_EVIDENCE * noise * noise or mag <= 0.0
                or mag + lenient < self.settings.min_effect
                or ramp_evidence(rel)[0] >= RAMP_EVIDENCE * noise * noise or self._rising(rel[pseudo:k], noise)
                or trend_z(y[pseudo:k]) >= EARLIER_RISE_Z):  # the earlier part rises by the rank test: a warm-up
            return None
        if not pseudo and not first_k and k < LEARNED_STEP_MIN_AFTER and self._short_part_rises(y, k):
            return None
        # young at the split, not now: a block job's first learning spans more steps than a warm-up may last
        if not pseudo and self._young(n - 1 - k) and self._warm_up_curve(rel, sse_k, noise, k,
                                                                WARM_UP_STEPS_EVIDENCE if first_k else None,
                                                                (max(short, first_k), n - LEARNED_STEP_MIN_AFTER)):
            return None
        return k, mag, noise, float(math.exp(logs[:k].mean()))

    def _short_part_rises(self, y: np.ndarray, k: int) -> bool:
        """Whether the few (fewer than :data:`LEARNED_STEP_MIN_AFTER`) first learned steps ``y[:k]`` before a split
        of a generation's first learned steps ``y`` (s, oldest first) rise with the warm-up steps just before them
        (excluded from detection, the newest :data:`PRIOR_WARM_VALUES`, at least :data:`WARM_UP_BEFORE_MIN`) by
        the rank test (:func:`~profwatch.core.detection.drift.trend_z` at least :data:`EARLIER_RISE_Z`): the rule
        of :meth:`_split` that the part before a change is a level, not a rise, applied where 5-7 steps alone
        cannot show a rise (the same steps and conditions as :meth:`_warm_split`: from the generation's start,
        without a previous generation's level, the learned steps beginning where the warm-up's end). A warm-up
        rising 0.55 -> 1.0x over some 17 steps at 8 % noise left 6 learned steps at 0.83x before the rest at 1.0x:
        split there and reported as +24 % (``bench/bench_corpus.py --healthy-hours``, seed 32 ``warmup_up`` healthy
        run 20; tests/unit/test_warm_up_changes.py). False when those steps are not available. Pure."""
        warm = self._warm_before()
        if warm is None or y.size != len(self._recent):
            return False
        return trend_z(np.concatenate([warm, y[:k]])) >= EARLIER_RISE_Z

    def _warm_before(self) -> np.ndarray | None:
        """The warm-up steps just before a generation's first learned steps (s, oldest first: the newest
        :data:`PRIOR_WARM_VALUES` excluded from detection), when :meth:`_warm_split` and :meth:`_short_part_rises`
        may judge the learned steps with them: at least :data:`WARM_UP_BEFORE_MIN` steps in at least
        :data:`WARM_UP_BEFORE_VALUES` values, from the job's start,
        without a previous generation's level, the learned steps beginning where the warm-up's end (the first not
        held out, none dropped) and still fewer than ``RAMP_WINDOW``. None otherwise. Pure."""
        warm = self._warm_values
        # counted in steps: a value may be a block (fast steps), and 4 blocks of 3 warm-up steps showed the rise
        if (len(warm) < WARM_UP_BEFORE_VALUES or len(warm) * self._steps_per_value < WARM_UP_BEFORE_MIN
                or not self._from_start or self.prior is not None):
            return None
        if self._first_step is None or self._first_learned != self._first_step or len(self._recent) >= RAMP_WINDOW:
            return None  # the learned steps do not begin where the warm-up's end (the first held out, or dropped)
        return np.asarray(list(warm), dtype=np.float64)

    @staticmethod
    def _warm_up_curve(rel: np.ndarray, sse_step: float, noise: float, k: int, need: float | None = None,
                       splits: tuple[int, int] | None = None) -> bool:
        """Whether a warm-up curve (:func:`~profwatch.core.detection.drift.warm_up_sse`: a straight rise from the
        first learned step, flat from its knee on, or one straight line) explains the learned steps ``rel``
        (relative to their median, oldest first) about as well as their best two-level split (residual sum
        ``sse_step``): the split must beat it by :data:`WARM_UP_SHAPE_EVIDENCE` noise variances (``noise``
        relative), or by ``need`` when given, and, when the split must win (``need > 0``) and ``splits`` (the
        first and last split index tried) is given, by more than the curve itself lets a split win by chance: the
        :data:`WARM_UP_NULL_QUANTILE` of that gain over :data:`WARM_UP_NULL_REPS` series simulated from the
        fitted curve (:func:`~profwatch.core.detection.drift.warm_up_split_null`). Both models have three
        parameters, so their residual sums compare directly; but each is the best of tens of break points, and on a
        rise of one or two noise deviations the best split beat the best curve by 3-12 noise variances in 11 of 160
        simulated warm-ups at 10-20 % noise (a false ``learned_steps`` report; ``bench/bench_corpus.py`` healthy
        ``warmup_up`` runs at 18.8-19.3 % noise, +40-46 % at step 56)."""
        sse_warm, _ = warm_up_sse(rel)
        if need is None:
            need = WARM_UP_SHAPE_EVIDENCE if k >= LEARNED_STEP_MIN_AFTER else -WARM_UP_SHORT_EVIDENCE
        gain = sse_warm - sse_step
        if gain < need * noise * noise:
            return True
        if need <= 0.0 or splits is None:
            return False
        return gain < warm_up_split_null(rel, splits[0], splits[1], WARM_UP_NULL_REPS, WARM_UP_NULL_QUANTILE)

    @staticmethod
    def _rising(rel: np.ndarray, noise: float) -> bool:
        """Whether ``rel`` (the earlier part of a split of the first learned steps) rises along its own steps by
        :data:`EFFECT_Z` standard errors of a least-squares slope: a warm-up still rising, not the flat level
        before a sudden change."""
        n = rel.size
        if n < 3:
            return False
        pos = np.arange(n, dtype=np.float64) - (n - 1) / 2.0
        slope = float(pos @ rel) / float(pos @ pos)
        return slope >= EFFECT_Z * noise / math.sqrt(float(pos @ pos))

    def _new_level(self, fs: FinalizedStep, new: NewLevel) -> Anomaly:
        """A level report's excursion ended on a level ``min_effect`` or more over the one before it (a change that
        started during or right after it, which the baseline re-learned after the report would take for the job's
        level): ``step_regression`` with ``pattern "level"``, ``detail.reference "before_interruption"``, the
        level before as ``baseline_s`` and the median of the steps since as ``step_time_s``. The baseline already
        learns at that level: nothing is re-learned."""
        self.counters["regressions"] += 1
        detail = {"pattern": "level", "reference": "before_interruption", "first_step": new.first_step,
                  "baseline_s": new.before_s, "step_time_s": new.before_s * (1.0 + new.level), "steps": new.steps,
                  "slowest_ranks": [fs.slowest_rank]}
        return Anomaly("step_regression", self.job_id, fs.step, (), new.level, detail)

    def _recurring_hold(self, onset: int, mu: float, values: list[float], hold: int) -> int:
        """The hold of risen ``values`` (s) held since ``onset`` against a level ``mu`` (s) while the baseline
        (re-)learns: longer when their median excess is alike to an interruption that came back
        (:meth:`RecurringInterruptions.hold`)."""
        rels = sorted(v / mu - 1.0 for v in values)
        level = rels[len(rels) // 2]
        return self.recurring.hold(onset, level, hold, self._steps_per_value, mu * (1.0 + max(level, 0.0)))

    def _spike_event(self, step: int, ep: SpikeEpisode, mu: float, hold: int, out: list[Anomaly]) -> None:
        """A spike episode ended: ``step_spike`` (``pattern "transient"``; ``"recurring"`` when it outlasted the
        hold and ended within the longer one an alike earlier interruption gave it, with that evidence in
        ``detail.recurring``, and is remembered as one more occurrence); at most one event per
        ``spike_event_gap_steps``, the others counted in the next; the first recognised recurrence is always
        reported (it says the job's pattern was learned)."""
        extra: dict[str, Any] = {"pattern": "transient"}
        first = False
        if (ep.last - ep.onset) // self._steps_per_value + 1 > hold:
            extra = {"pattern": "recurring", "recurring": self.recurring.describe(ep.level)}
            first = self.recurring.counters["interruptions_recognised"] == 0
            self.recurring.recognised(ep.onset, ep.duration, ep.level)
        else:  # a transient of some length: a recurring one of that kind may run a step or two longer (hold)
            self.recurring.transient(ep.onset, ep.duration, ep.level)
        gap = self.settings.spike_event_gap_steps
        if not first and self._last_spike_event is not None and ep.onset - self._last_spike_event < gap:
            self._spikes_since_event += 1
            self.counters["spikes_not_reported"] += 1
            return
        detail: dict[str, Any] = {**extra, **ep.to_json(), "baseline_s": mu, "hold_steps": hold,
                                  "not_reported_before": self._spikes_since_event}
        self._last_spike_event = ep.onset
        self._spikes_since_event = 0
        self.counters["spike_events"] += 1
        out.append(Anomaly("step_spike", self.job_id, step, (), ep.peak, detail))

    def _design(self, noise: float) -> tuple[float, float, float]:
        s = self.settings
        key = (s.min_effect, noise, s.false_alarm_steps)
        if key != self._design_key:
            self._design_key, self._design_val = key, cusum_design(*key)
        return self._design_val

    def _cusum(self, fs: FinalizedStep, x: float, rel: float, z: float, mu: float, noise: float) -> Anomaly | None:
        s = self.settings
        k, h, clip = self._design(noise)
        zc = min(max(z, -clip), clip)
        self._s_hi = max(0.0, self._s_hi + zc - k)
        self._s_lo = max(0.0, self._s_lo - zc - k)
        if self._s_hi > 0.0:
            self._run_push(fs, x, mu)
        else:
            self._run_reset()
        self._base.push(x)
        self._recent.append(x)
        self._fall_seq.append(x)
        if self._s_hi > h * (1.0 + 1e-9):
            mean = log_ratio_magnitude(self._run_log / self._run_n)
            if mean + self.effect_z * noise / math.sqrt(self._run_n) >= s.min_effect and self._confirmed(mean, noise):
                shape = self._shape(fs.step, mu, noise) if s.drift_detection else "step"
                if shape == "ramp":
                    return None
                if shape == "step":
                    detail = {"pattern": "cusum", "first_step": self._run_start, "baseline_s": mu, "noise": noise,
                              "step_time_s": mu * (1.0 + mean), "cusum": self._s_hi, "threshold": h,
                              "steps": self._run_n, "slowest_ranks": sorted(self._run_slowest)}
                    if self._deferred:
                        detail["deferred_steps"] = self._deferred
                    if self._post_n:
                        detail["confirm_steps"] = self._post_n
                    return self._fire(fs.step, mean, detail)
                self._deferred += 1
            self._crossed = True
            self._s_hi = h
        if self._s_lo > 0.0:
            if not self._lo_vals:
                self.speedup_first_step = fs.step
            self._lo_vals.append(max(x, 1e-9))  # the run's own step times (the line may move under it)
        else:
            self._lo_vals.clear()
        if self._s_lo > h * (1.0 + 1e-9):
            self.counters["speedups"] += 1
            self._suspend_drift()
            fallen, n_lo = fallen_level(list(self._lo_vals), noise) if self._lo_vals else (x, 1)
            level = fallen * (1.0 + INTERIM_SE * noise / math.sqrt(n_lo))
            left = (self._level_since, self.speedup_first_step - self._level_since, mu) \
                if self._level_since is not None and len(self._base) >= s.min_baseline_steps \
                and self._first_level else None
            self._speedup_noise = max(self._speedup_noise, noise)
            self._relearn()
            self._first_level = False
            self._left_pending = left
            self._interim = (min(mu, level), noise, "before_speedup")
            self._speedup_from = mu
            self.speedup_ratio = min(1.0, fallen / mu)
            return None
        return self._drift(fs.step)

    def _confirmed(self, mean: float, noise: float) -> bool:
        """Whether a CUSUM run whose mean excess passed the effect test may fire: its mean ``mean`` (relative)
        reaches ``min_effect`` by itself, or, let through by the :attr:`effect_z` leniency, the run's steps after it
        first crossed h, which did not select it, are over the baseline by :data:`MARGINAL_CONFIRM_Z` standard
        errors of their mean (``noise / sqrt(n)``, the design's relative noise). A run is the stretch of steps a
        maximum picked, so its mean reads high on noise: a chance +9 % run of 15 steps at 8 % noise passed the
        lenient test at ``min_effect`` 10 %; a real change of about ``min_effect`` goes on after the crossing and
        confirms within a few steps."""
        if mean >= self.settings.min_effect + self._high_noise_margin(noise):
            return True
        return self._post_n > 0 and self._post_log / self._post_n >= MARGINAL_CONFIRM_Z * noise / math.sqrt(self._post_n)

    def _high_noise_margin(self, noise: float) -> float:
        """How far over ``min_effect`` a CUSUM run's mean must read to fire without confirmation (relative): 0 while
        the design's shift ``min_effect / noise`` is at least :data:`CONFIRM_DELTA` sigmas, else :data:`EFFECT_Z`
        standard errors of the run's mean against the baseline's level, both estimated
        (``noise * sqrt(1 / run + 1 / n)``, n the baseline's values)."""
        if not self.high_noise_confirm or self.settings.min_effect >= CONFIRM_DELTA * noise or self._run_n == 0:
            return 0.0
        return EFFECT_Z * noise * math.sqrt(1.0 / self._run_n + 1.0 / max(1, len(self._base)))

    def _speedup_reference(self, interim_s: float, noise: float) -> tuple[float, bool, int]:
        """``(reference_s, confirmed, n)``: what a rise after a speedup is judged against. The interim reference
        ``interim_s`` (s) rests on the speedup's own run, the stretch the lower CUSUM picked because it was low, so
        a chance dip sets it low and a return to the old level reads as a slowdown (+11.5 % 4 steps after a
        chance -12 % dip at 5 % noise). The ``n`` steps after the speedup fired and before the rise's run began did
        not pick it; when there are none, the rise's run's own steps before its best rising split
        (:func:`rise_split`; a rise 3 steps after the speedup left no other step) stand for them: when their geometric mean is under the level before the speedup by :data:`SPEEDUP_CONFIRM_Z`
        standard errors (``noise / sqrt(n)``) the speedup is confirmed and the reference is the higher of
        ``interim_s`` and that mean raised by :data:`INTERIM_SE` standard errors; otherwise (none, or not lower) it is the level before the speedup."""
        before = self._speedup_from
        if before is None:
            return interim_s, True, 0
        start = self._run_start if self._run_start is not None else self._step_now + 1
        logs = [math.log(v) for st, v in self._after_speedup if st < start and v > 0.0]
        run = [v for st, v in self._after_speedup if st >= start and v > 0.0]
        cut = rise_split(np.log(np.asarray(run, dtype=np.float64))) if len(run) >= 3 and not logs else None
        if cut is not None:  # none after the fire: the run's steps before its rise (the upper CUSUM took them for
            logs += [math.log(v) for v in run[:cut]]  # being high, the split for being low) are the evidence
        n = len(logs)
        if n:
            level = math.exp(sum(logs) / n)
            if level / before - 1.0 <= -SPEEDUP_CONFIRM_Z * noise / math.sqrt(n):
                # raised by INTERIM_SE standard errors as the interim level is: a chance low mean of 12 steps at
                # 17 % noise and a chance high run read +10 % on a series that only got faster
                return max(interim_s, level * (1.0 + INTERIM_SE * noise / math.sqrt(n))), True, n
        return max(interim_s, before), False, n

    def _interim_cusum(self, fs: FinalizedStep, x: float) -> Anomaly | None:
        """While the baseline re-learns after a speedup or a report, judge each step against the *interim*
        reference ``(mu_s, noise_rel, reference)`` instead of the young baseline alone, which would learn a further
        change as the new normal:

        - after a speedup (``reference "before_speedup"``): the level the speedup's own run showed (the geometric
          mean of the steps since the lower CUSUM last was 0), raised by :data:`INTERIM_SE` standard errors
          (``noise / sqrt(run)`` each) and never above the level before the speedup;
        - after a ``step_regression`` (``reference "reported_level"``): the level the report measured
          (:meth:`_reported_level`), raised by :data:`REPORTED_SE` standard errors; a second rise that starts 1-40
          steps after a report was absorbed by the re-learned baseline and never reported;
        - after a level report whose excursion came back (``reference "before_interruption"``,
          ``daemon/profwatch/core/detection/interruptions.py``): the level before the excursion (a +30 % change 10
          steps after a 7x, 5-step one was learned as normal against the excursion's level).

        After a report (either reference), steps over it by ``spike_min_effect`` (and ``spike_z``; ``EXIT_FRACTION`` of both to go
        on) are held as spike steps, as on a learned baseline:
        when they outlast the hold, ``pattern "level"`` (magnitude the median ratio on log step time); a transient
        one (a checkpoint) is no report (after a speedup they are held only when the excursion starts on a learned
        interruption's interval, ``RecurringInterruptions.on_interval``: a +30 % change straddling the threshold
        otherwise waited the hold, 2 -> 15 steps in ``bench_corpus.py`` levels seed 6). The other steps feed the same CUSUM, clip and effect test as
        :meth:`_cusum` (``pattern "cusum"``; after a report the run's mean must reach ``min_effect`` itself). A
        slowdown soon after a speedup or a report is found in the usual delay. For :data:`REPORT_FOLLOW_STEPS` steps
        after a report that may not have measured the change's settled level (:meth:`_follows`), the reference
        follows the steps first (:meth:`_follow_rise`). ``detail.reference`` names the reference; ``baseline_s`` is its level, the magnitude a ratio to it."""
        assert self._interim is not None
        if self._follow_left > 0:
            self._follow_rise(x)
        mu, noise, reference = self._interim
        s = self.settings
        if reference == "before_speedup":
            self._after_speedup.append((fs.step, x))
        k, h, clip = self._design(noise)
        rel = x / mu - 1.0
        z = rel / noise
        spike = self.spikes.is_spike(rel, z) or (  # hysteresis, as the spike filter's: a rise straddling the
            bool(self._interim_spikes)  # threshold stays one episode
            and rel >= EXIT_FRACTION * s.spike_min_effect and z >= EXIT_FRACTION * s.spike_z)
        # after a speedup only an excursion on a learned interruption's interval is held (a checkpoint due 2 steps
        # after a chance 2-step dip fired the speedup was reported as a +57 % cusum: hypothesis, recurring 2x/5 steps)
        held = spike and (reference in ("reported_level", "before_interruption") or (
            reference == "before_speedup" and (bool(self._interim_spikes) or self.recurring.on_interval(fs.step, rel)
                                               or bool(self.recurring.alike(rel)))))
        if held:
            if not self._interim_spikes:
                self._interim_spike_start = fs.step
            self._interim_spikes.append(x)
            self._interim_spike_last = fs.step
            self._run_vals.append(x)
            hold = self._spike_hold(fs.step, mu, x)
            if len(self._interim_spikes) > hold:
                hold = self._recurring_hold(self._interim_spike_start, mu, self._interim_spikes, hold)
            if len(self._interim_spikes) <= hold:
                return None
            logs = sorted(math.log(v / mu) for v in self._interim_spikes)
            m = len(logs)
            mag = log_ratio_magnitude(logs[m // 2] if m % 2 else 0.5 * (logs[m // 2 - 1] + logs[m // 2]))
            detail = {"pattern": "level", "reference": reference, "first_step": self._interim_spike_start,
                      "baseline_s": mu, "noise": noise, "step_time_s": mu * (1.0 + mag), "steps": m,
                      "hold_steps": hold, "slowest_ranks": [fs.slowest_rank]}
            self._level_vals = list(self._interim_spikes)
            return self._fire(fs.step, mag, detail)
        if fs.step - self._interim_spike_last > MERGE_GAP_STEPS * max(1, self._steps_per_value):
            # the held episode ended; one ordinary step inside it does not end it, as in the spike filter (a
            # +30 % change held after a speedup broke on one step 3.5 sigmas low and restarted its hold)
            self._interim_spikes.clear()
        zc = min(max(z, -clip), clip)
        self._s_hi = max(0.0, self._s_hi + zc - k)
        if self._s_hi <= 0.0:
            self._run_reset()
            return None
        self._run_push(fs, x, mu)
        if self._s_hi <= h * (1.0 + 1e-9):
            return None
        mean = log_ratio_magnitude(self._run_log / self._run_n)
        extra: dict[str, Any] = {}
        if reference == "before_speedup":
            ref, confirmed, n_after = self._speedup_reference(mu, noise)
            shift = math.log(mu / ref)
            mean = log_ratio_magnitude(self._run_log / self._run_n + shift)
            extra = {"speedup_confirmed": confirmed, "level_before_speedup_s": self._speedup_from,
                     "steps_after_speedup": n_after}
            if not self._speedup_rise_clear(mean, noise, n_after if confirmed else 0, shift):
                self._crossed = True
                self._s_hi = h
                return None
            if self._post_n:
                extra["confirm_steps"] = self._post_n
            mu = ref
        # a rise over an interim reference clears min_effect by itself: that reference rests on a few steps, so a
        # level measured low was otherwise re-reported at +7-9 % within EFFECT_Z standard errors of it (a report),
        # or reported on a series that only got faster (+8.6 % over a speedup's level measured 4 % low: the
        # detector invariant's hypothesis example, 1.0 s -> 0.25 s -> 0.125 s at 3 % noise)
        lenient = 0.0 if reference in ("reported_level", "before_speedup") else self.effect_z
        if mean + lenient * noise / math.sqrt(self._run_n) < s.min_effect:
            self._s_hi = h
            return None
        detail = {"pattern": "cusum", "reference": reference, "first_step": self._run_start,
                  "baseline_s": mu, "noise": noise, "step_time_s": mu * (1.0 + mean), "cusum": self._s_hi,
                  "threshold": h, "steps": self._run_n, "slowest_ranks": sorted(self._run_slowest), **extra}
        return self._fire(fs.step, mean, detail)

    def _run_push(self, fs: FinalizedStep, x: float, mu: float) -> None:
        """Step ``fs`` (time ``x`` s) joins the upper CUSUM's run over the level ``mu`` (s): its log ratio, value and
        slowest rank, and, once the run first crossed its threshold, the unselected evidence after it
        (``_post_n``, ``_post_log``: what a held fire waits for)."""
        if self._run_start is None:
            self._run_start = fs.step
        self._run_n += 1
        lr = math.log(x / mu) if x > 0.0 else math.log(MIN_NOISE)
        self._run_log += lr
        self._run_vals.append(x)
        if len(self._run_slowest) < MAX_SLOWEST_RANKS:
            self._run_slowest.add(fs.slowest_rank)
        if self._crossed:
            self._post_n += 1
            self._post_log += lr

    def _speedup_rise_clear(self, mean: float, noise: float, n_ref: int, shift: float) -> bool:
        """Whether a CUSUM run over the interim reference after a speedup (``mean``: its mean excess over the
        reference, relative) may fire, at a relative noise ``noise`` over :data:`CONFIRM_DELTA` times under
        ``min_effect`` (a shift of under 1.5 sigmas; below that, always). Both sides of the comparison read off
        their true level: the run is the stretch the upper CUSUM picked because it was high, and a confirmed
        speedup's reference rests on the ``n_ref`` steps after its fire (:meth:`_speedup_reference`; 0: the level
        before the speedup, learned on many steps), a few steps that read low by chance as often as high. So, as
        :meth:`_confirmed` asks of a run on a learned baseline, the run's mean clears ``min_effect`` by
        :data:`EFFECT_Z` standard errors of the difference of the two means (``noise * sqrt(1 / run + 1 / n_ref)``),
        or the steps since it first crossed h (which did not select it; their log ratios to the interim reference
        plus ``shift``, the log of that reference over the one in force) sit over the reference by
        :data:`MARGINAL_CONFIRM_Z` such standard errors (``noise * sqrt(1 / post + 1 / n_ref)``). ``bench_corpus.py``
        seed 41, ``faster`` run 15 (17.5 % noise) read +14.8 % over 25 steps against a reference resting on 8 steps
        that read 15 % low, and generator seed 160 of ``_speedups_only`` in ``test_detector_invariants.py``
        +10.7 % over 35 steps against 4 steps: both series only got faster."""
        if mean < self.settings.min_effect:
            return False
        if not self.high_noise_confirm or self.settings.min_effect >= CONFIRM_DELTA * noise:
            return True
        ref_var = 1.0 / n_ref if n_ref > 0 else 0.0
        if mean >= self.settings.min_effect + EFFECT_Z * noise * math.sqrt(1.0 / self._run_n + ref_var):
            return True
        return self._post_n > 0 and (self._post_log / self._post_n + shift
                                     >= MARGINAL_CONFIRM_Z * noise * math.sqrt(1.0 / self._post_n + ref_var))

    def _follow_rise(self, x: float) -> None:
        """One of the :data:`REPORT_FOLLOW_STEPS` steps after a report that the interim reference follows: it becomes
        the geometric mean of the steps followed so far (``x``, s, included) raised by :data:`REPORTED_SE` standard
        errors (at most :data:`FOLLOW_MAX_RATIO` times :attr:`_follow_from`), or the level the report measured
        (:attr:`_follow_from`) when that is higher: never lower than what
        the report measured, and never the maximum of the running estimates (one high step among the first would
        otherwise set it for good: a further 1.3x read +17 %)."""
        assert self._interim is not None
        _, noise, reference = self._interim
        self._follow.append(x)
        self._follow_left -= 1
        m = len(self._follow)
        level = math.exp(sum(math.log(v) for v in self._follow) / m) * (1.0 + REPORTED_SE * noise / math.sqrt(m))
        if math.isfinite(level):
            level = min(level, FOLLOW_MAX_RATIO * self._follow_from)
            self._interim = (max(self._follow_from, level), noise, reference)

    def _follows(self, detail: dict[str, Any]) -> bool:
        """Whether the interim reference after this report follows the next :data:`REPORT_FOLLOW_STEPS` steps: a
        ``pattern "cusum"`` report (its level rests on the 2-4 steps its run held at a large change), or a
        ``pattern "level"`` one whose risen steps (the newest ``steps`` of the run's values) still rose at the fire:
        the least-squares slope of their relative excess over ``baseline_s`` by :data:`EFFECT_Z` standard errors
        (:meth:`_rising`). A flat level (a sudden change held out as spike steps) is measured: no follow."""
        if detail.get("pattern") == "cusum":
            return True
        mu, k = detail.get("baseline_s"), int(detail.get("steps") or 0)
        if (detail.get("pattern") != "level" or detail.get("learning") or not isinstance(mu, float) or not mu > 0.0
                or k < 3):
            return False  # the learning path's reports keep their risen steps apart (the baseline takes them)
        vals = list(self._run_vals)[-k:]
        rel = np.asarray(vals, dtype=np.float64) / mu - 1.0
        return len(vals) >= 3 and self._rising(rel, float(detail.get("noise") or MIN_NOISE))

    def _reported_level(self, detail: dict[str, Any]) -> tuple[float, int]:
        """``(level_s, n)``: the level (s) a report measured and the steps it rests on. For ``pattern "cusum"`` the
        run may begin with a few steps before the change (the upper CUSUM leaves 0 on noise): its geometric mean
        then reads low (+22 % for a +40 % change with 2 of 5 run steps before it), and a reference that low would
        report the new level again. The run's log step times are split at the best two-level split (least squares,
        the later part at least 2 steps and above the earlier: two low steps at a run's end once read +28 % for a
        +35 % change) and the later part's geometric mean is the level (the whole run's without such a split). Other patterns measure
        the risen steps only (``step_time_s``)."""
        level = float(detail["step_time_s"])
        n = int(detail.get("steps") or 1)
        vals = list(self._run_vals)
        risen, self._level_vals = self._level_vals, []
        if detail.get("pattern") == "level" and not detail.get("learning"):
            return self._level_later(level, n, risen, float(detail.get("noise") or 0.0))
        if detail.get("pattern") != "cusum" or len(vals) < 3:
            return level, max(1, n)
        y = np.log(np.asarray(vals, dtype=np.float64))
        cut = rise_split(y)
        if cut is None:
            return max(level, float(math.exp(y.mean()))), y.size
        later = float(math.exp(y[cut:].mean()))
        return max(level, later), y.size - cut

    def _level_later(self, level: float, n: int, risen: list[float], noise: float) -> tuple[float, int]:
        """``(level_s, n)`` a ``pattern "level"`` report measured: the median of its risen steps ``risen`` (s) as
        ``level`` (s, over ``n`` steps), or, when those steps hold two levels, the later one: a change that began
        while a checkpoint's excursion was still held (its first 4 steps at 2x, then 3x) was measured at the median of
        both (2.5x), and the 3x that went on was reported a second time against it, 3 steps later. Two levels: the
        best rising split (:func:`rise_split`) whose parts differ by at least ``min_effect`` and
        :data:`SPLIT_Z` standard errors (``noise``, relative, at the steps of each part)."""
        y = np.log(np.asarray([v for v in risen if v > 0.0], dtype=np.float64))
        cut = rise_split(y) if y.size == len(risen) else None
        if cut is None:
            return level, max(1, n)
        lo, hi = float(y[:cut].mean()), float(y[cut:].mean())
        se = max(noise, MIN_NOISE) * math.sqrt(1.0 / cut + 1.0 / (y.size - cut))
        if hi - lo < max(math.log1p(self.settings.min_effect), SPLIT_Z * se):
            return level, max(1, n)
        return max(level, float(math.exp(hi))), y.size - cut

    def _shape(self, step: int, mu: float, noise: float) -> str:
        """At a fire, what the newest values (relative to the baseline's line) look like: ``"ramp"`` when a ramp
        explains them better than a step by :data:`RAMP_EVIDENCE` noise variances
        (:func:`~profwatch.core.detection.drift.ramp_evidence`): the level is drifting, not changing at once; the
        baseline is re-learned from the ramp's knee on (its trend follows it once it holds enough values), the
        drift reached so far stays counted, and nothing is reported. ``"wait"`` while a ramp fits better by less
        than that (at most :data:`RAMP_MAX_DEFER` steps), else ``"step"`` (fire)."""
        y = np.fromiter(self._recent, dtype=np.float64, count=len(self._recent))
        if y.size < 8:
            return "step"
        line = mu - self._base.slope * np.arange(y.size - 1, -1, -1, dtype=np.float64)
        if not np.all(line > 0):
            return "step"
        gain, knee, rise = ramp_evidence(y / line - 1.0)
        if gain < RAMP_EVIDENCE * noise * noise:
            return "wait" if gain > RAMP_DEFER * noise * noise and self._deferred < RAMP_MAX_DEFER else "step"
        tail = y[knee:].tolist()
        slope = self._base.slope + rise * mu
        self._base.clear()
        self._base.prior_slope = slope
        self._recent.clear()
        self._fall_seq.clear()
        for v in tail:
            self._base.push(v)
            self._recent.append(v)
            self._fall_seq.append(v)
        self._s_hi = self._s_lo = 0.0
        self._run_reset()
        self.spikes.reset_episode()
        self._ramp_step = step - (y.size - 1 - knee)
        self.counters["drift_onsets"] += 1
        return "ramp"

    def _drift(self, step: int) -> Anomaly | None:
        """A rise of the baseline level by another ``drift_threshold`` (and by :data:`EFFECT_Z` standard errors of
        the two levels compared, below): ``drift`` when it is gradual (the trend
        explains at least :data:`TREND_EXPLAINS` of the rise since the last report or the reference, or the
        rise took at least half a baseline window), else a level change of at least ``min_effect`` that
        entered the baseline before the change-point test saw it (e.g. while re-learning):
        ``step_regression`` with ``pattern "baseline"``, judged on the window's own level (a trend fitted to a
        young window, extrapolated over the held-back steps, read as a level change) and only when the rise clears
        ``min_effect`` by :data:`EFFECT_Z` standard errors of the two levels compared
        (``noise * sqrt(1 / n + 1 / n_ref)``, ``n_ref`` the values the reference was learned from, at most ``n``):
        a young window's error alone made most false alarms of a young baseline (docs/detection.md), and a
        reference re-learned from 30 values after a speedup that came out 6 % low read a series that only got
        faster as +13 % once the window held 143 values (``bench/bench_corpus.py`` seed 31, ``faster`` run 14)."""
        s = self.settings
        tracker = self.drift
        ref = tracker.reference_s
        if not s.drift_detection or len(self._base) < s.min_baseline_steps or ref is None:
            return None
        mu = self._noise()[0]  # cached between re-estimates
        if mu / ref - 1.0 < (tracker.reports + 1) * tracker.threshold:
            return None
        since = tracker.last_step if tracker.last_step is not None else step
        before = ref * (1.0 + tracker.reports * tracker.threshold)
        per_step = self._base.slope / self._steps_per_value
        gradual = (per_step * (step - since) >= TREND_EXPLAINS * (mu - before) or step - since >= s.baseline_steps // 2
                   or self._ramp_step is not None)
        if not gradual and mu / before - 1.0 >= s.min_effect:
            level0 = self._base.stats()[0]  # the window's own level, not extrapolated along its trend
            noise = self._noise()[1]
            n = len(self._base)
            n_ref = tracker.reference_n or n  # the reference's own sample: a young re-learned one is the noisier
            margin = EFFECT_Z * noise * math.sqrt(1.0 / n + 1.0 / min(n_ref, n))  # two levels, each estimated
            if level0 / before - 1.0 < s.min_effect + margin or not self._recent_above(before, s.min_effect, noise, n_ref):
                return None  # not clear of the estimates' errors (a young window's): wait for more values
            if self._warm_up_continues():  # the first learning's warm-up went on rising: its level, not a change
                tracker.rebase(level0, step, n)
                self.counters["warmup_rebases"] += 1
                return None
            tracker.rebase(level0, step, n)
            level: dict[str, Any] = {"pattern": "baseline", "first_step": since, "baseline_s": before,
                                     "step_time_s": level0, "steps": len(self._base)}
            self.counters["regressions"] += 1
            return Anomaly("step_regression", self.job_id, step, (), level0 / before - 1.0, level)
        # The level ``mu`` is the window's line extrapolated ``h`` values past its centre: its variance is
        # noise^2 * (1 / n + 12 h^2 / n^3) (least-squares line, n equally spaced values; Theil-Sen is close), and
        # the reference's noise^2 / n_ref adds to it. A trend fitted to chance (low values early in a young window,
        # high ones late) once carried a series that only got faster to a +16 % drift (same run 14).
        noise, n = self._noise()[1], len(self._base)
        h = n / 2.0 + self._base.lag + 1.0 if self._base.slope != 0.0 else 0.0
        se = noise * math.sqrt(1.0 / n + 12.0 * h * h / n**3 + 1.0 / min(tracker.reference_n or n, n))
        if mu / ref - 1.0 < (tracker.reports + 1) * tracker.threshold + EFFECT_Z * se:
            return None  # the two levels' errors alone could make this rise
        if not self._recent_above(ref, (tracker.reports + 1) * tracker.threshold, noise, tracker.reference_n or n):
            return None  # the line rose, the newest steps did not (a trend fitted to chance, extrapolated)
        drift = tracker.observe(mu, per_step, mu, step)
        if drift is None:
            return None
        self.counters["drift_reports"] += 1
        return Anomaly("drift", self.job_id, step, (), float(drift["total"]), drift)

    def _warm_up_continues(self) -> bool:
        """Whether a rise of the baseline's own level over the drift reference learned at the end of a generation's
        first learning (:meth:`_drift`'s ``pattern "baseline"`` branch) is that learning's warm-up still rising, by
        the rule :meth:`_settled` applies at its end, now on the steps since the generation's first learned one
        (:attr:`_recent`, more of them): the generation is young (:meth:`_young`), reported nothing yet, has no
        previous generation's level (:attr:`prior`) and is no serving unit's (:attr:`provisional` off); its steps
        rise by the rank test (:func:`~profwatch.core.detection.drift.trend_z` at least :data:`SETTLE_Z`), no sudden
        change explains the rise (:meth:`_split` finds none: the earlier part rises too, or a warm-up curve fits as
        well) and none jumped off the warm-up's line (:meth:`_line_jump`: a change during or right after the rise
        is still reported). At 19 % noise a warm-up rising over some 50 steps (0.7 -> 1.0x) rose by about one noise
        deviation over the 46 first learned steps: :meth:`_settled` took them as settled, the reference learned
        the level mid-rise and the settled level read +29 % 27 steps later, armed (``bench/bench_corpus.py
        --healthy-hours``, seed 34 ``warmup_up`` healthy run 5, tests/unit/test_warm_up_changes.py). Needs at least
        ``2 *`` :data:`LEARNED_STEP_MIN_AFTER` steps (as :meth:`_split`); the reference then learns the window's
        level silently (counted in ``warmup_rebases``). Pure but for the counter the caller keeps."""
        if (self._gen_reported or self.prior is not None or self.provisional or not self._young()
                or self._first_learned is None):
            return False
        y = np.fromiter(self._recent, dtype=np.float64, count=len(self._recent))
        if y.size < 2 * LEARNED_STEP_MIN_AFTER or not np.all(y > 0.0):
            return False
        return trend_z(y) >= SETTLE_Z and self._split(y) is None and self._line_jump(y) is None

    def _recent_above(self, ref_s: float, rise: float, noise: float, n_ref: int) -> bool:
        """Whether the newest :data:`RECENT_LEVEL_VALUES` accepted step times themselves (their median, not the
        baseline's line) are above ``ref_s`` (s) by ``rise`` (relative) and :data:`EFFECT_Z` standard errors of the
        two levels compared (``noise * sqrt(pi / (2 k) + 1 / n_ref)``: a median of k values, a reference from
        ``n_ref``). A series whose recent level is not above its earlier level never reports a rise: the line of a
        young window extrapolated a chance trend to +17.8 % on a series that only got faster
        (``bench/bench_corpus.py`` seed 31, ``faster`` run 14: a re-learned reference 5 % low, the newest steps
        +7 % over it, the line +18 %)."""
        k = min(RECENT_LEVEL_VALUES, len(self._recent))
        if k == 0 or not ref_s > 0.0:
            return False
        newest = np.fromiter((self._recent[-1 - i] for i in range(k)), dtype=np.float64, count=k)
        se = noise * math.sqrt(math.pi / (2.0 * k) + 1.0 / max(1, n_ref))
        return float(np.median(newest)) / ref_s - 1.0 >= rise + EFFECT_Z * se

    def _suspend_drift(self) -> None:
        if len(self._base) >= self.settings.min_baseline_steps:
            self.drift.suspend(self._noise()[0])

    def _excursion(self, detail: dict[str, Any], magnitude: float, noise: float) -> bool:
        """Whether a report is an excursion whose return is watched (:class:`RecurringInterruptions`): a level of
        spike steps held out (not the learning path's step or jump in its learned steps, :data:`_NOT_EXCURSIONS`),
        or a ``cusum`` report after a speedup (``reference "before_speedup"``) that is spike-sized itself
        (``spike_min_effect`` and ``spike_z`` noise sigmas over the speedup's level). The latter: a job whose slow
        regime (an RL rollout, 3.6x for 20 steps) came first took the fast one for a speedup, and each return of
        the slow one was a cusum report 3 steps in, never learned as the job's pattern (``bench/bench_new_shapes.py``
        ``alternating`` seed 31 run 0: 15 reports, 5 arms). A smaller one is no excursion: its steps are under the
        watch's threshold and a lasting one would read as a new level, a second report."""
        reference = detail.get("reference")
        if detail.get("pattern") == "level":
            return reference not in _NOT_EXCURSIONS
        s = self.settings
        return (detail.get("pattern") == "cusum" and reference == "before_speedup"
                and magnitude >= s.spike_min_effect and magnitude >= s.spike_z * noise)

    def _fire(self, step: int, magnitude: float, detail: dict[str, Any]) -> Anomaly:
        """Report a ``step_regression`` and re-learn the baseline; while it re-learns, steps are judged against
        the level this report measured (``_interim``, ``reference "reported_level"``, see :meth:`_interim_cusum`),
        raised by :data:`REPORTED_SE` standard errors, so a further rise soon after is its own report."""
        self.counters["regressions"] += 1
        self._gen_reported = True
        self._speedup_noise = 0.0  # a slower level may well be relatively calmer (a fixed cost added)
        self.prior = None  # the generation's level is judged now: the previous one is no reference any more (a
        # change the learning path reported was reported again against it at the end of the first learning)
        self._suspend_drift()
        trend = self._base.slope if self.settings.drift_detection else 0.0
        level, n = self._reported_level(detail)
        noise = float(detail.get("noise") or MIN_NOISE)
        # watched: a level of spike steps held out (not the learning path's step or jump in its learned steps,
        # whose risen steps are no excursion: the watch read the change going on as a new level, a second report)
        if self._excursion(detail, magnitude, noise):
            self.recurring.reported(int(detail.get("first_step", step)), step, magnitude,
                                    float(detail.get("baseline_s") or 0.0), noise)
        follow = self._follows(detail)
        self._relearn()
        self._first_level = False
        self._base.prior_slope = trend  # a drift goes on after a sudden change: the new level follows it
        # a jump off a warm-up's line is a point on a rise that goes on: the rest of the warm-up is no further
        # change (judged against that level, it was reported again: 1.15x during a 0.3 -> 1.0 rise, 10 of 10)
        if level > 0.0 and math.isfinite(level) and detail.get("reference") != "warm_up_line":
            self._interim = (level * (1.0 + REPORTED_SE * noise / math.sqrt(n)), noise, "reported_level")
            self._follow_left = REPORT_FOLLOW_STEPS if follow else 0
            self._follow_from = self._interim[0]
        return Anomaly("step_regression", self.job_id, step, (), magnitude, detail)
