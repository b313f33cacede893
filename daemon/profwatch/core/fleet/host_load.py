"""Host CPU load per node, and whether it explains a job-wide slowdown (pure: no I/O, no clock reads).

Each node daemon samples its host about once a second (``daemon/profwatch/adapters/host_load.py``) and sends the
mean of the last heartbeat interval with each heartbeat (``rankhook/wire.py`` ``NodeHeartbeat.runnable_per_core`` and
``cpu_psi_some_pct``). The coordinator keeps one bounded :class:`HostLoadSeries` per node (coarse buckets of
:data:`BUCKET_S`, at most :data:`SERIES_BUCKETS`), and :func:`explain_job_change` says whether a job-wide move of the
step time comes with a host-load move that predicts it.

Two measures, and why the run queue decides:

* ``runnable_per_core``: tasks runnable (``procs_running`` of ``/proc/stat``, see proc(5), less the sampler itself)
  per online CPU. Under the kernel's fair scheduler a CPU-bound task sharing ``C`` cores with ``R`` runnable tasks
  gets ``min(1, C / R)`` of a core, so its time per unit of work scales with ``max(1, R / C)``: the measure does not
  saturate, and a ratio of two levels predicts a ratio of step times.
* PSI ``some avg10`` of ``/proc/pressure/cpu`` (the kernel's pressure stall information,
  Documentation/accounting/psi.rst): the share of the last 10 s in which at least one runnable task waited for a
  CPU. It saturates near 100 % as soon as the host runs more runnable tasks than cores (measured 93-95 % at a load
  of 4 on 2 cores), so it cannot tell one busy loop from two; it is kept as evidence and shown in ``status`` where
  the kernel has it (``-1``: absent, e.g. kernels before 4.20 or booted with ``psi=0``), never used to decide.

Neither weighs tasks by their nice level: on a host shared with niced work the run queue over-predicts a normal-priority
job's slowdown, so the explanation is off unless ``[arming] host_load_explains`` is set (measured in
``docs/detection.md``, "Host load explains a job-wide move").
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

BUCKET_S = 10.0
"""Width of one stored bucket of a node's load series (the heartbeats inside one are averaged)."""
SERIES_BUCKETS = 180
"""Buckets kept per node: 30 minutes at :data:`BUCKET_S`, about 3 KB per node (``limits.HOST_LOAD_BYTES``)."""
MAX_RUNNABLE_PER_CORE = 10_000.0
"""Largest runnable-per-core value a heartbeat may carry (a larger one is refused as ``bad_value``)."""
BEFORE_S = (900.0, 120.0)
"""The load before a change: the median of the buckets from 900 s to 120 s before its episode opened (the
detectors' baselines are learned over minutes, and a change is reported up to minutes after its onset)."""
AFTER_S = 60.0
"""The load during a change: the median of the last 60 s of buckets."""
MIN_BUCKETS = (6, 3)
"""Buckets needed before and after (60 s and 30 s of heartbeats) for any judgement; fewer: no explanation."""
MAX_EXPLAIN_GAP_S = AFTER_S / MIN_BUCKETS[1]
"""Largest gap between a node's heartbeats (s) that always fills :data:`MIN_BUCKETS` after a move: a node whose
heartbeats come further apart (``[node] heartbeat_interval_s`` of 30 s, say) explains a move only at some judgement
times (2 of 3 see too few heartbeats at 30 s), and ``status`` says so instead of staying silent."""
GAPS_KEPT = 5
"""Gaps between a node's heartbeats kept to tell its interval (their median)."""
MIN_LOAD_FACTOR = 1.08
"""A host-load move explains nothing below this predicted slowdown (the run queue's noise from second to second
on a quiet host)."""
UNEXPLAINED_SLACK = 0.10
"""A job-wide move is explained when it is at most the predicted slowdown times ``1 + UNEXPLAINED_SLACK``: what load
does not explain must stay under 10 %, less than the smallest change the detectors capture (``min_effect``)."""


def parse_psi_some_avg10(text: str) -> float | None:
    """The ``some avg10`` percentage of a ``/proc/pressure/cpu`` text (``some avg10=1.23 avg60=... total=...``), or
    None when the line or field is absent or not a number in [0, 100]."""
    for line in text.splitlines():
        parts = line.split()
        if not parts or parts[0] != "some":
            continue
        for p in parts[1:]:
            if p.startswith("avg10="):
                try:
                    v = float(p[6:])
                except ValueError:
                    return None
                return v if 0.0 <= v <= 100.0 else None
    return None


def parse_procs_running(text: str) -> int | None:
    """``procs_running`` of a ``/proc/stat`` text (proc(5): runnable tasks now), or None when absent or bad."""
    for line in text.splitlines():
        if line.startswith("procs_running "):
            try:
                v = int(line.split()[1])
            except (IndexError, ValueError):
                return None
            return v if v >= 0 else None
    return None


def contention(runnable_per_core: float) -> float:
    """Predicted time per unit of CPU-bound work relative to an idle host: ``max(1, R / C)`` (see the module doc)."""
    return max(1.0, runnable_per_core)


@dataclass(slots=True)
class HostLoadSeries:
    """One node's load over the last :data:`SERIES_BUCKETS` buckets of :data:`BUCKET_S` (coordinator clock, s).

    ``t`` bucket starts; ``runnable`` mean runnable tasks per core; ``psi`` mean PSI ``some avg10`` (%) or NaN where
    the node has no PSI. Memory is bounded: the oldest bucket is dropped first.
    """

    t: array = field(default_factory=lambda: array("d"))
    runnable: array = field(default_factory=lambda: array("f"))
    psi: array = field(default_factory=lambda: array("f"))
    _n: array = field(default_factory=lambda: array("H"))
    samples: int = 0
    psi_available: bool | None = None
    """None: no sample yet; False: the node's kernel has no PSI (its heartbeats say -1)."""
    last_s: float = math.nan
    """Coordinator time of the newest sample (NaN before any)."""
    gaps: array = field(default_factory=lambda: array("f"))
    """Seconds between successive samples, the newest :data:`GAPS_KEPT` (empty before the second sample)."""

    def add(self, now_s: float, runnable_per_core: float, psi_some_pct: float) -> None:
        """Fold one heartbeat's sample in. ``runnable_per_core < 0``: the node did not measure (an older node
        daemon, or /proc/stat unreadable): ignored. ``psi_some_pct < 0``: no PSI on that node."""
        if not (math.isfinite(now_s) and math.isfinite(runnable_per_core)) or runnable_per_core < 0:
            return
        if self.t and now_s < self.t[-1]:
            return  # the coordinator's clock stepped back: dropped, never stored out of order
        has_psi = math.isfinite(psi_some_pct) and psi_some_pct >= 0
        self.psi_available = has_psi
        psi = psi_some_pct if has_psi else math.nan
        self.samples += 1
        if math.isfinite(self.last_s):
            self.gaps.append(now_s - self.last_s)
            if len(self.gaps) > GAPS_KEPT:
                del self.gaps[0]
        self.last_s = now_s
        if self.t and self.t[-1] <= now_s < self.t[-1] + BUCKET_S:
            k = self._n[-1] + 1
            self.runnable[-1] += (runnable_per_core - self.runnable[-1]) / k
            self.psi[-1] = psi if math.isnan(self.psi[-1]) else self.psi[-1] + (psi - self.psi[-1]) / k
            self._n[-1] = min(k, 65_535)
            return
        self.t.append(now_s)
        self.runnable.append(runnable_per_core)
        self.psi.append(psi)
        self._n.append(1)
        if len(self.t) > SERIES_BUCKETS:
            for a in (self.t, self.runnable, self.psi, self._n):
                del a[0]

    def between(self, start_s: float, end_s: float) -> list[tuple[float, float]]:
        """``(runnable_per_core, psi)`` of the buckets starting in ``[start_s, end_s)``."""
        return [(self.runnable[i], self.psi[i]) for i in range(len(self.t)) if start_s <= self.t[i] < end_s]

    def latest(self) -> tuple[float, float] | None:
        """The newest bucket's ``(runnable_per_core, psi)`` (psi NaN where absent), or None before any sample."""
        return (self.runnable[-1], self.psi[-1]) if self.t else None

    def view(self) -> dict[str, Any]:
        """JSON for ``status``: the newest bucket and whether the node has PSI."""
        last = self.latest()
        return {"runnable_per_core": None if last is None else round(last[0], 3),
                "cpu_psi_some_pct": None if last is None or math.isnan(last[1]) else round(last[1], 2),
                "psi_available": self.psi_available, "samples": self.samples,
                "heartbeat_gap_s": None if math.isnan(self.gap_s) else round(self.gap_s, 1),
                "too_sparse_to_explain": bool(self.gap_s > MAX_EXPLAIN_GAP_S)}

    @property
    def gap_s(self) -> float:
        """The node's heartbeat interval as seen here: the median of the newest :data:`GAPS_KEPT` gaps between
        samples (one late heartbeat does not make a node "too sparse"), NaN before the second sample."""
        return _median(list(self.gaps)) if self.gaps else math.nan


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


@dataclass(frozen=True, slots=True)
class LoadExplanation:
    """The host-load evidence for one job-wide move: runnable tasks per core before and during it (the worst node),
    the slowdown that predicts (``predicted``, a ratio >= 1), the job's move (``observed``, a ratio), and PSI before
    and during where the nodes have it (None otherwise)."""

    node_id: str
    runnable_before: float
    runnable_after: float
    predicted: float
    observed: float
    psi_before: float | None
    psi_after: float | None
    explained: bool

    def to_json(self) -> dict[str, Any]:
        """The evidence as an event's JSON (rounded)."""
        return {"node_id": self.node_id, "runnable_per_core_before": round(self.runnable_before, 3),
                "runnable_per_core_after": round(self.runnable_after, 3), "predicted_ratio": round(self.predicted, 3),
                "observed_ratio": round(self.observed, 3), "explained": self.explained,
                "cpu_psi_some_pct_before": None if self.psi_before is None else round(self.psi_before, 2),
                "cpu_psi_some_pct_after": None if self.psi_after is None else round(self.psi_after, 2)}


def _psi_median(rows: list[tuple[float, float]]) -> float | None:
    vals = [p for _, p in rows if not math.isnan(p)]
    return _median(vals) if vals else None


def explain_job_change(series: Iterable[tuple[str, HostLoadSeries]], *, opened_s: float, now_s: float,
                       magnitude: float) -> LoadExplanation | None:
    """Whether the host load of a job's nodes explains a job-wide move of ``magnitude`` (now / before - 1).

    For each node: the median runnable tasks per core before (:data:`BEFORE_S` relative to ``opened_s``) and during
    (the last :data:`AFTER_S` before ``now_s``); the predicted slowdown ``contention(after) / contention(before)``.
    A job in lockstep runs at its slowest node's pace, so the node with the largest predicted slowdown is the
    evidence. The move is explained when that prediction is at least :data:`MIN_LOAD_FACTOR` and the observed ratio
    ``1 + magnitude`` is at most ``predicted * (1 + UNEXPLAINED_SLACK)``.

    Returns:
        The evidence (``explained`` True or False), or None when no node has :data:`MIN_BUCKETS` of data on both
        sides or ``magnitude`` is not a finite number above -1 (nothing can be said: the move is judged as before).
    """
    if not (math.isfinite(magnitude) and magnitude > -1.0):
        return None
    best: LoadExplanation | None = None
    for node_id, s in series:
        before = s.between(opened_s - BEFORE_S[0], opened_s - BEFORE_S[1])
        after = s.between(now_s - AFTER_S, now_s + BUCKET_S)
        if len(before) < MIN_BUCKETS[0] or len(after) < MIN_BUCKETS[1]:
            continue
        rb, ra = _median([r for r, _ in before]), _median([r for r, _ in after])
        predicted = contention(ra) / contention(rb)
        if best is None or predicted > best.predicted:
            observed = 1.0 + magnitude
            explained = predicted >= MIN_LOAD_FACTOR and observed <= predicted * (1.0 + UNEXPLAINED_SLACK)
            best = LoadExplanation(node_id, rb, ra, predicted, observed, _psi_median(before), _psi_median(after),
                                   explained)
    return best
