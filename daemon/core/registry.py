"""Registry of jobs, nodes and ranks as seen from step telemetry (pure; time is passed in).

Holds what ``profwatch status`` shows: per job its world size and ranks, per rank its last step, step time,
node and capture state, per node its heartbeat and counters.

What a message may change is bounded here (issue "authenticated, identity-bound, bounded daemons"):

- a job's world size and its paths (``profiler_config_path``, ``prof_root``) are pinned by its first hello; a
  later hello that differs is refused (``world_size_conflict``, ``paths_changed``) and changes nothing;
- a rank is bound to the node that first reported it: another node's step, capture event, bye or hello for it is
  refused (``rank_on_other_node``) until the rank said bye or was silent for ``rank_rebind_after_s``;
- jobs, ranks and nodes are capped (:class:`~daemon.core.limits.LimitSettings`); rank records are created only
  when a rank reports, never from a declared ``world_size``; jobs with no rank heard for ``job_expiry_s`` expire.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from daemon.core.limits import LimitSettings
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
    uid: int | None = None  # the rank process's uid, from the node socket's peer credentials (None: not known)
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
    pinned_paths: tuple[str | None, str | None] | None = None  # (config path, prof_root) of the first hello

    def last_heard_unix_s(self) -> float:
        """Latest time any rank of the job was heard (0.0 when none)."""
        return max((r.seen_unix_s for r in self.ranks.values()), default=self.first_seen_unix_s)

    def furthest_step(self) -> int:
        """Highest step any rank reported (-1 before any)."""
        return max((r.last_step for r in self.ranks.values()), default=-1)

    def median_step_time_s(self, n: int = 20) -> float | None:
        """Median over ranks of each rank's median of its last ``n`` step times (robust typical step time)."""
        medians = [median(r.window.recent_times(n)) for r in self.ranks.values() if r.window is not None and len(r.window)]
        return median([x for x in medians if x is not None])


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
    """Jobs, nodes and ranks; bounded memory per rank (``window_steps``) and in total (``limits``)."""

    def __init__(self, window_steps: int = 1000, limits: LimitSettings | None = None) -> None:
        self.window_steps = window_steps
        self.limits = limits or LimitSettings.model_validate({})
        self.jobs: dict[str, JobState] = {}
        self.nodes: dict[str, NodeState] = {}
        self.rank_count = 0
        self._node_jobs: dict[str, set[str]] = {}  # node_id -> jobs with a rank bound to it
        self._node_ranks: dict[str, int] = {}  # node_id -> rank records bound to it

    # -- nodes ------------------------------------------------------------------------------------------------
    def touch_node(self, node_id: str, hostname: str, now: float) -> tuple[NodeState, bool]:
        """Return the node (created if new) and whether it was unknown.

        Raises:
            RegistryError: ``too_many_nodes`` when a new node would exceed ``limits.max_nodes``.
        """
        node = self.nodes.get(node_id)
        new = node is None
        if node is None:
            if len(self.nodes) >= self.limits.max_nodes:
                raise RegistryError("too_many_nodes", f"{len(self.nodes)} nodes tracked (limits.max_nodes)")
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
        """Register a rank of a job (the job too when it is new) for the node ``node_id``.

        Raises:
            RegistryError: ``world_size_conflict`` or ``paths_changed`` (the job's first hello said otherwise),
                ``rank_on_other_node`` (the rank is live on another node), ``too_many_jobs`` /
                ``too_many_jobs_on_node`` / ``too_many_ranks`` (limits). Nothing is changed then.
        """
        paths = (msg.profiler_config_path, msg.prof_root)
        job = self.jobs.get(msg.job_id)
        if job is None:
            self._check_new_job(node_id)
        elif job.world_size != msg.world_size:
            raise RegistryError(
                "world_size_conflict", f"job {msg.job_id} has world_size {job.world_size}, rank {msg.rank} says {msg.world_size}"
            )
        elif job.pinned_paths is not None and paths != job.pinned_paths:
            raise RegistryError(
                "paths_changed", f"job {msg.job_id} pinned profiler_config_path={job.pinned_paths[0]!r} "
                f"prof_root={job.pinned_paths[1]!r} at its first hello; rank {msg.rank} from node {node_id} says "
                f"{paths[0]!r} {paths[1]!r}")
        r = job.ranks.get(msg.rank) if job is not None else None
        if r is not None:
            self._check_rank_node(r, msg.job_id, node_id, now)
        else:
            self._check_rank_room(node_id)  # before anything changes: a refused hello leaves no empty job behind
        if job is None:
            job = self.jobs[msg.job_id] = JobState(job_id=msg.job_id, world_size=msg.world_size, first_seen_unix_s=now,
                                                   pinned_paths=paths, profiler_config_path=paths[0], prof_root=paths[1])
        elif job.pinned_paths is None:  # restored without paths: the first hello after a restart pins them
            job.pinned_paths = paths
            job.profiler_config_path, job.prof_root = paths
        if r is None:
            r = self._new_rank(job, msg.rank, node_id)
        elif r.node_id != node_id:
            self._bind(r, job.job_id, node_id)
        r.hostname, r.pid, r.local_rank, r.backend = msg.hostname, msg.pid, msg.local_rank, msg.backend
        r.backend_error = msg.backend_error[:500]
        r.seen_unix_s = now
        r.left = False
        r.dropped = int(msg.counters.get("dropped", 0))
        r.uid = msg.peer_uid
        job.backend = msg.backend
        job.started_unix_s = max(job.started_unix_s, msg.ts_unix_s)
        if len(job.versions) < 64:
            job.versions.update(list(msg.versions.items())[: 64 - len(job.versions)])
        return job

    def _check_new_job(self, node_id: str) -> None:
        if len(self.jobs) >= self.limits.max_jobs_total:
            raise RegistryError("too_many_jobs", f"{len(self.jobs)} jobs tracked (limits.max_jobs_total)")
        self._check_new_job_on_node(node_id)

    def _check_rank_node(self, r: RankState, job_id: str, node_id: str, now: float) -> None:
        if r.node_id and r.node_id != node_id and not r.left and now - r.seen_unix_s < self.limits.rank_rebind_after_s:
            raise RegistryError("rank_on_other_node",
                                f"rank {r.rank} of job {job_id} runs on node {r.node_id}, not {node_id}")

    def _check_rank_room(self, node_id: str) -> None:
        if self.rank_count >= self.limits.max_ranks_total:
            raise RegistryError("too_many_ranks", f"{self.rank_count} ranks tracked (limits.max_ranks_total)")
        if self._node_ranks.get(node_id, 0) >= self.limits.max_ranks_per_node:
            raise RegistryError("too_many_ranks_on_node",
                                f"node {node_id} has {self.limits.max_ranks_per_node} ranks (limits.max_ranks_per_node)")

    def _new_rank(self, job: JobState, rank: int, node_id: str) -> RankState:
        self._check_rank_room(node_id)
        if node_id and job.job_id not in self._node_jobs.get(node_id, ()):
            self._check_new_job_on_node(node_id)
        r = job.ranks[rank] = RankState(rank=rank, node_id=node_id, window=StepWindow(self.window_steps))
        self.rank_count += 1
        self._count_rank(node_id, job.job_id, +1)
        return r

    def _count_rank(self, node_id: str, job_id: str, delta: int) -> None:
        if not node_id:
            return
        n = self._node_ranks.get(node_id, 0) + delta
        if n > 0:
            self._node_ranks[node_id] = n
            if delta > 0:
                self._node_jobs.setdefault(node_id, set()).add(job_id)
        else:
            self._node_ranks.pop(node_id, None)

    def _check_new_job_on_node(self, node_id: str) -> None:
        if len(self._node_jobs.get(node_id, ())) >= self.limits.max_jobs_per_node:
            raise RegistryError("too_many_jobs_on_node",
                                f"node {node_id} has ranks of {self.limits.max_jobs_per_node} jobs (limits.max_jobs_per_node)")

    def _bind(self, r: RankState, job_id: str, node_id: str) -> None:
        old = r.node_id
        r.node_id = node_id
        self._count_rank(node_id, job_id, +1)
        self._count_rank(old, job_id, -1)
        if old and old != node_id:
            job = self.jobs.get(job_id)
            if job is not None and not any(x.node_id == old for x in job.ranks.values()):
                self._node_jobs.get(old, set()).discard(job_id)

    def restore(self, job: JobState) -> None:
        """Add a job read back from the state store (its ranks included), keeping the counts in step. Caps are not
        applied: what was stored was admitted before."""
        if not job.pinned_paths and (job.profiler_config_path or job.prof_root):
            job.pinned_paths = (job.profiler_config_path, job.prof_root)
        self.jobs[job.job_id] = job
        self.rank_count += len(job.ranks)
        for r in job.ranks.values():
            self._count_rank(r.node_id, job.job_id, +1)

    def expire(self, now: float) -> list[str]:
        """Forget jobs none of whose ranks was heard for ``limits.job_expiry_s`` (and nodes silent as long with no
        job left); return the job ids."""
        cutoff = now - self.limits.job_expiry_s
        gone = [j.job_id for j in self.jobs.values() if j.last_heard_unix_s() < cutoff]
        for job_id in gone:
            job = self.jobs.pop(job_id)
            self.rank_count -= len(job.ranks)
            for r in job.ranks.values():
                self._count_rank(r.node_id, job_id, -1)
                jobs = self._node_jobs.get(r.node_id)
                if jobs is not None:
                    jobs.discard(job_id)
                    if not jobs:
                        del self._node_jobs[r.node_id]
        for node in [n for n in self.nodes.values() if n.last_seen_unix_s < cutoff and n.node_id not in self._node_jobs]:
            del self.nodes[node.node_id]
        return gone

    def forget_node(self, node_id: str) -> None:
        """Forget a node record (not its ranks)."""
        self.nodes.pop(node_id, None)

    def rank_for(self, msg: Any, node_id: str | None) -> tuple[JobState | None, RankState | None]:
        """The job and rank a step/capture/bye message is about, checked against the node it came through.

        Returns ``(None, None)`` for an unknown job and ``(job, None)`` for a rank not reported yet.
        Raises:
            RegistryError: ``bad_rank`` (outside the job's world size), ``rank_on_other_node``.
        """
        job = self.jobs.get(msg.job_id)
        if job is None:
            return None, None
        if msg.rank >= job.world_size:
            raise RegistryError("bad_rank", f"rank {msg.rank} >= world_size {job.world_size} of job {msg.job_id}")
        r = job.ranks.get(msg.rank)
        if r is not None and node_id is not None and r.node_id and r.node_id != node_id:
            raise RegistryError("rank_on_other_node",
                                f"rank {r.rank} of job {job.job_id} runs on node {r.node_id}, not {node_id}")
        return job, r

    def step(self, msg: wire.StepReport, now: float, node_id: str | None = None) -> tuple[JobState | None, RankState | None, bool]:
        """Record a step report that arrived through ``node_id`` (None: not checked, for offline tools).

        Returns ``(job, rank, restarted)``; ``(None, None, False)`` for an unknown job. ``restarted`` is True when
        the rank's step counter went backwards (process restart / resume).
        Raises:
            RegistryError: ``bad_rank``, ``rank_on_other_node``, ``too_many_ranks``, ``too_many_jobs_on_node``.
        """
        job, r = self.rank_for(msg, node_id)
        if job is None:
            return None, None, False
        if r is None:
            r = self._new_rank(job, msg.rank, node_id or "")
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

    def bye(self, msg: wire.RankBye, now: float, node_id: str | None = None) -> None:
        """Mark a rank as left on purpose. Raises :class:`RegistryError` for a rank bound to another node."""
        _job, r = self.rank_for(msg, node_id)
        if r is not None:
            r.left = True
            r.seen_unix_s = now

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
                    "median_step_time_s": _recent_median(r, STATUS_MEDIAN_STEPS),
                    "age_s": round(now - r.seen_unix_s, 3) if r.seen_unix_s else None,
                    "capturing": r.capturing,
                    "left": r.left,
                    "dropped": r.dropped,
                    "backend": r.backend,
                    "backend_error": r.backend_error,
                    "uid": r.uid,
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
                    "median_step_time_s": job.median_step_time_s(STATUS_MEDIAN_STEPS),
                    "median_steps": STATUS_MEDIAN_STEPS,
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


STATUS_MEDIAN_STEPS = 20
"""``status`` shows each rank's median over its last this many steps and the job's median of those medians."""


def _recent_median(r: RankState, n: int) -> float | None:
    """Median of the rank's last ``n`` step times (None before its first step), rounded to the microsecond."""
    if r.window is None or not len(r.window):
        return None
    m = median(r.window.recent_times(n))
    return None if m is None else round(m, 6)


def _backends_in_use(job: JobState) -> str:
    """The capture backend the job's ranks actually run (``torch_npu``; ``none`` when it failed to open), e.g.
    ``torch_npu`` or ``none x1, torch_npu x3`` when the ranks differ."""
    counts: dict[str, int] = {}
    for r in job.ranks.values():
        counts[r.backend or "?"] = counts.get(r.backend or "?", 0) + 1
    if len(counts) <= 1:
        return next(iter(counts), job.backend)
    return ", ".join(f"{b} x{n}" for b, n in sorted(counts.items()))
