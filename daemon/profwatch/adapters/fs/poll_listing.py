"""The polling observer with bounded work per wake (I/O adapter; docs/rank-dirs.md#polling-bound).

watchdog's ``PollingObserverVFS`` takes a whole snapshot every poll: with ``completion_scandir`` that is about four
stat/scandir calls per rank dir (4,096 rank dirs: ~18,400 calls, ~0.3 CPU-s per wake). Here each watched tree gets
a :class:`BoundedPollListing` between the snapshot and the file system. Every poll still lists the folders above
rank dirs and stats every rank dir (new and vanished rank dirs are seen at once), and stats each rank dir's
``ASCEND_PROFILER_OUTPUT/`` (``analyse.done`` lands there and changes its mtime). A rank dir itself is re-listed
(scandir, then a stat of each entry the listing keeps) only when

- it is new, or its own inode or mtime changed (an entry was created, removed or renamed in it: ``trace.done``,
  ``profiler_metadata.json``, ``ASCEND_PROFILER_OUTPUT/`` appearing or going),
- its last look saw it change (a listing that differed, or its ``ASCEND_PROFILER_OUTPUT/`` mtime moved): a rank
  still writing or parsing, re-listed every poll until a listing shows it quiet,
- or rotation makes it due (``core/batches/poll_rotation.py``): at most ``max_listings`` rank dirs a poll, each at
  least every ``ceil(rank dirs / max_listings)`` polls.

The others are served from their last listing (entries and stats cached) and counted as deferred. What that costs:
a change that moves neither the rank dir's mtime nor its ``ASCEND_PROFILER_OUTPUT/``'s (a file rewritten in place,
e.g. ``profiler_info_*.json`` growing) is seen within ``ceil(rank dirs / max_listings)`` polls instead of one. A
client that caches directory attributes (NFS ``acdirmin``/``acdirmax``, 30-60 s by default; Lustre until its lock
on the folder is revoked) shows another host's marker in the folder's mtime only when they expire; the same cache
delays a listing of that folder too, so the bound adds at most the rotation period to what the cache hides, and
the reconciliation scan (``watch.reconcile_interval_s``) reads every rank dir regardless
(docs/rank-dirs.md#polling-bound).
"""

from __future__ import annotations

import os
import stat as stat_mod
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

from watchdog.observers.api import DEFAULT_EMITTER_TIMEOUT, BaseObserver, EventQueue, ObservedWatch
from watchdog.observers.polling import PollingEmitter

from profwatch.core.batches.poll_rotation import relist_period, rotation_due
from profwatch.core.batches.prof_layout import PROFILER_OUTPUT_DIR, parse_rank_dir_name

__all__ = ["BoundedPollListing", "BoundedPollingObserver"]

StatFn = Callable[[str], os.stat_result]
ListdirFn = Callable[[str | None], Iterator[os.DirEntry[str]]]


@dataclass(frozen=True, slots=True)
class _Name:
    """A cached listing entry: the snapshot's walk reads only ``name``."""

    name: str


@dataclass(slots=True)
class _RankDir:
    slot: int
    key: tuple[int, int, int] | None = None  # (st_ino, st_dev, st_mtime_ns) of the rank dir when last listed
    stats: dict[str, os.stat_result] = field(default_factory=dict)  # entry path -> its stat at the last listing
    seen: int = 0  # the poll that last reached it
    active: bool = True  # its last look saw it change: re-list at the next poll


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_ino, a.st_dev, a.st_mtime_ns, a.st_size, a.st_mode) == \
        (b.st_ino, b.st_dev, b.st_mtime_ns, b.st_size, b.st_mode)


class BoundedPollListing:
    """``stat`` and ``listdir`` for one polling snapshot of ``root`` that re-list at most ``max_listings`` rank
    dirs per poll by rotation (see the module docstring for what else is re-listed and what the bound costs).

    ``stat``/``listdir``: the real calls (``listdir`` filters as ``prof_watch.completion_scandir`` does; the
    snapshot's walk reads only ``.name`` of what it yields). A poll starts when the snapshot lists ``root``; use
    from one thread (the emitter's). ``on_deferred(n)``: told, when the next poll starts, how many rank dirs the
    poll before served from their cache. ``deferred_total``, ``relisted_total``, ``polls``: counters.

    Raises:
        ValueError: ``max_listings`` < 1.
    """

    def __init__(self, root: str, max_listings: int, *, stat: StatFn = os.stat, listdir: ListdirFn,
                 on_deferred: Callable[[int], None] | None = None) -> None:
        relist_period(0, max_listings)  # validates
        self.root = root
        self.max_listings = max_listings
        self._stat = stat
        self._listdir = listdir
        self._on_deferred = on_deferred
        self._known: dict[str, _RankDir] = {}
        self._next_slot = 0
        self._dir_stats: dict[str, os.stat_result] = {}  # this poll's stats of folders, until they are listed
        self._filling: dict[str, tuple[_RankDir, dict[str, os.stat_result]]] = {}  # re-listed now: (dir, old stats)
        self._serving: dict[str, _RankDir] = {}  # served from the cache this poll
        self._deferred_now = 0
        self.polls = 0
        self.deferred_total = 0
        self.relisted_total = 0

    # -- the two calls the snapshot makes -----------------------------------------------------------------------
    def stat(self, path: str) -> os.stat_result:
        """``stat(path)`` for the snapshot: an entry of a rank dir served from its cache gets its cached stat (its
        ``ASCEND_PROFILER_OUTPUT/`` is always stat'ed for real).

        Raises:
            OSError: as ``stat`` (the snapshot drops the entry).
        """
        parent = os.path.dirname(path)
        served = self._serving.get(parent)
        if served is not None:
            if os.path.basename(path) != PROFILER_OUTPUT_DIR:
                return served.stats[path]
            st = self._stat(path)  # raises when it went: the snapshot reports it deleted
            old = served.stats.get(path)
            if old is None or not _same(old, st):
                served.stats[path] = st
                served.active = True
            return st
        st = self._stat(path)
        filling = self._filling.get(parent)
        if filling is not None:
            rank_dir, old_stats = filling
            rank_dir.stats[path] = st
            old = old_stats.get(path)
            if old is None or not _same(old, st):
                rank_dir.active = True
        elif stat_mod.S_ISDIR(st.st_mode):
            self._dir_stats[path] = st
        return st

    def listdir(self, path: str | None) -> Iterator[os.DirEntry[str]]:
        """The entries of ``path`` for the snapshot: real below and above rank dirs, a rank dir's cached ones when
        it is not re-listed this poll. Listing ``root`` starts a poll.

        Raises:
            OSError: as ``listdir``.
        """
        here = os.fspath(path or ".")
        if here == self.root:
            self._start_poll()
            return self._listdir(path)
        st = self._dir_stats.pop(here, None)
        if parse_rank_dir_name(os.path.basename(here)) is None:
            return self._listdir(path)
        rank_dir = self._known.get(here)
        if rank_dir is None:
            rank_dir = self._known[here] = _RankDir(slot=self._next_slot)
            self._next_slot += 1
        rank_dir.seen = self.polls
        key = None if st is None else (st.st_ino, st.st_dev, st.st_mtime_ns)
        if key is not None and key == rank_dir.key and not rank_dir.active and not rotation_due(
                self.polls, rank_dir.slot, relist_period(self._next_slot, self.max_listings)):
            self._serving[here] = rank_dir
            self._deferred_now += 1
            self.deferred_total += 1
            return cast("Iterator[os.DirEntry[str]]", iter([_Name(os.path.basename(p)) for p in rank_dir.stats]))
        entries = list(self._listdir(path))  # raises before anything changed: the snapshot keeps the old one
        old = rank_dir.stats
        rank_dir.key, rank_dir.stats, rank_dir.active = key, {}, key is None
        if len(entries) != len(old) or any(os.path.join(here, e.name) not in old for e in entries):
            rank_dir.active = True
        self._filling[here] = (rank_dir, old)
        self.relisted_total += 1
        return iter(entries)

    # -- internals ------------------------------------------------------------------------------------------------
    def _start_poll(self) -> None:
        """Forget the last poll's per-poll state and the rank dirs it did not reach; compact slots when half are
        holes (the period follows the slots)."""
        if self._on_deferred is not None and self._deferred_now:
            self._on_deferred(self._deferred_now)
        self._deferred_now = 0
        self._dir_stats.clear()
        self._filling.clear()
        self._serving.clear()
        last = self.polls
        self.polls += 1
        if self.polls > 1:
            gone = [p for p, d in self._known.items() if d.seen < last]
            for p in gone:
                del self._known[p]
        if len(self._known) * 2 < self._next_slot:
            for i, d in enumerate(sorted(self._known.values(), key=lambda d: d.slot)):
                d.slot = i
            self._next_slot = len(self._known)


class BoundedPollingObserver(BaseObserver):
    """watchdog's polling observer with one :class:`BoundedPollListing` per watched tree (each watch has its own
    emitter thread). ``listdir`` builds the real listing (``prof_watch.completion_scandir``); ``stat`` and
    ``on_deferred`` go to every listing (``on_deferred`` from the emitter threads)."""

    def __init__(self, *, listdir: ListdirFn, max_listings: int, polling_interval: float,
                 stat: StatFn = os.stat, on_deferred: Callable[[int], None] | None = None) -> None:
        relist_period(0, max_listings)  # validates before any thread
        self._listings_lock = threading.Lock()
        self.listings: dict[str, BoundedPollListing] = {}
        """watched path -> its listing (the latest emitter's), for tests and benches."""

        def emitter(event_queue: EventQueue, watch: ObservedWatch, *, timeout: float = DEFAULT_EMITTER_TIMEOUT,
                    **kwargs: Any) -> PollingEmitter:
            listing = BoundedPollListing(watch.path, max_listings, stat=stat, listdir=listdir,
                                         on_deferred=on_deferred)
            with self._listings_lock:
                self.listings[watch.path] = listing
            return PollingEmitter(event_queue, watch, timeout=timeout, stat=listing.stat, listdir=listing.listdir,
                                  **kwargs)

        super().__init__(emitter, timeout=polling_interval)  # type: ignore[arg-type]
