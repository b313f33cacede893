"""Benchmark of the slow-link search's memory and wall time: ``communication_matrix_sum`` over the whole batch
against ``--rank_list`` chunks (issue 26; prints a table; no assertions).

For each ``--sizes`` rank count it writes a generated batch (``profwatch.simulate.ascend_tree.generate_cluster``,
``--steps`` steps, one slow link between two ranks of different chunks), then runs the enrich phase's link search
(``msprof_analysis.run_phase`` with only communication_matrix planned, the real msprof-analyze, one command at a
time at ``enrich_nice``) twice, one after the other: whole (``matrix_max_ranks`` above the batch) and in chunks of
``--chunk`` ranks. Per run: the peak resident memory of the tool's whole process session (the runner's memory
watchdog, polled every 0.1 s; for chunks the largest chunk's), the wall time of the search, the chunks, the rows of
the merged table, the slow links named (``links.find_slow_links``) and the 1-minute load average before and after
(``os.getloadavg``). The batch is deleted afterwards.

Usage: ``python bench/bench_matrix_memory.py [--sizes 256,1024] [--chunk 128] [--steps 3] [--work DIR]``; about a
minute per size on 2 cores at the defaults. Run it niced on a shared box, alone.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "daemon"))

from profwatch.adapters.tools.msprof_analysis import prepare_msprof, run_phase  # noqa: E402
from profwatch.adapters.tools.msprof_runner import MsprofRunner  # noqa: E402
from profwatch.core.verdict.links import find_slow_links  # noqa: E402
from profwatch.core.verdict.msprof_plan import MsprofSettings  # noqa: E402
from profwatch.simulate.ascend_tree import generate_cluster  # noqa: E402

MiB = 2**20


def search(batch: Path, out: Path, ranks: int, max_ranks: int) -> dict[str, object]:
    """One link search over ``batch``: peak RSS (MiB), wall (s), chunks, rows, links, status, load before/after."""
    settings = MsprofSettings(advisor=False, memory_limit="watchdog", memory_poll_interval_s=0.1, timeout_s=1800,
                              matrix_max_ranks=max_ranks)
    with MsprofRunner(settings) as runner:
        t = time.monotonic()
        ev, session = prepare_msprof(batch, out, runner=runner, world_size=ranks, settings=settings)
        inspect_s = time.monotonic() - t
        session.plan.commands = [c for c in session.plan.commands if c.name == "communication_matrix"]
        load0 = os.getloadavg()[0]
        t = time.monotonic()
        run_phase(session, ev, "enrich", runner=runner)
        wall = time.monotonic() - t
        load1 = os.getloadavg()[0]
    status = ev.recipes["communication_matrix"]
    found = find_slow_links(ev.link_rows, world_size=ranks)
    chunks = session.plan.matrix_chunks
    return {"status": status.status, "peak_mib": (status.peak_rss_bytes or 0) / MiB, "wall_s": wall,
            "inspect_s": inspect_s, "chunks": len(chunks.chunks) if chunks else 1, "rows": len(ev.link_rows),
            "links": [lk.ranks for lk in found.links], "pairs": found.pairs_judged, "load": (load0, load1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="256,1024")
    ap.add_argument("--chunk", type=int, default=128)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--work", type=Path, default=None, help="folder for the batches (default: a temp dir)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-matrix-", dir=args.work))
    print(f"chunk {args.chunk} ranks, {args.steps} steps, cpus {os.cpu_count()}")
    print(f"{'ranks':>6} {'mode':>8} {'chunks':>6} {'peak MiB':>9} {'wall s':>7} {'rows':>7} {'pairs':>6} "
          f"{'load 1m before/after':>21}  status, slow links")
    try:
        for n in (int(x) for x in args.sizes.split(",")):
            slow = (n // 16 + 1, n // 2 + n // 16 + 2)
            batch = work / f"b{n}"
            generate_cluster(batch, world_size=n, steps=args.steps, slow_links={slow: 3.0}, seed=5,
                             capture_id=f"bench-{n}")
            for mode, cap in (("whole", n + 1), ("chunked", args.chunk)):
                r = search(batch, work / f"out{n}-{mode}", n, cap)
                load = r["load"]
                assert isinstance(load, tuple)
                print(f"{n:>6} {mode:>8} {r['chunks']:>6} {r['peak_mib']:>9.0f} {r['wall_s']:>7.1f} {r['rows']:>7} "
                      f"{r['pairs']:>6} {load[0]:>10.2f}/{load[1]:<10.2f}  {r['status']}, {r['links']} "
                      f"(injected {slow}; inspect {r['inspect_s']:.1f} s)", flush=True)
            shutil.rmtree(batch)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
