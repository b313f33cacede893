"""Judge what a node's torch_npu leftovers mean for dynamic profiling (pure; time passed in).

torch_npu's dynamic profiling runs through one shared-memory segment per node and hour
(``/dev/shm/DynamicProfileNpuShm<YYYYMMDDHH>``) fed by a monitor process (``DynMonitorProc``) forked from the first
rank. A job killed without cleanup leaves both behind; the next job on the node in that hour attaches to the old
segment and is armed by the old job's config, not its own (``docs/capture-lifecycle.md``, "Stale torch_npu state";
the Ascend msMonitor FAQ says to delete leftover ``DynamicProfileNpuShm*`` files after ``pkill -9``).
"""

from __future__ import annotations

from rankhook.backends.dp_state import DpState

STALE_SHM_AGE_S = 120.0
"""A segment last written this long before the node's earliest torch_npu rank started is not that job's."""


def stale_dp_findings(state: DpState, earliest_rank_start_unix_s: float | None,
                      stale_age_s: float = STALE_SHM_AGE_S) -> str:
    """One line naming what is stale ("" when nothing is).

    Notes:
        Reported: every orphaned monitor (a ``DynMonitorProc`` whose parent is pid 1: its job is gone); every
        segment when an orphan exists (it feeds one); otherwise a segment last modified more than ``stale_age_s``
        before ``earliest_rank_start_unix_s`` (the node's earliest torch_npu rank start; None = no such rank: a
        segment alone is then another job's business and not reported). Heuristic on mtimes: a live job's own
        segment is written at its creation and at every config change, so it is never older than its ranks.
    """
    orphans = list(state.orphans)
    shm = [b for b in state.shm_blocks
           if orphans or (earliest_rank_start_unix_s is not None
                          and b.mtime_unix_s < earliest_rank_start_unix_s - stale_age_s)]
    parts = [f"shm {b.path} (last written {b.age_s:.0f} s ago)" for b in shm]
    parts += [f"orphaned DynMonitorProc pid {m.pid}" for m in orphans]
    if not parts:
        return ""
    return "; ".join(parts) + ": a killed job's torch_npu monitor state; arms of new jobs on this node may go to it"
