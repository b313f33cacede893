"""watchdog's inotify observer, extended to report queue overflows and watch-limit failures (I/O adapter; Linux).

``daemon/profwatch/adapters/fs/prof_watch.py`` uses it. watchdog 7 only logs an inotify queue overflow and silently skips
directories below a recursive watch whose watch cannot be added (``fs.inotify.max_user_watches`` reached:
ENOSPC; instance limit: EMFILE). This subclass reports both, so the watcher can rescan and poll what could
not be watched (docs/field-cases.md#fc-17). It subclasses watchdog internals (``InotifyFD``,
``InotifyObserver``): pyproject.toml bounds watchdog to the major version tested (7.x).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable

from watchdog.observers.api import BaseObserver

WatchLimitCallback = Callable[[str, str], None]
"""``(directory, error)``: inotify could not add a watch for ``directory`` (a limit was reached)."""
_LIMIT_ERRNOS = (errno.ENOSPC, errno.EMFILE)


def make_inotify_observer(on_overflow: Callable[[], None],
                          on_watch_limit: WatchLimitCallback | None = None) -> BaseObserver:
    """watchdog's InotifyObserver whose inotify reader also reports ``IN_Q_OVERFLOW`` to ``on_overflow`` and every
    watch it could not add because of a limit (ENOSPC, EMFILE) to ``on_watch_limit(directory, error)``.

    watchdog 7 only logs an overflow and rebuilds its own watches (removes and re-adds every one: changes made
    meanwhile raise no event); ``on_overflow`` runs once that rebuild is done, so the rescan it asks for sees what
    was lost before and during it (docs/field-cases.md#fc-17). It silently skips directories below a recursive watch whose watch
    cannot be added. ``on_watch_limit`` runs on whichever thread adds the watch, holding watchdog's locks: it
    must only record (never block or call back into the observer). Imported lazily: inotify exists only on Linux.
    """
    from watchdog.observers.inotify import InotifyEmitter, InotifyObserver
    from watchdog.observers.inotify_c import InotifyEvent, InotifyFD, WatchCallback, WatchDescriptor

    class _FD(InotifyFD):
        def handle_event(self, event: InotifyEvent) -> None:
            super().handle_event(event)
            if event.is_queue_overflow:  # after watchdog re-armed its watches: a rescan then misses nothing
                on_overflow()

        def add_callback(self, path: bytes, mask: int, callback: WatchCallback, id_: object) -> WatchDescriptor:
            try:
                return super().add_callback(path, mask, callback, id_)  # type: ignore[arg-type]
            except OSError as exc:
                if exc.errno in _LIMIT_ERRNOS and on_watch_limit is not None:
                    on_watch_limit(os.fsdecode(path), str(exc))
                raise

    class _Observer(InotifyObserver):
        def __init__(self) -> None:
            self._inotify_fd = _FD()
            self._inotify_fd.start()
            self.inotify_fd: InotifyFD = self._inotify_fd  # public: lets tests inject an overflow event
            BaseObserver.__init__(self, InotifyEmitter, inotify_fd=self._inotify_fd)

    return _Observer()
