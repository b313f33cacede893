"""Kineto breakdown (profwatch.core.verdict.kineto, pure) and the streaming reader (profwatch.adapters.tools.kineto_reader) on small
handmade traces."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from profwatch.adapters.tools.kineto_reader import (
    TraceFormatError,
    analyze_torch_batch,
    find_trace_files,
    read_rank_trace,
    write_torch_trace,
)
from profwatch.core.verdict.kineto import (
    COLL_BACKEND,
    COLL_C10D,
    COLL_DEVICE,
    RankTrace,
    _measure,
    _merge,
    collective_class,
    parse_step,
    summarize_traces,
)


def X(name: str, ts: float, dur: float, cat: str = "cpu_op", tid: int = 1) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 100, "tid": tid, "ts": ts, "dur": dur}


def cpu_rank(compute_us: float, *, steps: int = 2, step_len: float = 100.0, gap: float = 5.0) -> list[dict]:
    """Host-only trace in the gloo shape: compute on the main thread, c10d enqueue, gloo:all_reduce on the runloop
    thread lasting until the common end of the collective (everyone leaves at ``step_start + 80``)."""
    ev = []
    for s in range(steps):
        t0 = 1000.0 + s * step_len
        ev.append(X(f"ProfilerStep#{s + 1}", t0, step_len - 1, "user_annotation"))
        ev.append(X("aten::mm", t0 + gap, compute_us))
        start = t0 + gap + compute_us
        ev.append(X("c10d::allreduce_", start, 1.0))
        ev.append(X("gloo:all_reduce", start, t0 + 80 - start, "user_annotation", tid=2))
    return ev


def _trace(rank: int, events: list[dict]) -> RankTrace:
    tr = RankTrace(rank)
    for e in events:
        tr.add_event(e["name"], e["cat"], e["ts"], e["dur"])
    return tr


def test_classification():
    assert collective_class("gloo:all_reduce", "user_annotation") == COLL_BACKEND
    assert collective_class("c10d::allreduce_", "cpu_op") == COLL_C10D
    assert collective_class("ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)", "kernel") == COLL_DEVICE
    assert collective_class("record_param_comms", "cpu_op") is not None
    assert collective_class("aten::broadcast_tensors", "cpu_op") is None
    assert collective_class("aten::mm", "cpu_op") is None
    assert parse_step("ProfilerStep#12") == 12 and parse_step("ProfilerStep#x") is None


def test_interval_union_measure():
    merged = _merge([0, 5, 20, 22], [10, 12, 25, 30])  # -> [0,12], [20,30]
    assert _measure(merged, 0, 100) == 22
    assert _measure(merged, 6, 21) == 7  # 6..12 + 20..21
    assert _measure(merged, 13, 19) == 0
    assert _measure(_merge([], []), 0, 10) == 0


def test_cpu_breakdown_slow_rank_has_no_wait():
    traces = {0: _trace(0, cpu_rank(40)), 1: _trace(1, cpu_rank(60))}
    brk = summarize_traces(traces)
    assert brk.collective_class == "backend" and brk.instances_matched == 2
    rows = {(s.rank, s.step): s for s in brk.summaries}
    fast, slow = rows[(0, 1)], rows[(1, 1)]
    assert fast.step_time_us == pytest.approx(99) and fast.computation_us == pytest.approx(40)
    # comm = gloo 45..80 (35us), compute 40us, free = 99 - 75 (busy union) = 24
    assert fast.communication_us == pytest.approx(35) and fast.free_us == pytest.approx(24)
    assert slow.communication_us == pytest.approx(15)
    assert slow.wait_us == pytest.approx(0) and fast.wait_us == pytest.approx(20)
    assert fast.transmit_us == pytest.approx(15) == slow.transmit_us


def test_instances_matched_by_name_and_order_within_step():
    def rank(durs: list[float]) -> list[dict]:
        ev = [X("ProfilerStep#1", 0, 1000, "user_annotation")]
        t = 10.0
        for d in durs:
            ev.append(X("gloo:all_reduce", t, d, "user_annotation", tid=2))
            t += d + 10
        ev.append(X("gloo:barrier", t, 5, "user_annotation", tid=2))
        return ev

    brk = summarize_traces({0: _trace(0, rank([10, 50])), 1: _trace(1, rank([30, 20])), 2: _trace(2, rank([10, 20]))})
    rows = {s.rank: s for s in brk.summaries}
    assert brk.instances_matched == 3
    assert rows[0].wait_us == pytest.approx(30) and rows[1].wait_us == pytest.approx(20) and rows[2].wait_us == 0
    assert rows[0].transmit_us == pytest.approx(35)


def test_device_mode_uses_kernels_and_gpu_step_spans():
    def rank(compute: float) -> list[dict]:
        return [
            X("ProfilerStep#3", 0, 50, "user_annotation"),            # host span (short: async launch)
            X("ProfilerStep#3", 10, 200, "gpu_user_annotation"),      # device span
            X("cudaLaunchKernel", 1, 2, "cuda_runtime"),
            X("sm80_xmma_gemm", 20, compute, "kernel", tid=7),
            X("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 20 + compute, 170 - compute, "kernel", tid=8),
        ]

    brk = summarize_traces({0: _trace(0, rank(60)), 1: _trace(1, rank(100))})
    rows = {s.rank: s for s in brk.summaries}
    assert brk.collective_class == "device"
    assert rows[0].step_time_us == 200 and rows[0].computation_us == 60 and rows[0].communication_us == 110
    assert rows[0].free_us == pytest.approx(30) and rows[0].wait_us == pytest.approx(40) and rows[1].wait_us == 0


def test_memory_is_the_copy_time_no_compute_kernel_overlaps_and_mtia_is_device_work():
    events = [
        X("ProfilerStep#1", 0, 100, "gpu_user_annotation"),
        X("sm80_xmma_gemm", 10, 30, "kernel", tid=7),
        X("Memcpy HtoD (Pinned -> Device)", 30, 20, "gpu_memcpy", tid=9),   # 10 us under the gemm, 10 alone
        X("Memset (Device)", 60, 5, "gpu_memset", tid=9),
    ]
    (row,) = summarize_traces({0: _trace(0, events)}).summaries
    assert row.computation_us == pytest.approx(45) and row.memory_us == pytest.approx(15)
    assert row.free_us == pytest.approx(55)
    mtia = [X("ProfilerStep#1", 0, 100, "user_annotation"), X("fc-dtype_Float", 10, 40, "mtia_ccp_events", tid=4),
            X("runFunction", 5, 50, "mtia_runtime")]
    (row,) = summarize_traces({0: _trace(0, mtia)}).summaries
    assert row.computation_us == pytest.approx(40) and row.free_us == pytest.approx(60) and row.memory_us == 0


def test_missing_steps_and_no_common_class_are_noted():
    a = _trace(0, [X("aten::mm", 0, 5)])
    b = _trace(1, cpu_rank(10))
    c = _trace(2, [X("ProfilerStep#1", 1000, 99, "user_annotation"), X("aten::mm", 1005, 10)])
    brk = summarize_traces({0: a, 1: b, 2: c})
    assert any("no ProfilerStep" in n for n in brk.notes)
    assert any("no collective class common" in n for n in brk.notes)
    assert {s.rank for s in brk.summaries} == {1, 2}


# --- reader (file I/O on tmp_path) ----------------------------------------------------------------------------


def _rank_dir(root: Path, rank: int, events: list[dict], *, gz: bool = False) -> Path:
    d = root / f"node0_{4000 + rank}_20260101120000{rank:03d}_torch_pt"
    d.mkdir(parents=True)
    (d / f"profiler_info_{rank}.json").write_text(json.dumps({"rank_id": rank, "world_size": 2}))
    path = d / f"node0_{4000 + rank}.1767268800000.pt.trace.json"
    write_torch_trace(path, rank, 2, events)
    if gz:
        with gzip.open(str(path) + ".gz", "wb") as fh:
            fh.write(path.read_bytes())
        path.unlink()
    (d / "trace.done").write_text("")
    return d


def test_reader_streams_plain_and_gz_and_reads_header_rank(tmp_path: Path):
    d0 = _rank_dir(tmp_path, 0, cpu_rank(40))
    d1 = _rank_dir(tmp_path, 1, cpu_rank(60), gz=True)
    tr = read_rank_trace(find_trace_files(d1)[0])
    assert tr.rank == 1 and tr.steps and len(tr.collectives) == 4
    ev = analyze_torch_batch({0: d0, 1: d1})
    assert ev.kind == "torch_pt" and ev.recipes["kineto_breakdown"].status == "ok"
    assert len(ev.summaries) == 4 and ev.rank_paths == {0: str(d0), 1: str(d1)}


def test_reader_truncated_and_missing(tmp_path: Path):
    d0 = _rank_dir(tmp_path, 0, cpu_rank(40))
    d1 = _rank_dir(tmp_path, 1, cpu_rank(60))
    trace = find_trace_files(d1)[0]
    trace.write_bytes(trace.read_bytes()[:300])
    with pytest.raises(TraceFormatError):
        read_rank_trace(trace)
    ev = analyze_torch_batch({0: d0, 1: d1})
    assert ev.recipes["kineto_breakdown"].status == "tool_error" and ev.summaries == []
    empty = tmp_path / "empty_torch_pt"
    empty.mkdir()
    ev = analyze_torch_batch({0: d0, 1: empty})
    assert ev.recipes["kineto_breakdown"].status == "no_data"
    (tmp_path / "x.pt.trace.json").write_text('{"traceEvents": []}')
    with pytest.raises(TraceFormatError):
        read_rank_trace(tmp_path / "x.pt.trace.json")


def test_a_trace_gone_between_listing_and_reading_is_not_a_crash(tmp_path: Path):
    # a dangling link in a rank dir (a staged link whose file was deleted, or a trace removed while the batch is
    # read): analyze_torch_batch raised FileNotFoundError from picking the newest trace, losing the whole verdict
    d0 = _rank_dir(tmp_path, 0, cpu_rank(40))
    d1 = _rank_dir(tmp_path, 1, cpu_rank(60))
    (d1 / "zz.pt.trace.json").symlink_to(tmp_path / "deleted.pt.trace.json")
    ev = analyze_torch_batch({0: d0, 1: d1})
    assert ev.recipes["kineto_breakdown"].status == "ok" and ev.unusable_ranks == {}
    only = tmp_path / "only_dangling_torch_pt"
    only.mkdir()
    (only / "a.pt.trace.json").symlink_to(tmp_path / "deleted.pt.trace.json")
    ev = analyze_torch_batch({0: d0, 1: d1, 2: only})
    assert ev.unusable_ranks == {2: f"no *.pt.trace.json in {only}"}


def test_a_batch_knows_whether_its_job_has_accelerators(tmp_path: Path):
    """Host-only traces (a gloo job on CPUs) make ``ev.accelerator`` False, so impacts are in CPU rank-hours; one
    trace with device kernels keeps accelerator-hours."""
    cpu = analyze_torch_batch({0: _rank_dir(tmp_path / "c", 0, cpu_rank(40)),
                               1: _rank_dir(tmp_path / "c", 1, cpu_rank(60))})
    assert cpu.summaries and cpu.accelerator is False
    dev = [X("ProfilerStep#3", 0, 50, "user_annotation"), X("ProfilerStep#3", 10, 200, "gpu_user_annotation"),
           X("sm80_xmma_gemm", 20, 60, "kernel", tid=7)]
    gpu = analyze_torch_batch({0: _rank_dir(tmp_path / "g", 0, dev), 1: _rank_dir(tmp_path / "g", 1, dev)})
    assert gpu.accelerator is True
