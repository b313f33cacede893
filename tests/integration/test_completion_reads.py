"""What a rank dir read costs when its marker lands, and that the cheaper read still sees every change:
``IncrementalScan`` keeps each folder's listing (``rank_dir_fs.ListingCache``) under the folder's (dev, inode,
mtime, ctime) once it has settled (``LISTING_SETTLE_S``), and confirms a dir it confirmed before with one ``lstat``. Real folders,
real inotify observer; the ``scandir`` calls are counted by wrapping the real one."""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from profwatch.adapters.fs import rank_dir_fs
from profwatch.adapters.fs.incremental_scan import IncrementalScan
from profwatch.adapters.fs.prof_watch import ProfWatcher
from profwatch.adapters.fs.rank_dir_fs import LISTING_SETTLE_S, ListingCache, RankDirReader
from profwatch.core.batches.completeness import NO_DEVICE_DATA, BatchState
from profwatch.core.batches.settings import WatchSettings
from profwatch.simulate import ascend_tree as gen
from tests.conftest import wait_for

EARLY = gen.DEFAULT_TS_BASE_NS / 1e9 + 30  # "now" for the completeness rules: before the deadline
PROF = "PROF_000001_20260101120000000_TEST"
FAST = {"poll_interval_s": 0.1, "supervise_interval_s": 0.05, "reconcile_interval_s": 3600.0}


def _settled() -> float:
    """A reader clock far enough ahead that every folder created by the test counts as settled."""
    return time.time() + LISTING_SETTLE_S + 60


def _cluster(root: Path, world: int = 4) -> list[Path]:
    dirs = gen.generate_cluster(root, world_size=world, capture_id="cap", with_marker=False, minimal=True)
    for d in dirs:  # raw data as torch_npu leaves it: PROF_*/device_0 with data, PROF_*/host
        (d / PROF / "device_0" / "data").mkdir(parents=True)
        (d / PROF / "host" / "data").mkdir(parents=True)
    return dirs


def _marker(d: Path) -> Path:
    return d / "ASCEND_PROFILER_OUTPUT" / "analyse.done"


class _Listings:
    """Counts the real ``os.scandir`` calls per path (every thread), under a lock."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[str] = []
        self._lock = threading.Lock()
        real = os.scandir

        def counted(path: object = ".") -> Iterator[os.DirEntry[str]]:
            with self._lock:
                self.calls.append(os.fsdecode(path) if isinstance(path, (str, bytes)) else str(path))
            return real(path)  # type: ignore[call-overload]

        monkeypatch.setattr(rank_dir_fs.os, "scandir", counted)

    def below(self, d: Path) -> list[str]:
        with self._lock:
            return [c for c in self.calls if c == str(d) or c.startswith(f"{d}/")]


def _status(batches: list[BatchState] | None) -> BatchState | None:
    return next((b for b in batches or [] if b.capture_id == "cap"), None)


def test_a_marker_read_lists_only_the_folder_it_landed_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: a marker's read listed the rank dir, PROF_*, PROF_*/device_0 and ASCEND_PROFILER_OUTPUT (and
    walked its path up to the root again); now only ASCEND_PROFILER_OUTPUT, whose mtime the marker moved."""
    prof = tmp_path / "prof"
    dirs = _cluster(prof)
    settings = WatchSettings(observer="inotify", **FAST)
    scan = IncrementalScan(prof, settings=settings, listings=ListingCache(wall=_settled), wall=lambda: EARLY)
    lock = threading.Lock()
    seen: list[BatchState | None] = []

    def run(rank_dirs: frozenset[str] | None) -> None:
        with lock:
            seen.append(_status(scan.update(rank_dirs, capture_id="cap", world_size=4)))
            while scan.reconciling:
                seen.append(_status(scan.update((), capture_id="cap", world_size=4)))

    listings = _Listings(monkeypatch)
    with ProfWatcher(lambda p: run(None), settings=settings, on_rank_dirs=lambda p, ds: run(ds)) as w:
        w.watch(prof)
        wait_for(lambda: scan.reader.reads >= 4 and not scan.reconciling, 20, what="the first pass")
        reads0, before = scan.reader.reads, len(listings.below(dirs[1]))
        assert before >= 4  # the first read listed the rank dir, PROF_*, device_0, host and the output folder
        _marker(dirs[1]).touch()
        wait_for(lambda: scan.reader.reads > reads0, 20, what="the marker's read")
        with lock:
            assert listings.below(dirs[1])[before:] == [str(dirs[1] / "ASCEND_PROFILER_OUTPUT")]
            assert scan.tracker.state(str(dirs[1])).state == "parsed"  # type: ignore[union-attr]
        for d in dirs[:1] + dirs[2:]:
            _marker(d).touch()
        wait_for(lambda: any(b is not None and b.status == "complete" for b in seen), 20, what="complete")
    assert w.stats.wakes == 1  # the first look only: the markers' reads completed the batch


def test_changes_below_cached_listings_are_still_seen(tmp_path: Path) -> None:
    """A settled listing is served from the cache only while its folder's (dev, inode, mtime, ctime) stands: a
    device dir emptied (its mtime then set back to the old value: the ctime still moves), a profiler_info rewritten
    in place and a DB damaged in place are each caught by the marker's read, with their reason."""
    prof = tmp_path / "prof"
    dirs = _cluster(prof, world=4)
    scan = IncrementalScan(prof, listings=ListingCache(wall=_settled), wall=lambda: EARLY)
    scan.update(None, capture_id="cap", world_size=4)
    while scan.reconciling:
        scan.update((), capture_id="cap", world_size=4)
    listed = scan.reader.listings

    dev = dirs[0] / PROF / "device_0"
    st = os.stat(dev)
    shutil.rmtree(dev / "data")
    os.utime(dev, ns=(st.st_atime_ns, st.st_mtime_ns))  # the mtime as it was (rsync -t, cp -p do this)
    assert os.stat(dev).st_mtime_ns == st.st_mtime_ns
    info = dirs[1] / "profiler_info_1.json"
    info.write_text(info.read_text().replace('"rank_id": 1', '"rank_id": 5'))  # rewritten in place
    db = dirs[2] / "ASCEND_PROFILER_OUTPUT" / "ascend_pytorch_profiler_2.db"
    with open(db, "r+b") as fh:  # damaged in place: the header's magic overwritten
        fh.write(b"not sqlite at all")
    for d in dirs:
        _marker(d).touch()
    b = _status(scan.update(frozenset(str(d) for d in dirs), capture_id="cap", world_size=4))
    assert b is not None and b.status != "complete"
    reasons = {r: b.ranks[r].reasons for r in range(4) if r in b.ranks}
    assert any(NO_DEVICE_DATA in why and "device_0 empty" in why for why in reasons[0]), reasons
    assert any("says rank_id 5" in why for why in reasons[1]), reasons
    assert any("damaged" in why and "ascend_pytorch_profiler_2.db" in why for why in reasons[2]), reasons
    assert b.ranks[3].state == "parsed"
    # re-listed: four output folders, rank 0's device_0 (its ctime moved); every other folder from the cache
    assert scan.reader.listings - listed == 5


def test_a_listing_is_kept_only_once_settled_and_without_symlinks(tmp_path: Path) -> None:
    (d,) = _cluster(tmp_path / "prof", world=1)
    reader = RankDirReader()

    def listed(cache: ListingCache | None) -> int:
        before = reader.listings
        assert reader.read(str(d), listings=cache) is not None
        return reader.listings - before

    fresh = ListingCache()  # the real clock: everything here was just created, nothing has settled
    assert listed(fresh) == listed(fresh) == 5  # the rank dir, PROF_*, device_0, host, ASCEND_PROFILER_OUTPUT
    assert len(fresh) == 0  # a change in the same timestamp tick would be invisible: nothing kept
    settled = ListingCache(wall=_settled)
    assert listed(settled) == 5 and len(settled) == 5
    assert listed(settled) == 0
    obs = reader.read(str(d), listings=settled)
    assert obs is not None and obs.device_dirs == (f"{PROF}/device_0",) and obs.output_dir

    os.symlink(d / PROF, d / "PROF_000002_20260101120000000_LINK")  # a symlinked PROF_ dir: never kept
    assert listed(settled) == 1  # the rank dir moved; it now holds a symlink
    assert listed(settled) == 1  # ... so it is listed on every read
    assert listed(None) == listed(None) == 5  # no cache: every folder every read (profwatch scan)

    small = ListingCache(wall=_settled, max_entries=3)  # bounded: past the bound it starts over
    listed(small)
    assert len(small) <= 3
    shutil.rmtree(d)
    assert reader.read(str(d), listings=settled) is None and str(d) not in {p for p in settled._entries}  # noqa: SLF001


def test_a_rank_dir_replaced_after_it_was_confirmed_is_confirmed_again(tmp_path: Path) -> None:
    """The one-lstat confirmation holds only for the folder confirmed (same device and inode): a rank dir replaced
    by a symlink (not followed, as find_rank_dirs does not) drops out; one recreated as a new folder is read."""
    prof = tmp_path / "prof"
    dirs = _cluster(prof, world=2)
    for d in dirs:
        _marker(d).touch()
    scan = IncrementalScan(prof, listings=ListingCache(wall=_settled), wall=lambda: EARLY)
    scan.update(None, capture_id="cap", world_size=2)
    while scan.reconciling:
        scan.update((), capture_id="cap", world_size=2)
    assert scan.tracker.count("cap") == 2
    moved = tmp_path / "elsewhere" / dirs[1].name
    moved.parent.mkdir()
    dirs[1].rename(moved)
    os.symlink(moved, dirs[1])
    b = _status(scan.update(frozenset({str(dirs[1])}), capture_id="cap", world_size=2))
    assert scan.tracker.state(str(dirs[1])) is None and scan.tracker.count("cap") == 1
    os.unlink(dirs[1])
    shutil.copytree(moved, dirs[1])
    b = _status(scan.update(frozenset({str(dirs[1])}), capture_id="cap", world_size=2))
    assert b is not None and b.status == "complete"
