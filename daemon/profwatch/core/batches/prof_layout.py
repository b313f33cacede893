"""Rank-dir layout of torch_npu / torch.profiler captures: name recognition and info/metadata parsing (pure).

Nothing here reads files: callers pass directory names and already-decoded JSON objects. Sources:
docs/rank-dirs.md (both formats and their completion rules), docs/msprof-analyze.md#discovery and
#before-running, docs/torch_npu-dynamic-profile.md#output-layout.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

RankDirKind = Literal["ascend_pt", "torch_pt"]

#: Rank dir name, torch_npu spelling ``{worker}_{pid}_{YYYYmmddHHMMSSfff}_ascend_pt`` (docs/rank-dirs.md);
#: the torch backend uses the same shape with ``_torch_pt``.
RANK_DIR_RE = re.compile(r"^(?P<worker>.+)_(?P<pid>\d+)_(?P<ts>\d{17})_(?P<kind>ascend_pt|torch_pt)$")
PROFILER_INFO_RE = re.compile(r"^profiler_info(?:_(?P<rank>-?\d+))?\.json$")
#: ``ascend_pytorch_profiler(_<digits>)?.db``; no digits means rank -1 to msprof-analyze (docs/msprof-analyze.md#discovery).
PROFILER_DB_RE = re.compile(r"^ascend_pytorch_profiler(?:_(?P<rank>\d+))?\.db$")
KINETO_TRACE_RE = re.compile(r"^.+\.pt\.trace\.json(?:\.gz)?$")

#: Profiler outputs profwatch recognises but does not analyse: (pattern, is_dir, what it is). msprof-analyze
#: classifies the same suffixes (msprof doc section 3B); profwatch reads PyTorch captures only.
UNSUPPORTED_OUTPUTS: tuple[tuple[re.Pattern[str], bool, str], ...] = (
    (re.compile(r"^.+_\d+_\d{17}_ascend_ms$"), True, "MindSpore profiler rank dirs (*_ascend_ms)"),
    (re.compile(r"^PROF_\d+_\d+_[0-9A-Za-z]+$"), True, "msprof command-line captures (PROF_*)"),
    (re.compile(r"^.+\.pt\.trace\.json(?:\.gz)?$"), False,
     "torch.profiler traces outside a profwatch *_torch_pt rank dir (*.pt.trace.json)"),
    (re.compile(r"^msmonitor_\d+_\d{17}_(?:-1|\d+)\.db$"), False,
     "msMonitor lightweight DBs (msmonitor_{pid}_{ts}_{rank}.db)"),
)
UNSUPPORTED_ADVICE = {
    "msMonitor lightweight DBs (msmonitor_{pid}_{ts}_{rank}.db)":
        "msprof-analyze reads them itself: `msprof-analyze -m slow_rank -d <this folder>` names a slow rank from "
        "their communication ops (cluster_time_summary and communication_matrix need the analysis.db msMonitor "
        "does not write); for profwatch's verdict, capture with torch_npu's dynamic_profile (one *_ascend_pt rank "
        "dir per rank)",
}
"""What to do with an output kind of :data:`UNSUPPORTED_OUTPUTS` when there is more to say than "not supported"
(msMonitor's DBs: the name pattern and the recipes that read them, docs/msprof-analyze.md#msmonitor)."""

NAMED_RANKS_KEY = "profwatch_named_ranks"
"""Metadata key of the ranks the capture's anomaly named (a named-rank regression), as ranges (:func:`encode_rank_list`):
the comparison with the job's reference capture is made on those ranks (docs/changes.md)."""
RANK_LIST_KEY = "profwatch_rank_list"
"""Metadata key of a targeted capture's ``rank_list``, as ranges (:func:`encode_rank_list`): torch_npu copies the
config's ``metadata`` into every rank dir's ``profiler_metadata.json`` (the torch.profiler backend does the same),
so an offline scan knows the capture was targeted and which ranks it expects."""
WORLD_SIZE_KEY = "profwatch_world_size"
"""Metadata key of the job's world size at arm time (a targeted capture holds fewer ranks than the job)."""
MAX_DECODED_RANKS = 1 << 20
"""A decoded rank list longer than this is refused (the metadata is read from disk: it is not trusted)."""

PROFILER_OUTPUT_DIR = "ASCEND_PROFILER_OUTPUT"
NOT_REGULAR = "not a regular file"
"""``DbObservation.error`` of a FIFO/socket/device in place of a DB (never opened: that could block)."""
UNREADABLE = "unreadable"
"""Prefix of ``DbObservation.error`` when the file could not be opened (permission denied, ...): not damage."""
OUTPUT_MARKER = ".profwatch-output"
"""File profwatch writes into the folders it creates (``analyze --out``, staging roots): scans skip any folder
below the scan root holding it, so staged links to a batch never count as a second copy of its ranks."""
PROFILER_METADATA = "profiler_metadata.json"
ANALYSIS_DB = "analysis.db"
#: torch_npu >= 26.0.0 writes this empty file last in a parse (docs/rank-dirs.md#ascend).
ANALYSE_DONE = "analyse.done"
#: The torch backend's completion marker, written last (architecture.md "Rank dir formats").
TRACE_DONE = "trace.done"

#: Tables the recipes read from ``ascend_pytorch_profiler_{rank}.db`` (docs/msprof-analyze.md#rank-files).
REQUIRED_PROFILER_TABLES: tuple[str, ...] = (
    "STRING_IDS",
    "COMMUNICATION_OP",
    "CANN_API",
    "RANK_DEVICE_MAP",
    "TASK",
    "COMPUTE_TASK_INFO",
)
#: Tables that only carry communication data; a Level0 capture may lack them (docs/field-cases.md#fc-03).
COMMUNICATION_TABLES: frozenset[str] = frozenset({"COMMUNICATION_OP", "CommAnalyzerTime"})
#: Tables cluster_time_summary reads from ``analysis.db``; StepTraceTime is written last (docs/rank-dirs.md#ascend).
REQUIRED_ANALYSIS_TABLES: tuple[str, ...] = ("StepTraceTime", "CommAnalyzerTime")
#: Text-export outputs (docs/rank-dirs.md#ascend); seen without a DB they mean "text-only export".
TEXT_OUTPUTS: frozenset[str] = frozenset(
    {"step_trace_time.csv", "communication.json", "communication_matrix.json", "trace_view.json", "kernel_details.csv"}
)


class LayoutError(ValueError):
    """A profiler_info / profiler_metadata object does not have the documented shape."""


@dataclass(frozen=True, slots=True)
class RankDirName:
    """Fields of a rank dir name: ``worker`` (hostname by default), ``pid``, 17-digit local-time ``ts``, ``kind``."""

    worker: str
    pid: int
    ts: str
    kind: RankDirKind

    @property
    def ts_naive(self) -> datetime:
        """``ts`` as a naive local-time datetime (torch_npu writes local time, docs/rank-dirs.md)."""
        return ts_naive_of(self.ts)


@functools.lru_cache(maxsize=1 << 16)
def ts_naive_of(t: str) -> datetime:
    """A 17-digit rank dir name time (``RankDirName.ts``, ``YYYYmmddHHMMSSfff``) as a naive datetime; ValueError for an
    impossible date. Memoised (a datetime is immutable): every read of a rank dir needs its name's time, twice."""
    return datetime(int(t[0:4]), int(t[4:6]), int(t[6:8]), int(t[8:10]), int(t[10:12]), int(t[12:14]),
                    int(t[14:17]) * 1000)


@functools.lru_cache(maxsize=1 << 16)
def parse_rank_dir_name(name: str) -> RankDirName | None:
    """Return the fields of a rank dir name, or None when ``name`` is not a rank dir (docs/rank-dirs.md).
    Memoised (the result is immutable): a warm scan parses each of thousands of names again."""
    m = RANK_DIR_RE.fullmatch(name)
    if m is None:
        return None
    parsed = RankDirName(m["worker"], int(m["pid"]), m["ts"], m["kind"])  # type: ignore[arg-type]
    try:
        parsed.ts_naive  # noqa: B018 (rejects impossible dates such as month 13)
    except ValueError:
        return None
    return parsed


def rank_dir_of(root: str, path: str, max_depth: int) -> str | None:
    """The rank dir that holds ``path`` (or is ``path``) below the scan root ``root``: the first of ``path``'s first
    ``max_depth`` components below ``root`` named like a rank dir, as ``find_rank_dirs`` would find it (it walks
    ``max_depth`` levels and never descends into a rank dir); ``root`` itself when it is a rank dir. None when no
    such component exists or ``path`` is not below ``root``. Both are normalised absolute paths (string work only:
    whether the dir is real is the reader's question)."""
    root = root.rstrip("/") or "/"
    if parse_rank_dir_name(root.rsplit("/", 1)[-1]) is not None:
        return root if path == root or path.startswith(root + "/") else None
    prefix = root if root.endswith("/") else root + "/"
    if not path.startswith(prefix):
        return None
    parts = path[len(prefix):].split("/")
    for i, part in enumerate(parts[:max_depth]):
        if parse_rank_dir_name(part) is not None:
            return prefix + "/".join(parts[: i + 1])
    return None


def unsupported_output(name: str, *, is_dir: bool) -> str | None:
    """What an entry of a scanned folder is when profwatch recognises it but does not analyse it, else None."""
    for pattern, want_dir, what in UNSUPPORTED_OUTPUTS:
        if want_dir == is_dir and pattern.fullmatch(name):
            return what
    return None


@functools.lru_cache(maxsize=1 << 16)
def rank_from_profiler_info_name(name: str) -> int | None:
    """Rank encoded in ``profiler_info_{rank}.json``; None for ``profiler_info.json`` (no rank) or other names.
    Memoised (every read of a rank dir asks twice; a regex match costs more than the cache)."""
    m = PROFILER_INFO_RE.fullmatch(name)
    if m is None or m["rank"] is None:
        return None
    return int(m["rank"])


@functools.lru_cache(maxsize=1 << 16)
def is_profiler_info_name(name: str) -> bool:
    """True for ``profiler_info.json`` and ``profiler_info_{rank}.json``. Memoised (asked on every rank dir read)."""
    return PROFILER_INFO_RE.fullmatch(name) is not None


@functools.lru_cache(maxsize=1 << 16)
def rank_from_db_name(name: str) -> int | None:
    """Rank msprof-analyze derives from a profiler DB file name: the digits, -1 without digits, None if no DB name.

    Source: docs/msprof-analyze.md#discovery (discovery takes the rank from the file name, not from the DB).
    Memoised (asked on every rank dir read).
    """
    m = PROFILER_DB_RE.fullmatch(name)
    if m is None:
        return None
    return int(m["rank"]) if m["rank"] is not None else -1


@dataclass(frozen=True, slots=True)
class ProfilerInfo:
    """What profwatch uses from ``profiler_info_{rank}.json`` (docs/rank-dirs.md#ascend, step 2).

    ``export_types`` from ``config.experimental_config._export_type`` (a string or a list; empty when absent,
    which torch_npu treats as text); ``collection_time_end_ns`` from ``end_info.collectionTimeEnd`` (unix ns);
    ``world_size`` only in torch backend files.
    """

    rank_id: int | None
    export_types: tuple[str, ...] = ()
    profiler_level: str | None = None
    collection_time_end_ns: int | None = None
    torch_npu_version: str | None = None
    cann_version: str | None = None
    world_size: int | None = None


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.fullmatch(r"-?\d+", value.strip()):
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def parse_profiler_info(data: Mapping[str, Any]) -> ProfilerInfo:
    """Extract :class:`ProfilerInfo` from a decoded ``profiler_info*.json`` object.

    Raises:
        LayoutError: ``data`` is not an object, or ``rank_id`` is present but not an integer.
    """
    if not isinstance(data, Mapping):
        raise LayoutError(f"profiler_info is a {type(data).__name__}, not an object")
    rank_raw = data.get("rank_id")
    rank_id = _as_int(rank_raw)
    if rank_raw is not None and rank_id is None:
        raise LayoutError(f"profiler_info rank_id is not an integer: {rank_raw!r}")
    config_raw = data.get("config")
    config: Mapping[str, Any] = config_raw if isinstance(config_raw, Mapping) else {}
    exp_raw = config.get("experimental_config")
    exp: Mapping[str, Any] = exp_raw if isinstance(exp_raw, Mapping) else {}
    export_raw = exp.get("_export_type", exp.get("export_type"))
    if isinstance(export_raw, str):
        export_types: tuple[str, ...] = (export_raw.lower(),)
    elif isinstance(export_raw, (list, tuple)):
        export_types = tuple(str(x).lower() for x in export_raw)
    else:
        export_types = ()
    level = exp.get("_profiler_level", exp.get("profiler_level"))
    end_raw = data.get("end_info")
    end_info: Mapping[str, Any] = end_raw if isinstance(end_raw, Mapping) else {}
    return ProfilerInfo(
        rank_id=rank_id,
        export_types=export_types,
        profiler_level=str(level) if level is not None else None,
        collection_time_end_ns=_as_int(end_info.get("collectionTimeEnd")),
        torch_npu_version=_str_or_none(data.get("torch_npu_version")),
        cann_version=_str_or_none(data.get("cann_version")),
        world_size=_as_int(data.get("world_size")),
    )


def encode_rank_list(ranks: Iterable[int], max_chars: int) -> str | None:
    """``"0-3,8,10-12"``: sorted distinct ranks as contiguous ranges; ``None`` when the text (as a JSON string, with
    its two quotes) would exceed ``max_chars`` (torch_npu's ``add_metadata_json`` skips longer values)."""
    spans: list[list[int]] = []
    for r in sorted(set(ranks)):
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    text = ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
    return text if len(text) + 2 <= max_chars else None


_RANGE_RE = re.compile(r"^\s*(\d{1,9})\s*(?:-\s*(\d{1,9})\s*)?$")


def decode_rank_list(value: Any) -> tuple[int, ...] | None:
    """Inverse of :func:`encode_rank_list` (a JSON list of ints is accepted too); ``None`` for anything malformed,
    empty, with a reversed range, or expanding to more than :data:`MAX_DECODED_RANKS` ranks."""
    if isinstance(value, list):
        if not value or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
            return None
        return tuple(sorted(set(value))) if len(value) <= MAX_DECODED_RANKS else None
    if not isinstance(value, str) or not value.strip():
        return None
    out: set[int] = set()
    for part in value.split(","):
        m = _RANGE_RE.match(part)
        if m is None:
            return None
        a = int(m.group(1))
        b = int(m.group(2)) if m.group(2) is not None else a
        if b < a or len(out) + (b - a + 1) > MAX_DECODED_RANKS:
            return None
        out.update(range(a, b + 1))
    return tuple(sorted(out))


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


@dataclass(frozen=True, slots=True)
class ProfilerMetadata:
    """What profwatch uses from ``profiler_metadata.json`` (docs/rank-dirs.md).

    ``capture_id``/``job_id``/``reason``: the ``profwatch_*`` keys profwatch stamps into the config's metadata.
    ``world_size``: ``len(global_ranks)`` of the ``default_group`` entry of ``parallel_group_info``, else
    ``distributed_args.world_size``, else the ``profwatch_world_size`` profwatch stamps (docs/rank-dirs.md#completion). ``group_names``: the HCCL communicator names
    (keys of ``parallel_group_info``), identical across ranks of one job, a grouping hint only. ``groups``: the
    communicators smaller than the world (name -> sorted global ranks), which targeted captures use to pick a
    suspect's group peers (``daemon/profwatch/core/arming/targeting.py``); the world group is left out (it says nothing about
    locality, and a copy of it per rank would cost N^2 memory).
    """

    capture_id: str | None = None
    job_id: str | None = None
    reason: str | None = None
    world_size: int | None = None
    group_names: frozenset[str] = field(default_factory=frozenset)
    groups: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    rank_list: tuple[int, ...] | None = None
    """A targeted capture's ranks (:data:`RANK_LIST_KEY`), else None."""


def _group_members(pgi: Mapping[str, Any], world: int | None,
                   intern: dict[tuple[int, ...], tuple[int, ...]] | None) -> dict[str, tuple[int, ...]]:
    out: dict[str, tuple[int, ...]] = {}
    for raw_name, info in pgi.items():
        ranks = info.get("global_ranks") if isinstance(info, Mapping) else None
        if not isinstance(ranks, list) or not ranks or (world is not None and len(ranks) >= world):
            continue
        if not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in ranks):
            continue
        members = tuple(sorted(set(ranks)))
        if intern is not None:  # every rank of a group lists the same members: keep one tuple
            members = intern.setdefault(members, members)
        out[str(raw_name)] = members
    return out


def parse_profiler_metadata(data: Mapping[str, Any],
                            intern: dict[tuple[int, ...], tuple[int, ...]] | None = None) -> ProfilerMetadata:
    """Extract :class:`ProfilerMetadata` from a decoded ``profiler_metadata.json`` object.

    torch_npu stores some values as JSON-encoded strings (``add_metadata`` takes strings), so string values of
    ``parallel_group_info`` / ``distributed_args`` are decoded by the caller or ignored here when not objects.
    ``intern``: a table shared across the ranks of a scan, so that a group's member tuple exists once.

    Raises:
        LayoutError: ``data`` is not an object.
    """
    if not isinstance(data, Mapping):
        raise LayoutError(f"profiler_metadata is a {type(data).__name__}, not an object")
    world_size: int | None = None
    groups: set[str] = set()
    pgi = data.get("parallel_group_info")
    if isinstance(pgi, Mapping):
        for raw_name, info in pgi.items():
            groups.add(str(raw_name))
            if isinstance(info, Mapping) and info.get("group_name") == "default_group":
                ranks = info.get("global_ranks")
                if isinstance(ranks, list) and ranks:
                    world_size = len(ranks)
    dargs = data.get("distributed_args")
    if world_size is None and isinstance(dargs, Mapping):
        world_size = _as_int(dargs.get("world_size"))
    if world_size is None:
        world_size = _as_int(data.get(WORLD_SIZE_KEY))
    world = world_size if world_size and world_size > 0 else None
    return ProfilerMetadata(
        capture_id=_str_or_none(data.get("profwatch_capture_id")),
        job_id=_str_or_none(data.get("profwatch_job_id")),
        reason=_str_or_none(data.get("profwatch_reason")),
        world_size=world,
        group_names=frozenset(groups),
        groups=_group_members(pgi, world, intern) if isinstance(pgi, Mapping) else {},
        rank_list=decode_rank_list(data.get(RANK_LIST_KEY)),
    )


@dataclass(frozen=True, slots=True)
class DbObservation:
    """What the adapter saw in one SQLite file (read-only open; docs/msprof-analyze.md#before-running).

    ``checked`` is False when the adapter skipped the content checks (the rank is still parsing). ``error`` is
    the header's problem, the ``PRAGMA quick_check`` result of a checked table when not ``ok``
    (``adapters/fs/rank_dir_fs.CHECKED_TABLES``), or the open/read error ("database disk image is malformed",
    "file is not a database"). ``locked``: a writer holds the DB (still being written).
    ``rank_device_map``: ``RANK_DEVICE_MAP.rankId`` values (None when the table is missing);
    ``step_ids``: ``STEP_TIME.id`` values (None when the table is missing); ``rows``: row counts of the
    tables the checks count (``COMMUNICATION_OP``, ``StepTraceTime``, ``CommAnalyzerTime``, ``TASK``,
    ``COMPUTE_TASK_INFO``; 1 = has rows, 0 = empty).
    """

    name: str
    size_bytes: int = 0
    mtime_s: float = 0.0
    checked: bool = False
    error: str | None = None
    locked: bool = False
    tables: frozenset[str] = frozenset()
    rank_device_map: tuple[int, ...] | None = None
    step_ids: tuple[int, ...] | None = None
    rows: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RankDirObservation:
    """Everything the completeness core needs from one rank dir, read by ``daemon/profwatch/adapters/fs/rank_dir_fs.py``.

    ``unknown`` is set (to the errno name and message) when the directory could not be read right now
    (ESTALE, EIO, ...): such a rank is neither present-and-healthy nor deleted (docs/field-cases.md#fc-15).
    ``dir_ts_unix_s``: the name's local-time ``ts`` converted by the adapter (the host's time zone).
    ``info_file``/``info``/``info_error``: the ``profiler_info*.json`` file name, parsed content, or why it did
    not parse (a non-atomic write may still be in progress, docs/rank-dirs.md#ascend). Same for ``metadata``.
    ``output_files``: names in ``ASCEND_PROFILER_OUTPUT`` (ascend) or in the rank dir itself (torch).
    ``newest_output_mtime_s``: the newest mtime (unix s) of anything in the output dir, for the quiet period (with
    ``analyse.done`` there, of its DBs only: the quiet period is then not used).
    ``leftover_sqlite``: some ``PROF_*/{host,device_*}/sqlite`` dir still exists (docs/rank-dirs.md#completion).
    ``device_dirs`` / ``empty_device_dirs``: the ``PROF_*/device_N`` dirs, and those holding nothing at all (the
    device recorded no data).
    """

    path: str
    name: RankDirName
    dir_ts_unix_s: float | None = None
    unknown: str | None = None
    info_file: str | None = None
    info: ProfilerInfo | None = None
    info_error: str | None = None
    metadata: ProfilerMetadata | None = None
    metadata_error: str | None = None
    output_dir: bool = False
    output_files: frozenset[str] = frozenset()
    marker: bool = False
    profiler_dbs: tuple[DbObservation, ...] = ()
    analysis_db: DbObservation | None = None
    leftover_sqlite: bool = False
    journal_files: tuple[str, ...] = ()
    newest_output_mtime_s: float | None = None
    trace_files: tuple[str, ...] = ()
    device_dirs: tuple[str, ...] = ()
    empty_device_dirs: tuple[str, ...] = ()
