"""Benchmark (issue 25): the last update of a 16,384-rank batch in process (no file system), with and without
``profwatch/adapters/gc_freeze.py``, over several batches one after another, and whether freezing leaks.

Per batch: a new ``RankDirTracker`` gets ``--ranks`` rank dir states read as parsing, then each re-read as parsed
but the last (as markers land), a ``GcFreezer`` told of every read (as ``IncrementalScan`` tells it); then the
clock runs over the last rank's read and the batch's decision (``update`` + ``ready`` + ``batch_of``), with the
seconds spent in garbage collections meanwhile (``gc.callbacks``), beside the full collections while the batch
filled and the longest of them (the pause a last read may land in). The previous batch's tracker is dropped first
(the scanner forgets old trees). Columns: RSS and frozen objects after each batch: flat when nothing leaks.

    /work/venv/bin/python bench/bench_gc_freeze.py [--ranks 16384] [--batches 6] [--modes freeze,plain]
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "daemon"))

from profwatch.adapters.gc_freeze import GcFreezer  # noqa: E402
from profwatch.core.batches.completeness import RankDirState  # noqa: E402
from profwatch.core.batches.settings import WatchSettings  # noqa: E402
from profwatch.core.batches.tracker import RankDirTracker  # noqa: E402

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_mib() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * PAGE / 2**20


def state(batch: int, r: int, n: int, parsed: bool) -> RankDirState:
    """A rank dir state shaped like a real one (groups, steps, versions, tuples of reasons/notes)."""
    tp = r - r % 8
    return RankDirState(path=f"/prof/b{batch}/node{r // 8}_{4000 + r}_20260101120000{r % 1000:03d}_ascend_pt",
                        kind="ascend_pt", rank=r, state="parsed" if parsed else "parsing",
                        reasons=() if parsed else ("no analyse.done and not both DBs yet",), steps=(1, 2, 3),
                        capture_id=f"cap{batch}", world_size=n, group_names=frozenset({f"tp_{tp}"}),
                        t_order_s=1000.0 + r / 1000, dir_ts=f"20260101120000{r % 1000:03d}", dir_ts_unix_s=1.7e9,
                        has_metadata=True, groups={f"tp_{tp}": tuple(range(tp, tp + 8))},
                        versions=("2.6.0", "8.1.RC1"))


class GcClock:
    """Seconds in collections and full collections since reset, and the longest full collection."""

    def __init__(self) -> None:
        self.seconds, self.full, self.longest_full, self._t = 0.0, 0, 0.0, 0.0
        gc.callbacks.append(self._cb)

    def _cb(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t = time.perf_counter()
            return
        took = time.perf_counter() - self._t
        self.seconds += took
        if info["generation"] == 2:
            self.full += 1
            self.longest_full = max(self.longest_full, took)

    def reset(self) -> None:
        self.seconds, self.full, self.longest_full = 0.0, 0, 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--ranks", type=int, default=16384)
    ap.add_argument("--batches", type=int, default=6)
    ap.add_argument("--modes", default="freeze,plain")
    args = ap.parse_args()
    n, settings, clock = args.ranks, WatchSettings(), GcClock()
    print(f"{'mode':>7} {'batch':>5} {'last read + decision s':>23} {'gc s':>6} {'full gc':>7} "
          f"{'full gcs in batch':>17} {'longest s':>9} {'RSS MiB':>8} {'frozen':>8} {'freezes':>7} {'load 1m':>7}",
          flush=True)
    for mode in args.modes.split(","):
        gc.unfreeze()
        gc.collect()
        freezer = GcFreezer() if mode == "freeze" else None
        tracker: RankDirTracker | None = None
        for b in range(args.batches):
            tracker = None  # the scanner forgot the previous batch's tree
            tracker = RankDirTracker()
            clock.reset()
            for parsed in (False, True):
                for r in range(n - 1 if parsed else n):
                    s = state(b, r, n, parsed)
                    tracker.update(s.path, s)
                    if freezer is not None:
                        freezer.after_reads(1, tree_dirs=len(tracker), pass_ended=False)
            last = state(b, n - 1, n, True)
            fills, longest = clock.full, clock.longest_full
            clock.reset()
            t0 = time.perf_counter()
            tracker.update(last.path, last)
            assert tracker.ready(f"cap{b}", n)
            (batch,) = tracker.batch_of(f"cap{b}", now_unix_s=1.7e9 + 10, settings=settings, world_size=n)
            took = time.perf_counter() - t0
            assert batch.status == "complete", batch.describe()
            print(f"{mode:>7} {b:>5} {took:>23.3f} {clock.seconds:>6.3f} {clock.full:>7} {fills:>17} "
                  f"{longest:>9.3f} {rss_mib():>8.0f} "
                  f"{gc.get_freeze_count():>8} {freezer.freezes if freezer else 0:>7} {os.getloadavg()[0]:>7.2f}",
                  flush=True)
    gc.unfreeze()


if __name__ == "__main__":
    main()
