"""Job generations (pure; time is passed in): when an elastic restart or resize of a job starts a new generation.

A torchrun elastic job keeps ``TORCHELASTIC_RUN_ID`` (profwatch's ``job_id``) across restarts. When a worker fails
or the membership changes, the elastic agents stop every worker and start a new worker group, with
``TORCHELASTIC_RESTART_COUNT`` one higher and possibly another ``WORLD_SIZE`` (PyTorch docs, "torchrun (Elastic
Launch)": environment variables, and "Elastic Agent": restarts stop and restart all workers). Each process of the
new group counts steps from 0 again. profwatch calls each such worker group a *generation* of the job.

Who may open one (``docs/generations.md``): a new generation is opened only by hellos that agree on the new shape
and arrive through nodes the job runs on; paths stay pinned across generations:

- The *shape* of a hello is ``(world_size, restart_count)``. A hello whose shape differs from the job's current one
  (another world size, or a higher restart count) is a **claim**; by itself it changes nothing. A hello with a lower
  restart count is stale (a worker of an older generation): refused. Another world size with the *same* restart
  count is refused too (``world_size_conflict``): torchrun never resizes without a restart.
- A claim's hellos are held per shape. The generation opens when hellos of one shape came from at least
  :func:`quorum` distinct ranks through nodes the job runs on now (nodes with a rank of the current generation).
  Hellos of that shape through other nodes (the new nodes of a scale-up) are held too and admitted when it opens,
  but do not count. The paths of a claim must equal the job's pinned paths (checked by the registry first).
- Without restart counts (launchers other than torchrun), step counters going back on :func:`quorum` distinct
  *processes* of the job within :data:`CLAIM_WINDOW_S` open a generation of the same world size (a requeue under
  the same job id: new pids, steps from the checkpoint). One process is one vote (:func:`process_key`): a process
  whose hellos spoke for several ranks moves their counters back as one vote, never as several.
- A **new run** under the same job id (a Slurm requeue, a job restarted by hand; maybe fewer ranks, on other
  nodes) opens a generation when **every old rank is gone** (said bye, or silent for longer than the registry's
  rule for a live rank, ``Registry.alive_ranks``) and a hello comes from a process that is none of the old ranks'
  (:func:`is_new_process`), under the job's uid (where the old ranks' uid is known); it takes the hello's shape,
  may re-pin the job's paths (only then, and only under that uid) and admits the held hellos of its shape. A hello
  with another paths while old ranks are alive is a job id collision, not a new run.
- Claims older than :data:`CLAIM_WINDOW_S` lapse. Memory: at most :data:`MAX_SHAPES` shapes per job, and at most
  ``64 + 2 x ranks known`` held hellos per job (pruned copies: no versions, counters or paths).

A lone hello, or any number of hellos through nodes the job does not run on, therefore never opens a generation.
Nor do hellos for several ranks from one process: where the node attests the sending process (``peer_pid`` from
the ipc connection's credentials), one process counts for one rank only (a torchrun worker group runs one process
per rank).
What a node may claim is bounded by its identity (CURVE key) and, on the node, by the uid pin of the job
(``docs/security.md``): only processes of the job's own user on the job's own nodes can claim.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from rankhook import wire

CLAIM_WINDOW_S = 120.0
"""A claim lapses when its first hello is older than this (an elastic restart's workers start within seconds;
model loading before ``rankhook.init`` may take a minute on a slow file system)."""
MAX_SHAPES = 4
"""Pending shapes held per job; a fifth evicts the oldest claim."""

Change = Literal["same", "stale", "conflict", "claim"]
Reason = Literal["world_size", "restart_count", "steps_went_back", "every_rank_gone", "resumed_after_end"]
ProcessKey = tuple[str, int]
"""``(node_id, pid)`` of one rank process: its vote."""


@dataclass(frozen=True, slots=True)
class Shape:
    """What a generation looks like from its hellos."""

    world_size: int
    restart_count: int | None


def quorum(old_world_size: int, new_world_size: int) -> int:
    """Distinct ranks that must agree, through nodes the job runs on, to open a generation.

    A majority of the smaller of the two shapes, and at least two ranks (one when that shape has a single rank):
    ``min(m, max(2, ceil(m / 2)))`` with ``m = min(old, new)``. Scale-down 8 -> 4: 2; scale-up 4 -> 8: 2;
    restart 64 -> 64: 32. The smaller shape, because on a scale-down only the surviving ranks speak and on a
    scale-up only the old nodes count.
    """
    m = max(1, min(old_world_size, new_world_size))
    return min(m, max(2, -(-m // 2)))


def process_key(node_id: str, peer_pid: int | None, pid: int) -> ProcessKey:
    """The process a rank's hello came from: the node's attested ``peer_pid`` where it gave one, else the pid the
    rank wrote (``(node_id, 0)`` for a rank known only from step reports: one vote per node)."""
    return (node_id, peer_pid if peer_pid is not None else pid)


def is_new_process(node_id: str, peer_pid: int | None, pid: int, old: Iterable[tuple[str, int | None, int]]) -> bool:
    """True when a hello's process (``node_id``, attested ``peer_pid``, written ``pid``) is none of the ``old``
    ranks' processes ``(node_id, peer_pid, pid)``. Lenient on purpose: a match on either pid counts as the same
    process (after a coordinator restart the restored ranks know only the written pid), so an old process speaking
    again never opens a run; claiming an old pid can only keep a run from opening."""
    mine = {pid} | ({peer_pid} if peer_pid is not None else set())
    return not any(n == node_id and ({op} | ({opp} if opp is not None else set())) & mine for n, opp, op in old)


def classify(current: Shape, claimed: Shape) -> Change:
    """How a hello of shape ``claimed`` relates to the job's ``current`` shape (module doc)."""
    rc, crc = current.restart_count, claimed.restart_count
    if rc is not None and crc is not None:
        if crc < rc:
            return "stale"
        if crc > rc:
            return "claim"
        return "same" if claimed.world_size == current.world_size else "conflict"
    return "same" if claimed.world_size == current.world_size else "claim"


@dataclass(slots=True)
class Claim:
    """Hellos of one shape waiting for a quorum: ``hellos[rank] = (node_id, pruned hello)``; ``counted`` holds the
    ranks whose hello came through a node the job runs on, one rank per sending process (``voters[(node_id,
    peer_pid)] = rank`` where the node attested the process)."""

    shape: Shape
    first_unix_s: float
    hellos: dict[int, tuple[str, wire.RankHello]] = field(default_factory=dict)
    counted: set[int] = field(default_factory=set)
    voters: dict[tuple[str, int], int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class GenerationOpened:
    """A new generation of ``job_id`` (the ``job_generation`` event's data).

    ``ranks``: the ranks whose agreement opened it; ``nodes``: the nodes they spoke through; ``admitted``: ranks
    registered at once from held hellos; ``refused``: held hellos the registry refused then (reason per rank).
    """

    job_id: str
    generation: int
    old_generation: int
    world_size: int
    old_world_size: int
    restart_count: int | None
    old_restart_count: int | None
    reason: Reason
    ranks: tuple[int, ...]
    nodes: tuple[str, ...]
    opened_unix_s: float
    admitted: tuple[int, ...] = ()
    refused: tuple[tuple[int, str], ...] = ()

    def event_id(self) -> str:
        """Unique per job, generation and time (a job forgotten and seen again counts generations from 0)."""
        return f"job_generation-{self.job_id}-{self.generation}-{int(self.opened_unix_s)}"

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["ranks"], d["nodes"], d["admitted"] = list(self.ranks), list(self.nodes), list(self.admitted)
        d["refused"] = {str(r): why for r, why in self.refused}
        return d


def pruned(msg: wire.RankHello) -> wire.RankHello:
    """The part of a held hello the registry needs to admit it later (bounded: no versions, counters, paths)."""
    return dataclasses.replace(msg, versions={}, counters={}, profiler_config_path=None, prof_root=None,
                               backend_error=msg.backend_error[:200])


class GenerationClaims:
    """Pending claims and step-counter restarts of one job (see the module doc). Pure; O(1) per message."""

    __slots__ = ("claims", "restarts")

    def __init__(self) -> None:
        self.claims: dict[Shape, Claim] = {}
        self.restarts: dict[int, tuple[ProcessKey, float]] = {}  # rank -> (its process, when its counter went back)

    def clear(self) -> None:
        self.claims.clear()
        self.restarts.clear()

    def held(self) -> int:
        return sum(len(c.hellos) for c in self.claims.values())

    def expire(self, now: float, window_s: float = CLAIM_WINDOW_S) -> list[Claim]:
        """Drop claims and restarts older than ``window_s``; return the dropped claims."""
        gone = [c for c in self.claims.values() if now - c.first_unix_s > window_s]
        for c in gone:
            del self.claims[c.shape]
        if self.restarts:
            self.restarts = {r: pt for r, pt in self.restarts.items() if now - pt[1] <= window_s}
        return gone

    def add(self, shape: Shape, msg: wire.RankHello, node_id: str, *, counts: bool, now: float,
            max_held: int) -> Claim | None:
        """Hold one claiming hello; return its claim (None when it was not held: the job holds ``max_held``
        hellos already, or another node holds a hello of this rank for this shape)."""
        claim = self.claims.get(shape)
        if claim is None:
            if len(self.claims) >= MAX_SHAPES:
                oldest = min(self.claims.values(), key=lambda c: c.first_unix_s)
                del self.claims[oldest.shape]
            claim = self.claims[shape] = Claim(shape, now)
        held = claim.hellos.get(msg.rank)
        if held is not None and held[0] != node_id:
            return None
        if held is None and self.held() >= max_held:
            return None
        claim.hellos[msg.rank] = (node_id, pruned(msg))
        if counts:
            voter = (node_id, msg.peer_pid) if msg.peer_pid is not None else None
            if voter is None:
                claim.counted.add(msg.rank)
            elif claim.voters.setdefault(voter, msg.rank) == msg.rank:  # one process speaks for one rank
                claim.counted.add(msg.rank)
        return claim

    def note_restart(self, rank: int, process: ProcessKey, now: float) -> int:
        """Record that ``rank``'s step counter went back, in the process ``process`` (:func:`process_key`); return
        how many distinct processes did so lately (one process is one vote, whatever ranks it spoke for).
        O(ranks that went back lately); called only when a counter goes back."""
        self.restarts[rank] = (process, now)
        return len(self.voters())

    def voters(self) -> set[ProcessKey]:
        """The distinct processes whose step counters went back lately."""
        return {p for p, _t in self.restarts.values()}

    def summary(self, current: Shape, now: float) -> list[dict[str, Any]]:
        """Pending claims for ``profwatch status``."""
        out = [{"world_size": c.shape.world_size, "restart_count": c.shape.restart_count, "ranks": len(c.hellos),
                "agreeing_through_job_nodes": len(c.counted),
                "quorum": quorum(current.world_size, c.shape.world_size), "age_s": round(now - c.first_unix_s, 3)}
               for c in self.claims.values()]
        if self.restarts:
            out.append({"world_size": current.world_size, "restart_count": current.restart_count,
                        "ranks": len(self.restarts), "agreeing_through_job_nodes": len(self.voters()),
                        "quorum": quorum(current.world_size, current.world_size), "steps_went_back": True})
        return out
