"""Read the coordinator's state db without the coordinator (I/O: sqlite3, read-only): stored events for
``profwatch alerts``, the last recorded jobs, nodes and captures for ``profwatch status``, when the coordinator
is down.

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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

T = TypeVar("T")


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


def _readable(path: str | Path) -> Path:
    """``path`` as a Path once it exists and this user may read it; raises :class:`StateUnreadable` otherwise."""
    p = Path(path)
    if not p.exists():
        raise StateUnreadable(f"no state db at {p} (the coordinator's [coordinator] state_db)")
    if not os.access(p, os.R_OK) or not os.access(p.parent, os.X_OK):
        raise StateUnreadable(f"this user may not read the state db {p}{_who_may_read(p)}: run as a user the file "
                              "permits (its group), or ask an operator")
    return p


def _read_only(p: Path, run: Callable[[sqlite3.Connection], T], notes: list[str], what: str) -> T:
    """``run`` over the state db opened read-only; a WAL file in a folder this user cannot write is read without
    its ``-wal`` (``immutable``), noted in ``notes`` (``what``: what may be missing); so is a file another process
    kept locked past the 5 s timeout (read without its lock, noted too). Raises StateUnreadable."""
    def attempt(immutable: bool) -> T:
        db = _connect(p, immutable)
        try:
            return run(db)
        finally:
            db.close()

    try:
        try:
            return attempt(immutable=False)
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                raise
            got = attempt(immutable=True)  # WAL file in a folder this user cannot write: read the main file
            wal = Path(f"{p}-wal")
            if wal.exists() and wal.stat().st_size > 0:
                notes.append(f"read without {wal.name} ({exc}): the newest {what} may be missing")
            elif "locked" in str(exc):  # a writer held it past the timeout: read without its lock
                notes.append(f"read without waiting for the process writing it ({exc}): what it was writing may be "
                             "missing or inconsistent")
            return got
    except sqlite3.DatabaseError as exc:
        raise StateUnreadable(f"{p} is not a readable profwatch state db: {exc}") from None


def read_events(path: str | Path, *, job_id: str | None = None, alerts_only: bool = True,
                limit: int = 100) -> OfflineEvents:
    """The most recent ``limit`` stored events (alerts only by default; of ``job_id`` when given), oldest first.

    Raises:
        StateUnreadable: no file at ``path``, this user may not read it (the message names its owner, group and
            mode), or it is not a profwatch state db.
    """
    p = _readable(path)
    out = OfflineEvents(str(p))
    q, args = events_query(job_id=job_id, alerts_only=alerts_only, since_seq=0, limit=limit)
    rows = _read_only(p, lambda db: db.execute(q, args).fetchall(), out.notes, "events")
    for seq, body in reversed(rows):
        try:
            out.rows.append((int(seq), json.loads(body)))
        except (ValueError, TypeError):
            out.notes.append(f"event #{seq} is not valid JSON; skipped")
    return out


@dataclass
class OfflineStatus:
    """The coordinator's last recorded state, read from its state db (``profwatch status`` while it is down).

    ``recorded_unix_s``: the newest time the file holds (a rank or node last heard, a capture's or episode's last
    change, a batch stored; None when it holds none of them); ``jobs``: ``[{"job_id", "world_size",
    "generation", "ranks", "left", "last_step", "seen_unix_s"}]``; ``nodes``: ``[{"node_id", "hostname",
    "last_seen_unix_s"}]``; ``captures``: the newest 20 (of the job), oldest first, ``[{"capture_id", "job_id",
    "state", "state_since_unix_s", "reason", "start_step", "outcome"}]``; ``notes``: caveats to show."""

    path: str
    recorded_unix_s: float | None = None
    jobs: list[dict[str, Any]] = field(default_factory=list)
    nodes: list[dict[str, Any]] = field(default_factory=list)
    captures: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"offline": True, "state_db": self.path, "recorded_unix_s": self.recorded_unix_s, "jobs": self.jobs,
                "nodes": self.nodes, "captures": self.captures, "notes": self.notes}


_STATUS_COLUMNS = {
    "jobs": ("job_id", "world_size", "generation", "ranks", "left", "last_step", "seen_unix_s"),
    "nodes": ("node_id", "hostname", "last_seen_unix_s"),
    "captures": ("capture_id", "job_id", "state", "state_since_unix_s", "reason", "start_step", "outcome"),
}
_STATUS_QUERIES = {
    "jobs": ("SELECT j.job_id, j.world_size, {generation}, COUNT(r.rank), COALESCE(SUM(r.left), 0), "
             "MAX(r.last_step), MAX(r.seen_unix_s) FROM jobs j LEFT JOIN ranks r ON r.job_id = j.job_id "
             "WHERE (? IS NULL OR j.job_id = ?) GROUP BY j.job_id ORDER BY j.job_id"),
    "nodes": "SELECT node_id, hostname, last_seen_unix_s FROM nodes ORDER BY node_id",
    "captures": ("SELECT capture_id, job_id, state, state_since_unix_s, reason, start_step, outcome FROM captures "
                 "WHERE (? IS NULL OR job_id = ?) ORDER BY created_unix_s DESC LIMIT 20"),
}
_RECORDED = (("ranks", "seen_unix_s"), ("nodes", "last_seen_unix_s"), ("captures", "state_since_unix_s"),
             ("episodes", "updated_unix_s"), ("batches", "updated_unix_s"))
"""The tables and columns whose newest time is the record's time (each read when the file has it)."""


def _status_rows(db: sqlite3.Connection, job_id: str | None) -> tuple[dict[str, list[Any]], list[str]]:
    """The status queries over ``db``, each on the tables and columns the file has: a file an older profwatch
    wrote (``state.py``'s schema versions: no ``jobs.generation`` before version 3, no ``episodes`` table before
    episodes, version-1 captures) is read for what it holds, never refused whole (the coordinator migrates it on
    its next start; until then ``status`` is all there is). Returns the rows and notes saying what could not be
    read. Raises ``sqlite3.OperationalError`` (no such table) for a file with neither jobs nor captures."""
    cols = {t: {r[1] for r in db.execute(f"PRAGMA table_info({t})")}
            for t in ("jobs", "ranks", "nodes", "captures", "episodes", "batches")}
    if not cols["jobs"] and not cols["captures"]:
        raise sqlite3.OperationalError("no such table: jobs")
    notes: list[str] = []
    version = db.execute("PRAGMA user_version").fetchone()[0]
    args = {"jobs": [job_id, job_id], "nodes": [], "captures": [job_id, job_id]}
    out: dict[str, list[Any]] = {}
    for k, q in _STATUS_QUERIES.items():
        q = q.replace("{generation}", "j.generation" if "generation" in cols["jobs"] else "0")
        try:
            out[k] = db.execute(q, args[k]).fetchall()
        except sqlite3.OperationalError as exc:
            if "no such" not in str(exc):
                raise
            out[k] = []
            notes.append(f"no {k} read: the file has an older schema (version {version}; {exc}), which the "
                         "coordinator migrates when it starts")
    times = [db.execute(f"SELECT MAX({c}) FROM {t}").fetchone()[0] for t, c in _RECORDED if c in cols[t]]
    out["recorded"] = [(max((x for x in times if isinstance(x, (int, float))), default=None),)]
    return out, notes


def read_status(path: str | Path, *, job_id: str | None = None) -> OfflineStatus:
    """The last recorded jobs, nodes and captures (of ``job_id`` when given) in the state db at ``path``, read-only
    (the same access rules and WAL fallback as :func:`read_events`); a file an older profwatch wrote is read for
    what it holds (:func:`_status_rows`).

    Raises:
        StateUnreadable: as :func:`read_events`.
    """
    p = _readable(path)
    out = OfflineStatus(str(p))
    rows, older = _read_only(p, lambda db: _status_rows(db, job_id), out.notes, "state")
    out.notes += older
    out.jobs = [dict(zip(_STATUS_COLUMNS["jobs"], r, strict=True)) for r in rows["jobs"]]
    out.nodes = [dict(zip(_STATUS_COLUMNS["nodes"], r, strict=True)) for r in rows["nodes"]]
    out.captures = [dict(zip(_STATUS_COLUMNS["captures"], r, strict=True)) for r in reversed(rows["captures"])]
    out.recorded_unix_s = rows["recorded"][0][0] if rows["recorded"] else None
    return out
