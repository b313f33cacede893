"""Kineto (torch.profiler Chrome trace) time breakdown per rank and step, msprof-analyze style (pure).

The adapter ``daemon/profwatch/adapters/tools/kineto_reader.py`` streams each rank's trace and feeds ``ph == "X"`` events into a
:class:`RankTrace` (compact columns, not dicts); :func:`summarize_traces` turns the ranks' traces into
``RankStepSummary`` rows with the same meaning as msprof-analyze ``ClusterTimeSummary`` (Ascend/msprof-analyze
recipe ``cluster_time_summary``: wait = own collective time minus the shortest of the same instance, transmit = that
shortest), so ranking treats both backends alike. All times are microseconds, the unit
of Kineto's ``ts``/``dur``.
"""

from __future__ import annotations

import re
from array import array
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

from profwatch.core.verdict.evidence import RankStepSummary
from profwatch.core.verdict.kineto_align import Alignment, align_steps

STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
STEP_MARKER_RE = re.compile(r"^\s*(ProfilerStep\s*[#*]?\s*\d*|(train_?|training_?)?(step|iteration|iter)\s*[#_ ]?\s*\d*)\s*$",
                            re.IGNORECASE)
"""Whole-step annotations, not operators: ``ProfilerStep#N`` (torch.profiler's ``schedule`` step spans, also written
by torch_npu), ``ProfilerStep*`` (the span name before Kineto numbers it), and bare ``step N`` / ``iteration N`` /
``train_step_N`` record_function spans around a whole step."""
COLLECTIVE_TOKENS = ("nccl", "gloo", "hccl", "xccl", "c10d::", "all_reduce", "allreduce", "broadcast", "all_gather",
                     "allgather", "reduce_scatter", "reducescatter", "barrier", "all_to_all", "alltoall",
                     "record_param_comms")
"""Lower-case substrings that make an event a collective (CPU or device lane)."""
DEVICE_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "mtia_ccp_events"})
"""Kineto categories of device work (the ``cat`` Kineto writes is ``toString(ActivityType)``, the name table in
pytorch/kineto ``libkineto/include/ActivityType.h``, read at commit 114171d, 2026-08-20):

* ``kernel`` (``CONCURRENT_KERNEL``): CUDA kernels (CUPTI), ROCm kernels (``libkineto/src/RocprofActivity.h``),
  Intel XPU kernels (``libkineto/src/plugin/xpupti/XpuptiActivityHandlers.cpp``);
* ``gpu_memcpy`` / ``gpu_memset`` (``GPU_MEMCPY`` / ``GPU_MEMSET``): device copies and fills, the same three
  backends;
* ``mtia_ccp_events`` (``MTIA_CCP_EVENTS``, "MTIA ondevice CCP events"): Meta MTIA kernels and DMA requests (the
  real MTIA trace of HTA's test data: 25,814 of them, ``fc-dtype_Float``, ``dma_request``, ...). An earlier list
  had ``mtia_kernel``, which no public Kineto writes: MTIA device time was read as host idle.

Ascend NPUs write msprof data, not Kineto device categories (``torch_npu``'s Kineto-shaped export is read by
msprof-analyze). What Kineto writes that is *not* device work: :data:`NOT_DEVICE_CATS`."""
NOT_DEVICE_CATS = frozenset({
    "cpu_op", "user_annotation", "python_function", "cpu_instant_event", "external_correlation", "overhead",
    "gpu_user_annotation", "cuda_runtime", "cuda_driver", "cuda_sync", "cuda_event", "mtia_runtime",
    "mtia_insight", "mtia_counters", "glow_runtime", "cuda_profiler_range", "hpu_op", "xpu_runtime", "xpu_driver",
    "collective_comm", "privateuse1_runtime", "privateuse1_driver", "xpu_scope_profiler", "xpu_sync",
    "hardware_counters", "ac2g", "fwdbwd", "async_cpu_to_gpu", "Trace"})
"""Categories Kineto writes that are not device work (same source as :data:`DEVICE_CATS`):

* host activity: ``cpu_op`` (busy host time, :data:`CPU_COMPUTE_CATS`), ``user_annotation`` (record_function
  spans, ``ProfilerStep#N`` on the host), ``python_function``, ``cpu_instant_event``, ``hpu_op`` ("HPU host side
  runtime event"), the runtime/driver API calls ``cuda_runtime``, ``cuda_driver``, ``mtia_runtime``,
  ``xpu_runtime``, ``xpu_driver``, ``privateuse1_runtime``, ``privateuse1_driver``, ``glow_runtime``;
* on a device lane but not work: ``gpu_user_annotation`` (a user span projected onto the device: the device-side
  ``ProfilerStep#N`` window, used to bound steps), ``cuda_sync`` / ``xpu_sync`` (the host or a stream waiting),
  ``cuda_event`` (event records), ``overhead`` (profiler overhead), counters (``mtia_counters``,
  ``hardware_counters``, ``mtia_insight``), ``cuda_profiler_range``, ``xpu_scope_profiler``, ``external_correlation``;
* ``collective_comm``: Intel XPU's oneCCL records (``xccl::<op>``): a collective by name, kept on the host side;
* flow arrows (``ph`` ``s``/``f``, never ``X``): ``ac2g`` and ``fwdbwd`` (``libkineto/src/output_json.cpp``),
  ``async_cpu_to_gpu`` (older Kineto's launch-to-kernel flow, in the trace_diff traces of HTA's test data);
* ``Trace``: the profiler's own span around the whole capture."""
MEMORY_CATS = frozenset({"gpu_memcpy", "gpu_memset"})
"""Device work that moves or fills memory rather than computing (``RankStepSummary.memory_us``)."""
CPU_COMPUTE_CATS = frozenset({"cpu_op"})
"""Host categories counted as busy. ``user_annotation`` spans (record_function) are left out: a user span
around a whole step would otherwise hide every idle gap."""

# Collective classes, best first: the instance matcher uses the best class present on every rank.
COLL_DEVICE = 0     # device kernels: ncclDevKernel_AllReduce..., hcom kernels (the real transfer)
COLL_BACKEND = 1    # ProcessGroup spans "gloo:all_reduce" (on gloo's runloop thread: the real transfer)
COLL_PARAM = 2      # record_param_comms
COLL_C10D = 3       # c10d::allreduce_ (host enqueue; the wait happens in work.wait())
COLL_OTHER = 4
CLASS_NAMES = {COLL_DEVICE: "device", COLL_BACKEND: "backend", COLL_PARAM: "record_param_comms",
               COLL_C10D: "c10d", COLL_OTHER: "other"}


def collective_class(name: str, cat: str) -> int | None:
    """Collective class of an event (``COLL_*``), or ``None`` when it is not a collective.

    ``aten::`` ops are never collectives (``aten::broadcast_tensors`` is compute).
    """
    low = name.lower()
    if low.startswith("aten::") or not any(tok in low for tok in COLLECTIVE_TOKENS):
        return None
    if cat in DEVICE_CATS:
        return COLL_DEVICE
    if low.startswith(("gloo:", "nccl:", "hccl:")):
        return COLL_BACKEND
    if low == "record_param_comms":
        return COLL_PARAM
    if low.startswith("c10d::"):
        return COLL_C10D
    return COLL_OTHER


def is_step_marker(name: str) -> bool:
    """Whether ``name`` is a whole-step annotation (:data:`STEP_MARKER_RE`) rather than an operator: its time is the
    step's, every operator inside it counts in it too, so a drill-down leaves it out."""
    return bool(STEP_MARKER_RE.match(name))


def parse_step(name: str) -> int | None:
    """``"ProfilerStep#12"`` -> 12; anything else -> ``None``."""
    m = STEP_RE.match(name)
    return int(m.group(1)) if m else None


@dataclass(slots=True)
class Collective:
    """One collective event: start and duration (µs), name, class, device lane or not."""

    ts_us: float
    dur_us: float
    name: str
    klass: int
    device: bool


@dataclass(slots=True)
class RankTrace:
    """The parts of one rank's Kineto trace the breakdown needs, in compact columns.

    ``steps``/``device_steps``: step -> (start_us, end_us) of ``ProfilerStep#N`` on the host / on the device lane
    (``gpu_user_annotation``). Compute intervals are kept as parallel float arrays (16 bytes per event).
    """

    rank: int
    steps: dict[int, tuple[float, float]] = field(default_factory=dict)
    device_steps: dict[int, tuple[float, float]] = field(default_factory=dict)
    cpu_start: array = field(default_factory=lambda: array("d"))
    cpu_end: array = field(default_factory=lambda: array("d"))
    dev_start: array = field(default_factory=lambda: array("d"))
    dev_end: array = field(default_factory=lambda: array("d"))
    dev_mem: bytearray = field(default_factory=bytearray)
    """1 where the device interval of the same index is a memory copy or fill (:data:`MEMORY_CATS`)."""
    collectives: list[Collective] = field(default_factory=list)
    events_seen: int = 0

    def add_event(self, name: str, cat: str, ts_us: float, dur_us: float) -> None:
        """Feed one complete (``ph == "X"``) event. Events with a negative duration are ignored."""
        self.events_seen += 1
        if dur_us < 0:
            return
        step = parse_step(name)
        if step is not None:
            target = self.device_steps if cat.startswith("gpu_") else self.steps
            prev = target.get(step)
            target[step] = (ts_us, ts_us + dur_us) if prev is None else (min(prev[0], ts_us),
                                                                         max(prev[1], ts_us + dur_us))
            return
        klass = collective_class(name, cat)
        device = cat in DEVICE_CATS
        if klass is not None:
            self.collectives.append(Collective(ts_us, dur_us, name, klass, device))
        elif device:
            self.dev_start.append(ts_us)
            self.dev_end.append(ts_us + dur_us)
            self.dev_mem.append(cat in MEMORY_CATS)
        elif cat in CPU_COMPUTE_CATS:
            self.cpu_start.append(ts_us)
            self.cpu_end.append(ts_us + dur_us)

    @property
    def has_device(self) -> bool:
        """True when the trace has device-lane activity (GPU kernels): breakdown is then device-side."""
        return bool(self.dev_start) or any(c.device for c in self.collectives)


@dataclass(slots=True)
class KinetoBreakdown:
    """Result of :func:`summarize_traces`: rows (steps are the reference rank's labels), the collective class
    used, instances matched, notes, and how the ranks' steps were aligned."""

    summaries: list[RankStepSummary]
    collective_class: str | None
    instances_matched: int
    notes: list[str]
    alignment: Alignment = field(default_factory=Alignment)


def _merge(starts: list[float], ends: list[float]) -> tuple[list[float], list[float], list[float]]:
    """Union of intervals -> sorted disjoint ``(starts, ends, prefix_lengths)``; prefix[i] = length before i."""
    order = sorted(range(len(starts)), key=starts.__getitem__)
    ms: list[float] = []
    me: list[float] = []
    for i in order:
        s, e = starts[i], ends[i]
        if ms and s <= me[-1]:
            me[-1] = max(me[-1], e)
        else:
            ms.append(s)
            me.append(e)
    prefix = [0.0]
    for s, e in zip(ms, me, strict=True):
        prefix.append(prefix[-1] + e - s)
    return ms, me, prefix


def _measure(merged: tuple[list[float], list[float], list[float]], a: float, b: float) -> float:
    """Length of ``union ∩ [a, b)`` for a union from :func:`_merge` (O(log n) plus the two edge intervals)."""
    ms, me, prefix = merged
    if not ms or b <= a:
        return 0.0
    lo = bisect_right(me, a)          # first interval ending after a
    hi = bisect_right(ms, b) - 1      # last interval starting before b
    if hi < lo:
        return 0.0
    total = prefix[hi + 1] - prefix[lo]
    total -= max(0.0, a - ms[lo])      # clip the first interval at a
    total -= max(0.0, me[hi] - b)      # clip the last interval at b
    return max(0.0, total)


def _step_of(spans: list[tuple[int, float, float]], ts: float) -> int | None:
    """Step whose span contains ``ts`` (spans sorted by start)."""
    i = bisect_right([s[1] for s in spans], ts) - 1
    if i >= 0 and spans[i][1] <= ts < spans[i][2]:
        return spans[i][0]
    return None


def _side(tr: RankTrace) -> tuple[bool, list[tuple[int, float, float]], list[Collective]]:
    """``(device side?, step spans sorted by start, collectives of that side)`` of one trace."""
    device = tr.has_device
    spans_map = {**tr.steps, **tr.device_steps} if device else tr.steps
    spans = sorted(((s, a, b) for s, (a, b) in spans_map.items()), key=lambda t: t[1])
    colls = [c for c in tr.collectives if c.device == device]
    return device, spans, colls


def _step_rows(tr: RankTrace, device: bool, spans: list[tuple[int, float, float]],
               colls: list[Collective]) -> dict[int, tuple[list[float], tuple[float, float]]]:
    """step -> ``([step_time, computation, communication, wait 0, transmit 0, free, memory], span)`` of one
    rank (see :func:`summarize_traces`; wait and transmit are filled later)."""
    comp_s = list(tr.dev_start if device else tr.cpu_start)
    comp_e = list(tr.dev_end if device else tr.cpu_end)
    comm_union = _merge([c.ts_us for c in colls], [c.ts_us + c.dur_us for c in colls])
    comp_union = _merge(comp_s, comp_e)
    kern_union = _merge([x for x, m in zip(comp_s, tr.dev_mem, strict=True) if not m],
                        [x for x, m in zip(comp_e, tr.dev_mem, strict=True) if not m]) if device else None
    busy_union = _merge(comp_s + [c.ts_us for c in colls], comp_e + [c.ts_us + c.dur_us for c in colls])
    out: dict[int, tuple[list[float], tuple[float, float]]] = {}
    for step, a, b in spans:
        comp = _measure(comp_union, a, b)
        memory = comp - _measure(kern_union, a, b) if kern_union is not None else 0.0
        out[step] = ([b - a, comp, _measure(comm_union, a, b), 0.0, 0.0, (b - a) - _measure(busy_union, a, b),
                      memory], (a, b))
    return out


def summarize_traces(traces: Mapping[int, RankTrace], *, max_skew_us: float = 50_000.0,
                     armed_labels: frozenset[int] | None = None) -> KinetoBreakdown:
    """Per-(rank, step) breakdown of a set of rank traces of one batch.

    Args:
        traces: rank -> :class:`RankTrace` (one per rank).
        max_skew_us: largest clock offset between hosts considered when aligning steps.
        armed_labels: the ``ProfilerStep#`` labels the capture was armed to record, when known
            (:func:`~profwatch.core.verdict.kineto_align.align_steps`).

    Returns:
        :class:`KinetoBreakdown` with one ``RankStepSummary`` per rank and aligned step (the reference rank's
        ``ProfilerStep#N`` label), and the :class:`~profwatch.core.verdict.kineto_align.Alignment` used.

    Alignment (``docs/verdicts.md``; :mod:`profwatch.core.verdict.kineto_align`): steps are paired across ranks by the time their
    spans overlap after correcting each rank's clock offset, estimated from the ends of the collectives it shares
    with the reference rank; without shared collectives by position in the armed window. Steps of a rank that
    cannot be aligned are left out and the rank is named in ``alignment.unaligned``.

    Definitions (µs, per rank and step span ``[a, b)``; device lanes when the rank has device activity, as HTA's
    temporal breakdown does, otherwise host lanes):

    * ``step_time`` = ``b - a`` (device-side ``ProfilerStep`` span when the trace has one).
    * ``communication`` = length of the union of collective intervals in the span (all classes, all lanes of
      the chosen side), overlapped or not, as msprof-analyze's ``communication`` column.
    * ``computation`` = length of the union of compute intervals (``cpu_op`` outside collectives, or device
      kernels/memcpy), including compute overlapped by communication (DDP), as msprof's ``computation``.
    * ``free`` = ``step_time`` minus the union of all busy intervals (compute and collectives).
    * ``memory`` = the part of ``computation`` in device memory copies and fills (:data:`MEMORY_CATS`) that no
      compute kernel overlaps (HTA's TraceDiff reports memory kernels apart from compute kernels).
    * ``wait``/``transmit`` as msprof-analyze: collective instances are the events of the best collective
      class present on every rank (device kernels > ``gloo:``/``nccl:`` spans > ``record_param_comms`` >
      ``c10d::``), assigned to the aligned step containing their start and matched across ranks by (name,
      order of that name within the step). Per instance seen on >= 2 ranks: ``transmit += min duration``,
      ``wait`` = the length of the union of the instances' wait intervals ``[start, start + own - min)`` (a
      collective waits for its last peer, then transfers). The rank the others wait for has the shortest
      collective, so wait ~0. Where msprof-analyze sums over instances, the union keeps ``wait <= communication``
      with concurrent collectives (DDP buckets on several gloo threads: a real gloo job's sum showed 1,674 ms of
      wait in a 940 ms step, docs/report.md); ``transmit`` is at most ``communication - wait``. Durations do not
      depend on clocks.
    """
    notes: list[str] = []
    summaries: list[RankStepSummary] = []
    present = [{c.klass for c in t.collectives} for t in traces.values()]
    common = set.intersection(*present) if present else set()
    klass = min(common) if common else None
    if klass is None and any(present):
        notes.append("no collective class common to all ranks: wait/transmit not computed")
    sides = {rank: _side(tr) for rank, tr in traces.items()}
    alignment = align_steps(
        {r: spans for r, (_, spans, _) in sides.items()},
        {r: [(c.name, c.ts_us + c.dur_us) for c in colls if c.klass == klass] for r, (_, _, colls) in sides.items()}
        if klass is not None else {}, max_skew_us=max_skew_us, armed_labels=armed_labels)
    notes += alignment.notes + [f"rank {r}: {why}" for r, why in sorted(alignment.unaligned.items())]
    # instances[step][(name, k)] -> rank -> (start, duration)
    instances: dict[int, dict[tuple[str, int], dict[int, tuple[float, float]]]] = defaultdict(lambda: defaultdict(dict))
    rows: dict[tuple[int, int], list[float]] = {}
    span_of: dict[tuple[int, int], tuple[float, float]] = {}
    for rank, tr in traces.items():
        labels = alignment.labels.get(rank)
        if not labels:
            continue
        device, all_spans, colls = sides[rank]
        spans = [(labels[s], a, b) for s, a, b in all_spans if s in labels]
        for step, (vals, span) in _step_rows(tr, device, spans, colls).items():
            rows[(rank, step)] = vals
            span_of[(rank, step)] = span
        if klass is None:
            continue
        seen: dict[tuple[int, str], int] = defaultdict(int)
        spans.sort(key=lambda t: t[1])
        for c in sorted((c for c in tr.collectives if c.klass == klass), key=lambda c: c.ts_us):
            found = _step_of(spans, c.ts_us)
            if found is None:
                continue
            k = seen[(found, c.name)]
            seen[(found, c.name)] += 1
            instances[found][(c.name, k)][rank] = (c.ts_us, c.dur_us)
    matched = 0
    waits: dict[tuple[int, int], tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    for step, insts in instances.items():
        for seen_on in insts.values():
            if len(seen_on) < 2:
                continue
            matched += 1
            shortest = min(d for _, d in seen_on.values())
            for rank, (ts, d) in seen_on.items():
                row = rows.get((rank, step))
                if row is not None:
                    starts, ends = waits[(rank, step)]
                    starts.append(ts)
                    ends.append(ts + d - shortest)  # a collective waits for its last peer, then transfers
                    row[4] += shortest
    for key, (starts, ends) in waits.items():
        row = rows[key]
        # wall time spent waiting: the union of the instances' wait intervals, so concurrent collectives (DDP
        # buckets on several gloo threads) never make wait exceed communication (docs/report.md invariants)
        row[3] = min(_measure(_merge(starts, ends), *span_of[key]), row[2])
        row[4] = min(row[4], row[2] - row[3])
    for (rank, step), (st, comp, comm, wait, tx, free, mem) in sorted(rows.items(),
                                                                     key=lambda kv: (kv[0][1], kv[0][0])):
        summaries.append(RankStepSummary(rank, step, st, comp, comm, wait, tx, max(0.0, free), max(0.0, mem)))
    if klass is not None and matched == 0:
        notes.append("no collective instance matched across ranks")
    return KinetoBreakdown(summaries, CLASS_NAMES.get(klass) if klass is not None else None, matched, notes,
                           alignment)
