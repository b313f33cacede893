"""Registry of jobs, nodes and ranks as seen from step telemetry (pure; time is passed in).

Holds what ``profwatch status`` shows: per job its world size and ranks, per rank its last step, step time,
node and capture state, per node its heartbeat and counters.

What a message may change is bounded here (``docs/security.md``):

- a job's paths (``profiler_config_path``, ``prof_root``) are pinned by its first hello, across generations; a
  later hello that differs while a rank of the job is alive is another job with the same id (``job_id_collision``,
  reason ``paths_changed``; ``daemon/profwatch/core/fleet/job_pins.py`` keeps the two apart on one node): refused,
  and steps of ranks not known yet from that node are refused too; with every rank gone it is refused as
  ``paths_changed`` (the rule for a new run under the same id, ``docs/generations.md``, decides there); neither
  changes anything;
- a job's shape (world size, torchrun restart count) changes only by a new *generation* (an elastic restart or
  resize, ``daemon/profwatch/core/fleet/generations.py``): a hello of another shape is held as a claim (``generation_pending``)
  until hellos of that shape from a quorum of ranks arrived through nodes the job runs on; a stale hello (older
  restart count) or another world size with the same restart count is refused (``stale_generation``,
  ``world_size_conflict``);
- a rank is bound to the node that first reported it: another node's step, capture event, bye or hello for it is
  refused (``rank_on_other_node``) until the rank said bye or was silent for ``rank_rebind_after_s``;
- jobs, ranks and nodes are capped (:class:`~profwatch.core.fleet.limits.LimitSettings`); rank records are created only
  when a rank reports, never from a declared ``world_size``; jobs with no rank heard for ``job_expiry_s`` expire.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from profwatch.core.fleet.generations import (
    GenerationOpened,
    Reason,
    Shape,
    classify,
    is_new_process,
    process_key,
    quorum,
)
from profwatch.core.fleet.job_pins import alive_after_s
from profwatch.core.fleet.limits import LimitSettings
from profwatch.core.fleet.registry_state import HelloOutcome, JobState, NodeState, RankState, gauge_rows, snapshot
from profwatch.core.fleet.step_window import StepWindow
from rankhook import wire

__all__ = ["GenerationPending", "HelloOutcome", "JobState", "NodeState", "RankState", "Registry", "RegistryError"]


def _record(r: RankState, msg: wire.StepReport, now: float) -> None:
    """What a step report of rank ``r`` that arrived at ``now`` changes on it (its checks passed)."""
    step = msg.step
    t = msg.step_time_s
    r.last_step = step
    r.last_step_time_s = t
    r.last_ts_unix_s = msg.ts_unix_s
    r.seen_unix_s = now
    r.capturing = msg.capturing
    r.left = False
    sample = (msg.cpu_at_step, msg.cpu_total_s) if msg.cpu_at_step is not None and msg.cpu_total_s is not None else None
    r.window.append(step, t, msg.work, msg.stages, msg.cpu_s, sample)  # type: ignore[union-attr]


class RegistryError(ValueError):
    """A message contradicts what the registry knows. ``reason`` is a counter label."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


class GenerationPending(RegistryError):
    """A hello (or a step of a rank beyond the current world size) belongs to a claimed new generation that has
    no quorum yet: it is held or dropped, and nothing else changed. Not an error of the sender."""


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
        # what the state store's rows miss since the last flush (:meth:`take_changes`): identities only; the
        # per-step fields (last step, step time, last heard) are written by the slow full flush
        self.changed_jobs: set[str] = set()
        self.changed_ranks: set[tuple[str, int]] = set()
        self.changed_nodes: set[str] = set()

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
            self.changed_nodes.add(node_id)
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
        if node.pid != hb.pid or node.started_unix_s != hb.started_unix_s or node.hostname != hb.hostname:
            self.changed_nodes.add(node.node_id)
        node.pid = hb.pid
        node.started_unix_s = hb.started_unix_s
        node.counters = dict(hb.counters)
        node.stale_state = hb.stale_state[:2000]
        node.host_load.add(now, getattr(hb, "runnable_per_core", -1.0), getattr(hb, "cpu_psi_some_pct", -1.0))
        return new

    # -- ranks ------------------------------------------------------------------------------------------------
    def hello(self, msg: wire.RankHello, node_id: str, now: float) -> JobState:
        """:meth:`admit_hello` for callers that do not follow generations; returns the job."""
        return self.admit_hello(msg, node_id, now).job

    def admit_hello(self, msg: wire.RankHello, node_id: str, now: float) -> HelloOutcome:
        """Register a rank of a job (the job too when it is new) for the node ``node_id``; a hello of a new shape
        may open the job's next generation, and a hello of a new process after every old rank is gone opens a new
        run (``daemon/profwatch/core/fleet/generations.py``; :attr:`HelloOutcome.opened` says which).

        Raises:
            GenerationPending: the hello claims a new generation that has no quorum yet (held; nothing changed).
            RegistryError: ``job_id_collision`` (other paths than the job's first hello while ranks of the job
                are alive), ``paths_changed`` (the same with every rank gone, from an old process or under another
                uid: no new run), ``stale_generation``,
                ``world_size_conflict``, ``rank_on_other_node`` (the rank is live on another node),
                ``too_many_jobs`` / ``too_many_jobs_on_node`` / ``too_many_jobs_of_uid_on_node`` / ``too_many_ranks`` (limits). Nothing is changed then.
        """
        paths = (msg.profiler_config_path, msg.prof_root)
        job = self.jobs.get(msg.job_id)
        if job is None:
            self._check_new_job(node_id, msg.peer_uid)
            self._check_rank_room(node_id)  # before anything changes: a refused hello leaves no empty job behind
            job = self.jobs[msg.job_id] = JobState(
                job_id=msg.job_id, world_size=msg.world_size, first_seen_unix_s=now, pinned_paths=paths,
                profiler_config_path=paths[0], prof_root=paths[1], restart_count=msg.restart_count,
                generation_since_unix_s=now)
            self._apply_hello(job, msg, node_id, now)
            return HelloOutcome(job)
        opened = self._new_run(job, msg, node_id, now)
        if opened is not None:
            return HelloOutcome(job, opened)
        if job.pinned_paths is not None and paths != job.pinned_paths:
            alive = self.alive_ranks(job, now)
            detail = (f"job {msg.job_id} pinned profiler_config_path={job.pinned_paths[0]!r} "
                      f"prof_root={job.pinned_paths[1]!r} at its first hello; rank {msg.rank} from node {node_id} "
                      f"says {paths[0]!r} {paths[1]!r}")
            if alive:
                if node_id and (node_id in job.collided_nodes or len(job.collided_nodes) < 64):
                    job.collided_nodes[node_id] = now
                raise RegistryError("job_id_collision", f"{detail} while {len(alive)} of its ranks are alive")
            raise RegistryError("paths_changed", detail)
        claimed = Shape(msg.world_size, msg.restart_count)
        change = classify(job.shape, claimed)
        if change == "stale":
            raise RegistryError("stale_generation", f"job {msg.job_id} is in generation {job.generation} (restart "
                                f"count {job.restart_count}); rank {msg.rank} says restart count {msg.restart_count}")
        if change == "conflict":
            raise RegistryError("world_size_conflict", f"job {msg.job_id} has world_size {job.world_size} at restart "
                                f"count {job.restart_count}, rank {msg.rank} says {msg.world_size}")
        if change == "claim":
            return HelloOutcome(job, self._claim(job, claimed, msg, node_id, now))
        r = job.ranks.get(msg.rank)
        if r is not None:
            self._check_rank_node(r, msg.job_id, node_id, now)
        else:
            self._check_rank_room(node_id)
        if job.pinned_paths is None:  # restored without paths: the first hello after a restart pins them
            job.pinned_paths = paths
            job.profiler_config_path, job.prof_root = paths
        self._apply_hello(job, msg, node_id, now)
        return HelloOutcome(job)

    def _new_run(self, job: JobState, msg: wire.RankHello, node_id: str, now: float) -> GenerationOpened | None:
        """Open a new run of ``job`` when every old rank is gone and ``msg`` comes from a new process of the job's
        uid (``daemon/profwatch/core/fleet/generations.py``); else None (the hello is judged as any other).

        The new run takes the hello's shape and paths (re-pinned here, under the job's uid only), drops the old
        ranks and their node bindings, and admits the held hellos of its shape with that uid, from any node.
        """
        if not job.ranks or self.any_alive(job, now):  # not alive_ranks: O(1) per hello while the job runs
            return None
        if not is_new_process(node_id, msg.peer_pid, msg.pid,
                              ((r.node_id, r.peer_pid, r.pid) for r in job.ranks.values())):
            return None  # an old process speaking again (its node was away, the coordinator restarted)
        uids = {r.uid for r in job.ranks.values() if r.uid is not None}
        if uids and msg.peer_uid not in uids:
            return None  # only the job's own user starts a new run (and may re-pin its paths)
        shape = Shape(msg.world_size, msg.restart_count)
        if classify(job.shape, shape) == "stale":
            return None  # a worker of an older torchrun group: never the job's next run
        claim = job.claims.claims.get(shape)
        held = [h for _r, h in sorted(claim.hellos.items()) if h[1].peer_uid == msg.peer_uid] if claim else []
        old = (job.generation, job.world_size, job.restart_count)
        self._release_ranks(job)
        self._next_generation(job, shape, now)
        paths = (msg.profiler_config_path, msg.prof_root)
        job.pinned_paths = paths
        job.profiler_config_path, job.prof_root = paths
        job.collided_nodes.clear()
        self._apply_hello(job, msg, node_id, now)  # room: the old ranks were released just now
        admitted, refused = [msg.rank], []
        for via, h in held:
            if h.rank in job.ranks:
                continue
            try:
                self._check_rank_room(via)
                self._apply_hello(job, h, via, now)
                admitted.append(h.rank)
            except RegistryError as exc:
                refused.append((h.rank, exc.reason))
        return GenerationOpened(
            job_id=job.job_id, generation=job.generation, old_generation=old[0], world_size=job.world_size,
            old_world_size=old[1], restart_count=job.restart_count, old_restart_count=old[2], reason="every_rank_gone",
            ranks=(msg.rank,), nodes=(node_id,), opened_unix_s=now, admitted=tuple(sorted(admitted)),
            refused=tuple(refused))

    def any_alive(self, job: JobState, now: float) -> bool:
        """Whether a rank of ``job`` is alive (:meth:`alive_ranks` is not empty), stopping at the first."""
        return any(self._alive(r, now) for r in job.ranks.values())

    def alive_ranks(self, job: JobState, now: float) -> list[int]:
        """Ranks of ``job`` that are alive: no bye, heard within ``max(rank_rebind_after_s, 3 x their last step
        time)`` (:func:`~profwatch.core.fleet.job_pins.alive_after_s`)."""
        return [r.rank for r in job.ranks.values() if self._alive(r, now)]

    def _alive(self, r: RankState, now: float) -> bool:
        return not r.left and now - r.seen_unix_s < alive_after_s(self.limits.rank_rebind_after_s, r.last_step_time_s)

    def _apply_hello(self, job: JobState, msg: wire.RankHello, node_id: str, now: float) -> RankState:
        r = job.ranks.get(msg.rank)
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
        r.peer_pid = msg.peer_pid
        r.torch_npu = msg.versions.get("torch_npu", "")[:64]
        r.mode, r.role = msg.mode, msg.role
        job.heard_unix_s = max(job.heard_unix_s, now)
        job.gauge_stale = True
        self.changed_ranks.add((job.job_id, r.rank))
        self.changed_jobs.add(job.job_id)
        job.backend = msg.backend
        job.started_unix_s = max(job.started_unix_s, msg.ts_unix_s)
        if len(job.versions) < 64:
            job.versions.update(list(msg.versions.items())[: 64 - len(job.versions)])
        return r

    # -- generations -------------------------------------------------------------------------------------------
    def _claim(self, job: JobState, shape: Shape, msg: wire.RankHello, node_id: str, now: float) -> GenerationOpened:
        """Hold a claiming hello; open the generation when its shape has a quorum through the job's nodes."""
        job.claims.expire(now)
        counts = bool(node_id) and job.job_id in self._node_jobs.get(node_id, ())
        claim = job.claims.add(shape, msg, node_id, counts=counts, now=now, max_held=64 + 2 * len(job.ranks))
        need = quorum(job.world_size, shape.world_size)
        if claim is None or len(claim.counted) < need:
            have = len(claim.counted) if claim is not None else 0
            raise GenerationPending(
                "generation_pending", f"job {job.job_id}: rank {msg.rank} via node {node_id} claims world_size "
                f"{shape.world_size} restart count {shape.restart_count}; {have} of {need} ranks agree through "
                f"nodes the job runs on" + ("" if claim is not None else " (not held: bound reached or rank held "
                                            "from another node)"))
        reason: Reason = "world_size" if shape.world_size != job.world_size else "restart_count"
        old = (job.generation, job.world_size, job.restart_count)
        self._release_ranks(job)
        self._next_generation(job, shape, now)
        admitted: list[int] = []
        refused: list[tuple[int, str]] = []
        for rank, (via, held) in sorted(claim.hellos.items()):
            try:
                self._check_rank_room(via)
                self._apply_hello(job, held, via, now)
                admitted.append(rank)
            except RegistryError as exc:
                refused.append((rank, exc.reason))
        return GenerationOpened(
            job_id=job.job_id, generation=job.generation, old_generation=old[0], world_size=job.world_size,
            old_world_size=old[1], restart_count=job.restart_count, old_restart_count=old[2], reason=reason,
            ranks=tuple(sorted(claim.counted)), nodes=tuple(sorted({claim.hellos[r][0] for r in claim.counted})),
            opened_unix_s=now, admitted=tuple(admitted), refused=tuple(refused))

    def note_restart(self, job: JobState, r: RankState, now: float, sender_pid: int | None = None
                     ) -> GenerationOpened | None:
        """``r``'s step counter went back (:meth:`step` said ``restarted``). When a quorum of distinct processes
        did so within the claim window, open a generation of the same shape (launchers without restart counts: a
        requeue) and return it; a rank of an older generation just joins the current one.

        The process a report is credited to (:func:`~profwatch.core.fleet.generations.process_key`): the sender of
        the step report that went back, ``sender_pid`` (the report's ``peer_pid``, which the node attests from the
        connection; the sender cannot choose it), so one process sending for several ranks is one vote, with or
        without a hello; where no node attested it (tcp, a version-1 node), the process of the rank's hello."""
        if r.gen < job.generation:
            r.gen = job.generation
            return None
        job.claims.expire(now)
        who = (process_key(r.node_id, sender_pid, 0) if sender_pid is not None
               else process_key(r.node_id, r.peer_pid, r.pid))
        if job.claims.note_restart(r.rank, who, now) < quorum(
                job.world_size, job.world_size):
            return None  # fewer distinct processes than the quorum: one process is one vote
        ranks = tuple(sorted(x for x in job.claims.restarts if x in job.ranks))
        old_gen = job.generation
        self._next_generation(job, job.shape, now)
        for x in ranks:
            job.ranks[x].gen = job.generation
        return GenerationOpened(
            job_id=job.job_id, generation=job.generation, old_generation=old_gen, world_size=job.world_size,
            old_world_size=job.world_size, restart_count=job.restart_count, old_restart_count=job.restart_count,
            reason="steps_went_back", ranks=ranks, nodes=tuple(sorted({job.ranks[x].node_id for x in ranks})),
            opened_unix_s=now)

    def note_ended(self, job_id: str, now: float) -> None:
        """The job was found ended (no rank reported for ``job_end_after_s``: ``job_ended`` was published)."""
        job = self.jobs.get(job_id)
        if job is not None:
            job.ended_unix_s = now

    def resume_after_end(self, job: JobState, now: float, rank: int, node_id: str) -> GenerationOpened | None:
        """A hello or step of ``job`` after it was found ended (:meth:`note_ended`; a serving job idle longer than
        ``job_end_after_s``, a job paused that long) opens a new generation of the same shape, as a requeue does
        (reason ``resumed_after_end``): the end resolved its alerts and closed its episodes and captures, and what
        comes now is judged as a new run with a fresh detector and budget, never silenced by the end of the old one.
        Returns None when the job was not ended."""
        if job.ended_unix_s is None:
            return None
        job.ended_unix_s = None
        old_gen = job.generation
        self._next_generation(job, job.shape, now)
        for r in job.ranks.values():
            r.gen = job.generation
            # the new run counts its steps afresh: its first steps (a requeue from a checkpoint) are not a step
            # counter going back, which would open a second generation (steps_went_back) for one requeue
            r.last_step = -1
            if r.window is not None:
                r.window.clear()
        job.furthest = -1
        return GenerationOpened(
            job_id=job.job_id, generation=job.generation, old_generation=old_gen, world_size=job.world_size,
            old_world_size=job.world_size, restart_count=job.restart_count, old_restart_count=job.restart_count,
            reason="resumed_after_end", ranks=(rank,), nodes=(node_id,), opened_unix_s=now)

    @staticmethod
    def _next_generation(job: JobState, shape: Shape, now: float) -> None:
        job.world_size, job.restart_count = shape.world_size, shape.restart_count
        job.generation += 1
        job.generation_since_unix_s = now
        job.ended_unix_s = None  # a new generation is live
        job.claims.clear()
        job.gauge_stale = True  # the caller records the job as changed (its rank rows are rewritten: a reset)

    def _release_ranks(self, job: JobState) -> None:
        """Forget the job's rank records and their node bindings (expiry, or a new generation)."""
        self.rank_count -= len(job.ranks)
        for r in job.ranks.values():
            self._count_rank(r.node_id, job.job_id, -1)
            jobs = self._node_jobs.get(r.node_id)
            if jobs is not None:
                jobs.discard(job.job_id)
                if not jobs:
                    del self._node_jobs[r.node_id]
        job.ranks.clear()
        job.gauge_stale = True

    def _check_new_job(self, node_id: str, uid: int | None = None) -> None:
        if len(self.jobs) >= self.limits.max_jobs_total:
            raise RegistryError("too_many_jobs", f"{len(self.jobs)} jobs tracked (limits.max_jobs_total)")
        self._check_new_job_on_node(node_id, uid)

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
        r = job.ranks[rank] = RankState(rank=rank, node_id=node_id, window=StepWindow(self.window_steps),
                                        gen=job.generation)
        self.rank_count += 1
        self._count_rank(node_id, job.job_id, +1)
        job.gauge_stale = True
        self.changed_ranks.add((job.job_id, rank))
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

    def _check_new_job_on_node(self, node_id: str, uid: int | None = None) -> None:
        """Refuse a new job on ``node_id`` beyond ``max_jobs_per_node``, or beyond ``max_jobs_per_node_per_uid``
        jobs of the attested ``uid`` there (one user cannot take every job slot of a node)."""
        on_node = self._node_jobs.get(node_id, ())
        if len(on_node) >= self.limits.max_jobs_per_node:
            raise RegistryError("too_many_jobs_on_node",
                                f"node {node_id} has ranks of {self.limits.max_jobs_per_node} jobs (limits.max_jobs_per_node)")
        if uid is None or len(on_node) < self.limits.max_jobs_per_node_per_uid:
            return
        mine = sum(1 for j in on_node if (job := self.jobs.get(j)) is not None
                   and any(r.uid == uid and r.node_id == node_id for r in job.ranks.values()))
        if mine >= self.limits.max_jobs_per_node_per_uid:
            raise RegistryError("too_many_jobs_of_uid_on_node",
                                f"uid {uid} has ranks of {mine} jobs on node {node_id} "
                                "(limits.max_jobs_per_node_per_uid)")

    def _bind(self, r: RankState, job_id: str, node_id: str) -> None:
        old = r.node_id
        r.node_id = node_id
        self.changed_ranks.add((job_id, r.rank))
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
        job.heard_unix_s = max((r.seen_unix_s for r in job.ranks.values()), default=job.heard_unix_s)
        job.gauge_stale = True
        for r in job.ranks.values():
            r.gen = job.generation
            self._count_rank(r.node_id, job.job_id, +1)

    def expire(self, now: float) -> list[str]:
        """Forget jobs none of whose ranks was heard for ``limits.job_expiry_s`` (and nodes silent as long with no
        job left); return the job ids."""
        cutoff = now - self.limits.job_expiry_s
        gone = [j.job_id for j in self.jobs.values() if j.last_heard_unix_s() < cutoff]
        for job_id in gone:
            self._release_ranks(self.jobs.pop(job_id))
        for job in self.jobs.values():
            job.claims.expire(now)
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
            RegistryError: ``bad_rank`` (outside the job's world size), ``rank_on_other_node``,
                ``job_id_collision`` (a rank not known yet, from a node where another job claimed this id).
        """
        job = self.jobs.get(msg.job_id)
        if job is None:
            return None, None
        if msg.rank >= job.world_size:
            if any(msg.rank < c.shape.world_size for c in job.claims.claims.values()):
                raise GenerationPending("generation_pending", f"rank {msg.rank} of job {msg.job_id} belongs to a "
                                        f"claimed generation of another world size (not open yet)")
            raise RegistryError("bad_rank", f"rank {msg.rank} >= world_size {job.world_size} of job {msg.job_id}")
        r = job.ranks.get(msg.rank)
        if r is not None and node_id is not None and r.node_id and r.node_id != node_id:
            raise RegistryError("rank_on_other_node",
                                f"rank {r.rank} of job {job.job_id} runs on node {r.node_id}, not {node_id}")
        if r is None and node_id is not None and node_id in job.collided_nodes and job.job_id not in self._node_jobs.get(node_id, ()):
            raise RegistryError("job_id_collision", f"rank {msg.rank} of job {job.job_id} via node {node_id}: "
                                "another job with this id runs there (its hello was refused)")
        return job, r

    def step(self, msg: wire.StepReport, now: float, node_id: str | None = None) -> tuple[JobState | None, RankState | None, bool]:
        """Record a step report that arrived through ``node_id`` (None: not checked, for offline tools).

        Returns ``(job, rank, restarted)``; ``(None, None, False)`` for an unknown job. ``restarted`` is True when
        the rank's step counter went backwards (process restart / resume).
        Raises:
            RegistryError: ``bad_rank``, ``rank_on_other_node``, ``too_many_ranks``, ``too_many_jobs_on_node``.
        """
        job = self.jobs.get(msg.job_id)
        if job is None:
            return None, None, False
        r, restarted = self.step_of(job, msg, now, node_id)
        return job, r, restarted

    def step_of(self, job: JobState, msg: wire.StepReport, now: float, node_id: str | None = None
                ) -> tuple[RankState, bool]:
        """:meth:`step` for a report of ``job`` (``msg.job_id``, looked up by the caller). Returns ``(rank,
        restarted)``; raises as :meth:`step`."""
        rank = msg.rank
        r = job.ranks.get(rank) if rank < job.world_size else None
        if r is None or (node_id is not None and r.node_id != node_id and r.node_id):
            _job, r = self.rank_for(msg, node_id)  # raises for a refused one
            if r is None:
                r = self._new_rank(job, rank, node_id or "")
        restarted = msg.step < r.last_step
        if restarted:
            r.window.clear()  # type: ignore[union-attr]
            job.gauge_stale = True  # the furthest step may go down
        elif r.left:
            job.gauge_stale = True  # back after a bye: live again (a change of its stored row)
            self.changed_ranks.add((job.job_id, rank))
        _record(r, msg, now)
        job.heard_unix_s = now
        if msg.step > job.furthest:
            job.furthest = msg.step
        return r, restarted

    def step_run(self, job: JobState, msgs: Sequence[Any], start: int, now: float, node_id: str | None,
                 current: list[Any]) -> int:
        """Record the common step reports of ``job`` in ``msgs[start:]`` (the coordinator's hot path: a node
        batch's reports of one job): from ``start`` up to the first message that is not a step report of ``job``
        or needs :meth:`step_of` (a rank not known yet or bound to another node, a rank beyond the world size, a
        step counter that went back). Appends to ``current`` the reports of ranks of the job's current generation
        (what its detector judges). Returns the index of the first message not taken (``start`` when none was).
        The same result as :meth:`step_of` on each, which raises nothing for these."""
        ranks = job.ranks
        job_id = job.job_id
        ws = job.world_size
        gen = job.generation
        keep = current.append
        n = len(msgs)
        i = start
        furthest = job.furthest
        while i < n:
            m = msgs[i]
            if m.kind != "step" or m.job_id != job_id:
                break
            rank = m.rank
            r = ranks.get(rank) if rank < ws else None
            step = m.step
            if r is None or (node_id is not None and r.node_id != node_id and r.node_id) or step < r.last_step:
                break
            if r.left:
                job.gauge_stale = True  # back after a bye: live again (a change of its stored row)
                self.changed_ranks.add((job_id, rank))
            _record(r, m, now)
            if step > furthest:
                furthest = step
            if r.gen == gen:
                keep(m)
            i += 1
        if i > start:
            job.heard_unix_s = now
            job.furthest = furthest
        return i

    def bye(self, msg: wire.RankBye, now: float, node_id: str | None = None) -> bool:
        """Mark a rank as left on purpose. Returns True when this bye was the last one of the job's current
        generation: every one of its ``world_size`` ranks said bye and the job was not found ended already (the
        job ends now, not after ``job_end_after_s`` of silence). Raises :class:`RegistryError` for a rank bound to
        another node."""
        _job, r = self.rank_for(msg, node_id)
        if r is None:
            return False
        was_left = r.left
        r.left = True
        r.seen_unix_s = now
        job = self.jobs[msg.job_id]
        # not job.heard_unix_s: a bye is no report. The job's end reads heard_unix_s, and a late bye must never
        # make an ended job live again (only a step or a hello does, opening a new generation:
        # docs/generations.md)
        job.gauge_stale = True
        self.changed_ranks.add((msg.job_id, r.rank))
        return not was_left and job.ended_unix_s is None and every_rank_left(job)

    def take_changes(self) -> tuple[set[str], set[tuple[str, int]], set[str]]:
        """The jobs, ranks ``(job_id, rank)`` and nodes whose identity changed since the last call (a hello, a bye,
        a new rank or node, a rank moved to another node, a node daemon restarted), and forget them: what the
        frequent registry flush writes. Ids of records gone since (expired) may be among them."""
        out = (self.changed_jobs, self.changed_ranks, self.changed_nodes)
        self.changed_jobs, self.changed_ranks, self.changed_nodes = set(), set(), set()
        return out

    def gauge_rows(self, now: float, node_timeout_s: float = 10.0) -> dict[str, Any]:
        """The gauges' view (:func:`profwatch.core.fleet.registry_state.gauge_rows`): cheap, built every second."""
        return gauge_rows(self.jobs.values(), self.nodes.values(), now, node_timeout_s)

    def snapshot(self, now: float, node_timeout_s: float = 10.0, job_id: str | None = None) -> dict[str, Any]:
        """A JSON-ready view for ``profwatch status`` (:func:`profwatch.core.fleet.registry_state.snapshot`): every
        job, or only ``job_id``'s (none when unknown; the other jobs' rows are not built: O(ranks) each)."""
        if job_id is None:
            jobs: Iterable[JobState] = self.jobs.values()
        else:
            job = self.jobs.get(job_id)
            jobs = [job] if job is not None else []
        return snapshot(jobs, self.nodes.values(), now, node_timeout_s)


def every_rank_left(job: JobState) -> bool:
    """Whether every one of the ``world_size`` ranks of ``job``'s current generation said bye (a rank of an older
    generation not restarted yet, or a rank never heard, does not count as left)."""
    current = [r for r in job.ranks.values() if r.gen == job.generation]
    return len(current) >= job.world_size and all(r.left for r in current)
