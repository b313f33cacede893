"""Keeps CPython's cyclic garbage collector off the long-lived state of big rank dir trees (process-wide; the
interpreter's ``gc`` module is the I/O here).

The tracker of a 16,384-rank tree holds ~260k container objects (rank dir states, observations, DB-check cache
entries) that live as long as the tree is watched. A full collection traverses every one of them (~0.16 s at
16,384 ranks, more under load) and CPython starts one whenever enough objects survived younger collections, so
one can land on the very read that completes a batch. ``gc.freeze()`` moves every object tracked now
into the permanent generation, which collections skip, in O(1). Frozen objects are still freed by reference
counting when dropped (the state a re-read replaces, a tree the scanner forgets: none of them is part of a
cycle), so freezing leaks nothing of theirs; only cyclic garbage frozen with them waits for the next refresh.

Policy (:meth:`GcFreezer.after_reads`, :meth:`GcFreezer.before_full_look`, :meth:`GcFreezer.after_overflow`):
only trees of at least ``min_tree_dirs`` rank dirs count (small trees never pay a noticeable collection). After
``freeze_after_reads`` of their reads, before each full look at one, and once watchdog has re-armed its watches
after an inotify queue overflow while one is watched (a watch per directory: ~100k new long-lived objects at
16,384 ranks, which the next full collection would otherwise traverse, on the read that completes a batch), collect the young generations (``gc.collect(1)``:
milliseconds; so young cyclic garbage is freed rather than frozen) and freeze. At the end of
a reconcile pass (every batch was just decided: no decision waits), before a full look and after an overflow, at
most every ``refresh_s``: unfreeze, collect fully and freeze again, so cyclic garbage frozen meanwhile is collected within ``refresh_s`` plus a pass.
Source: the ``gc.freeze`` documentation (https://docs.python.org/3/library/gc.html#gc.freeze) and CPython 3.11's
``Modules/gcmodule.c`` (the full collection rule ``long_lived_pending > long_lived_total / 4``).
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable


class GcFreezer:
    """Counts reads of big trees and freezes / refreshes the collector as the module doc says. Thread-safe.

    Counters (for tests and benches): ``freezes``, ``refreshes``.
    """

    def __init__(self, *, min_tree_dirs: int = 2048, freeze_after_reads: int = 1024, refresh_s: float = 300.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.min_tree_dirs = min_tree_dirs
        self.freeze_after_reads = freeze_after_reads
        self.refresh_s = refresh_s
        self._clock = clock
        self._lock = threading.Lock()
        self._reads = 0
        self._big = False  # a tree of min_tree_dirs was seen
        self._refreshed_at = clock()
        self.freezes = 0
        self.refreshes = 0

    def after_reads(self, reads: int, *, tree_dirs: int, pass_ended: bool) -> None:
        """A tree of ``tree_dirs`` rank dirs made ``reads`` reads (``pass_ended``: its reconcile pass just read its
        last dir). Freezes after ``freeze_after_reads`` reads of big trees; refreshes at a pass end at most every
        ``refresh_s``. Costs O(young objects) when it freezes, a full collection when it refreshes, else nothing."""
        if tree_dirs < self.min_tree_dirs:
            return
        with self._lock:
            self._big = True
            self._reads += reads
            now = self._clock()
            if pass_ended and now - self._refreshed_at >= self.refresh_s:
                gc.unfreeze()
                gc.collect()
                self._refreshed_at = now
                self.refreshes += 1
            elif self._reads >= self.freeze_after_reads:
                gc.collect(1)
            else:
                return
            self._freeze()

    def before_full_look(self, *, tree_dirs: int) -> None:
        """A full look at a tree of ``tree_dirs`` rank dirs is about to walk it: freeze what lives now (big trees),
        refreshing first when ``refresh_s`` passed: a full look starts a new reconcile pass, so full looks that
        come faster than a pass ends (a busy tree: more changed dirs than the watcher lists) would otherwise freeze
        the process's cyclic garbage for good."""
        if tree_dirs < self.min_tree_dirs:
            return
        with self._lock:
            self._big = True
            self._collect_and_freeze()

    def _collect_and_freeze(self) -> None:
        """Refresh (unfreeze, full collection) when ``refresh_s`` passed since the last one, else collect the young
        generations; then freeze. Lock held."""
        now = self._clock()
        if now - self._refreshed_at >= self.refresh_s:
            gc.unfreeze()
            gc.collect()
            self._refreshed_at = now
            self.refreshes += 1
        else:
            gc.collect(1)
        self._freeze()

    def after_overflow(self) -> None:
        """watchdog has re-armed its inotify watches after a queue overflow: freeze them when a big tree was seen."""
        with self._lock:
            if self._big:
                self._collect_and_freeze()

    def _freeze(self) -> None:
        gc.freeze()
        self._reads = 0
        self.freezes += 1


GC_FREEZER = GcFreezer()
"""The process's one freezer (``IncrementalScan``'s default)."""
