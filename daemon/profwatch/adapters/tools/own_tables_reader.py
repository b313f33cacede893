"""Read one Ascend rank dir's own tables for profwatch's first verdict (I/O; the arithmetic is in
``daemon/profwatch/core/verdict/own_tables.py``).

Per rank dir (``{rank dir}/ASCEND_PROFILER_OUTPUT/``): ``ascend_pytorch_profiler_{rank}.db`` (``STEP_TIME``,
``COMMUNICATION_OP`` + ``STRING_IDS`` + ``CANN_API``, ``TASK`` + ``COMPUTE_TASK_INFO`` for memcpy overlap) and
``analysis.db`` (``StepTraceTime``), the tables msprof-analyze 26.2.0's ``cluster_time_summary`` reads
(docs/msprof-analyze.md#own-tables), and ``AICORE_FREQ`` (the AI Core clock, docs/msprof-analyze.md#ai-core-frequency). Databases are opened read-only; a missing file or table reads as no rows
plus a note, never an exception. :func:`read_batch_tables` reads many rank dirs with a bounded thread pool
(sqlite releases the GIL while it steps).
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from profwatch.adapters.tools.msprof_db import connect_ro
from profwatch.adapters.tools.rank_prefetch import RankPrefetcher
from profwatch.core.batches.prof_layout import ANALYSIS_DB, PROFILER_DB_RE, PROFILER_OUTPUT_DIR
from profwatch.core.changes.hardware import FreqSummary, summarise_sorted
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
            con = connect_ro(analysis)
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
        con = connect_ro(prof)
        try:
            _read_profiler_db(con, t)
        finally:
            con.close()
    except sqlite3.Error as exc:
        t.notes.append(f"{prof.name} unreadable: {exc}")
    except (TypeError, ValueError, ArithmeticError) as exc:  # a STEP_TIME bound of text or infinity
        t.notes.append(f"{prof.name} holds a value that is not a number where one is needed: {exc}")
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
    if "AICORE_FREQ" in names and spans:
        t.aicore = read_aicore_freq(con, min(a for _, a, _ in spans), max(b for _, _, b in spans))
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


_FREQ_DEV_SQL = ("SELECT deviceId FROM AICORE_FREQ GROUP BY deviceId ORDER BY COUNT(*) DESC, deviceId LIMIT 1")
_FREQ_ROWS_SQL = (
    "SELECT timestampNs, freq FROM AICORE_FREQ WHERE deviceId IS ? AND typeof(timestampNs) = 'integer' "
    "AND typeof(freq) IN ('integer', 'real') AND freq > 0 AND freq < 1e6 AND timestampNs < ? AND timestampNs >= "
    "COALESCE((SELECT MAX(timestampNs) FROM AICORE_FREQ WHERE deviceId IS ? AND typeof(timestampNs) = 'integer' "
    "AND typeof(freq) IN ('integer', 'real') AND freq > 0 AND freq < 1e6 AND timestampNs <= ?), ?) "
    "ORDER BY timestampNs, freq")


def _i64(ns: int) -> int:
    """``ns`` clamped to SQLite's INTEGER (signed 64-bit)."""
    return max(-(2**63), min(2**63 - 1, ns))


def read_aicore_freq(con: sqlite3.Connection, start_ns: int, end_ns: int) -> FreqSummary | None:
    """The rank's AI Core clock over ``[start_ns, end_ns)`` from ``AICORE_FREQ`` (``hardware.summarise_sorted``);
    when the table holds several devices, the one with the most rows (a rank drives one device). SQLite filters,
    orders and streams the rows (the sample in force at ``start_ns`` and those inside the window; integer
    timestamps and numeric, positive clocks only), so a table of millions of samples is read in bounded memory.
    None without rows."""
    dev = con.execute(_FREQ_DEV_SQL).fetchone()
    if dev is None:
        return None
    lo, hi = _i64(start_ns), _i64(end_ns)  # a step span from a REAL 1e30 would not bind (OverflowError)
    rows = con.execute(_FREQ_ROWS_SQL, (dev[0], hi, dev[0], lo, lo))
    return summarise_sorted(((int(t), float(f)) for t, f in rows), start_ns, end_ns)


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


Signature = tuple[tuple[int, int], ...]
"""``(mtime_ns, size)`` of a rank dir's profiler DB and analysis.db when they were read."""


def signature(rank_dir: Path) -> Signature:
    """What must not change between a read and its use: ``(mtime_ns, size)`` of the two DBs (``(0, 0)`` absent)."""
    out = []
    for db in rank_dbs(Path(rank_dir)):
        try:
            st = os.stat(db) if db is not None else None
        except OSError:
            st = None
        out.append((st.st_mtime_ns, st.st_size) if st is not None else (0, 0))
    return tuple(out)


def _read_signed(rank: int, rank_dir: Path) -> tuple[Signature, RankTables]:
    sig = signature(rank_dir)
    return sig, read_rank_tables(rank, rank_dir)


def read_batch_tables(rank_dirs: Mapping[int, str | Path], *, workers: int = 4,
                      prefetched: Mapping[str, tuple[Signature, RankTables]] | None = None,
                      ) -> tuple[dict[int, RankTables], float]:
    """Every rank's :class:`RankTables` with a pool of at most ``workers`` threads; returns them and the wall
    seconds taken. ``prefetched``: rank dir path -> (signature, tables) read earlier (:class:`TablePrefetcher`);
    used when the rank's DBs still have that signature and the rank matches, else read again."""
    t0 = time.monotonic()
    done: dict[int, RankTables] = {}
    todo: dict[int, Path] = {}
    for rank, path in rank_dirs.items():
        got = (prefetched or {}).get(str(path))
        if got is not None and got[1].rank == rank and got[0] == signature(Path(path)):
            done[rank] = got[1]
        else:
            todo[rank] = Path(path)
    if todo:
        with ThreadPoolExecutor(max_workers=max(1, min(workers, len(todo)))) as pool:
            done.update(zip(todo, pool.map(lambda kv: read_rank_tables(kv[0], kv[1]), todo.items()), strict=True))
    return done, time.monotonic() - t0


def read_rank_aicore(rank_dir: Path) -> FreqSummary | None:
    """One rank dir's AI Core clock over its ``STEP_TIME`` span (:func:`read_aicore_freq`); None when its profiler
    DB, ``STEP_TIME`` or ``AICORE_FREQ`` is missing or unreadable (never raises for bad data)."""
    prof, _ = rank_dbs(Path(rank_dir))
    if prof is None:
        return None
    try:
        con = connect_ro(prof)
        try:
            names = _tables(con)
            if not {"STEP_TIME", "AICORE_FREQ"} <= names:
                return None
            span = con.execute("SELECT MIN(startNs), MAX(endNs) FROM STEP_TIME").fetchone()
            if span is None or span[0] is None or span[1] is None:
                return None
            return read_aicore_freq(con, int(span[0]), int(span[1]))
        finally:
            con.close()
    except (sqlite3.Error, TypeError, ValueError, ArithmeticError):  # an infinite span: OverflowError
        return None


def read_batch_aicore(rank_dirs: Mapping[int, str | Path], *, workers: int = 4) -> dict[int, FreqSummary]:
    """rank -> AI Core clock of every rank dir that recorded one (:func:`read_rank_aicore`), on a pool of at most
    ``workers`` threads (the msprof-analyze path, where the own tables were not read)."""
    if not rank_dirs:
        return {}
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(rank_dirs)))) as pool:
        got = dict(zip(rank_dirs, pool.map(lambda p: read_rank_aicore(Path(p)), rank_dirs.values()), strict=True))
    return {r: s for r, s in got.items() if s is not None}


class TablePrefetcher(RankPrefetcher[tuple[Signature, RankTables]]):
    """Reads each rank dir's tables once, as soon as the capture's scan sees it parsed, on a pool of ``workers``
    threads, while the other ranks are still parsing (``rank_prefetch.RankPrefetcher``); :meth:`take` hands a
    capture's reads (path -> (signature, tables)) to its analysis (``read_batch_tables(prefetched=...)``, which
    re-reads any whose DBs changed since). The tables of one rank are small (its steps and collectives)."""

    def __init__(self, workers: int = 4, max_captures: int = 8) -> None:
        super().__init__(_read_signed, workers, max_captures, thread_name="profwatch-tables")
