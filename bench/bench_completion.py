"""Benchmark: latency from the last rank's ``analyse.done`` to "batch complete" (inotify, inotify after an overflow,
polling) at 1,024 / 4,096 / 16,384 rank dirs, and the cost of polling.

Prints numbers only (no assertions), each row with the 1-minute load average beside it (the box is shared).
Targets (issue 25): <= 0.2 s after the last marker with inotify, also right after an overflow; polling <= its
interval + 1 s. Issue 34, mode ``burst``: every marker lands within ``--burst-s`` (2 s), paced evenly, the clock
starts at the last one: <= 1 s of wall time after it on an idle box at 16,384 rank dirs, and <= 0.2 s of this
process's CPU after it (``CPU after s``: ``time.process_time``, every thread: the watcher, the emitter, the
scanner) at 4,096; ``polling-burst`` is the same through the polling observer. ``CPU/marker ms``: this
process's CPU from the burst's start to complete, per marker (load-independent: an idle box keeps up with a burst
when it times the markers is below ``--burst-s``).

    /work/venv/bin/python bench/bench_completion.py [--ranks 1024,4096,16384] [--modes inotify,overflow,polling,burst]
        [--burst-s 2]
        [--poll-interval-s 2] [--files-per-rank 0] [--cost] [--poll-max-listings 1024] [--dir DIR] [--no-gc-freeze]

Setup: the tree of ``bench/scan_tree_bench.py`` (each rank dir holds the files completion reads: profiler_info,
profiler_metadata with the capture id, both DBs, an empty ``PROF_*/device_0/data``), optionally padded with empty
raw-data files (``--files-per-rank``, in ``FRAMEWORK/``, ``PROF_*/host/data``, ``logs/``, which the polling observer
skips). Per mode: every marker is removed; a ``ProfWatcher`` feeds one ``IncrementalScan`` (the daemon's scanner,
``RankDirScanner``, holds one per prof_dir) through a driver that schedules as the capture shell does: one scan at a
time, the rank dirs events named first, then a full look, then the rest of a reconcile pass in slices. The first
full look reads every dir (cold DB checks the first time; the reader is shared across modes, as the daemon's is;
each mode's scan keeps its own folder listings, ``rank_dir_fs.ListingCache``, as the daemon's scan of a prof_dir does);
then all markers but the last are written and the bench waits until everything is read (at 16,384 dirs this
overflows inotify's queue for real); then the clock starts and the last marker is written ("overflow": an inotify
overflow is injected right before it, so its reconcile pass runs while the marker lands) and stops when the driver
gets the batch complete. ``gc s`` / ``full gc``: seconds in garbage collections (any thread) and full collections
meanwhile, ``last update s`` the scan call that answered "complete" (``--no-gc-freeze``: without ``profwatch/adapters/gc_freeze.py``, for comparison). ``reads`` counts the rank dirs read in between, ``full looks`` the full looks the watcher
asked for meanwhile (the overflow's; a supervisor re-arm). ``--cost``: one polling observer over the
tree, counting stat/scandir calls, and this process's CPU seconds per wall second: the whole tree, the completion
listing with every rank dir re-listed each poll (the observer before issue 34's bound), and ProfWatcher's observer
(``adapters/fs/poll_listing.py``: at most ``--poll-max-listings`` rank dirs re-listed a poll, the others cached).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "daemon"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from scan_tree_bench import CAPTURE, build_scan_tree  # noqa: E402
from watchdog.events import FileSystemEventHandler  # noqa: E402
from watchdog.observers.api import BaseObserver  # noqa: E402
from watchdog.observers.polling import PollingObserverVFS  # noqa: E402

from profwatch.adapters.fs.incremental_scan import IncrementalScan  # noqa: E402
from profwatch.adapters.fs.poll_listing import BoundedPollingObserver  # noqa: E402
from profwatch.adapters.fs.prof_watch import (  # noqa: E402
    GATHER_S,
    ProfWatcher,
    completion_scandir,
    make_inotify_observer,
    pruned_scandir,
)
from profwatch.adapters.fs.rank_dir_fs import RankDirReader  # noqa: E402
from profwatch.adapters.gc_freeze import GC_FREEZER  # noqa: E402
from profwatch.core.batches.settings import WatchSettings  # noqa: E402
from profwatch.simulate import ascend_tree as gen  # noqa: E402

EARLY = gen.DEFAULT_TS_BASE_NS / 1e9 + 30  # "now" for the scans: before the deadline, inside the quiet period


def pad_rank_dir(rank_dir: Path, n_files: int) -> None:
    """Add ``n_files`` empty raw-data files (in dirs the polling observer skips, as torch_npu's raw data)."""
    prof = rank_dir / "PROF_000001_20260101120000000_BENCH"
    parts = [rank_dir / "FRAMEWORK", prof / "host" / "data", rank_dir / "logs"]
    for p in parts:
        p.mkdir(parents=True, exist_ok=True)
    for i in range(n_files):
        (parts[i % len(parts)] / f"raw.{i}").touch()


def _marker(d: Path) -> Path:
    return d / "ASCEND_PROFILER_OUTPUT" / "analyse.done"


class Driver:
    """Runs one IncrementalScan on its own thread, scheduled as ``CaptureShell`` schedules ``RankDirScanner``: one
    scan at a time; rank dirs named by events first, then a full look, then the next slice of a pass in progress."""

    def __init__(self, scan: IncrementalScan, world: int) -> None:
        self.scan, self.world = scan, world
        self.cv = threading.Condition()
        self.want_full = False
        self.want_dirs: set[str] = set()
        self.busy = False
        self.last_active = time.monotonic()
        self.complete = threading.Event()
        self.complete_at = 0.0
        self.reads_at_complete = 0
        self.last_update_s = 0.0  # how long the update that answered "complete" took
        self.complete_cpu = 0.0  # this process's CPU seconds (time.process_time) when complete was answered
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def on_wake(self, prof_dir: str) -> None:
        with self.cv:
            self.want_full = True
            self.cv.notify_all()

    def on_rank_dirs(self, prof_dir: str, rank_dirs: frozenset[str]) -> None:
        with self.cv:
            self.want_dirs |= rank_dirs
            self.cv.notify_all()

    def _run(self) -> None:
        while True:
            with self.cv:
                self.cv.wait_for(lambda: self._stop or self.want_full or self.want_dirs or self.scan.reconciling)
                if self._stop:
                    return
                arg: frozenset[str] | None
                if self.want_dirs:
                    arg, self.want_dirs = frozenset(self.want_dirs), set()
                elif self.want_full:
                    arg, self.want_full = None, False
                else:
                    arg = frozenset()
                self.busy = True
            t = time.monotonic()
            out = self.scan.update(arg, capture_id=CAPTURE, world_size=self.world)
            if out is not None and any(b.capture_id == CAPTURE and b.status == "complete" for b in out) \
                    and not self.complete.is_set():
                self.complete_at = time.monotonic()
                self.complete_cpu = time.process_time()
                self.last_update_s = self.complete_at - t
                self.reads_at_complete = self.scan.reader.reads
                self.complete.set()
            with self.cv:
                self.busy = False
                self.last_active = time.monotonic()

    def wait_idle(self, quiet_s: float, limit_s: float, reads: int = 0) -> bool:
        """Wait (bounded) until at least ``reads`` rank dir reads were made, nothing is asked or running, and
        nothing happened for ``quiet_s``."""
        end = time.monotonic() + limit_s
        while time.monotonic() < end:
            with self.cv:
                idle = not (self.busy or self.want_full or self.want_dirs or self.scan.reconciling)
                quiet = time.monotonic() - self.last_active >= quiet_s
            if idle and quiet and self.scan.reader.reads >= reads:
                return True
            time.sleep(0.05)
        return False

    def close(self) -> None:
        with self.cv:
            self._stop = True
            self.cv.notify_all()
        self._thread.join(30)


class GcClock:
    """Seconds spent in garbage collections (``gc.callbacks``), and the full ones, since :meth:`reset`."""

    def __init__(self) -> None:
        self.seconds, self.full, self._start = 0.0, 0, 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
            return
        self.seconds += time.perf_counter() - self._start
        self.full += info["generation"] == 2

    def reset(self) -> tuple[float, int]:
        out = (self.seconds, self.full)
        self.seconds, self.full = 0.0, 0
        return out


GC_CLOCK = GcClock()


_BURST_WRITER = """
import json, sys, time
a = json.loads(sys.stdin.read())
paths, start, burst = a["paths"], a["start"], a["burst"]
step = burst / max(len(paths) - 1, 1)
for i, p in enumerate(paths[:-1]):
    lag = start + i * step - time.monotonic()
    if lag > 0.002:
        time.sleep(lag)
    open(p, "a").close()
lag = start + burst - time.monotonic()
if lag > 0:
    time.sleep(lag)
open(paths[-1], "a").close()
print(time.monotonic())
"""


BURST_CPU = [0.0]  # this process's CPU seconds when the last burst began (the writer starts 0.5 s later)


def _burst(dirs: list[Path], burst_s: float) -> tuple[float, float]:
    """Write every marker from a child process (as ranks do: not this process's GIL), evenly over ``burst_s``, the
    last at the end; returns (monotonic time of the last marker, this process's CPU seconds then). CLOCK_MONOTONIC
    is one clock for every process of the host."""
    paths = [str(_marker(d)) for d in dirs]  # before the CPU baseline: the bench's own work, not the watcher's
    start = time.monotonic() + 0.5
    BURST_CPU[0] = time.process_time()
    child = subprocess.Popen([sys.executable, "-c", _BURST_WRITER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    assert child.stdin is not None
    child.stdin.write(json.dumps({"paths": paths, "start": start, "burst": burst_s}))
    child.stdin.close()
    lag = start + burst_s - time.monotonic()
    if lag > 0:
        time.sleep(lag)
    cpu0 = time.process_time()  # at the last marker's planned time (this thread wakes within a few ms of it)
    GC_CLOCK.reset()
    assert child.stdout is not None
    out = child.stdout.read()
    child.wait(600)
    return float(out.strip().splitlines()[-1]), cpu0


def measure_latency(mode: str, prof: Path, dirs: list[Path], reader: RankDirReader,
                    poll_interval_s: float, gc_freeze: bool = True, burst_s: float = 2.0) -> dict[str, float]:
    """One row: seconds from the last marker to complete, rank dirs read meanwhile, the first full look's seconds,
    overflows seen while all markers but the last landed."""

    for d in dirs:
        _marker(d).unlink(missing_ok=True)
    polling = mode in ("polling", "polling-burst")
    settings = WatchSettings(observer="polling" if polling else "inotify", poll_interval_s=poll_interval_s,
                             reconcile_interval_s=3600)
    scan = IncrementalScan(prof, settings=settings, reader=reader, wall=lambda: EARLY,
                           gc_freezer=GC_FREEZER if gc_freeze else None)
    drv = Driver(scan, len(dirs))
    observers: list[BaseObserver] = []

    def inotify_factory(m: str, on_overflow: Callable[[], None]) -> BaseObserver:
        obs = make_inotify_observer(on_overflow, gather_rank_dirs=True, gather_s=GATHER_S)  # as the daemon
        observers.append(obs)
        return obs

    quiet_s = 2 * poll_interval_s + 0.5 if polling else 1.0
    try:
        with ProfWatcher(drv.on_wake, settings=settings, on_rank_dirs=drv.on_rank_dirs,
                         observer_factory=None if polling else inotify_factory) as w:
            t = time.monotonic()
            w.watch(prof)
            drv.wait_idle(quiet_s, 900, reads=reader.reads + len(dirs))
            first_look_s = drv.last_active - t
            before = reader.reads
            if not mode.endswith("burst"):
                for d in dirs[:-1]:
                    _marker(d).touch()
                drv.wait_idle(quiet_s, 900, reads=before + len(dirs) - 1)  # each of them read since
            overflows, wakes0 = w.stats.overflows, w.stats.wakes
            if mode == "overflow":
                observers[0].simulate_overflow()  # type: ignore[attr-defined]
            reads0 = reader.reads
            if mode.endswith("burst"):  # every marker from another process within burst_s, paced evenly
                t0, cpu0 = _burst(dirs, burst_s)
            else:
                t0 = time.monotonic()
                cpu0 = time.process_time()
                GC_CLOCK.reset()
                _marker(dirs[-1]).touch()
            ok = drv.complete.wait(poll_interval_s + 120)
            gc_s, gc_full = GC_CLOCK.reset()  # a little after complete_at: an upper bound
            latency = drv.complete_at - t0 if ok else float("nan")
            cpu_after = drv.complete_cpu - cpu0 if ok else float("nan")
            per_marker_ms = (drv.complete_cpu - BURST_CPU[0]) / len(dirs) * 1e3 \
                if ok and mode.endswith("burst") else float("nan")
            reads = drv.reads_at_complete - reads0 if ok else reader.reads - reads0
            full_looks = w.stats.wakes - wakes0
    finally:
        drv.close()
    return {"latency_s": latency, "reads": reads, "first_look_s": first_look_s, "overflows": overflows,
            "full_looks": full_looks, "gc_s": gc_s, "gc_full": gc_full, "update_s": drv.last_update_s,
            "cpu_after_s": cpu_after, "cpu_per_marker_ms": per_marker_ms}


def measure_polling_cost(prof: Path, poll_interval_s: float, window_s: float,
                         scandir: Callable[[str | None], Iterator[os.DirEntry[str]]],
                         bounded: int | None = None) -> tuple[float, float, int]:
    """(CPU s per wall s, stat+scandir calls per s, calls per poll) of one PollingObserver over the tree listing
    with ``scandir`` (``completion_scandir``: what ProfWatcher lists); ``bounded``: ProfWatcher's observer,
    re-listing at most that many rank dirs a poll (``watch.poll_max_rank_dir_listings``), else watchdog's
    whole-snapshot ``PollingObserverVFS``."""
    calls = [0]

    def stat(path: str) -> os.stat_result:
        calls[0] += 1
        return os.stat(path)

    def listdir(path: str | None) -> Iterator[os.DirEntry[str]]:
        calls[0] += 1
        return scandir(path)

    def counted_scandir(path: str) -> Any:
        calls[0] += 1
        return os.scandir(path)

    obs: BaseObserver = (
        PollingObserverVFS(stat=stat, listdir=listdir, polling_interval=poll_interval_s) if bounded is None else
        BoundedPollingObserver(stat=stat, listdir=listdir, scandir=counted_scandir, max_listings=bounded,
                               polling_interval=poll_interval_s, skip=WatchSettings().poll_skip_dirs))
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


def measure_arming(root: Path, n: int, limit_s: float = 600.0) -> tuple[float, int]:
    """(seconds, watches) to arm the inotify observer over a tree of ``n`` rank dirs that hold only folders (the
    layout of a finished rank: ``ASCEND_PROFILER_OUTPUT/``, ``PROF_*/device_0/data``, ``PROF_*/host/data``,
    ``FRAMEWORK/``, ``logs/``): from ``schedule`` to every watch added (nan when not within ``limit_s``)."""
    for r in range(n):
        d = root / gen.rank_dir_name(f"node{r // 8}", 4000 + r, gen.DEFAULT_TS_BASE_NS + r * 1_000_000)
        for sub in ("ASCEND_PROFILER_OUTPUT", "PROF_000001_20260101120000000_BENCH/device_0/data",
                    "PROF_000001_20260101120000000_BENCH/host/data", "FRAMEWORK", "logs"):
            (d / sub).mkdir(parents=True)
    obs = make_inotify_observer(lambda: None)
    obs.start()
    try:
        t0 = time.monotonic()
        obs.schedule(FileSystemEventHandler(), str(root), recursive=True)
        want = 1 + 2 * n
        while obs.watch_count() < want and time.monotonic() - t0 < limit_s:  # type: ignore[attr-defined]
            time.sleep(0.01)
        took = time.monotonic() - t0
        held = obs.watch_count()  # type: ignore[attr-defined]
    finally:
        obs.stop()
        obs.join(10)
    return (took if held >= want else float("nan")), held


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--ranks", default="1024,4096,16384", help="comma-separated tree sizes")
    ap.add_argument("--modes", default="inotify,overflow,polling,burst",
                    help="inotify, overflow, polling: one last marker; burst (inotify), polling-burst: every "
                         "marker within --burst-s")
    ap.add_argument("--burst-s", type=float, default=2.0, help="burst modes: seconds over which every marker lands")
    ap.add_argument("--files-per-rank", type=int, default=0, help="empty raw-data files added per rank dir")
    ap.add_argument("--poll-interval-s", type=float, default=2.0)
    ap.add_argument("--cost", action="store_true", help="also measure the polling observer's cost")
    ap.add_argument("--cost-window-s", type=float, default=10.0)
    ap.add_argument("--poll-max-listings", type=int, default=WatchSettings().poll_max_rank_dir_listings,
                    help="--cost: rank dirs ProfWatcher's polling observer re-lists a poll (watch.poll_max_rank_dir_listings)")
    ap.add_argument("--dir", default=None, help="where to build the trees (default: a temp dir)")
    ap.add_argument("--tree", default=None, help="reuse this tree of build_scan_tree (one size: --ranks N) instead "
                                                 "of building one (its markers are removed and rewritten)")
    ap.add_argument("--no-gc-freeze", action="store_true", help="scan without the GcFreezer (for comparison)")
    ap.add_argument("--arm", type=int, default=0, help="only measure arming the inotify watches over a tree of "
                                                       "this many rank dirs (folders only), then exit")
    args = ap.parse_args()
    if args.dir:  # a --dir that does not exist yet is made (tempfile would fail on it)
        Path(args.dir).mkdir(parents=True, exist_ok=True)
    if args.arm:
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            cpu0 = time.process_time()
            took, held = measure_arming(Path(tmp) / "prof", args.arm)
            print(f"arming {args.arm} rank dirs (7 folders each): {took:.2f} s wall, {held} inotify watches, "
                  f"{time.process_time() - cpu0:.2f} CPU s with the tree's creation; load 1m "
                  f"{os.getloadavg()[0]:.2f}", flush=True)
        return
    modes = args.modes.split(",")
    print(f"{'ranks':>6} {'mode':>9} {'latency s':>10} {'target s':>9} {'reads':>6} {'full looks':>10} "
          f"{'first look s':>13} {'overflows':>10} {'gc s':>6} {'full gc':>7} {'last update s':>13} {'CPU after s':>11} {'CPU/marker ms':>13} {'load 1m':>8}",
          flush=True)
    for n in (int(x) for x in args.ranks.split(",")):
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            prof = Path(args.tree) if args.tree else Path(tmp) / "prof"
            build_s = 0.0 if args.tree else build_scan_tree(prof, n)
            dirs = sorted((p for p in prof.iterdir() if p.is_dir()), key=lambda p: p.name)
            if args.files_per_rank:
                for d in dirs:
                    pad_rank_dir(d, args.files_per_rank)
            reader = RankDirReader()
            for mode in modes:
                m = measure_latency(mode, prof, dirs, reader, args.poll_interval_s, not args.no_gc_freeze,
                                    args.burst_s)
                target = (args.poll_interval_s + 1.0 if mode.startswith("polling") else
                          1.0 if mode == "burst" else 0.2)
                print(f"{n:>6} {mode:>9} {m['latency_s']:>10.3f} {target:>9.1f} {m['reads']:>6.0f} "
                      f"{m['full_looks']:>10.0f} "
                      f"{m['first_look_s']:>13.1f} {m['overflows']:>10.0f} {m['gc_s']:>6.3f} {m['gc_full']:>7.0f} "
                      f"{m['update_s']:>13.3f} {m['cpu_after_s']:>11.3f} {m['cpu_per_marker_ms']:>13.3f} "
                      f"{os.getloadavg()[0]:>8.2f}", flush=True)
            if args.cost:
                skip = WatchSettings().poll_skip_dirs
                listings = (("whole tree", pruned_scandir(()), None),
                            ("completion listing, every rank dir each poll", completion_scandir(skip), None),
                            (f"as ProfWatcher polls (at most {args.poll_max_listings} re-listed a poll)",
                             completion_scandir(skip), args.poll_max_listings))
                for label, listing, bound in listings:
                    cpu, calls_s, per_poll = measure_polling_cost(prof, args.poll_interval_s, args.cost_window_s,
                                                                  listing, bound)
                    print(f"  polling cost at {n} rank dirs, {label} (interval {args.poll_interval_s:g} s): "
                          f"{cpu:.3f} CPU s per wall s, {calls_s:.0f} stat/scandir calls per s ({per_poll} per "
                          f"poll); tree built in {build_s:.0f} s", flush=True)
            if not args.tree:
                shutil.rmtree(prof, ignore_errors=True)


if __name__ == "__main__":
    main()
