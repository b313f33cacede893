"""Benchmark: how long the Ascend tree generator takes to write a minimal cluster (1024 ranks by default).

Prints numbers only (no assertions): the layout itself is checked by ``tests/unit/test_ascend_tree.py`` at 64
ranks; this script measures what the tests no longer time (a timed assertion in a unit test fails on a loaded box).

    .venv/bin/python bench/bench_generate.py [--ranks 1024 4096] [--runs 3]

Per rank count: wall time of ``generate_cluster(..., minimal=True)`` (median and max of ``--runs``), per rank, and
the load average when it ran.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "daemon"))

from profwatch.simulate import ascend_tree  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[1024])
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    print(f"{'ranks':>6} {'median_s':>9} {'max_s':>7} {'ms/rank':>8} {'load1':>6}")
    for n in args.ranks:
        times = []
        for _ in range(args.runs):
            out = Path(tempfile.mkdtemp(prefix="pwgen"))
            try:
                t0 = time.monotonic()
                ascend_tree.generate_cluster(out, world_size=n, slow_ranks={5: 1.5}, minimal=True)
                times.append(time.monotonic() - t0)
            finally:
                shutil.rmtree(out, ignore_errors=True)
        print(f"{n:>6} {median(times):>9.2f} {max(times):>7.2f} {1e3 * median(times) / n:>8.2f} "
              f"{os.getloadavg()[0]:>6.2f}")


if __name__ == "__main__":
    main()
