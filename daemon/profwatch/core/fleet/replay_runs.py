"""New runs in recorded telemetry (pure; time is each record's ``ts_unix_s``): the coordinator's registry rule for
``profwatch replay``.

Recorded lines carry no hellos, so a record that names its process (``pid``, and ``node`` where it reported
through one; ``daemon/profwatch/core/fleet/telemetry.py``) stands for one: the first record of a rank, and every
record whose process differs from the rank's last one, is fed to the registry as that process's hello (attested
pid, the record's world size) before its step. The registry then applies the same rules as live
(``daemon/profwatch/core/fleet/generations.py``): a new run when every old rank is gone, or when step counters go
back on a quorum of distinct processes; a step it refuses (e.g. ``rank_on_other_node``) is not judged, as live.
Records without ``pid`` are never fed here (replay then judges them as one run, as before).
"""

from __future__ import annotations

from dataclasses import dataclass

from profwatch.core.fleet.generations import GenerationOpened
from profwatch.core.fleet.registry import Registry, RegistryError
from rankhook import wire

REPLAY_NODE = "replay"
"""The node of records that name no ``node``."""


@dataclass(frozen=True, slots=True)
class RunStep:
    """What the registry made of one record: judge it (``accepted``), and the generation it opened (or None)."""

    accepted: bool
    opened: GenerationOpened | None = None


class RunFollower:
    """One registry for a replay (bounded as the coordinator's: ``LimitSettings`` defaults, small windows)."""

    def __init__(self) -> None:
        self.registry = Registry(window_steps=8)
        self._proc: dict[tuple[str, int], tuple[str, int]] = {}  # (job, rank) -> (node, pid) of its last record

    def observe(self, *, job_id: str, rank: int, world_size: int, step: int, step_time_s: float, ts_unix_s: float,
                pid: int, node: str | None) -> RunStep:
        """Feed one step record that names its process; return whether it is judged and what it opened."""
        via = node or REPLAY_NODE
        opened: GenerationOpened | None = None
        key = (job_id, rank)
        if self._proc.get(key) != (via, pid):
            self._proc[key] = (via, pid)
            hello = wire.RankHello(job_id=job_id, rank=rank, local_rank=0, world_size=world_size, hostname=via,
                                   pid=pid, backend="none", ts_unix_s=ts_unix_s, peer_pid=pid)
            try:
                opened = self.registry.admit_hello(hello, via, ts_unix_s).opened
            except RegistryError:  # held as a claim, or refused: the step below says whether it counts
                pass
        try:
            job, r, restarted = self.registry.step(
                wire.StepReport(job_id=job_id, rank=rank, step=step, step_time_s=step_time_s, ts_unix_s=ts_unix_s),
                ts_unix_s, via)
        except RegistryError:
            return RunStep(False, opened)
        if job is None or r is None:
            return RunStep(False, opened)
        if restarted:
            opened = self.registry.note_restart(job, r, ts_unix_s) or opened
        return RunStep(r.gen == job.generation, opened)

    def bye(self, job_id: str, rank: int, step: int, ts_unix_s: float) -> None:
        """A bye record: the rank left on purpose (counts as gone for the new-run rule)."""
        try:
            self.registry.bye(wire.RankBye(job_id=job_id, rank=rank, step=step, ts_unix_s=ts_unix_s), ts_unix_s)
        except RegistryError:
            pass
