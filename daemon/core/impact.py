"""What a suspect costs the job: the step time saved if it were as fast as its peers, by what-if analysis (pure).

Source of the idea: J. Lin et al., "Understanding Stragglers in Large Model Training Using What-if Analysis",
OSDI '25 (USENIX; arXiv:2505.05713): replay the job with the straggler made as fast as the others and contrast the
simulated step time with the measured one. Here the replay is the synchronous-collective model of
msprof-analyze's ``ClusterTimeSummary`` (section 5 of the msprof-analyze notes in ``docs/verdicts.md``): every rank
leaves a step's collectives when the last one has arrived, so a step lasts as long as the slowest rank's own work
(``computation + free``) plus the transfer, and the others wait the difference (their ``wait``).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence

from daemon.core.evidence import Impact, RankStepSummary
from daemon.core.robust import loo_medians, median

HOURS_PER_DAY = 24.0


def own_work_us(row: RankStepSummary) -> float:
    """A rank's own work in a step (µs): ``computation + free``, the time before it can join the collectives."""
    return row.computation_us + row.free_us


def step_savings_us(rows: Mapping[int, RankStepSummary], fixed: set[int] | frozenset[int]) -> float:
    """Step time (µs) one step would save if the ranks in ``fixed`` did the median rank's own work.

    Notes:
        ``W_r`` = own work of rank r; ``B`` = median of ``W`` over the other ranks (what a typical peer needs);
        today the step waits for ``max W``; with ``fixed`` made typical it waits for
        ``max(B, max W over the others)``. The saving is the difference, at most the median peer's ``wait``
        when wait data is present (peers cannot save more time than they spend waiting). With several
        collectives per step the true critical path is the sum of per-collective maxima, so this per-step
        estimate is slightly optimistic, by about the spread of the innocent ranks' own work.
    """
    if not rows or not fixed:
        return 0.0
    work = {r: own_work_us(row) for r, row in rows.items()}
    others = [w for r, w in work.items() if r not in fixed]
    base = median(others) if others else median(work.values())
    now = max(work.values())
    after = max([base, *others])
    saving = max(0.0, now - after)
    waits = [row.wait_us for r, row in rows.items() if r not in fixed and (row.wait_us > 0 or row.transmit_us > 0)]
    if waits:
        saving = min(saving, median(waits))
    return saving


def impact_of(by_step: Mapping[int, Mapping[int, RankStepSummary]], fixed: set[int] | frozenset[int], *,
              world_size: int, extra_us_per_step: Sequence[float] = ()) -> Impact | None:
    """Mean what-if saving over the steps of ``by_step`` (step -> rank -> row) for the ranks ``fixed``.

    Args:
        by_step: the analysed steps' rows (µs).
        fixed: ranks made as fast as their peers (one suspect: "this rank alone fixed"; all suspects: the
            headline).
        world_size: accelerators of the job, for accelerator-hours per day.
        extra_us_per_step: further savings (µs per step) to add, e.g. slow links made as fast as their peers.

    Returns:
        :class:`Impact`, or ``None`` without steps. ``saving_pct_of_step`` is against the mean measured step
        time (median over ranks per step); ``accelerator_hours_per_day = saving / step x world_size x 24``.
    """
    savings: list[float] = []
    step_times: list[float] = []
    for rows in by_step.values():
        if not rows:
            continue
        step_times.append(_step_time_us(rows))
        savings.append(step_savings_us(rows, fixed) if fixed else 0.0)
    if not step_times:
        return None
    saving_us = sum(savings) / len(savings) + sum(extra_us_per_step)
    return to_impact(saving_us, sum(step_times) / len(step_times), world_size)


def _step_time_us(rows: Mapping[int, RankStepSummary]) -> float:
    return median(r.step_time_us if r.step_time_us > 0 else own_work_us(r) + r.communication_us
                  for r in rows.values())


def to_impact(saving_us: float, step_us: float, world_size: int) -> Impact:
    """:class:`Impact` of a saving of ``saving_us`` per step of ``step_us`` in a job of ``world_size``."""
    frac = saving_us / step_us if step_us > 0 else 0.0
    return Impact(saving_s_per_step=saving_us / 1e6, saving_pct_of_step=100.0 * frac,
                  accelerator_hours_per_day=frac * max(world_size, 0) * HOURS_PER_DAY)


def single_rank_impacts(by_step: Mapping[int, Mapping[int, RankStepSummary]], ranks: Iterable[int], *,
                        world_size: int) -> dict[int, Impact]:
    """:func:`impact_of` with ``fixed = {r}`` for each of ``ranks``, in O(S N log N) for all of them together
    (per step: the median, the two largest own works and leave-one-out median waits, then O(1) per rank)."""
    wanted = set(ranks)
    if not wanted:
        return {}
    totals: dict[int, float] = dict.fromkeys(wanted, 0.0)
    step_times: list[float] = []
    for rows in by_step.values():
        if not rows:
            continue
        step_times.append(_step_time_us(rows))
        work = {r: own_work_us(row) for r, row in rows.items()}
        peers_median = dict(zip(work, loo_medians(list(work.values())), strict=True))
        top = heapq.nlargest(2, work.items(), key=lambda kv: kv[1])
        waiters = [r for r, row in rows.items() if row.wait_us > 0 or row.transmit_us > 0]
        loo = dict(zip(waiters, loo_medians([rows[r].wait_us for r in waiters]), strict=True))
        for r in wanted & set(rows):
            base = peers_median[r]
            if base is None:
                continue
            second = top[1][1] if len(top) > 1 else base
            after = max(base, second if r == top[0][0] else top[0][1])
            saving = max(0.0, top[0][1] - after)
            cap = loo.get(r) if r in loo else (median(rows[w].wait_us for w in waiters) if waiters else None)
            totals[r] += min(saving, cap) if cap is not None else saving
    if not step_times:
        return {}
    step_us = sum(step_times) / len(step_times)
    return {r: to_impact(t / len(step_times), step_us, world_size) for r, t in totals.items()}


def link_saving_us(transit_us: Sequence[float], peer_transit_us: Sequence[float]) -> float:
    """Per-step saving (µs) of a slow link made as fast as its peers: mean over steps of its transit time minus
    the peers' median transit time in the same step (a ring collective moves at the pace of its slowest link,
    so the whole group waits that difference). Pairs the two sequences step by step; negative steps count 0."""
    diffs = [max(0.0, t - p) for t, p in zip(transit_us, peer_transit_us, strict=False)]
    return sum(diffs) / len(diffs) if diffs else 0.0
