"""Benchmark: latency from the last rank's ``analyse.done`` to "batch complete", and the cost of polling.

Prints numbers only (no assertions). Targets from issue 4: inotify <= 1 s; polling <= poll interval + 1 s.

    /work/venv/bin/python bench/bench_completion.py [--ranks 1024] [--files-per-rank 150] [--poll-interval-s 2]

Setup: ``--ranks`` minimal generated rank dirs (daemon/profwatch/simulate/ascend_tree.py) without markers, padded with
raw-data files (FRAMEWORK/, PROF_*/host, PROF_*/device_0/data, logs/) to ``--files-per-rank`` entries, as a real
torch_npu rank dir holds hundreds. All markers but the last are written and scanned first (warm DB cache, as in
the daemon, where earlier ranks finish first); then the last marker is written and the clock runs until the
wake callback's scan_tree reports the batch complete. Polling cost: one PollingObserver over the whole tree,
counting stat/scandir calls through watchdog's PollingObserverVFS, and this process's CPU seconds per wall
second (``time.process_time``), over ``--cost-window-s``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "daemon"))

from watchdog.events import FileSystemEventHandler
from watchdog.observers.polling import PollingObserverVFS

from profwatch.adapters.fs.prof_watch import ProfWatcher, pruned_scandir
from profwatch.adapters.fs.rank_dir_fs import RankDirReader, scan_tree
from profwatch.core.batches.settings import WatchSettings
from profwatch.simulate import ascend_tree as gen


def pad_rank_dir(rank_dir: Path, n_files: int) -> None:
    """Add empty raw-data files so the rank dir holds about ``n_files`` entries."""
    prof = rank_dir / "PROF_000001_20260101120000000_BENCH"
    parts = [rank_dir / "FRAMEWORK", prof / "host" / "data", prof / "device_0" / "data", rank_dir / "logs"]
    for p in parts:
        p.mkdir(parents=True, exist_ok=True)
    for i in range(max(n_files - 10, 0)):
        (parts[i % len(parts)] / f"raw.{i}").touch()


def build_tree(root: Path, ranks: int, files_per_rank: int) -> list[Path]:
    dirs = gen.generate_cluster(root, world_size=ranks, capture_id="bench", with_marker=False, minimal=True)
    for d in dirs:
        pad_rank_dir(d, files_per_rank)
    return dirs


def measure_latency(mode: str, prof: Path, dirs: list[Path], poll_interval_s: float) -> tuple[float, float]:
    """Seconds from the last marker to complete, and the duration of one warm scan."""
    now = gen.DEFAULT_TS_BASE_NS / 1e9 + 30
    reader = RankDirReader()
    complete = threading.Event()
    scans: list[float] = []

    def on_wake(prof_dir: str) -> None:
        t0 = time.monotonic()
        (batch,) = scan_tree(prof_dir, now=now, reader=reader)
        scans.append(time.monotonic() - t0)
        if batch.status == "complete":
            complete.set()

    for d in dirs:  # fresh markers except the last
        (d / "ASCEND_PROFILER_OUTPUT" / "analyse.done").unlink(missing_ok=True)
    settings = WatchSettings(observer=mode, poll_interval_s=poll_interval_s, reconcile_interval_s=3600)  # type: ignore[arg-type]
    with ProfWatcher(on_wake, settings=settings) as w:
        w.watch(prof)
        for d in dirs[:-1]:
            (d / "ASCEND_PROFILER_OUTPUT" / "analyse.done").touch()
        settle = time.monotonic() + 2 * poll_interval_s + 5
        n = -1
        while time.monotonic() < settle and n != len(scans):  # wait until wakes stop (bounded)
            n = len(scans)
            time.sleep(max(poll_interval_s, 0.5) + 0.5)
        t0 = time.monotonic()
        (dirs[-1] / "ASCEND_PROFILER_OUTPUT" / "analyse.done").touch()
        ok = complete.wait(poll_interval_s + 60)
        latency = time.monotonic() - t0 if ok else float("nan")
    return latency, min(scans[-3:]) if scans else float("nan")


def measure_polling_cost(prof: Path, poll_interval_s: float, window_s: float,
                         skip: tuple[str, ...] = ()) -> tuple[float, float, int]:
    """(CPU s per wall s, stat+scandir calls per s, calls per poll) of one PollingObserver over the tree;
    ``skip``: dir names not descended into (ProfWatcher uses ``WatchSettings.poll_skip_dirs``)."""
    calls = [0]
    scandir = pruned_scandir(skip)

    def stat(path: str) -> os.stat_result:
        calls[0] += 1
        return os.stat(path)

    def listdir(path: str | None) -> Iterator[os.DirEntry[str]]:
        calls[0] += 1
        return scandir(path)

    obs = PollingObserverVFS(stat=stat, listdir=listdir, polling_interval=poll_interval_s)
    obs.schedule(FileSystemEventHandler(), str(prof), recursive=True)
    obs.start()
    try:
        time.sleep(poll_interval_s + 0.5)  # first snapshot
        c0, cpu0, t0 = calls[0], time.process_time(), time.monotonic()
        time.sleep(window_s)
        c1, cpu1, t1 = calls[0], time.process_time(), time.monotonic()
    finally:
        obs.stop()
        obs.join(10)
    wall = t1 - t0
    polls = max(wall / poll_interval_s, 1e-9)
    return (cpu1 - cpu0) / wall, (c1 - c0) / wall, int((c1 - c0) / polls)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--files-per-rank", type=int, default=150)
    ap.add_argument("--poll-interval-s", type=float, default=2.0)
    ap.add_argument("--cost-window-s", type=float, default=10.0)
    ap.add_argument("--dir", default=None, help="where to build the tree (default: a temp dir)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        prof = Path(tmp) / "prof"
        t0 = time.monotonic()
        dirs = build_tree(prof, args.ranks, args.files_per_rank)
        n_entries = sum(len(files) + len(ds) for _r, ds, files in os.walk(prof))
        print(f"tree: {args.ranks} rank dirs, {n_entries} entries, built in {time.monotonic() - t0:.1f} s")
        for mode in ("inotify", "polling"):
            latency, scan_s = measure_latency(mode, prof, dirs, args.poll_interval_s)
            target = 1.0 if mode == "inotify" else args.poll_interval_s + 1.0
            print(f"{mode:8s} last analyse.done -> complete: {latency:.3f} s (target <= {target:.1f} s); "
                  f"warm scan_tree of the batch: {scan_s:.3f} s")
        for label, skip in (("whole tree", ()), ("as ProfWatcher polls", WatchSettings().poll_skip_dirs)):
            cpu, calls_s, per_poll = measure_polling_cost(prof, args.poll_interval_s, args.cost_window_s, skip)
            print(f"polling cost, {label} (interval {args.poll_interval_s:g} s): {cpu:.3f} CPU s per wall s, "
                  f"{calls_s:.0f} stat/scandir calls per s ({per_poll} per poll)")


if __name__ == "__main__":
    main()
