"""Read the coordinator's state db without the coordinator (I/O: sqlite3, read-only): stored events for
``profwatch alerts`` when the coordinator is down.

Opened with SQLite's read-only URI mode (``mode=ro``, https://www.sqlite.org/uri.html): nothing is created,
migrated or written, and the file's permissions decide who may read it (the systemd unit keeps it in a 0750
``StateDirectory``, so only the profwatch user and its group can; nobody else learns more offline than the
coordinator would tell them). A WAL-mode file whose ``-shm`` index cannot be created (read-only folder) is
opened ``immutable`` instead, which ignores writes not yet checkpointed into the main file; the result says so.
"""

from __future__ import annotations

import json
import os
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote


class StateUnreadable(Exception):
    """The state db cannot be read by this user (missing, permission denied, not a profwatch state db)."""


@dataclass
class OfflineEvents:
    """Stored events, oldest first: ``rows`` = ``[(seq, CloudEvent dict)]``; ``notes`` = caveats to show."""

    path: str
    rows: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _who_may_read(path: Path) -> str:
    try:
        st = path.stat()
    except OSError:
        return ""
    import grp
    import pwd

    def name(fn: Any, ident: int) -> str:
        try:
            return str(fn(ident)[0])
        except KeyError:
            return str(ident)

    return (f" (owner {name(pwd.getpwuid, st.st_uid)}, group {name(grp.getgrgid, st.st_gid)}, "
            f"mode {oct(st.st_mode & 0o777)})")


def events_query(*, job_id: str | None, alerts_only: bool, since_seq: int, limit: int) -> tuple[str, list[Any]]:
    """The SQL and arguments for the most recent ``limit`` events after ``since_seq`` (newest first), of
    ``job_id`` when given, alerts only when asked: one query for the live store and the offline reader."""
    q = "SELECT seq, body FROM events WHERE seq > ?"
    args: list[Any] = [since_seq]
    if alerts_only:
        q += " AND is_alert = 1"
    if job_id:
        q += " AND job_id = ?"
        args.append(job_id)
    q += " ORDER BY seq DESC LIMIT ?"
    args.append(int(limit))
    return q, args


def _connect(path: Path, immutable: bool) -> sqlite3.Connection:
    uri = f"file:{quote(str(path))}?mode=ro" + ("&immutable=1" if immutable else "")
    return sqlite3.connect(uri, uri=True, timeout=5)


def read_events(path: str | Path, *, job_id: str | None = None, alerts_only: bool = True,
                limit: int = 100) -> OfflineEvents:
    """The most recent ``limit`` stored events (alerts only by default; of ``job_id`` when given), oldest first.

    Raises:
        StateUnreadable: no file at ``path``, this user may not read it (the message names its owner, group and
            mode), or it is not a profwatch state db.
    """
    p = Path(path)
    if not p.exists():
        raise StateUnreadable(f"no state db at {p} (the coordinator's [coordinator] state_db)")
    if not os.access(p, os.R_OK) or not os.access(p.parent, os.X_OK):
        raise StateUnreadable(f"this user may not read the state db {p}{_who_may_read(p)}: run as a user the file "
                              "permits (its group), or ask an operator")
    out = OfflineEvents(str(p))
    q, args = events_query(job_id=job_id, alerts_only=alerts_only, since_seq=0, limit=limit)
    def query(immutable: bool) -> list[Any]:
        db = _connect(p, immutable)
        try:
            return db.execute(q, args).fetchall()
        finally:
            db.close()

    try:
        try:
            rows = query(immutable=False)
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                raise
            rows = query(immutable=True)  # WAL file in a folder this user cannot write: read the main file
            wal = Path(f"{p}-wal")
            if wal.exists() and wal.stat().st_size > 0:
                out.notes.append(f"read without {wal.name} ({exc}): the newest events may be missing")
    except sqlite3.DatabaseError as exc:
        raise StateUnreadable(f"{p} is not a readable profwatch state db: {exc}") from None
    for seq, body in reversed(rows):
        try:
            out.rows.append((int(seq), json.loads(body)))
        except (ValueError, TypeError):
            out.notes.append(f"event #{seq} is not valid JSON; skipped")
    return out
