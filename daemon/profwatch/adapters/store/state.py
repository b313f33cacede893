"""Coordinator state in SQLite (stdlib ``sqlite3``; I/O): jobs, ranks, nodes, captures, batches, events/alerts.

A restart loses nothing that matters: the registry (jobs, ranks, last steps), every capture with its plan, state,
deadlines, per-rank acknowledgements and per-node writes (typed columns, ``profwatch.core.capture.lifecycle.Capture`` in and
out), batch results, and every published event (alerts are re-served to late subscribers from here). WAL mode;
the connection belongs to the thread that created it (the coordinator's main loop).

Schema versions (``PRAGMA user_version``): 0/absent with a ``captures.plan`` column = version 1 (captures as JSON
``plan``/``detail`` blobs), migrated in place on open (the old table is kept as ``captures_v1``); 2 = typed capture
rows; 3 = ``jobs.generation``, ``jobs.restart_count`` (added to a version-2 file in place); 4 = this one
(``captures.idle_owed``: added in place, derived for the rows already there by
``daemon/profwatch/adapters/store/state_migrate.py``). A newer version is refused with :class:`StateSchemaError`.
The ``sink_outbox`` table (a sink's undelivered events, in order) and the ``episodes`` table (anomaly episodes,
``daemon/profwatch/core/arming/episodes.py``) are created when missing without a version change: an older
profwatch ignores them.

A write the disk refuses (``SQLITE_FULL``, an I/O error) loses nothing the coordinator still holds: events, capture
rows and batch results go to a bounded retry queue (``daemon/profwatch/adapters/store/state_retry.py``) and :meth:`StateStore.retry`
writes them later; an event's unique ``id`` still drops duplicates meanwhile (the queue, a memory of recent ids, and
a read of the file, which works on a full disk). The caller publishes regardless and raises ``storage_failed``.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from enum import Enum
from pathlib import Path
from typing import Any

import structlog

from profwatch.adapters.store.capture_rows import CAPTURE_COLS, CAPTURE_SCHEMA, RANK_COLS, write_capture
from profwatch.adapters.store.state_migrate import add_idle_owed, migrate_v1_captures
from profwatch.adapters.store.state_reader import events_query
from profwatch.adapters.store.state_retry import PendingWrite, RetryQueue
from profwatch.core.capture.lifecycle import Capture, CaptureState, NodeWrite, RankProgress

log = structlog.get_logger("profwatch.state")
SCHEMA_VERSION = 4
APPLICATION_ID = 0x50465743
"""SQLite ``PRAGMA application_id`` of a profwatch state db ("PFWC"; header offset 68,
https://www.sqlite.org/fileformat.html section 1.3.13): what makes a file profwatch's own, so a damaged one may be
moved aside (``state_open.py``) and a foreign one never is."""
SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs(
  job_id TEXT PRIMARY KEY, world_size INTEGER NOT NULL, backend TEXT, profiler_config_path TEXT, prof_root TEXT,
  first_seen_unix_s REAL, started_unix_s REAL, versions TEXT, generation INTEGER NOT NULL DEFAULT 0,
  restart_count INTEGER);
CREATE TABLE IF NOT EXISTS ranks(
  job_id TEXT NOT NULL, rank INTEGER NOT NULL, hostname TEXT, node_id TEXT, pid INTEGER, local_rank INTEGER,
  backend TEXT, last_step INTEGER, last_step_time_s REAL, seen_unix_s REAL, left INTEGER DEFAULT 0,
  PRIMARY KEY(job_id, rank));
CREATE TABLE IF NOT EXISTS nodes(
  node_id TEXT PRIMARY KEY, hostname TEXT, pid INTEGER, last_seen_unix_s REAL, counters TEXT);
CREATE TABLE IF NOT EXISTS batches(
  batch_id TEXT PRIMARY KEY, capture_id TEXT, job_id TEXT, status TEXT, updated_unix_s REAL, result TEXT);
CREATE TABLE IF NOT EXISTS events(
  seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL, type TEXT NOT NULL, job_id TEXT,
  time TEXT, is_alert INTEGER NOT NULL DEFAULT 0, body TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS events_job ON events(job_id, seq);
CREATE TABLE IF NOT EXISTS sink_outbox(
  seq INTEGER PRIMARY KEY AUTOINCREMENT, sink TEXT NOT NULL, event_id TEXT NOT NULL, body BLOB NOT NULL,
  UNIQUE(sink, event_id));
CREATE TABLE IF NOT EXISTS episodes(
  episode_id TEXT PRIMARY KEY, job_id TEXT NOT NULL, open INTEGER NOT NULL, updated_unix_s REAL NOT NULL,
  body TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS episodes_job ON episodes(job_id, open);
"""
V1_PARSE_ALLOWANCE_S = 600.0
"""Judgement time of a migrated version-1 capture: its plan deadline plus the default parse allowance."""
RECENT_EVENT_IDS = 10_000
"""Event ids remembered in memory, so a duplicate is dropped even when the file cannot be read."""
RETRY_BACKOFF_S = (1.0, 30.0)
"""First and longest wait between two retries of the queued writes (doubling)."""
_EVENT_SQL = "INSERT INTO events(id, type, job_id, time, is_alert, body) VALUES(?,?,?,?,?,?)"


class Stored(str, Enum):
    """What :meth:`StateStore.add_event` did with an event."""

    NEW = "new"  # stored
    DUPLICATE = "duplicate"  # its id was stored (or queued) before: drop it on every path
    QUEUED = "queued"  # the store failed: kept for a retry; publish it anyway


class StateSchemaError(sqlite3.DatabaseError):
    """The state database has a schema this profwatch cannot use (newer, or a capture table it does not know)."""


class StateStore:
    """Thin persistence layer; every method is one short transaction.

    Args:
        path: SQLite file (parent folders are created); ``":memory:"`` for tests.
    Raises:
        sqlite3.DatabaseError: the file is not a usable database (the daemon refuses to start with a clear error);
            :class:`StateSchemaError` for a newer or unknown schema.
    """

    def __init__(self, path: str | Path, *, retry_max_items: int = 20_000, retry_max_bytes: int = 32 << 20,
                 on_failed: Callable[[str, str], None] | None = None,
                 on_dropped: Callable[[str, int], None] | None = None) -> None:
        if str(path) != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.path = str(path)
        self.queue = RetryQueue(retry_max_items, retry_max_bytes)
        self._recent_ids: OrderedDict[str, None] = OrderedDict()
        self._on_failed = on_failed or (lambda op, error: None)
        self._on_dropped = on_dropped or (lambda kind, n: None)
        self.failures: dict[str, int] = {}  # op -> writes the store refused
        self.dropped: dict[str, int] = {}  # kind -> pending writes dropped by the queue's bounds or refused at retry
        self.last_error = ""
        self.closed = False
        """True once close() ran (the coordinator's /readyz: state db open)."""
        self.owner_lock: Any = None
        """The single-writer lock (``state_open.StateLock``) this store holds, released by close()."""
        self.failing_since_unix_s: float | None = None
        self._next_retry = 0.0
        self._backoff_s = RETRY_BACKOFF_S[0]
        # built by the thread that constructs the coordinator, then used only by its main loop thread
        self.db = sqlite3.connect(self.path, isolation_level=None, timeout=10, check_same_thread=False)
        try:
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self._open_schema()
        except Exception:
            self.db.close()
            raise

    def _open_schema(self) -> None:
        version = int(self.db.execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise StateSchemaError(
                f"state db {self.path} has schema version {version}, newer than this profwatch's {SCHEMA_VERSION}: "
                "run the profwatch that wrote it, or move the file away to start with an empty state")
        cols = {r[1] for r in self.db.execute("PRAGMA table_info(captures)")}
        self.db.executescript(SCHEMA)
        if "plan" in cols:
            migrate_v1_captures(self.db, V1_PARSE_ALLOWANCE_S)
        elif cols and "judge_unix_s" not in cols:
            raise StateSchemaError(f"state db {self.path}: unknown captures table (columns {sorted(cols)}); "
                                   "move the file away to start with an empty state")
        if cols and "plan" not in cols and "idle_owed" not in cols:  # version 3: what is owed, on the row
            add_idle_owed(self.db)
        self.db.executescript(CAPTURE_SCHEMA)
        job_cols = {r[1] for r in self.db.execute("PRAGMA table_info(jobs)")}
        if "generation" not in job_cols:  # version 2: job generations (docs/generations.md)
            self.db.execute("ALTER TABLE jobs ADD COLUMN generation INTEGER NOT NULL DEFAULT 0")
            self.db.execute("ALTER TABLE jobs ADD COLUMN restart_count INTEGER")
        self.db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        self.db.execute(f"PRAGMA application_id={APPLICATION_ID}")

    def close(self) -> None:
        """Try the queued writes once more, then close (what still fails is logged as lost)."""
        if len(self.queue):
            self.retry(float("inf"))
            if len(self.queue):
                log.error("state_writes_lost", pending=len(self.queue), error=self.last_error,
                          note="the state store failed until shutdown; these events were published, not stored")
        self.closed = True
        try:
            self.db.close()
        finally:
            if self.owner_lock is not None:
                self.owner_lock.close()

    # -- failed writes --------------------------------------------------------------------------------------------
    def _failed(self, w: PendingWrite, exc: sqlite3.Error) -> None:
        self.last_error = str(exc) or repr(exc)
        self.failures[w.kind] = self.failures.get(w.kind, 0) + 1
        if self.failing_since_unix_s is None:
            self.failing_since_unix_s = time.time()
            log.error("state_write_failed", op=w.kind, error=self.last_error, path=self.path,
                      note="kept in memory for a retry (bounded); events are still published")
        self._on_failed(w.kind, self.last_error)
        for d in self.queue.put(w):
            self._count_dropped(d.kind, 1)

    def _count_dropped(self, kind: str, n: int) -> None:
        self.dropped[kind] = self.dropped.get(kind, 0) + n
        self._on_dropped(kind, n)

    def retry(self, now: float) -> bool:
        """Write the queued writes (at most once per backoff period, doubling from 1 s to 30 s while they fail).
        Returns True when the queue is empty afterwards."""
        if not len(self.queue):
            return True
        if now < self._next_retry:
            return False
        try:
            written, rejected = self.queue.flush(self.db)
        except sqlite3.OperationalError as exc:
            self.last_error = str(exc) or repr(exc)
            self._next_retry = now + self._backoff_s if now != float("inf") else 0.0
            self._backoff_s = min(self._backoff_s * 2, RETRY_BACKOFF_S[1])
            return False
        for w, why in rejected:
            self._count_dropped(w.kind, 1)
            log.error("state_write_rejected", op=w.kind, key=w.key, error=why)
        log.info("state_writes_retried", written=written, rejected=len(rejected),
                 failing_for_s=round(time.time() - (self.failing_since_unix_s or time.time()), 3))
        self.failing_since_unix_s = None
        self._backoff_s = RETRY_BACKOFF_S[0]
        self._next_retry = 0.0
        return True

    def status(self) -> dict[str, Any]:
        """For ``profwatch status``: writes waiting for a retry, failures and drops by kind, the last error."""
        return {"pending": len(self.queue), "pending_bytes": self.queue.bytes, "failures": dict(self.failures),
                "dropped": dict(self.dropped), "last_error": self.last_error,
                "failing_since_unix_s": self.failing_since_unix_s}

    # -- registry -------------------------------------------------------------------------------------------------
    def save_registry(self, jobs: list[dict[str, Any]], ranks: list[tuple], nodes: list[tuple],
                      reset_ranks_of: Sequence[str] = ()) -> None:
        """Upsert jobs, ranks ``(job_id, rank, hostname, node_id, pid, local_rank, backend, last_step,
        last_step_time_s, seen_unix_s, left)`` and nodes ``(node_id, hostname, pid, last_seen_unix_s, counters_json)``;
        first delete every rank row of the jobs in ``reset_ranks_of`` (a new generation: other ranks). Raises
        ``sqlite3.Error`` when the store fails (the caller retries at its next flush)."""
        with self.db:
            self.db.execute("BEGIN")
            self.db.executemany("DELETE FROM ranks WHERE job_id=?", [(j,) for j in reset_ranks_of])
            self.db.executemany(
                "INSERT INTO jobs(job_id, world_size, backend, profiler_config_path, prof_root, first_seen_unix_s, "
                "started_unix_s, versions, generation, restart_count) VALUES(:job_id,:world_size,:backend,"
                ":profiler_config_path,:prof_root,:first_seen_unix_s,:started_unix_s,:versions,:generation,"
                ":restart_count) ON CONFLICT(job_id) DO UPDATE SET "
                "world_size=excluded.world_size, backend=excluded.backend, generation=excluded.generation, "
                "restart_count=excluded.restart_count,"
                "profiler_config_path=excluded.profiler_config_path, prof_root=excluded.prof_root,"
                "started_unix_s=excluded.started_unix_s, versions=excluded.versions",
                jobs,
            )
            self.db.executemany("INSERT OR REPLACE INTO ranks VALUES(?,?,?,?,?,?,?,?,?,?,?)", ranks)
            self.db.executemany("INSERT OR REPLACE INTO nodes VALUES(?,?,?,?,?)", nodes)

    def forget_jobs(self, job_ids: list[str]) -> None:
        """Delete expired jobs and their ranks (captures, batches and events stay)."""
        with self.db:
            self.db.execute("BEGIN")
            self.db.executemany("DELETE FROM ranks WHERE job_id=?", [(j,) for j in job_ids])
            self.db.executemany("DELETE FROM jobs WHERE job_id=?", [(j,) for j in job_ids])

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

    # -- captures -------------------------------------------------------------------------------------------------
    def save_capture(self, cap: Capture, ranks: Iterable[int] | None = None) -> None:
        """Write one capture: its row, its node writes, and the per-rank rows of ``ranks`` (None = all of them;
        pass the ranks a transition touched so a 10,000-rank capture is not rewritten per acknowledgement)."""
        if ("capture", cap.capture_id) in self.queue:
            ranks = None  # an older version of this capture waits: write every row of the newer one
        try:
            with self.db:
                self.db.execute("BEGIN")
                write_capture(self.db, cap, ranks)
        except sqlite3.OperationalError as exc:
            self._failed(PendingWrite("capture", cap.capture_id, lambda db: write_capture(db, cap, None),
                                      2048 + 256 * len(cap.ranks), time.time(), record=cap), exc)
            return
        self.queue.discard("capture", cap.capture_id)

    def captures_with_pending(self, job_id: str | None = None, newest: int = 20) -> list[tuple[Capture, bool]]:
        """``[(capture, stored)]``, oldest first: the ``newest`` stored captures (of ``job_id``) with each one that
        waits in the retry queue (the store failed) in its newer version and ``stored=False``, plus the waiting
        ones the store has never held. While the file cannot even be read, only the waiting ones."""
        waiting = {c.capture_id: c for c in self.queue.records("capture") if job_id is None or c.job_id == job_id}
        try:
            stored = self.captures(job_id, newest=newest)
        except sqlite3.Error:
            stored = []
        out = [(waiting.pop(c.capture_id), False) if c.capture_id in waiting else (c, True) for c in stored]
        out += [(c, False) for c in waiting.values()]
        out.sort(key=lambda pair: (pair[0].created_unix_s, pair[0].capture_id))
        return out[-newest:]

    def get_capture(self, capture_id: str) -> Capture | None:
        found = self._load("WHERE capture_id=?", [capture_id])
        return found[0] if found else None

    def capture_state_summary(self) -> dict[str, tuple[int, float | None]]:
        """state -> (number of captures in it, oldest ``created_unix_s`` among them), for metrics."""
        rows = self.db.execute("SELECT state, COUNT(*), MIN(created_unix_s) FROM captures GROUP BY state").fetchall()
        return {r[0]: (int(r[1]), r[2]) for r in rows}

    def captures(self, job_id: str | None = None, states: Iterable[CaptureState] | None = None, *,
                 since_unix_s: float | None = None, judged_after_unix_s: float | None = None,
                 newest: int | None = None) -> list[Capture]:
        """Captures, oldest first, optionally filtered by job (exact id), state, creation time and judgement time
        (``judge_unix_s`` later than ``judged_after_unix_s``); ``newest`` keeps only that many of the most recent."""
        cond: list[str] = []
        args: list[Any] = []
        if job_id is not None:
            cond.append("job_id=?")
            args.append(job_id)
        if states is not None:
            vals = [s.value for s in states]
            cond.append(f"state IN ({','.join('?' * len(vals))})")
            args.extend(vals)
        if since_unix_s is not None:
            cond.append("created_unix_s>=?")
            args.append(since_unix_s)
        if judged_after_unix_s is not None:
            cond.append("judge_unix_s>?")
            args.append(judged_after_unix_s)
        return self._load(("WHERE " + " AND ".join(cond)) if cond else "", args, newest)

    def _load(self, where: str, args: list[Any], newest: int | None = None) -> list[Capture]:
        if newest is None:
            rows = self.db.execute(f"SELECT {','.join(CAPTURE_COLS)} FROM captures {where} "
                                   "ORDER BY created_unix_s, capture_id", args).fetchall()
        else:
            rows = self.db.execute(f"SELECT {','.join(CAPTURE_COLS)} FROM captures {where} "
                                   "ORDER BY created_unix_s DESC, capture_id DESC LIMIT ?", [*args, newest]).fetchall()
            rows.reverse()
        if not rows:
            return []
        ids = [r[0] for r in rows]
        marks = ",".join("?" * len(ids))
        ranks: dict[str, dict[int, RankProgress]] = {i: {} for i in ids}
        for r in self.db.execute(f"SELECT {','.join(RANK_COLS)} FROM capture_ranks WHERE capture_id IN ({marks}) "
                                 "ORDER BY capture_id, rank", ids):
            ranks[r[0]][r[1]] = RankProgress(
                rank=r[1], step_at_plan=r[2], step_time_s=r[3], window_end_unix_s=r[4], backend=r[5],
                hook_seen_unix_s=r[6], tool_seen_unix_s=r[7], started_unix_s=r[8], completed_unix_s=r[9],
                rejected=r[10], failure=r[11], rank_dir=r[12], steps=tuple(int(x) for x in r[13].split(",") if x),
                total_bytes=r[14])
        nodes: dict[str, dict[str, NodeWrite]] = {i: {} for i in ids}
        for n in self.db.execute(f"SELECT capture_id, node_id, command_id, sent_unix_s, ok, detail FROM capture_nodes "
                                 f"WHERE capture_id IN ({marks})", ids):
            nodes[n[0]][n[1]] = NodeWrite(n[1], n[2], n[3], None if n[4] is None else bool(n[4]), n[5])
        out = []
        for r in rows:
            d = dict(zip(CAPTURE_COLS, r, strict=True))
            d["state"] = CaptureState(d["state"])
            d["rank_list"] = None if d["rank_list"] is None else tuple(int(x) for x in d["rank_list"].split(",") if x)
            d["config"] = json.loads(d["config"])
            d["notes"] = tuple(json.loads(d["notes"]))
            d["idle_owed"] = bool(d["idle_owed"])
            out.append(Capture(**d, ranks=ranks[d["capture_id"]], nodes=nodes[d["capture_id"]]))
        return out

    # -- episodes -------------------------------------------------------------------------------------------------
    def save_episode(self, episode_id: str, job_id: str, is_open: bool, updated_unix_s: float,
                     body: dict[str, Any]) -> None:
        """Upsert one episode (``Episode.to_json``); queued for a retry when the store fails."""
        row = (episode_id, job_id, int(is_open), updated_unix_s, json.dumps(body, default=str))

        def write(db: sqlite3.Connection) -> None:
            db.execute("INSERT OR REPLACE INTO episodes VALUES(?,?,?,?,?)", row)

        try:
            with self.db:
                write(self.db)
        except sqlite3.OperationalError as exc:
            self._failed(PendingWrite("episode", episode_id, write, 256 + len(row[4]), time.time()), exc)
            return
        self.queue.discard("episode", episode_id)

    def episodes(self, job_ids: Sequence[str] | None = None, closed_per_job: int = 16) -> list[dict[str, Any]]:
        """Stored episodes, oldest first: every open one and the last ``closed_per_job`` closed ones of each job
        (of ``job_ids`` only, when given). A body that is not JSON is skipped."""
        where, args = "", list(job_ids or ())
        if job_ids is not None:
            if not args:
                return []
            where = f"WHERE job_id IN ({','.join('?' * len(args))})"
        rows = self.db.execute(f"SELECT job_id, open, body FROM episodes {where} ORDER BY updated_unix_s",
                               args).fetchall()
        closed: dict[str, int] = {}
        keep: list[tuple[str, int, str]] = []
        for job_id, is_open, body in reversed(rows):
            if not is_open:
                closed[job_id] = closed.get(job_id, 0) + 1
                if closed[job_id] > closed_per_job:
                    continue
            keep.append((job_id, is_open, body))
        out = []
        for _, _, body in reversed(keep):
            try:
                v = json.loads(body)
            except ValueError:
                continue
            if isinstance(v, dict):
                out.append(v)
        return out

    # -- batches --------------------------------------------------------------------------------------------------
    def save_batch(self, batch_id: str, capture_id: str | None, job_id: str | None, status: str, now: float,
                   result: dict[str, Any]) -> None:
        """Store one batch result (queued for a retry when the store fails)."""
        row = (batch_id, capture_id, job_id, status, now, json.dumps(result, default=str))

        def write(db: sqlite3.Connection) -> None:
            db.execute("INSERT OR REPLACE INTO batches VALUES(?,?,?,?,?,?)", row)

        try:
            write(self.db)
        except sqlite3.OperationalError as exc:
            self._failed(PendingWrite("batch", batch_id, write, 256 + len(row[5]), time.time()), exc)
            return
        self.queue.discard("batch", batch_id)

    def get_batch(self, batch_id: str) -> dict[str, Any] | None:
        r = self.db.execute("SELECT batch_id, capture_id, job_id, status, updated_unix_s, result FROM batches "
                            "WHERE batch_id=?", (batch_id,)).fetchone()
        if r is None:
            return None
        return {"batch_id": r[0], "capture_id": r[1], "job_id": r[2], "status": r[3], "updated_unix_s": r[4],
                "result": json.loads(r[5] or "{}")}

    # -- a sink's undelivered events ----------------------------------------------------------------------------
    def outbox_add(self, sink: str, event_id: str, body: bytes) -> None:
        """Keep one undelivered body of ``sink`` (a second add of the same event is ignored). Raises
        ``sqlite3.Error`` when the store fails (the sink keeps it in memory only)."""
        self.db.execute("INSERT OR IGNORE INTO sink_outbox(sink, event_id, body) VALUES(?,?,?)", (sink, event_id, body))

    def outbox_remove(self, sink: str, event_ids: Iterable[str]) -> None:
        """Forget delivered (or dropped) bodies of ``sink``. Raises ``sqlite3.Error`` when the store fails."""
        with self.db:
            self.db.execute("BEGIN")
            self.db.executemany("DELETE FROM sink_outbox WHERE sink=? AND event_id=?", [(sink, e) for e in event_ids])

    def outbox_load(self, sink: str) -> list[tuple[str, bytes]]:
        """``[(event_id, body)]`` of ``sink`` still undelivered, oldest first."""
        rows = self.db.execute("SELECT event_id, body FROM sink_outbox WHERE sink=? ORDER BY seq", (sink,)).fetchall()
        return [(str(e), bytes(b)) for e, b in rows]

    # -- events ---------------------------------------------------------------------------------------------------
    def add_event(self, event: dict[str, Any], is_alert: bool) -> Stored:
        """Store a CloudEvent. Returns :attr:`Stored.DUPLICATE` when its ``id`` was stored or queued before (drop
        it on every path), :attr:`Stored.QUEUED` when the store failed (kept for :meth:`retry`; publish it anyway),
        else :attr:`Stored.NEW`."""
        eid = str(event["id"])
        if eid in self._recent_ids or ("event", eid) in self.queue:
            return Stored.DUPLICATE
        body = json.dumps(event, default=str)
        row = (eid, event["type"], event.get("subject"), event.get("time"), int(is_alert), body)
        try:
            self.db.execute(_EVENT_SQL, row)
        except sqlite3.IntegrityError:
            self._remember(eid)
            return Stored.DUPLICATE
        except sqlite3.OperationalError as exc:
            if self._event_stored(eid):  # reads work on a full disk: a stored id is a duplicate
                self._remember(eid)
                return Stored.DUPLICATE
            def write(db: sqlite3.Connection) -> None:  # duplicates by id are dropped here too
                db.execute(_EVENT_SQL.replace("INSERT", "INSERT OR IGNORE", 1), row)

            self._failed(PendingWrite("event", eid, write, len(body) + 200, time.time(), is_alert, event), exc)
            return Stored.QUEUED
        self._remember(eid)
        return Stored.NEW

    def _remember(self, eid: str) -> None:
        self._recent_ids[eid] = None
        if len(self._recent_ids) > RECENT_EVENT_IDS:
            self._recent_ids.popitem(last=False)

    def _event_stored(self, eid: str) -> bool:
        try:
            return self.db.execute("SELECT 1 FROM events WHERE id=?", (eid,)).fetchone() is not None
        except sqlite3.Error:
            return False

    def pending_events(self, *, job_id: str | None = None, alerts_only: bool = True) -> list[dict[str, Any]]:
        """Events published while the store failed and not stored yet (oldest first)."""
        return [e for e, is_alert in self.queue.events()
                if (not job_id or e.get("subject") == job_id) and (is_alert or not alerts_only)]

    def events(self, *, job_id: str | None = None, alerts_only: bool = True, since_seq: int = 0,
               limit: int = 100) -> list[tuple[int, dict[str, Any]]]:
        """Return ``[(seq, event)]`` newest last (at most ``limit``, the most recent ones)."""
        q, args = events_query(job_id=job_id, alerts_only=alerts_only, since_seq=since_seq, limit=limit)
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
