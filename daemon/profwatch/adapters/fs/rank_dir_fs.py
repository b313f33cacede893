"""Reads rank dirs from (possibly shared) storage into the completeness core's inputs (I/O adapter).

Every read tolerates entries vanishing mid-walk (a re-parse deletes ``ASCEND_PROFILER_OUTPUT``,
docs/rank-dirs.md#completion). Errors such as ESTALE/EIO, or a vanished scan root, mean "unknown", never
"deleted" (docs/field-cases.md#fc-15). SQLite files are opened read-only through a ``file:...?mode=ro`` URI
built from the name's bytes (docs/msprof-analyze.md#before-running, docs/paths.md#any-locale).
"""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import stat
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import structlog

from profwatch.core.batches.completeness import BatchState, CaptureHint, assess_batches
from profwatch.core.batches.prof_layout import (
    ANALYSE_DONE,
    ANALYSIS_DB,
    KINETO_TRACE_RE,
    NOT_REGULAR,
    OUTPUT_MARKER,
    PROFILER_DB_RE,
    PROFILER_METADATA,
    PROFILER_OUTPUT_DIR,
    TRACE_DONE,
    UNREADABLE,
    UNSUPPORTED_ADVICE,
    DbObservation,
    LayoutError,
    RankDirObservation,
    is_profiler_info_name,
    parse_profiler_info,
    parse_profiler_metadata,
    parse_rank_dir_name,
    rank_dir_of,
    rank_from_profiler_info_name,
    unsupported_output,
)
from profwatch.core.batches.settings import WatchSettings

log = structlog.get_logger(__name__)

#: errnos that say "the storage cannot answer now", not "the file is gone" (docs/field-cases.md#fc-15).
UNKNOWN_ERRNOS: frozenset[int] = frozenset(
    getattr(errno, n)
    for n in ("ESTALE", "EIO", "ENOTCONN", "EHOSTDOWN", "EHOSTUNREACH", "ETIMEDOUT", "ENETDOWN", "ENETUNREACH",
              "ECONNRESET", "ECONNABORTED", "EACCES", "EPERM", "ENXIO", "EREMOTEIO", "ENOLINK", "EBUSY", "EAGAIN")
    if hasattr(errno, n)
)
_JSON_VALUE_KEYS = ("parallel_group_info", "distributed_args")


class TreeUnavailable(OSError):
    """The scan root itself cannot be listed (missing mount, ESTALE, EIO): its ranks are unknown, not deleted."""


def _describe(exc: OSError) -> str:
    name = errno.errorcode.get(exc.errno or 0, "OSError")
    return f"{name}: {exc.strerror or exc}"


def _gone(exc: OSError) -> bool:
    return isinstance(exc, (FileNotFoundError, NotADirectoryError))


class RankDirReader:
    """Reads rank dirs; caches DB checks by ``(path, size, mtime_ns)`` so a reconciliation scan of 1024 ranks
    does not re-run ``PRAGMA quick_check`` on unchanged files. Thread-safe."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, int, int], DbObservation] = {}
        self._identity: dict[str, dict[str, Any]] = {}
        self._json_cache: dict[tuple[str, int, int], tuple[Any, str | None]] = {}
        self._groups: dict[tuple[int, ...], tuple[int, ...]] = {}  # one tuple per communicator's members
        self._lock = threading.Lock()
        self.reads = 0
        """Rank dirs read so far (each call of :meth:`read`; for the bench and tests)."""

    def read(self, path: str) -> RankDirObservation | None:
        """Observe one rank dir. None when ``path`` vanished or is not a rank dir name.

        Raises nothing for storage errors: they come back as ``RankDirObservation.unknown``, carrying the rank
        identity (profiler_info, metadata) this reader last saw there, so the rank stays in its batch.
        """
        name = parse_rank_dir_name(os.path.basename(path))
        if name is None:
            return None
        with self._lock:
            self.reads += 1
        base: dict[str, Any] = {"path": path, "name": name, "dir_ts_unix_s": _local_ts(name.ts_naive)}
        try:
            entries = {e.name: e for e in os.scandir(path)}
            obs = self._read_entries(path, name.kind, entries, base)
        except OSError as exc:
            if _gone(exc) and not os.path.lexists(path):
                with self._lock:
                    self._identity.pop(path, None)
                return None
            with self._lock:
                known = self._identity.get(path, {})
            return RankDirObservation(unknown=_describe(exc), **base, **known)
        if obs.info is not None and obs.metadata is not None:
            with self._lock:
                self._identity[path] = {"info_file": obs.info_file, "info": obs.info, "metadata": obs.metadata}
        return obs

    def _read_entries(self, path: str, kind: str, entries: Mapping[str, os.DirEntry[str]],
                      base: dict[str, Any]) -> RankDirObservation:
        info_names = sorted(n for n in entries if is_profiler_info_name(n))
        info_file = next((n for n in info_names if rank_from_profiler_info_name(n) is not None), None)
        info_file = info_file or (info_names[0] if info_names else None)
        out: dict[str, Any] = dict(base, info_file=info_file)
        if len(info_names) > 1:
            out["info_error"] = f"several profiler_info files: {', '.join(info_names)}"
        elif info_file:
            out["info"], out["info_error"] = self._parsed_json(entries[info_file], _parse_info)
        if PROFILER_METADATA in entries:
            out["metadata"], out["metadata_error"] = self._parsed_json(entries[PROFILER_METADATA], self._parse_meta)
        if kind == "torch_pt":
            out["marker"] = TRACE_DONE in entries
            out["trace_files"] = tuple(sorted(n for n in entries if KINETO_TRACE_RE.fullmatch(n)))
            out["output_files"] = frozenset(entries)
            return RankDirObservation(**out)
        prof = [e for n, e in entries.items() if n.startswith("PROF_")]
        out["device_dirs"], out["empty_device_dirs"], out["leftover_sqlite"] = _raw_data_state(prof)
        outdir = entries.get(PROFILER_OUTPUT_DIR)
        if outdir is None or not outdir.is_dir(follow_symlinks=True):
            return RankDirObservation(**out)
        try:
            files = list(os.scandir(outdir.path))
        except OSError as exc:
            if _gone(exc):  # deleted by a re-parse between the two listings
                return RankDirObservation(**out)
            raise
        names = frozenset(f.name for f in files)
        newest = None
        stats: dict[str, os.stat_result] = {}  # one stat per output file, reused by the DB checks below
        for f in files:
            try:
                st = stats[f.name] = f.stat(follow_symlinks=True)
            except FileNotFoundError:
                continue
            newest = st.st_mtime if newest is None else max(newest, st.st_mtime)
        journals = tuple(sorted(n for n in names if n.endswith(("-journal", "-wal"))))
        marker = ANALYSE_DONE in names
        db_names = sorted(n for n in names if PROFILER_DB_RE.fullmatch(n))
        # without the marker, DBs are read once no CANN export or journal is left (an old torch_npu whose
        # analysis.db never comes is then named by the health checks after the quiet period, not "parsing" forever)
        deep = marker or (bool(db_names) and not out["leftover_sqlite"] and not journals)
        dbs = tuple(self.check_db(os.path.join(outdir.path, n), deep=deep, st=stats.get(n)) for n in db_names)
        adb = self.check_db(os.path.join(outdir.path, ANALYSIS_DB), deep=deep, st=stats.get(ANALYSIS_DB)) \
            if ANALYSIS_DB in names else None
        out.update(output_dir=True, output_files=names, marker=marker, profiler_dbs=dbs, analysis_db=adb,
                   journal_files=journals, newest_output_mtime_s=newest)
        return RankDirObservation(**out)

    def _parse_meta(self, data: Any) -> Any:
        if len(self._groups) > 100_000:
            self._groups.clear()
        return _parse_meta(data, self._groups)

    def _parsed_json(self, entry: os.DirEntry[str], parse: Callable[[Any], Any]) -> tuple[Any, str | None]:
        """``(parse(decoded JSON), None)`` or ``(None, why)``; cached by (path, size, mtime_ns)."""
        st = entry.stat(follow_symlinks=True)
        key = (entry.path, st.st_size, st.st_mtime_ns)
        with self._lock:
            hit = self._json_cache.get(key)
        if hit is not None:
            return hit
        data, err = _read_json(entry.path)
        value = None
        if err is None:
            try:
                value = parse(data)
            except LayoutError as exc:
                err = str(exc)
        result = (value, err and f"{entry.name}: {err}")
        if err is None:
            with self._lock:
                if len(self._json_cache) > 200_000:
                    self._json_cache.clear()
                self._json_cache[key] = result
        return result

    def check_db(self, path: str, *, deep: bool = True, st: os.stat_result | None = None) -> DbObservation:
        """Observe one SQLite file; with ``deep`` check it (:func:`_check_sqlite`: the header, the schema and
        ``PRAGMA quick_check`` of each table of :data:`CHECKED_TABLES` it holds, not every byte of the file) and
        read what the recipes need: the table list, ``RANK_DEVICE_MAP.rankId``, ``STEP_TIME.id``, and whether
        ``COMMUNICATION_OP``/``StepTraceTime``/``CommAnalyzerTime``/``TASK``/``COMPUTE_TASK_INFO`` have rows
        (docs/msprof-analyze.md#before-running). ``st``: ``path``'s ``os.stat`` (symlinks followed) taken in the
        same read (a rank dir read stats each output file once); None: stat it here.
        """
        name = os.path.basename(path)
        st = os.stat(path) if st is None else st
        if not stat.S_ISREG(st.st_mode):  # a FIFO/socket/device/dir in place of a DB: never opened (it may block)
            return DbObservation(name=name, size_bytes=0, mtime_s=st.st_mtime, checked=True, error=NOT_REGULAR)
        if not deep:
            return DbObservation(name=name, size_bytes=st.st_size, mtime_s=st.st_mtime)
        key = (path, st.st_size, st.st_mtime_ns)
        with self._lock:
            hit = self._cache.get(key)
        if hit is not None:
            return hit
        obs = _check_sqlite(path, name, st.st_size, st.st_mtime)
        if obs.checked and not obs.locked:
            with self._lock:
                if len(self._cache) > 100_000:
                    self._cache.clear()
                self._cache[key] = obs
        return obs


CHECKED_TABLES = ("RANK_DEVICE_MAP", "STEP_TIME", "STRING_IDS", "COMMUNICATION_OP", "CANN_API", "TASK",
                  "COMPUTE_TASK_INFO", "AICORE_FREQ", "META_DATA", "StepTraceTime", "CommAnalyzerTime")
"""The tables a rank's DBs are checked in (``PRAGMA quick_check(<table>)``, SQLite >= 3.33: that table's b-tree
and its indexes): those the first verdict and the alert-phase recipes read (the own-tables reader:
``STEP_TIME``, ``STRING_IDS``, ``COMMUNICATION_OP``, ``CANN_API``, ``TASK``, ``COMPUTE_TASK_INFO``,
``AICORE_FREQ``, ``StepTraceTime``; the checks here: ``RANK_DEVICE_MAP``, ``CommAnalyzerTime``; ``META_DATA``;
docs/msprof-analyze.md#own-tables). A corrupt page in one of them is caught before a verdict reads it; a
corrupt page in a table no verdict reads (e.g. ``PYTORCH_API``, ``MSTX``, the memory tables) is not looked for: a
whole-file ``quick_check`` read every byte of every DB (1.79 GB at 1024 ranks against the 0.2 GB the recipe
reads) and made the cold first verdict slower than the recipe it precedes. A recipe of the enrich phase that meets
such a page fails on its own (``tool_error``)."""
_SQLITE_MAGIC = b"SQLite format 3\x00"


def _header_problem(path: str, size: int) -> str | None:
    """Why the 100-byte SQLite header (https://www.sqlite.org/fileformat.html section 1.3) makes the file unusable:
    not SQLite, a page size that is not a power of two in 512..65536, or a file shorter than the in-header page
    count says (valid when the version-valid-for number at 92 equals the change
    counter at 24): an interrupted copy or write. None when the header is sound."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(100)
    except OSError as exc:
        return f"{UNREADABLE} ({_describe(exc)})"
    if len(head) < 100 or not head.startswith(_SQLITE_MAGIC):
        return "file is not a database (no SQLite header)"
    page_size = int.from_bytes(head[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    if page_size < 512 or page_size & (page_size - 1):
        return f"file is not a database (page size {page_size} in its header)"
    pages = int.from_bytes(head[28:32], "big")
    if pages and head[24:28] == head[92:96] and size < pages * page_size:
        return f"database disk image is malformed (truncated: {size} bytes, its header says {pages * page_size})"
    return None


def _check_sqlite(path: str, name: str, size: int, mtime: float) -> DbObservation:
    common: dict[str, Any] = {"name": name, "size_bytes": size, "mtime_s": mtime, "checked": True}
    try:  # sqlite3 says only "unable to open database file": name a permission problem as such
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
    except PermissionError:
        return DbObservation(error=f"{UNREADABLE} (permission denied)", **common)
    except FileNotFoundError:
        raise
    except OSError as exc:
        return DbObservation(error=f"{UNREADABLE} ({_describe(exc)})", **common)
    if size == 0:
        return DbObservation(error="empty file", **common)
    problem = _header_problem(path, size)
    if problem is not None:
        return DbObservation(error=problem, **common)
    # quote the file name's bytes as the OS gives them (os.fsencode), not its str: a name that is not valid in
    # the locale's encoding holds surrogate escapes, which a str quote() cannot encode (docs/paths.md#any-locale)
    uri = "file:" + urllib.parse.quote(os.fsencode(os.path.abspath(path))) + "?mode=ro"
    try:
        con = sqlite3.connect(uri, uri=True, timeout=0.2, check_same_thread=False)
    except sqlite3.Error as exc:
        return DbObservation(error=str(exc), **common)
    try:
        tables = frozenset(r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'"))  # schema
        for t in CHECKED_TABLES:
            if t in tables:
                result = con.execute(f'PRAGMA quick_check("{t}")').fetchone()
                if not result or result[0] != "ok":
                    return DbObservation(error=f"quick_check({t}): {result[0] if result else 'no result'}", **common)
        rdm = tuple(int(r[0]) for r in con.execute("SELECT rankId FROM RANK_DEVICE_MAP")) \
            if "RANK_DEVICE_MAP" in tables else None
        steps = tuple(int(r[0]) for r in con.execute("SELECT id FROM STEP_TIME")) if "STEP_TIME" in tables else None
        rows = {t: int(con.execute(f'SELECT EXISTS(SELECT 1 FROM "{t}")').fetchone()[0])
                for t in ("COMMUNICATION_OP", "StepTraceTime", "CommAnalyzerTime", "TASK", "COMPUTE_TASK_INFO")
                if t in tables}
        return DbObservation(tables=tables, rank_device_map=rdm, step_ids=steps, rows=rows, **common)
    except sqlite3.OperationalError as exc:
        if "locked" in str(exc) or "busy" in str(exc):
            return DbObservation(locked=True, **common)
        return DbObservation(error=str(exc), **common)
    except (sqlite3.Error, ValueError, TypeError) as exc:
        return DbObservation(error=str(exc), **common)
    finally:
        con.close()


def _local_ts(ts_naive: Any) -> float | None:
    try:
        return float(ts_naive.timestamp())  # naive -> this host's local time, as torch_npu wrote it
    except (OverflowError, OSError, ValueError):
        return None


def _parse_info(data: Any) -> Any:
    return parse_profiler_info(data)


def _parse_meta(data: Any, intern: dict[tuple[int, ...], tuple[int, ...]] | None = None) -> Any:
    if isinstance(data, dict):  # add_metadata() stores strings: decode JSON-encoded values
        data = {k: _maybe_json(v) if k in _JSON_VALUE_KEYS else v for k, v in data.items()}
    return parse_profiler_metadata(data, intern)


def _maybe_json(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except (ValueError, RecursionError, MemoryError):  # nested past the parser's depth limit: not JSON
            return value
    return value


MAX_JSON_BYTES = 64 * 1024 * 1024
"""profiler_info / profiler_metadata are small (KBs); anything beyond this is not read."""


def _read_json(path: str) -> tuple[Any, str | None]:
    """Decoded JSON, or (None, why). A half-written file (non-atomic writes, docs/rank-dirs.md#ascend) is "not yet valid"."""
    try:
        # O_NONBLOCK: a FIFO planted in a rank dir must not hang the scan; only regular files are read, capped
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return None, "not a regular file"
            if st.st_size > MAX_JSON_BYTES:
                return None, f"too large for a profiler JSON ({st.st_size} bytes > {MAX_JSON_BYTES})"
            with os.fdopen(fd, "rb", closefd=False) as fh:
                data = fh.read(MAX_JSON_BYTES + 1)
        finally:
            os.close(fd)
        text = data.decode("utf-8")
    except FileNotFoundError:
        return None, "vanished"
    except UnicodeDecodeError as exc:
        return None, f"not UTF-8 ({exc.reason})"
    except OSError as exc:
        return None, f"unreadable ({exc.strerror or exc})"
    if not text.strip():
        return None, "empty (still being written?)"
    try:
        return json.loads(text), None
    except ValueError as exc:
        return None, f"not valid JSON yet ({exc})"
    except RecursionError:  # "[[[[..." deeper than the interpreter's recursion limit (a hostile or corrupt file)
        return None, "not valid JSON (nested too deeply to decode)"
    except MemoryError:
        return None, "not valid JSON (too large to decode in memory)"


def _raw_data_state(prof_entries: list[os.DirEntry[str]]) -> tuple[tuple[str, ...], tuple[str, ...], bool]:
    """One pass over the ``PROF_*`` dirs (names only: no raw data file is read): ``(PROF_*/device_N dirs, those of
    them that are empty, whether a PROF_*/{host,device_*}/sqlite is still there)``; the last means CANN's export
    is not finished (docs/rank-dirs.md#completion). Device dirs are paths relative to the rank dir."""
    found: list[str] = []
    empty: list[str] = []
    leftover = False
    for entry in prof_entries:
        try:
            if not entry.is_dir(follow_symlinks=False):
                continue
            with os.scandir(entry.path) as subs:
                for sub in subs:
                    is_device = sub.name.startswith("device_")
                    if not (is_device or sub.name == "host") or not sub.is_dir(follow_symlinks=False):
                        continue
                    if not is_device:
                        leftover = leftover or os.path.isdir(os.path.join(sub.path, "sqlite"))
                        continue
                    rel = f"{entry.name}/{sub.name}"
                    found.append(rel)
                    with os.scandir(sub.path) as it:  # one listing: empty, and whether sqlite/ is left
                        inside = list(it)
                    if not inside:
                        empty.append(rel)
                    elif not leftover:
                        leftover = any(e.name == "sqlite" and e.is_dir(follow_symlinks=True) for e in inside)
        except FileNotFoundError:
            continue
    return tuple(sorted(found)), tuple(sorted(empty)), leftover


def find_rank_dirs(root: str, *, max_depth: int = 5, notes: list[str] | None = None) -> tuple[list[str], list[str]]:
    """Rank dirs under ``root`` (``root`` itself included), at most ``max_depth`` levels down, no symlinked dirs.

    Does not descend into rank dirs, nor into folders below ``root`` that hold profwatch's
    :data:`~profwatch.core.batches.prof_layout.OUTPUT_MARKER` (its own staging and output folders). Returns
    ``(paths, walk_errors)``; sub-dirs vanishing mid-walk are skipped. ``notes``, when given, receives one line
    per rank dir name skipped because it is a symlink (not followed, as msprof-analyze does not) or not a folder.

    Raises:
        TreeUnavailable: ``root`` cannot be listed (missing mount, ESTALE, EIO, ...).
    """
    root = os.path.abspath(root)
    if parse_rank_dir_name(os.path.basename(root)) is not None:
        return [root], []
    found: list[str] = []
    errors: list[str] = []
    level = [root]
    for _depth in range(max_depth):
        nxt: list[str] = []
        for d in level:
            try:
                with os.scandir(d) as it:
                    entries = list(it)
                if d != root and any(e.name == OUTPUT_MARKER for e in entries):
                    continue  # profwatch's own output (staged links of a batch): not capture data
                subdirs = []
                for e in entries:
                    if e.is_dir(follow_symlinks=False):
                        subdirs.append(e)
                    elif notes is not None and parse_rank_dir_name(e.name) is not None:
                        notes.append(_skipped_rank_dir(e))
            except OSError as exc:
                if d == root:
                    raise TreeUnavailable(exc.errno, f"cannot list scan root {root}: {_describe(exc)}") from exc
                if not _gone(exc):
                    errors.append(f"{d}: {_describe(exc)}")
                continue
            for e in subdirs:
                (found if parse_rank_dir_name(e.name) is not None else nxt).append(e.path)
        level = nxt
        if not level:
            break
    return sorted(found), errors


def _skipped_rank_dir(entry: os.DirEntry[str]) -> str:
    """Why a rank-dir-named entry that is not a real folder was not scanned (for a note naming its path)."""
    if entry.is_symlink():
        try:
            dest = os.readlink(entry.path)
        except OSError as exc:
            dest = f"? ({_describe(exc)})"
        return (f"skipped {entry.path}: a symlink (-> {dest}); rank dir links are not followed, as msprof-analyze "
                "does not follow them: scan the link's target instead")
    return f"skipped {entry.path}: named like a rank dir but not a folder"


def find_unsupported(root: str | os.PathLike[str], *, max_depth: int = 5, limit: int = 10_000) -> dict[str, list[str]]:
    """Profiler outputs under ``root`` that profwatch recognises but does not analyse (MindSpore ``*_ascend_ms``
    rank dirs, msprof ``PROF_*`` captures, loose ``*.pt.trace.json``), by kind (sorted paths).

    Walks like :func:`find_rank_dirs` (no symlinked dirs, not into rank dirs of either kind nor profwatch's output
    folders); looks at no more
    than ``limit`` entries. Never raises: unreadable folders are skipped.
    """
    found: dict[str, list[str]] = {}
    level_root = os.path.abspath(root)
    level = [level_root]
    seen = 0
    for _depth in range(max_depth):
        nxt: list[str] = []
        for d in level:
            try:
                with os.scandir(d) as it:
                    entries = list(it)
            except OSError:
                continue
            if d != level_root and any(e.name == OUTPUT_MARKER for e in entries):
                continue  # profwatch's own output folder
            for e in entries:
                seen += 1
                if seen > limit:
                    return found
                try:
                    is_dir = e.is_dir(follow_symlinks=False)
                except OSError:
                    continue
                what = unsupported_output(e.name, is_dir=is_dir)
                if what is not None:
                    found.setdefault(what, []).append(e.path)
                elif is_dir and parse_rank_dir_name(e.name) is None:
                    nxt.append(e.path)
        level = nxt
        if not level:
            break
    return {k: sorted(v) for k, v in found.items()}


def describe_unsupported(found: Mapping[str, list[str]]) -> str:
    """One line per kind of :func:`find_unsupported`: what was found, an example, and that it is not supported."""
    return "\n".join(f"found {len(paths)} {what}, e.g. {paths[0]}: not supported (profwatch analyses PyTorch "
                     "captures: *_ascend_pt rank dirs from torch_npu, *_torch_pt from its torch backend)"
                     + (f"; {UNSUPPORTED_ADVICE[what]}" if what in UNSUPPORTED_ADVICE else "")
                     for what, paths in found.items())


SCAN_READ_WORKERS = 4
"""Threads that read the rank dirs of one :func:`scan_tree` (their files and DB checks): reads from a cold page
cache wait on the disk, and several in flight overlap those waits. 1024 generated rank dirs read cold took
3.8-4.8 s with 4 threads against 7.9-14.6 s with one (a shared two-core box at load 23-33)."""


def scan_tree(root: str | os.PathLike[str], *, world_size: int | None = None, now: float | None = None,
              settings: WatchSettings | None = None, hints: Mapping[str, CaptureHint] | None = None,
              reader: RankDirReader | None = None, workers: int = SCAN_READ_WORKERS) -> list[BatchState]:
    """Walk ``root`` (up to ``settings.scan_max_depth`` levels) and return every batch found, sorted by id.

    ``now``: unix seconds (default: the wall clock) for deadlines and the quiet period. ``world_size`` fixes the
    expected ranks of every batch; ``hints`` (by capture id) carry what the coordinator armed. Pass a long-lived
    ``reader`` to reuse DB checks across scans. Sub-folders that fail to list add a note to every batch. The rank
    dirs are read by ``workers`` threads (:data:`SCAN_READ_WORKERS`; 1: in this thread), in the walk's order.

    Raises:
        TreeUnavailable: the root cannot be listed; treat its batches as unknown.
    """
    settings = settings or WatchSettings()
    reader = reader or RankDirReader()
    skipped: list[str] = []
    paths, errors = find_rank_dirs(os.fspath(root), max_depth=settings.scan_max_depth, notes=skipped)
    for e in errors:
        log.warning("scan_walk_error", error=e)
    if workers > 1 and len(paths) > 1:
        with ThreadPoolExecutor(min(workers, len(paths)), thread_name_prefix="profwatch-scan") as pool:
            read = list(pool.map(reader.read, paths))
    else:
        read = [reader.read(p) for p in paths]
    observations = [o for o in read if o is not None]
    batches = assess_batches(observations, now_unix_s=time.time() if now is None else now, settings=settings,
                             world_size=world_size, hints=hints)
    add_walk_notes(batches, errors, skipped)
    return batches


def add_walk_notes(batches: list[BatchState], errors: list[str], skipped: list[str]) -> None:
    """Append what the walk of :func:`find_rank_dirs` could not see (folders that failed to list, rank dir names
    skipped) to the notes of every batch."""
    for b in batches:
        b.notes += [f"could not list {e}; ranks below it may be missing" for e in errors]
        b.notes += skipped


def confirm_rank_dir(root: str, path: str, max_depth: int) -> bool:
    """Whether ``path`` (named by a watch event) is a rank dir :func:`find_rank_dirs` would find below ``root``:
    its first rank-dir-named component within ``max_depth`` levels (``prof_layout.rank_dir_of``), a real folder
    (not a symlink), below no symlinked folder and no folder holding profwatch's ``OUTPUT_MARKER``. False when it
    or a folder above it is gone or not a folder; True when the storage cannot answer (ESTALE, EIO: the read then
    says ``unknown``, docs/field-cases.md#fc-15)."""
    root = os.path.abspath(root)
    if rank_dir_of(root, path, max_depth) != path:
        return False
    cur = root
    rel = os.path.relpath(path, root)
    parts = [] if rel == "." else rel.split(os.sep)
    try:
        for i, part in enumerate(parts):
            cur = os.path.join(cur, part)
            st = os.lstat(cur)
            if not stat.S_ISDIR(st.st_mode):  # a symlink or a file
                return False
            if i < len(parts) - 1 and os.path.lexists(os.path.join(cur, OUTPUT_MARKER)):
                return False  # profwatch's own output (staged links of a batch)
    except OSError as exc:
        return not _gone(exc)
    return True
