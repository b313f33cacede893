"""Whether the ranks of a targeted capture wait for ranks it did not capture (pure).

A verdict over a subset compares the captured ranks with one another. When the rank they all wait for was not
captured, every captured rank waits about the same and nobody stands out: "no suspect" would claim more than the
data show (docs/verdicts.md). Each rank's own data say how long it waited for its peers, wherever they are (HCCL's
Notify-Wait time, ``CommAnalyzerTime.wait_time`` in its ``analysis.db``); msprof-analyze's cluster-level wait is
relative to the ranks analysed only. The rank that waits least among the captured ones arrives last among them:
what it still waits is the wait for ranks outside the capture.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from profwatch.core.batches.completeness import rank_ranges
from profwatch.core.verdict.evidence import RankStepSummary
from profwatch.core.verdict.impact import own_work_us
from profwatch.core.verdict.robust import mad_sigma, median

NOISE_FACTOR = 4.0
"""The outside wait must exceed this many times ``sqrt(C) x`` the captured ranks' between-rank sd of own work
per step (``C`` collectives per step): what noise alone leaves a rank waiting for a peer outside the capture is
about ``C`` times a fraction of a chunk's sd, well under that."""


def wait_outside(summaries: Sequence[RankStepSummary], own_waits: Mapping[int, Mapping[int, tuple[float, int]]],
                 captured: Sequence[int], job_world: int, *, min_effect_frac: float) -> dict[str, Any] | None:
    """What the captured ranks wait for ranks outside a targeted capture, or ``None`` when it is not shown.

    Args:
        summaries: the batch's per-(rank, step) time breakdown (µs).
        own_waits: rank -> step -> (own HCCL wait µs, collectives) (``ClusterEvidence.own_waits``).
        captured: the ranks the capture holds; job_world: the job's world size.
        min_effect_frac: the smallest wait, as a fraction of the step, worth reporting.

    Returns:
        ``{"wait_us_per_step", "wait_pct_of_step", "least_waiting_rank", "uncaptured": "4-7", "uncaptured_count",
        "named", "text"}`` when, in the median step, even the least-waiting captured rank waits at least
        ``min_effect_frac`` of the step and :data:`NOISE_FACTOR` noise sds; else ``None`` (also without own
        waits, or when no rank is outside the capture). ``named`` is the one uncaptured rank when only one is
        outside, else empty: a subset's data do not say which of the uncaptured ranks is late, and the text says so.
    """
    outside = job_world - len(set(captured))
    if outside <= 0 or not own_waits:
        return None
    by_step: dict[int, dict[int, RankStepSummary]] = {}
    for row in summaries:
        by_step.setdefault(row.step, {})[row.rank] = row
    least: list[tuple[float, float, float, int]] = []  # per step: (wait µs, step µs, noise µs, rank)
    for step, rows in by_step.items():
        waits = {r: own_waits[r][step] for r in rows if step in own_waits.get(r, {})}
        if len(waits) < max(1, len(rows) // 2):
            continue
        rank = min(waits, key=lambda r: (waits[r][0], r))
        t = median(r.step_time_us for r in rows.values())
        colls = median(float(n) for _, n in waits.values()) or 1.0
        noise = NOISE_FACTOR * math.sqrt(colls) * mad_sigma([own_work_us(r) for r in rows.values()])
        least.append((waits[rank][0], t, noise, rank))
    if not least:
        return None
    least.sort()
    wait_us, step_us, noise_us, rank = least[len(least) // 2]
    if step_us <= 0 or wait_us < max(min_effect_frac * step_us, noise_us):
        return None
    missing = sorted(set(range(job_world)) - set(captured))
    pct = 100.0 * wait_us / step_us
    lead = (f"the captured ranks wait for ranks outside the capture: even the one that waits least (rank {rank}) "
            f"waits {wait_us / 1e3:.1f} ms per step in collectives ({pct:.1f}% of the step)")
    if len(missing) == 1:
        named = missing
        tail = f"; they wait for rank {missing[0]}, the only rank not captured: capture it to judge it"
    else:
        named = []
        tail = (f"; the ranks they wait for were not captured and cannot be named from this capture (among the "
                f"{len(missing)} uncaptured ranks: {rank_ranges(missing)}): capture those ranks (or the whole job)"
                " to find them")
    return {"wait_us_per_step": round(wait_us, 3), "wait_pct_of_step": round(pct, 3), "least_waiting_rank": rank,
            "uncaptured": rank_ranges(missing), "uncaptured_count": len(missing), "named": named,
            "text": lead + tail}
