"""What changed between a healthy reference capture and a capture of a regression (pure).

Input: the per-(rank, step) time breakdowns of both captures (:class:`RankStepSummary`, microseconds; for Ascend
msprof-analyze ``cluster_time_summary``'s ``ClusterTimeSummary``, which carries ``analysis.db``'s ``StepTraceTime``
split of each step: computing, communication not overlapped, free; for torch.profiler the Kineto breakdown of
``daemon/profwatch/core/verdict/kineto.py``), the software versions each capture's rank dirs record, and their world
sizes. Output: :class:`Comparison`, whose ``changes`` are ordered by size (``docs/changes.md``).

Rules (``docs/changes.md``):

* Only ranks present in both captures are compared (``ranks_compared``); the others are listed, never paired with
  a different rank without saying so. ``ranks`` may restrict the comparison further (a named-rank regression).
  A named rank missing from the reference is compared with the reference rank of the same role given in
  ``substitutes`` (:func:`same_role_rank`), said in the notes and in each change's ``basis``.
* Component per step: for each captured step, the mean over the compared ranks of the component
  (``compute`` = computation without memory copies, ``memory`` = copies and fills (torch device traces only),
  ``communication`` = communication not overlapped with computation, ``host`` = free time: the device idle,
  waiting for the host); the capture's value is the mean of those per-step means.
* Decision (:func:`_decide`, :mod:`profwatch.core.verdict.shift_test`): the step is the sample unit; each
  component is tested one-sided in both directions, Holm's correction over all of them at ``alpha`` (1 %), the
  exact Mann-Whitney test when the step counts can reach Holm's first threshold, else Welch's t-test on
  ``log(value + floor)`` (durations vary multiplicatively); a change
  counts when rejected and larger than the healthy job's own step-to-step variation: the reference capture's
  robust step-time spread (1.4826 x MAD, :func:`robust_spread`), at least ``floor_frac`` (0.5 %) of the reference
  step time, so identical synthetic steps (no spread: an exact difference) do not make a microsecond a change, and
  a component that moved by less than one healthy step varies (the host's scheduling noise between two windows of
  a real job) is not called a change however consistent it is over a few steps. With one step in each capture there is no
  test and only the floor applies (said in ``notes``). ``noise_s_per_step`` is the pooled standard deviation of
  the per-step values, for reading.
* ``share`` = the component's delta / the step time's delta (None when the step time did not change above its own
  noise); shares need not sum to 1 (the components overlap in a real step and another component may have shrunk).
* A software version that differs (``torch_npu``, ``cann``, ...) is a change of component ``software`` with
  ``delta_s_per_step`` None and a ``detail``; so is nothing else: a different world size is a note.
* The reference capture's step time is checked against the telemetry's step time when the reference was planned
  (``telemetry_baseline_step_s``, when given): a difference above 25 % or 2 ms is a note (the reference may have
  been taken during a slow period or under other load).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from statistics import fmean
from typing import Any, Literal

from profwatch.core.changes.hardware import DROP_FRAC, FreqSummary
from profwatch.core.verdict.drilldown import delta_text, excess_text
from profwatch.core.verdict.evidence import RankStepSummary, usable_row
from profwatch.core.verdict.robust import MAD_TO_SIGMA
from profwatch.core.verdict.shift_test import ALPHA, ShiftTest, holm, rank_test_reaches, shift_test

Component = Literal["compute", "memory", "communication", "host", "software", "hardware"]
COMPONENT_FIELDS: dict[Component, str] = {"compute": "computation_us", "communication": "communication_us",
                                    "host": "free_us"}
"""Timed components -> the :class:`RankStepSummary` field each is read from (microseconds). ``compute`` is
``computation_us - memory_us`` and ``memory`` is ``memory_us`` (:func:`_component_value`), the latter compared only
when a capture splits it (Kineto device traces: copies and fills, as HTA's TraceDiff reports them apart)."""
IGNORED_VERSION_KEYS = frozenset({"msprof_analyze"})
"""Versions of the analysing tool, not of the job: the same run analyses both captures."""
TELEMETRY_MISMATCH_FRAC = 0.25
TELEMETRY_MISMATCH_S = 0.002


@dataclass(frozen=True, slots=True)
class Change:
    """One component that changed. Seconds per step; ``delta_s_per_step`` None for ``software``/``hardware``."""

    component: Component
    delta_s_per_step: float | None
    baseline_s_per_step: float | None = None
    now_s_per_step: float | None = None
    share: float | None = None
    noise_s_per_step: float | None = None
    detail: list[dict[str, Any]] | str | None = None
    basis: str | None = None
    """What the reference side stands for when it is not the same ranks ("rank 13 compared with reference rank
    5, ..."); None when every compared rank is in both captures."""
    p_value: float | None = None
    """One-sided p-value of the change in its direction (:mod:`profwatch.core.verdict.shift_test`)."""
    interval_s_per_step: tuple[float, float] | None = None
    """The 98 % confidence interval of ``delta_s_per_step`` (each bound a one-sided 1 % bound)."""
    test: str | None = None
    """Which test decided: ``mann_whitney``, ``welch``, ``pooled_t``, ``exact`` (no spread), ``none``."""

    def to_json(self) -> dict[str, Any]:
        """``{"component", "delta_s_per_step", "baseline_s_per_step", "now_s_per_step", "share",
        "noise_s_per_step", "p_value", "interval_s_per_step", "test", "detail", "basis"}`` (seconds, rounded to the
        microsecond; share to 1e-3; p to 4 significant digits)."""
        return {"component": self.component, "delta_s_per_step": _r(self.delta_s_per_step),
                "baseline_s_per_step": _r(self.baseline_s_per_step), "now_s_per_step": _r(self.now_s_per_step),
                "share": None if self.share is None else round(self.share, 3),
                "noise_s_per_step": _r(self.noise_s_per_step),
                "p_value": _p(self.p_value),
                "interval_s_per_step": None if self.interval_s_per_step is None else
                [_r(self.interval_s_per_step[0]), _r(self.interval_s_per_step[1])],
                "test": self.test, "detail": self.detail, "basis": self.basis}


@dataclass(slots=True)
class Comparison:
    """The comparison of one capture with its reference.

    ``changes``: above-noise changes, timed ones by ``|delta|`` descending, then software/hardware ones.
    ``components``: every timed component side by side (changed or not), for the report.
    ``step_time_*``: mean step time over the compared ranks and captured steps (seconds).
    """

    changes: list[Change] = field(default_factory=list)
    components: list[Change] = field(default_factory=list)
    step_time_baseline_s: float | None = None
    step_time_now_s: float | None = None
    step_time_noise_s: float | None = None
    step_time_changed: bool = False
    step_time_p_value: float | None = None
    step_time_interval_s: tuple[float, float] | None = None
    step_time_shift_s: float | None = None
    """The typical step's change (seconds): Hodges-Lehmann's shift, the median of all (now - reference) step-time
    differences (Hodges & Lehmann 1963), robust where one huge step moves the means; the step-time decision uses
    it, and the headline says it when it and ``step_delta_s`` disagree."""
    ranks_compared: list[int] = field(default_factory=list)
    ranks_only_now: list[int] = field(default_factory=list)
    ranks_only_baseline: list[int] = field(default_factory=list)
    steps_baseline: int = 0
    steps_now: int = 0
    notes: list[str] = field(default_factory=list)
    paired: dict[int, int] = field(default_factory=dict)
    """Named rank -> the reference rank of the same role it was compared with (not in the reference itself)."""
    caveats: list[str] = field(default_factory=list)
    """What makes the reference a questionable baseline, said in the headline: another job, another world size."""

    @property
    def step_delta_s(self) -> float | None:
        if self.step_time_baseline_s is None or self.step_time_now_s is None:
            return None
        return self.step_time_now_s - self.step_time_baseline_s

    def to_json(self) -> dict[str, Any]:
        """The ``comparison`` object of a verdict: ``changes`` (list of :meth:`Change.to_json`), ``components``,
        ``step_time_baseline_s``, ``step_time_now_s``, ``step_delta_s``, ``step_time_changed``,
        ``ranks_compared``, ``ranks_only_now``, ``ranks_only_baseline``, ``steps_baseline``, ``steps_now``,
        ``headline``, ``notes``."""
        return {"changes": [c.to_json() for c in self.changes],
                "components": [c.to_json() for c in self.components],
                "step_time_baseline_s": _r(self.step_time_baseline_s), "step_time_now_s": _r(self.step_time_now_s),
                "step_delta_s": _r(self.step_delta_s), "step_time_changed": self.step_time_changed,
                "step_time_p_value": _p(self.step_time_p_value),
                "step_time_interval_s": None if self.step_time_interval_s is None else
                [_r(self.step_time_interval_s[0]), _r(self.step_time_interval_s[1])],
                "step_time_shift_s": _r(self.step_time_shift_s),
                "ranks_compared": list(self.ranks_compared), "ranks_only_now": list(self.ranks_only_now),
                "ranks_only_baseline": list(self.ranks_only_baseline), "steps_baseline": self.steps_baseline,
                "steps_now": self.steps_now, "headline": headline(self), "notes": list(self.notes),
                "paired": {str(k): v for k, v in sorted(self.paired.items())}}


P_FLOOR = 1e-6
"""p-values below this are reported as it: a few steps cannot show more, and a smaller figure (Welch's t on steps
without spread gives 1e-15) would only measure the tail of the normal model."""


def _p(p: float | None) -> float | None:
    return None if p is None else float(f"{max(p, P_FLOOR):.4g}")


SPREAD_MIN_STEPS = 5
"""Reference steps below which no step-to-step spread is estimated (only the floor applies)."""
SPREAD_MAX_CYCLE = 8
"""The longest repeating cycle of steps (gradient accumulation, alternating optimizer steps) :func:`robust_spread`
looks for."""


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 6)


def _component_value(row: RankStepSummary, attr: str) -> float:
    if attr == "computation_us":  # compute kernels; copies and fills are ``memory``
        return float(row.computation_us) - float(row.memory_us)
    return float(getattr(row, attr))


def _per_step_means(rows: Iterable[RankStepSummary], ranks: set[int], attr: str) -> list[float]:
    """One value per step: the mean over ``ranks`` (the sample unit of the tests is the step)."""
    by_step: dict[int, list[float]] = {}
    for r in rows:
        if r.rank in ranks and usable_row(r):
            by_step.setdefault(r.step, []).append(_component_value(r, attr))
    return [fmean(v) for _, v in sorted(by_step.items()) if v]


def pooled_sd(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Pooled sample standard deviation of two samples; None when neither has two values."""
    dof = max(len(a) - 1, 0) + max(len(b) - 1, 0)
    if dof == 0:
        return None
    ss = sum((x - fmean(a)) ** 2 for x in a) if len(a) > 1 else 0.0
    ss += sum((x - fmean(b)) ** 2 for x in b) if len(b) > 1 else 0.0
    return math.sqrt(ss / dof)


def compare_captures(baseline: Sequence[RankStepSummary], now: Sequence[RankStepSummary], *,
                     ranks: Iterable[int] | None = None,
                     baseline_versions: Mapping[str, str] | None = None,
                     now_versions: Mapping[str, str] | None = None,
                     baseline_world_size: int | None = None, now_world_size: int | None = None,
                     telemetry_baseline_step_s: float | None = None,
                     alpha: float = ALPHA, floor_frac: float = 0.005,
                     substitutes: Mapping[int, tuple[int, str]] | None = None,
                     baseline_job: str | None = None, now_job: str | None = None) -> Comparison:
    """Compare a capture (``now``) with its healthy reference (``baseline``); see the module docstring.
    ``substitutes``: named rank -> (reference rank, why), used for a rank of ``ranks`` the reference lacks.

    Raises:
        ValueError: ``alpha`` outside (0, 0.5) or ``floor_frac`` negative.
    """
    if not 0 < alpha < 0.5 or floor_frac < 0:
        raise ValueError("alpha must be in (0, 0.5) and floor_frac >= 0")
    out = Comparison()
    ref_ranks, now_ranks = {r.rank for r in baseline}, {r.rank for r in now}
    common = ref_ranks & now_ranks
    basis: list[str] = []
    if ranks is not None:
        wanted = set(ranks)
        by_rank: dict[int, list[RankStepSummary]] = {}
        for row in baseline:
            by_rank.setdefault(row.rank, []).append(row)
        subs = {r: q for r, (q, _) in (substitutes or {}).items()
                if r in wanted and r not in ref_ranks and r in now_ranks and q in by_rank}
        for r, q in sorted(subs.items()):  # the reference's rank of the same role stands in for the named rank
            baseline = [*baseline, *(replace(row, rank=r) for row in by_rank[q])]
            why = (substitutes or {})[r][1]
            basis.append(f"rank {r} compared with reference rank {q} ({why})")
            out.paired[r] = q
        if basis:
            out.notes.append("; ".join(basis) + ": the named rank is not in the reference capture")
        ref_ranks = ref_ranks | set(subs)
        missing = sorted(wanted - ref_ranks)
        if missing:
            out.notes.append(f"ranks {missing} are not in the reference capture and no reference rank has the same "
                             "role: not compared")
        common = (ref_ranks & now_ranks) & wanted
    out.ranks_compared = sorted(common)
    out.ranks_only_now = sorted(now_ranks - ref_ranks)
    out.ranks_only_baseline = sorted(ref_ranks - now_ranks - set(out.paired.values()))
    if out.ranks_only_now or out.ranks_only_baseline:
        out.notes.append(f"the captures cover different ranks: compared {len(common)} rank(s) present in both"
                         + (f"; only now: {_span(out.ranks_only_now)}" if out.ranks_only_now else "")
                         + (f"; only in the reference: {_span(out.ranks_only_baseline)}"
                            if out.ranks_only_baseline else ""))
    if baseline_world_size and now_world_size and baseline_world_size != now_world_size:
        out.notes.append(f"world size changed: {baseline_world_size} in the reference, {now_world_size} now")
        out.caveats.append(f"world size {baseline_world_size} -> {now_world_size}")
    if baseline_job and now_job and baseline_job != now_job:
        out.notes.append(f"the reference is of another job ({baseline_job!r}, this capture {now_job!r}): compared "
                         "as asked, but its differences may be the jobs' rather than a regression")
        out.caveats.append(f"reference of another job ({baseline_job})")
    out.changes.extend(_software_changes(baseline_versions or {}, now_versions or {}))
    if not common:
        out.notes.append("no rank is in both captures: no component can be compared")
        return out
    step_ref = _per_step_means(baseline, common, "step_time_us")
    step_now = _per_step_means(now, common, "step_time_us")
    out.steps_baseline, out.steps_now = len(step_ref), len(step_now)
    if not step_ref or not step_now:
        out.notes.append("a capture has no step with a time breakdown for the compared ranks")
        return out
    ref_step_s, now_step_s = fmean(step_ref) / 1e6, fmean(step_now) / 1e6
    out.step_time_baseline_s, out.step_time_now_s = ref_step_s, now_step_s
    floor_s = floor_frac * _median(sorted(step_ref)) / 1e6  # the median: one huge step does not raise the floor
    sd = pooled_sd(step_ref, step_now)
    out.step_time_noise_s = None if sd is None else sd / 1e6
    if sd is None:
        out.notes.append("one step per capture: the noise is unknown, only the floor "
                         f"({100 * floor_frac:.1f} % of the reference step) decides what counts as a change")
    if telemetry_baseline_step_s is not None and telemetry_baseline_step_s > 0:
        diff = abs(ref_step_s - telemetry_baseline_step_s)
        if diff > max(TELEMETRY_MISMATCH_FRAC * telemetry_baseline_step_s, TELEMETRY_MISMATCH_S):
            out.notes.append(f"the reference capture's step time ({1e3 * ref_step_s:.1f} ms) differs from the "
                             f"telemetry baseline ({1e3 * telemetry_baseline_step_s:.1f} ms): the reference may not "
                             "show the healthy job")
    if len(step_ref) < SPREAD_MIN_STEPS:
        out.notes.append(f"{len(step_ref)} reference step(s): too few to measure the healthy step-to-step spread, "
                         f"only the floor ({100 * floor_frac:.1f} % of the median reference step) bounds a change")
    effect_s = max(floor_s, robust_spread(step_ref) / 1e6)
    _decide(out, baseline, now, common, step_ref, step_now, floor_s, effect_s, alpha, "; ".join(basis) or None)
    return out


def robust_spread(values: Sequence[float]) -> float:
    """The step-to-step noise of a healthy capture (``values``: its per-step values in order), robust to its rare
    slow steps and blind to its repeating structure, in the unit of ``values``: 1.4826 x the median absolute
    deviation (the normal-consistent MAD, Rousseeuw & Croux 1993); 0 below :data:`SPREAD_MIN_STEPS` values (the
    MAD of 2 steps is half their difference, no estimate of noise). A job whose steps repeat a cycle (gradient
    accumulation: 100, 200, 100, 200 ms) has a MAD of half the gap between its modes, structure rather than noise:
    for each cycle length ``p`` of 2-:data:`SPREAD_MAX_CYCLE` steps with at least 3 steps per phase, the MAD of the
    residuals (each value minus the median of its phase, steps ``i`` with the same ``i mod p``) is the spread
    without the cycle; when the smallest of them is below 1/3 of the plain MAD (the cycle explains most of the
    variation; phase medians of independent noise leave about 2/3 of it), it is the spread."""
    n = len(values)
    if n < SPREAD_MIN_STEPS:
        return 0.0
    plain = _mad(values)
    best = plain
    for p in range(2, min(SPREAD_MAX_CYCLE, n // 3) + 1):
        phase_median = [_median(sorted(values[i::p])) for i in range(p)]
        best = min(best, _mad([v - phase_median[i % p] for i, v in enumerate(values)]))
    return MAD_TO_SIGMA * (best if best < plain / 3 else plain)


def hodges_lehmann(ref: Sequence[float], now: Sequence[float]) -> float:
    """Hodges-Lehmann's shift of ``now`` from ``ref`` (Hodges & Lehmann 1963): the median of all ``now[j] -
    ref[i]`` differences, in their unit; robust to a few extreme values on either side. Raises ValueError when
    either is empty."""
    if not ref or not now:
        raise ValueError("both samples need a value")
    return _median(sorted(b - a for a in ref for b in now))


def _mad(values: Sequence[float]) -> float:
    med = _median(sorted(values))
    return _median(sorted(abs(x - med) for x in values))


def _median(xs: Sequence[float]) -> float:
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def _decide(out: Comparison, baseline: Sequence[RankStepSummary], now: Sequence[RankStepSummary], common: set[int],
            step_ref: list[float], step_now: list[float], floor_s: float, effect_s: float, alpha: float,
            basis: str | None) -> None:
    """Fill ``out``'s step-time test and components: each timed component tested both ways, Holm across all
    (:mod:`profwatch.core.verdict.shift_test`); a change counts when its hypothesis is rejected and it exceeds
    ``effect_s`` (seconds per step: the larger of ``floor_s`` and the reference's step-to-step spread); ``floor_s``
    is also the log scale's offset."""
    fields = dict(COMPONENT_FIELDS)
    if any(r.memory_us > 0 for r in (*baseline, *now) if r.rank in common):
        fields = {"compute": "computation_us", "memory": "memory_us", "communication": "communication_us",
                  "host": "free_us"}
    family = 2 * len(fields)
    rank_ok = rank_test_reaches(len(step_ref), len(step_now), alpha / family)
    offset = max(floor_s * 1e6, 1.0)  # µs: the log scale's offset (shift_test), at least 1 µs
    step_test, more, less = shift_test(step_ref, step_now, rank_test=rank_ok, alpha=alpha, offset=offset)
    out.step_time_p_value = step_test.p_value
    out.step_time_interval_s = _scaled(step_test.interval)
    step_delta = out.step_delta_s or 0.0
    shift_s = hodges_lehmann(step_ref, step_now) / 1e6
    out.step_time_shift_s = shift_s
    # the step time is one more question, both ways: Bonferroni over its two directions; decided on the typical
    # step's shift (one huge reference step moves the mean delta, not the shift), tested in the shift's direction
    step_p = step_test.p_value if more is None or less is None else (more if shift_s >= 0 else less)
    step_sig = step_p is None or step_p <= alpha / 2
    out.step_time_changed = step_sig and abs(shift_s) > effect_s
    tests: dict[Component, ShiftTest] = {}
    pvals: dict[str, float] = {}
    for comp, attr in fields.items():
        a, b = _per_step_means(baseline, common, attr), _per_step_means(now, common, attr)
        tests[comp], more, less = shift_test(a, b, rank_test=rank_ok, alpha=alpha, offset=offset)
        if more is not None and less is not None:
            pvals[f"{comp}+"], pvals[f"{comp}-"] = more, less
        noise = pooled_sd(a, b)
        delta_s = tests[comp].delta / 1e6
        out.components.append(Change(
            comp, delta_s, fmean(a) / 1e6, fmean(b) / 1e6,
            delta_s / step_delta if out.step_time_changed and step_delta != 0 else None,
            None if noise is None else noise / 1e6, basis=basis, p_value=tests[comp].p_value,
            interval_s_per_step=_scaled(tests[comp].interval), test=tests[comp].method))
    rejected = holm(pvals, alpha)
    timed = [c for c in out.components
             if abs(c.delta_s_per_step or 0.0) > effect_s
             and (tests[c.component].p_value is None
                  or f"{c.component}{'+' if (c.delta_s_per_step or 0.0) >= 0 else '-'}" in rejected)]
    timed.sort(key=lambda c: -abs(c.delta_s_per_step or 0.0))
    out.changes[:0] = timed
    methods = sorted({t.method for t in tests.values()} | {step_test.method})
    out.notes.append(f"a change counts when a one-sided test per component and direction rejects at "
                     f"{100 * alpha:g} % (Holm over {family} hypotheses; {', '.join(methods)}; "
                     f"{len(step_ref)} vs {len(step_now)} steps) and it exceeds {1e3 * effect_s:.2f} ms/step"
                     + (f" (the reference's own step-to-step spread, 1.4826 x MAD; the floor is {1e3 * floor_s:.2f})"
                        if effect_s > floor_s else " (the floor, a share of the median reference step)"))


def _scaled(iv: tuple[float, float] | None) -> tuple[float, float] | None:
    return None if iv is None else (iv[0] / 1e6, iv[1] / 1e6)


def _software_changes(ref: Mapping[str, str], now: Mapping[str, str]) -> list[Change]:
    out = []
    for key in sorted((set(ref) | set(now)) - IGNORED_VERSION_KEYS):
        a, b = ref.get(key) or "", now.get(key) or ""
        if a and b and a != b:
            out.append(Change("software", None, detail=f"{key} {a} -> {b}"))
    return out


def _span(ranks: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``0-2,5``."""
    parts: list[str] = []
    start = prev = None
    for r in sorted(ranks):
        if start is None:
            start = prev = r
        elif prev is not None and r == prev + 1:
            prev = r
        else:
            parts.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = prev = r
    if start is not None:
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ",".join(parts)


def headline(c: Comparison) -> str:
    """One line leading an alert: ``+8.0 ms/step: communication +7.6 ms, compute +0.30 ms`` (or why nothing), the
    reference's caveats in brackets (``[world size 8 -> 2; reference of another job (train-a)]``). Each change
    with 2-3 significant digits (``drilldown.delta_text``: ``compute +27 us``, never ``+0.0 ms``)."""
    if c.step_delta_s is None:
        return "no comparison: " + (c.notes[-1] if c.notes else "no data") + (
            " [" + "; ".join(c.caveats) + "]" if c.caveats else "")
    timed = [x for x in c.changes if x.delta_s_per_step is not None]
    other = [x for x in c.changes if x.delta_s_per_step is None]
    head = f"{excess_text(1e6 * c.step_delta_s)} since the reference"
    shift = c.step_time_shift_s
    if shift is not None and _disagree(c.step_delta_s, shift, c.step_time_baseline_s or 0.0):
        head = (f"{excess_text(1e6 * shift)} since the reference for the typical step (the mean "
                f"{excess_text(1e6 * c.step_delta_s)}, moved by a few extreme steps)")
    if not c.step_time_changed:
        head += " (within noise)"
    if timed:
        head += ": " + ", ".join(f"{x.component} {delta_text(1e6 * (x.delta_s_per_step or 0.0))}" for x in timed)
    elif c.step_time_changed:
        head += ": no single component changed above noise"
    if other:
        head += "; " + "; ".join(str(x.detail) for x in other)
    if c.caveats:
        head += " [" + "; ".join(c.caveats) + "]"
    return head


def _disagree(mean_delta: float, shift: float, scale: float) -> bool:
    """Whether the mean delta misleads about the typical step's shift (seconds): they differ by more than 1 % of
    ``scale`` (the reference step) and by another sign or a factor above 2."""
    if abs(mean_delta - shift) <= 0.01 * abs(scale):
        return False
    return (mean_delta > 0) != (shift > 0) or not 0.5 * abs(shift) <= abs(mean_delta) <= 2 * abs(shift)


def headline_line(comparison: Mapping[str, Any]) -> str:
    """The terminal line of a verdict's ``comparison`` (its JSON, :meth:`Comparison.to_json`, with ``reference``
    set by ``attach_comparison``): ``what changed (reference PATH): HEADLINE``. The :func:`headline` is the one
    text that says "since the reference" (once); callers print this line and add no such label of their own."""
    ref = comparison.get("reference")
    path = ref.get("path") if isinstance(ref, Mapping) else None
    where = f" (reference {path})" if path else ""
    return f"what changed{where}: {comparison.get('headline') or 'no comparison'}"


def impact_hours_per_day(c: Comparison, world_size: int) -> float | None:
    """Accelerator-hours a day the step-time change costs the job: ``world_size x 24 x delta / now step``."""
    if c.step_delta_s is None or not c.step_time_now_s or world_size < 1:
        return None
    return world_size * 24.0 * c.step_delta_s / c.step_time_now_s


def same_role_rank(rank: int, now_groups: Mapping[str, Sequence[int]], ref_groups: Mapping[str, Sequence[int]],
                   ref_ranks: Iterable[int]) -> tuple[int, str] | None:
    """The reference rank that plays the role of ``rank`` (a rank the reference capture does not hold), by its
    place in the communication groups (``parallel_group_info``; groups smaller than the world: name -> global
    ranks, ``now_groups`` from the capture, ``ref_groups`` from the reference; a group is known by its members).

    A reference rank ``q`` has the same role when it shares a group with ``rank`` and holds the same position
    (index among the sorted members) in groups of the same sizes in all its other groups: in a
    tensor x data x pipeline layout the rank's data-parallel peer (same stage, same tensor slice) and its
    pipeline peer (same slice and data shard, another stage) both qualify, as the group structure alone cannot
    tell which group is which. Of those, the nearest rank id is taken: in Megatron's default rank order
    (tensor fastest, pipeline slowest) that is a peer of the same pipeline stage. Returns ``(q, why)`` or None
    (no group known for ``rank``, or no such reference rank)."""
    def member_sets(groups: Mapping[str, Sequence[int]]) -> set[tuple[int, ...]]:
        return {tuple(sorted(set(g))) for g in groups.values() if g}

    known = member_sets(now_groups) | member_sets(ref_groups)
    mine = [g for g in known if rank in g]
    if not mine:
        return None

    def places(r: int, skip: set[tuple[int, ...]]) -> list[tuple[int, int]]:
        return sorted((len(g), g.index(r)) for g in known if r in g and g not in skip)

    found: list[tuple[int, int, tuple[int, ...]]] = []
    for q in sorted(set(ref_ranks) - {rank}):
        shared = {g for g in mine if q in g}
        if shared and places(q, shared) == places(rank, shared):
            g = max(shared, key=len)
            found.append((abs(q - rank), q, g))
    if not found:
        return None
    _, q, g = min(found)
    sizes = ", ".join(str(n) for n, _ in places(rank, {x for x in mine if q in x}))
    return q, (f"same role: in a group of {len(g)} ranks with it and at the same position in its other groups "
               f"(of {sizes} ranks)" if sizes else f"same role: in a group of {len(g)} ranks with it, no other group")


def frequency_changes(reference: Mapping[int, FreqSummary], now: Mapping[int, FreqSummary], *,
                      ranks: Sequence[int] | None = None, drop_frac: float = DROP_FRAC) -> list[Change]:
    """Ranks held by both captures (within ``ranks`` when given) whose busy AI Core frequency
    (:attr:`~profwatch.core.changes.hardware.FreqSummary.busy_mhz`: more idle time is not a hardware change) fell below their own reference's by
    more than ``drop_frac``: one ``hardware`` :class:`Change` per (reference MHz, now MHz) pair,
    rounded to the MHz, listing its ranks (the largest drop first); [] when none fell."""
    both = sorted(set(reference) & set(now) & (set(ranks) if ranks is not None else set(reference)))
    groups: dict[tuple[int, int], list[int]] = {}
    for r in both:
        a, b = reference[r].busy_mhz, now[r].busy_mhz
        if b < a * (1.0 - drop_frac):
            groups.setdefault((round(a), round(b)), []).append(r)
    out = []
    for (a, b), rs in sorted(groups.items(), key=lambda kv: (kv[0][1] - kv[0][0], kv[1][0])):
        below = sum(now[r].seconds_below(a * (1.0 - drop_frac)) for r in rs) / len(rs)
        window = sum(now[r].window_s for r in rs) / len(rs)
        shown = ", ".join(str(r) for r in rs[:16]) + (f" (+{len(rs) - 16} more)" if len(rs) > 16 else "")
        out.append(Change("hardware", None, detail=f"AI Core frequency of rank{'s' if len(rs) > 1 else ''} {shown}: "
                                                   f"{a} -> {b} MHz (reference -> now; {below:.3g} s of "
                                                   f"{window:.3g} s captured below it)"))
    return out
