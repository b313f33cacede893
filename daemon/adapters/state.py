"""Coordinator state in SQLite (stdlib ``sqlite3``; I/O): jobs, ranks, nodes, captures, batches, events/alerts.

A restart loses nothing that matters: the registry (jobs, ranks, last steps), every capture and its state, batch
results, and every published event (alerts are re-served to late subscribers from here, FC-20). WAL mode; the
connection belongs to the thread that created it (the coordinator's main loop).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs(
  job_id TEXT PRIMARY KEY, world_size INTEGER NOT NULL, backend TEXT, profiler_config_path TEXT, prof_root TEXT,
  first_seen_unix_s REAL, started_unix_s REAL, versions TEXT);
CREATE TABLE IF NOT EXISTS ranks(
  job_id TEXT NOT NULL, rank INTEGER NOT NULL, hostname TEXT, node_id TEXT, pid INTEGER, local_rank INTEGER,
  backend TEXT, last_step INTEGER, last_step_time_s REAL, seen_unix_s REAL, left INTEGER DEFAULT 0,
  PRIMARY KEY(job_id, rank));
CREATE TABLE IF NOT EXISTS nodes(
  node_id TEXT PRIMARY KEY, hostname TEXT, pid INTEGER, last_seen_unix_s REAL, counters TEXT);
CREATE TABLE IF NOT EXISTS captures(
  capture_id TEXT PRIMARY KEY, job_id TEXT NOT NULL, state TEXT NOT NULL, reason TEXT, created_unix_s REAL,
  updated_unix_s REAL, plan TEXT, detail TEXT);
CREATE TABLE IF NOT EXISTS batches(
  batch_id TEXT PRIMARY KEY, capture_id TEXT, job_id TEXT, status TEXT, updated_unix_s REAL, result TEXT);
CREATE TABLE IF NOT EXISTS events(
  seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL, type TEXT NOT NULL, job_id TEXT,
  time TEXT, is_alert INTEGER NOT NULL DEFAULT 0, body TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS events_job ON events(job_id, seq);
"""

ACTIVE_CAPTURE_STATES = ("planned", "written", "acknowledged", "capturing", "collecting", "analysing")


class StateStore:
    """Thin persistence layer; every method is one short transaction.

    Args:
        path: SQLite file (parent folders are created); ``":memory:"`` for tests.
    Raises:
        sqlite3.DatabaseError: the file is not a usable database (the daemon refuses to start with a clear error).
    """

    def __init__(self, path: str | Path) -> None:
        if str(path) != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.path = str(path)
        # built by the thread that constructs the coordinator, then used only by its main loop thread
        self.db = sqlite3.connect(self.path, isolation_level=None, timeout=10, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(SCHEMA)

    def close(self) -> None:
        self.db.close()

    # -- registry -------------------------------------------------------------------------------------------------
    def save_registry(self, jobs: list[dict[str, Any]], ranks: list[tuple], nodes: list[tuple]) -> None:
        """Upsert jobs, ranks ``(job_id, rank, hostname, node_id, pid, local_rank, backend, last_step,
        last_step_time_s, seen_unix_s, left)`` and nodes ``(node_id, hostname, pid, last_seen_unix_s, counters_json)``."""
        with self.db:
            self.db.execute("BEGIN")
            self.db.executemany(
                "INSERT INTO jobs VALUES(:job_id,:world_size,:backend,:profiler_config_path,:prof_root,"
                ":first_seen_unix_s,:started_unix_s,:versions) ON CONFLICT(job_id) DO UPDATE SET "
                "world_size=excluded.world_size, backend=excluded.backend,"
                "profiler_config_path=excluded.profiler_config_path, prof_root=excluded.prof_root,"
                "started_unix_s=excluded.started_unix_s, versions=excluded.versions",
                jobs,
            )
            self.db.executemany("INSERT OR REPLACE INTO ranks VALUES(?,?,?,?,?,?,?,?,?,?,?)", ranks)
            self.db.executemany("INSERT OR REPLACE INTO nodes VALUES(?,?,?,?,?)", nodes)

    def load_registry(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
        """Return ``(jobs, ranks, nodes)`` as dict rows."""
        self.db.row_factory = sqlite3.Row
        try:
            jobs = [dict(r) for r in self.db.execute("SELECT * FROM jobs")]
            ranks = [dict(r) for r in self.db.execute("SELECT * FROM ranks")]
            nodes = [dict(r) for r in self.db.execute("SELECT * FROM nodes")]
        finally:
            self.db.row_factory = None
        return jobs, ranks, nodes

    # -- captures and batches -------------------------------------------------------------------------------------
    def upsert_capture(
        self, capture_id: str, job_id: str, state: str, now: float, *, reason: str | None = None,
        plan: dict[str, Any] | None = None, detail: dict[str, Any] | None = None,
    ) -> None:
        """Create or update a capture row (``plan``/``detail`` are merged JSON objects)."""
        row = self.get_capture(capture_id)
        if row is None:
            self.db.execute(
                "INSERT INTO captures VALUES(?,?,?,?,?,?,?,?)",
                (capture_id, job_id, state, reason, now, now, json.dumps(plan or {}), json.dumps(detail or {})),
            )
            return
        new_plan = row["plan"] | (plan or {})
        new_detail = row["detail"] | (detail or {})
        self.db.execute(
            "UPDATE captures SET state=?, updated_unix_s=?, plan=?, detail=?, reason=COALESCE(?, reason) WHERE capture_id=?",
            (state, now, json.dumps(new_plan), json.dumps(new_detail), reason, capture_id),
        )

    def get_capture(self, capture_id: str) -> dict[str, Any] | None:
        cur = self.db.execute(
            "SELECT capture_id, job_id, state, reason, created_unix_s, updated_unix_s, plan, detail FROM captures "
            "WHERE capture_id=?",
            (capture_id,),
        )
        r = cur.fetchone()
        return None if r is None else self._capture_row(r)

    def capture_state_summary(self) -> dict[str, tuple[int, float | None]]:
        """state -> (number of captures in it, oldest ``created_unix_s`` among them), for metrics."""
        rows = self.db.execute("SELECT state, COUNT(*), MIN(created_unix_s) FROM captures GROUP BY state").fetchall()
        return {r[0]: (int(r[1]), r[2]) for r in rows}

    def captures(self, job_id: str | None = None, states: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
        """Captures, oldest first, optionally filtered by job and state."""
        q = "SELECT capture_id, job_id, state, reason, created_unix_s, updated_unix_s, plan, detail FROM captures"
        cond, args = [], []
        if job_id is not None:
            cond.append("job_id=?")
            args.append(job_id)
        if states:
            cond.append(f"state IN ({','.join('?' * len(states))})")
            args.extend(states)
        if cond:
            q += " WHERE " + " AND ".join(cond)
        return [self._capture_row(r) for r in self.db.execute(q + " ORDER BY created_unix_s", args)]

    @staticmethod
    def _capture_row(r: tuple) -> dict[str, Any]:
        return {
            "capture_id": r[0], "job_id": r[1], "state": r[2], "reason": r[3], "created_unix_s": r[4],
            "updated_unix_s": r[5], "plan": json.loads(r[6] or "{}"), "detail": json.loads(r[7] or "{}"),
        }

    def save_batch(self, batch_id: str, capture_id: str | None, job_id: str | None, status: str, now: float,
                   result: dict[str, Any]) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO batches VALUES(?,?,?,?,?,?)",
            (batch_id, capture_id, job_id, status, now, json.dumps(result, default=str)),
        )

    def get_batch(self, batch_id: str) -> dict[str, Any] | None:
        r = self.db.execute("SELECT batch_id, capture_id, job_id, status, updated_unix_s, result FROM batches "
                            "WHERE batch_id=?", (batch_id,)).fetchone()
        if r is None:
            return None
        return {"batch_id": r[0], "capture_id": r[1], "job_id": r[2], "status": r[3], "updated_unix_s": r[4],
                "result": json.loads(r[5] or "{}")}

    # -- events ---------------------------------------------------------------------------------------------------
    def add_event(self, event: dict[str, Any], is_alert: bool) -> bool:
        """Store a CloudEvent; return False if its ``id`` was already stored (no duplicate alerts)."""
        try:
            self.db.execute(
                "INSERT INTO events(id, type, job_id, time, is_alert, body) VALUES(?,?,?,?,?,?)",
                (event["id"], event["type"], event.get("subject"), event.get("time"), int(is_alert),
                 json.dumps(event, default=str)),
            )
            return True
        except sqlite3.IntegrityError:
            return False

    def events(self, *, job_id: str | None = None, alerts_only: bool = True, since_seq: int = 0,
               limit: int = 100) -> list[tuple[int, dict[str, Any]]]:
        """Return ``[(seq, event)]`` newest last (at most ``limit``, the most recent ones)."""
        q = "SELECT seq, body FROM events WHERE seq > ?"
        args: list[Any] = [since_seq]
        if alerts_only:
            q += " AND is_alert = 1"
        if job_id:
            q += " AND job_id = ?"
            args.append(job_id)
        q += " ORDER BY seq DESC LIMIT ?"
        args.append(limit)
        rows = self.db.execute(q, args).fetchall()
        return [(seq, json.loads(body)) for seq, body in reversed(rows)]

    def iter_events(self, types: Sequence[str], since_seq: int = 0) -> Iterator[dict[str, Any]]:
        """Stored events of the given types, oldest first (streamed; used to rebuild sink state at start)."""
        if not types:
            return
        q = f"SELECT body FROM events WHERE seq > ? AND type IN ({','.join('?' * len(types))}) ORDER BY seq"
        cur = self.db.execute(q, [since_seq, *types])
        try:
            while rows := cur.fetchmany(500):
                for (body,) in rows:
                    yield json.loads(body)
        finally:
            cur.close()
