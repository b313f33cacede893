"""Watches the prof_dirs of pending captures with watchdog and wakes the completeness logic (I/O adapter).

Events only *wake* the logic: ``on_wake(prof_dir)`` means "look again at everything under this prof_dir" (a
full look); with ``on_rank_dirs``, an event inside a rank dir becomes ``on_rank_dirs(prof_dir, rank_dirs)``:
"read these rank dirs again" (``adapters/fs/incremental_scan.py`` reads only them). Whether a batch is complete is
decided by reading the files, never by an event (docs/field-cases.md#fc-18).
inotify is used on local file systems, polling on network ones, where inotify misses other nodes' writes (#fc-15):
``adapters/fs/poll_listing.py``, with bounded work per wake (``watch.poll_max_rank_dir_listings``). Only prof_dirs
of pending captures are watched (#fc-16). A supervisor thread restarts dead observers, re-arms watches on prof_dirs
that appear, vanish or are recreated, asks for a full look after an inotify queue overflow (#fc-17), and wakes
every watched prof_dir each ``reconcile_interval_s``. An event below a prof_dir but in no rank dir asks for a full
look when a folder moved or was deleted (rank dirs may have gone with it); files there, and folders created there
(their contents report themselves), ask for nothing.

inotify needs one watch per directory. The inotify observer (``adapters/fs/inotify_observer.py``) watches only the
layout completion reads: the prof_dir, the folders above rank dirs, each rank dir and its ``ASCEND_PROFILER_OUTPUT/``
(two watches per rank dir, never raw data; a recursive watch of a 16,384-rank-dir tree took ~82k). The per-user
limit (``fs.inotify.max_user_watches``) can still run out (ENOSPC; EMFILE for the instance limit): the observer
reports it, and the supervisor polls what could not be watched: the whole prof_dir when its root fails, else the
subtree, logged once (``inotify_watch_limit_reached``), counted in ``WatchStats.watch_limit_fallbacks`` and the
``profwatch_watch_fallbacks_total{reason}`` metric.
"""

from __future__ import annotations

import fnmatch
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import structlog
from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
    FileClosedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers.api import BaseObserver, ObservedWatch

from profwatch.adapters.fs.inotify_observer import RankDirsChangedEvent, WatchLimitCallback, make_inotify_observer
from profwatch.adapters.fs.poll_listing import BoundedPollingObserver
from profwatch.adapters.gc_freeze import GC_FREEZER
from profwatch.core.batches.mounts import fs_type_of, is_network_fs, parse_mountinfo
from profwatch.core.batches.prof_layout import (
    PROFILER_METADATA,
    PROFILER_OUTPUT_DIR,
    TRACE_DONE,
    is_profiler_info_name,
    parse_rank_dir_name,
    rank_dir_of,
)
from profwatch.core.batches.settings import WatchSettings

__all__ = ["INOTIFY_EVENTS", "ObserverFactory", "ObserverMode", "ProfWatcher", "WatchStats", "completion_scandir",
           "fs_type_of", "is_network_fs", "make_inotify_observer", "parse_mountinfo", "pruned_scandir"]

if TYPE_CHECKING:
    from profwatch.adapters.outputs.metrics import DaemonMetrics

log = structlog.get_logger(__name__)
ObserverMode = Literal["inotify", "polling"]
ObserverFactory = Callable[[ObserverMode, Callable[[], None]], BaseObserver]
#: inotify: only changes of the tree, never IN_OPEN/IN_ACCESS/IN_CLOSE_NOWRITE (our own reads would wake us and
#: overflow the queue) nor IN_MODIFY (every DB page write); a file's last write shows as IN_CLOSE_WRITE. Files
#: changed in rank dirs come gathered, one ``RankDirsChangedEvent`` per read of the fd (adapters/fs/inotify_observer.py).
INOTIFY_EVENTS: list[type[FileSystemEvent]] = [
    FileCreatedEvent, DirCreatedEvent, FileDeletedEvent, DirDeletedEvent, FileMovedEvent, DirMovedEvent,
    FileClosedEvent, RankDirsChangedEvent,
]


def pruned_scandir(skip: tuple[str, ...]) -> Callable[[str | None], Iterator[os.DirEntry[str]]]:
    """``os.scandir`` that hides sub-directories whose name matches ``skip`` (fnmatch) from a polling snapshot."""

    def listdir(path: str | None) -> Iterator[os.DirEntry[str]]:
        with os.scandir(path) as it:
            entries = list(it)
        return iter([e for e in entries if not (any(fnmatch.fnmatchcase(e.name, p) for p in skip)
                                                and e.is_dir(follow_symlinks=False))])

    return listdir


def completion_scandir(skip: tuple[str, ...]) -> Callable[[str | None], Iterator[os.DirEntry[str]]]:
    """The polling observer's listing: what completion needs to notice, not the whole tree
    (docs/rank-dirs.md#completion). Above rank dirs: sub-folders only (minus ``skip``: new rank dirs appear
    there). In a rank dir: ``ASCEND_PROFILER_OUTPUT/``, ``profiler_info*.json``, ``profiler_metadata.json``,
    ``trace.done`` (their sizes and the folder's mtime change when a rank finishes its stop, a parse starts over,
    or the torch backend's marker lands). ``ASCEND_PROFILER_OUTPUT/`` itself is not listed: its mtime changes when
    ``analyse.done`` is created. A poll of 16,384 rank dirs then stats about 4 entries per rank dir instead of
    every output file."""
    skip_dirs = pruned_scandir(skip)

    def listdir(path: str | None) -> Iterator[os.DirEntry[str]]:
        here = os.fspath(path or ".")
        base = os.path.basename(here)
        if base == PROFILER_OUTPUT_DIR and parse_rank_dir_name(os.path.basename(os.path.dirname(here))) is not None:
            return iter(())
        if parse_rank_dir_name(base) is None:
            return iter([e for e in skip_dirs(path) if e.is_dir(follow_symlinks=False)])
        with os.scandir(path) as it:
            return iter([e for e in it if e.name in _RANK_DIR_WATCHED or is_profiler_info_name(e.name)])

    return listdir


MAX_MOUNTINFO_BYTES = 64 * 1024 * 1024
"""Most of the mount table read (``/proc/self/mountinfo`` is ~150 bytes a mount); a longer one is cut at its last
whole line (the mounts past it are not seen: the observer falls back to what it can tell)."""
_RANK_DIR_WATCHED = frozenset({PROFILER_OUTPUT_DIR, PROFILER_METADATA, TRACE_DONE})
GATHER_S = 0.01
"""After the first event that names rank dirs, the watcher waits this long before it delivers them, so that a burst
(16,384 ranks' ``analyse.done`` within 2 s) reaches ``on_rank_dirs`` as a few sets of many rank dirs rather than one
call, and one reader wake-up, per marker (measured with bench/bench_completion.py: two wake-ups of two threads per marker were half the event
path's CPU). Full looks are not delayed. Adds at most this much to the time from an event to its read."""


def _default_observer(mode: ObserverMode, on_overflow: Callable[[], None], settings: WatchSettings,
                      on_watch_limit: WatchLimitCallback | None = None,
                      on_deferred: Callable[[int], None] | None = None) -> BaseObserver:
    if mode == "polling":  # bounded work per wake: adapters/fs/poll_listing.py
        return BoundedPollingObserver(listdir=completion_scandir(settings.poll_skip_dirs),
                                      max_listings=settings.poll_max_rank_dir_listings,
                                      polling_interval=settings.poll_interval_s, skip=settings.poll_skip_dirs,
                                      max_depth=settings.scan_max_depth, on_deferred=on_deferred)
    return make_inotify_observer(on_overflow, on_watch_limit, max_depth=settings.scan_max_depth,
                                 gather_rank_dirs=True, gather_s=GATHER_S)


class _Handler(FileSystemEventHandler):
    def __init__(self, prof_dir: str, notify: Callable[[str, FileSystemEvent], None]) -> None:
        self._prof_dir = prof_dir
        self._notify = notify

    def on_any_event(self, event: FileSystemEvent) -> None:
        self._notify(self._prof_dir, event)


def _event_paths(event: FileSystemEvent) -> list[str]:
    paths = [os.fsdecode(event.src_path)]
    if event.dest_path:
        paths.append(os.fsdecode(event.dest_path))
    return paths


@dataclass(slots=True)
class WatchStats:
    """Counters: wakes delivered (full looks), rank dir wakes delivered (``on_rank_dirs`` calls) and the rank dirs
    they named, reconciliation rounds (``reconciles_left``: rounds left to the caller, ``reconcile=False``),
    observer restarts, inotify overflows, prof_dirs polled because inotify could
    not watch their root (``polling_fallbacks``), subtrees polled because an inotify limit was reached below a
    watched root (``watch_limit_fallbacks``), rank dir listings the polling observer served from its cache instead
    of re-listing (``poll_listings_deferred``: ``watch.poll_max_rank_dir_listings``, adapters/fs/poll_listing.py)."""

    wakes: int = 0
    rank_dir_wakes: int = 0
    rank_dirs_named: int = 0
    reconciles: int = 0
    reconciles_left: int = 0
    observer_restarts: int = 0
    overflows: int = 0
    polling_fallbacks: int = 0
    watch_limit_fallbacks: int = 0
    poll_listings_deferred: int = 0


@dataclass(slots=True)
class _Watched:
    mode: ObserverMode
    watch: ObservedWatch | None = None
    inode: tuple[int, int] | None = None
    subtrees: dict[str, ObservedWatch] = field(default_factory=dict)
    """Subtrees below an inotify-watched prof_dir that inotify could not watch: polled instead."""


class ProfWatcher:
    """Wakes ``on_wake(prof_dir)`` when something may have changed under a watched prof_dir.

    ``on_wake`` runs on the watcher's own thread (never on a watchdog thread), coalesced per prof_dir; it
    should be quick or hand work off. ``on_rank_dirs(prof_dir, rank_dirs)`` (optional, same thread) receives the
    rank dirs that events inside them named since the last call (a frozenset of absolute paths, found with
    ``prof_layout.rank_dir_of`` within ``scan_max_depth`` levels; at most ``max_changed_rank_dirs``, beyond which
    they become one full look); without it such events wake ``on_wake``. In one round the rank dirs come before
    a full look of the same prof_dir. ``observer_factory(mode, on_overflow)`` replaces the watchdog observers
    (tests; an inotify one reports limits to :meth:`watch_limit_hit`); ``reconcile=False``: the caller runs its own
    reconcile timer (the capture shell's ``tick`` looks at each capture every ``reconcile_interval_s``), so the
    watcher does not wake every prof_dir on that timer too (one full look per interval, not two); events,
    overflows and observer restarts still wake. ``gather_s``: how long events naming rank dirs gather before they
    are delivered (:data:`GATHER_S`; 0: at once). ``mountinfo_path`` is read to pick
    inotify or polling when ``settings.observer == "auto"``. ``metrics`` (optional) counts fallbacks to polling
    in ``profwatch_watch_fallbacks_total{reason}``. Use as a context manager or call :meth:`start` and
    :meth:`close`.
    """

    def __init__(self, on_wake: Callable[[str], None], *, settings: WatchSettings | None = None,
                 mountinfo_path: str = "/proc/self/mountinfo", observer_factory: ObserverFactory | None = None,
                 clock: Callable[[], float] = time.monotonic, metrics: DaemonMetrics | None = None,
                 on_rank_dirs: Callable[[str, frozenset[str]], None] | None = None, reconcile: bool = True,
                 gather_s: float = GATHER_S) -> None:
        self._on_wake = on_wake
        self._gather_s = gather_s
        self._reconcile = reconcile
        self._on_rank_dirs = on_rank_dirs
        self._settings = settings or WatchSettings()
        self._mountinfo_path = mountinfo_path
        self._factory = observer_factory or (
            lambda m, cb: _default_observer(m, cb, self._settings, self.watch_limit_hit, self._count_deferred))
        self._clock = clock
        self._metrics = metrics
        self._limit_hits: queue.SimpleQueue[tuple[str, str]] = queue.SimpleQueue()
        self._limit_logged = False
        self._cv = threading.Condition()
        self._count_lock = threading.Lock()
        self._pending: set[str] = set()
        self._changed: dict[str, set[str]] = {}  # prof_dir -> rank dirs events named, not delivered yet
        self._dirs: dict[str, _Watched] = {}
        self._observers: dict[ObserverMode, BaseObserver] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.stats = WatchStats()

    # ------------------------------------------------------------------------------------------------ API
    def start(self) -> None:
        """Start the supervisor thread (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="profwatch-prof-watch", daemon=True)
            self._thread.start()

    def __enter__(self) -> ProfWatcher:  # noqa: PYI034
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def watch(self, prof_dir: str | os.PathLike[str]) -> ObserverMode:
        """Watch ``prof_dir`` (it may not exist yet; inotify: the rank-dir layout below it, polling: the listing of
        :func:`completion_scandir`); wakes it once at once. Returns the mode used."""
        path = os.path.abspath(os.fspath(prof_dir))
        with self._cv:
            entry = self._dirs.get(path)
            if entry is None:
                entry = self._dirs[path] = _Watched(mode=self._mode_for(path))
                self._schedule(path, entry)
            self._pending.add(path)
            self._cv.notify_all()
            return entry.mode

    def unwatch(self, prof_dir: str | os.PathLike[str]) -> None:
        """Stop watching ``prof_dir`` (its capture is closed). Unknown dirs are ignored."""
        path = os.path.abspath(os.fspath(prof_dir))
        with self._cv:
            entry = self._dirs.pop(path, None)
            self._pending.discard(path)
            self._changed.pop(path, None)
            if entry is not None:
                self._unschedule(entry)

    def watched(self) -> dict[str, ObserverMode]:
        """prof_dir -> observer mode, for status output."""
        with self._cv:
            return {p: e.mode for p, e in self._dirs.items()}

    def polled_subtrees(self) -> dict[str, list[str]]:
        """prof_dir -> subtrees polled because inotify could not watch them (a limit was reached), for status."""
        with self._cv:
            return {p: sorted(e.subtrees) for p, e in self._dirs.items() if e.subtrees}

    def watch_limit_hit(self, directory: str, error: str) -> None:
        """Record that inotify could not watch ``directory`` (ENOSPC/EMFILE); the supervisor polls it within
        ``supervise_interval_s``. Safe from any thread, never blocks (called under watchdog's locks)."""
        self._limit_hits.put((os.path.abspath(directory), error))

    def request_rescan(self) -> None:
        """Wake every watched prof_dir (after an inotify overflow, a remount, or on demand)."""
        with self._cv:
            self._pending.update(self._dirs)
            self._cv.notify_all()

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the supervisor and every observer thread and join them (bounded by ``timeout_s`` each)."""
        self._stop.set()
        with self._cv:
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)
        with self._cv:
            observers, self._observers = list(self._observers.values()), {}
            for e in self._dirs.values():
                e.watch = None
        for obs in observers:
            _stop_observer(obs, timeout_s)

    # ------------------------------------------------------------------------------------------------ internals
    def _mode_for(self, path: str) -> ObserverMode:
        if self._settings.observer != "auto":
            return self._settings.observer
        probe = path
        while not os.path.exists(probe) and os.path.dirname(probe) != probe:
            probe = os.path.dirname(probe)
        try:
            with open(self._mountinfo_path, encoding="utf-8") as fh:
                text = fh.read(MAX_MOUNTINFO_BYTES)  # bounded (a host with 10^5 mounts: ~15 MB)
            mounts = parse_mountinfo(text if len(text) < MAX_MOUNTINFO_BYTES else text[: text.rfind("\n") + 1])
        except OSError:
            return "polling"  # cannot tell: polling is correct everywhere, only slower
        fstype = fs_type_of(os.path.realpath(probe), mounts)
        return "polling" if is_network_fs(fstype, self._settings.network_fs_types) else "inotify"

    def _observer(self, mode: ObserverMode) -> BaseObserver:
        obs = self._observers.get(mode)
        if obs is None:
            obs = self._factory(mode, self._overflowed)
            obs.start()
            self._observers[mode] = obs
        return obs

    def _schedule(self, path: str, entry: _Watched) -> None:
        """Arm a watch on ``path`` (caller holds the lock). A missing dir stays pending for the supervisor."""
        try:
            st = os.stat(path)
            flt = INOTIFY_EVENTS if entry.mode == "inotify" else None
            entry.watch = self._observer(entry.mode).schedule(_Handler(path, self._notify), path, recursive=True,
                                                              event_filter=flt)
            entry.inode = (st.st_dev, st.st_ino)
        except FileNotFoundError:
            entry.watch, entry.inode = None, None
        except OSError as exc:
            if entry.mode == "inotify":  # ENOSPC (max_user_watches), EMFILE: poll the whole prof_dir instead
                log.warning("inotify_watch_failed_polling_instead", prof_dir=path, error=str(exc))
                self.stats.polling_fallbacks += 1
                self._count_fallback("inotify_root_failed")
                entry.mode = "polling"
                self._schedule(path, entry)
            else:
                log.warning("watch_failed", prof_dir=path, error=str(exc))
                entry.watch, entry.inode = None, None

    def _unschedule(self, entry: _Watched) -> None:
        obs = self._observers.get(entry.mode)
        if entry.watch is not None and obs is not None:
            try:
                obs.unschedule(entry.watch)
            except (KeyError, OSError):
                pass
        entry.watch, entry.inode = None, None
        for sub in list(entry.subtrees):
            self._unschedule_subtree(entry, sub)

    def _unschedule_subtree(self, entry: _Watched, subtree: str) -> None:
        watch = entry.subtrees.pop(subtree, None)
        obs = self._observers.get("polling")
        if watch is not None and obs is not None:
            try:
                obs.unschedule(watch)
            except (KeyError, OSError):
                pass

    def _count_deferred(self, n: int) -> None:
        """A polling emitter served ``n`` rank dirs from their cached listing in one poll (its thread)."""
        with self._count_lock:  # not self._cv: unschedule joins emitters under it
            self.stats.poll_listings_deferred += n
        if self._metrics is not None:
            self._metrics.watch_poll_deferred.inc(n)

    def _count_fallback(self, reason: str) -> None:
        if self._metrics is not None:
            self._metrics.watch_fallbacks.labels(reason).inc()

    def _poll_unwatchable(self) -> None:
        """Poll every subtree inotify reported it could not watch (caller holds the lock; supervisor thread)."""
        while True:
            try:
                directory, error = self._limit_hits.get_nowait()
            except queue.Empty:
                return
            owners = [p for p in self._dirs if directory == p or directory.startswith(p.rstrip("/") + "/")]
            if not owners:
                continue
            prof_dir = max(owners, key=len)
            entry = self._dirs[prof_dir]
            if entry.mode != "inotify" or directory == prof_dir or any(
                    directory == s or directory.startswith(s.rstrip("/") + "/") for s in entry.subtrees):
                continue  # the root failed (polled whole by _schedule) or already polled
            try:
                watch = self._observer("polling").schedule(_Handler(prof_dir, self._notify), directory,
                                                           recursive=True)
            except OSError as exc:  # vanished meanwhile: the reconciliation scan covers it
                log.debug("subtree_poll_failed", prof_dir=prof_dir, subtree=directory, error=str(exc))
                continue
            for nested in [s for s in entry.subtrees if s.startswith(directory.rstrip("/") + "/")]:
                self._unschedule_subtree(entry, nested)
            entry.subtrees[directory] = watch
            self.stats.watch_limit_fallbacks += 1
            self._count_fallback("watch_limit")
            self._pending.add(prof_dir)  # events below it may have been missed until now
            if not self._limit_logged:
                self._limit_logged = True
                log.warning("inotify_watch_limit_reached", prof_dir=prof_dir, subtree=directory, error=error,
                            action="polling what could not be watched; raise fs.inotify.max_user_watches "
                                   "(or set watch.observer = 'polling') to stop this",
                            poll_interval_s=self._settings.poll_interval_s)
            else:
                log.debug("inotify_watch_limit_subtree_polled", prof_dir=prof_dir, subtree=directory)

    def _notify(self, prof_dir: str, event: FileSystemEvent) -> None:
        """An event below ``prof_dir`` (watchdog's thread): note the rank dirs it names, or a full look."""
        if self._on_rank_dirs is None:
            self._wake_all(prof_dir)
            return
        if isinstance(event, RankDirsChangedEvent):  # the emitter named them (inotify_observer.py)
            dirs = set(event.rank_dirs)
        else:
            depth = self._settings.scan_max_depth
            named = [rank_dir_of(prof_dir, p, depth) for p in _event_paths(event)]
            dirs = {d for d in named if d is not None}
            if None in named and event.is_directory and event.event_type in ("moved", "deleted"):
                self._wake_all(prof_dir)  # a folder above rank dirs moved or went: they may have gone with it
        if not dirs:
            return  # a file outside every rank dir, or a new folder (what it holds reports itself)
        with self._cv:
            got = self._changed.setdefault(prof_dir, set())
            got |= dirs
            if len(got) > self._settings.max_changed_rank_dirs:
                del self._changed[prof_dir]
                self._pending.add(prof_dir)
            self._cv.notify_all()

    def _wake_all(self, prof_dir: str) -> None:
        with self._cv:
            self._pending.add(prof_dir)
            self._cv.notify_all()

    def _overflowed(self) -> None:
        log.warning("inotify_overflow_rescan")
        self.stats.overflows += 1
        GC_FREEZER.after_overflow()  # watchdog's re-armed watches: out of full collections (adapters/gc_freeze.py)
        self.request_rescan()

    def _run(self) -> None:
        s = self._settings
        next_supervise = self._clock() + s.supervise_interval_s
        next_reconcile = self._clock() + s.reconcile_interval_s
        while not self._stop.is_set():
            with self._cv:
                timeout = max(0.0, min(next_supervise, next_reconcile) - self._clock())
                self._cv.wait_for(lambda: self._pending or self._changed or self._stop.is_set(), timeout=timeout)
                gather = bool(self._changed) and not self._pending
            if gather and self._gather_s > 0:
                self._stop.wait(self._gather_s)  # let a burst's events gather (GATHER_S)
            with self._cv:
                batch, self._pending = sorted(self._pending), set()
                changed, self._changed = self._changed, {}
            for prof_dir, rank_dirs in sorted(changed.items()):
                if self._stop.is_set():
                    return
                self._deliver_rank_dirs(prof_dir, frozenset(rank_dirs))
            for prof_dir in batch:
                if self._stop.is_set():
                    return
                self._deliver(prof_dir)
            now = self._clock()
            if now >= next_supervise:
                self._supervise()
                next_supervise = now + s.supervise_interval_s
            if now >= next_reconcile:
                next_reconcile = now + s.reconcile_interval_s
                if self._reconcile:
                    self.stats.reconciles += 1
                    self.request_rescan()
                else:
                    self.stats.reconciles_left += 1

    def _deliver(self, prof_dir: str) -> None:
        with self._cv:
            if prof_dir not in self._dirs:
                return
        self.stats.wakes += 1
        try:
            self._on_wake(prof_dir)
        except Exception:  # the callback's bug must not kill watching
            log.exception("on_wake_failed", prof_dir=prof_dir)

    def _deliver_rank_dirs(self, prof_dir: str, rank_dirs: frozenset[str]) -> None:
        with self._cv:
            if prof_dir not in self._dirs or self._on_rank_dirs is None:
                return
        self.stats.rank_dir_wakes += 1
        self.stats.rank_dirs_named += len(rank_dirs)
        try:
            self._on_rank_dirs(prof_dir, rank_dirs)
        except Exception:  # the callback's bug must not kill watching
            log.exception("on_rank_dirs_failed", prof_dir=prof_dir)

    def _supervise(self) -> None:
        """Restart dead observers; re-arm watches whose prof_dir appeared, vanished or was recreated; poll
        subtrees inotify could not watch, and stop polling those that are gone."""
        dead: list[BaseObserver] = []
        with self._cv:
            self._poll_unwatchable()
            for e in self._dirs.values():
                for sub in [s for s in e.subtrees if not os.path.isdir(s)]:
                    self._unschedule_subtree(e, sub)
            for mode, obs in list(self._observers.items()):
                if obs.is_alive():
                    continue
                log.warning("observer_died_restarting", mode=mode)
                self.stats.observer_restarts += 1
                dead.append(self._observers.pop(mode))
                for path, e in self._dirs.items():
                    if e.mode == mode:
                        e.watch = None
                        self._pending.add(path)
        for obs in dead:  # outside the lock: its dispatcher thread may be waiting for it in _notify
            _stop_observer(obs, 1.0)
        with self._cv:
            alive_emitters = {id(em.watch): em.is_alive() for o in self._observers.values() for em in o.emitters}
            for path, e in self._dirs.items():
                try:
                    st = os.stat(path)
                    inode: tuple[int, int] | None = (st.st_dev, st.st_ino)
                except FileNotFoundError:
                    inode = None
                except OSError:
                    continue  # ESTALE/EIO: unknown; keep the watch as it is (docs/field-cases.md#fc-15)
                stale = e.watch is not None and (inode != e.inode or not alive_emitters.get(id(e.watch), False))
                if stale:
                    self._unschedule(e)
                if e.watch is None and inode is not None:
                    self._schedule(path, e)
                    self._pending.add(path)
                elif stale:
                    self._pending.add(path)
            self._cv.notify_all()


def _stop_observer(obs: BaseObserver, timeout_s: float) -> None:
    try:
        obs.stop()
    except Exception:  # a dead observer may fail to stop cleanly; joining below is what matters
        log.exception("observer_stop_failed")
    if obs.ident is not None:
        obs.join(timeout_s)
