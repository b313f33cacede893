"""Read the SQLite files and JSON side files around msprof-analyze: rank DBs before a run, result tables after (I/O).

Every database is opened read-only by ``file:`` URI (``?mode=ro``): profwatch never writes into a capture or a
tool output, and a read-only open of a missing file fails instead of creating an empty DB. Tables are returned
as dicts by column name, because msprof-analyze's result tables come from pandas ``to_sql`` and their column
types vary between runs (docs/msprof-analyze.md, "Result tables"). Readers never raise for broken data: a
missing or malformed file reads as None / False, and the caller decides what that means
(``daemon/profwatch/core/verdict/msprof_plan.py``).
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from profwatch.adapters.fs.bounded_read import InputTooLarge, read_capped
from profwatch.adapters.fs.rank_dir_fs import MAX_JSON_BYTES
from profwatch.core.verdict.link_rows import COLUMNS, LinkRows
from profwatch.core.verdict.msprof_plan import COLUMNAR_TABLES, InputFacts

T = TypeVar("T")

_SQLITE_MAGIC = b"SQLite format 3\x00"


def connect_ro(db_path: Path) -> sqlite3.Connection:
    """A read-only connection to ``db_path`` (``file:`` URI, ``mode=ro``: never creates or writes the file).
    Raises ``sqlite3.Error`` when it cannot be opened."""
    return sqlite3.connect(f"{db_path.absolute().as_uri()}?mode=ro", uri=True)


def _read_if_table(db_path: Path, table: str, read: Callable[[sqlite3.Connection], T]) -> T | None:
    """``read(con)`` on ``db_path`` opened read-only when it holds ``table``; None when the file or the table is
    missing or anything is unreadable (e.g. "database disk image is malformed"). The connection is closed after."""
    if not db_path.is_file():
        return None
    try:
        con = connect_ro(db_path)
    except sqlite3.Error:
        return None
    try:
        found = con.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (table,)).fetchone()
        return read(con) if found else None
    except sqlite3.Error:
        return None
    finally:
        con.close()


def read_table(db_path: Path, table: str) -> list[dict[str, Any]] | None:
    """Rows of ``table`` as dicts keyed by column name; None when the file or the table is missing or unreadable
    (e.g. "database disk image is malformed"). Reads the whole table: result tables are per-rank/step summaries
    (hundreds of rows), never raw events."""
    def rows(con: sqlite3.Connection) -> list[dict[str, Any]]:
        con.row_factory = sqlite3.Row
        return [dict(r) for r in con.execute(f'SELECT * FROM "{table}"')]

    return _read_if_table(db_path, table, rows)


def read_link_rows(db_path: Path, table: str, *, chunk: int = 16384) -> LinkRows | None:
    """Rows of ``table`` (a ``ClusterCommunicationMatrix``) straight into columns (:class:`LinkRows`: the kept
    columns only, ``chunk`` rows at a time, never a dict per row); None as :func:`read_table`."""
    def columns(con: sqlite3.Connection) -> LinkRows:
        have = [str(r[1]) for r in con.execute(f'PRAGMA table_info("{table}")')]
        names = [n for n in COLUMNS if n in have]
        out = LinkRows()
        cur = con.execute(f'SELECT {", ".join(chr(34) + n + chr(34) for n in names) or "1"} FROM "{table}"')
        while rows := cur.fetchmany(chunk):
            out.extend_tuples(names, rows)
        return out

    return _read_if_table(db_path, table, columns)


def read_tables(db_path: Path, tables: Iterable[str]) -> dict[str, Sequence[Mapping[str, Any]] | None]:
    """``{table: rows or None}`` for each of ``tables`` in ``db_path`` (see :func:`read_table`; tables of
    ``msprof_plan.COLUMNAR_TABLES`` by :func:`read_link_rows`)."""
    return {t: read_link_rows(db_path, t) if t in COLUMNAR_TABLES else read_table(db_path, t) for t in tables}


def collectives_per_step(db_path: Path) -> float | None:
    """COMMUNICATION_OP rows per STEP_TIME row of one rank DB (for the impact estimate), None when unknown."""
    try:
        con = connect_ro(db_path)
    except sqlite3.Error:
        return None
    try:
        ops = con.execute("SELECT COUNT(*) FROM COMMUNICATION_OP").fetchone()[0]
        steps = con.execute("SELECT COUNT(*) FROM STEP_TIME").fetchone()[0]
        return ops / steps if steps and ops else None
    except sqlite3.Error:
        return None
    finally:
        con.close()


def own_comm_waits(analysis_db: Path) -> dict[int, tuple[float, int]]:
    """One rank's own HCCL wait per step from its ``analysis.db`` ``CommAnalyzerTime`` (torch_npu's parse):
    ``step -> (sum of wait_time in µs, collectives)``; ``{}`` when the file or table is missing or unreadable.

    ``wait_time`` (ms) is HCCL's Notify-Wait time of each op on this rank: how long it waited for its peers,
    wherever they are, seen from its own data, unlike msprof-analyze's cluster-level wait (own duration minus
    the shortest of the ranks analysed). Rows whose ``step`` is not ``stepN`` are skipped."""
    rows = read_table(analysis_db, "CommAnalyzerTime") or []
    out: dict[int, list[float]] = {}
    for row in rows:
        step = str(row.get("step") or "")
        if not step.startswith("step") or not step[4:].isdigit():
            continue
        try:
            wait_ms = float(row.get("wait_time") or 0.0)
        except (TypeError, ValueError):
            continue
        acc = out.setdefault(int(step[4:]), [0.0, 0])
        acc[0] += max(0.0, wait_ms) * 1e3 if wait_ms == wait_ms and wait_ms != float("inf") else 0.0
        acc[1] += 1
    return {s: (w, int(n)) for s, (w, n) in out.items()}


def has_row(db_path: Path, sql: str) -> bool:
    """True when ``sql`` returns a row from ``db_path`` opened read-only; False on no row or any sqlite error."""
    try:
        con = connect_ro(db_path)
    except sqlite3.Error:
        return False
    try:
        return con.execute(sql).fetchone() is not None
    except sqlite3.Error:
        return False
    finally:
        con.close()


def sqlite_truncated(db_path: Path) -> bool:
    """True when the file is shorter than its header's page count x page size (an interrupted copy or write).

    O(1): reads the 100-byte SQLite header (https://www.sqlite.org/fileformat.html section 1.3: page size at
    offset 16, the in-header database size in pages at 28, valid only when the version-valid-for number at 92
    equals the change counter at 24). An unreadable or shorter-than-header file is truncated; a file that is
    not SQLite or whose in-header size is not valid is not judged (False).
    """
    try:
        with db_path.open("rb") as fh:
            head = fh.read(100)
        size = db_path.stat().st_size
    except OSError:
        return True
    if len(head) < 100 or not head.startswith(_SQLITE_MAGIC):
        return len(head) < 100
    page_size = int.from_bytes(head[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(head[28:32], "big")
    if pages == 0 or head[24:28] != head[92:96]:
        return False
    return size < pages * page_size


MAX_INFO_JSON_BYTES = MAX_JSON_BYTES
"""Largest ``profiler_info*.json`` / ``profiler_metadata.json`` read (the rank dir reader's JSON cap)."""


def _read_json(path: Path) -> Any:
    """A capture's JSON document, read bounded (raises ``InputTooLarge``, a ``ValueError``, for a device, a FIFO
    or a file over :data:`MAX_INFO_JSON_BYTES`; ``OSError`` when unreadable)."""
    return json.loads(read_capped(path, MAX_INFO_JSON_BYTES, "capture file").decode("utf-8"))


def inspect_inputs(staged_dir: Path, *, max_depth: int = 5) -> InputFacts:
    """Walk ``staged_dir`` as msprof-analyze does (folders holding ``ASCEND_PROFILER_OUTPUT``, up to ``max_depth``
    levels) and record ranks, DB health (header truncation, a readable ``RANK_DEVICE_MAP``), communication and
    MEMCPY_ASYNC presence, group sizes and members (``profiler_metadata.json`` ``parallel_group_info``), each rank's
    ``analysis.db`` size, profiler levels and
    versions (``profiler_info*.json``). File names are handled as the OS gives them (``os.walk`` on a str path
    keeps undecodable bytes as surrogate escapes). Never raises for unreadable files: they become notes."""
    facts = InputFacts()
    rank_dirs: list[Path] = []
    for root, dirs, _files in os.walk(staged_dir):
        depth = len(Path(root).relative_to(staged_dir).parts)
        if "ASCEND_PROFILER_OUTPUT" in dirs:
            rank_dirs.append(Path(root))
        if depth >= max_depth:
            dirs[:] = []
    facts.rank_count = len(rank_dirs)
    groups: list[int] = []
    group_set: set[tuple[int, ...]] = set()
    dbs: dict[int, Path] = {}
    for rd in sorted(rank_dirs):
        for info_path in rd.glob("profiler_info*.json"):
            try:
                info = _read_json(info_path)
                config = info.get("config", {})
                facts.levels.add(str(config.get("experimental_config", {}).get("_profiler_level", "")))
            except InputTooLarge as exc:
                facts.notes.append(f"unreadable {info_path}: {exc}")
                continue
            except (OSError, ValueError, AttributeError, RecursionError, MemoryError):
                facts.notes.append(f"unreadable {info_path}")
                continue
            for key, bag in (("torch_npu_version", facts.torch_npu_versions), ("cann_version", facts.cann_versions)):
                if info.get(key):
                    bag.add(str(info[key]))
        try:
            meta = _read_json(rd / "profiler_metadata.json")
            for g in meta.get("parallel_group_info", {}).values():
                members = g.get("global_ranks", [])
                groups.append(len(members))
                if isinstance(members, list) and all(isinstance(r, int) for r in members):
                    group_set.add(tuple(sorted(set(members))))
        except InputTooLarge as exc:
            facts.notes.append(f"unreadable {rd / 'profiler_metadata.json'}: {exc}")
        except (OSError, ValueError, AttributeError, TypeError, RecursionError, MemoryError):
            pass
        for db in (rd / "ASCEND_PROFILER_OUTPUT").glob("ascend_pytorch_profiler*.db"):
            digits = db.stem.rsplit("_", 1)[-1]
            rank = int(digits) if digits.isdigit() else -1
            dbs[rank] = db
            if sqlite_truncated(db) or not has_row(db, "SELECT rankId FROM RANK_DEVICE_MAP"):
                facts.broken_db_ranks.append(rank)
            try:
                facts.analysis_bytes[rank] = (rd / "ASCEND_PROFILER_OUTPUT" / "analysis.db").stat().st_size
            except OSError:
                pass
    facts.db_ranks = sorted(dbs)
    facts.max_group_size = max(groups, default=len(dbs))
    facts.groups = sorted(group_set, key=lambda g: (len(g), g))
    healthy = [dbs[r] for r in facts.healthy_db_ranks]
    facts.has_communication = any(has_row(db, "SELECT 1 FROM COMMUNICATION_OP LIMIT 1") for db in healthy)
    facts.has_memcpy = any(has_row(db, "SELECT 1 FROM TASK WHERE taskType IN (SELECT id FROM STRING_IDS "
                                       "WHERE value='MEMCPY_ASYNC') LIMIT 1") for db in healthy)
    if healthy and facts.has_communication:
        facts.collectives_per_step = collectives_per_step(healthy[0])
    return facts
