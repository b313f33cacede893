"""AI Core frequency: ranks whose NPUs ran below their peers' or their reference's frequency (pure).

Source: the ``AICORE_FREQ`` table of each rank's ``ascend_pytorch_profiler_{rank}.db`` (``deviceId``,
``timestampNs``, ``freq`` in MHz; docs/msprof-analyze.md#ai-core-frequency). Each row is a sample of the device's AI
Core clock that holds until the next row, as msprof-analyze's advisor reads it (its timeline query pairs each row
with the next row's timestamp). msprof-analyze's ``freq_analysis`` recipe only lists the distinct frequencies of
each rank against a fixed set (1800 MHz the common clock, 800 MHz the idle clock); it does not say how long a rank
ran slow nor compare it with its peers. Here:

* :func:`summarise_freq`: one rank's time at each frequency over the captured steps' span, and the time-weighted
  mean (MHz);
* :func:`below_peers`: a rank whose time-weighted mean is below the median of the ranks' means by more than
  ``drop_frac`` (5 %: a clock step on these chips is 100 MHz or more, 5-6 % of 1800 MHz) ran slower hardware:
  kind ``hardware`` with its frequency, the peers', and how long it spent below them;
* :func:`frequency_changes`: a rank both captures hold whose mean fell below its own reference mean by more than
  ``drop_frac``: a :class:`~profwatch.core.verdict.changes.Change` of component ``hardware`` (``delta_s_per_step``
  None, ``detail`` the text).

A slower clock explains a slow rank (or a slow group) without a software cause: compute scales with the clock, so a
rank at 1200 MHz among peers at 1800 MHz does its kernels about 1.5x slower. Idle clocks (the device clocked down
while it waited) lower a rank's mean too; the text gives the time at each frequency so a reader can tell.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from profwatch.core.verdict.changes import Change
from profwatch.core.verdict.robust import median

DROP_FRAC = 0.05
"""Relative: a mean frequency this far below the peers' median (or the reference's) counts."""
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

    def to_json(self) -> dict[str, Any]:
        return {"mean_mhz": round(self.mean_mhz, 1), "min_mhz": round(self.min_mhz, 1),
                "window_s": round(self.window_s, 6), "at": [[round(f, 1), round(s, 6)] for f, s in self.at]}


def summarise_freq(rows: Iterable[tuple[Any, Any]], start_ns: int, end_ns: int) -> FreqSummary | None:
    """Summarise ``AICORE_FREQ`` rows ``(timestampNs, freq MHz)`` over ``[start_ns, end_ns)``: each sample holds
    until the next one (the last until ``end_ns``); the sample in force at ``start_ns`` is the last one at or before
    it (else the window starts at the first sample). Rows with a non-numeric or non-positive value are skipped.
    Returns None without a sample inside or before the window, or for an empty window."""
    clean: list[tuple[int, float]] = []
    for ts, freq in rows:
        try:
            t, f = int(ts), float(freq)
        except (TypeError, ValueError):
            continue
        if f > 0 and f == f and f < 1e6:
            clean.append((t, f))
    if end_ns <= start_ns or not clean:
        return None
    clean.sort()
    before = [x for x in clean if x[0] <= start_ns]
    inside = [x for x in clean if start_ns < x[0] < end_ns]
    points = ([(start_ns, before[-1][1])] if before else []) + inside
    if not points:
        return None
    at: dict[float, float] = {}
    for (t, f), nxt in zip(points, [*points[1:], (end_ns, 0.0)], strict=True):
        at[f] = at.get(f, 0.0) + max(0, nxt[0] - t) / 1e9
    total = sum(at.values())
    if total <= 0:
        return None
    mean = sum(f * s for f, s in at.items()) / total
    ordered = tuple(sorted(at.items(), key=lambda x: (-x[1], -x[0])))
    return FreqSummary(mean, min(at), total, ordered)


def _text_at(s: FreqSummary) -> str:
    return ", ".join(f"{f:.0f} MHz for {sec:.3g} s" for f, sec in s.at[:4])


def below_peers(per_rank: Mapping[int, FreqSummary], *, drop_frac: float = DROP_FRAC) -> list[dict[str, Any]]:
    """Ranks whose mean AI Core frequency is below the median of all ranks' means by more than ``drop_frac``, the
    lowest first (at most :data:`MAX_FINDINGS`): ``{"rank", "kind": "hardware", "mean_mhz", "min_mhz",
    "peers_mhz", "seconds_below", "window_s", "text"}``. Needs at least 3 ranks (the median of 2 is one of them);
    [] otherwise."""
    if len(per_rank) < 3:
        return []
    peers = median([s.mean_mhz for s in per_rank.values()])
    limit = peers * (1.0 - drop_frac)
    low = sorted((r for r, s in per_rank.items() if s.mean_mhz < limit), key=lambda r: (per_rank[r].mean_mhz, r))
    out = []
    for r in low[:MAX_FINDINGS]:
        s = per_rank[r]
        below = s.seconds_below(limit)
        out.append({"rank": r, "kind": "hardware", "mean_mhz": round(s.mean_mhz, 1), "min_mhz": round(s.min_mhz, 1),
                    "peers_mhz": round(peers, 1), "seconds_below": round(below, 6), "window_s": round(s.window_s, 6),
                    "text": f"rank {r}'s AI Core ran at {s.mean_mhz:.0f} MHz on average against its peers' "
                            f"{peers:.0f} MHz ({_text_at(s)}; {below:.3g} s of {s.window_s:.3g} s captured below "
                            f"its peers): a hardware cause (clock throttled: power, thermal or a fault), which "
                            "slows its compute without a software cause"})
    return out


def frequency_changes(reference: Mapping[int, FreqSummary], now: Mapping[int, FreqSummary], *,
                      ranks: Sequence[int] | None = None, drop_frac: float = DROP_FRAC) -> list[Change]:
    """Ranks held by both captures (within ``ranks`` when given) whose mean AI Core frequency fell below their own
    reference mean by more than ``drop_frac``: one ``hardware`` :class:`Change` per (reference MHz, now MHz) pair,
    rounded to the MHz, listing its ranks (the largest drop first); [] when none fell."""
    both = sorted(set(reference) & set(now) & (set(ranks) if ranks is not None else set(reference)))
    groups: dict[tuple[int, int], list[int]] = {}
    for r in both:
        a, b = reference[r].mean_mhz, now[r].mean_mhz
        if b < a * (1.0 - drop_frac):
            groups.setdefault((round(a), round(b)), []).append(r)
    out = []
    for (a, b), rs in sorted(groups.items(), key=lambda kv: (kv[0][1] - kv[0][0], kv[1][0])):
        below = sum(now[r].seconds_below(a * (1.0 - drop_frac)) for r in rs) / len(rs)
        window = sum(now[r].window_s for r in rs) / len(rs)
        shown = ", ".join(str(r) for r in rs[:16]) + (f" (+{len(rs) - 16} more)" if len(rs) > 16 else "")
        out.append(Change("hardware", None, detail=f"AI Core frequency of rank{'s' if len(rs) > 1 else ''} {shown}: "
                                                   f"{a} -> {b} MHz since the reference ({below:.3g} s of "
                                                   f"{window:.3g} s captured below it)"))
    return out
