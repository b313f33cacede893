"""Opening the coordinator's state store at start, and what happens to a corrupt one (I/O: file checks, rename).

A state db that SQLite cannot use (the file header is not ``SQLite format 3``, ``PRAGMA integrity_check`` does not
answer ``ok``, or opening it raises ``sqlite3.DatabaseError``) is moved aside, never deleted: renamed to
``<name>.corrupt-<UTC time>`` with its ``-wal``/``-shm`` files, and the coordinator starts with an empty store and
publishes ``state_store_reset`` (what was lost, as far as the damaged file still tells, and what comes back by
itself). A db of a newer schema is not corrupt: :class:`~profwatch.adapters.store.state.StateSchemaError` still
stops the start (exit 2), as the file is fine for the profwatch that wrote it.

Sources: the header string and the integrity check are SQLite's (https://www.sqlite.org/fileformat.html section
1.3, https://www.sqlite.org/pragma.html#pragma_integrity_check). ``integrity_check`` reads the whole file: about
one second per few hundred MB on a local disk, once per start.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from profwatch.adapters.store.state import StateSchemaError, StateStore
from profwatch.core.capture.lifecycle import IN_FLIGHT

log = structlog.get_logger("profwatch.state")
SQLITE_HEADER = b"SQLite format 3\x00"
REBUILT_FROM_NODES = ("jobs, their ranks and last steps (every node re-registers its ranks when it reconnects)",
                      "node records (at the next heartbeat)")
"""What comes back by itself after a reset (the ``state_store_reset`` event says it)."""

_LOST_QUERIES: dict[str, str] = {
    "pinned_jobs": "SELECT COUNT(*) FROM jobs",
    "captures_in_flight": "SELECT COUNT(*) FROM captures WHERE state IN ({in_flight})",
    "captures": "SELECT COUNT(*) FROM captures",
    "queued_deliveries": "SELECT COUNT(*) FROM sink_outbox",
    "events": "SELECT COUNT(*) FROM events",
    "batches": "SELECT COUNT(*) FROM batches",
    "open_episodes": "SELECT COUNT(*) FROM episodes WHERE open=1",
}


@dataclass(frozen=True, slots=True)
class StoreReset:
    """A corrupt state db moved aside at start: ``moved_to`` (the kept file), ``problem`` (what was wrong),
    ``lost`` (row counts per kind the damaged file still gave; ``None`` for a kind it could not tell), and
    ``rebuilt`` (what comes back from the nodes)."""

    path: str
    moved_to: str
    problem: str
    lost: dict[str, int | None] = field(default_factory=dict)
    rebuilt: tuple[str, ...] = REBUILT_FROM_NODES

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "moved_to": self.moved_to, "problem": self.problem, "lost": dict(self.lost),
                "rebuilt_from_nodes": list(self.rebuilt),
                "not_rebuilt": "captures in flight and their analyses, queued webhook deliveries, stored events, "
                               "verdicts and open episodes (the moved file keeps them for inspection)"}


def check_file(path: Path) -> str | None:
    """What is wrong with an existing state db file (None: usable, or absent/empty, which SQLite creates).
    Never raises for a damaged file. Opened read-write as the store itself would be (a read-only open fails on a
    healthy WAL file whose ``-shm`` is missing), so a crash's WAL is recovered first."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(SQLITE_HEADER))
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot read: {exc.strerror}"
    if not head:
        return None
    if head != SQLITE_HEADER:
        return f"not an SQLite database (header {head[:16]!r})"
    try:
        db = sqlite3.connect(path, timeout=10)
    except sqlite3.Error as exc:
        return f"cannot open: {exc}"
    try:
        rows = db.execute("PRAGMA integrity_check(20)").fetchall()
    except sqlite3.DatabaseError as exc:
        return f"integrity_check failed: {exc}"
    finally:
        db.close()
    if [tuple(r) for r in rows] != [("ok",)]:
        return "integrity_check: " + "; ".join(str(r[0]) for r in rows[:5])
    return None


def _count_lost(path: Path) -> dict[str, int | None]:
    lost: dict[str, int | None] = {}
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
    except sqlite3.Error:
        return {k: None for k in _LOST_QUERIES}
    in_flight = ",".join(f"'{s.value}'" for s in IN_FLIGHT)
    try:
        for kind, q in _LOST_QUERIES.items():
            try:
                lost[kind] = int(db.execute(q.format(in_flight=in_flight)).fetchone()[0])
            except sqlite3.Error:
                lost[kind] = None
    finally:
        db.close()
    return lost


def move_aside(path: Path, problem: str, now_unix_s: float) -> StoreReset:
    """Rename a corrupt db (and its ``-wal``/``-shm``) to ``<name>.corrupt-<UTC time>``; count what it held first.

    Raises:
        OSError: the file cannot be renamed (then the daemon cannot start: exit 2 with the reason).
    """
    lost = _count_lost(path)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now_unix_s))
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
    path.rename(target)
    for suffix in ("-wal", "-shm"):
        side = path.with_name(path.name + suffix)
        if side.exists():
            side.rename(target.with_name(target.name + suffix))
    reset = StoreReset(str(path), str(target), problem, lost)
    log.error("state_db_corrupt", path=str(path), moved_to=str(target), problem=problem, lost=lost,
              note="started with an empty state store; the damaged file is kept")
    return reset


def open_state_store(path: str | Path, now_unix_s: float, **kw: Any) -> tuple[StateStore, StoreReset | None]:
    """Open the state store; a corrupt file is moved aside and an empty store opened (module doc).

    Returns ``(store, reset or None)``. ``kw`` goes to :class:`StateStore`.
    Raises:
        StateSchemaError: the file is of a newer schema (or an unknown captures table): not moved, not used.
        OSError: a corrupt file cannot be moved aside.
    """
    if str(path) == ":memory:":
        return StateStore(path, **kw), None
    p = Path(path)
    problem = check_file(p)
    if problem is None:
        try:
            return StateStore(p, **kw), None
        except StateSchemaError:
            raise
        except sqlite3.DatabaseError as exc:
            problem = f"cannot open: {exc}"
    reset = move_aside(p, problem, now_unix_s)
    return StateStore(p, **kw), reset
