"""Which ranks a capture covers: targeted captures for large jobs (pure; no I/O).

A capture of every rank of a 10,000-rank job writes terabytes to shared storage and feeds msprof-analyze a batch it
cannot hold in memory (``docs/msprof-analyze.md``). When detection already names the ranks (a rank outlier) and the job is larger
than ``min_world_size``, the capture covers only:

* the **suspects** (the anomaly's ranks, at most ``max_suspects``);
* **node peers**: ``node_peers`` ranks of each suspect's own node (same host: a node-level cause such as a hot
  CPU, a noisy neighbour or a PCIe switch shows on them too, and they share its network path);
* **group peers**: ``group_peers`` ranks of each communication group the suspect belongs to, when a previous
  capture of the job left ``parallel_group_info`` (torch_npu's ``profiler_metadata.json``: HCCL group ->
  global ranks). Before any capture the groups are unknown, so node locality stands in for them. msprof-analyze's
  slow_rank recipe compares the members of one group (docs/msprof-analyze.md#slow-rank);
* **reference ranks**: ``reference_ranks`` (16) ranks spread evenly over the job's nodes, so the ranking keeps its
  pooled noise estimate. The ranking takes the noise of each signal from the other ranks' median and MAD
  (docs/verdicts.md, "The test"); the MAD scale of n normal values has a relative standard error of about
  1.17 / sqrt(n) (its asymptotic efficiency is 37 %; Rousseeuw & Croux, JASA 88, 1993): 41 % with 8 ranks,
  29 % with 16, 21 % with 32. With the 4-sigma rule an error of 29 % moves the threshold between 3.1 and 5.2
  sigmas, which the 1.5 %-of-step effect floor keeps from naming noise; 16 is the smallest count at which the
  scale is known within about a third. Spreading them over nodes keeps node-level noise in the estimate.

A job-wide regression (no rank named) captures a **sample** that covers every node: one rank per node, then more
ranks spread evenly until ``sample_ranks``. The captured ranks become ``rank_list`` with ``is_rank: true`` in
``profiler_config.json``; completeness then expects exactly those ranks.

A **follow-up** (:func:`plan_follow_up`) covers the ranks a targeted capture's ranks waited for and did not hold
(``profwatch.core.verdict.subset.wait_outside``): when they are few (at most ``max_suspects``) they are planned as
suspects (with their peers and the reference ranks); when the verdict could not name them, every uncaptured rank is
covered, with the reference ranks, so the next verdict can tell which of them is late.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["JobTopology", "Target", "TargetingSettings", "estimate_capture_bytes", "plan_follow_up", "plan_targets"]

TargetMode = Literal["full", "targeted", "sample", "configured", "follow_up"]
Role = Literal["suspect", "node_peer", "group_peer", "reference", "sample", "waited_for"]


class TargetingSettings(BaseModel):
    """Targeted captures (``[arming.targeting]``). ``min_world_size``: jobs of at most this many ranks are captured
    whole; ``reference_ranks`` spread over nodes (see the module doc for why 16); ``node_peers`` / ``group_peers``
    per suspect; ``sample_ranks``: the size of a job-wide regression's sample (at least one rank per node);
    ``bytes_per_rank_step``: the estimate of one rank's bytes per recorded step before the job's first capture
    says (16 MiB: about 8 MB of profiler DB plus as much raw data for 20,000 kernels per step, the arithmetic of
    ``CAPTURE_WINDOW_NOTE`` in ``daemon/profwatch/core/capture/planner.py``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    enabled: bool = Field(True, description=(
        "capture a targeted subset of a large job's ranks (false: every rank, always)"))
    min_world_size: int = Field(64, ge=1, le=1 << 20, description="jobs of at most this many ranks are captured whole")
    reference_ranks: int = Field(16, ge=4, le=4096, description=(
        "healthy ranks spread over nodes added to a targeted capture, for the ranking's noise estimate"))
    node_peers: int = Field(2, ge=0, le=64, description="ranks on each suspect's node added beside it")
    group_peers: int = Field(2, ge=0, le=64, description=(
        "ranks of each suspect's communication groups added beside it (groups known from an earlier capture)"))
    max_suspects: int = Field(8, ge=1, le=256, description="most named ranks one targeted capture centres on")
    sample_ranks: int = Field(64, ge=4, le=1 << 20, description=(
        "size of a job-wide anomaly's sample (at least one rank per node)"))
    bytes_per_rank_step: int = Field(16 * 2**20, ge=0, le=2**40, description=(
        "estimate of one rank's capture bytes per recorded step before the job's first capture measures it (16 MiB)"))


@dataclass(frozen=True, slots=True)
class JobTopology:
    """What is known of a job's layout at arm time: ``world_size``, rank -> host (from the ranks' hellos), and
    the communication groups a previous capture recorded (``groups``: group name -> global ranks; empty before
    the first capture) with the id of that capture (``groups_from``)."""

    world_size: int
    hosts: Mapping[int, str] = field(default_factory=dict)
    groups: Mapping[str, Sequence[int]] = field(default_factory=dict)
    groups_from: str | None = None


@dataclass(frozen=True, slots=True)
class Target:
    """The ranks to capture: ``rank_list`` (None = every rank), ``mode``, each captured rank's ``roles`` and one
    line saying what and why (``detail``), for the capture event and every verdict's notes."""

    rank_list: tuple[int, ...] | None
    mode: TargetMode
    detail: str
    roles: Mapping[int, Role] = field(default_factory=dict)
    nodes_covered: int = 0

    def to_json(self) -> dict[str, Any]:
        by_role: dict[str, list[int]] = {}
        for r, role in sorted(self.roles.items()):
            by_role.setdefault(role, []).append(r)
        return {"mode": self.mode, "ranks": len(self.rank_list) if self.rank_list is not None else None,
                "rank_list": list(self.rank_list) if self.rank_list is not None else None,
                "roles": {k: v[:64] for k, v in by_role.items()}, "nodes_covered": self.nodes_covered,
                "detail": self.detail}


def _spread(items: Sequence[Any], k: int) -> list[Any]:
    """``k`` items evenly spaced over ``items`` (all when ``k >= len``), first and last included."""
    n = len(items)
    if k >= n:
        return list(items)
    if k <= 0:
        return []
    if k == 1:
        return [items[n // 2]]
    return [items[round(i * (n - 1) / (k - 1))] for i in range(k)]


def _nearest(pool: Sequence[int], to: int, k: int, taken: set[int]) -> list[int]:
    return sorted((r for r in pool if r not in taken), key=lambda r: (abs(r - to), r))[:k]


def _by_host(world: int, hosts: Mapping[int, str]) -> dict[str, list[int]]:
    nodes: dict[str, list[int]] = {}
    for r in range(world):
        nodes.setdefault(hosts.get(r) or f"?{r}", []).append(r)  # an unknown host is a node of its own
    return nodes


def plan_targets(ranks: Sequence[int], topo: JobTopology, settings: TargetingSettings) -> Target:
    """The ranks a capture covers, given the anomaly's ``ranks`` (empty: a job-wide anomaly) and the job's
    :class:`JobTopology`. Deterministic. See the module doc for the rule; a job of at most ``min_world_size``
    ranks (or targeting disabled) is captured whole (``mode="full"``)."""
    world = topo.world_size
    if not settings.enabled or world <= settings.min_world_size:
        why = "targeting disabled" if not settings.enabled else (
            f"job of {world} ranks <= [arming.targeting] min_world_size {settings.min_world_size}")
        return Target(None, "full", f"every rank captured ({why})")
    nodes = _by_host(world, topo.hosts)
    order = sorted(nodes, key=lambda h: nodes[h][0])
    suspects = sorted({r for r in ranks if 0 <= r < world})[: settings.max_suspects]
    if not suspects:
        return _sample_target(world, nodes, order, settings)
    roles: dict[int, Role] = {s: "suspect" for s in suspects}
    for s in suspects:
        host = topo.hosts.get(s) or f"?{s}"
        for r in _nearest(nodes.get(host, []), s, settings.node_peers, set(roles)):
            roles[r] = "node_peer"
    groups_used = _add_group_peers(roles, suspects, topo, settings)
    _add_references(roles, suspects, topo, nodes, order, settings.reference_ranks)
    covered = {topo.hosts.get(r) or f"?{r}" for r in roles}
    ref_nodes = {topo.hosts.get(r) or f"?{r}" for r, role in roles.items() if role == "reference"}
    n = {role: sum(1 for v in roles.values() if v == role) for role in ("suspect", "node_peer", "group_peer",
                                                                         "reference")}
    detail = (f"targeted capture of {len(roles)} of {world} ranks: suspects {suspects}, {n['node_peer']} peer(s) on "
              f"their nodes, {n['group_peer']} peer(s) from {groups_used} of their communication groups"
              + (f" (groups from capture {topo.groups_from})" if topo.groups_from and topo.groups else
                 " (groups unknown before a capture of the job: node locality stands in)")
              + f", {n['reference']} reference ranks over {len(ref_nodes)} nodes for the ranking's noise estimate")
    return Target(tuple(sorted(roles)), "targeted", detail, roles, len(covered))


def _sample_target(world: int, nodes: Mapping[str, list[int]], order: Sequence[str],
                   settings: TargetingSettings) -> Target:
    """A job-wide anomaly (no rank named): one rank per node, then more spread evenly up to ``sample_ranks``."""
    roles: dict[int, Role] = {}
    for h in order:
        roles[nodes[h][len(nodes[h]) // 2]] = "sample"
    rest = [r for r in range(world) if r not in roles]
    for r in _spread(rest, max(0, settings.sample_ranks - len(roles))):
        roles[r] = "sample"
    detail = (f"sample of {len(roles)} of {world} ranks covering all {len(nodes)} nodes (job-wide anomaly: no "
              "rank named)")
    return Target(tuple(sorted(roles)), "sample", detail, roles, len(nodes))


def _add_group_peers(roles: dict[int, Role], suspects: Sequence[int], topo: JobTopology,
                     settings: TargetingSettings) -> int:
    """Up to ``group_peers`` nearest members of each suspect's communication groups (not the world group) join as
    ``group_peer``; returns how many (group, suspect) pairs were used."""
    groups_used = 0
    for _name, members in sorted(topo.groups.items()):
        if len(members) >= topo.world_size:  # the world group says nothing about locality
            continue
        for s in suspects:
            if s in members:
                groups_used += 1
                for r in _nearest(members, s, settings.group_peers, set(roles)):
                    roles.setdefault(r, "group_peer")
    return groups_used


def _add_references(roles: dict[int, Role], suspects: Sequence[int], topo: JobTopology,
                    nodes: Mapping[str, list[int]], order: Sequence[str], want: int) -> None:
    """References: one rank on each of up to ``want`` nodes evenly spaced over the job (suspects' nodes last),
    more rounds over the same nodes when the job has fewer nodes than references."""
    suspect_hosts = {topo.hosts.get(s) or f"?{s}" for s in suspects}
    picked = 0
    hosts = _spread([h for h in order if h not in suspect_hosts] or order, want)
    while picked < want:
        added = 0
        for h in hosts:
            free = [r for r in nodes[h] if r not in roles]
            if free and picked < want:
                roles[free[len(free) // 2]] = "reference"
                picked, added = picked + 1, added + 1
        if not added:
            if len(hosts) == len(order):
                break  # every rank is taken
            hosts = list(order)


def plan_follow_up(waited: Sequence[int], topo: JobTopology, settings: TargetingSettings) -> Target:
    """The ranks of a follow-up capture: ``waited`` are the ranks a targeted capture's ranks waited for and did not
    hold (one named rank, or every uncaptured one when the verdict could not name them). At most
    ``max_suspects`` of them: :func:`plan_targets` with them as suspects (mode ``follow_up``); more: a sample of
    them (role ``waited_for``) of at most ``sample_ranks`` (one rank on each of their nodes first, then more spread
    evenly over them, as a job-wide capture's sample) plus ``reference_ranks`` ranks spread over the others: every
    uncaptured rank of a 1,024-rank job was a follow-up larger than the hourly byte cap, never armed. Deterministic;
    ranks outside ``0..world_size-1`` are ignored; an empty ``waited`` gives the job-wide sample."""
    world = topo.world_size
    wanted = sorted({r for r in waited if 0 <= r < world})
    if len(wanted) <= settings.max_suspects:
        t = plan_targets(wanted, topo, settings)
        if t.mode != "targeted":
            return t
        return Target(t.rank_list, "follow_up", f"follow-up of the ranks the last capture waited for: {t.detail}",
                      t.roles, t.nodes_covered)
    nodes: dict[str, list[int]] = {}
    for r in wanted:
        nodes.setdefault(topo.hosts.get(r) or f"?{r}", []).append(r)
    firsts = [rs[len(rs) // 2] for rs in sorted(nodes.values(), key=lambda rs: rs[0])]
    roles: dict[int, Role] = {r: "waited_for" for r in _spread(firsts, settings.sample_ranks)}
    if len(roles) < settings.sample_ranks:
        for r in _spread([r for r in wanted if r not in roles], settings.sample_ranks - len(roles)):
            roles[r] = "waited_for"
    sampled = len(roles)
    waited_set = set(wanted)
    rest = [r for r in range(world) if r not in waited_set]
    for r in _spread(rest or [r for r in wanted if r not in roles], settings.reference_ranks):
        roles.setdefault(r, "reference")
    covered = {topo.hosts.get(r) or f"?{r}" for r in roles}
    which = ("every one" if sampled == len(wanted) else
             f"a sample of {sampled} over {min(len(nodes), sampled)} of their {len(nodes)} nodes")
    detail = (f"follow-up capture of {len(roles)} of {world} ranks: {which} of the {len(wanted)} ranks the last "
              f"capture waited for and did not hold (not named by its data), and {len(roles) - sampled} reference "
              "ranks")
    return Target(tuple(sorted(roles)), "follow_up", detail, roles, len(covered))


def estimate_capture_bytes(ranks: int, active_steps: int, bytes_per_rank_step: float) -> int:
    """Bytes a capture of ``ranks`` ranks over ``active_steps`` recorded steps is expected to write (warm-up steps
    are profiled but not written): ``ranks x active_steps x bytes_per_rank_step``."""
    return int(max(0, ranks) * max(0, active_steps) * max(0.0, bytes_per_rank_step))
