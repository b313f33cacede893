"""The typed capture rows of the state database (I/O: sqlite3): the ``captures``, ``capture_ranks`` and
``capture_nodes`` tables (schema version 4) and the write of one
:class:`~profwatch.core.capture.lifecycle.Capture` into them.

Shared by the store (``daemon/profwatch/adapters/store/state.py``, which also reads the rows back) and the in-place
migrations (``daemon/profwatch/adapters/store/state_migrate.py``), which neither imports the other's module for it.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable

from profwatch.core.capture.lifecycle import Capture

CAPTURE_SCHEMA = """
CREATE TABLE IF NOT EXISTS captures(
  capture_id TEXT PRIMARY KEY, job_id TEXT NOT NULL, generation INTEGER NOT NULL DEFAULT 0, state TEXT NOT NULL,
  reason TEXT NOT NULL, created_unix_s REAL NOT NULL, state_since_unix_s REAL NOT NULL, deadline_unix_s REAL,
  judge_unix_s REAL NOT NULL, start_step INTEGER NOT NULL, warmup INTEGER NOT NULL, active INTEGER NOT NULL,
  rank_list TEXT, world_size INTEGER NOT NULL, prof_dir TEXT NOT NULL, profiler_config_path TEXT NOT NULL,
  writer TEXT NOT NULL, step_time_s REAL, config TEXT NOT NULL, written_unix_s REAL, config_mtime_s INTEGER,
  batch_id TEXT, analysis_status TEXT, outcome TEXT NOT NULL DEFAULT '', notes TEXT NOT NULL DEFAULT '[]',
  idle_owed INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS captures_job ON captures(job_id, created_unix_s);
CREATE INDEX IF NOT EXISTS captures_state ON captures(state);
CREATE TABLE IF NOT EXISTS capture_ranks(
  capture_id TEXT NOT NULL, rank INTEGER NOT NULL, step_at_plan INTEGER NOT NULL, step_time_s REAL,
  window_end_unix_s REAL NOT NULL, backend TEXT NOT NULL DEFAULT '', hook_seen_unix_s REAL, tool_seen_unix_s REAL,
  started_unix_s REAL, completed_unix_s REAL, rejected TEXT NOT NULL DEFAULT '', failure TEXT NOT NULL DEFAULT '',
  rank_dir TEXT NOT NULL DEFAULT '', steps TEXT NOT NULL DEFAULT '', total_bytes INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY(capture_id, rank));
CREATE TABLE IF NOT EXISTS capture_nodes(
  capture_id TEXT NOT NULL, node_id TEXT NOT NULL, command_id TEXT NOT NULL, sent_unix_s REAL NOT NULL,
  ok INTEGER, detail TEXT NOT NULL DEFAULT '', PRIMARY KEY(capture_id, node_id));
"""
CAPTURE_COLS = ("capture_id", "job_id", "generation", "state", "reason", "created_unix_s", "state_since_unix_s",
                "deadline_unix_s", "judge_unix_s", "start_step", "warmup", "active", "rank_list", "world_size",
                "prof_dir", "profiler_config_path", "writer", "step_time_s", "config", "written_unix_s",
                "config_mtime_s", "batch_id", "analysis_status", "outcome", "notes", "idle_owed")
RANK_COLS = ("capture_id", "rank", "step_at_plan", "step_time_s", "window_end_unix_s", "backend", "hook_seen_unix_s",
             "tool_seen_unix_s", "started_unix_s", "completed_unix_s", "rejected", "failure", "rank_dir", "steps",
             "total_bytes")


def write_capture(db: sqlite3.Connection, cap: Capture, ranks: Iterable[int] | None = None) -> None:
    """Insert or replace one capture's rows inside the caller's transaction (see :meth:`~profwatch.adapters.store.state.StateStore.save_capture`)."""
    row = (cap.capture_id, cap.job_id, cap.generation, cap.state.value, cap.reason, cap.created_unix_s,
           cap.state_since_unix_s, cap.deadline_unix_s, cap.judge_unix_s, cap.start_step, cap.warmup, cap.active,
           None if cap.rank_list is None else ",".join(map(str, cap.rank_list)), cap.world_size, cap.prof_dir,
           cap.profiler_config_path, cap.writer, cap.step_time_s, json.dumps(dict(cap.config)), cap.written_unix_s,
           cap.config_mtime_s, cap.batch_id, cap.analysis_status, cap.outcome, json.dumps(list(cap.notes)),
           int(cap.idle_owed))
    which = cap.ranks.values() if ranks is None else [cap.ranks[r] for r in ranks if r in cap.ranks]
    db.execute(f"INSERT OR REPLACE INTO captures({','.join(CAPTURE_COLS)}) VALUES({','.join('?' * len(CAPTURE_COLS))})",
               row)
    db.executemany(
        f"INSERT OR REPLACE INTO capture_ranks({','.join(RANK_COLS)}) VALUES({','.join('?' * len(RANK_COLS))})",
        [(cap.capture_id, p.rank, p.step_at_plan, p.step_time_s, p.window_end_unix_s, p.backend, p.hook_seen_unix_s,
          p.tool_seen_unix_s, p.started_unix_s, p.completed_unix_s, p.rejected, p.failure, p.rank_dir,
          ",".join(map(str, p.steps)), p.total_bytes) for p in which])
    db.executemany("INSERT OR REPLACE INTO capture_nodes VALUES(?,?,?,?,?,?)",
                   [(cap.capture_id, n.node_id, n.command_id, n.sent_unix_s, None if n.ok is None else int(n.ok),
                     n.detail) for n in cap.nodes.values()])
