"""The polling observer with bounded work per wake (I/O adapter; docs/rank-dirs.md#polling-bound).

watchdog's ``PollingObserverVFS`` builds a whole snapshot of the tree and diffs it with the last one every poll:
about four stat/scandir calls and four snapshot entries per rank dir, whatever changed (4,096 rank dirs: ~0.2
CPU-s per wake, most of it the snapshot and its diff). :class:`RankTreePoller` keeps per rank dir what it saw
instead, and every poll:

- stats and lists the prof_dir and the folders above rank dirs (down to ``max_depth``, minus ``skip``): new and
  vanished rank dirs and folders are seen at once;
- stats each rank dir and its ``ASCEND_PROFILER_OUTPUT/`` (``analyse.done`` lands there and moves its mtime;
  ``trace.done`` and ``profiler_metadata.json`` land in the rank dir and move the rank dir's mtime), as far as its
  last look says something completion waits for can still land there (``_settled``): both for a dir new, changing
  or still appearing; only ``ASCEND_PROFILER_OUTPUT/`` for an ``*_ascend_pt`` dir that has its profiler_info,
  metadata and output folder and waits for ``analyse.done``; neither for a dir whose marker was seen (finished)
  until rotation re-lists it, or its folder's listing shows it under another inode (moved away and replaced);
- re-lists a rank dir (scandir, then a stat of each entry completion reads: ``profiler_info*.json``,
  ``profiler_metadata.json``, ``trace.done``, and a stat of ``ASCEND_PROFILER_OUTPUT/analyse.done``, whose folder
  is not listed) when it is new, one of those two mtimes (or inodes) changed, its last
  look saw it change (a rank still writing or parsing: re-listed every poll until a listing shows it quiet), or
  rotation makes it due (``core/batches/poll_rotation.py``): at most ``max_listings`` a poll, each rank dir at
  least every ``ceil(rank dirs / max_listings)`` polls;
- counts the others as deferred (their last listing stands).

What that costs: a change that moves neither folder's mtime (a file rewritten in place, e.g. ``profiler_info_*.json``
growing; an ``analyse.done`` whose folder's mtime did not move), or that lands in a folder not stat'ed (a finished
dir re-parsed: its ``ASCEND_PROFILER_OUTPUT/`` deleted; a profiler_info added to a dir waiting for its marker), is
seen within ``ceil(rank dirs / max_listings)`` polls instead of one. Other files of ``ASCEND_PROFILER_OUTPUT/`` are not looked at by polling (completion reads only
the marker there); they are read by the analysis and the reconciliation scan. A client that caches directory
attributes (NFS ``acdirmin``/``acdirmax``, 30-60 s by default; Lustre until its lock on the folder is revoked) shows
another host's marker in the folder's mtime only when they expire; the same cache delays a listing of that folder
too, so the bound adds at most the rotation period to what the cache hides, and the reconciliation scan
(``watch.reconcile_interval_s``) reads every rank dir regardless.

Events are watchdog's: ``DirCreatedEvent``/``DirDeletedEvent`` for rank dirs and folders that appear or go,
``DirModifiedEvent`` for a folder above rank dirs whose mtime moved,
``FileCreatedEvent``/``FileDeletedEvent``/``FileModifiedEvent`` for the entries of a re-listed rank dir and its
``ASCEND_PROFILER_OUTPUT/analyse.done``, and
``DirModifiedEvent`` for an ``ASCEND_PROFILER_OUTPUT/`` whose mtime moved. A watch whose root is a rank dir or lies
inside one (a subtree inotify could not watch) is small: it gets watchdog's own polling emitter.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import structlog
from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    DirModifiedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileSystemEvent,
)
from watchdog.observers.api import DEFAULT_EMITTER_TIMEOUT, BaseObserver, EventEmitter, EventQueue, ObservedWatch
from watchdog.observers.polling import PollingEmitter

from profwatch.core.batches.poll_rotation import relist_period, rotation_due
from profwatch.core.batches.prof_layout import (
    ANALYSE_DONE,
    PROFILER_METADATA,
    PROFILER_OUTPUT_DIR,
    TRACE_DONE,
    is_profiler_info_name,
    parse_rank_dir_name,
)

__all__ = ["BoundedPollingObserver", "RankTreePoller"]

log = structlog.get_logger(__name__)
StatFn = Callable[[str], os.stat_result]
ScandirFn = Callable[[str], Iterator[os.DirEntry[str]]]
_KEPT = frozenset({PROFILER_METADATA, TRACE_DONE})
_Key = tuple[int, int, int]  # (st_ino, st_dev, st_mtime_ns)
_FileKey = tuple[int, int, int, int]  # (st_ino, st_mtime_ns, st_size, st_mode)


def _key(st: os.stat_result) -> _Key:
    return st.st_ino, st.st_dev, st.st_mtime_ns


def _file_key(st: os.stat_result) -> _FileKey:
    return st.st_ino, st.st_mtime_ns, st.st_size, st.st_mode


@dataclass(slots=True)
class _RankDir:
    slot: int
    key: _Key | None = None  # the rank dir's (ino, dev, mtime_ns) at its last look
    out: _Key | None = None  # its ASCEND_PROFILER_OUTPUT/'s, None when absent
    files: dict[str, _FileKey] = field(default_factory=dict)  # kept entry name -> its stat at the last listing
    marker: _FileKey | None = None  # ASCEND_PROFILER_OUTPUT/analyse.done's stat at the last listing, None: absent
    active: bool = True  # its last look saw a change: re-list at the next poll
    settled: Literal["finished", "waiting"] | None = None  # what its last quiet listing says (_settled)
    entry_ino: int | None = None  # its inode in its folder's listing at the last poll (d_ino: no extra call)


class RankTreePoller:
    """What changed under ``root`` (a prof_dir or a folder above rank dirs) since the last :meth:`poll`, with at
    most ``max_listings`` rank dirs re-listed by rotation a poll (module docstring). Use from one thread.

    ``stat``/``scandir``: the real calls (benches count them); ``skip``: folder names (fnmatch) not descended into;
    ``max_depth``: folder levels below ``root`` searched for rank dirs. ``deferred_total``, ``relisted_total``,
    ``stats_skipped_total`` (stats of a rank dir or its output folder left to rotation), ``polls``: counters;
    ``last_deferred``: rank dirs the last poll did not re-list.

    Raises:
        ValueError: ``max_listings`` < 1.
    """

    def __init__(self, root: str, max_listings: int, *, skip: tuple[str, ...] = (), max_depth: int = 5,
                 stat: StatFn = os.stat, scandir: ScandirFn = os.scandir) -> None:
        relist_period(0, max_listings)  # validates
        self.root = root
        self.max_listings = max_listings
        self._skip = skip
        self._max_depth = max_depth
        self._stat = stat
        self._scandir = scandir
        self._folders: dict[str, _Key] = {}
        self._known: dict[str, _RankDir] = {}
        self._next_slot = 0
        self.polls = 0
        self.deferred_total = 0
        self.relisted_total = 0
        self.stats_skipped_total = 0
        self.last_deferred = 0

    def poll(self) -> list[FileSystemEvent]:
        """One wake: the events since the last poll (the first poll learns the tree and returns none).

        Raises:
            FileNotFoundError, NotADirectoryError: ``root`` is gone (nothing is forgotten).
            OSError: ``root`` cannot be listed now (nothing is forgotten: the next poll reports what changed).
        """
        first = self.polls == 0
        folders, rank_dirs = self._walk()
        self.polls += 1
        events: list[FileSystemEvent] = []
        events += [DirDeletedEvent(p) for p in sorted(set(self._folders) - set(folders))]
        for p, k in sorted(folders.items()):
            old = self._folders.get(p)
            if old is None:
                events.append(DirCreatedEvent(p))
            elif old != k:
                events.append(DirModifiedEvent(p))
        self._folders = folders
        for gone in sorted(set(self._known) - set(rank_dirs)):
            del self._known[gone]
            events.append(DirDeletedEvent(gone))
        if len(self._known) * 2 < self._next_slot:  # half the slots are holes: compact (the period follows them)
            for i, d in enumerate(sorted(self._known.values(), key=lambda d: d.slot)):
                d.slot = i
            self._next_slot = len(self._known)
        for path, ino in rank_dirs.items():
            if path not in self._known:
                self._known[path] = _RankDir(slot=self._next_slot)
                self._next_slot += 1
                events.append(DirCreatedEvent(path))
            rd = self._known[path]
            if rd.entry_ino is not None and ino != rd.entry_ino:
                rd.settled = None  # another folder under the same name (moved away and replaced): look at it now
            rd.entry_ino = ino
        period = relist_period(self._next_slot, self.max_listings)
        deferred = 0
        for path in rank_dirs:
            deferred += self._look(path, self._known[path], period, events)
        self.last_deferred = deferred
        self.deferred_total += deferred
        return [] if first else events

    # -- internals ------------------------------------------------------------------------------------------------
    def _walk(self) -> tuple[dict[str, _Key], dict[str, int]]:
        """The folders above rank dirs (``root`` included) with their (ino, dev, mtime_ns), and the rank dirs below
        ``root`` with their inode as their folder's listing gives it (raises when ``root`` cannot be stat'ed or
        listed)."""
        folders: dict[str, _Key] = {self.root: _key(self._stat(self.root))}
        rank_dirs: dict[str, int] = {}
        todo = [(self.root, 0)]
        while todo:
            folder, depth = todo.pop()
            try:
                with self._scandir(folder) as it:  # type: ignore[attr-defined]
                    entries = [(e.name, e.path, e.inode()) for e in it if e.is_dir(follow_symlinks=False)]
            except OSError:
                if folder == self.root:
                    raise
                continue  # went meanwhile: the next poll sees it gone
            for name, path, ino in entries:
                if parse_rank_dir_name(name) is not None:
                    rank_dirs[path] = ino
                elif depth + 1 < self._max_depth and not any(fnmatch.fnmatchcase(name, p) for p in self._skip):
                    try:
                        folders[path] = _key(self._stat(path))
                    except OSError:
                        continue
                    todo.append((path, depth + 1))
        return folders, rank_dirs

    def _look(self, path: str, rd: _RankDir, period: int, events: list[FileSystemEvent]) -> int:
        """Stat one rank dir and its output folder, as far as its last look says anything can land there; re-list
        it when due. Returns 1 when deferred."""
        out_path = os.path.join(path, PROFILER_OUTPUT_DIR)
        out: _Key | None
        due = rotation_due(self.polls, rd.slot, period)
        settled = None if due or rd.active else rd.settled
        if settled == "finished":  # its marker was seen: rotation alone looks again (a re-parse, a rewrite)
            self.stats_skipped_total += 2
            return 1
        if settled == "waiting":  # only analyse.done can come, in ASCEND_PROFILER_OUTPUT/: stat that alone
            try:
                out = _key(self._stat(out_path))
            except OSError:
                out = None
            if out == rd.out:
                self.stats_skipped_total += 1
                return 1
        try:
            key = _key(self._stat(path))
        except OSError:
            return 0  # went after the listing: the next poll reports it gone
        if settled is None:
            try:
                out = _key(self._stat(out_path))
            except OSError:
                out = None
        changed = key != rd.key or out != rd.out
        if rd.key is not None and out != rd.out:
            if out is None:
                events.append(DirDeletedEvent(out_path))
            else:
                events.append(DirModifiedEvent(out_path) if rd.out is not None else DirCreatedEvent(out_path))
        rd.key, rd.out = key, out
        if not (changed or rd.active or due):
            return 1
        self.relisted_total += 1
        try:
            with self._scandir(path) as it:  # type: ignore[attr-defined]
                names = [e.name for e in it if e.name in _KEPT or is_profiler_info_name(e.name)]
        except OSError:
            rd.active = True
            return 0
        files: dict[str, _FileKey] = {}
        for name in names:
            try:
                st = self._stat(os.path.join(path, name))
            except OSError:
                continue
            files[name] = _file_key(st)
        marker_path = os.path.join(out_path, ANALYSE_DONE)  # its folder's mtime may not show it (docstring)
        try:
            marker: _FileKey | None = _file_key(self._stat(marker_path))
        except OSError:
            marker = None
        if marker != rd.marker:
            events.append(FileDeletedEvent(marker_path) if marker is None else
                          FileCreatedEvent(marker_path) if rd.marker is None else FileModifiedEvent(marker_path))
        for name in sorted(set(rd.files) - set(files)):
            events.append(FileDeletedEvent(os.path.join(path, name)))
        for name, fk in sorted(files.items()):
            old = rd.files.get(name)
            if old is None:
                events.append(FileCreatedEvent(os.path.join(path, name)))
            elif old != fk:
                events.append(FileModifiedEvent(os.path.join(path, name)))
        rd.active = changed or files != rd.files or marker != rd.marker
        rd.files, rd.marker = files, marker
        rd.settled = None if rd.active else _settled(path, rd)
        return 0


def _settled(path: str, rd: _RankDir) -> Literal["finished", "waiting"] | None:
    """What the last look at a quiet rank dir says can still land there between rotation re-lists: "finished" (its
    ``analyse.done`` or ``trace.done`` was seen: nothing completion waits for), "waiting" (an ``*_ascend_pt`` dir
    with ``profiler_info*.json``, ``profiler_metadata.json`` and ``ASCEND_PROFILER_OUTPUT/``, no ``analyse.done``
    yet: only the marker, in ``ASCEND_PROFILER_OUTPUT/``), or None (a dir new, changing or still appearing:
    anything, so both folders are stat'ed every poll)."""
    if rd.key is None or rd.active:
        return None
    if rd.marker is not None or TRACE_DONE in rd.files:
        return "finished"
    name = parse_rank_dir_name(os.path.basename(path))
    if rd.out is not None and name is not None and name.kind == "ascend_pt" and PROFILER_METADATA in rd.files \
            and any(is_profiler_info_name(n) for n in rd.files):
        return "waiting"
    return None


class _TreeEmitter(EventEmitter):
    """watchdog emitter over a :class:`RankTreePoller` (one thread per watch)."""

    def __init__(self, event_queue: EventQueue, watch: ObservedWatch, poller: RankTreePoller,
                 on_deferred: Callable[[int], None] | None, *, timeout: float = DEFAULT_EMITTER_TIMEOUT,
                 event_filter: Any = None) -> None:
        super().__init__(event_queue, watch, timeout=timeout, event_filter=event_filter)
        self._poller = poller
        self._on_deferred = on_deferred
        self._failing = False

    def on_thread_start(self) -> None:
        self._poll()

    def queue_events(self, timeout: float) -> None:
        if self.stopped_event.wait(timeout):
            return
        self._poll()

    def _poll(self) -> None:
        try:
            events = self._poller.poll()
        except (FileNotFoundError, NotADirectoryError):
            self.queue_event(DirDeletedEvent(self.watch.path))
            self.stop()
            return
        except OSError as exc:  # EIO, ESTALE, a share briefly away: keep what was seen, try again next poll
            if not self._failing:
                self._failing = True
                log.warning("poll_failed_retrying", path=self.watch.path, error=str(exc),
                            errno=errno.errorcode.get(exc.errno or 0, exc.errno))
            return
        self._failing = False
        for ev in events:
            self.queue_event(ev)
        if self._on_deferred is not None and self._poller.last_deferred:
            self._on_deferred(self._poller.last_deferred)


class BoundedPollingObserver(BaseObserver):
    """watchdog observer polling each watched tree with a :class:`RankTreePoller` (each watch has its own emitter
    thread); a watch whose root is a rank dir or lies in one gets watchdog's ``PollingEmitter`` with ``listdir``
    (``prof_watch.completion_scandir``). ``on_deferred(n)`` is told, from the emitter threads, how many rank dirs
    each poll did not re-list."""

    def __init__(self, *, listdir: Callable[[str | None], Iterator[os.DirEntry[str]]], max_listings: int,
                 polling_interval: float, skip: tuple[str, ...] = (), max_depth: int = 5, stat: StatFn = os.stat,
                 scandir: ScandirFn = os.scandir, on_deferred: Callable[[int], None] | None = None) -> None:
        relist_period(0, max_listings)  # validates before any thread
        self._pollers_lock = threading.Lock()
        self.pollers: dict[str, RankTreePoller] = {}
        """watched path -> its poller (the latest emitter's), for tests and benches."""

        def emitter(event_queue: EventQueue, watch: ObservedWatch, *, timeout: float = DEFAULT_EMITTER_TIMEOUT,
                    event_filter: Any = None) -> EventEmitter:
            parts = os.path.abspath(watch.path).split(os.sep)
            if any(parse_rank_dir_name(p) is not None for p in parts):
                return PollingEmitter(event_queue, watch, timeout=timeout, event_filter=event_filter, stat=stat,
                                      listdir=listdir)
            poller = RankTreePoller(watch.path, max_listings, skip=skip, max_depth=max_depth, stat=stat,
                                    scandir=scandir)
            with self._pollers_lock:
                self.pollers[watch.path] = poller
            return _TreeEmitter(event_queue, watch, poller, on_deferred, timeout=timeout, event_filter=event_filter)

        super().__init__(emitter, timeout=polling_interval)  # type: ignore[arg-type]
