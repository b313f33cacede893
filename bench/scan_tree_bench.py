"""Part of ``bench/bench_alert_latency.py``: ``scan`` cold and warm at 1,024 .. 16,384 ranks on a tree holding only
the files ``scan`` reads (issue 13: warm scan <= 2 s at 16,384 ranks).

Each rank dir is a copy of one generated rank (``daemon/profwatch/simulate/ascend_tree.py``, minimal DBs) with its rank
written where torch_npu writes it: the DB file name, ``RANK_DEVICE_MAP.rankId``, ``profiler_info_<rank>.json``;
``profiler_metadata.json`` carries the capture id and the job's tensor-parallel groups of 8 (the world group is
left out: listing 16,384 ranks in each of 16,384 files would write 1.6 GB of JSON). Raw data (``PROF_*``) holds
one empty ``device_0``. Prints numbers; no assertion.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import time
from pathlib import Path
from typing import Any

from profwatch.adapters.fs.rank_dir_fs import RankDirReader, scan_tree
from profwatch.core.batches.completeness import CaptureHint
from profwatch.core.batches.settings import WatchSettings
from profwatch.simulate import ascend_tree as gen

CAPTURE = "c-bench-scan"


def build_scan_tree(root: Path, ranks: int) -> float:
    """Write ``ranks`` rank dirs under ``root`` (see the module doc); returns the seconds it took."""
    t0 = time.monotonic()
    tpl_root = root.parent / f"{root.name}-template"
    shutil.rmtree(tpl_root, ignore_errors=True)
    (tpl,) = gen.generate_cluster(tpl_root, world_size=1, capture_id=CAPTURE, minimal=True)
    info = json.loads(next(tpl.glob("profiler_info_*.json")).read_text())
    meta = json.loads((tpl / "profiler_metadata.json").read_text())
    pdb = gen.profiler_db_path(tpl)
    adb = tpl / "ASCEND_PROFILER_OUTPUT" / "analysis.db"
    root.mkdir(parents=True, exist_ok=True)
    for r in range(ranks):
        d = root / gen.rank_dir_name(f"node{r // 8}", 4000 + r, gen.DEFAULT_TS_BASE_NS + r * 1_000_000)
        out = d / "ASCEND_PROFILER_OUTPUT"
        out.mkdir(parents=True)
        (d / "PROF_000001_20260101120000000_BENCH" / "device_0").mkdir(parents=True)
        (d / "PROF_000001_20260101120000000_BENCH" / "device_0" / "data").mkdir()
        info_r: dict[str, Any] = {**info, "rank_id": r}
        (d / f"profiler_info_{r}.json").write_text(json.dumps(info_r))
        tp = r - r % 8
        meta_r = {**meta, "distributed_args": {"world_size": ranks, "tensor_model_parallel_size": 8},
                  "parallel_group_info": {f"tp_{tp}": {"group_name": "tp", "group_rank": r % 8,
                                                       "global_ranks": list(range(tp, tp + 8))}}}
        (d / "profiler_metadata.json").write_text(json.dumps(meta_r))
        db = out / f"ascend_pytorch_profiler_{r}.db"
        shutil.copyfile(pdb, db)
        with sqlite3.connect(db) as con:
            con.execute("UPDATE RANK_DEVICE_MAP SET rankId = ?", (r,))
        con.close()
        shutil.copyfile(adb, out / "analysis.db")
        (out / "analyse.done").touch()
    shutil.rmtree(tpl_root, ignore_errors=True)
    return time.monotonic() - t0


def measure_scan(root: Path, ranks: int, *, repeats: int = 3) -> dict[str, float]:
    """Cold scan (fresh reader: every DB checked) and warm scans (the coordinator's long-lived reader), seconds."""
    hint = {CAPTURE: CaptureHint(world_size=ranks)}
    settings = WatchSettings()
    now = gen.DEFAULT_TS_BASE_NS / 1e9 + 60
    reader = RankDirReader()
    t = time.monotonic()
    (batch,) = scan_tree(root, world_size=ranks, now=now, settings=settings, hints=hint, reader=reader)
    cold = time.monotonic() - t
    warm = []
    for _ in range(repeats):
        t = time.monotonic()
        (batch,) = scan_tree(root, world_size=ranks, now=now, settings=settings, hints=hint, reader=reader)
        warm.append(time.monotonic() - t)
    if batch.status != "complete":
        raise SystemExit(f"bench tree of {ranks} ranks is {batch.status}: {batch.describe()}")
    return {"cold_s": cold, "warm_s": min(warm), "warm_max_s": max(warm)}


def run(work: Path, sizes: list[int]) -> None:
    print("\n== scan: cold and warm at scale (tree of the files scan reads) ==")
    print(f"{'ranks':>7} {'build s':>8} {'cold s':>8} {'warm s':>8} {'warm max':>9} {'warm us/rank':>13}")
    for n in sizes:
        root = work / f"scan{n}"
        shutil.rmtree(root, ignore_errors=True)
        built = build_scan_tree(root, n)
        m = measure_scan(root, n)
        print(f"{n:>7} {built:>8.1f} {m['cold_s']:>8.2f} {m['warm_s']:>8.2f} {m['warm_max_s']:>9.2f} "
              f"{1e6 * m['warm_s'] / n:>13.1f}", flush=True)
        shutil.rmtree(root, ignore_errors=True)
    print("goal (issue 13): warm scan <= 2 s at 16,384 ranks; per-rank cost flat = O(N)")


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1024,4096,16384")
    ap.add_argument("--work", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "profwatch-bench-scan")
    a = ap.parse_args()
    run(a.work, [int(x) for x in a.sizes.split(",")])
