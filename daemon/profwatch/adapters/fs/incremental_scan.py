"""Keeps the rank dirs under one prof_dir read one rank dir at a time, and reconciles in bounded, resumable passes
(I/O adapter over ``daemon/profwatch/core/batches/tracker.py``).

A watch event names a rank dir (``ProfWatcher``'s ``on_rank_dirs``): :meth:`IncrementalScan.update` reads only
that dir (``RankDirReader.read``, DB checks cached by size and mtime) and answers the capture's batch as soon as
the counts say it can be decided, without walking the tree. A full look (start, inotify overflow, observer
restart, the reconcile timer) walks the tree once (``find_rank_dirs``, names only) and reads the planned dirs in
slices of at most ``WatchSettings.reconcile_slice_s``; ``reconciling`` stays true until the pass has read them
all, and each later call resumes it. Completion is always decided from files read, never from an event
(docs/field-cases.md#fc-18). Each update tells the process's ``GcFreezer`` how many dirs it read, so a big tree's
long-lived state stays out of full garbage collections (``profwatch/adapters/gc_freeze.py``).
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable, Collection

import structlog

from profwatch.adapters.fs.rank_dir_fs import (
    ListingCache,
    RankDirReader,
    add_walk_notes,
    confirm_rank_dir,
    find_rank_dirs,
)
from profwatch.adapters.gc_freeze import GC_FREEZER, GcFreezer
from profwatch.core.batches.completeness import BatchState, CaptureHint, evaluate_rank_dir
from profwatch.core.batches.settings import WatchSettings
from profwatch.core.batches.tracker import RankDirTracker, expected_count

log = structlog.get_logger(__name__)


class IncrementalScan:
    """The rank dirs below ``root`` (a prof_dir), read incrementally. Use from one thread.

    ``reader``: a long-lived :class:`RankDirReader` (shared DB-check cache); ``clock``: monotonic seconds (slice
    budget); ``wall``: unix seconds (deadlines, the quiet period of older torch_npu); ``gc_freezer``: told of every
    update's reads, so a big tree's long-lived state is frozen out of full collections
    (``profwatch/adapters/gc_freeze.py``; None: never); ``listings``: this tree's folder listings, kept between
    reads (``rank_dir_fs.ListingCache``, its own clock; default: a new one), so a marker's read lists only the
    folder it landed in.
    """

    def __init__(self, root: str | os.PathLike[str], *, settings: WatchSettings | None = None,
                 reader: RankDirReader | None = None, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time, gc_freezer: GcFreezer | None = GC_FREEZER,
                 listings: ListingCache | None = None) -> None:
        self.root = os.path.abspath(os.fspath(root))
        self.settings = settings or WatchSettings()
        self.reader = reader or RankDirReader()
        self.listings = listings if listings is not None else ListingCache()
        self.tracker = RankDirTracker()
        self._clock = clock
        self._wall = wall
        self._gc = gc_freezer
        self._walk_errors: list[str] = []
        self._skipped: list[str] = []
        self._pass_ended = False
        self._listed = 0  # rank dirs the last full look listed (the tree's size before the pass has read them)
        self._confirmed: dict[str, tuple[int, int]] = {}  # rank dir -> (st_dev, st_ino) when confirm_rank_dir held

    @property
    def tree_dirs(self) -> int:
        """The tree's size in rank dirs: those the last full look listed, or those read, whichever is more (a pass
        reads its listed dirs over several slices; counting only those read so far undercounts a big tree)."""
        return max(self._listed, len(self.tracker))

    @property
    def reconciling(self) -> bool:
        """True while a reconcile pass has rank dirs left: call :meth:`update` with ``rank_dirs=()`` to resume it."""
        return self.tracker.reconciling

    def update(self, rank_dirs: Collection[str] | None, *, capture_id: str | None = None,
               world_size: int | None = None, hint: CaptureHint | None = None) -> list[BatchState] | None:
        """Read what changed and answer the batches when a decision about ``capture_id``'s batch is possible.

        ``rank_dirs``: the rank dirs events named (each read, in path order, once), ``()`` to resume a pass in
        progress, or None for a full look (walk the tree; a new pass replaces the one in progress). Returns the
        batches ``lifecycle.pick_batch`` picks from (exact: as ``scan_tree`` would decide them from the same
        reads) when the batch got its first dir, when every expected rank has a dir and none is pending
        (``RankDirTracker.ready``: after event reads whenever it holds, within a pass when the pass made it
        hold; the slice stops there), or when a pass has just read its last dir (then every batch); else None
        ("nothing to decide yet"). Event reads that make a decision possible return before any slice.

        Raises:
            TreeUnavailable: a full look cannot list ``root`` (its ranks are unknown, not deleted).
        """
        reads = self.tracker.reads
        if rank_dirs is None and self._gc is not None:
            self._gc.before_full_look(tree_dirs=self.tree_dirs)
        try:
            return self._update(rank_dirs, capture_id, world_size, hint)
        finally:
            if self._gc is not None:
                self._gc.after_reads(self.tracker.reads - reads, tree_dirs=self.tree_dirs,
                                     pass_ended=self._pass_ended)

    def _update(self, rank_dirs: Collection[str] | None, capture_id: str | None, world_size: int | None,
                hint: CaptureHint | None) -> list[BatchState] | None:
        self._pass_ended = False
        s = self.settings
        expected = expected_count(world_size, hint)
        before = self.tracker.count(capture_id)
        ready_before = self.tracker.ready(capture_id, expected)
        now = self._wall()
        if rank_dirs is None:
            skipped: list[str] = []
            paths, errors = find_rank_dirs(self.root, max_depth=s.scan_max_depth, notes=skipped)
            for e in errors:
                log.warning("scan_walk_error", error=e)
            self._walk_errors, self._skipped = errors, skipped
            self._listed = len(paths)
            self._confirmed.clear()  # a full look confirms every dir again (bounds the map by the tree)
            self.tracker.begin_pass(paths)
        else:
            for changed in sorted(rank_dirs):
                self._read(changed, now)
            if rank_dirs and self._decidable(capture_id, expected, before):
                return self._batch_of(capture_id, now, world_size, hint)  # the events alone: no slice first
        if not self.tracker.reconciling:
            return None
        end = self._clock() + s.reconcile_slice_s
        while True:
            path = self.tracker.next_to_read()
            if path is None:  # the pass is over: every batch, decided on what it read
                self.tracker.end_pass()
                self._pass_ended = True
                batches = self.tracker.batches(now_unix_s=now, settings=s, world_size=world_size,
                                               hints={capture_id: hint} if capture_id and hint else None)
                add_walk_notes(batches, self._walk_errors, self._skipped)
                return batches
            self._read(path, now)
            if not ready_before and self.tracker.ready(capture_id, expected):  # O(1): decidable now, stop here
                return self._batch_of(capture_id, now, world_size, hint)
            if self._clock() >= end:
                break
        return self._batch_of(capture_id, now, world_size, hint) if before == 0 < self.tracker.count(capture_id) \
            else None

    def _decidable(self, capture_id: str | None, expected: int | None, before: int) -> bool:
        return self.tracker.ready(capture_id, expected) or (before == 0 and self.tracker.count(capture_id) > 0)

    def _batch_of(self, capture_id: str | None, now: float, world_size: int | None,
                  hint: CaptureHint | None) -> list[BatchState]:
        batches = self.tracker.batch_of(capture_id, now_unix_s=now, settings=self.settings, world_size=world_size,
                                        hint=hint)
        add_walk_notes(batches, self._walk_errors, self._skipped)
        return batches

    def _read(self, path: str, now: float) -> None:
        """Read one rank dir into the tracker (gone, or not a rank dir ``find_rank_dirs`` would find: dropped).

        A dir confirmed since the last full look (``confirm_rank_dir``: one ``lstat`` per folder level and a look
        for profwatch's output marker) is confirmed again by one ``lstat`` showing the same folder (device and
        inode); that stat also validates the kept listing of the dir (``listings``)."""
        path = os.path.abspath(path)
        st = self._confirmed_stat(path) if path in self._confirmed else None
        if st is None:
            if not confirm_rank_dir(self.root, path, self.settings.scan_max_depth):
                self.tracker.update(path, None)
                return
            st = self._confirmed_stat(path, remember=True)
        obs = self.reader.read(path, listings=self.listings, st=st)
        self.tracker.update(path, None if obs is None else evaluate_rank_dir(obs, now_unix_s=now,
                                                                             settings=self.settings))

    def _confirmed_stat(self, path: str, *, remember: bool = False) -> os.stat_result | None:
        """``path``'s ``lstat`` when it is the folder confirmed before (``remember``: just confirmed, record it);
        else None (also when it cannot be stat'ed: the reader then says why)."""
        try:
            st = os.lstat(path)
        except OSError:
            self._confirmed.pop(path, None)
            return None
        ident = (st.st_dev, st.st_ino)
        if not stat.S_ISDIR(st.st_mode):
            self._confirmed.pop(path, None)
            return None
        if remember:
            self._confirmed[path] = ident
            return st
        return st if self._confirmed.get(path) == ident else None
