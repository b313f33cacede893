"""Per-rank excess signals of one batch, computed column-wise per step and pooled per rank (pure).

Used by :mod:`profwatch.core.verdict.ranking`. Each step is handled as columns (one list per signal, ranks in sorted order)
with leave-one-out medians from one sort, and per-rank pooling works on ``zip(*columns)``: the whole table costs
O(S N log N) with small constants, so 16,384 ranks x 5 steps take well under a second in pure Python. Units: every
signal is a fraction of the step's median step time; raw values are microseconds as in ``RankStepSummary``.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from profwatch.core.verdict.evidence import MAX_ROW_US, RankStepSummary, row_in_bounds, usable_row
from profwatch.core.verdict.robust import loo_medians, median, within_sigma

_WITHIN_SAMPLE = 2048
SIGNALS = ("comp", "free", "own", "comm", "late", "link")
"""``comp``/``free``: computation / free-time excess; ``own`` their sum (own work); ``comm``: collective time not
explained by waiting; ``late``: how much less than its peers the rank waits (peers wait for it); ``link``: link
time excess from the advisor's per-rank "slow link" sheet."""
_DIGITS = re.compile(r"-?\d+")
MIN_STEP_US = 1e-3
"""Floor (µs) of a step's median step time as the unit of the excess signals: a nanosecond, shorter than any real
step. A positive step time below it (a parsing error such as 1e-300) would make the excess of an ordinary
computation time overflow a float."""


def _num(value: Any) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return 0.0
    return x if math.isfinite(x) else 0.0


def parse_link_rows(rows: Iterable[Mapping[str, Any]]) -> dict[int, dict[int, tuple[float, float]]]:
    """msprof-analyze advisor "slow link" sheet rows -> ``step -> rank -> (link_time_us, bandwidth_GBps)``.

    Columns (advisor ``-l en``): ``step, rank_id, RDMA bandwidth(GB/s), RDMA size(mb), RDMA time(ms), SDMA
    bandwidth(GB/s), SDMA size(mb), SDMA time(ms)``. Time is RDMA + SDMA time; bandwidth is total size / total
    time. Rows without a parseable step/rank, with zero time or with a time past
    :data:`~profwatch.core.verdict.evidence.MAX_ROW_US` are skipped.
    """
    out: dict[int, dict[int, tuple[float, float]]] = defaultdict(dict)
    for row in rows:
        step_m = _DIGITS.search(str(row.get("step", "")))
        rank_m = _DIGITS.search(str(row.get("rank_id", "")))
        if not step_m or not rank_m:
            continue
        t_ms = _num(row.get("RDMA time(ms)")) + _num(row.get("SDMA time(ms)"))
        size_mb = _num(row.get("RDMA size(mb)")) + _num(row.get("SDMA size(mb)"))
        if not 0 < t_ms * 1e3 <= MAX_ROW_US:
            continue
        out[int(step_m.group())][int(rank_m.group())] = (t_ms * 1e3, size_mb / 1024 / (t_ms / 1e3))
    return dict(out)


def valid_rows(summaries: Sequence[RankStepSummary]) -> tuple[dict[int, dict[int, RankStepSummary]], list[str]]:
    """Group rows by step, dropping rows that cannot carry a signal (steps with one rank are kept: the caller
    compares only steps with two or more). Returns ``(step -> rank -> row, notes)``."""
    by_step: dict[int, dict[int, RankStepSummary]] = defaultdict(dict)
    notes: list[str] = []
    dropped = 0
    out_of_bounds = 0
    empty_steps: set[int] = set()
    for row in summaries:
        if not row_in_bounds(row):
            out_of_bounds += 1
            continue
        if not usable_row(row):
            dropped += 1  # msprof-analyze zero-fills a rank whose sources are missing (step -1 rows, zeros)
            if row.step >= 0:
                empty_steps.add(row.step)
            continue
        by_step[row.step][row.rank] = row
    if dropped:
        said = (f" (steps {sorted(empty_steps)[:8]} without computation or communication: zero-filled, or "
                "truncated by the profiler's stop)" if empty_steps else "")
        notes.append(f"left out {dropped} summary row(s) that carry no work{said}")
    if out_of_bounds:
        notes.append(f"left out {out_of_bounds} summary row(s) with a time that is not finite or beyond "
                     f"{MAX_ROW_US / 86400e6:g} days (a unit or parsing error)")
    return dict(by_step), notes


@dataclass(slots=True)
class StepColumns:
    """One step as columns over ``ranks`` (sorted): excess per signal (``None`` where the rank has no value),
    peers' leave-one-out medians (µs) of computation, free and wait, and link bandwidth against peers."""

    step: int
    ranks: list[int]
    t_step_us: float
    ex: dict[str, list[float | None]]
    peer_us: dict[str, list[float | None]]
    link_ratio: list[float | None]
    pos: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.pos = {r: i for i, r in enumerate(self.ranks)}


def _loo(vals: list[float | None]) -> list[float | None]:
    """Leave-one-out medians over the non-None entries; None where the entry is None."""
    if None not in vals:
        return loo_medians(vals)  # type: ignore[arg-type]
    idx = [i for i, v in enumerate(vals) if v is not None]
    out: list[float | None] = [None] * len(vals)
    for i, m in zip(idx, loo_medians([vals[i] for i in idx]), strict=True):  # type: ignore[misc]
        out[i] = m
    return out


def step_columns(step: int, rows: Mapping[int, RankStepSummary], link: Mapping[int, tuple[float, float]],
                 unreliable: set[int]) -> StepColumns | None:
    """Excess columns of one step (``None`` when its median step time is not positive). Adds ranks whose wait
    is zero-filled (no wait and no transmit while peers have transmit time) to ``unreliable``. The median step
    time is floored at :data:`MIN_STEP_US`, so with rows in :func:`~profwatch.core.verdict.evidence.row_in_bounds`
    every excess is finite and within a few ``MAX_ROW_US / MIN_STEP_US`` (~6e14) in magnitude: its square, the
    within-rank variance, cannot overflow."""
    ranks = sorted(rows)
    rs = [rows[k] for k in ranks]
    t = median(r.step_time_us if r.step_time_us > 0 else r.computation_us + r.communication_us + r.free_us
               for r in rs)
    if t <= 0:
        return None
    t = max(t, MIN_STEP_US)
    comp = [r.computation_us for r in rs]
    free = [r.free_us for r in rs]
    own = [c + f for c, f in zip(comp, free, strict=True)]
    last = max(own)
    # non-overlapped collective time (stepTime = computation + comm not overlapped + free) minus the wait a rank
    # must spend for the last arrival: collective time not explained by waiting
    unexplained = [(min(r.communication_us, max(0.0, r.step_time_us - r.computation_us - r.free_us))
                    if r.step_time_us > 0 else r.communication_us) - (last - o) for r, o in zip(rs, own, strict=True)]
    any_tx = any(r.transmit_us > 0 for r in rs)
    wait: list[float | None] = [None if (any_tx and r.communication_us > 0 and r.wait_us <= 0 and r.transmit_us <= 0)
                                else r.wait_us for r in rs]
    if any_tx and None in wait:
        unreliable.update(k for k, w in zip(ranks, wait, strict=True) if w is None)
    inv = 1.0 / t
    ex: dict[str, list[float | None]] = {}
    peer: dict[str, list[float | None]] = {}
    for name, vals in (("comp", comp), ("free", free), ("own", own), ("comm", unexplained)):
        ref = loo_medians(vals)
        ex[name] = [(v - r0) * inv if r0 is not None else 0.0 for v, r0 in zip(vals, ref, strict=True)]
        if name in ("comp", "free"):
            peer["computation_us" if name == "comp" else "free_us"] = ref
    wref = _loo(wait)
    ex["late"] = [(r0 - w) * inv if (w is not None and r0 is not None) else None for w, r0 in zip(wait, wref, strict=True)]
    peer["wait_us"] = wref
    if not link:
        nothing: list[float | None] = [None] * len(ranks)
        ex["link"] = nothing
        return StepColumns(step, ranks, t, ex, peer, nothing)
    lt: list[float | None] = [link[k][0] if k in link else None for k in ranks]
    lb: list[float | None] = [link[k][1] if k in link else None for k in ranks]
    ltr, lbr = _loo(lt), _loo(lb)
    ex["link"] = [min(1.0, (v - r0) * inv) if (v is not None and r0 is not None) else None
                  for v, r0 in zip(lt, ltr, strict=True)]
    ratio = [v / r0 if (v is not None and r0) else None for v, r0 in zip(lb, lbr, strict=True)]
    return StepColumns(step, ranks, t, ex, peer, ratio)


@dataclass(slots=True)
class SignalTable:
    """All steps' columns and every rank's pooled signals.

    ``pooled[signal][rank]``: see :func:`pool` (``comp``/``free`` over the steps ``own`` kept); ``left_out[rank]``:
    the index of the step ``own`` left out. ``n_steps[rank]``: steps with an own-work value. ``within[signal]``:
    robust within-rank step-to-step sigma and the median number of steps per rank.
    """

    columns: list[StepColumns]
    by_step: dict[int, dict[int, RankStepSummary]]
    pooled: dict[str, dict[int, float]] = field(default_factory=dict)
    n_steps: dict[int, int] = field(default_factory=dict)
    within: dict[str, tuple[float, float]] = field(default_factory=dict)
    left_out: dict[int, int] = field(default_factory=dict)
    unreliable: set[int] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)
    steps_seen: list[int] = field(default_factory=list)
    """Every step with a usable row, sorted, also those with one rank (a one-rank job's steps)."""

    def step_of(self, rank: int, name: str, index: int) -> int | None:
        """The step number of entry ``index`` of :meth:`series` ``(rank, name)`` (``None`` when out of range)."""
        k = 0
        for c in self.columns:
            i = c.pos.get(rank)
            if i is not None and c.ex[name][i] is not None:
                if k == index:
                    return c.step
                k += 1
        return None

    def series(self, rank: int, name: str) -> list[float]:
        """The rank's per-step values of one signal (steps where it has one)."""
        out = []
        for c in self.columns:
            i = c.pos.get(rank)
            if i is not None and (v := c.ex[name][i]) is not None:
                out.append(v)
        return out

    def details(self, rank: int) -> dict[str, Any]:
        """Medians over steps of the rank's own metrics (µs), its peers' (leave-one-out) medians and its link
        bandwidth ratio: ``{"median_us": {...}, "peer_median_us": {...}, "bandwidth_ratio": float | None}``."""
        mine: dict[str, list[float]] = defaultdict(list)
        peers: dict[str, list[float]] = defaultdict(list)
        ratios: list[float] = []
        for c in self.columns:
            i = c.pos.get(rank)
            if i is None:
                continue
            row = self.by_step[c.step][rank]
            for m in ("step_time_us", "computation_us", "communication_us", "wait_us", "transmit_us", "free_us"):
                mine[m].append(float(getattr(row, m)))
            for m, vals in c.peer_us.items():
                if vals[i] is not None:
                    peers[m].append(vals[i])  # type: ignore[arg-type]
            if c.link_ratio[i] is not None:
                ratios.append(c.link_ratio[i])  # type: ignore[arg-type]
        return {"median_us": {m: median(v) for m, v in mine.items() if v},
                "peer_median_us": {m: median(v) for m, v in peers.items() if v},
                "bandwidth_ratio": median(ratios) if ratios else None}


def _per_rank(columns: list[StepColumns], name: str, same: bool) -> dict[int, list[float]]:
    """rank -> its values of ``name`` over steps (None entries left out)."""
    if same:
        ranks = columns[0].ranks
        out = {}
        for r, vals in zip(ranks, zip(*(c.ex[name] for c in columns), strict=True), strict=True):
            if None in vals:
                vals = tuple(v for v in vals if v is not None)
            if vals:
                out[r] = list(vals)
        return out
    acc: dict[int, list[float]] = defaultdict(list)
    for c in columns:
        for r, v in zip(c.ranks, c.ex[name], strict=True):
            if v is not None:
                acc[r].append(v)
    return dict(acc)


def _within(series: Iterable[list[float]]) -> tuple[float, float]:
    """Within-rank step-to-step sigma (:func:`~profwatch.core.verdict.robust.within_sigma`: unbiased at 2-4 steps,
    robust to a few ranks with a one-off spike) and the median series length. Above 2,048 ranks every k-th rank
    is used (the estimate is then precise to ~2 %)."""
    all_series = list(series)
    if not all_series:
        return 0.0, 0.0
    stride = max(1, len(all_series) // _WITHIN_SAMPLE)
    sample = all_series[::stride]
    sigma, _ = within_sigma(sample)
    return sigma, float(median(len(xs) for xs in sample))


def pool(xs: Sequence[float], sigma_within: float, trim_z: float) -> tuple[float, int | None]:
    """A rank's pooled value of one signal and the index of the step left out (``None`` if none).

    The mean over its steps, except that its worst (largest) step is left out when it stands out from the rank's
    own other steps by more than ``trim_z`` within-rank sigmas (``sqrt(2)`` times that for two steps): a one-off
    delay is not evidence of a slow rank, a consistent excess is pooled in full.
    """
    n = len(xs)
    if n == 1:
        return xs[0], None
    limit = trim_z * max(sigma_within, 1e-12) * (math.sqrt(2.0) if n == 2 else 1.0)
    if max(xs) - min(xs) <= limit:  # the worst step cannot stand out from the others: the common case, O(n)
        return sum(xs) / n, None
    i = max(range(n), key=xs.__getitem__)
    rest = [x for j, x in enumerate(xs) if j != i]
    ref = rest[0] if n == 2 else median(rest)
    if xs[i] - ref > limit:
        return sum(rest) / (n - 1), i
    return sum(xs) / n, None


def measure_signals(summaries: Sequence[RankStepSummary], link_rows: Iterable[Mapping[str, Any]] = (), *,
                    trim_z: float = 3.0) -> SignalTable:
    """Every rank's per-step excess and pooled value of each signal (see :data:`SIGNALS` and :func:`pool`).

    References are leave-one-out medians: a rank is compared with the median of the *other* ranks of the step,
    so a slow rank does not pull its own reference (this matters for 2- and 3-rank groups). ``comp`` and ``free``
    are pooled over the same steps as ``own`` (so the kind always explains the excess that was tested).
    """
    all_steps, notes = valid_rows(summaries)
    by_step = {s: r for s, r in all_steps.items() if len(r) >= 2}
    links = parse_link_rows(link_rows)
    unreliable: set[int] = set()
    columns = [c for s in sorted(by_step) if (c := step_columns(s, by_step[s], links.get(s, {}), unreliable))]
    table = SignalTable(columns, by_step, unreliable=unreliable, notes=notes, steps_seen=sorted(all_steps))
    if unreliable:
        notes.append(f"wait time unusable (zero-filled) for ranks {sorted(unreliable)}")
    if not columns:
        return table
    same = all(c.ranks == columns[0].ranks for c in columns)
    own = _per_rank(columns, "own", same)
    comp = _per_rank(columns, "comp", same)
    free = _per_rank(columns, "free", same)
    table.n_steps = {r: len(v) for r, v in own.items()}
    pooled: dict[str, dict[int, float]] = {"own": {}, "comp": {}, "free": {}}
    table.within["own"] = _within(own.values())
    sigma_own = table.within["own"][0]
    for r, xs in own.items():
        value, left_out = pool(xs, sigma_own, trim_z)
        pooled["own"][r] = value
        cs, fs = comp[r], free[r]
        if left_out is None:
            pooled["comp"][r] = sum(cs) / len(cs)
            pooled["free"][r] = sum(fs) / len(fs)
        else:
            table.left_out[r] = left_out
            pooled["comp"][r] = (sum(cs) - cs[left_out]) / (len(cs) - 1)
            pooled["free"][r] = (sum(fs) - fs[left_out]) / (len(fs) - 1)
    for name in ("comm", "late", "link"):
        if all(c.ex[name][0] is None and c.ex[name][-1] is None and not any(v is not None for v in c.ex[name])
               for c in columns):
            continue
        per = _per_rank(columns, name, same)
        if not per:
            continue
        table.within[name] = _within(per.values())
        sigma = table.within[name][0]
        pooled[name] = {r: pool(xs, sigma, trim_z)[0] for r, xs in per.items()}
    table.pooled = pooled
    return table
