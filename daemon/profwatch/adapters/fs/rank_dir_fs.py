"""Reads rank dirs from (possibly shared) storage into the completeness core's inputs (I/O adapter).

Every read tolerates entries vanishing mid-walk (a re-parse deletes ``ASCEND_PROFILER_OUTPUT``,
docs/rank-dirs.md#completion). Errors such as ESTALE/EIO, or a vanished scan root, mean "unknown", never
"deleted" (docs/field-cases.md#fc-15). SQLite files are opened read-only through a ``file:...?mode=ro`` URI
built from the name's bytes (docs/msprof-analyze.md#before-running, docs/paths.md#any-locale).
"""

from __future__ import annotations

import errno
import functools
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
    rank_from_db_name,
    rank_from_profiler_info_name,
    ts_naive_of,
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
_Listing = tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]
"""A folder's listing: ``(entry names, names of sub-folders (not symlinks), names of symlinks to folders)``."""
_COMMON_NAMES = {n: n for n in ("ASCEND_PROFILER_OUTPUT", "profiler_metadata.json", "analysis.db", "analyse.done",
                                "host", "device_0", "data", "sqlite", "FRAMEWORK", "logs")}
"""Names every rank dir holds: one string object for all the listings kept (memory)."""
LISTING_SETTLE_S = 2.0
"""A folder's listing is cached (``RankDirReader``) only once its ctime is this many seconds older than the
reader's clock: a change within the file system's timestamp granularity (ext4, xfs: a clock tick, ~4 ms; NFS
servers: down to 1 s on old ones) after the listing would not move the timestamps. A file server whose clock runs more
than this behind the reader's makes a fresh change look settled; the reconciliation pass re-reads every rank dir
then, and its listings are validated the same way (the NFS client itself revalidates a cached listing by the
folder's attributes)."""
_INFO_PREFIX = "profiler_info"
_DB_PREFIX = "ascend_pytorch_profiler"
"""The fixed starts of ``PROFILER_INFO_RE`` and ``PROFILER_DB_RE``: a name without it is not matched (one
``startswith`` instead of a regex per entry of a rank dir read on every marker)."""
MAX_CACHED_LISTINGS = 200_000
"""Listings one :class:`ListingCache` keeps at most (about four per rank dir: the rank dir, ``PROF_*``,
``PROF_*/device_N`` and ``host``, ``ASCEND_PROFILER_OUTPUT``; a 16,384-rank tree ~80k); past it the cache starts
over."""


class TreeUnavailable(OSError):
    """The scan root itself cannot be listed (missing mount, ESTALE, EIO): its ranks are unknown, not deleted.
    ``str()`` is the message alone (``cannot list scan root /x: ENOENT: No such file or directory``), without
    ``OSError``'s ``[Errno 2]`` prefix that repeated the errno the message already names."""

    def __str__(self) -> str:
        return self.strerror or super().__str__()


def _describe(exc: OSError) -> str:
    name = errno.errorcode.get(exc.errno or 0, "OSError")
    return f"{name}: {exc.strerror or exc}"


def _gone(exc: OSError) -> bool:
    return isinstance(exc, (FileNotFoundError, NotADirectoryError))


class ListingCache:
    """Folder listings of one tree's rank dirs, each kept under the folder's ``(st_dev, st_ino, st_mtime_ns,
    st_ctime_ns)`` (:meth:`RankDirReader.read` with ``listings``). A folder's mtime and ctime move when an entry is
    created, deleted or renamed in it (not when a file in it is rewritten: profiler JSON and DB files are stat'ed on
    every read); the ctime also when the mtime is set back (``touch -d``, ``rsync -t``, ``cp -p``), and no program
    can set it. A listing is kept only once its folder's ctime is :data:`LISTING_SETTLE_S` older than ``wall()``
    (a change within the file system's timestamp granularity after the listing would not move it: the "racy"
    case) and when it holds no symlink (its target may change type). The folder is stat'ed before it is listed, so
    a change in between moves the key and the next read lists again.

    Memory: one listing per folder read (about four per rank dir, ~3 KB), at most ``max_entries`` (past it the
    cache starts over); the owner drops it with the tree (``IncrementalScan`` keeps one per prof_dir).
    Thread-safe.
    """

    def __init__(self, *, wall: Callable[[], float] = time.time, max_entries: int = MAX_CACHED_LISTINGS) -> None:
        self.wall = wall
        self._max = max_entries
        self._entries: dict[str, tuple[tuple[int, int, int, int], _Listing]] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, path: str, key: tuple[int, int, int, int]) -> _Listing | None:
        """The listing kept for ``path`` under ``key``, or None."""
        hit = self._entries.get(path)
        return hit[1] if hit is not None and hit[0] == key else None

    def put(self, path: str, key: tuple[int, int, int, int], listing: _Listing, *, keep: bool) -> None:
        """Keep ``listing`` under ``key`` (``keep``), or forget what was kept for ``path``."""
        with self._lock:
            if not keep:
                self._entries.pop(path, None)
                return
            if len(self._entries) >= self._max:
                self._entries.clear()
            self._entries[path] = (key, listing)

    def forget(self, path: str) -> None:
        """Drop ``path``'s listing (a rank dir that went; those of its sub-folders stay until the cache is dropped
        or starts over: a folder recreated there has another inode and ctime, so they are never served for it)."""
        with self._lock:
            self._entries.pop(path, None)


class _Lister:
    """One read's listings: through ``cache`` (with one clock reading for the read), or fresh without it."""

    __slots__ = ("_cache", "_now", "_reader")

    def __init__(self, reader: RankDirReader, cache: ListingCache | None) -> None:
        self._reader, self._cache = reader, cache
        self._now = cache.wall() if cache is not None else 0.0

    def listing(self, path: str, st: os.stat_result | None = None) -> _Listing:
        """``path``'s listing (:data:`_Listing`), kept or fresh (:class:`ListingCache`).

        Raises:
            OSError: the folder cannot be stat'ed or listed (gone, ESTALE, EIO ...).
        """
        cache = self._cache
        if cache is None:
            return self._reader._list(path)[0]  # noqa: SLF001 - the reader's own helper
        if st is None:
            st = os.stat(path)
        key = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
        hit = cache.get(path, key)
        if hit is not None:
            return hit
        listing, symlinks = self._reader._list(path)  # noqa: SLF001
        cache.put(path, key, listing, keep=self._now - st.st_ctime >= LISTING_SETTLE_S and not symlinks)
        return listing


class RankDirReader:
    """Reads rank dirs; caches DB checks by ``(path, size, mtime_ns)`` so a reconciliation scan of 1024 ranks
    does not re-run ``PRAGMA quick_check`` on unchanged files. A read given a :class:`ListingCache` lists only the
    folders that changed since (a rank dir whose marker just landed: its ``ASCEND_PROFILER_OUTPUT/``). Thread-safe.
    """

    def __init__(self) -> None:
        self._cache: dict[tuple[str, int, int, int, int], DbObservation] = {}
        self._identity: dict[str, dict[str, Any]] = {}
        self._json_cache: dict[tuple[str, int, int, int, int], tuple[Any, str | None]] = {}
        self._groups: dict[tuple[int, ...], tuple[int, ...]] = {}  # one tuple per communicator's members
        self._lock = threading.Lock()
        self.reads = 0
        """Rank dirs read so far (each call of :meth:`read`; for the bench and tests)."""
        self.listings = 0
        """Folders listed (``scandir``) so far; a listing served from the cache is not counted (bench, tests)."""

    def read(self, path: str, *, listings: ListingCache | None = None,
             st: os.stat_result | None = None) -> RankDirObservation | None:
        """Observe one rank dir. None when ``path`` vanished or is not a rank dir name.

        ``listings``: folder listings kept from earlier reads of the same tree (None: list every folder);
        ``st``: ``path``'s ``os.lstat`` taken just before by the caller (``IncrementalScan`` confirms the dir with
        it), so validating its cached listing costs no second call; None: stat it here (with ``listings``).

        Raises nothing for storage errors: they come back as ``RankDirObservation.unknown``, carrying the rank
        identity (profiler_info, metadata) this reader last saw there, so the rank stays in its batch.
        """
        name = parse_rank_dir_name(path.rpartition("/")[2])  # os.path.basename of a str path, without its calls
        if name is None:
            return None
        with self._lock:
            self.reads += 1
        base: dict[str, Any] = {"path": path, "name": name, "dir_ts_unix_s": _local_ts(name.ts)}
        try:
            lc = _Lister(self, listings)
            obs = self._read_entries(path, name.kind, lc.listing(path, st), base, lc)
        except OSError as exc:
            if _gone(exc) and not os.path.lexists(path):
                with self._lock:
                    self._identity.pop(path, None)
                if listings is not None:
                    listings.forget(path)
                return None
            with self._lock:
                known = self._identity.get(path, {})
            return RankDirObservation(unknown=_describe(exc), **base, **known)
        if obs.info is not None and obs.metadata is not None:
            with self._lock:
                self._identity[path] = {"info_file": obs.info_file, "info": obs.info, "metadata": obs.metadata}
        return obs

    # paths below a rank dir are joined with "/": the rank dir is absolute and normalised, names never hold "/"
    def _list(self, path: str) -> tuple[_Listing, bool]:
        """``(path's listing, whether it holds a symlink)``: one ``scandir`` (entry types from ``d_type``)."""
        names: list[str] = []
        dirs: list[str] = []
        linked: list[str] = []  # symlinks to folders (followed)
        symlinks = False
        with os.scandir(path) as it:
            for e in it:
                name = _COMMON_NAMES.get(e.name, e.name)
                names.append(name)
                if e.is_dir(follow_symlinks=False):
                    dirs.append(name)
                elif e.is_symlink():
                    symlinks = True
                    try:
                        if e.is_dir(follow_symlinks=True):
                            linked.append(name)
                    except OSError:
                        pass
        with self._lock:
            self.listings += 1
        return (tuple(names), tuple(dirs), tuple(linked)), symlinks

    def _read_entries(self, path: str, kind: str, top: _Listing, base: dict[str, Any],
                      lc: _Lister) -> RankDirObservation:
        entries, dirs, linked = top
        info_names = sorted([n for n in entries if n.startswith(_INFO_PREFIX) and is_profiler_info_name(n)])
        info_file = next((n for n in info_names if rank_from_profiler_info_name(n) is not None), None)
        info_file = info_file or (info_names[0] if info_names else None)
        out: dict[str, Any] = dict(base, info_file=info_file)
        if len(info_names) > 1:
            out["info_error"] = f"several profiler_info files: {', '.join(info_names)}"
        elif info_file:
            out["info"], out["info_error"] = self._parsed_json(path, info_file, _parse_info)
        if PROFILER_METADATA in entries:
            out["metadata"], out["metadata_error"] = self._parsed_json(path, PROFILER_METADATA, self._parse_meta)
        if kind == "torch_pt":
            out["marker"] = TRACE_DONE in entries
            out["trace_files"] = tuple(sorted(n for n in entries if KINETO_TRACE_RE.fullmatch(n)))
            out["output_files"] = frozenset(entries)
            return RankDirObservation(**out)
        prof = [n for n in entries if n.startswith("PROF_") and n in dirs]
        out["device_dirs"], out["empty_device_dirs"], out["leftover_sqlite"] = self._raw_data_state(path, prof, lc)
        if PROFILER_OUTPUT_DIR not in dirs and PROFILER_OUTPUT_DIR not in linked:
            return RankDirObservation(**out)
        outdir = f"{path}/{PROFILER_OUTPUT_DIR}"
        try:
            names = frozenset(lc.listing(outdir)[0])
        except OSError as exc:
            if _gone(exc):  # deleted by a re-parse between the two listings
                return RankDirObservation(**out)
            raise
        marker = ANALYSE_DONE in names
        db_names = sorted([n for n in names if n.startswith(_DB_PREFIX) and rank_from_db_name(n) is not None])
        # with the marker, the quiet period is not used: only the DBs are stat'ed (their checks are cached by
        # size and mtime); without it, every output file (the newest mtime decides the quiet period)
        statted = [*db_names, ANALYSIS_DB] if marker else names
        newest = None
        stats: dict[str, os.stat_result] = {}  # one stat per file, reused by the DB checks below
        for n in statted:
            try:
                st = stats[n] = os.stat(f"{outdir}/{n}")
            except FileNotFoundError:
                continue
            newest = st.st_mtime if newest is None else max(newest, st.st_mtime)
        journals = tuple(sorted(n for n in names if n.endswith(("-journal", "-wal"))))
        # without the marker, DBs are read once no CANN export or journal is left (an old torch_npu whose
        # analysis.db never comes is then named by the health checks after the quiet period, not "parsing" forever)
        deep = marker or (bool(db_names) and not out["leftover_sqlite"] and not journals)
        dbs = tuple(self.check_db(f"{outdir}/{n}", deep=deep, st=stats.get(n)) for n in db_names)
        adb = self.check_db(f"{outdir}/{ANALYSIS_DB}", deep=deep, st=stats.get(ANALYSIS_DB)) \
            if ANALYSIS_DB in names else None
        out.update(output_dir=True, output_files=names, marker=marker, profiler_dbs=dbs, analysis_db=adb,
                   journal_files=journals, newest_output_mtime_s=newest)
        return RankDirObservation(**out)

    def _raw_data_state(self, path: str, prof_names: list[str], lc: _Lister) -> tuple[tuple[str, ...],
                                                                                       tuple[str, ...], bool]:
        """One pass over the ``PROF_*`` dirs ``prof_names`` of rank dir ``path`` (listings only, cached as
        :class:`ListingCache` says: no raw data file is read): ``(PROF_*/device_N dirs, those of them that are empty,
        whether a PROF_*/{host,device_*}/sqlite is still there)``; the last means CANN's export is not finished
        (docs/rank-dirs.md#completion). Device dirs are paths relative to the rank dir."""
        found: list[str] = []
        empty: list[str] = []
        leftover = False
        for pn in prof_names:
            prof = f"{path}/{pn}"
            try:
                subs, sub_dirs, _ = lc.listing(prof)
                for sub in subs:
                    is_device = sub.startswith("device_")
                    if not (is_device or sub == "host") or sub not in sub_dirs:
                        continue
                    if not is_device:
                        if not leftover:
                            try:
                                _, h_dirs, h_linked = lc.listing(f"{prof}/{sub}")
                                leftover = "sqlite" in h_dirs or "sqlite" in h_linked
                            except OSError:  # as os.path.isdir: cannot tell, so not a leftover
                                pass
                        continue
                    rel = f"{pn}/{sub}"
                    found.append(rel)
                    inside, in_dirs, in_linked = lc.listing(f"{prof}/{sub}")
                    if not inside:
                        empty.append(rel)
                    elif not leftover:
                        leftover = "sqlite" in in_dirs or "sqlite" in in_linked
            except FileNotFoundError:
                continue
        return tuple(sorted(found)), tuple(sorted(empty)), leftover

    def _parse_meta(self, data: Any) -> Any:
        if len(self._groups) > 100_000:
            self._groups.clear()
        return _parse_meta(data, self._groups)

    def _parsed_json(self, folder: str, name: str, parse: Callable[[Any], Any]) -> tuple[Any, str | None]:
        """``(parse(decoded JSON), None)`` or ``(None, why)`` of ``folder/name``; cached by (path, inode, size, mtime_ns,
        ctime_ns) (stat'ed on every call: a JSON rewritten in place does not move its folder's mtime; ctime, which no
        user can set back, so that a rewrite of the same size with its mtime restored, ``cp -p``/``touch -d``, is
        read again)."""
        file_path = f"{folder}/{name}"
        st = os.stat(file_path)
        key = (file_path, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        with self._lock:
            hit = self._json_cache.get(key)
        if hit is not None:
            return hit
        data, err = _read_json(file_path)
        value = None
        if err is None:
            try:
                value = parse(data)
            except LayoutError as exc:
                err = str(exc)
        result = (value, err and f"{name}: {err}")
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
        name = path.rpartition("/")[2]  # os.path.basename of a str path
        st = os.stat(path) if st is None else st
        if not stat.S_ISREG(st.st_mode):  # a FIFO/socket/device/dir in place of a DB: never opened (it may block)
            return DbObservation(name=name, size_bytes=0, mtime_s=st.st_mtime, checked=True, error=NOT_REGULAR)
        if not deep:
            return DbObservation(name=name, size_bytes=st.st_size, mtime_s=st.st_mtime)
        key = (path, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)  # ctime: a restored mtime still misses
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


@functools.lru_cache(maxsize=1 << 16)
def _local_ts(ts: str) -> float | None:
    """A rank dir name's ``ts`` in unix seconds: naive, so this host's local time, as torch_npu wrote it. Memoised
    (each read of a rank dir needs it; the process's time zone does not change under it)."""
    try:
        return float(ts_naive_of(ts).timestamp())
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
    if parse_rank_dir_name(os.path.basename(level_root.rstrip("/"))) is not None:
        return found  # the root is a rank dir: its traces are inside one, and a walk never goes into one
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
