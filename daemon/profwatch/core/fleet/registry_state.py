"""The registry's records of jobs, ranks and nodes, the ``profwatch status`` view of them, and their rows in the
state store (pure)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from profwatch.core.fleet.generations import GenerationClaims, GenerationOpened, Shape
from profwatch.core.fleet.host_load import HostLoadSeries
from profwatch.core.fleet.step_window import StepWindow, median


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
    gen: int = 0  # the job generation this rank's step counter belongs to (older: a worker not restarted yet)
    peer_pid: int | None = None  # the hello's process as the node attested it (SO_PEERCRED); None: not attested
    torch_npu: str = ""  # the torch_npu version the rank's hello reports ("" when none)
    mode: str | None = None  # what the rank's hello says: "training" | "serving" | None (not said)
    role: str | None = None  # the rank's role label from its hello (ranks doing the same work), None: not said


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
    generation: int = 0  # 0 at the first hello; +1 per elastic restart or resize (daemon/profwatch/core/fleet/generations.py)
    restart_count: int | None = None  # TORCHELASTIC_RESTART_COUNT of the current generation (None: not torchrun)
    generation_since_unix_s: float = 0.0
    ended_unix_s: float | None = None  # when job_ended was published (silent for job_end_after_s); None: live
    claims: GenerationClaims = field(default_factory=GenerationClaims)
    collided_nodes: dict[str, float] = field(default_factory=dict)  # node id -> when another job claimed this id there
    warnings: dict[str, str] = field(default_factory=dict)  # what may go wrong, by topic (status shows it); in memory
    heard_unix_s: float = 0.0  # latest time any rank was heard, kept on ingest (the max of the ranks' seen_unix_s)
    furthest: int = -1  # highest step any rank reported, kept on ingest (recomputed after a counter went back)
    gauge_stale: bool = True  # ranks joined, left or restarted since the gauge fields below were computed
    ranks_live: int = 0  # ranks that did not leave (valid while not gauge_stale)
    rank_drops: int = 0  # sum of the ranks' cumulative drop counts (idem)
    gauge_sample: list[RankState] = field(default_factory=list)  # <= GAUGE_SAMPLE ranks the median gauge reads

    @property
    def shape(self) -> Shape:
        return Shape(self.world_size, self.restart_count)

    def last_heard_unix_s(self) -> float:
        """Latest time any rank of the job was heard (``first_seen_unix_s`` when none): O(1), kept on ingest."""
        return max(self.heard_unix_s, self.first_seen_unix_s)

    def furthest_step(self) -> int:
        """Highest step any rank reported (-1 before any)."""
        return max((r.last_step for r in self.ranks.values()), default=-1)

    def median_step_time_s(self, n: int = 20, sampled: bool = False) -> float | None:
        """Median over ranks of each rank's median of its last ``n`` step times (robust typical step time).
        ``sampled``: over the ranks the step-time gauge reads (at most :data:`GAUGE_SAMPLE`, evenly spaced by rank),
        so a caller that asks about once a second does work bounded per job, not O(ranks x n)."""
        if sampled and self.gauge_stale:
            _refresh_gauge_fields(self)
        ranks = self.gauge_sample if sampled else self.ranks.values()
        medians = [median(r.window.recent_times(n)) for r in ranks if r.window is not None and len(r.window)]
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
    host_load: HostLoadSeries = field(default_factory=HostLoadSeries)
    """The host's CPU load from the node's heartbeats (bounded: ``daemon/profwatch/core/fleet/host_load.py``)."""


@dataclass(frozen=True, slots=True)
class HelloOutcome:
    """What a hello did: the job it registered with, and the generation it opened (None: none)."""

    job: JobState
    opened: GenerationOpened | None = None


def snapshot(jobs: Iterable[JobState], nodes: Iterable[NodeState], now: float,
             node_timeout_s: float = 10.0) -> dict[str, Any]:
    """A JSON-ready view for ``profwatch status``: ``{"jobs": [...], "nodes": [...]}``; each job shows its
    ``generation``, ``restart_count`` and the claims of a next generation still waiting for a quorum."""
    out = []
    for job in jobs:
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
                "generation": r.gen,
                "mode": r.mode,
                "role": r.role,
            }
            for r in sorted(job.ranks.values(), key=lambda r: r.rank)
        ]
        out.append(
            {
                "job_id": job.job_id,
                "world_size": job.world_size,
                "generation": job.generation,
                "restart_count": job.restart_count,
                "generation_since_unix_s": job.generation_since_unix_s,
                "pending_generations": job.claims.summary(job.shape, now),
                "ranks_seen": len(job.ranks),
                "backend": _backends_in_use(job),
                "backend_errors": {str(r.rank): r.backend_error for r in job.ranks.values() if r.backend_error},
                "furthest_step": job.furthest_step(),
                "median_step_time_s": job.median_step_time_s(STATUS_MEDIAN_STEPS),
                "median_steps": STATUS_MEDIAN_STEPS,
                "profiler_config_path": job.profiler_config_path,
                "prof_root": job.prof_root,
                "rank_drops": sum(r.dropped for r in job.ranks.values()),
                "warnings": [job.warnings[k] for k in sorted(job.warnings)],
                "ranks": ranks,
            }
        )
    nodes_out = [
        {
            "node_id": n.node_id,
            "hostname": n.hostname,
            "pid": n.pid,
            "age_s": round(now - n.last_seen_unix_s, 3),
            "lost_batches": n.lost_batches,
            "down": now - n.last_seen_unix_s > node_timeout_s,
            "counters": n.counters,
            "stale_state": n.stale_state,
            "host_load": n.host_load.view(),
        }
        for n in nodes
    ]
    return {"jobs": out, "nodes": nodes_out}


GAUGE_SAMPLE = 512
"""The job step-time gauge is the median of the latest step time of at most this many ranks, evenly spaced by
rank (all of them up to this size): a gauge read once a second need not touch 16k ranks to be right to a few %."""


def _refresh_gauge_fields(job: JobState) -> None:
    """Recompute what changes only when ranks join, leave, restart or say hello (O(ranks), rare)."""
    ranks = sorted(job.ranks.values(), key=lambda r: r.rank)
    job.ranks_live = sum(1 for r in ranks if not r.left)
    job.rank_drops = sum(r.dropped for r in ranks)
    job.furthest = max((r.last_step for r in ranks), default=-1)
    stride = max(1, -(-len(ranks) // GAUGE_SAMPLE))
    job.gauge_sample = ranks[::stride]
    job.gauge_stale = False


def gauge_rows(jobs: Iterable[JobState], nodes: Iterable[NodeState], now: float,
               node_timeout_s: float = 10.0) -> dict[str, Any]:
    """What the coordinator's gauges need, once a second, in work bounded per job (no per-rank rows:
    :func:`snapshot` is built only when ``status`` asks): the counts kept on ingest, recomputed in O(ranks) only
    after ranks joined, left, restarted or said hello (``JobState.gauge_stale``), and a median over at most
    :data:`GAUGE_SAMPLE` ranks.

    Shape: ``{"jobs": [{"job_id", "ranks_live" (ranks that did not leave), "median_step_time_s" (median over the
    ranks of their latest step time, s, sampled as :data:`GAUGE_SAMPLE` says; None before any step),
    "furthest_step" (-1 before any), "rank_drops" (sum of the ranks' cumulative drop counts), "generation"}],
    "nodes": [{"node_id", "down"}]}``."""
    out = []
    for job in jobs:
        if job.gauge_stale:
            _refresh_gauge_fields(job)
        latest = [r.last_step_time_s for r in job.gauge_sample if r.window is not None and len(r.window)]
        out.append({"job_id": job.job_id, "ranks_live": job.ranks_live, "median_step_time_s": median(latest),
                    "furthest_step": job.furthest, "rank_drops": job.rank_drops, "generation": job.generation})
    return {"jobs": out, "nodes": [{"node_id": n.node_id, "down": now - n.last_seen_unix_s > node_timeout_s}
                                   for n in nodes]}


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


def registry_rows(jobs: Iterable[JobState], nodes: Iterable[NodeState]
                  ) -> tuple[list[dict[str, Any]], list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """``(job rows, rank rows, node rows)`` for :meth:`profwatch.adapters.store.state.StateStore.save_registry`."""
    job_rows: list[dict[str, Any]] = []
    rank_rows: list[tuple[Any, ...]] = []
    for job in jobs:
        job_rows.append({
            "job_id": job.job_id, "world_size": job.world_size, "backend": job.backend,
            "profiler_config_path": job.profiler_config_path, "prof_root": job.prof_root,
            "first_seen_unix_s": job.first_seen_unix_s, "started_unix_s": job.started_unix_s,
            "versions": json.dumps(job.versions), "generation": job.generation, "restart_count": job.restart_count,
        })
        rank_rows += _rank_rows(job, job.ranks.values())
    node_rows = [(n.node_id, n.hostname, n.pid, n.last_seen_unix_s, json.dumps(n.counters)) for n in nodes]
    return job_rows, rank_rows, node_rows


def changed_rows(jobs: Mapping[str, JobState], nodes: Mapping[str, NodeState],
                 changed: tuple[Iterable[str], Iterable[tuple[str, int]], Iterable[str]], reset: Iterable[str]
                 ) -> tuple[list[dict[str, Any]], list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """:func:`registry_rows` of the records that changed (``(job ids, (job id, rank) pairs, node ids)``, as
    :meth:`profwatch.core.fleet.registry.Registry.take_changes` gives them; ids no longer held are skipped) and of
    every rank of the jobs in ``reset`` (a new generation: the store's rank rows of those jobs are replaced)."""
    job_ids, rank_keys, node_ids = changed
    reset = set(reset)
    pick_jobs = [jobs[j] for j in sorted(set(job_ids) | reset) if j in jobs]
    job_rows, _none, _ = registry_rows(pick_jobs, ())
    rank_rows: list[tuple[Any, ...]] = []
    for j in sorted(reset):
        if j in jobs:
            rank_rows += _rank_rows(jobs[j], jobs[j].ranks.values())
    for job_id, rank in sorted(rank_keys):
        job = jobs.get(job_id)
        r = job.ranks.get(rank) if job is not None and job_id not in reset else None
        if r is not None:
            rank_rows += _rank_rows(job, (r,))  # type: ignore[arg-type]
    _j, _r, node_rows = registry_rows((), [nodes[n] for n in sorted(node_ids) if n in nodes])
    return job_rows, rank_rows, node_rows


def _rank_rows(job: JobState, ranks: Iterable[RankState]) -> list[tuple[Any, ...]]:
    return [(job.job_id, r.rank, r.hostname, r.node_id, r.pid, r.local_rank, r.backend, r.last_step,
             r.last_step_time_s, r.seen_unix_s, int(r.left)) for r in ranks]


def jobs_from_rows(jobs: Iterable[Mapping[str, Any]], ranks: Iterable[Mapping[str, Any]],
                   window_steps: int) -> list[JobState]:
    """Jobs (with their ranks, empty step windows) read back from the state store's rows."""
    restored: dict[str, JobState] = {}
    for j in jobs:
        restored[j["job_id"]] = JobState(
            job_id=j["job_id"], world_size=j["world_size"], profiler_config_path=j["profiler_config_path"],
            prof_root=j["prof_root"], backend=j["backend"] or "", first_seen_unix_s=j["first_seen_unix_s"] or 0.0,
            started_unix_s=j["started_unix_s"] or 0.0, versions=json.loads(j["versions"] or "{}"),
            generation=j.get("generation") or 0, restart_count=j.get("restart_count"))
    for r in ranks:
        job = restored.get(r["job_id"])
        if job is None or not 0 <= r["rank"] < job.world_size:
            continue
        job.ranks[r["rank"]] = RankState(
            rank=r["rank"], hostname=r["hostname"] or "", node_id=r["node_id"] or "", pid=r["pid"] or 0,
            local_rank=r["local_rank"] if r["local_rank"] is not None else -1, backend=r["backend"] or "",
            last_step=r["last_step"] if r["last_step"] is not None else -1,
            last_step_time_s=r["last_step_time_s"] or 0.0, seen_unix_s=r["seen_unix_s"] or 0.0,
            left=bool(r["left"]), window=StepWindow(window_steps), gen=job.generation)
    return list(restored.values())
