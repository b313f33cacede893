"""Incremental completeness on real folders with real watchdog observers: an event reads only the rank dir it
names, an inotify overflow triggers one reconcile pass that still completes the batch, a pass is bounded in time
and resumes, and a name an event gives is read only when a full walk would have found it."""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from watchdog.observers.api import BaseObserver

from profwatch.adapters.fs.incremental_scan import IncrementalScan
from profwatch.adapters.fs.prof_watch import ProfWatcher, make_inotify_observer
from profwatch.core.batches.completeness import BatchState, CaptureHint
from profwatch.core.batches.prof_layout import OUTPUT_MARKER
from profwatch.core.batches.settings import WatchSettings
from profwatch.simulate import ascend_tree as gen
from tests.conftest import wait_for

EARLY = gen.DEFAULT_TS_BASE_NS / 1e9 + 30  # "now" for the scans: before the deadline, inside the quiet period
FAST = {"poll_interval_s": 0.1, "supervise_interval_s": 0.05, "reconcile_interval_s": 3600.0}


class Driver:
    """The watcher's callbacks over one IncrementalScan, as the capture shell uses it (one scan at a time; a full
    look runs its pass to the end)."""

    def __init__(self, scan: IncrementalScan, world: int, hint: CaptureHint | None = None) -> None:
        self.scan, self.world, self.hint = scan, world, hint
        self.lock = threading.Lock()
        self.named: list[frozenset[str]] = []
        self.status: str | None = None

    def _update(self, rank_dirs: frozenset[str] | None) -> None:
        out = self.scan.update(rank_dirs, capture_id="cap", world_size=self.world, hint=self.hint)
        self._keep(out)
        while self.scan.reconciling:
            self._keep(self.scan.update((), capture_id="cap", world_size=self.world, hint=self.hint))

    def _keep(self, batches: list[BatchState] | None) -> None:
        if batches is not None:
            self.status = next((b.status for b in batches if b.capture_id == "cap"), None)

    def on_wake(self, prof_dir: str) -> None:
        with self.lock:
            self._update(None)

    def on_rank_dirs(self, prof_dir: str, rank_dirs: frozenset[str]) -> None:
        with self.lock:
            self.named.append(rank_dirs)
            self._update(rank_dirs)

    def snapshot(self) -> tuple[int, list[frozenset[str]]]:
        with self.lock:
            return self.scan.reader.reads, list(self.named)


def _marker(d: Path) -> Path:
    return d / "ASCEND_PROFILER_OUTPUT" / "analyse.done"


@pytest.mark.parametrize("observer", ["inotify", "polling"])
def test_an_event_reads_only_the_rank_dir_it_names(tmp_path: Path, observer: str) -> None:
    prof = tmp_path / "prof"
    dirs = gen.generate_cluster(prof, world_size=8, capture_id="cap", with_marker=False)
    settings = WatchSettings(observer=observer, **FAST)  # type: ignore[arg-type]
    drv = Driver(IncrementalScan(prof, settings=settings, wall=lambda: EARLY), world=8)
    with ProfWatcher(drv.on_wake, settings=settings, on_rank_dirs=drv.on_rank_dirs) as w:
        w.watch(prof)
        wait_for(lambda: drv.snapshot()[0] == 8 and drv.status == "parsing", 20, what="first pass read all 8")
        reads0, named0 = drv.snapshot()
        _marker(dirs[3]).touch()
        wait_for(lambda: len(drv.snapshot()[1]) > len(named0), 20, what="the event delivered")
        reads, named = drv.snapshot()
        new = named[len(named0):]
        assert all(n == frozenset({str(dirs[3])}) for n in new)  # only the rank dir the marker landed in
        assert reads - reads0 == len(new)  # one read of that dir per delivery, none of the other seven
        assert drv.status == "parsing" and drv.scan.tracker.passes == 1
        for d in dirs[:3] + dirs[4:]:
            _marker(d).touch()
        wait_for(lambda: drv.status == "complete", 20, what="complete from events alone")
        assert drv.scan.tracker.passes == 1  # no full look was needed
        assert w.stats.rank_dirs_named >= 8


def test_an_overflow_triggers_one_reconcile_that_completes_the_batch(tmp_path: Path) -> None:
    """The last rank finishes without any event reaching us (an older torch_npu writes no marker; its outputs fall
    quiet, which no inotify event reports): only the reconcile pass the overflow asks for can see it."""

    prof = tmp_path / "prof"
    dirs = gen.generate_cluster(prof, world_size=4, capture_id="cap")
    _marker(dirs[3]).unlink()  # rank 3: parsed by the quiet-period fallback, once its outputs are old enough
    observers: list[BaseObserver] = []

    def factory(mode: str, on_overflow: Callable[[], None]) -> BaseObserver:
        obs = make_inotify_observer(on_overflow)
        observers.append(obs)
        return obs

    settings = WatchSettings(observer="inotify", quiet_period_s=60, **FAST)  # type: ignore[arg-type]
    hint = CaptureHint(world_size=4, deadline_unix_s=time.time() + 3600)
    drv = Driver(IncrementalScan(prof, settings=settings), world=4, hint=hint)
    with ProfWatcher(drv.on_wake, settings=settings, on_rank_dirs=drv.on_rank_dirs, observer_factory=factory) as w:
        w.watch(prof)
        wait_for(lambda: drv.status == "parsing" and not drv.scan.reconciling, 20, what="first pass")
        out = dirs[3] / "ASCEND_PROFILER_OUTPUT"
        old = time.time() - 3600
        for f in out.iterdir():  # an attribute change: no event the watcher listens to
            os.utime(f, (old, old))
        os.utime(out, (old, old))
        observers[0].simulate_overflow()  # type: ignore[attr-defined]
        wait_for(lambda: drv.status == "complete", 20, what="complete after the overflow's reconcile")
        assert w.stats.overflows == 1
        assert drv.scan.tracker.passes == 2  # the first look, and the one reconcile the overflow asked for
        assert w.stats.rank_dir_wakes == 0  # no event named a rank dir: the reconcile found it


def test_a_reconcile_pass_is_bounded_and_resumes(tmp_path: Path) -> None:
    prof = tmp_path / "prof"
    dirs = gen.generate_cluster(prof, world_size=12, capture_id="cap")
    ticks = itertools.count()  # the clock moves one second each time the scan looks at it

    scan = IncrementalScan(prof, settings=WatchSettings(reconcile_slice_s=2.5), clock=lambda: float(next(ticks)),
                           wall=lambda: EARLY)
    per_call: list[int] = []
    results: list[list[BatchState] | None] = []

    def call(rank_dirs: frozenset[str] | None) -> None:
        before = scan.reader.reads
        results.append(scan.update(rank_dirs, capture_id="cap", world_size=12))
        per_call.append(scan.reader.reads - before)

    call(None)
    assert scan.reconciling and per_call == [3]  # one slice: 2.5 s of budget, 1 s per read
    call(frozenset({str(dirs[-1])}))  # an event meanwhile: read at once, then the pass resumes
    while scan.reconciling:
        call(frozenset())
    assert max(per_call) <= 4 and len(per_call) >= 4
    assert scan.reader.reads == 12  # every dir once: the pass skipped the one the event had read
    final = results[-1]
    assert final is not None and [b.status for b in final] == ["complete"]


def test_a_name_from_an_event_is_read_only_where_a_walk_would_find_it(tmp_path: Path) -> None:
    prof = tmp_path / "prof"
    (real,) = gen.generate_cluster(tmp_path / "elsewhere", world_size=1, capture_id="cap")
    prof.mkdir()
    link = prof / real.name
    link.symlink_to(real)  # a rank dir name that is a symlink: never followed
    staged = prof / "staging"
    staged.mkdir()
    (staged / OUTPUT_MARKER).touch()
    (copy,) = gen.generate_cluster(staged, world_size=1, capture_id="cap")  # inside profwatch's own output
    (deep,) = gen.generate_cluster(prof / "a" / "b", world_size=1, capture_id="cap")
    scan = IncrementalScan(prof, settings=WatchSettings(scan_max_depth=5), wall=lambda: EARLY)
    out = scan.update(frozenset({str(link), str(copy), str(deep)}), capture_id="cap", world_size=1)
    assert scan.reader.reads == 1 and len(scan.tracker) == 1
    assert out is not None and [b.status for b in out] == ["complete"] and out[0].rank_dirs == {0: str(deep)}


def test_a_pass_over_a_batch_that_stays_undecided_still_ends(tmp_path: Path) -> None:
    """Every rank finished but two dirs claim ranks 0 and 1 (invalid, never complete): each resumed slice reads
    on and the pass ends with every batch, rather than answering the same decision again and again."""
    prof = tmp_path / "prof"
    gen.generate_cluster(prof, world_size=4, capture_id="cap")
    gen.generate_cluster(prof, world_size=2, capture_id="cap", ts_base=gen.DEFAULT_TS_BASE_NS + 5_000_000_000)
    ticks = itertools.count()
    scan = IncrementalScan(prof, settings=WatchSettings(reconcile_slice_s=1.5), clock=lambda: float(next(ticks)),
                           wall=lambda: EARLY)
    out = scan.update(None, capture_id="cap", world_size=4)
    calls = 1
    while scan.reconciling and calls < 20:
        out = scan.update((), capture_id="cap", world_size=4)
        calls += 1
    assert not scan.reconciling and scan.reader.reads == 6
    assert out is not None and [b.status for b in out] == ["invalid"]
