"""A watchdog observer whose inotify watches follow the rank-dir layout, not the whole tree (I/O adapter; Linux).

``daemon/profwatch/adapters/fs/prof_watch.py`` uses it for prof_dirs on local file systems. Completion needs to
notice rank dirs appearing and, in each, the files of a finished stop and parse (profiler_info, metadata,
``trace.done``, ``ASCEND_PROFILER_OUTPUT/*.db``, ``analyse.done``; docs/rank-dirs.md#completion). watchdog's
recursive inotify watch adds one watch per directory of the tree: at 16,384 rank dirs about 82k watches
(``PROF_*/device_*/data``, ``FRAMEWORK/``, ``logs/`` ...), set up by a walk that took more than 25 min on a busy box,
and two such captures exceed ``fs.inotify.max_user_watches`` (192,540 on our hosts). Here each emitter (one per
scheduled prof_dir, with its own inotify instance) watches, shallowly:

- the prof_dir and the folders below it that are not rank dirs, down to ``max_depth`` levels (where
  ``find_rank_dirs`` looks for rank dirs): every event there;
- each rank dir (a folder named like one, ``prof_layout.parse_rank_dir_name``) and its ``ASCEND_PROFILER_OUTPUT/``:
  entries created, closed after writing, deleted or moved there. Nothing deeper (raw data is never watched).

That is two watches per rank dir (32,768 at 16,384 ranks; two such captures use a third of the limit). A folder
created where rank dirs may appear is armed when its event arrives, and what it already holds is armed and reported
(rank dirs created before the watch raise no event of their own). Changes below a rank dir's two watched folders
(``PROF_*`` raw data, CANN's ``sqlite/`` export) raise no event: the capture shell's reconcile timer reads them
(``WatchSettings.reconcile_interval_s``).

A file created and closed after writing within one read of the inotify fd (a marker such as ``analyse.done``, a small
JSON) is queued once, as its ``FileCreatedEvent``: its ``IN_CLOSE_WRITE`` is folded into it (``closes_folded``), so
a burst of markers costs one event each on the observer's queue, dispatcher and handler instead of two
(``bench/bench_completion.py --modes burst``).
The watcher reads the file after the event is dispatched, i.e. after the close that came in the same read; a close
in a later read is queued as ``FileClosedEvent``.

With ``gather_rank_dirs`` (what ``adapters/fs/prof_watch.py`` uses), the files created, closed after writing or
deleted in a rank dir or its ``ASCEND_PROFILER_OUTPUT/`` are not queued one event each: one
:class:`RankDirsChangedEvent` per read of the inotify fd names the rank dirs they were in (taken from the watch,
no path parsing), queued after that read's other events. A burst of 16,384 markers within 2 s then costs the
observer's queue, dispatcher and handler a few events per read instead of one per marker (at 16,384 ranks the
per-event path was ~35 us a marker of the ~180 us a marker costs, ``bench/bench_completion.py --modes burst``).
Moves keep their own events (a move pairs two folders), and so do folders created or deleted there.
With ``gather_s`` > 0 (``adapters/fs/prof_watch.py`` passes its ``GATHER_S``, 10 ms), the emitter waits that long
after a read that named rank dirs before it reads again, so the markers of a burst come in a few reads of many events
rather than one read, one queued event and one handler call each: at 4,096 markers paced over 2 s the emitter's
thread cost ~29 us of CPU a marker (its ``select``, ``read``, event and queue per marker) and the dispatcher's
~12 us (measured per thread from ``/proc/self/task``, ``bench/bench_completion.py --modes burst``). The kernel
keeps the events meanwhile (a 10 ms pause at 8,192 markers/s queues ~160 of the default 16,384
``max_queued_events``); a rank dir's read comes at most ``gather_s`` later.

An inotify queue overflow (``IN_Q_OVERFLOW``) re-arms the tree (``inotify_add_watch`` on a watched folder is a no-op)
and then calls ``on_overflow``, so the rescan it asks for sees what was lost (docs/field-cases.md#fc-17). A watch
that cannot be added because of a limit (ENOSPC: ``max_user_watches``; EMFILE) is reported to
``on_watch_limit(directory, error)`` (the watcher polls that subtree); the prof_dir's own watch raises instead
(the watcher then polls the whole prof_dir). The kernel calls are watchdog's ``ctypes`` bindings
(``watchdog.observers.inotify_c``); the event layout is ``struct inotify_event`` of inotify(7). pyproject.toml bounds
watchdog to the major version tested (7.x).
"""

from __future__ import annotations

import errno
import os
import select
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    DirModifiedEvent,
    DirMovedEvent,
    FileClosedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileMovedEvent,
    FileSystemEvent,
)
from watchdog.observers.api import BaseObserver, EventEmitter

from profwatch.core.batches.prof_layout import PROFILER_OUTPUT_DIR, parse_rank_dir_name

WatchLimitCallback = Callable[[str, str], None]
"""``(directory, error)``: inotify could not add a watch for ``directory`` (a limit was reached)."""
_LIMIT_ERRNOS = (errno.ENOSPC, errno.EMFILE)

# inotify(7) constants (linux/inotify.h)
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
IN_EXCL_UNLINK = 0x04000000
IN_ISDIR = 0x40000000
WATCH_MASK = (IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_CLOSE_WRITE | IN_ONLYDIR | IN_DONT_FOLLOW
              | IN_EXCL_UNLINK)
"""What every watch asks for: entries created, deleted, moved in or out, files closed after writing; never reads,
opens or ``IN_MODIFY`` (every DB page write)."""
_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; then len bytes of name
_READ_BYTES = 1 << 16

Kind = Literal["above", "rank", "out"]


@dataclass(unsafe_hash=True)
class RankDirsChangedEvent(DirModifiedEvent):
    """Files changed in these rank dirs (created, closed after writing, deleted in a rank dir or its
    ``ASCEND_PROFILER_OUTPUT/``) within one read of the inotify fd; ``src_path`` is the scheduled prof_dir.
    Queued by a :class:`LayoutEmitter` with ``gather_rank_dirs`` instead of one event per file (module doc); a
    handler that does not know it sees a modified prof_dir."""

    rank_dirs: frozenset[str] = frozenset()


def _inotify_init() -> int:
    from watchdog.observers.inotify_c import inotify_init

    fd = inotify_init()
    if fd < 0:
        err = ctypes_errno()
        raise OSError(err, os.strerror(err))
    os.set_blocking(fd, False)
    os.set_inheritable(fd, False)
    return fd


def ctypes_errno() -> int:
    """The ``errno`` of the last failed watchdog ``ctypes`` inotify call."""
    import ctypes

    return ctypes.get_errno()


def _add_watch(fd: int, path: str, mask: int) -> int:
    """``inotify_add_watch(fd, path, mask)``: the watch descriptor; OSError with the kernel's errno on failure."""
    from watchdog.observers.inotify_c import inotify_add_watch

    wd = inotify_add_watch(fd, os.fsencode(path), mask)
    if wd < 0:
        err = ctypes_errno()
        raise OSError(err, os.strerror(err), path)
    return wd


class LayoutEmitter(EventEmitter):
    """One prof_dir's shallow inotify watches (see the module doc); events queued as watchdog's event types."""

    def __init__(self, event_queue: Any, watch: Any, *, timeout: float = 1.0,
                 event_filter: list[type[FileSystemEvent]] | None = None,
                 on_overflow: Callable[[], None] = lambda: None, on_watch_limit: WatchLimitCallback | None = None,
                 max_depth: int = 5, gather_rank_dirs: bool = False, gather_s: float = 0.0) -> None:
        super().__init__(event_queue, watch, timeout=timeout, event_filter=event_filter)
        self._gather = gather_rank_dirs
        self._gather_s = gather_s if gather_rank_dirs else 0.0
        self.reads = 0
        """Reads of the inotify fd that returned events (tests, bench)."""
        self._changed: set[str] = set()  # gather_rank_dirs: rank dirs named in the buffer being handled
        self._on_overflow = on_overflow
        self._on_watch_limit = on_watch_limit
        self._max_depth = max_depth
        self._root = os.path.abspath(os.fsdecode(watch.path))
        self._fd = -1
        # wd -> (folder, kind, level below the prof_dir, the rank dir it is or is in ("" above rank dirs))
        self._wds: dict[int, tuple[str, Kind, int, str]] = {}
        self._armed = False
        self._moves: dict[int, str] = {}  # cookie -> source path of a move seen from its IN_MOVED_FROM
        self._created: set[str] = set()  # files whose IN_CREATE came in the buffer being handled
        self.closes_folded = 0
        """``IN_CLOSE_WRITE`` events not queued because the same buffer had the file's ``IN_CREATE`` (module doc)."""
        self._lock = threading.Lock()  # the emitter's thread, and simulate_overflow from another
        self._fd_lock = threading.Lock()  # the fd's reads (emitter thread) against its close (on_thread_stop)

    @property
    def watch_count(self) -> int:
        """inotify watches this emitter holds."""
        return len(self._wds)

    def on_thread_start(self) -> None:
        """Runs in the scheduling thread (watchdog's ``BaseThread.start``): the prof_dir's own watch, so that a
        failure raises to ``schedule`` (the watcher then polls the prof_dir). The rest is armed on the emitter's
        thread."""
        self._fd = _inotify_init()
        try:
            wd = _add_watch(self._fd, self._root, WATCH_MASK)
            kind = self._kind(self._root, 0) or "above"
            self._wds[wd] = (self._root, kind, 0, self._root if kind == "rank" else "")
        except OSError:
            os.close(self._fd)
            self._fd = -1
            raise

    def on_thread_stop(self) -> None:
        """Close the inotify fd, never while the emitter's thread is in ``select``/``read`` on it (``_fd_lock``): a
        descriptor closed under it could be reused at once by another socket of the process (a ZeroMQ connection),
        and the emitter would read that socket's bytes as inotify events (a libzmq stream broken under it aborted
        the coordinator: ``Assertion failed: !_io_error``, after a false ``IN_Q_OVERFLOW``)."""
        with self._fd_lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def simulate_overflow(self) -> None:
        """Handle an ``IN_Q_OVERFLOW`` as if the kernel had sent one (tests, bench); call from any thread."""
        with self._lock:
            self._handle(-1, IN_Q_OVERFLOW, 0, b"")

    def queue_events(self, timeout: float) -> None:
        if not self._armed:
            self._armed = True
            with self._lock:
                self._arm_below(self._root, 0)
        with self._fd_lock:  # on_thread_stop closes the fd only between two reads (its docstring)
            fd = self._fd
            if fd < 0:
                return
            try:
                ready, _, _ = select.select([fd], [], [], timeout)
            except (OSError, ValueError):
                return
            if not ready:
                return
            try:
                buf = os.read(fd, _READ_BYTES)
            except (BlockingIOError, OSError):
                return
        off = 0
        changed: frozenset[str] = frozenset()
        with self._lock:
            self.reads += 1
            self._created.clear()
            while off + _EVENT.size <= len(buf):
                wd, mask, cookie, length = _EVENT.unpack_from(buf, off)
                name = buf[off + _EVENT.size: off + _EVENT.size + length].rstrip(b"\0")
                off += _EVENT.size + length
                self._handle(wd, mask, cookie, name)
            if self._changed:
                changed, self._changed = frozenset(self._changed), set()
                self.queue_event(RankDirsChangedEvent(self._root, rank_dirs=changed))
        if changed and self._gather_s > 0:
            self.stopped_event.wait(self._gather_s)  # let a burst's next events gather in the kernel (module doc)

    # ------------------------------------------------------------------------------------------------ internals
    def _kind(self, path: str, level: int) -> Kind | None:
        if parse_rank_dir_name(os.path.basename(path)) is not None and (level > 0 or path == self._root):
            return "rank"
        return "above" if level < self._max_depth else None

    def _add(self, path: str, kind: Kind | None, level: int) -> bool:
        """Watch ``path``; False when it cannot be watched (gone, or a limit: reported to ``on_watch_limit``)."""
        if kind is None:
            return False
        try:
            wd = _add_watch(self._fd, path, WATCH_MASK)
        except OSError as exc:
            if exc.errno in _LIMIT_ERRNOS:
                if self._on_watch_limit is not None:
                    self._on_watch_limit(path, str(exc))
            return False
        self._wds[wd] = (path, kind, level, path if kind == "rank" else os.path.dirname(path) if kind == "out" else "")
        return True

    def _arm_below(self, path: str, level: int) -> list[str]:
        """Watch what ``path`` (already watched) holds, as the layout says; the rank dirs found below it."""
        kind = self._kind(path, level)
        found: list[str] = []
        if kind == "rank":
            out = os.path.join(path, PROFILER_OUTPUT_DIR)
            if os.path.isdir(out) and not os.path.islink(out):
                self._add(out, "out", level + 1)
            return [path]
        try:
            with os.scandir(path) as it:
                subs = [e.path for e in it if e.is_dir(follow_symlinks=False)]
        except OSError:
            return found
        for sub in subs:
            sub_kind = self._kind(sub, level + 1)
            if self._add(sub, sub_kind, level + 1):
                found.extend(self._arm_below(sub, level + 1))
        return found

    def _handle(self, wd: int, mask: int, cookie: int, name: bytes) -> None:
        if mask & IN_Q_OVERFLOW:
            self._arm_below(self._root, 0)  # re-arm what appeared meanwhile, then the rescan sees everything
            self._on_overflow()
            return
        if mask & IN_IGNORED:
            where = self._wds.pop(wd, None)
            if where is not None and where[0] == self._root:  # the prof_dir went (deleted, unmounted): say so and
                self.queue_event(DirDeletedEvent(self._root))  # stop; the watcher's supervisor re-arms a new one
                self.stop()
            return
        where = self._wds.get(wd)
        if where is None or not name:
            return
        folder, kind, level, rank_dir = where
        is_dir = bool(mask & IN_ISDIR)
        if rank_dir and self._gather and not is_dir and mask & (IN_CREATE | IN_CLOSE_WRITE | IN_DELETE):
            self._changed.add(rank_dir)  # one RankDirsChangedEvent for the whole read (module doc)
            return
        path = os.path.join(folder, os.fsdecode(name))
        if mask & (IN_CREATE | IN_MOVED_TO):
            if is_dir and kind == "above":
                sub_kind = self._kind(path, level + 1)
                if self._add(path, sub_kind, level + 1):
                    for rank_dir in self._arm_below(path, level + 1):
                        if rank_dir != path:  # there before the watch: no event of its own
                            self.queue_event(DirCreatedEvent(rank_dir))
            elif is_dir and kind == "rank" and os.path.basename(path) == PROFILER_OUTPUT_DIR:
                self._add(path, "out", level + 1)
            src = self._moves.pop(cookie, None) if mask & IN_MOVED_TO else None
            if src is not None:
                self.queue_event(DirMovedEvent(src, path) if is_dir else FileMovedEvent(src, path))
            else:
                if not is_dir:
                    self._created.add(path)
                self.queue_event(DirCreatedEvent(path) if is_dir else FileCreatedEvent(path))
        elif mask & IN_CLOSE_WRITE:
            if path in self._created:  # created and closed in one read: its created event already names it
                self.closes_folded += 1
                return
            self.queue_event(FileClosedEvent(path))
        elif mask & IN_DELETE:
            self.queue_event(DirDeletedEvent(path) if is_dir else FileDeletedEvent(path))
        elif mask & IN_MOVED_FROM:
            if len(self._moves) > 1024:
                self._moves.clear()
            self._moves[cookie] = path
            self.queue_event(DirMovedEvent(path, "") if is_dir else FileMovedEvent(path, ""))


def make_inotify_observer(on_overflow: Callable[[], None], on_watch_limit: WatchLimitCallback | None = None,
                          *, max_depth: int = 5, gather_rank_dirs: bool = False,
                          gather_s: float = 0.0) -> BaseObserver:
    """A watchdog observer whose emitters are :class:`LayoutEmitter`: shallow inotify watches that follow the
    rank-dir layout down to ``max_depth`` levels (``WatchSettings.scan_max_depth``), ``on_overflow`` called after an
    inotify queue overflow was re-armed, ``on_watch_limit(directory, error)`` for each folder below a scheduled one
    that a limit kept from being watched (it runs on the emitter's thread and must only record). ``recursive`` of
    ``schedule`` is ignored: the layout decides. ``gather_rank_dirs``: files changed in rank dirs are reported as
    one :class:`RankDirsChangedEvent` per read of the fd (module doc; a handler's ``event_filter`` must let it
    through), not one event per file; ``gather_s``: with it, seconds the emitter waits after a read that named rank
    dirs before it reads again (module doc). Imported lazily by callers: inotify exists only on Linux.
    """

    class _Emitter(LayoutEmitter):
        def __init__(self, event_queue: Any, watch: Any, *, timeout: float = 1.0,
                     event_filter: list[type[FileSystemEvent]] | None = None) -> None:
            super().__init__(event_queue, watch, timeout=timeout, event_filter=event_filter,
                             on_overflow=on_overflow, on_watch_limit=on_watch_limit, max_depth=max_depth,
                             gather_rank_dirs=gather_rank_dirs, gather_s=gather_s)

    class _Observer(BaseObserver):
        def __init__(self) -> None:
            super().__init__(_Emitter, timeout=0.5)

        def simulate_overflow(self) -> None:
            """An ``IN_Q_OVERFLOW`` in every emitter (tests, bench)."""
            for em in list(self.emitters):
                if isinstance(em, LayoutEmitter):
                    em.simulate_overflow()

        def watch_count(self) -> int:
            """inotify watches held by all emitters."""
            return sum(em.watch_count for em in list(self.emitters) if isinstance(em, LayoutEmitter))

    return _Observer()
