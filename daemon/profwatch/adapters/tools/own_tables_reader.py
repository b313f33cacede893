"""Read one Ascend rank dir's own tables for profwatch's first verdict (I/O; the arithmetic is in
``daemon/profwatch/core/verdict/own_tables.py``).

Per rank dir (``{rank dir}/ASCEND_PROFILER_OUTPUT/``): ``ascend_pytorch_profiler_{rank}.db`` (``STEP_TIME``,
``COMMUNICATION_OP`` + ``STRING_IDS`` + ``CANN_API``, ``TASK`` + ``COMPUTE_TASK_INFO`` for memcpy overlap) and
``analysis.db`` (``StepTraceTime``), the tables msprof-analyze 26.2.0's ``cluster_time_summary`` reads
(docs/msprof-analyze.md#own-tables). Databases are opened read-only; a missing file or table reads as no rows
plus a note, never an exception. :func:`read_batch_tables` reads many rank dirs with a bounded thread pool
(sqlite releases the GIL while it steps).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from profwatch.core.batches.prof_layout import ANALYSIS_DB, PROFILER_DB_RE, PROFILER_OUTPUT_DIR
from profwatch.core.verdict.own_tables import (
    KIND_COMM,
    KIND_COMPUTE,
    KIND_MEMORY,
    RankTables,
    TraceRow,
    comm_ops,
    memory_by_step,
)

_COMM_SQL = """
SELECT sg.value, so.value, c.startNs, c.endNs, a.startNs
FROM COMMUNICATION_OP c
JOIN STRING_IDS sg ON c.groupName = sg.id
JOIN STRING_IDS so ON c.opName = so.id
JOIN CANN_API a ON a.connectionId = c.connectionId
"""
_OVERLAP_SQL = f"""
SELECT t.startNs, t.endNs, {KIND_COMPUTE}, a.startNs FROM COMPUTE_TASK_INFO ci
  JOIN TASK t ON ci.globalTaskId = t.globalTaskId AND t.startNs != t.endNs
  JOIN CANN_API a ON a.connectionId = t.connectionId
UNION ALL
SELECT c.startNs, c.endNs, {KIND_COMM}, a.startNs FROM COMMUNICATION_OP c
  JOIN CANN_API a ON a.connectionId = c.connectionId
UNION ALL
SELECT startNs, endNs, {KIND_MEMORY}, startNs FROM TASK WHERE taskType = ?
"""


def _connect_ro(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True)


def _tables(con: sqlite3.Connection) -> set[str]:
    return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def rank_dbs(rank_dir: Path) -> tuple[Path | None, Path | None]:
    """``(profiler db, analysis.db)`` of one rank dir, each None when absent."""
    out = Path(rank_dir) / PROFILER_OUTPUT_DIR
    try:
        names = sorted(p.name for p in out.iterdir())
    except OSError:
        return None, None
    prof = next((out / n for n in names if PROFILER_DB_RE.fullmatch(n)), None)
    analysis = out / ANALYSIS_DB
    return prof, analysis if analysis.is_file() else None


def read_rank_tables(rank: int, rank_dir: Path) -> RankTables:
    """One rank's :class:`RankTables` from its rank dir. Never raises for bad data: what could not be read is
    a note on the result (and reads as no rows)."""
    t = RankTables(rank)
    prof, analysis = rank_dbs(Path(rank_dir))
    if analysis is None:
        t.notes.append(f"no {ANALYSIS_DB}")
    else:
        try:
            con = _connect_ro(analysis)
            try:
                if "StepTraceTime" in _tables(con):
                    for step, comp, cnov, comm, free in con.execute(
                            "SELECT step, computing, communication_not_overlapped, communication, free "
                            "FROM StepTraceTime"):
                        t.trace[_step(step)] = TraceRow(_f(comp), _f(cnov), _f(comm), _f(free))
                else:
                    t.notes.append("no StepTraceTime table")
            finally:
                con.close()
        except sqlite3.Error as exc:
            t.notes.append(f"{ANALYSIS_DB} unreadable: {exc}")
    if prof is None:
        t.notes.append("no profiler db")
        return t
    try:
        con = _connect_ro(prof)
        try:
            _read_profiler_db(con, t)
        finally:
            con.close()
    except sqlite3.Error as exc:
        t.notes.append(f"{prof.name} unreadable: {exc}")
    return t


def _read_profiler_db(con: sqlite3.Connection, t: RankTables) -> None:
    names = _tables(con)
    spans: list[tuple[int, int, int]] | None = None
    if "STEP_TIME" in names:
        spans = [(int(i), int(a), int(b)) for i, a, b in con.execute("SELECT id, startNs, endNs FROM STEP_TIME")
                 if i is not None and a is not None and b is not None]
        t.step_time_us = {s: (b - a) / 1000.0 for s, a, b in spans}
    else:
        t.notes.append("no STEP_TIME table: one step -1")
    if not {"COMMUNICATION_OP", "STRING_IDS", "CANN_API"} <= names:
        return
    raw = con.execute(_COMM_SQL).fetchall()
    t.comm_rows = len(raw)
    t.comm = comm_ops(raw, spans)
    row = con.execute("SELECT id FROM STRING_IDS WHERE value = 'MEMCPY_ASYNC'").fetchone()
    if row is None or not {"TASK", "COMPUTE_TASK_INFO"} <= names:
        return
    if con.execute("SELECT 1 FROM TASK WHERE taskType = ? LIMIT 1", (row[0],)).fetchone() is None:
        return  # no memcpy: nothing to subtract from free, skip reading every compute task
    t.has_memcpy = True
    t.memory_not_overlapped_us = memory_by_step(con.execute(_OVERLAP_SQL, (row[0],)), spans)


def _step(value: Any) -> int:
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return -1


def _f(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def read_batch_tables(rank_dirs: Mapping[int, str | Path], *, workers: int = 4) -> tuple[dict[int, RankTables],
                                                                                          float]:
    """Every rank's :class:`RankTables` with a pool of at most ``workers`` threads; returns them and the wall
    seconds taken."""
    t0 = time.monotonic()
    if not rank_dirs:
        return {}, 0.0
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(rank_dirs)))) as pool:
        done = dict(zip(rank_dirs, pool.map(lambda kv: read_rank_tables(kv[0], Path(kv[1])), rank_dirs.items()),
                        strict=True))
    return done, time.monotonic() - t0
