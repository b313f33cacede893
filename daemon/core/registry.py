"""Registry of jobs, nodes and ranks as seen from step telemetry (pure; time is passed in).

Holds what ``profwatch status`` shows: per job its world size and ranks, per rank its last step, step time,
node and capture state, per node its heartbeat and counters. Conflicting world sizes for one job are refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from daemon.core.step_window import StepWindow, median
from rankhook import wire


class RegistryError(ValueError):
    """A message contradicts what the registry knows. ``reason`` is a counter label."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


@dataclass(slots=True)
class RankState:
    """One rank as last seen."""

    rank: int
    hostname: str = ""
    node_id: str = ""
    pid: int = 0
    local_rank: int = -1
    backend: str = ""
    last_step: int = -1
    last_step_time_s: float = 0.0
    last_ts_unix_s: float = 0.0
    seen_unix_s: float = 0.0
    capturing: bool = False
    left: bool = False
    dropped: int = 0  # messages the rank's publisher dropped (from its periodic hello)
    window: StepWindow | None = None
    backend_error: str = ""  # why the requested capture backend is not in use ("" = none asked or it opened)


@dataclass(slots=True)
class JobState:
    """One job: identity, ranks and where its capture files live."""

    job_id: str
    world_size: int
    ranks: dict[int, RankState] = field(default_factory=dict)
    profiler_config_path: str | None = None
    prof_root: str | None = None
    backend: str = ""
    first_seen_unix_s: float = 0.0
    started_unix_s: float = 0.0  # latest rank init time seen (arms must be newer than every rank's start)
    versions: dict[str, str] = field(default_factory=dict)

    def furthest_step(self) -> int:
        """Highest step any rank reported (-1 before any)."""
        return max((r.last_step for r in self.ranks.values()), default=-1)

    def median_step_time_s(self, n: int = 20) -> float | None:
        """Median over ranks of each rank's median of its last ``n`` step times (robust typical step time)."""
        per_rank = [median(r.window.recent_times(n)) for r in self.ranks.values() if r.window is not None and len(r.window)]
        per_rank = [x for x in per_rank if x is not None]
        return median(per_rank)


@dataclass(slots=True)
class NodeState:
    """One node daemon."""

    node_id: str
    hostname: str
    pid: int = 0
    last_seen_unix_s: float = 0.0
    started_unix_s: float = 0.0
    last_seq: int = -1
    lost_batches: int = 0
    counters: dict[str, int] = field(default_factory=dict)
    stale_state: str = ""  # torch_npu leftovers the node daemon found (stale shm segment, orphaned monitor)


class Registry:
    """Jobs, nodes and ranks; bounded memory per rank (``window_steps``)."""

    def __init__(self, window_steps: int = 1000) -> None:
        self.window_steps = window_steps
        self.jobs: dict[str, JobState] = {}
        self.nodes: dict[str, NodeState] = {}

    # -- nodes ------------------------------------------------------------------------------------------------
    def touch_node(self, node_id: str, hostname: str, now: float) -> tuple[NodeState, bool]:
        """Return the node (created if new) and whether it was unknown."""
        node = self.nodes.get(node_id)
        new = node is None
        if node is None:
            node = self.nodes[node_id] = NodeState(node_id=node_id, hostname=hostname)
        node.last_seen_unix_s = now
        return node, new

    def note_batch_seq(self, node: NodeState, seq: int) -> int:
        """Track batch sequence numbers; return how many batches were lost in between (0 normally)."""
        lost = 0
        if node.last_seq >= 0 and seq > node.last_seq + 1:
            lost = seq - node.last_seq - 1
            node.lost_batches += lost
        node.last_seq = seq
        return lost

    def heartbeat(self, hb: wire.NodeHeartbeat, now: float) -> bool:
        """Record a node heartbeat; return True when the node was unknown (must re-register)."""
        node, new = self.touch_node(hb.node_id, hb.hostname, now)
        if node.started_unix_s and hb.started_unix_s != node.started_unix_s:
            node.last_seq = -1  # the node daemon restarted: its seq starts again
        node.pid = hb.pid
        node.started_unix_s = hb.started_unix_s
        node.counters = dict(hb.counters)
        node.stale_state = hb.stale_state[:2000]
        return new

    # -- ranks ------------------------------------------------------------------------------------------------
    def hello(self, msg: wire.RankHello, node_id: str, now: float) -> JobState:
        """Register a rank. Raises :class:`RegistryError` on a conflicting world size."""
        job = self.jobs.get(msg.job_id)
        if job is None:
            job = self.jobs[msg.job_id] = JobState(job_id=msg.job_id, world_size=msg.world_size, first_seen_unix_s=now)
        elif job.world_size != msg.world_size:
            raise RegistryError(
                "world_size_conflict", f"job {msg.job_id} has world_size {job.world_size}, rank {msg.rank} says {msg.world_size}"
            )
        r = job.ranks.get(msg.rank)
        if r is None:
            r = job.ranks[msg.rank] = RankState(rank=msg.rank, window=StepWindow(self.window_steps))
        r.hostname, r.node_id, r.pid, r.local_rank, r.backend = msg.hostname, node_id, msg.pid, msg.local_rank, msg.backend
        r.backend_error = msg.backend_error[:500]
        r.seen_unix_s = now
        r.left = False
        r.dropped = int(msg.counters.get("dropped", 0))
        job.backend = msg.backend
        job.started_unix_s = max(job.started_unix_s, msg.ts_unix_s)
        if msg.profiler_config_path:
            job.profiler_config_path = msg.profiler_config_path
        if msg.prof_root:
            job.prof_root = msg.prof_root
        job.versions.update(msg.versions)
        return job

    def step(self, msg: wire.StepReport, now: float) -> tuple[JobState | None, RankState | None, bool]:
        """Record a step report. Returns ``(job, rank, restarted)``; ``(None, None, False)`` for an unknown job.

        ``restarted`` is True when the rank's step counter went backwards (process restart / resume).
        Raises :class:`RegistryError` when the rank is outside the job's world size.
        """
        job = self.jobs.get(msg.job_id)
        if job is None:
            return None, None, False
        rank = msg.rank
        r = job.ranks.get(rank)
        if r is None:
            if rank >= job.world_size:
                raise RegistryError("bad_rank", f"rank {rank} >= world_size {job.world_size} of job {msg.job_id}")
            r = job.ranks[rank] = RankState(rank=rank, window=StepWindow(self.window_steps))
        step = msg.step
        restarted = step < r.last_step
        if restarted:
            r.window.clear()  # type: ignore[union-attr]
        r.last_step = step
        r.last_step_time_s = msg.step_time_s
        r.last_ts_unix_s = msg.ts_unix_s
        r.seen_unix_s = now
        r.capturing = msg.capturing
        r.left = False
        r.window.append(step, msg.step_time_s)  # type: ignore[union-attr]
        return job, r, restarted

    def bye(self, msg: wire.RankBye, now: float) -> None:
        """Mark a rank as left on purpose."""
        job = self.jobs.get(msg.job_id)
        if job is not None and msg.rank in job.ranks:
            job.ranks[msg.rank].left = True
            job.ranks[msg.rank].seen_unix_s = now

    def snapshot(self, now: float, node_timeout_s: float = 10.0) -> dict[str, Any]:
        """A JSON-ready view for ``profwatch status``."""
        jobs = []
        for job in self.jobs.values():
            ranks = [
                {
                    "rank": r.rank,
                    "hostname": r.hostname,
                    "node_id": r.node_id,
                    "pid": r.pid,
                    "last_step": r.last_step,
                    "step_time_s": round(r.last_step_time_s, 6),
                    "age_s": round(now - r.seen_unix_s, 3) if r.seen_unix_s else None,
                    "capturing": r.capturing,
                    "left": r.left,
                    "dropped": r.dropped,
                    "backend": r.backend,
                    "backend_error": r.backend_error,
                }
                for r in sorted(job.ranks.values(), key=lambda r: r.rank)
            ]
            jobs.append(
                {
                    "job_id": job.job_id,
                    "world_size": job.world_size,
                    "ranks_seen": len(job.ranks),
                    "backend": _backends_in_use(job),
                    "backend_errors": {str(r.rank): r.backend_error for r in job.ranks.values() if r.backend_error},
                    "furthest_step": job.furthest_step(),
                    "median_step_time_s": job.median_step_time_s(),
                    "profiler_config_path": job.profiler_config_path,
                    "prof_root": job.prof_root,
                    "rank_drops": sum(r.dropped for r in job.ranks.values()),
                    "ranks": ranks,
                }
            )
        nodes = [
            {
                "node_id": n.node_id,
                "hostname": n.hostname,
                "pid": n.pid,
                "age_s": round(now - n.last_seen_unix_s, 3),
                "lost_batches": n.lost_batches,
                "down": now - n.last_seen_unix_s > node_timeout_s,
                "counters": n.counters,
                "stale_state": n.stale_state,
            }
            for n in self.nodes.values()
        ]
        return {"jobs": jobs, "nodes": nodes}


def _backends_in_use(job: JobState) -> str:
    """The capture backend the job's ranks actually run (``torch_npu``; ``none`` when it failed to open), e.g.
    ``torch_npu`` or ``none x1, torch_npu x3`` when the ranks differ."""
    counts: dict[str, int] = {}
    for r in job.ranks.values():
        counts[r.backend or "?"] = counts.get(r.backend or "?", 0) + 1
    if len(counts) <= 1:
        return next(iter(counts), job.backend)
    return ", ".join(f"{b} x{n}" for b, n in sorted(counts.items()))
