"""Stalled-rank detection from report arrival times on the coordinator's clock (pure; time passed in).

A rank whose host clock is off (NTP step, skew, a container with a frozen clock) must neither look stalled nor
hide a stall, so :class:`ArrivalStallDetector` never reads ``StepReport.ts_unix_s``: it keeps, per rank, the time
the coordinator received its last report and compares it with the coordinator's own ``now``.
"""

from __future__ import annotations

import math

import numpy as np

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

        Cost: O(world_size) numpy per check; nothing per report beyond one list store.
    """

    def __init__(self, job_id: str, world_size: int, settings: DetectionSettings) -> None:
        self.job_id = job_id
        self.world_size = world_size
        self.settings = settings
        self._arrival: list[float] = [-math.inf] * world_size
        self._left: set[int] = set()
        self._stalled: set[int] = set()

    @property
    def stalled_ranks(self) -> frozenset[int]:
        """Ranks currently reported as stalled (cleared when they report again or leave)."""
        return frozenset(self._stalled)

    def update_settings(self, settings: DetectionSettings) -> None:
        """Swap thresholds (no learned state depends on them)."""
        self.settings = settings

    def on_arrival(self, rank: int, arrival_unix_s: float) -> None:
        """Record that a report of ``rank`` arrived at ``arrival_unix_s``; clears its stalled/left marks."""
        if 0 <= rank < self.world_size:
            self._arrival[rank] = arrival_unix_s
            if self._stalled:
                self._stalled.discard(rank)
            if self._left:
                self._left.discard(rank)

    def mark_left(self, rank: int) -> None:
        """``rank`` left on purpose (``bye``): never reported as stalled until it reports again."""
        if 0 <= rank < self.world_size:
            self._left.add(rank)
            self._stalled.discard(rank)

    def check(self, progress: RankProgress, now_unix_s: float) -> list[Anomaly]:
        """Return one ``stalled_rank`` anomaly naming the newly stalled ranks at ``now_unix_s``, or ``[]``."""
        furthest = progress.furthest_step
        if furthest is None:
            return []
        s = self.settings
        last_step = np.asarray(progress.last_step, dtype=np.int64)
        arrival = np.asarray(self._arrival, dtype=np.float64)
        epoch = np.asarray(progress.rank_epoch, dtype=np.int64)
        seen = np.isfinite(arrival)
        behind = furthest - last_step
        current = epoch == progress.epoch
        since = np.where(current, arrival, np.maximum(arrival, progress.epoch_start_arrival_s))
        silent = (now_unix_s - since) >= s.stall_after_s
        cand = seen & silent & ((current & (behind >= s.stall_steps_behind)) | ~current)
        idx = [int(r) for r in np.flatnonzero(cand).tolist() if r not in self._left and r not in self._stalled]
        if not idx:
            return []
        self._stalled.update(idx)
        detail = {"last_step": {r: int(last_step[r]) for r in idx},
                  "steps_behind": {r: int(behind[r]) if current[r] else None for r in idx},
                  "silent_s": {r: round(float(now_unix_s - arrival[r]), 3) for r in idx},
                  "furthest_step": furthest, "clock": "coordinator_arrival"}
        return [Anomaly("stalled_rank", self.job_id, furthest, tuple(idx), 1.0, detail)]
