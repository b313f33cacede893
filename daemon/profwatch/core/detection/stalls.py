"""Stalled-rank detection from report arrival times on the coordinator's clock (pure; time passed in).

A rank whose host clock is off (NTP step, skew, a container with a frozen clock) must neither look stalled nor
hide a stall, so :class:`ArrivalStallDetector` never reads ``StepReport.ts_unix_s``: it keeps, per rank, the time
the coordinator received its last report and compares it with the coordinator's own ``now``.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

from profwatch.core.detection.settings import DetectionSettings
from profwatch.core.detection.types import Anomaly, RankProgress


class ArrivalStallDetector:
    """Reports ranks that stopped stepping while their peers go on (the ``StallDetector`` Protocol).

    Args:
        job_id: copied into every :class:`Anomaly`.
        world_size: ranks of the job.
        settings: ``stall_steps_behind`` and ``stall_after_s``.

    Notes:
        Algorithm: at each :meth:`check` (about once a second), a rank that has reported at least once, did not
        say ``bye`` (:meth:`mark_left`), is at least ``stall_steps_behind`` steps behind the furthest rank of its
        epoch and whose last report *arrived* at least ``stall_after_s`` seconds before ``now`` is reported once
        as ``stalled_rank``; it is re-armed when it reports again. A rank still in an old epoch (its peers
        restarted their step counters, it did not) gets ``stall_after_s`` from the restart's first arrival to
        rejoin, so the restart gap itself is never a stall. A job where every rank stops is not reported here
        (nobody is ahead: that is a job-level hang, not a slow rank).

        Why arrival time: the rank host's ``ts_unix_s`` can be minutes off or frozen; the coordinator's receive
        time is one clock for every rank. Delivery delay (node batching, at most a few hundred ms) is far below
        ``stall_after_s``. A stalled rank is reported as stalled, never as slow: a rank that does not step never
        reaches a capture's ``start_step``, so arming a capture for it could never complete (the arming policy
        suppresses it). Source: the hang/stall split of NVIDIA Resiliency Extension's straggler and hang
        detection (separate timeouts for "no progress") and MegaScale's heartbeat-based hang detection
        (Jiang et al., NSDI'24).

        Cost: nothing per check for ranks that keep reporting. A deadline queue (ranks in order of their last
        arrival, an ``OrderedDict``: O(1) to move a rank to the back on a report, O(1) to take the oldest) yields
        only the ranks silent for ``stall_after_s``; those are judged when they fall silent and again only when
        what decides changes (the furthest step or the epoch), or, for a rank not yet silent long enough by the
        current settings or in its epoch's grace, at each check until it is. A check costs O(ranks that fell
        silent), a report O(1). Arrivals are expected in order (the coordinator's monotonic clock); one that is
        earlier than the latest so far is queued as if it came with the latest (a stall is then reported at most
        that disorder late, never early).
    """

    def __init__(self, job_id: str, world_size: int, settings: DetectionSettings) -> None:
        self.job_id = job_id
        self.world_size = world_size
        self.settings = settings
        self._queue: OrderedDict[int, float] = OrderedDict()  # rank -> last arrival; oldest first (deadline order)
        self._latest = -math.inf  # the latest arrival queued (the queue's order)
        self._silent: dict[int, float] = {}  # rank -> arrival: silent ranks not reported, waiting on what decides
        self._recheck: set[int] = set()  # silent ranks whose time (or epoch grace) has not come: judged each check
        self._key: tuple[int, int, float] | None = None  # (furthest, epoch, epoch start) the silent were judged at
        self._left: set[int] = set()
        self._stalled: set[int] = set()

    @property
    def stalled_ranks(self) -> frozenset[int]:
        """Ranks currently reported as stalled (cleared when they report again or leave)."""
        return frozenset(self._stalled)

    def update_settings(self, settings: DetectionSettings) -> None:
        """Swap thresholds (no learned state depends on them; the silent ranks are judged again)."""
        self.settings = settings
        self._key = None

    def on_arrival(self, rank: int, arrival_unix_s: float) -> None:
        """Record that a report of ``rank`` arrived at ``arrival_unix_s``; clears its stalled/left marks."""
        if 0 <= rank < self.world_size:
            q = self._queue
            if rank in q:
                q.move_to_end(rank)
            q[rank] = arrival_unix_s
            if arrival_unix_s > self._latest:
                self._latest = arrival_unix_s
            if self._silent:
                self._silent.pop(rank, None)
                self._recheck.discard(rank)
            if self._stalled:
                self._stalled.discard(rank)
            if self._left:
                self._left.discard(rank)

    def on_arrivals(self, reports: Sequence[Any], start: int, end: int, arrival_unix_s: float) -> None:
        """:meth:`on_arrival` for the ranks of ``reports[start:end]`` (objects with a ``rank``), all arrived at
        ``arrival_unix_s``: one call per run of a batch, the common rank (nothing silent, stalled or left) in a
        plain loop."""
        if self._silent or self._stalled or self._left or arrival_unix_s < self._latest:
            for x in range(start, end):
                self.on_arrival(reports[x].rank, arrival_unix_s)
            return
        q = self._queue
        ws = self.world_size
        move = q.move_to_end
        hit = False
        for x in range(start, end):
            rank = reports[x].rank
            if 0 <= rank < ws:
                if rank in q:
                    move(rank)
                q[rank] = arrival_unix_s
                hit = True
        if hit:  # a rank of the job arrived
            self._latest = arrival_unix_s

    def mark_left(self, rank: int) -> None:
        """``rank`` left on purpose (``bye``): never reported as stalled until it reports again."""
        if 0 <= rank < self.world_size:
            self._left.add(rank)
            self._stalled.discard(rank)
            self._silent.pop(rank, None)
            self._recheck.discard(rank)

    def check(self, progress: RankProgress, now_unix_s: float) -> list[Anomaly]:
        """Return one ``stalled_rank`` anomaly naming the newly stalled ranks at ``now_unix_s``, or ``[]``."""
        furthest = progress.furthest_step
        if furthest is None:
            return []
        s = self.settings
        q = self._queue
        cutoff = now_unix_s - s.stall_after_s
        fresh: list[int] = []
        while q:
            rank, t = next(iter(q.items()))
            if t > cutoff:
                break
            q.popitem(last=False)
            if rank not in self._left:
                self._silent[rank] = t
                fresh.append(rank)
        key = (furthest, progress.epoch, progress.epoch_start_arrival_s)
        if key != self._key:
            self._key = key
            judge: Iterable[int] = list(self._silent)
        else:
            judge = fresh + sorted(self._recheck)
        last_step, rank_epoch, epoch = progress.last_step, progress.rank_epoch, progress.epoch
        idx: list[int] = []
        arrival: dict[int, float] = {}
        for r in judge:
            at = self._silent.get(r)
            if at is None:
                continue
            current = rank_epoch[r] == epoch
            since = at if current else max(at, progress.epoch_start_arrival_s)
            if now_unix_s - since < s.stall_after_s:
                self._recheck.add(r)  # its time comes without anything else changing
                continue
            self._recheck.discard(r)
            if current and furthest - last_step[r] < s.stall_steps_behind:
                continue  # waits for the furthest step (or the epoch) to move
            del self._silent[r]
            if r not in self._stalled:
                idx.append(r)
                arrival[r] = at
        if not idx:
            return []
        idx.sort()
        self._stalled.update(idx)
        current_of = {r: rank_epoch[r] == epoch for r in idx}
        detail = {"last_step": {r: int(last_step[r]) for r in idx},
                  "steps_behind": {r: int(furthest - last_step[r]) if current_of[r] else None for r in idx},
                  "silent_s": {r: round(float(now_unix_s - arrival[r]), 3) for r in idx},
                  "furthest_step": furthest, "clock": "coordinator_arrival"}
        return [Anomaly("stalled_rank", self.job_id, furthest, tuple(idx), 1.0, detail)]
