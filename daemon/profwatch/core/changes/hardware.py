"""AI Core frequency: ranks whose NPUs ran below their peers' or their reference's frequency (pure).

Source: the ``AICORE_FREQ`` table of each rank's ``ascend_pytorch_profiler_{rank}.db`` (``deviceId``,
``timestampNs``, ``freq`` in MHz; docs/msprof-analyze.md#ai-core-frequency). Each row is a sample of the device's AI
Core clock that holds until the next row, as msprof-analyze's advisor reads it (its timeline query pairs each row
with the next row's timestamp). msprof-analyze's ``freq_analysis`` recipe only lists the distinct frequencies of
each rank against a fixed set (1800 MHz the common clock, 800 MHz the idle clock); it does not say how long a rank
ran slow nor compare it with its peers. Here:

* :func:`summarise_freq`: one rank's time at each frequency over the captured steps' span, and the time-weighted
  mean (MHz);
* :func:`below_peers`: a rank whose time-weighted busy mean (idle clock left out, below) is below the median of the
  ranks' means by more than ``drop_frac`` (5 %: a clock step on these chips is 100 MHz or more, 5-6 % of 1800 MHz) ran slower hardware:
  kind ``hardware`` with its frequency, the peers', and how long it spent below them;
* a rank both captures hold whose busy mean fell below its own reference mean by more than ``drop_frac`` is a
  ``hardware`` change since the reference: :func:`profwatch.core.changes.comparison.frequency_changes` (that module
  owns :class:`~profwatch.core.changes.comparison.Change`; this one imports nothing of it, so the record of
  ``daemon/profwatch/core/verdict/evidence.py`` can hold a :class:`FreqSummary`).

A slower clock explains a slow rank (or a slow group) without a software cause: compute scales with the clock, so a
rank at 1200 MHz among peers at 1800 MHz does its kernels about 1.5x slower. Idle clocks are not a hardware cause:
a device clocks down to its idle :data:`IDLE_MHZ` while it has nothing to run (a rank waiting for a slower peer at a
collective, a data-loader stall), and msprof-analyze's ``freq_analysis`` lists {800, 1800} MHz apart as "free"
ranks for that reason. So ranks are compared on :attr:`FreqSummary.busy_mhz`, the time-weighted mean over the time
the clock was not at idle (the idle clock itself when it never left it; a clock below idle is throttled, not idle):
a rank that idled more than its peers is not named; the time-weighted mean over all the time stays in ``mean_mhz``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from profwatch.core.verdict.robust import median

DROP_FRAC = 0.05
"""Relative: a mean frequency this far below the peers' median (or the reference's) counts."""
IDLE_MHZ = 800.0
"""The AI Core's idle clock (MHz): msprof-analyze 26.2.0 ``freq_analysis`` reads a rank whose clocks are exactly
{800, 1800} MHz as one that clocked down while idle ("FreeFrequencyRanks"), not as abnormal."""
MAX_FINDINGS = 64
"""Ranks listed at most (the lowest first)."""


@dataclass(frozen=True, slots=True)
class FreqSummary:
    """One rank's AI Core clock over a window: ``mean_mhz`` (time-weighted), ``min_mhz``, ``window_s`` (seconds
    covered by samples), ``at`` ((MHz, seconds) per distinct frequency, most time first)."""

    mean_mhz: float
    min_mhz: float
    window_s: float
    at: tuple[tuple[float, float], ...]

    def seconds_below(self, mhz: float) -> float:
        """Seconds the clock spent below ``mhz``."""
        return sum(s for f, s in self.at if f < mhz)

    @property
    def idle_s(self) -> float:
        """Seconds the clock spent at the idle :data:`IDLE_MHZ` (a clock below it is no idle clock: throttled)."""
        return sum(s for f, s in self.at if f == IDLE_MHZ)

    @property
    def busy_mhz(self) -> float:
        """Time-weighted mean frequency (MHz) over the time the clock was not at the idle :data:`IDLE_MHZ`;
        ``mean_mhz`` when it always was (a clock held at idle the whole window)."""
        busy = [(f, s) for f, s in self.at if f != IDLE_MHZ]
        total = sum(s for _, s in busy)
        return sum(f * s for f, s in busy) / total if total > 0 else self.mean_mhz

    def to_json(self) -> dict[str, Any]:
        return {"mean_mhz": round(self.mean_mhz, 1), "busy_mhz": round(self.busy_mhz, 1),
                "min_mhz": round(self.min_mhz, 1),
                "window_s": round(self.window_s, 6), "at": [[round(f, 1), round(s, 6)] for f, s in self.at]}


def summarise_freq(rows: Iterable[tuple[Any, Any]], start_ns: int, end_ns: int) -> FreqSummary | None:
    """Summarise ``AICORE_FREQ`` rows ``(timestampNs, freq MHz)`` over ``[start_ns, end_ns)``: each sample holds
    until the next one (the last until ``end_ns``); the sample in force at ``start_ns`` is the last one at or before
    it (else the window starts at the first sample). Rows with a non-numeric, infinite or non-positive value are
    skipped. Returns None without a sample inside or
    before the window, or for an empty window."""
    clean: list[tuple[int, float]] = []
    for ts, freq in rows:
        try:
            t, f = int(ts), float(freq)
        except (TypeError, ValueError, OverflowError):
            continue
        if f > 0 and f == f and f < 1e6:
            clean.append((t, f))
    clean.sort()
    return summarise_sorted(clean, start_ns, end_ns)


def summarise_sorted(rows: Iterable[tuple[int, float]], start_ns: int, end_ns: int) -> FreqSummary | None:
    """:func:`summarise_freq` over clean rows ``(timestampNs int, freq MHz > 0)`` already in ascending
    ``(timestampNs, freq)`` order, in one pass and constant memory (a table of millions of samples is read from
    its cursor without a list); rows at or after ``end_ns`` end it."""
    if end_ns <= start_ns:
        return None
    at: dict[float, float] = {}
    cur: tuple[int, float] | None = None  # the sample in force, from its time (or start_ns)
    for t, f in rows:
        if t >= end_ns:
            break
        if t <= start_ns:
            cur = (start_ns, f)
            continue
        if cur is not None and t > cur[0]:  # a later sample at the same time replaces it, holding for no time
            at[cur[1]] = at.get(cur[1], 0.0) + (t - cur[0]) / 1e9
        cur = (t, f)
    if cur is None:
        return None
    at[cur[1]] = at.get(cur[1], 0.0) + (end_ns - cur[0]) / 1e9
    total = sum(at.values())
    if total <= 0:
        return None
    mean = sum(f * s for f, s in at.items()) / total
    ordered = tuple(sorted(at.items(), key=lambda x: (-x[1], -x[0])))
    return FreqSummary(mean, min(at), total, ordered)


def _text_at(s: FreqSummary) -> str:
    return ", ".join(f"{f:.0f} MHz for {sec:.3g} s" for f, sec in s.at[:4])


def below_peers(per_rank: Mapping[int, FreqSummary], *, drop_frac: float = DROP_FRAC) -> list[dict[str, Any]]:
    """Ranks whose busy AI Core frequency (:attr:`FreqSummary.busy_mhz`: idle time left out, so a rank that waited
    more than its peers is not named) is below the median of all ranks' by more than ``drop_frac``, the lowest
    first (at most :data:`MAX_FINDINGS`): ``{"rank", "kind": "hardware", "mean_mhz", "busy_mhz", "min_mhz",
    "peers_mhz" (the peers' median busy MHz), "seconds_below", "idle_s", "window_s", "text"}``. Needs at least 3
    ranks (the median of 2 is one of them); [] otherwise."""
    if len(per_rank) < 3:
        return []
    busy = {r: s.busy_mhz for r, s in per_rank.items()}
    peers = median(list(busy.values()))
    limit = peers * (1.0 - drop_frac)
    low = sorted((r for r, b in busy.items() if b < limit), key=lambda r: (busy[r], r))
    out = []
    for r in low[:MAX_FINDINGS]:
        s = per_rank[r]
        below = s.seconds_below(limit)
        idle = s.idle_s
        idle_text = f", {idle:.3g} s of it at the idle {IDLE_MHZ:.0f} MHz" if idle > 0 else ""
        out.append({"rank": r, "kind": "hardware", "mean_mhz": round(s.mean_mhz, 1), "busy_mhz": round(busy[r], 1),
                    "min_mhz": round(s.min_mhz, 1), "peers_mhz": round(peers, 1), "seconds_below": round(below, 6),
                    "idle_s": round(idle, 6), "window_s": round(s.window_s, 6),
                    "text": f"rank {r}'s AI Core ran at {busy[r]:.0f} MHz on average while busy against its peers' "
                            f"{peers:.0f} MHz ({_text_at(s)}; {below:.3g} s of {s.window_s:.3g} s captured below "
                            f"its peers{idle_text}): a hardware cause (clock throttled: power, thermal or a fault), "
                            "which slows its compute without a software cause"})
    return out
