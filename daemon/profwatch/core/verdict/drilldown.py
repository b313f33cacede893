"""Why a suspect rank is slow: its operators, kernels and collectives against its median peer's (pure).

The enrich phase compares each suspect rank with one peer, the rank whose step time is nearest the median of the
ranks not named (``median_peer``), as an engineer does in MindStudio Insight's timeline or HTA's TraceDiff: on
Ascend ``msprof-analyze compare`` (suspect as the comparison, the peer as the base; read by
``profwatch.core.changes.detail.entries_from_compare``), on torch.profiler traces the per-operator / kernel totals inside the step
windows (``profwatch.core.changes.detail.entries_from_op_totals``). Each yields :class:`~profwatch.core.changes.detail.DetailEntry`
rows, seconds per step, ``now`` = the suspect and ``baseline`` = the peer; :func:`excess_over_peer` keeps those where
the suspect spends more, largest first.

Shape of one suspect's drill-down (the verdict's ``op_compare`` list, ``docs/verdicts.md#drill-down``)::

    {"rank", "reference_rank", "steps", "source", "ops": [{"name", "kind", "component", "suspect_us_per_step",
     "reference_us_per_step", "excess_us_per_step", "ratio"}]}

``ratio`` is suspect / peer (0.0 when the peer has none of it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from profwatch.core.changes.detail import DetailEntry

DRILL_LIMIT = 8
"""Entries kept per suspect."""
MIN_EXCESS_FRAC = 0.01
"""An entry whose excess is below this share of the largest one is left out (noise of per-operator sums)."""


def median_peer(step_time_us: Mapping[int, float], named: Sequence[int]) -> int | None:
    """The rank whose step time is nearest the median of the ranks not in ``named`` (ties: the lower rank; an even
    count takes the upper median); None when no such rank."""
    times = {r: t for r, t in step_time_us.items() if r not in set(named)}
    if not times:
        return None
    mid = sorted(times.values())[len(times) // 2]
    return min(times, key=lambda r: (abs(times[r] - mid), r))


def excess_over_peer(entries: Sequence[DetailEntry], *, limit: int = DRILL_LIMIT,
                     min_frac: float = MIN_EXCESS_FRAC) -> list[dict[str, Any]]:
    """The entries where the suspect (``now``) spends more per step than its peer (``baseline``), largest excess
    first, at most ``limit``, none below ``min_frac`` of the largest; microseconds per step, rounded to 0.001."""
    rows = [e for e in entries if e.now_s_per_step - e.baseline_s_per_step > 0]
    rows.sort(key=lambda e: (-(e.now_s_per_step - e.baseline_s_per_step), e.kind, e.name))
    if not rows:
        return []
    top = rows[0].now_s_per_step - rows[0].baseline_s_per_step
    out = []
    for e in rows[:max(0, limit)]:
        excess = e.now_s_per_step - e.baseline_s_per_step
        if excess < min_frac * top:
            break
        out.append({"name": e.name, "kind": e.kind, "component": e.component,
                    "suspect_us_per_step": round(1e6 * e.now_s_per_step, 3),
                    "reference_us_per_step": round(1e6 * e.baseline_s_per_step, 3),
                    "excess_us_per_step": round(1e6 * excess, 3),
                    "ratio": round(e.now_s_per_step / e.baseline_s_per_step, 3) if e.baseline_s_per_step > 0 else 0.0})
    return out


def delta_text(us: float) -> str:
    """A signed time difference (``us``, microseconds) for people, with 2-3 significant digits: ``+12.1 ms`` from
    1 ms up, ``+0.15 ms`` from 100 us, ``+40 us`` and ``+2.5 us`` below (a fixed ``+0.0 ms`` said nothing of a 27
    us change). The one rule for every change shown: the drill-down (:func:`excess_text`), the "what changed"
    headline, the report and the CLI. A non-finite value (NaN, infinite) is ``unknown``, never ``+nan us``."""
    if not math.isfinite(us):
        return "unknown"
    a = abs(us)
    if a >= 1000:
        return f"{us / 1e3:+.1f} ms"
    if a >= 100:
        return f"{us / 1e3:+.2f} ms"
    return f"{us:+.0f} us" if a >= 10 else f"{us:+.1f} us"


def excess_text(us: float) -> str:
    """An excess per step (``us``, microseconds) for people: :func:`delta_text` per step (``+12.1 ms/step``,
    ``+0.15 ms/step``, ``+40 us/step``; ``+0.0 ms/step`` said nothing of a 40 us excess)."""
    return f"{delta_text(us)}/step"


def drilldown_text(item: Mapping[str, Any], *, top: int = 3, width: int = 60) -> str:
    """One line for an alert or a terminal: ``rank 6: aten::matmul +12.1 ms/step, ... over its median peer (rank
    3)``; names are cut to ``width`` characters (kernel names run to kilobytes)."""
    ops = [o for o in item.get("ops") or [] if isinstance(o, Mapping)][:max(0, top)]
    head = f"rank {item.get('rank')}: "
    peer = f" over its median peer (rank {item.get('reference_rank')})"
    if not ops:
        return head + "no operator stands out" + peer
    parts = []
    for o in ops:
        name = str(o.get("name") or "?")
        name = name if len(name) <= width else name[:width - 1] + "…"
        parts.append(f"{name} {excess_text(float(o.get('excess_us_per_step') or 0.0))}")
    return head + ", ".join(parts) + peer
