"""SIMULATOR: writes Ascend-format rank dirs (``*_ascend_pt``) as torch_npu does, from timelines (I/O).

This is **not** captured data. It mirrors the layout, file order, modes and tables torch_npu + CANN produce
(Ascend/pytorch ``torch_npu/profiler`` writers; the rank discovery and table reads of Ascend/msprof-analyze
``cluster_analyse``) so that msprof-analyze 26.2.0 accepts the tree. Two entry points:

- :func:`write_rank_dir` writes one rank dir from a :class:`RankTimeline` (e.g. timings measured by the
  simulator job, one call per rank);
- :func:`generate_cluster` builds physically consistent timelines for a whole world and writes them.

Damage helpers (:func:`truncate_db`, :func:`drop_table`, :func:`empty_device_data`, ...) break a written rank dir
the way real captures break (interrupted copies, missing tables, no device data) for tests.

The table contents are written by ``daemon/profwatch/simulate/ascend_db.py``, which takes its timeline types from
here: a deliberate pair (each imports the other), kept as two files only to hold the SQL apart from the layout.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar, Literal

from profwatch.core.verdict.evidence import RankStepSummary
from profwatch.simulate.ascend_db import FILE_MODE, write_analysis_db, write_profiler_db, write_text_outputs

ExportType = Literal["db", "text", "both"]
DIR_MODE = 0o750
DEFAULT_TS_BASE_NS = 1_767_268_800_000_000_000  # 2026-01-01T12:00:00Z: fixed so generated trees are reproducible
TORCH_NPU_VERSION = "2.7.1"
CANN_VERSION = "8.3.RC1"
NOMINAL_AICORE_MHZ = 1800.0  # the AI Core clock msprof-analyze's freq_analysis treats as common (800 MHz: idle)
_CHUNK_COMPUTE_NS = 15_000_000  # compute per chunk before each collective (15 ms)
_TRANSMIT_NS = 1_000_000  # data movement of one collective (1 ms)
_LAUNCH_GAP_NS = 2_000
_KERNELS = (("aclnnMatMul_MatMulKernel", "MatMul", "aten::matmul"), ("aclnnAdd_AddKernel", "Add", "aten::add"))


@dataclass(frozen=True, slots=True)
class ComputeSegment:
    """One compute kernel on the device: [start_ns, end_ns) unix-epoch ns."""

    kind: ClassVar[str] = "compute"
    start_ns: int
    end_ns: int
    name: str = "aclnnMatMul_MatMulKernel"
    op_type: str = "MatMul"
    aten_name: str = "aten::matmul"


@dataclass(frozen=True, slots=True)
class CollectiveSegment:
    """One collective as seen by one rank: it starts when this rank arrives and ends when all ranks are done.

    ``name`` is the per-instance HCCL op name, identical on every member (``hcom_allReduce__100_0_1``);
    ``group`` the raw HCCL group name. ``wait_ns`` is the part of the duration spent waiting for peers (0 for
    the last arrival); ``link_transit_ns`` the time this rank's own link needed for the data (None = the
    transit part, duration - wait); a slow link has a larger one (lower bandwidth in CommAnalyzerBandwidth).
    """

    kind: ClassVar[str] = "collective"
    start_ns: int
    end_ns: int
    name: str
    group: str
    op_type: str = "hcom_allReduce_"
    size_bytes: int = 64 * 1024 * 1024
    wait_ns: int = 0
    link_transit_ns: int | None = None


Segment = ComputeSegment | CollectiveSegment


@dataclass(frozen=True, slots=True)
class StepTimeline:
    """One ``ProfilerStep#step`` on one rank: its window and its segments in time order."""

    step: int
    start_ns: int
    end_ns: int
    segments: tuple[Segment, ...]


@dataclass(frozen=True, slots=True)
class ParallelGroup:
    """One HCCL communicator, as in ``parallel_group_info``: raw name -> {group_name, group_rank, global_ranks}."""

    raw_name: str
    pg_name: str
    global_ranks: tuple[int, ...]


@dataclass(slots=True)
class RankTimeline:
    """Everything needed to write one rank dir. ``start_ns``: profiler start (names the dir, local time).

    ``level``: ``"Level0"`` writes no communication tables (COMMUNICATION_OP, CommAnalyzer*), as a Level0
    capture has no HCCL op data. ``memcpy``: add one
    MEMCPY_ASYNC task per step (cluster_time_summary needs at least one in the cluster, section 5).
    """

    rank: int
    world_size: int
    hostname: str
    pid: int
    steps: list[StepTimeline]
    start_ns: int
    groups: list[ParallelGroup] = field(default_factory=list)
    device_id: int | None = None
    level: str = "Level1"
    memcpy: bool = True
    torch_npu_version: str = TORCH_NPU_VERSION
    cann_version: str = CANN_VERSION
    peer_link_factors: dict[int, float] = field(default_factory=dict)
    """global peer rank -> how many times slower the link to that peer is (``slow_links``); matrix rows only."""
    own_link_factor: float = 1.0
    """this rank's own link slowdown (``slow_link_ranks``): every link of the rank, in the matrix too."""
    aicore_mhz: float = NOMINAL_AICORE_MHZ
    """its AI Core clock (MHz) through the capture (``AICORE_FREQ``; ``throttled_ranks``)."""


def rank_dir_name(hostname: str, pid: int, start_ns: int) -> str:
    """``{host}_{pid}_{YYYYmmddHHMMSSfff}_ascend_pt`` with local time, as torch_npu names it (section 3)."""
    dt = datetime.fromtimestamp(start_ns / 1e9)
    return f"{hostname}_{pid}_{dt.strftime('%Y%m%d%H%M%S')}{dt.microsecond // 1000:03d}_ascend_pt"


def _export_list(export_type: ExportType) -> list[str]:
    return {"db": ["db"], "text": ["text"], "both": ["text", "db"]}[export_type]


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=4), encoding="utf-8")
    path.chmod(FILE_MODE)


def write_rank_dir(parent: Path, timeline: RankTimeline, *, export_type: ExportType = "db", with_marker: bool = True,
                   metadata: Mapping[str, Any] | None = None, minimal: bool = False) -> Path:
    """Write one rank dir under ``parent`` in torch_npu's order; return its path.

    Order (section 4.1): dir (0750) -> ``profiler_info_{rank}.json`` -> ``profiler_metadata.json`` ->
    ``ASCEND_PROFILER_OUTPUT/ascend_pytorch_profiler_{rank}.db`` -> ``analysis.db`` (StepTraceTime last) ->
    text files -> empty ``analyse.done`` (only if ``with_marker``). Files are 0640. ``metadata`` keys are added
    to ``profiler_metadata.json`` and META_DATA next to ``parallel_group_info`` and ``distributed_args``.
    ``minimal`` writes smaller DBs (see :func:`~profwatch.simulate.ascend_db.write_profiler_db`) and no text.
    Raises FileExistsError if the rank dir already exists.
    """
    tl = timeline
    rank_dir = Path(parent) / rank_dir_name(tl.hostname, tl.pid, tl.start_ns)
    Path(parent).mkdir(parents=True, exist_ok=True)
    rank_dir.mkdir(mode=DIR_MODE)
    rank_dir.chmod(DIR_MODE)
    last_end = max((s.end_ns for s in tl.steps), default=tl.start_ns)
    info = {
        "config": {
            "common_config": {"activities": ["ProfilerActivity.CPU", "ProfilerActivity.NPU"],
                              "schedule": {"wait": 0, "warmup": 0, "active": len(tl.steps), "repeat": 1,
                                           "skip_first": 0},
                              "record_shapes": False, "profile_memory": False, "with_stack": False},
            "experimental_config": {"_profiler_level": tl.level, "_aic_metrics": "AiCoreNone",
                                    "_l2_cache": False, "_data_simplification": True,
                                    "_export_type": _export_list(export_type)}},
        "start_info": {"syscnt_enable": False, "freq": 100, "start_cnt": 0,
                       "collectionTimeBegin": str(tl.start_ns)},
        "end_info": {"collectionTimeEnd": str(last_end + 5_000_000), "MonotonicTimeEnd": str(last_end)},
        "torch_npu_version": tl.torch_npu_version,
        "cann_version": tl.cann_version,
        "rank_id": tl.rank,
    }
    _write_json(rank_dir / f"profiler_info_{tl.rank}.json", info)
    meta: dict[str, Any] = {
        "distributed_args": {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1,
                             "data_parallel_size": tl.world_size, "world_size": tl.world_size},
        "parallel_group_info": {g.raw_name: {"group_name": g.pg_name, "group_rank": g.global_ranks.index(tl.rank),
                                             "global_ranks": list(g.global_ranks)}
                                for g in tl.groups if tl.rank in g.global_ranks},
        "trace_id": f"{tl.hostname}-{tl.pid}-{tl.start_ns}",
    }
    meta.update(metadata or {})
    _write_json(rank_dir / "profiler_metadata.json", meta)
    out = rank_dir / "ASCEND_PROFILER_OUTPUT"
    out.mkdir(mode=DIR_MODE)
    out.chmod(DIR_MODE)
    if export_type in ("db", "both"):
        write_profiler_db(out / f"ascend_pytorch_profiler_{tl.rank}.db", tl, metadata=meta, minimal=minimal)
        write_analysis_db(out / "analysis.db", tl, minimal=minimal)
    if export_type in ("text", "both") and not minimal:
        write_text_outputs(out, tl)
    if with_marker:
        marker = out / "analyse.done"
        marker.touch()
        marker.chmod(FILE_MODE)
    return rank_dir


def default_group_name(ts_base_ns: int) -> str:
    """An HCCL-style raw communicator name, ``{ip}%{iface}_{port}_{idx}_{create_ts_us}``."""
    return f"10.0.0.1%eth0_60000_0_{ts_base_ns // 1000}"


def build_timelines(*, world_size: int = 4, slow_ranks: Mapping[int, float] | None = None, steps: int = 3,
                    first_step: int = 1, collectives_per_step: int = 4, hostnames: Mapping[int, str] | None = None,
                    seed: int = 0, noise: float = 0.02, level: str = "Level1",
                    host_bound_ranks: Mapping[int, float] | None = None,
                    slow_link_ranks: Mapping[int, float] | None = None, ts_base: int | None = None,
                    kernels_per_chunk: int = 6, slow_links: Mapping[tuple[int, int], float] | None = None,
                    first_step_delay_ranks: Mapping[int, float] | None = None,
                    step_delays: Mapping[tuple[int, int], float] | None = None,
                    throttled_ranks: Mapping[int, float] | None = None,
                    slow_ops: Mapping[str, float] | None = None,
                    rank_slow_ops: Mapping[int, Mapping[str, float]] | None = None) -> list[RankTimeline]:
    """Physically consistent timelines of one synchronous data-parallel job (one world allreduce group).

    Notes:
        Each step runs ``collectives_per_step`` times [compute chunk (``kernels_per_chunk`` kernels, 15 ms in
        total, times ``slow_ranks[r]``, each kernel jittered by N(1, ``noise``)) -> world allreduce]. Rank r
        arrives at the collective when its chunk ends (plus ``host_bound_ranks[r]`` x chunk of dispatch gaps
        spread between kernels). Every rank leaves the collective at ``last arrival + transmit``, transmit being
        1 ms x the worst ``slow_link_ranks`` / ``slow_links`` factor in the group (a ring collective moves at the
        pace of its slowest link); so the last arrival (the slow rank) has the shortest collective and the
        others wait (the fact msprof-analyze's slow_rank recipe votes on). A slow-link rank also records its own link time x factor
        (lower bandwidth); ``slow_links`` {(a, b): factor} slows only the link between a and b: both record
        their link time x factor and the communication matrix shows the pair (and only it) slower.
        ``first_step_delay_ranks`` {rank: fraction of a chunk}: a one-off delay before the rank's first kernel
        of the first step (the profiler's start-up on one rank); ``step_delays`` {(rank, step index): fraction}
        the same for any step. ``throttled_ranks`` {rank: MHz}: the rank's AI Core clock (nominal
        :data:`NOMINAL_AICORE_MHZ`), recorded in ``AICORE_FREQ``; its compute takes nominal / MHz times longer (on
        top of ``slow_ranks``). ``slow_ops`` {operator type (``MatMul``, ``Add``): factor}: that operator's
        kernels take factor x longer on every rank (a regression in one operator: a worse kernel after an upgrade,
        a changed shape). ``rank_slow_ops`` {rank: {operator type: factor}}: the same on one rank only (a rank
        slow in one operator: what the drill-down names). Steps start in lockstep; timestamps are unix-epoch ns from ``ts_base`` (default
        :data:`DEFAULT_TS_BASE_NS`). Deterministic for a given ``seed``; the random draws do not depend on the
        slowdowns, so a batch with and one without a slowdown (same seed) differ only by it.
    """
    if world_size < 1 or steps < 1 or collectives_per_step < 1:
        raise ValueError("world_size, steps and collectives_per_step must be >= 1")
    rng = random.Random(seed)
    base = DEFAULT_TS_BASE_NS if ts_base is None else ts_base
    f = _job_factors(world_size, slow_ranks, host_bound_ranks, slow_link_ranks, throttled_ranks, slow_ops,
                     slow_links, first_step_delay_ranks, step_delays, rank_slow_ops)
    group = ParallelGroup(default_group_name(base), "default_group", tuple(range(world_size)))
    segs, windows = _run_steps(rng, f, group, world_size=world_size, steps=steps, base=base, noise=noise,
                               collectives_per_step=collectives_per_step, kernels_per_chunk=kernels_per_chunk)
    hosts = dict(hostnames or {})
    return [
        RankTimeline(rank=r, world_size=world_size, hostname=hosts.get(r, f"node{r // 8}"), pid=4000 + r,
                     start_ns=base + r * 1_000_000, groups=[group], device_id=r % 8, level=level,
                     steps=[StepTimeline(first_step + s, windows[s][0], windows[s][1], tuple(segs[r][s]))
                            for s in range(steps)],
                     peer_link_factors=dict(f.peer_factors[r]), own_link_factor=f.slow_link.get(r, 1.0),
                     aicore_mhz=f.clock.get(r, NOMINAL_AICORE_MHZ))
        for r in range(world_size)
    ]


@dataclass(slots=True)
class _JobFactors:
    """:func:`build_timelines`' slowdowns, checked and combined: compute factor per rank (a throttled clock
    included), host-bound gaps, link factors (own, per peer, the group's worst), operator factors, one-off delays."""

    slow: dict[int, float]
    host_bound: dict[int, float]
    slow_link: dict[int, float]
    clock: dict[int, float]
    op_factor: dict[str, float]
    rank_ops: dict[int, dict[str, float]]
    delays: dict[tuple[int, int], float]
    peer_factors: dict[int, dict[int, float]]
    rank_link: dict[int, float]
    link_factor: float


def _job_factors(world_size: int, slow_ranks: Mapping[int, float] | None, host_bound_ranks: Mapping[int, float] | None,
                 slow_link_ranks: Mapping[int, float] | None, throttled_ranks: Mapping[int, float] | None,
                 slow_ops: Mapping[str, float] | None, slow_links: Mapping[tuple[int, int], float] | None,
                 first_step_delay_ranks: Mapping[int, float] | None,
                 step_delays: Mapping[tuple[int, int], float] | None,
                 rank_slow_ops: Mapping[int, Mapping[str, float]] | None = None) -> _JobFactors:
    """Check and combine :func:`build_timelines`' slowdown arguments. Raises ValueError for a throttled rank or a
    slow link outside the job, a clock out of range or an operator the simulator does not have."""
    slow, host_bound, slow_link = dict(slow_ranks or {}), dict(host_bound_ranks or {}), dict(slow_link_ranks or {})
    clock = {r: float(m) for r, m in (throttled_ranks or {}).items()}
    for r, mhz in clock.items():
        if not (0 <= r < world_size and 0 < mhz <= 10 * NOMINAL_AICORE_MHZ):
            raise ValueError(f"throttled rank {r} at {mhz} MHz: rank outside 0..{world_size - 1} or clock out of range")
        slow[r] = slow.get(r, 1.0) * NOMINAL_AICORE_MHZ / mhz
    op_factor = dict(slow_ops or {})
    rank_ops = {r: dict(f) for r, f in (rank_slow_ops or {}).items()}
    unknown = sorted((set(op_factor) | {k for f in rank_ops.values() for k in f}) - {k[1] for k in _KERNELS})
    if unknown:
        raise ValueError(f"slow_ops {unknown}: the simulated operators are {sorted(k[1] for k in _KERNELS)}")
    pairs = {(min(a, b), max(a, b)): float(f) for (a, b), f in (slow_links or {}).items() if a != b}
    for a, b in pairs:
        if not (0 <= a < world_size and 0 <= b < world_size):
            raise ValueError(f"slow link {a}-{b} outside ranks 0..{world_size - 1}")
    delays = {(r, 0): f for r, f in (first_step_delay_ranks or {}).items()}
    delays.update(step_delays or {})
    peer_factors: dict[int, dict[int, float]] = {r: {} for r in range(world_size)}
    for (a, b), f in pairs.items():
        peer_factors[a][b] = peer_factors[b][a] = f
    rank_link = {r: max([slow_link.get(r, 1.0), *peer_factors[r].values()]) for r in range(world_size)}
    return _JobFactors(slow=slow, host_bound=host_bound, slow_link=slow_link, clock=clock, op_factor=op_factor,
                       rank_ops=rank_ops, delays=delays, peer_factors=peer_factors, rank_link=rank_link,
                       link_factor=max([1.0, *slow_link.values(), *pairs.values()]))


def _run_steps(rng: random.Random, f: _JobFactors, group: ParallelGroup, *, world_size: int, steps: int, base: int,
               noise: float, collectives_per_step: int,
               kernels_per_chunk: int) -> tuple[list[list[list[Segment]]], list[tuple[int, int]]]:
    """Every rank's segments per step (``segs[rank][step index]``) and each step's window ``(start_ns, end_ns)``
    (``build_timelines``' Notes: compute chunks, then a world allreduce every rank leaves together)."""
    op_ns = _CHUNK_COMPUTE_NS // kernels_per_chunk
    segs: list[list[list[Segment]]] = [[[] for _ in range(steps)] for _ in range(world_size)]
    windows: list[tuple[int, int]] = []
    t = base + 1_000_000
    instance = 100
    for s in range(steps):
        step_start = t
        cursor = [step_start + int(100_000 * (1 + rng.random() * 0.5)) for _ in range(world_size)]
        for r in range(world_size):
            cursor[r] += int(f.delays.get((r, s), 0.0) * _CHUNK_COMPUTE_NS)
        for _c in range(collectives_per_step):
            for r in range(world_size):
                factor = f.slow.get(r, 1.0)
                gap = _LAUNCH_GAP_NS + int(f.host_bound.get(r, 0.0) * _CHUNK_COMPUTE_NS * factor / kernels_per_chunk)
                for k in range(kernels_per_chunk):
                    kname, ktype, aten = _KERNELS[k % 2]
                    dur = max(int(op_ns * factor * f.op_factor.get(ktype, 1.0) * f.rank_ops.get(r, {}).get(ktype, 1.0)
                                  * (1.0 + rng.gauss(0.0, noise))), 1_000)
                    segs[r][s].append(ComputeSegment(cursor[r], cursor[r] + dur, kname, ktype, aten))
                    cursor[r] += dur + gap
            last = max(cursor)
            transmit = int(_TRANSMIT_NS * f.link_factor * (1.0 + abs(rng.gauss(0.0, noise / 4))))
            end = last + transmit
            name = f"hcom_allReduce__{instance}_0_1"
            instance += 1
            for r in range(world_size):
                link = int(_TRANSMIT_NS * f.rank_link[r])
                segs[r][s].append(CollectiveSegment(cursor[r], end, name, group.raw_name, wait_ns=last - cursor[r],
                                                    link_transit_ns=link))
                cursor[r] = end + 30_000
        t = max(cursor) + 50_000
        windows.append((step_start, t))
        t += 2_000_000
    return segs, windows


def cluster_time_summary(timelines: Sequence[RankTimeline]) -> list[RankStepSummary]:
    """EMULATION of msprof-analyze ``ClusterTimeSummary`` rows (µs) from timelines, without running the tool.

    Definitions (msprof-analyze ``cluster_time_summary`` recipe): step time = the step window; communication =
    union of collective intervals; computation = busy time outside them; free = step - busy; transmit = per
    collective instance the shortest duration across ranks, summed; wait = own duration minus that shortest,
    summed. Used by tests and ``bench/bench_ranking.py`` to judge the ranking alone, fast.
    """
    inst: dict[tuple[int, str], dict[int, float]] = {}
    for tl in timelines:
        for st in tl.steps:
            for seg in st.segments:
                if isinstance(seg, CollectiveSegment):
                    inst.setdefault((st.step, seg.name), {})[tl.rank] = (seg.end_ns - seg.start_ns) / 1e3
    shortest = {k: min(v.values()) for k, v in inst.items()}
    rows: list[RankStepSummary] = []
    for tl in timelines:
        for st in tl.steps:
            comp = [(x.start_ns, x.end_ns) for x in st.segments if not isinstance(x, CollectiveSegment)]
            comm = [(x.start_ns, x.end_ns) for x in st.segments if isinstance(x, CollectiveSegment)]
            busy = _union_ns(comp + comm, st.start_ns, st.end_ns) / 1e3
            comm_us = _union_ns(comm, st.start_ns, st.end_ns) / 1e3
            wait = tx = 0.0
            for x in st.segments:
                if isinstance(x, CollectiveSegment):
                    low = shortest[(st.step, x.name)]
                    wait += (x.end_ns - x.start_ns) / 1e3 - low
                    tx += low
            step_us = (st.end_ns - st.start_ns) / 1e3
            rows.append(RankStepSummary(tl.rank, st.step, step_us, busy - comm_us, comm_us, wait, tx, step_us - busy))
    return rows


def _union_ns(intervals: list[tuple[int, int]], a: int, b: int) -> int:
    """Length of the union of ``intervals`` clipped to ``[a, b)``."""
    total, cur_s, cur_e = 0, 0, None
    for s0, e0 in sorted((max(a, s0), min(b, e0)) for s0, e0 in intervals if e0 > a and s0 < b):
        if cur_e is None or s0 > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s0, e0
        else:
            cur_e = max(cur_e, e0)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def generate_cluster(out_dir: Path, *, world_size: int = 4, slow_ranks: Mapping[int, float] | None = None,
                     steps: int = 3, first_step: int = 1, collectives_per_step: int = 4,
                     export_type: ExportType = "db", with_marker: bool = True, capture_id: str | None = None,
                     metadata: Mapping[str, Any] | None = None, hostnames: Mapping[int, str] | None = None,
                     seed: int = 0, noise: float = 0.02, level: str = "Level1",
                     host_bound_ranks: Mapping[int, float] | None = None,
                     slow_link_ranks: Mapping[int, float] | None = None, ts_base: int | None = None,
                     minimal: bool = False, slow_links: Mapping[tuple[int, int], float] | None = None,
                     first_step_delay_ranks: Mapping[int, float] | None = None,
                     throttled_ranks: Mapping[int, float] | None = None,
                     slow_ops: Mapping[str, float] | None = None,
                     rank_slow_ops: Mapping[int, Mapping[str, float]] | None = None) -> list[Path]:
    """Write one capture batch of ``world_size`` rank dirs under ``out_dir``; return them ordered by rank.

    ``slow_ranks`` {rank: factor}: compute x factor. ``host_bound_ranks`` {rank: fraction}: extra dispatch gaps
    (free time) of that fraction of the chunk. ``slow_link_ranks`` {rank: factor}: that rank's link time x factor.
    ``slow_links`` {(a, b): factor}: only the link between a and b is slower. ``first_step_delay_ranks``
    {rank: fraction of a chunk}: a one-off delay at the start of that rank's first step. ``throttled_ranks``
    {rank: MHz}: that rank's AI Core clock (its compute slower by nominal / MHz, ``AICORE_FREQ`` shows it).
    ``slow_ops`` {operator type: factor}: that operator slower on every rank; ``rank_slow_ops`` {rank: {operator
    type: factor}}: on that rank only.
    ``capture_id`` is stamped as ``profwatch_capture_id`` into ``profiler_metadata.json`` / META_DATA, next to
    ``metadata``. ``minimal`` (1 kernel per chunk, small DBs, no text) makes 1024 ranks take seconds.
    Timing model: :func:`build_timelines`. Raises ValueError on bad sizes, FileExistsError on name clashes.
    """
    meta = dict(metadata or {})
    if capture_id is not None:
        meta["profwatch_capture_id"] = capture_id
    timelines = build_timelines(world_size=world_size, slow_ranks=slow_ranks, steps=steps, first_step=first_step,
                                collectives_per_step=collectives_per_step, hostnames=hostnames, seed=seed,
                                noise=noise, level=level, host_bound_ranks=host_bound_ranks,
                                slow_link_ranks=slow_link_ranks, ts_base=ts_base,
                                kernels_per_chunk=1 if minimal else 6, slow_links=slow_links,
                                first_step_delay_ranks=first_step_delay_ranks, throttled_ranks=throttled_ranks,
                                slow_ops=slow_ops, rank_slow_ops=rank_slow_ops)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return [write_rank_dir(out, tl, export_type=export_type, with_marker=with_marker, metadata=meta, minimal=minimal)
            for tl in timelines]


# --- damage helpers (tests): each breaks one rank dir the way a field case does -------------------------------

def profiler_db_path(rank_dir: Path) -> Path:
    """The rank's ``ascend_pytorch_profiler_{rank}.db``. Raises FileNotFoundError if there is none."""
    found = sorted((Path(rank_dir) / "ASCEND_PROFILER_OUTPUT").glob("ascend_pytorch_profiler*.db"))
    if not found:
        raise FileNotFoundError(f"no profiler DB under {rank_dir}")
    return found[0]


def _db(rank_dir: Path, which: Literal["profiler", "analysis"]) -> Path:
    if which == "profiler":
        return profiler_db_path(rank_dir)
    return Path(rank_dir) / "ASCEND_PROFILER_OUTPUT" / "analysis.db"


def truncate_db(rank_dir: Path, *, which: Literal["profiler", "analysis"] = "profiler",
                keep_fraction: float = 0.5) -> Path:
    """Cut a DB to ``keep_fraction`` of its bytes (an interrupted copy): "database disk image is malformed"."""
    path = _db(rank_dir, which)
    size = path.stat().st_size
    with path.open("r+b") as fh:
        fh.truncate(max(int(size * keep_fraction), 512))
    return path


def drop_table(rank_dir: Path, table: str, *, which: Literal["profiler", "analysis"] = "profiler") -> Path:
    """Drop ``table`` (e.g. STEP_TIME: no step boundaries, FC-02) from one of the rank's DBs."""
    path = _db(rank_dir, which)
    con = sqlite3.connect(path)
    try:
        con.execute(f'DROP TABLE IF EXISTS "{table}"')
        con.commit()
    finally:
        con.close()
    return path


def drop_step_time(rank_dir: Path) -> Path:
    """Remove STEP_TIME (recipes then report a pseudo-step -1, section 4.4)."""
    return drop_table(rank_dir, "STEP_TIME")


def remove_memcpy_tasks(rank_dir: Path) -> Path:
    """Delete the MEMCPY_ASYNC tasks (cluster_time_summary crashes when no rank has any, section 5)."""
    path = profiler_db_path(rank_dir)
    con = sqlite3.connect(path)
    try:
        con.execute("DELETE FROM TASK WHERE taskType IN (SELECT id FROM STRING_IDS WHERE value='MEMCPY_ASYNC')")
        con.commit()
    finally:
        con.close()
    return path


def set_rank_device_map(rank_dir: Path, rank_id: int) -> Path:
    """Overwrite RANK_DEVICE_MAP.rankId (a DB whose inner rank disagrees with its file name, gotcha 7)."""
    path = profiler_db_path(rank_dir)
    con = sqlite3.connect(path)
    try:
        con.execute("UPDATE RANK_DEVICE_MAP SET rankId = ?", (rank_id,))
        con.commit()
    finally:
        con.close()
    return path


def remove_profiler_info(rank_dir: Path) -> list[Path]:
    """Delete ``profiler_info*.json`` (rank unknown in text discovery, FC-01). Returns the removed paths."""
    removed = sorted(Path(rank_dir).glob("profiler_info*.json"))
    for p in removed:
        p.unlink()
    return removed


def empty_device_data(rank_dir: Path, *, device_dir: bool = True) -> Path:
    """A rank that finished but recorded no device work (``docs/verdicts.md``: ranks that cannot be judged): empty TASK and COMPUTE_TASK_INFO in
    its profiler DB and, with ``device_dir``, an empty ``PROF_*/device_N`` beside it. Returns the DB path."""
    path = profiler_db_path(rank_dir)
    con = sqlite3.connect(path)
    try:
        con.execute("DELETE FROM TASK")
        con.execute("DELETE FROM COMPUTE_TASK_INFO")
        con.commit()
    finally:
        con.close()
    if device_dir:
        dev = Path(rank_dir) / "PROF_000001_20260101120000123_ABCDEFGHIJKLMNOP" / "device_0"
        dev.mkdir(parents=True, exist_ok=True)
    return path


def remove_marker(rank_dir: Path) -> None:
    """Delete ``analyse.done`` (parse not finished, or torch_npu before the 26.0.0 line)."""
    (Path(rank_dir) / "ASCEND_PROFILER_OUTPUT" / "analyse.done").unlink(missing_ok=True)


def remove_output(rank_dir: Path) -> None:
    """Delete ``ASCEND_PROFILER_OUTPUT/`` as a re-parse does first (gotcha 17)."""
    shutil.rmtree(Path(rank_dir) / "ASCEND_PROFILER_OUTPUT", ignore_errors=True)


def add_prof_leftovers(rank_dir: Path, *, devices: Sequence[int] = (0,)) -> list[Path]:
    """Create ``PROF_*/host/sqlite`` and ``PROF_*/device_N/sqlite`` (raw CANN data of a parse still running or
    of older torch_npu without the marker, section 12 step 5b). Returns the sqlite dirs created."""
    prof = Path(rank_dir) / "PROF_000001_20260101120000123_ABCDEFGHIJKLMNOP"
    dirs = [prof / "host" / "sqlite", *(prof / f"device_{d}" / "sqlite" for d in devices)]
    for d in dirs:
        d.mkdir(parents=True, exist_ok=True)
        (d / "raw.db").write_bytes(b"")
    for root, subdirs, _files in os.walk(prof):
        for sub in subdirs:
            Path(root, sub).chmod(DIR_MODE)
    prof.chmod(DIR_MODE)
    return dirs
