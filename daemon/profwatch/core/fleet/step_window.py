"""Per-rank step-time windows with bounded memory (pure).

Each rank keeps the last ``capacity`` (step, step_time_s) pairs in two typed ring buffers (``array('i')`` for
steps, ``array('f')`` for float32 step times: 8 bytes per step, :data:`STEP_TIME_BYTES`, so 16k ranks x 1000 steps is
about 128 MB; 24 bytes and about 390 MB with both CPU rings below, ``profwatch.core.fleet.limits.STEP_BYTES``). A rank
that reports work or stages gets a float32 ring for each (allocated at the first such step; 4 bytes per step and
series; at most :data:`MAX_STAGE_SERIES` stage names per rank, later new names counted in ``stages_dropped``), so
``profwatch telemetry`` can dump what a replay needs to find rank outliers. A rank's CPU measurements get rings
too, allocated at the first step that carries them: the current hook's CPU samples (``cpu_at_step`` as ``int32``,
``cpu_total_s`` as ``float64``: 12 bytes per step, :data:`CPU_SAMPLE_STEP_BYTES`) and an older hook's ``cpu_s``
(``float32``, 4 bytes), so a replay of the dump sees the ``cpu/step`` series the live aggregation saw
(:meth:`StepWindow.cpu_rows`).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Mapping

STEP_TIME_BYTES = 8
"""Bytes per step of every rank: the step (int32) and its time (float32)."""
CPU_SAMPLE_STEP_BYTES = 12
"""Bytes per step of a rank whose reports carry CPU samples (``cpu_at_step`` int32 + ``cpu_total_s`` float64)."""
CPU_S_STEP_BYTES = 4
"""Bytes per step of a rank whose reports carry an older hook's ``cpu_s`` (float32); a rank whose reports carry
both has both rings."""
MAX_STAGE_SERIES = 32
"""Stage names kept per rank (the wire's per-message limit, ``profwatch.core.messages.MAX_STAGES``)."""


class StepWindow:
    """Ring buffer of one rank's recent steps.

    Args:
        capacity: number of steps kept (oldest dropped first).
    """

    __slots__ = ("capacity", "_steps", "_times", "_work", "_stages", "_cpu_s", "_cpu_at", "_cpu_total", "_n", "_head",
                 "stages_dropped")

    def __init__(self, capacity: int = 1000) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self._steps = array("i")  # with _times: STEP_TIME_BYTES a step
        self._times = array("f")
        self._work: array[float] | None = None  # allocated at the first step with work
        self._stages: dict[str, array[float]] | None = None  # name -> ring, allocated at the first step with stages
        self._cpu_s: array[float] | None = None  # NaN: none; allocated at the first step with cpu_s
        self._cpu_at: array[int] | None = None  # -1: no sample; allocated at the first step with a CPU sample
        self._cpu_total: array[float] | None = None  # aligned with _cpu_at
        self._n = 0
        self._head = 0  # next write position once full
        self.stages_dropped = 0
        """Stage values not kept: their name came after :data:`MAX_STAGE_SERIES` others."""

    def append(self, step: int, step_time_s: float, work: float | None = None,
               stages: Mapping[str, float] | None = None, cpu_s: float | None = None,
               cpu_sample: tuple[int, float] | None = None) -> None:
        """Add one step, its work, its stages (seconds) and its CPU fields as the step report carried them
        (``cpu_s``; ``cpu_sample``: ``(cpu_at_step, cpu_total_s)``); None: not reported. Steps (and sample steps)
        above 2**31-1 are clamped: windows are for recent timing, not identity."""
        if step > 2147483647:
            step = 2147483647
        if cpu_s is not None or self._cpu_s is not None:
            self._cpu_s = self._put(self._cpu_s, "f", math.nan, math.nan if cpu_s is None else cpu_s)
        if cpu_sample is not None or self._cpu_at is not None:
            at, total = cpu_sample if cpu_sample is not None else (-1, 0.0)
            self._cpu_at = self._put(self._cpu_at, "i", -1, min(at, 2147483647))
            self._cpu_total = self._put(self._cpu_total, "d", 0.0, total)
        if stages or self._stages is not None:
            self._append_stages(stages or {})
        wk = self._work
        if work is not None and wk is None:
            wk = self._work = array("f", [math.nan]) * self._n
        if self._n < self.capacity:
            self._steps.append(step)
            self._times.append(step_time_s)
            if wk is not None:
                wk.append(math.nan if work is None else work)
            self._n += 1
        else:
            h = self._head
            self._steps[h] = step
            self._times[h] = step_time_s
            if wk is not None:
                wk[h] = math.nan if work is None else work
            self._head = (h + 1) % self.capacity

    def _put(self, ring: array | None, code: str, missing: float | int, value: float | int) -> array:
        """One value into a ring aligned with the steps (allocated here, ``missing`` for the steps before it),
        before ``_n``/``_head`` move; returns the ring."""
        if ring is None:
            ring = array(code, [missing]) * self._n
        if self._n < self.capacity:
            ring.append(value)
        else:
            ring[self._head] = value
        return ring

    def _append_stages(self, stages: Mapping[str, float]) -> None:
        """The stage rings' part of :meth:`append` (before ``_n``/``_head`` move): NaN where a stage is absent."""
        rings = self._stages
        if rings is None:
            rings = self._stages = {}
        for name in stages:
            if name not in rings:
                if len(rings) >= MAX_STAGE_SERIES:
                    self.stages_dropped += 1
                    continue
                rings[name] = array("f", [math.nan]) * self._n
        full = self._n >= self.capacity
        for name, ring in rings.items():
            v = stages.get(name)
            x = math.nan if v is None else float(v)
            if full:
                ring[self._head] = x
            else:
                ring.append(x)

    def stage_rows(self) -> list[dict[str, float] | None]:
        """Each kept step's stages (seconds; None when it reported none), oldest first, aligned with
        :meth:`items`."""
        rings = self._stages
        if not rings:
            return [None] * self._n
        h = self._head if self._n >= self.capacity else 0
        ordered = {k: (r[h:] + r[:h]) for k, r in rings.items()}
        out: list[dict[str, float] | None] = []
        for i in range(self._n):
            row = {k: float(r[i]) for k, r in ordered.items() if not math.isnan(r[i])}
            out.append(row or None)
        return out

    def cpu_rows(self) -> list[dict[str, float | int] | None]:
        """Each kept step's CPU fields as its report carried them (``cpu_s``; ``cpu_at_step`` with ``cpu_total_s``),
        None for a step that carried none; oldest first, aligned with :meth:`items`."""
        if self._cpu_s is None and self._cpu_at is None:
            return [None] * self._n
        h = self._head if self._n >= self.capacity else 0

        def ordered(ring: array | None) -> array | None:
            return None if ring is None else ring[h:] + ring[:h]

        cs, at, tot = ordered(self._cpu_s), ordered(self._cpu_at), ordered(self._cpu_total)
        out: list[dict[str, float | int] | None] = []
        for i in range(self._n):
            row: dict[str, float | int] = {}
            if cs is not None and not math.isnan(cs[i]):
                row["cpu_s"] = round(float(cs[i]), 6)  # float32: to the µs, as step times are dumped
            if at is not None and tot is not None and at[i] >= 0:
                row["cpu_at_step"] = int(at[i])
                row["cpu_total_s"] = float(tot[i])
            out.append(row or None)
        return out

    def __len__(self) -> int:
        return self._n

    def items(self) -> list[tuple[int, float]]:
        """Return ``[(step, step_time_s), ...]`` oldest first."""
        if self._n < self.capacity:
            return list(zip(self._steps, self._times, strict=True))
        h = self._head
        steps = self._steps[h:] + self._steps[:h]
        times = self._times[h:] + self._times[:h]
        return list(zip(steps, times, strict=True))

    def items_with_work(self) -> list[tuple[int, float, float | None]]:
        """Return ``[(step, step_time_s, work or None), ...]`` oldest first."""
        wk = self._work
        if wk is None:
            return [(st, t, None) for st, t in self.items()]
        if self._n >= self.capacity:
            h = self._head
            wk = wk[h:] + wk[:h]
        return [(st, t, None if math.isnan(w) else w) for (st, t), w in zip(self.items(), wk, strict=True)]

    def recent_times(self, n: int) -> list[float]:
        """Return up to the last ``n`` step times (seconds), oldest first (``n >= 1``; read from the ring, not from
        :meth:`items`: the registry asks every rank's last 20 each second)."""
        if n < 1:
            raise ValueError("n must be >= 1")
        k = min(n, self._n)
        times = self._times
        if self._n < self.capacity:
            return times[self._n - k:].tolist()
        h = self._head
        if k <= h:
            return times[h - k:h].tolist()
        return times[self.capacity - (k - h):].tolist() + times[:h].tolist()

    def clear(self) -> None:
        """Forget everything (e.g. after a step counter restart)."""
        self._steps = array("i")  # with _times: STEP_TIME_BYTES a step
        self._times = array("f")
        self._work = None
        self._stages = None
        self._cpu_s = None
        self._cpu_at = None
        self._cpu_total = None
        self._n = 0
        self._head = 0


def median(values: list[float]) -> float | None:
    """Median of a list (None when empty)."""
    if not values:
        return None
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else 0.5 * (s[mid - 1] + s[mid])
