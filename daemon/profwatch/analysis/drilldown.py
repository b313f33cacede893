"""Why each suspect rank is slow, in the enrich phase (composition; the rules are pure, in
``daemon/profwatch/core/verdict/drilldown.py``; ``docs/verdicts.md#drill-down``): each suspect against its median
peer, operator by operator. torch.profiler: ``kineto_reader.compare_suspects`` (per-operator / kernel totals);
Ascend: ``msprof-analyze compare`` with the suspect's rank dir as the comparison and the peer's as the base, read
by ``profwatch.core.changes.detail.entries_from_compare``."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import structlog

from profwatch.adapters.tools.msprof_runner import MsprofRunner, RunTicket
from profwatch.changes.msprof_compare import compare_rank
from profwatch.core.changes.detail import entries_from_compare
from profwatch.core.verdict.drilldown import drilldown_text, excess_over_peer
from profwatch.core.verdict.evidence import RankStepSummary, RecipeStatus

log = structlog.get_logger()

SUSPECT_COMPARE = "suspect_compare"
"""Recipe name of the Ascend drill-down (its status in ``recipes``; the torch one is ``kineto_op_compare``)."""
DRILL_SUSPECTS = 3
"""Suspects drilled into, best first (each costs one compare run on Ascend)."""


def compare_ascend_suspects(runner: MsprofRunner, rank_dirs: Mapping[int, str], suspects: Sequence[int],
                            peer: int, summaries: Sequence[RankStepSummary], out_dir: Path, *,
                            batch_id: str, ticket: RunTicket | None = None) -> tuple[list[dict[str, Any]], RecipeStatus]:
    """``msprof-analyze compare`` of each suspect against ``peer`` through ``runner`` (enrich priority, its timeout
    and memory cap), one after the other; after a compare that timed out or hit the memory cap the others are not
    run (each would hold the enrich slot as long). ``ticket``: the analysis's (``Followup.ticket``); once it is
    cancelled no compare starts and the status is ``cancelled`` (default: a fresh ticket of ``batch_id``). Returns ``(op_compare entries, RecipeStatus)``; never raises
    for tool failures."""
    t0 = time.monotonic()
    steps: dict[int, set[int]] = {}
    for row in summaries:
        steps.setdefault(row.rank, set()).add(row.step)
    out: list[dict[str, Any]] = []
    failed: list[str] = []
    stop = ""
    ticket = ticket or runner.ticket(batch_id)
    for r in suspects:
        if r not in rank_dirs or peer not in rank_dirs:
            failed.append(f"rank {r}: no rank dir")
            continue
        if not stop and runner.cancelled(ticket):
            stop = "cancelled"
        if stop:
            failed.append(f"rank {r}: not compared (" + ("the analysis was cancelled: " + runner.cancelled(ticket)
                          if stop == "cancelled" else f"the compare before it ended {stop}") + ")")
            continue
        sheets, status = compare_rank(runner, Path(rank_dirs[r]), Path(rank_dirs[peer]), out_dir,
                                      name=f"{SUSPECT_COMPARE}_rank{r}", ticket=ticket)
        if sheets is None:
            failed.append(f"rank {r}: msprof-analyze compare {status.status}: {status.detail}")
            stop = status.status if status.status in ("timeout", "oom", "cancelled") else ""
            continue
        entries = entries_from_compare(sheets, steps_baseline=max(1, len(steps.get(peer, ()))),
                                       steps_now=max(1, len(steps.get(r, ()))))
        out.append({"rank": r, "reference_rank": peer, "steps": len(steps.get(r, ())),
                    "source": "msprof-analyze compare", "ops": excess_over_peer(entries)})
    took = round(time.monotonic() - t0, 3)
    detail = "; ".join([*(drilldown_text(c) for c in out), *failed])
    if not out:
        state: Any = "cancelled" if runner.cancelled(ticket) else stop or "tool_error"
        return [], RecipeStatus(SUSPECT_COMPARE, state, detail or "nothing compared", phase="enrich", duration_s=took)
    return out, RecipeStatus(SUSPECT_COMPARE, "ok", f"per step: {detail}", rows=sum(len(c["ops"]) for c in out),
                             phase="enrich", duration_s=took)
