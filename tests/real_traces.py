"""Real Kineto traces from HolisticTraceAnalysis's test data (``tests/data/real_traces``, MIT: see ``SOURCES.md``
and ``LICENSE.HolisticTraceAnalysis`` there), laid out as torch_pt rank dirs the way torch.profiler writes them.

Shapes: :func:`layout` -> ``{rank: rank dir}``; a trace laid out as several ranks is the same file under each.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

DATA = Path(__file__).parent / "data" / "real_traces"
TRACES = {
    "trace_diff_control": DATA / "trace_diff" / "control" / "control.json.gz",
    "trace_diff_test": DATA / "trace_diff" / "test" / "test.json.gz",
    "sampled_rank0": DATA / "trace_filter" / "sampled_rank-0.json.gz",
    "sampled_rank1": DATA / "trace_filter" / "sampled_rank-1.json.gz",
    "mtia": DATA / "mtia_trace_single_rank" / "mtia_rank_0.json.gz",
    "amd_mi250": DATA / "amd_trace" / "mi250_minitoy_train_ROCm6_2_kineto.json.gz",
}


def layout(root: Path, traces: list[Path], *, world_size: int | None = None, ts: str = "20260101120000") -> dict[int, Path]:
    """One ``{host}_{pid}_{timestamp}_torch_pt`` dir per rank under ``root`` (rank i gets ``traces[i]``), with
    ``profiler_info_{rank}.json``, ``profiler_metadata.json`` and ``trace.done``; the trace is copied as ``*.pt.trace.json.gz``."""
    out: dict[int, Path] = {}
    n = world_size or len(traces)
    for rank, src in enumerate(traces):
        d = root / f"node{rank}_{4000 + rank}_{ts}{rank:03d}_torch_pt"
        d.mkdir(parents=True)
        (d / f"profiler_info_{rank}.json").write_text(json.dumps({"rank_id": rank, "world_size": n}))
        (d / "profiler_metadata.json").write_text(json.dumps({"profwatch_capture_id": f"real-{ts}"}))
        shutil.copyfile(src, d / f"node{rank}_{4000 + rank}.1767268800000.pt.trace.json.gz")
        (d / "trace.done").write_text("")
        out[rank] = d
    return out
