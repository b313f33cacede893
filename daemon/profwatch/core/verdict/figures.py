"""The invariants every figure of a report keeps (docs/report.md "Figures"), checked on the data (pure).

A report that breaks one claims more than its data show (docs/report.md: a real gloo job showed a rank waiting
1,674 ms per step in a 940 ms step with 874 ms of communication), so the report lists every broken invariant in
its notes instead of drawing it, and the tests check that none is broken on generated and real-torch batches.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from profwatch.core.verdict.evidence import RankStepSummary


def _tol_us(step_us: float) -> float:
    return 1.0 + 1e-6 * abs(step_us)  # rounding of µs values and float sums


def figure_violations(summaries: Sequence[RankStepSummary], rank_rows: Sequence[Any] = (),
                      suspects: Sequence[Mapping[str, Any]] = (), *, limit: int = 8) -> list[str]:
    """Broken invariants, as sentences (at most ``limit``; empty when every figure is consistent).

    Args:
        summaries: per-(rank, step) rows (µs); rows with a negative step (msprof-analyze's zero-fill) are skipped.
        rank_rows: the report's per-rank rows (``report_view.RankRow``: ``own_ms``, ``peer_own_ms``,
            ``own_delta_ms``, ``wait_caused_ms``, ``step_ms``).
        suspects: ``suspects[i]`` of the verdict payload (``rank``, ``impact``).

    Invariants: per row ``0 <= wait <= communication <= step time``, ``0 <= computation <= step time``,
    ``0 <= free <= step time``; per rank ``own-work difference = own work - peer median`` and ``wait caused >= 0``;
    per suspect ``0 <= saving <= the median step time`` and ``0 <= saving % of step <= 100``.
    """
    out: list[str] = []
    for r in summaries:
        if r.step < 0 or r.step_time_us <= 0:
            continue
        tol = _tol_us(r.step_time_us)
        checks = ((r.wait_us >= -tol, "wait < 0"), (r.wait_us <= r.communication_us + tol, "wait > communication"),
                  (r.communication_us <= r.step_time_us + tol, "communication > step time"),
                  (-tol <= r.computation_us <= r.step_time_us + tol, "computation outside [0, step time]"),
                  (-tol <= r.free_us <= r.step_time_us + tol, "free outside [0, step time]"))
        for ok, what in checks:
            if not ok:
                out.append(f"rank {r.rank} step {r.step}: {what} (step {r.step_time_us / 1e3:.1f} ms, communication "
                           f"{r.communication_us / 1e3:.1f} ms, wait {r.wait_us / 1e3:.1f} ms, computation "
                           f"{r.computation_us / 1e3:.1f} ms, free {r.free_us / 1e3:.1f} ms)")
    step_ms = {row.rank: row.step_ms for row in rank_rows}
    for row in rank_rows:
        if abs(row.own_delta_ms - (row.own_ms - row.peer_own_ms)) > 1e-6 * max(1.0, abs(row.own_ms)):
            out.append(f"rank {row.rank}: own-work difference {row.own_delta_ms:.3f} ms is not own work minus the "
                       f"peer median ({row.own_ms:.3f} - {row.peer_own_ms:.3f} ms)")
        if row.wait_caused_ms < 0:
            out.append(f"rank {row.rank}: wait caused {row.wait_caused_ms:.3f} ms < 0")
    for s in suspects:
        imp = s.get("impact")
        if not isinstance(imp, Mapping):
            continue
        saving_ms = 1e3 * float(imp.get("saving_s_per_step") or 0.0)
        pct = float(imp.get("saving_pct_of_step") or 0.0)
        step = step_ms.get(s.get("rank"))
        if saving_ms < 0 or not 0.0 <= pct <= 100.0 or (step is not None and saving_ms > step * (1 + 1e-6) + 1e-3):
            out.append(f"rank {s.get('rank')}: saving {saving_ms:.1f} ms/step ({pct:.1f}% of the mean step) outside "
                       f"[0, step time {step if step is not None else float('nan'):.1f} ms]")
    return out[:limit] + ([f"... and {len(out) - limit} more"] if len(out) > limit else [])
