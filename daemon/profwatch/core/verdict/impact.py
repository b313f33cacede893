"""What a suspect costs the job: the step time saved if it were as fast as its peers, by what-if analysis (pure).

Source of the idea: J. Lin et al., "Understanding Stragglers in Large Model Training Using What-if Analysis",
OSDI '25 (USENIX; arXiv:2505.05713): replay the job with the straggler made as fast as the others and contrast the
simulated step time with the measured one. Here the replay is the synchronous-collective model behind
msprof-analyze's ``ClusterTimeSummary`` (Ascend/msprof-analyze ``cluster_time_summary`` recipe: a rank's wait is
its collective time minus the shortest of the same instance): every rank leaves a collective when the last one
has arrived, so each stretch of work between collectives lasts as long as its slowest rank, and the others wait
the difference.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist

from profwatch.core.verdict.evidence import Impact, RankStepSummary
from profwatch.core.verdict.robust import MAD_TO_SIGMA, loo_medians, median

HOURS_PER_DAY = 24.0


def own_work_us(row: RankStepSummary) -> float:
    """A rank's own work in a step (µs): ``computation + free``, the time it spends outside collectives."""
    return row.computation_us + row.free_us


def expected_max_z(n: int) -> float:
    """Expected maximum of ``n`` standard normal draws, Blom's approximation ``Phi^-1((n - 0.375) / (n + 0.25))``
    (G. Blom, *Statistical Estimates and Transformed Beta-Variables*, 1958); 0 for ``n <= 1``."""
    return NormalDist().inv_cdf((n - 0.375) / (n + 0.25)) if n > 1 else 0.0


def to_impact(saving_us: float, step_us: float, world_size: int) -> Impact:
    """:class:`Impact` of a saving of ``saving_us`` per step of ``step_us`` in a job of ``world_size``."""
    frac = saving_us / step_us if step_us > 0 else 0.0
    return Impact(saving_s_per_step=saving_us / 1e6, saving_pct_of_step=100.0 * frac,
                  accelerator_hours_per_day=frac * max(world_size, 0) * HOURS_PER_DAY)


def _step_time_us(rows: Mapping[int, RankStepSummary]) -> float:
    return median(r.step_time_us if r.step_time_us > 0 else own_work_us(r) + r.communication_us
                  for r in rows.values())


@dataclass(frozen=True, slots=True)
class SyncOverhead:
    """How much longer than the median rank's own work a step lasts when nobody is slow: ``overhead_us`` =
    ``E[max z over n ranks] x sqrt(tau^2 + C x sigma^2)`` with ``tau`` the spread of the ranks' persistent
    offsets and ``sigma`` their step-to-step spread (µs per step), ``C`` collectives per step."""

    overhead_us: float
    tau_us: float
    sigma_us: float
    ranks: int
    collectives_per_step: float


def sync_overhead(by_step: Mapping[int, Mapping[int, RankStepSummary]], exclude: Iterable[int], *,
                  collectives_per_step: float | None) -> SyncOverhead:
    """Expected synchronisation overhead of the ranks not in ``exclude`` (the innocent ranks).

    Notes:
        Each rank's own work per step, less the step's median, is a persistent offset plus step-to-step noise.
        ``sigma`` = robust within-rank spread (1.4826 x MAD of deviations from the rank's median, corrected for
        the median of ``S`` values), ``tau`` = robust between-rank spread of the ranks' mean deviations less the
        noise left in a mean of ``S`` steps. Between two collectives a rank does ``1/C`` of its step's work: its
        offset is ``tau / C`` and its noise ``sigma / sqrt(C)``, so the slowest of ``n`` ranks is about
        ``e_n x sqrt((tau / C)^2 + sigma^2 / C)`` late for each of the ``C`` collectives, ``e_n`` the expected
        maximum of ``n`` standard normals. Summed over the step: ``e_n x sqrt(tau^2 + C sigma^2)``. Without a
        known ``C`` one collective per step is assumed (the least overhead, so the largest saving).
    """
    skip = set(exclude)
    dev: dict[int, list[float]] = {}
    counts: list[int] = []
    for rows in by_step.values():
        work = {r: own_work_us(row) for r, row in rows.items() if r not in skip}
        if len(work) < 2:
            continue
        counts.append(len(work))
        base = median(work.values())
        for r, w in work.items():
            dev.setdefault(r, []).append(w - base)
    c = max(1.0, collectives_per_step or 1.0)
    if not dev:
        return SyncOverhead(0.0, 0.0, 0.0, 0, c)
    resid: list[float] = []
    lengths: list[int] = []
    means: list[float] = []
    series = list(dev.values())
    for xs in series[::max(1, len(series) // 2048)]:  # spreads from 2048 ranks are precise to a few %
        n = len(xs)
        lengths.append(n)
        means.append(sum(xs) / n)
        if n >= 2:
            m = median(xs)
            resid.extend(abs(x - m) for x in xs)
    s_typ = median(lengths)
    sigma = MAD_TO_SIGMA * median(resid) * math.sqrt(s_typ / max(1.0, s_typ - 1)) if resid else 0.0
    mid = median(means)
    between = MAD_TO_SIGMA * median(abs(x - mid) for x in means) if len(means) >= 3 else 0.0
    tau = math.sqrt(max(0.0, between * between - sigma * sigma / s_typ))
    n_ranks = int(median(counts))
    overhead = expected_max_z(n_ranks) * math.sqrt(tau * tau + c * sigma * sigma)
    return SyncOverhead(overhead, tau, sigma, n_ranks, c)


def _cap(rows: Mapping[int, RankStepSummary], fixed: set[int] | frozenset[int], saving: float) -> float:
    waits = [row.wait_us for r, row in rows.items() if r not in fixed and (row.wait_us > 0 or row.transmit_us > 0)]
    return min(saving, median(waits)) if waits else saving


def step_savings_us(rows: Mapping[int, RankStepSummary], fixed: set[int] | frozenset[int], *,
                    suspects: set[int] | frozenset[int] = frozenset(), overhead_us: float = 0.0) -> float:
    """Step time (µs) one step would save if the ranks in ``fixed`` did their peers' median own work.

    Notes:
        ``W_r`` = own work of rank r; ``B`` = median of ``W`` over the ranks that are not suspects (what a
        typical peer needs); ``O`` = the innocent ranks' synchronisation overhead (:func:`sync_overhead`).
        Today the step lasts ``max(max W, B + O)``; with ``fixed`` made typical it lasts
        ``max(B + O, max W over the suspects not fixed)``. The saving is the difference, at most the median
        peer's ``wait`` when wait data is present (peers cannot save more than they spend waiting).
    """
    if not rows or not fixed:
        return 0.0
    work = {r: own_work_us(row) for r, row in rows.items()}
    peers = [w for r, w in work.items() if r not in fixed and r not in suspects] or \
        [w for r, w in work.items() if r not in fixed] or list(work.values())
    base = median(peers) + overhead_us
    now = max(max(work.values()), base)
    after = max([base, *(w for r, w in work.items() if r in suspects and r not in fixed)])
    return _cap(rows, fixed, max(0.0, now - after))


def impact_of(by_step: Mapping[int, Mapping[int, RankStepSummary]], fixed: set[int] | frozenset[int], *,
              world_size: int, extra_us_per_step: Sequence[float] = (), suspects: Iterable[int] = (),
              collectives_per_step: float | None = None, overhead: SyncOverhead | None = None) -> Impact | None:
    """Mean what-if saving over the steps of ``by_step`` (step -> rank -> row) for the ranks ``fixed``.

    Args:
        by_step: the analysed steps' rows (µs).
        fixed: ranks made as fast as their peers (one suspect: "this rank alone fixed"; all suspects: the
            headline).
        world_size: accelerators of the job, for accelerator-hours per day.
        extra_us_per_step: further savings (µs per step) to add, e.g. slow links made as fast as their peers.
        suspects: every named suspect (default: ``fixed``); the others are the innocent ranks whose median and
            synchronisation overhead set the step time after the fix.
        collectives_per_step: collectives per step on a rank (for :func:`sync_overhead`; ``None``: 1).
        overhead: a :func:`sync_overhead` already computed for these suspects (saves recomputing it).

    Returns:
        :class:`Impact`, or ``None`` without steps. ``saving_pct_of_step`` is against the mean measured step
        time (median over ranks per step); ``accelerator_hours_per_day = saving / step x world_size x 24``.
    """
    named = set(suspects) | set(fixed)
    if overhead is None and fixed:
        overhead = sync_overhead(by_step, named, collectives_per_step=collectives_per_step)
    over = overhead.overhead_us if overhead is not None and fixed else 0.0
    savings: list[float] = []
    step_times: list[float] = []
    for rows in by_step.values():
        if not rows:
            continue
        step_times.append(_step_time_us(rows))
        savings.append(step_savings_us(rows, fixed, suspects=named, overhead_us=over) if fixed else 0.0)
    if not step_times:
        return None
    saving_us = sum(savings) / len(savings) + sum(extra_us_per_step)
    return to_impact(saving_us, sum(step_times) / len(step_times), world_size)


def single_rank_impacts(by_step: Mapping[int, Mapping[int, RankStepSummary]], ranks: Iterable[int], *,
                        world_size: int, collectives_per_step: float | None = None,
                        overhead: SyncOverhead | None = None) -> dict[int, Impact]:
    """:func:`impact_of` with ``fixed = {r}`` and ``suspects = ranks`` for each of ``ranks``, for all of them in
    O(S N log N) (per step: the peers' median, the two largest suspects' own work, leave-one-out median waits)."""
    wanted = set(ranks)
    if not wanted:
        return {}
    over = (overhead or sync_overhead(by_step, wanted, collectives_per_step=collectives_per_step)).overhead_us
    totals: dict[int, float] = dict.fromkeys(wanted, 0.0)
    step_times: list[float] = []
    for rows in by_step.values():
        if not rows:
            continue
        step_times.append(_step_time_us(rows))
        work = {r: own_work_us(row) for r, row in rows.items()}
        peers = [w for r, w in work.items() if r not in wanted]
        base = (median(peers) if peers else median(work.values())) + over
        now = max(max(work.values()), base)
        top = heapq.nlargest(2, ((r, w) for r, w in work.items() if r in wanted), key=lambda kv: kv[1])
        waiters = [r for r, row in rows.items() if row.wait_us > 0 or row.transmit_us > 0]
        loo = dict(zip(waiters, loo_medians([rows[r].wait_us for r in waiters]), strict=True))
        for r in wanted & set(rows):
            other = top[1][1] if top and top[0][0] == r and len(top) > 1 else (
                top[0][1] if top and top[0][0] != r else None)
            after = max(base, other) if other is not None else base
            saving = max(0.0, now - after)
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
