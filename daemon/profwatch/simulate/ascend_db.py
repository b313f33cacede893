"""SIMULATOR helpers: write the per-rank Ascend profiler outputs of one rank timeline (I/O, sqlite and files).

Nothing here is captured data. The tables, columns and units mirror what torch_npu + CANN write into
``ASCEND_PROFILER_OUTPUT/`` (Ascend/pytorch ``torch_npu/profiler`` DB export, read by Ascend/msprof-analyze): the profiler DB
``ascend_pytorch_profiler_{rank}.db`` (all times ns, unix epoch, strings as ids into STRING_IDS) and
``analysis.db`` (StepTraceTime in µs; CommAnalyzer* durations in ms, ``start_timestamp`` in µs), plus the text
export files msprof-analyze reads in text mode. Used only through
:func:`profwatch.simulate.ascend_tree.write_rank_dir`.

A deliberate pair with ``daemon/profwatch/simulate/ascend_tree.py`` (each imports the other): that module owns the
timeline types (:class:`~profwatch.simulate.ascend_tree.RankTimeline` and its segments) and the rank dir's layout,
this one the table contents written from them; the tree calls these writers for the files inside a rank dir. Split
only to keep the SQL apart from the layout: both are the simulator, nothing outside it imports this module.
"""

from __future__ import annotations

import csv
import json
import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from profwatch.simulate.ascend_tree import CollectiveSegment, ComputeSegment, RankTimeline, StepTimeline

FILE_MODE = 0o640
_NS_PER_US = 1000.0
_NS_PER_MS = 1_000_000.0
_MIB = 1024 * 1024
_TID = 17188459122595
_API_NODE, _API_RUNTIME, _API_OP = 10000, 5000, 50001
_INVALID = 4294967295

PROFILER_DDL = """
CREATE TABLE STRING_IDS (id INTEGER PRIMARY KEY, value TEXT);
CREATE TABLE META_DATA (name TEXT, value TEXT);
CREATE TABLE SESSION_TIME_INFO (startTimeNs INTEGER, endTimeNs INTEGER);
CREATE TABLE NPU_INFO (id INTEGER, name TEXT);
CREATE TABLE HOST_INFO (hostUid TEXT, hostName TEXT);
CREATE TABLE RANK_DEVICE_MAP (rankId INTEGER, deviceId INTEGER);
CREATE TABLE STEP_TIME (id INTEGER, startNs INTEGER, endNs INTEGER);
CREATE TABLE AICORE_FREQ (deviceId INTEGER, timestampNs INTEGER, freq INTEGER);
CREATE TABLE CANN_API (startNs INTEGER, endNs INTEGER, type INTEGER, globalTid INTEGER,
    connectionId INTEGER PRIMARY KEY, name INTEGER);
CREATE TABLE TASK (startNs INTEGER, endNs INTEGER, deviceId INTEGER, connectionId INTEGER, globalTaskId INTEGER,
    globalPid INTEGER, taskType INTEGER, contextId INTEGER, streamId INTEGER, taskId INTEGER, modelId INTEGER);
CREATE TABLE COMPUTE_TASK_INFO (name INTEGER, globalTaskId INTEGER PRIMARY KEY, blockNum INTEGER,
    mixBlockNum INTEGER, taskType INTEGER, opType INTEGER, inputFormats INTEGER, inputDataTypes INTEGER,
    inputShapes INTEGER, outputFormats INTEGER, outputDataTypes INTEGER, outputShapes INTEGER, attrInfo INTEGER,
    opState INTEGER, hf32Eligible INTEGER);
"""
COMM_DDL = """
CREATE TABLE COMMUNICATION_OP (opName INTEGER, startNs INTEGER, endNs INTEGER, connectionId INTEGER,
    groupName INTEGER, opId INTEGER PRIMARY KEY, relay INTEGER, retry INTEGER, dataType INTEGER, algType INTEGER,
    count NUMERIC, opType INTEGER, deviceId INTEGER);
"""
FULL_DDL = """
CREATE TABLE PYTORCH_API (startNs TEXT, endNs TEXT, globalTid INTEGER, connectionId INTEGER, name INTEGER,
    sequenceNumber INTEGER, fwdThreadId INTEGER, inputDtypes INTEGER, inputShapes INTEGER, callchainId INTEGER,
    type INTEGER);
CREATE TABLE CONNECTION_IDS (id INTEGER, connectionId INTEGER);
CREATE TABLE ENUM_API_TYPE (id INTEGER PRIMARY KEY, name TEXT);
CREATE TABLE ENUM_HCCL_DATA_TYPE (id INTEGER PRIMARY KEY, name TEXT);
CREATE TABLE ENUM_HCCL_LINK_TYPE (id INTEGER PRIMARY KEY, name TEXT);
CREATE TABLE ENUM_HCCL_TRANSPORT_TYPE (id INTEGER PRIMARY KEY, name TEXT);
"""
FULL_COMM_DDL = """
CREATE TABLE COMMUNICATION_TASK_INFO (name INTEGER, globalTaskId INTEGER, taskType INTEGER, planeId INTEGER,
    groupName INTEGER, notifyId INTEGER, rdmaType INTEGER, srcRank INTEGER, dstRank INTEGER,
    transportType INTEGER, size INTEGER, dataType INTEGER, linkType INTEGER, opId INTEGER, isMaster INTEGER,
    bandwidth NUMERIC);
"""
ANALYSIS_DDL = """
CREATE TABLE StepTraceTime (deviceId INTEGER, step TEXT, computing NUMERIC, communication_not_overlapped NUMERIC,
    overlapped NUMERIC, communication NUMERIC, free NUMERIC, stage NUMERIC, bubble NUMERIC,
    communication_not_overlapped_and_exclude_receive NUMERIC, preparing NUMERIC);
"""
ANALYSIS_COMM_DDL = """
CREATE TABLE CommAnalyzerTime (hccl_op_name TEXT, group_name TEXT, start_timestamp NUMERIC, elapse_time NUMERIC,
    transit_time NUMERIC, wait_time NUMERIC, synchronization_time NUMERIC, idle_time NUMERIC, step TEXT, type TEXT);
CREATE TABLE CommAnalyzerBandwidth (hccl_op_name TEXT, group_name TEXT, transport_type TEXT, transit_size NUMERIC,
    transit_time NUMERIC, bandwidth NUMERIC, large_packet_ratio NUMERIC, package_size NUMERIC, count NUMERIC,
    total_duration NUMERIC, step TEXT, type TEXT);
CREATE TABLE CommAnalyzerMatrix (hccl_op_name TEXT, group_name TEXT, src_rank TEXT, dst_rank TEXT,
    transport_type TEXT, transit_size NUMERIC, transit_time NUMERIC, bandwidth NUMERIC, step TEXT, type TEXT,
    op_name TEXT);
"""
_ENUMS = {
    "ENUM_API_TYPE": [(5000, "runtime"), (5500, "communication"), (10000, "node"), (15000, "model"),
                      (20000, "acl"), (50001, "op"), (50002, "queue"), (50003, "trace"), (50004, "mstx")],
    "ENUM_HCCL_DATA_TYPE": [(0, "INT8"), (1, "INT16"), (2, "INT32"), (3, "FP16"), (4, "FP32"), (5, "INT64"),
                            (11, "BFP16"), (65534, "N/A"), (65535, "INVALID_TYPE")],
    "ENUM_HCCL_LINK_TYPE": [(0, "ON_CHIP"), (1, "HCCS"), (2, "PCIE"), (3, "ROCE"), (4, "SIO"), (65534, "N/A"),
                            (65535, "INVALID_TYPE")],
    "ENUM_HCCL_TRANSPORT_TYPE": [(0, "SDMA"), (1, "RDMA"), (2, "LOCAL"), (65534, "N/A"), (65535, "INVALID_TYPE")],
}


def double_hash(text: str) -> int:
    """CANN / msprof-analyze group-name hash: two 32-bit polynomial hashes (x29, x131) packed into 64 bits.

    Mirrors ``msprof_analyze.cluster_analyse.common_func.utils.double_hash`` (Ascend/msprof-analyze).
    """
    h0 = h1 = 0
    for ch in text:
        h0 = (h0 * 29 + ord(ch)) & 0xFFFFFFFF
        h1 = (h1 * 131 + ord(ch)) & 0xFFFFFFFF
    return (h0 << 32) | h1


class _Strings:
    """STRING_IDS interning table (id from 1)."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def __call__(self, value: str) -> int:
        found = self.ids.get(value)
        if found is None:
            found = self.ids[value] = len(self.ids) + 1
        return found


def _connect(path: Path) -> sqlite3.Connection:
    con = sqlite3.connect(path)
    con.execute("PRAGMA journal_mode=OFF")
    con.execute("PRAGMA synchronous=OFF")
    return con


def _segments(step: StepTimeline) -> tuple[list[ComputeSegment], list[CollectiveSegment]]:
    compute = [s for s in step.segments if s.kind == "compute"]
    colls = [s for s in step.segments if s.kind == "collective"]
    return compute, colls  # type: ignore[return-value]


def step_trace_row(step: StepTimeline) -> dict[str, float]:
    """StepTraceTime values of one step in µs (computing, communication, free, ...), as CANN's step trace."""
    compute, colls = _segments(step)
    computing = sum(c.end_ns - c.start_ns for c in compute) / _NS_PER_US
    communication = sum(c.end_ns - c.start_ns for c in colls) / _NS_PER_US
    stage = (step.end_ns - step.start_ns) / _NS_PER_US
    first = min((c.start_ns for c in compute), default=step.start_ns)
    return {
        "computing": round(computing, 3), "communication_not_overlapped": round(communication, 3),
        "overlapped": 0.0, "communication": round(communication, 3),
        "free": round(max(stage - computing - communication, 0.0), 3), "stage": round(stage, 3), "bubble": 0.0,
        "exclude_receive": round(communication, 3), "preparing": round((first - step.start_ns) / _NS_PER_US, 3),
    }


def write_profiler_db(path: Path, tl: RankTimeline, *, metadata: dict[str, Any], minimal: bool) -> None:
    """Write ``ascend_pytorch_profiler_{rank}.db`` for ``tl``.

    Per compute segment: one CANN_API launch (40 µs before the kernel), one TASK and one COMPUTE_TASK_INFO row.
    Per step: one MEMCPY_ASYNC TASK overlapping the first kernel (cluster_time_summary needs one somewhere,
    section 5). Per collective (Level1+ only): a CANN_API ``HcclAllreduce`` launch and a COMMUNICATION_OP row,
    plus Notify_Wait/Memcpy tasks when not ``minimal``. ``AICORE_FREQ``: the rank's clock (``tl.aicore_mhz``) sampled at
    the profiler's start and at each step's start. ``minimal`` also omits PYTORCH_API and the enum tables.
    """
    s = _Strings()
    with_comm = tl.level != "Level0"
    device = tl.device_id if tl.device_id is not None else tl.rank % 8
    api: list[tuple[Any, ...]] = []
    task: list[tuple[Any, ...]] = []
    cti: list[tuple[Any, ...]] = []
    comm: list[tuple[Any, ...]] = []
    ctask: list[tuple[Any, ...]] = []
    torch_api: list[tuple[Any, ...]] = []
    conn_ids: list[tuple[int, int]] = []
    steps: list[tuple[int, int, int]] = []
    memcpy_type, ai_core = s("MEMCPY_ASYNC"), s("AI_CORE")
    shape_ids = [s(v) for v in ("ND;ND", "FLOAT16;FLOAT16", "4096,4096;4096,4096", "ND", "FLOAT16", "4096,4096",
                                "", "dynamic", "NO")]
    conn = 0
    for st in tl.steps:
        steps.append((st.step, st.start_ns, st.end_ns))
        if not minimal:
            name = s(f"ProfilerStep#{st.step}")
            torch_api.append((str(st.start_ns), str(st.end_ns), _TID, None, name, -1, 0, 0, 0, 0, _API_OP))
        compute, colls = _segments(st)
        for seg in compute:
            conn += 1
            kname = s(seg.name)
            api.append((seg.start_ns - 40_000, seg.start_ns - 32_000, _API_NODE, _TID, conn, kname))
            task.append((seg.start_ns, seg.end_ns, device, conn, conn, tl.pid, ai_core, _INVALID, 2, conn, _INVALID))
            cti.append((kname, conn, 24, 0, ai_core, s(seg.op_type), *shape_ids))
            if not minimal:
                torch_api.append((str(seg.start_ns - 60_000), str(seg.start_ns - 30_000), _TID, conn,
                                  s(seg.aten_name), -1, 0, 0, 0, 0, _API_OP))
                conn_ids.append((conn, conn))
        if tl.memcpy and compute:
            conn += 1
            start = compute[0].start_ns + 5_000
            api.append((start - 20_000, start - 15_000, _API_RUNTIME, _TID, conn, s("aclrtMemcpyAsync")))
            task.append((start, start + 120_000, device, conn, conn, tl.pid, memcpy_type, _INVALID, 3, conn,
                         _INVALID))
        if not with_comm:
            continue
        for cseg in colls:
            conn += 1
            api.append((cseg.start_ns - 20_000, cseg.start_ns - 12_000, _API_NODE, _TID, conn, s("HcclAllreduce")))
            comm.append((s(cseg.name), cseg.start_ns, cseg.end_ns, conn, s(cseg.group), len(comm) + 1, 0, 0, 3,
                         s("MESH-RING"), cseg.size_bytes // 2, s(cseg.op_type), device))
            if minimal:
                continue
            wait_end = cseg.start_ns + max(cseg.wait_ns, 1_000)
            for ttype, t0, t1, size in (("Notify_Wait", cseg.start_ns, wait_end, 0),
                                        ("Memcpy", wait_end, cseg.end_ns, cseg.size_bytes)):
                gid = 1_000_000 + len(ctask)
                tid = s(ttype)
                task.append((t0, t1, device, conn, gid, tl.pid, tid, _INVALID, 10, gid, _INVALID))
                ctask.append((tid, gid, tid, 0, s(cseg.group), 0, 65534, tl.rank, (tl.rank + 1) % tl.world_size,
                              0, size, 3, 1, len(comm), 1, 0))
    meta = {"SCHEMA_VERSION": "1.0.5", "SCHEMA_VERSION_MAJOR": "1", "SCHEMA_VERSION_MINOR": "0",
            "SCHEMA_VERSION_MICRO": "5", "ENV_VARIABLES": json.dumps({"ASCEND_GLOBAL_LOG_LEVEL": ""})}
    meta.update({k: v if isinstance(v, str) else json.dumps(v) for k, v in metadata.items()})
    last = max((st.end_ns for st in tl.steps), default=tl.start_ns)
    con = _connect(path)
    try:
        con.executescript(PROFILER_DDL + (COMM_DDL if with_comm else "")
                          + ("" if minimal else FULL_DDL + (FULL_COMM_DDL if with_comm else "")))
        con.executemany("INSERT INTO META_DATA VALUES (?,?)", meta.items())
        con.execute("INSERT INTO SESSION_TIME_INFO VALUES (?,?)", (tl.start_ns, last + 1_000_000))
        con.execute("INSERT INTO NPU_INFO VALUES (?,?)", (device, "Ascend910B1"))
        con.execute("INSERT INTO HOST_INFO VALUES (?,?)", (str(double_hash(tl.hostname) % 10**18), tl.hostname))
        con.execute("INSERT INTO RANK_DEVICE_MAP VALUES (?,?)", (tl.rank, device))
        con.executemany("INSERT INTO STEP_TIME VALUES (?,?,?)", steps)
        # the AI Core clock: one sample at the profiler's start and one at each step's start (holds until the next)
        con.executemany("INSERT INTO AICORE_FREQ VALUES (?,?,?)",
                        [(device, t, round(tl.aicore_mhz)) for t in (tl.start_ns, *(st.start_ns for st in tl.steps))])
        con.executemany("INSERT INTO CANN_API VALUES (?,?,?,?,?,?)", api)
        con.executemany("INSERT INTO TASK VALUES (?,?,?,?,?,?,?,?,?,?,?)", task)
        con.executemany("INSERT INTO COMPUTE_TASK_INFO VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", cti)
        if with_comm:
            con.executemany("INSERT INTO COMMUNICATION_OP VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)", comm)
        if not minimal:
            con.executemany("INSERT INTO PYTORCH_API VALUES (?,?,?,?,?,?,?,?,?,?,?)", torch_api)
            con.executemany("INSERT INTO CONNECTION_IDS VALUES (?,?)", conn_ids)
            for table, rows in _ENUMS.items():
                con.executemany(f"INSERT INTO {table} VALUES (?,?)", rows)
            if with_comm:
                con.executemany("INSERT INTO COMMUNICATION_TASK_INFO VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", ctask)
        con.executemany("INSERT INTO STRING_IDS VALUES (?,?)", ((i, v) for v, i in s.ids.items()))
        con.commit()
    finally:
        con.close()
    path.chmod(FILE_MODE)


def _transport(tl: RankTimeline, ranks: Sequence[int]) -> str:
    """HCCS inside one 8-device node, RDMA across nodes (group-local guess; enough for the simulator)."""
    return "HCCS" if len({r // 8 for r in ranks}) <= 1 else "RDMA"


def _comm_rows(tl: RankTimeline) -> Iterable[tuple[StepTimeline, CollectiveSegment, float, float]]:
    """Yield (step, collective, transit_ms, link_transit_ms) for every collective of ``tl``."""
    for st in tl.steps:
        for seg in _segments(st)[1]:
            transit = (seg.end_ns - seg.start_ns - seg.wait_ns) / _NS_PER_MS
            link = seg.link_transit_ns / _NS_PER_MS if seg.link_transit_ns is not None else transit
            yield st, seg, transit, link


def _bandwidth_gb_s(size_mb: float, time_ms: float) -> float:
    return size_mb / 1024.0 / (time_ms / 1000.0) if time_ms > 0 else 0.0


def write_analysis_db(path: Path, tl: RankTimeline, *, minimal: bool) -> None:
    """Write ``analysis.db``: CommAnalyzer{Time,Bandwidth,Matrix} (Level1+) and, last, StepTraceTime.

    ``group_name`` is ``double_hash(raw group)`` in decimal; durations ms; start_timestamp µs (section 4.3).
    CommAnalyzerMatrix holds, per step and op type, a ``-top1`` row per peer for the step's last collective and a
    ``-total`` row per peer summing all its collectives (msprof-analyze's ``communication_matrix_sum`` adds the
    ``-total`` rows into ``Total Op Info``). Peers: every member in groups of up to 8, else the two ring
    neighbours plus any ``slow_links`` peer. A link's time is 1 ms x this rank's ``own_link_factor`` x the
    pair's factor.
    ``minimal`` skips Bandwidth and Matrix (cluster_time_summary and slow_rank never read them, section 4.4).
    """
    device = tl.device_id if tl.device_id is not None else tl.rank % 8
    members = {g.raw_name: g.global_ranks for g in tl.groups}
    times, bws, matrix = [], [], []
    totals: dict[tuple[str, str, str, int, int, str], list[float]] = {}
    slowest = max([tl.own_link_factor, *tl.peer_link_factors.values(), 1.0])
    for st, seg, transit, link in _comm_rows(tl):
        step, gname = f"step{st.step}", str(double_hash(seg.group))
        elapse = (seg.end_ns - seg.start_ns) / _NS_PER_MS
        wait = seg.wait_ns / _NS_PER_MS
        times.append((seg.name, gname, seg.start_ns / _NS_PER_US, elapse, transit, wait, wait * 0.9,
                      max(elapse - transit - wait, 0.0), step, "collective"))
        ranks = members.get(seg.group, tuple(range(tl.world_size)))
        size_mb = seg.size_bytes / _MIB
        bw = _bandwidth_gb_s(size_mb, link)
        transport = _transport(tl, ranks)
        bws.append((seg.name, gname, transport, size_mb, link, bw, 1, 4, 16, link, step, "collective"))
        bws.append((seg.name, gname, "SDMA", size_mb, link, bw, 0, 0, 0, 0, step, "collective"))
        if tl.rank not in ranks:
            continue
        local = ranks.index(tl.rank)
        n = len(ranks)
        near = set(range(n)) if n <= 8 else {(local - 1) % n, (local + 1) % n}
        near |= {ranks.index(p) for p in tl.peer_link_factors if p in ranks}
        part = size_mb / max(n - 1, 1)
        unit = link / slowest  # the link time of a normal link
        last = seg is _segments(st)[1][-1]
        for peer in sorted(near - {local}):
            t = unit * tl.own_link_factor * tl.peer_link_factors.get(ranks[peer], 1.0)
            if last:
                matrix.append((f"{seg.op_type}-top1", gname, str(local), str(peer), transport, part, t,
                               _bandwidth_gb_s(part, t), step, "collective", seg.name))
            acc = totals.setdefault((gname, step, seg.op_type, local, peer, transport), [0.0, 0.0])
            acc[0] += part
            acc[1] += t
    for (gname, step, op_type, local, peer, transport), (size, t) in totals.items():
        matrix.append((f"{op_type}-total", gname, str(local), str(peer), transport, size, t,
                       _bandwidth_gb_s(size, t), step, "collective", ""))
    con = _connect(path)
    try:
        con.executescript(ANALYSIS_DDL + (ANALYSIS_COMM_DDL if tl.level != "Level0" else ""))
        if tl.level != "Level0":
            con.executemany("INSERT INTO CommAnalyzerTime VALUES (?,?,?,?,?,?,?,?,?,?)", times)
            if not minimal:
                con.executemany("INSERT INTO CommAnalyzerBandwidth VALUES (?,?,?,?,?,?,?,?,?,?,?,?)", bws)
                con.executemany("INSERT INTO CommAnalyzerMatrix VALUES (?,?,?,?,?,?,?,?,?,?,?)", matrix)
        rows = []
        for st in tl.steps:
            r = step_trace_row(st)
            rows.append((device, str(st.step), r["computing"], r["communication_not_overlapped"], r["overlapped"],
                         r["communication"], r["free"], r["stage"], r["bubble"], r["exclude_receive"],
                         r["preparing"]))
        con.executemany("INSERT INTO StepTraceTime VALUES (?,?,?,?,?,?,?,?,?,?,?)", rows)
        con.commit()
    finally:
        con.close()
    path.chmod(FILE_MODE)


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj), encoding="utf-8")
    path.chmod(FILE_MODE)


def write_text_outputs(out: Path, tl: RankTimeline) -> list[Path]:
    """Write the text export (section 4.2): step_trace_time.csv, communication(_matrix).json, kernel_details.csv,
    trace_view.json. Returns the paths written. Level0 writes no communication files."""
    device = tl.device_id if tl.device_id is not None else tl.rank % 8
    written: list[Path] = []
    stt = out / "step_trace_time.csv"
    with stt.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["Device_id", "Step", "Computing", "Communication(Not Overlapped)", "Overlapped",
                    "Communication", "Free", "Stage", "Bubble",
                    "Communication(Not Overlapped and Exclude Receive)", "Preparing"])
        for st in tl.steps:
            r = step_trace_row(st)
            w.writerow([device, st.step, r["computing"], r["communication_not_overlapped"], r["overlapped"],
                        r["communication"], r["free"], r["stage"], r["bubble"], r["exclude_receive"],
                        r["preparing"]])
    written.append(stt)
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": p, "tid": 0, "args": {"name": n}}
        for p, n in ((1, "Ascend Hardware"), (2, "HCCL"), (3, "Python"))]
    kernels = out / "kernel_details.csv"
    with kernels.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["Step Id", "Device_id", "Name", "Type", "Accelerator Core", "Start Time(us)", "Duration(us)",
                    "Wait Time(us)", "Block Dim", "Mix Block Dim", "Input Shapes", "Input Data Types",
                    "Input Formats", "Output Shapes", "Output Data Types", "Output Formats"])
        for st in tl.steps:
            events.append({"ph": "X", "name": f"ProfilerStep#{st.step}", "pid": 3, "tid": 1, "cat": "cpu_op",
                           "ts": f"{st.start_ns / _NS_PER_US:.3f}", "dur": (st.end_ns - st.start_ns) / _NS_PER_US,
                           "args": {}})
            prev = None
            for seg in _segments(st)[0]:
                dur = (seg.end_ns - seg.start_ns) / _NS_PER_US
                wait = 0 if prev is None else (seg.start_ns - prev) / _NS_PER_US
                prev = seg.end_ns
                w.writerow([st.step, device, seg.name, seg.op_type, "AI_CORE", f"{seg.start_ns / _NS_PER_US:.3f}\t",
                            dur, wait, 24, 0, "4096,4096;4096,4096", "DT_FLOAT16;DT_FLOAT16", "ND;ND",
                            "4096,4096", "DT_FLOAT16", "ND"])
                events.append({"ph": "X", "name": seg.name, "pid": 1, "tid": 2, "args": {"Task Type": "AI_CORE"},
                               "ts": f"{seg.start_ns / _NS_PER_US:.3f}", "dur": dur})
    written.append(kernels)
    if tl.level != "Level0":
        comm: dict[str, Any] = {}
        matrix: dict[str, Any] = {}
        for st, cseg, transit, link in _comm_rows(tl):
            key = f"{cseg.name}@{double_hash(cseg.group)}"
            elapse = (cseg.end_ns - cseg.start_ns) / _NS_PER_MS
            wait = cseg.wait_ns / _NS_PER_MS
            size_mb = cseg.size_bytes / _MIB
            bw = round(_bandwidth_gb_s(size_mb, link), 4)
            empty = {"Transit Size(MB)": 0, "Transit Time(ms)": 0, "Bandwidth(GB/s)": 0, "Large Packet Ratio": 0,
                     "Size Distribution": {}}
            link_info = {"Transit Size(MB)": size_mb, "Transit Time(ms)": link, "Bandwidth(GB/s)": bw,
                         "Large Packet Ratio": 1.0, "Size Distribution": {"4.0": [16, link]}}
            comm.setdefault(f"step{st.step}", {"collective": {}})["collective"][key] = {
                "Communication Time Info": {
                    "Start Timestamp(us)": cseg.start_ns / _NS_PER_US, "Elapse Time(ms)": elapse,
                    "Transit Time(ms)": transit, "Wait Time(ms)": wait, "Synchronization Time(ms)": wait * 0.9,
                    "Idle Time(ms)": max(elapse - transit - wait, 0.0),
                    "Wait Time Ratio": round(wait / (wait + transit), 4) if wait + transit else 0,
                    "Synchronization Time Ratio": round(0.9 * wait / (wait + transit), 4) if wait + transit else 0},
                "Communication Bandwidth Info": {"RDMA": empty, "PCIE": empty, "HCCS": link_info,
                                                 "SDMA": dict(link_info, **{"Large Packet Ratio": 0,
                                                                            "Size Distribution": {}})}}
            n = tl.world_size
            peers = {f"{tl.rank}-{p}": {"Transport Type": "HCCS", "Transit Time(ms)": link,
                                        "Transit Size(MB)": size_mb / max(n - 1, 1),
                                        "Bandwidth(GB/s)": round(_bandwidth_gb_s(size_mb / max(n - 1, 1), link), 4),
                                        "Op Name": cseg.name}
                     for p in ((tl.rank + 1) % n, (tl.rank - 1) % n) if p != tl.rank}
            matrix[f"step{st.step}"] = {"collective": {f"{cseg.op_type}-top1@{double_hash(cseg.group)}": peers}}
            events.append({"ph": "X", "name": cseg.name, "pid": 2, "tid": 1, "args": {},
                           "ts": f"{cseg.start_ns / _NS_PER_US:.3f}", "dur": elapse * 1000.0})
        _write_json(out / "communication.json", comm)
        _write_json(out / "communication_matrix.json", matrix)
        written += [out / "communication.json", out / "communication_matrix.json"]
    _write_json(out / "trace_view.json", events)
    written.append(out / "trace_view.json")
    for p in written:
        p.chmod(FILE_MODE)
    return written
