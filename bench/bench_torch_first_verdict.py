"""Benchmark (issue 25 B): a torch.profiler batch's first verdict after the last rank's trace lands, with each rank's
trace parsed as it lands (``pre``: ``kineto_reader.TracePrefetcher``, the coordinator's path) and with every trace
parsed at completion (``read``: before issue 25), interleaved pre, read, read, pre.

Prints numbers and whether all four verdicts are the same (status, suspects, evidence, notes; clocks left out);
nothing is asserted. Each row has the load averages beside it (the box is shared).

    /work/venv/bin/python bench/bench_torch_first_verdict.py [--sizes 8,32,128] [--events-per-rank 5000]
        [--spread-s 2] [--workers 4] [--dir DIR]

Setup per size: ``n`` rank dirs in the torch_pt layout (``profiler_info_{rank}.json``, ``profiler_metadata.json``
with a capture id, one ``*.pt.trace.json``), traces of a synchronous host-only job with one rank 1.3x slow
(``tests/unit/test_kineto_align.job_events``, 5 steps), each ``aten::mm`` padded with nested ``aten::add`` events
(inside it, so the breakdown is unchanged) up to ``--events-per-rank``. A turn removes every ``trace.done``, then
writes them one by one over ``--spread-s`` (``pre``: each rank's trace queued for parsing as its marker lands); the
clock starts at the last marker and stops when ``analyze_batch(enrich=False)`` returns (scan, staging, the Kineto
breakdown, ranking, report.json + report.html): the first verdict.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "daemon"))

from profwatch.adapters.fs.rank_dir_fs import scan_tree  # noqa: E402
from profwatch.adapters.tools.kineto_reader import TracePrefetcher, write_torch_trace  # noqa: E402
from profwatch.analysis.facade import AnalysisResult, AnalysisSettings, analyze_batch  # noqa: E402
from tests.unit.test_kineto_align import job_events  # noqa: E402

CAPTURE = "c-bench-torch"
MARKER = "trace.done"


def build(root: Path, n: int, events_per_rank: int) -> list[Path]:
    """Write ``n`` torch_pt rank dirs (no marker yet) with padded generated traces; returns them by rank."""
    events = job_events(n, steps=5, work={n // 3: 1.3})
    dirs = []
    for r in range(n):
        mms = [e for e in events[r] if e["name"] == "aten::mm"]
        pad = max(0, events_per_rank - len(events[r])) // max(len(mms), 1)
        extra = []
        for e in mms:
            step = e["dur"] / (pad + 1)
            extra += [{"ph": "X", "name": "aten::add", "cat": "cpu_op", "ts": e["ts"] + i * step, "dur": step * 0.5,
                       "pid": 1, "tid": 1} for i in range(pad)]
        d = root / f"node{r // 8}_{4000 + r}_20260101120000{r % 1000:03d}_torch_pt"
        d.mkdir(parents=True)
        (d / f"profiler_info_{r}.json").write_text(json.dumps({"rank_id": r, "world_size": n}))
        (d / "profiler_metadata.json").write_text(json.dumps({"profwatch_capture_id": CAPTURE}))
        write_torch_trace(d / f"node{r // 8}_{4000 + r}.1767268800000.pt.trace.json", r, n, events[r] + extra)
        dirs.append(d)
    return dirs


def verdict(res: AnalysisResult) -> dict[str, Any]:
    out = res.to_json()
    for key in ("timings_s", "paths", "report"):
        out.pop(key, None)
    for detail in out.get("recipe_details", {}).values():
        detail.pop("duration_s", None)
    return out


def turn(dirs: list[Path], root: Path, work: Path, *, pre: bool, spread_s: float, workers: int,
         settings: AnalysisSettings) -> tuple[float, float, int, dict[str, Any], str]:
    """One turn: (seconds from the last marker to the first verdict, of which scan_tree, traces parsed ahead,
    verdict, suspects)."""
    for d in dirs:
        (d / MARKER).unlink(missing_ok=True)
    fetcher = TracePrefetcher(workers)
    try:
        for rank, d in enumerate(dirs):
            (d / MARKER).write_text("")
            if pre:
                fetcher.submit(CAPTURE, {rank: str(d)})
            if spread_s and rank < len(dirs) - 1:
                time.sleep(spread_s / len(dirs))
        t0 = time.monotonic()
        (batch,) = scan_tree(root, world_size=len(dirs))
        scan_s = time.monotonic() - t0
        ahead = fetcher.take(CAPTURE) if pre else None
        res = analyze_batch(batch, work_dir=work, settings=settings, enrich=False, prefetched_traces=ahead)
        took = time.monotonic() - t0
    finally:
        fetcher.close()
    return took, scan_s, len(ahead or {}), verdict(res), f"{res.status} {[s.rank for s in res.suspects][:3]}"


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--sizes", default="8,32,128")
    ap.add_argument("--events-per-rank", type=int, default=5000)
    ap.add_argument("--spread-s", type=float, default=2.0, help="window over which the ranks' markers land")
    ap.add_argument("--workers", type=int, default=4, help="TracePrefetcher threads (own_tables_workers)")
    ap.add_argument("--dir", default=None, help="where to write the traces (default: a temp dir)")
    args = ap.parse_args()
    settings = AnalysisSettings()
    print(f"cores: {os.cpu_count()}; markers land over {args.spread_s:g} s; {args.events_per_rank} events per rank; "
          f"{args.workers} prefetch threads")
    print(f"{'ranks':>6} {'MB':>5} {'pre s (2 runs)':>15} {'read s (2 runs)':>16} {'scan s':>7} {'parsed ahead':>13} "
          f"{'same verdict':>13}  {'load 1/5/15':>14}  verdict")
    for n in (int(x) for x in args.sizes.split(",")):
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            root = Path(tmp) / "prof"
            dirs = build(root, n, args.events_per_rank)
            mb = sum(p.stat().st_size for d in dirs for p in d.glob("*.pt.trace.json")) / 2**20
            times: dict[str, list[float]] = {"pre": [], "read": []}
            verdicts, ahead, scans, said = [], [], [], ""
            for i, what in enumerate(("pre", "read", "read", "pre")):
                took, scan_s, got, v, said = turn(dirs, root, Path(tmp) / f"w{i}", pre=what == "pre",
                                                  spread_s=args.spread_s, workers=args.workers, settings=settings)
                times[what].append(took)
                scans.append(scan_s)
                verdicts.append(v)
                if what == "pre":
                    ahead.append(got)
            same = all(v == verdicts[0] for v in verdicts)
            p, r = sorted(times["pre"]), sorted(times["read"])
            load = " ".join(f"{x:.1f}" for x in os.getloadavg())
            print(f"{n:>6} {mb:>5.0f} {p[0]:>7.2f} {p[-1]:>7.2f} {r[0]:>8.2f} {r[-1]:>7.2f} {max(scans):>7.2f} "
                  f"{min(ahead):>6}/{n:<6} {'yes' if same else 'NO':>13}  {load:>14}  {said} (slow {n // 3})",
                  flush=True)
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
