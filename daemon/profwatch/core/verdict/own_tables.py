"""profwatch's own ``ClusterTimeSummary``: per-rank, per-step breakdowns from each rank's own tables (pure).

The first verdict of an Ascend capture does not wait for msprof-analyze: each rank's tables (written by
torch_npu's own parse into the rank dir) are read as that rank dir completes (the adapter
``daemon/profwatch/adapters/tools/own_tables_reader.py`` fills a :class:`RankTables`), and once the batch is
complete :func:`combine_rank_tables` does the one cross-rank part (the shortest duration of each collective
instance) and returns the same ``RankStepSummary`` rows msprof-analyze's ``cluster_time_summary`` recipe gives.
This is profwatch's one exception to "use msprof-analyze's recipes where they answer"; msprof-analyze still runs
after the first alert as the confirmation (docs/msprof-analyze.md#own-tables, table and column of each quantity).

Definitions follow Ascend/msprof-analyze 26.2.0, ``cluster_analyse/recipes/cluster_time_summary`` and
``prof_exports/cluster_time_summary_export.py`` (read, not copied). All durations µs, timestamps ns.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from profwatch.core.changes.hardware import FreqSummary
from profwatch.core.verdict.evidence import RankStepSummary

NO_STEP = -1
"""Step label msprof-analyze gives when a rank DB has no ``STEP_TIME`` table (and profwatch too)."""
KIND_COMPUTE, KIND_COMM, KIND_MEMORY = 0, 1, 4
"""Interval kinds of the memory sweep (msprof-analyze's ``COMPUTING_TYPE``, ``COMMUNICATION_TYPE``,
``MEMORY_TYPE``)."""


@dataclass(frozen=True, slots=True)
class TraceRow:
    """One ``analysis.db`` ``StepTraceTime`` row (µs): computing, communication not overlapped, communication,
    free."""

    computing_us: float
    comm_not_overlapped_us: float
    communication_us: float
    free_us: float


@dataclass(frozen=True, slots=True)
class CommOp:
    """One collective as one rank recorded it (``COMMUNICATION_OP``): raw group name, per-instance op name, the
    step its launch (``CANN_API.startNs``) falls in, and its duration (µs)."""

    group: str
    op: str
    step: int
    duration_us: float


@dataclass(slots=True)
class RankTables:
    """What one rank's own tables say, before any cross-rank step (µs).

    ``step_time_us``: step -> ``STEP_TIME`` end - start; ``trace``: step -> :class:`TraceRow`; ``comm``: its
    collectives; ``memory_not_overlapped_us``: step -> memcpy time outside compute and communication;
    ``notes``: what was missing (a missing table reads as no rows, as msprof-analyze zero-fills).
    """

    rank: int
    step_time_us: dict[int, float] = field(default_factory=dict)
    trace: dict[int, TraceRow] = field(default_factory=dict)
    comm: list[CommOp] = field(default_factory=list)
    memory_not_overlapped_us: dict[int, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    comm_rows: int = 0
    """``COMMUNICATION_OP`` rows of the rank DB (for collectives per step)."""
    has_memcpy: bool = False
    """The rank DB holds at least one ``MEMCPY_ASYNC`` task."""
    aicore: FreqSummary | None = None
    """Its AI Core clock over the captured steps (``AICORE_FREQ``: ``profwatch.core.changes.hardware``); None
    without that table."""


@dataclass(slots=True)
class OwnBreakdown:
    """Result of :func:`combine_rank_tables`: rows sorted by (rank, step), instances matched, notes, and
    collectives one rank runs per step (median over ranks of ``COMMUNICATION_OP`` rows per ``STEP_TIME`` row,
    as ``msprof_db.collectives_per_step`` counts one rank DB; None when unknown)."""

    summaries: list[RankStepSummary]
    instances: int
    notes: list[str]
    collectives_per_step: float | None = None


def steps_of(spans: Sequence[tuple[int, int, int]], ts_ns: int) -> list[int]:
    """Steps whose ``STEP_TIME`` span ``(step, start_ns, end_ns)`` holds ``ts_ns``, both ends inclusive, as
    msprof-analyze's ``LEFT JOIN STEP_TIME ON startNs BETWEEN`` (normally one; ``spans`` sorted by start)."""
    i = bisect_right([s[1] for s in spans], ts_ns)
    return [step for step, a, b in spans[:i] if a <= ts_ns <= b]


def comm_ops(rows: Iterable[tuple[str, str, int, int, int]],
             spans: Sequence[tuple[int, int, int]] | None) -> list[CommOp]:
    """``(group, op, start_ns, end_ns, api_start_ns)`` rows -> :class:`CommOp` per step they fall in.

    ``spans`` ``None``: the rank DB has no ``STEP_TIME``, every op is step :data:`NO_STEP`. An op whose launch
    falls in no step is dropped (msprof-analyze's groupby drops the null step).
    """
    out: list[CommOp] = []
    ordered = sorted(spans, key=lambda s: s[1]) if spans is not None else None
    for group, op, start, end, api in rows:
        dur = (end - start) / 1000.0
        for step in ([NO_STEP] if ordered is None else steps_of(ordered, api)):
            out.append(CommOp(group, op, step, dur))
    return out


def memory_not_overlapped_us(intervals: Sequence[tuple[int, int, int]]) -> float:
    """Memcpy time (µs) not covered by compute or communication in one step, msprof-analyze's sweep
    (``ClusterTimeSummary.get_memory_not_overlap``).

    ``intervals``: ``(start_ns, end_ns, kind)`` sorted by (start, end). Walking them by start, the *frontier* is
    the stretch past everything seen so far, owned by the interval reaching furthest; while a memcpy owns it,
    the part of the frontier before the next interval starts counts. An interval inside the frontier moves its
    start to its own end (msprof-analyze's rule, kept as is so both tools give the same figure).
    """
    if not intervals:
        return 0.0
    blk_s = blk_e = intervals[0][0]
    blk_kind = -1
    total = 0
    for s, e, kind in intervals:
        if blk_kind == KIND_MEMORY:
            stop = min(blk_e, s)
            if blk_s < stop:
                total += stop - blk_s
        if s > blk_e:
            blk_s, blk_e, blk_kind = s, e, kind
        elif e > blk_e:
            blk_s, blk_e, blk_kind = blk_e, e, kind
        else:
            blk_s = e
    if blk_kind == KIND_MEMORY:
        total += blk_e - blk_s
    return total / 1000.0


def memory_by_step(rows: Iterable[tuple[int, int, int, int]],
                   spans: Sequence[tuple[int, int, int]] | None) -> dict[int, float]:
    """``(start_ns, end_ns, kind, launch_ns)`` rows of compute, communication and memcpy tasks -> step -> memcpy
    µs not overlapped (:func:`memory_not_overlapped_us`); the launch (``CANN_API.startNs``, a memcpy's own
    start) places a task in its step."""
    ordered = sorted(spans, key=lambda s: s[1]) if spans is not None else None
    per: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    for start, end, kind, launch in rows:
        for step in ([NO_STEP] if ordered is None else steps_of(ordered, launch)):
            per[step].append((start, end, kind))
    return {step: memory_not_overlapped_us(sorted(iv, key=lambda t: (t[0], t[1])))
            for step, iv in per.items() if any(k == KIND_MEMORY for _, _, k in iv)}


def combine_rank_tables(tables: Mapping[int, RankTables]) -> OwnBreakdown:
    """Per-(rank, step) ``RankStepSummary`` rows of one batch from its ranks' own tables.

    Args:
        tables: rank -> :class:`RankTables` (one per rank of the batch; the key is the batch's rank).

    Returns:
        :class:`OwnBreakdown`; rows for every (rank, step) any source names (msprof-analyze's outer merge), a
        missing figure 0.

    Definitions (msprof-analyze 26.2.0 ``cluster_time_summary``):

    * ``step_time`` = ``STEP_TIME`` end - start; without one, computing + communication not overlapped + free.
    * ``computation``, ``communication`` = ``StepTraceTime.computing``, ``.communication``.
    * ``free`` = ``StepTraceTime.free`` minus memcpy time not overlapped by compute or communication.
    * collective instance = (group, op name, step) across the ranks that recorded it; ``transmit`` += the
      shortest duration of the instance, ``wait`` += own duration - that shortest, summed per rank and step.
      With one rank (or none) recording collectives, wait and transmit are 0.
    """
    notes: list[str] = []
    for r in sorted(tables):
        notes += [f"rank {r}: {n}" for n in tables[r].notes]
    inst: dict[tuple[str, str, int], list[tuple[int, float]]] = defaultdict(list)
    for rank, t in tables.items():
        for c in t.comm:
            inst[(c.group, c.op, c.step)].append((rank, c.duration_us))
    wait: dict[tuple[int, int], float] = defaultdict(float)
    transmit: dict[tuple[int, int], float] = defaultdict(float)
    with_comm = {rank for rank, t in tables.items() if t.comm}
    if len(with_comm) > 1:
        for (_, _, step), seen in inst.items():
            low = min(d for _, d in seen)
            for rank, d in seen:
                wait[(rank, step)] += d - low
                transmit[(rank, step)] += low
    elif with_comm:
        notes.append("one rank recorded collectives: wait and transmit are 0")
    else:
        notes.append("no rank recorded collectives: wait and transmit are 0")
    comm_steps: dict[int, set[int]] = defaultdict(set)
    for r, step_id in transmit:
        comm_steps[r].add(step_id)
    rows: list[RankStepSummary] = []
    for rank, t in tables.items():
        steps = set(t.step_time_us) | set(t.trace) | set(t.memory_not_overlapped_us) | comm_steps.get(rank, set())
        for step in steps:
            tr = t.trace.get(step, TraceRow(0.0, 0.0, 0.0, 0.0))
            st = t.step_time_us.get(step)
            if st is None:
                st = tr.computing_us + tr.comm_not_overlapped_us + tr.free_us
            free = tr.free_us - t.memory_not_overlapped_us.get(step, 0.0)
            rows.append(RankStepSummary(rank, step, st, tr.computing_us, tr.communication_us,
                                        wait.get((rank, step), 0.0), transmit.get((rank, step), 0.0), free))
    rows.sort(key=lambda s: (s.rank, s.step))
    per_step = sorted(t.comm_rows / len(t.step_time_us) for t in tables.values() if t.comm_rows and t.step_time_us)
    cps = per_step[len(per_step) // 2] if per_step else None
    return OwnBreakdown(rows, len(inst) if len(with_comm) > 1 else 0, notes, cps)


def unusable_reason(tables: Mapping[int, RankTables], breakdown: OwnBreakdown) -> str | None:
    """Why the own rows should not carry the first verdict (the caller then waits for msprof-analyze, whose
    statuses say what is wrong), or None when they can: a rank with a missing or unreadable table, no
    ``MEMCPY_ASYNC`` task in the whole batch (msprof-analyze 26.2.0 then writes no ``ClusterTimeSummary`` and
    could never confirm), no collective matched across two or more ranks (Level0 captures), or no rows."""
    for rank in sorted(tables):
        if tables[rank].notes:
            return f"rank {rank}: {'; '.join(tables[rank].notes)}"
    if not breakdown.summaries:
        return "no step rows"
    if not any(t.has_memcpy for t in tables.values()):
        return "no MEMCPY_ASYNC task in the batch"
    if len(tables) > 1 and breakdown.instances == 0:
        return "no collective recorded by two or more ranks"
    return None
