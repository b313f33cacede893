"""Writes the coordinator's state store could not take (disk full, I/O error), kept for a retry (helper of
``daemon/profwatch/adapters/store/state.py``; holds SQLite writes as closures, performs them only when the store asks).

Bounded by items and bytes (``[limits] state_retry_queue_items`` / ``state_retry_queue_bytes``). When full, the
oldest *event* that is not an alert goes first, then the oldest alert; capture, batch and episode rows are never
dropped (there is at most one pending row per capture, batch or episode: a newer write of the same row replaces the older one).
"""

from __future__ import annotations

import sqlite3
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

Kind = Literal["event", "capture", "batch", "episode"]


@dataclass(slots=True)
class PendingWrite:
    """One write to redo: ``write(db)`` inside the caller's transaction. ``event`` is the CloudEvent for events."""

    kind: Kind
    key: str
    write: Callable[[sqlite3.Connection], None]
    size_bytes: int
    queued_unix_s: float
    is_alert: bool = False
    event: dict[str, Any] | None = field(default=None, repr=False)
    record: Any = field(default=None, repr=False)
    """What the write stores, for reads while it waits (a capture: its ``Capture``)."""


class RetryQueue:
    """Pending writes in arrival order, at most one per ``(kind, key)``.

    Args:
        max_items, max_bytes: the bounds (module doc for what is dropped first).
    """

    def __init__(self, max_items: int, max_bytes: int) -> None:
        self.max_items = max_items
        self.max_bytes = max_bytes
        self._items: OrderedDict[tuple[str, str], PendingWrite] = OrderedDict()
        self._droppable: tuple[OrderedDict[str, None], OrderedDict[str, None]] = (OrderedDict(), OrderedDict())
        """Event keys in arrival order: (non-alerts, alerts), so the bound's victim is found in O(1)."""
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: tuple[str, str]) -> bool:
        return key in self._items

    def __iter__(self) -> Iterator[PendingWrite]:
        return iter(list(self._items.values()))

    def put(self, w: PendingWrite) -> list[PendingWrite]:
        """Queue ``w`` (replacing a pending write of the same row); return what the bounds dropped."""
        self.discard(w.kind, w.key)
        self._items[(w.kind, w.key)] = w
        self.bytes += w.size_bytes
        if w.kind == "event":
            self._droppable[w.is_alert][w.key] = None
        dropped: list[PendingWrite] = []
        while len(self._items) > self.max_items or self.bytes > self.max_bytes:
            victim = self._victim()
            if victim is None:
                break
            self.discard(victim.kind, victim.key)
            dropped.append(victim)
        return dropped

    def _victim(self) -> PendingWrite | None:
        for keys in self._droppable:
            if keys:
                return self._items[("event", next(iter(keys)))]
        return None

    def discard(self, kind: str, key: str) -> None:
        w = self._items.pop((kind, key), None)
        if w is not None:
            self.bytes -= w.size_bytes
            if kind == "event":
                self._droppable[w.is_alert].pop(key, None)

    def events(self) -> list[tuple[dict[str, Any], bool]]:
        """The pending events with whether each is an alert, oldest first."""
        return [(w.event, w.is_alert) for w in self._items.values() if w.kind == "event" and w.event is not None]

    def records(self, kind: Kind) -> list[Any]:
        """The ``record`` of every pending write of ``kind``, oldest first."""
        return [w.record for w in self._items.values() if w.kind == kind and w.record is not None]

    def flush(self, db: sqlite3.Connection) -> tuple[int, list[tuple[PendingWrite, str]]]:
        """Perform every pending write in one transaction. Returns ``(written, rejected)``: a write the database
        rejects for its content (not for the disk) is dropped and returned with the reason, so it cannot block the
        queue. Raises ``sqlite3.OperationalError`` (disk full, I/O error, locked): nothing was written, all kept."""
        if not self._items:
            return 0, []
        rejected: list[tuple[PendingWrite, str]] = []
        with db:
            db.execute("BEGIN")
            for w in list(self._items.values()):
                try:
                    w.write(db)
                except sqlite3.OperationalError:
                    raise
                except sqlite3.Error as exc:
                    rejected.append((w, repr(exc)))
        written = len(self._items) - len(rejected)
        self._items.clear()
        for keys in self._droppable:
            keys.clear()
        self.bytes = 0
        return written, rejected
