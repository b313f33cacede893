"""Do profwatch's first verdict (own tables) and the msprof-analyze-based one agree? (pure)

The first alert of an Ascend batch is judged on rows profwatch computes from each rank's own tables
(``daemon/profwatch/core/verdict/own_tables.py``); msprof-analyze's ``cluster_time_summary`` + ``slow_rank`` run
after it as the confirmation. :func:`compare_verdicts` says whether the two name the same suspects and give the
same figures (each rank's own work and wait, each suspect's excess and saving), so a disagreement is stated in the
alert and the report, never hidden (docs/msprof-analyze.md#own-tables).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from profwatch.core.verdict.evidence import RankStepSummary, Suspect
from profwatch.core.verdict.robust import median

DEFAULT_TOLERANCE = 0.02
"""Largest relative difference of a figure for the two verdicts to agree (2 %)."""


@dataclass(slots=True)
class Agreement:
    """Outcome of :func:`compare_verdicts`.

    ``agree``: same suspects, same top suspect and every figure within ``tolerance``; ``max_diff_frac``: the
    largest relative difference of any figure; ``differences``: each disagreement in words (at most 8).
    """

    agree: bool
    same_top: bool
    first_suspects: list[int]
    confirmed_suspects: list[int]
    max_diff_frac: float
    tolerance: float
    differences: list[str] = field(default_factory=list)

    def sentence(self) -> str:
        """One line for the alert and the report."""
        if self.agree:
            return (f"msprof-analyze confirms the first verdict: same suspects {self.first_suspects or 'none'}, "
                    f"figures within {100 * self.max_diff_frac:.2f} % (limit {100 * self.tolerance:g} %)")
        return "msprof-analyze disagrees with the first verdict: " + "; ".join(self.differences)

    def to_json(self) -> dict[str, Any]:
        return {"agree": self.agree, "same_top_suspect": self.same_top, "first_suspects": self.first_suspects,
                "confirmed_suspects": self.confirmed_suspects, "max_diff_frac": round(self.max_diff_frac, 6),
                "tolerance": self.tolerance, "differences": list(self.differences), "sentence": self.sentence()}


def _per_rank(rows: Sequence[RankStepSummary]) -> dict[int, tuple[float, float]]:
    """rank -> (mean own work = computation + free, mean wait) over its steps, µs."""
    acc: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for r in rows:
        a = acc[r.rank]
        a[0] += r.computation_us + r.free_us
        a[1] += r.wait_us
        a[2] += 1
    return {rank: (a[0] / a[2], a[1] / a[2]) for rank, a in acc.items()}


def _rel(a: float, b: float, floor: float) -> float:
    return abs(a - b) / max(abs(a), abs(b), floor)


def compare_verdicts(first_rows: Sequence[RankStepSummary], first: Sequence[Suspect],
                     confirmed_rows: Sequence[RankStepSummary], confirmed: Sequence[Suspect], *,
                     tolerance: float = DEFAULT_TOLERANCE) -> Agreement:
    """Compare the first verdict (``first_rows`` judged into ``first``) with the confirmation.

    Figures and their scale: per rank, the mean own work (computation + free) and mean wait over its steps,
    relative to the larger of the two values and at least 1 % of the median step time (a wait of ~0 on the slow
    rank must not turn a 1 µs difference into 100 %); per suspect named by both, its ``effect_frac`` (excess, a
    fraction of the step; floor 0.001) and ``impact.saving_s_per_step`` (floor 1 µs). A rank present in one
    set of rows only is a difference.
    """
    diffs: list[str] = []
    worst = 0.0
    a_ranks, b_ranks = [s.rank for s in first], [s.rank for s in confirmed]
    same_top = (a_ranks[:1] == b_ranks[:1])
    if set(a_ranks) != set(b_ranks):
        diffs.append(f"first verdict names {a_ranks or 'no rank'}, msprof-analyze's {b_ranks or 'no rank'}")
    elif not same_top:
        diffs.append(f"top suspect rank {a_ranks[0]} first, rank {b_ranks[0]} after msprof-analyze")
    pa, pb = _per_rank(first_rows), _per_rank(confirmed_rows)
    steps = [r.step_time_us for r in confirmed_rows] or [r.step_time_us for r in first_rows]
    floor = max(0.01 * median(steps), 1e-9) if steps else 1.0
    only = sorted(set(pa) ^ set(pb))
    if only:
        diffs.append(f"ranks {only[:8]} in one breakdown only")
    for rank in sorted(set(pa) & set(pb)):
        for i, what in enumerate(("own work", "wait")):
            d = _rel(pa[rank][i], pb[rank][i], floor)
            worst = max(worst, d)
            if d > tolerance:
                diffs.append(f"rank {rank} {what} {pa[rank][i] / 1e3:.3f} ms vs {pb[rank][i] / 1e3:.3f} ms "
                             f"({100 * d:.1f} %)")
    by_rank = {s.rank: s for s in confirmed}
    for s in first:
        other = by_rank.get(s.rank)
        if other is None:
            continue
        pairs = [("excess", float(s.evidence.get("effect_frac") or 0.0),
                  float(other.evidence.get("effect_frac") or 0.0), 0.001)]
        if s.impact and other.impact:
            pairs.append(("saving", s.impact["saving_s_per_step"], other.impact["saving_s_per_step"], 1e-6))
        for what, x, y, fl in pairs:
            d = _rel(x, y, fl)
            worst = max(worst, d)
            if d > tolerance:
                diffs.append(f"suspect {s.rank} {what} {x:.4g} vs {y:.4g} ({100 * d:.1f} %)")
    return Agreement(agree=not diffs, same_top=same_top, first_suspects=a_ranks, confirmed_suspects=b_ranks,
                     max_diff_frac=worst, tolerance=tolerance, differences=diffs[:8])
