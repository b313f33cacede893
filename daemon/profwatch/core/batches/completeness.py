"""Per-rank parse state, batch grouping and same-batch completeness of profiler captures (pure; time passed in).

Inputs are :class:`~profwatch.core.batches.prof_layout.RankDirObservation` objects (read by ``rank_dir_fs.py``); outputs
are :class:`BatchState` objects, whose ``to_json()`` is the ``profwatch scan --json`` shape. The checks follow
docs/rank-dirs.md#completion, docs/msprof-analyze.md#before-running and docs/field-cases.md (#fc-01, #fc-02,
#fc-07, #fc-12, #fc-18).
"""

from __future__ import annotations

import dataclasses
import hashlib
import posixpath
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache, partial
from itertools import compress, filterfalse
from operator import attrgetter, is_not
from typing import Any, Literal

from profwatch.core.batches.prof_layout import (
    ANALYSIS_DB,
    COMMUNICATION_TABLES,
    NOT_REGULAR,
    REQUIRED_ANALYSIS_TABLES,
    REQUIRED_PROFILER_TABLES,
    TEXT_OUTPUTS,
    UNREADABLE,
    DbObservation,
    RankDirKind,
    RankDirObservation,
    rank_from_db_name,
    rank_from_profiler_info_name,
    ts_naive_of,
)
from profwatch.core.batches.settings import WatchSettings
from profwatch.core.messages import MAX_WORLD_SIZE

NO_DEVICE_DATA = "no usable device data"
"""Prefix of the reason of a rank dir that finished but holds nothing to judge: the batch is not ``complete``,
yet :meth:`BatchState.judgeable` lets the analysis judge the other ranks (``partial``, ``docs/verdicts.md``)."""
RankState = Literal["appearing", "raw_complete", "parsing", "parsed", "failed", "unknown"]
BatchStatus = Literal["complete", "incomplete", "invalid", "parsing"]
_PENDING: frozenset[str] = frozenset({"appearing", "raw_complete", "parsing", "unknown"})
_EPOCH = datetime(1970, 1, 1)
BY_PATH = attrgetter("path")
"""The order :func:`evaluate_batch` reads a batch's dirs in to name the first claim of a rank."""
BY_TIME_PATH = attrgetter("t_order_s", "path")
"""The order of a batch's members (``group_rank_dirs``): name time, then path."""
_RANK = attrgetter("rank")
_STATE = attrgetter("state")
_NOTES = attrgetter("notes")
_VERSIONS = attrgetter("versions")
_WORLD_SIZE = attrgetter("world_size")
_DIR_TS_UNIX = attrgetter("dir_ts_unix_s")
_NOT_NONE = partial(is_not, None)
_IS_PARSED = "parsed".__eq__
_NOT_PARSED = "parsed".__ne__
MISSING_REASON = "rank dir missing"
"""Prefix of the reason of an expected rank without a dir (followed by " after deadline" / " (not seen yet)")."""
TEXT_EXPORT_REASON = "text export: re-export as db"
"""The documented status of a rank captured with ``export_type`` text only (docs/conformance.md)."""


@dataclass(frozen=True, slots=True)
class Problem:
    """One reason a batch is not complete: ``rank`` (None when unknown), the rank dir ``path`` (or None)."""

    rank: int | None
    path: str | None
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "path": self.path, "reason": self.reason}

    def describe(self) -> str:
        """``rank R: reason`` for a rank's problem, the bare reason for a batch-wide one (never ``rank None``)."""
        return self.reason if self.rank is None else f"rank {self.rank}: {self.reason}"


@dataclass(frozen=True, slots=True)
class CaptureHint:
    """What the coordinator knows about a capture it armed (all optional; keyed by ``capture_id``).

    ``rank_list``: the config's ``rank_list`` when ``is_rank`` is true (only those ranks capture).
    ``steps``: ``warmup + active``; ``step_time_s``: measured step time; ``armed_unix_s``: arm time.
    ``deadline_unix_s`` overrides the computed deadline (e.g. ``CapturePlan.deadline_s``).
    """

    world_size: int | None = None
    rank_list: tuple[int, ...] | None = None
    steps: int | None = None
    step_time_s: float | None = None
    armed_unix_s: float | None = None
    deadline_unix_s: float | None = None


@dataclass(frozen=True, slots=True)
class RankDirState:
    """Parse state of one rank dir: ``appearing -> raw_complete -> parsing -> parsed | failed`` (or ``unknown``).

    ``reasons`` say why a rank is failed or still pending; ``notes`` are non-blocking remarks (no STEP_TIME,
    no communication data). ``steps``: STEP_TIME ids (None when the table is missing or not checked).
    ``t_order_s``: seconds from the name's local-time ``ts`` (only for ordering and gaps, not a unix time).
    """

    path: str
    kind: RankDirKind
    rank: int | None
    state: RankState
    reasons: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    steps: tuple[int, ...] | None = None
    capture_id: str | None = None
    world_size: int | None = None
    group_names: frozenset[str] = frozenset()
    t_order_s: float = 0.0
    dir_ts: str = ""
    dir_ts_unix_s: float | None = None
    has_metadata: bool = False
    groups: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    versions: tuple[str | None, str | None] = (None, None)  # (torch_npu, CANN) from profiler_info
    rank_list: tuple[int, ...] | None = None

    @property
    def healthy(self) -> bool:
        return self.state == "parsed"

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "rank": self.rank,
            "state": self.state,
            "reasons": list(self.reasons),
            "notes": list(self.notes),
            "steps": None if self.steps is None else list(self.steps),
        }


@dataclass(slots=True)
class BatchState:
    """Completeness of one batch (all expected ranks of one capture). See ``to_json`` for the wire shape.

    ``ranks``: rank -> the single dir holding it (for a rank claimed twice, the first; both are in
    ``problems``). ``steps``: step ids common to every healthy rank. ``deadline_unix_s``: when a batch still
    missing ranks turns ``incomplete``.
    """

    batch_id: str
    status: BatchStatus
    kind: RankDirKind
    expected_ranks: list[int]
    ranks: dict[int, RankDirState]
    missing_ranks: list[int]
    problems: list[Problem]
    steps: list[int]
    capture_id: str | None = None
    notes: list[str] = field(default_factory=list)
    prof_dir: str | None = None
    deadline_unix_s: float | None = None
    unassigned: list[RankDirState] = field(default_factory=list)

    def describe(self, limit: int = 8) -> str:
        """One line: the missing ranks (when any) and the first ``limit`` problems, each via
        :meth:`Problem.describe` (never ``missing ranks []`` or ``rank None``)."""
        parts = [f"missing ranks {rank_summary(self.missing_ranks)}"] if self.missing_ranks else []
        lines = summarise_problems(self.problems)
        parts += lines[:limit]
        if len(lines) > limit:
            parts.append(f"... {len(lines) - limit} more problems")
        return "; ".join(parts) or "no problem recorded"

    @property
    def rank_dirs(self) -> dict[int, str]:
        """rank -> rank dir path."""
        return {r: s.path for r, s in sorted(self.ranks.items())}

    def parallel_groups(self) -> dict[str, tuple[int, ...]]:
        """Communicators smaller than the world recorded by the batch's ranks (``parallel_group_info``): name ->
        global ranks, the union over the ranks (each rank lists only its own groups)."""
        out: dict[str, tuple[int, ...]] = {}
        for s in self.ranks.values():
            for name, members in s.groups.items():
                out.setdefault(name, members)
        return out

    def unusable_ranks(self) -> dict[int, str]:
        """rank -> why, for ranks whose dir finished but holds no usable device data (reasons ``NO_DEVICE_DATA``)."""
        return {r: "; ".join(s.reasons) for r, s in sorted(self.ranks.items())
                if s.state == "failed" and s.reasons and all(x.startswith(NO_DEVICE_DATA) for x in s.reasons)}

    def judgeable(self) -> bool:
        """True when the batch is complete, or when every expected rank is present and finished, the only
        problems are ranks without usable device data and at least two usable ranks remain: the analysis then
        judges the usable ranks and says which could not be judged (``partial``)."""
        if self.status == "complete":
            return True
        unusable = self.unusable_ranks()
        if self.status != "incomplete" or self.missing_ranks or not unusable:
            return False
        usable = [s for r, s in self.ranks.items() if r not in unusable]
        return (len(usable) >= 2 and all(s.state == "parsed" for s in usable) and not self.unassigned
                and all(p.rank in unusable for p in self.problems))

    def to_json(self) -> dict[str, Any]:
        """``{"batch_id","status","kind","expected_ranks","ranks","missing_ranks","problems","steps"}`` plus
        ``capture_id``, ``prof_dir``, ``deadline_unix_s``, ``rank_dirs`` {rank: path}, ``rank_states``
        {rank: state} and ``notes``. ``ranks`` lists the ranks found (sorted)."""
        return {
            "batch_id": self.batch_id,
            "status": self.status,
            "kind": self.kind,
            "expected_ranks": list(self.expected_ranks),
            "ranks": sorted(self.ranks),
            "missing_ranks": list(self.missing_ranks),
            "problems": [p.to_json() for p in self.problems],
            "steps": list(self.steps),
            "capture_id": self.capture_id,
            "prof_dir": self.prof_dir,
            "deadline_unix_s": self.deadline_unix_s,
            "rank_dirs": {str(r): p for r, p in self.rank_dirs.items()},
            "rank_states": {str(r): s.state for r, s in sorted(self.ranks.items())},
            "notes": list(self.notes),
        }


# --------------------------------------------------------------------------------------------------- per rank


def _db_reasons(db: DbObservation, required: Sequence[str], optional: frozenset[str]) -> list[str]:
    if db.error:
        if db.error.startswith((UNREADABLE, NOT_REGULAR)):  # not damage: the file may be fine (say so)
            return [f"{db.name}: {db.error}"]
        return [f"{db.name}: damaged ({db.error})"]
    if db.tables.issuperset(required):  # the common case, in one C-level test
        return []
    missing = [t for t in required if t not in db.tables and t not in optional]
    return [f"{db.name}: missing tables {', '.join(missing)}"] if missing else []


def _fallback_finished(obs: RankDirObservation, now_unix_s: float, settings: WatchSettings) -> str | None:
    """None when an older torch_npu's parse looks finished (docs/rank-dirs.md#completion), else what is still missing.
    A dir without both DBs whose outputs were quiet for ``quiet_period_s`` (no CANN export or journal left) is
    finished too: the health checks then name what it lacks (a text-only export, ``analysis.db`` missing)."""
    quiet = (obs.newest_output_mtime_s is not None
             and now_unix_s - obs.newest_output_mtime_s >= settings.quiet_period_s)
    if not obs.profiler_dbs or obs.analysis_db is None:
        if quiet and not obs.leftover_sqlite and not obs.journal_files:
            return None  # quiet for the whole period: what is missing stays missing (the health checks name it)
        return "no analyse.done and not both DBs yet"
    if obs.leftover_sqlite:
        return "no analyse.done; PROF_*/*/sqlite still present (CANN export running)"
    if obs.journal_files:
        return f"no analyse.done; journal files present: {', '.join(obs.journal_files)}"
    adb = obs.analysis_db
    if not adb.checked or adb.locked or adb.rows.get("StepTraceTime", 0) <= 0:
        return "no analyse.done; analysis.db StepTraceTime not written yet"
    if obs.newest_output_mtime_s is None or now_unix_s - obs.newest_output_mtime_s < settings.quiet_period_s:
        return f"no analyse.done; outputs changed within the last {settings.quiet_period_s:g} s"
    return None


def _identify_rank(obs: RankDirObservation) -> tuple[int | None, list[str]]:
    """The rank of a dir and any disagreement between profiler_info's file name and its rank_id (FC-01)."""
    name_rank = rank_from_profiler_info_name(obs.info_file) if obs.info_file else None
    info_rank = obs.info.rank_id if obs.info else None
    if name_rank is not None and info_rank is not None and info_rank != name_rank:
        return name_rank, [f"{obs.info_file} says rank_id {info_rank}"]
    rank = name_rank if name_rank is not None else info_rank
    if rank is not None and rank < 0:
        return None, ["profiler_info has no rank (rank_id -1); msprof-analyze would skip this dir"]
    return rank, []


@lru_cache(maxsize=1 << 16)
def _t_order_s(ts: str) -> float:
    """``RankDirState.t_order_s`` of a rank dir name's ``ts``: seconds from 1970-01-01 of its naive local time (an
    order, not a unix time). Memoised: every read of a rank dir needs it."""
    return (ts_naive_of(ts) - _EPOCH).total_seconds()


def evaluate_rank_dir(obs: RankDirObservation, *, now_unix_s: float, settings: WatchSettings) -> RankDirState:
    """Classify one rank dir. Pure; ``now_unix_s`` only serves the quiet-period fallback.

    Notes:
        appearing: no parseable ``profiler_info*.json`` or ``profiler_metadata.json`` yet (both are written at
        profiler stop, non-atomically: a half-written file is "appearing", not broken). raw_complete: both
        present, no output dir. parsing: output dir present without a finished parse; a re-parse deletes the
        output dir and so moves a rank back (docs/rank-dirs.md#ascend). parsed: ``analyse.done``
        (``trace.done`` for torch_pt), or for older torch_npu the fallback of docs/rank-dirs.md#completion, and
        every health check of docs/msprof-analyze.md#before-running passes; failed otherwise. The marker is
        written even when a parser failed (docs/rank-dirs.md#ascend), so health checks always run.
    """
    meta = obs.metadata
    common: dict[str, Any] = {
        "path": obs.path,
        "kind": obs.name.kind,
        "capture_id": meta.capture_id if meta else None,
        "group_names": meta.group_names if meta else frozenset(),
        "groups": meta.groups if meta else {},
        "rank_list": meta.rank_list if meta else None,
        "t_order_s": _t_order_s(obs.name.ts),
        "dir_ts": obs.name.ts,
        "dir_ts_unix_s": obs.dir_ts_unix_s,
        "has_metadata": meta is not None,
    }
    world = (meta.world_size if meta else None) or (obs.info.world_size if obs.info else None)
    common["world_size"] = world
    rank, id_reasons = _identify_rank(obs)
    if obs.info is not None:
        common["versions"] = (obs.info.torch_npu_version, obs.info.cann_version)
    if obs.unknown:
        return RankDirState(rank=rank, state="unknown", reasons=(f"unreadable now: {obs.unknown}",), **common)
    if obs.info is None:
        why = obs.info_error or "profiler_info not written yet"
        return RankDirState(rank=rank, state="appearing", reasons=(why,), **common)
    if meta is None:
        why = obs.metadata_error or "profiler_metadata.json not written yet"
        return RankDirState(rank=rank, state="appearing", reasons=(why,), **common)
    if id_reasons:
        return RankDirState(rank=rank, state="failed", reasons=tuple(id_reasons), **common)
    if obs.name.kind == "torch_pt":
        return _evaluate_torch(obs, rank, common)
    notes: list[str] = []
    exports = obs.info.export_types
    if exports and "db" not in exports:
        notes.append(f"export type {'/'.join(exports)}: no DB unless re-parsed with analyse(export_type=['db'])")
    if not obs.output_dir:
        return RankDirState(rank=rank, state="raw_complete", reasons=("not parsed yet",), notes=tuple(notes), **common)
    if not obs.marker:
        pending = _fallback_finished(obs, now_unix_s, settings)
        if pending is not None:
            return RankDirState(rank=rank, state="parsing", reasons=(pending,), notes=tuple(notes), **common)
        notes.append("no analyse.done (torch_npu before 26.0.0): finished by DB checks and quiet period")
    if any(db.locked or not db.checked for db in (*obs.profiler_dbs, obs.analysis_db) if db is not None):
        return RankDirState(rank=rank, state="parsing", reasons=("a DB is still locked by a writer",), **common)
    reasons, steps = _health(obs, rank, notes)
    state: RankState = "failed" if reasons else "parsed"
    return RankDirState(rank=rank, state=state, reasons=tuple(reasons), notes=tuple(notes), steps=steps, **common)


def _health(obs: RankDirObservation, rank: int | None, notes: list[str]) -> tuple[list[str], tuple[int, ...] | None]:
    """DB health of a finished ascend rank (docs/msprof-analyze.md#before-running, gotcha 7). Appends non-blocking remarks to ``notes``."""
    if not obs.profiler_dbs:
        if obs.output_files & TEXT_OUTPUTS:
            why = (f"{TEXT_EXPORT_REASON} (text-only export: no ascend_pytorch_profiler_{{rank}}.db; profwatch and the "
                   "recipes read DB exports only; re-parse offline: torch_npu.profiler.profiler.analyse(<rank dir>, "
                   "export_type=['db']))")
            return [why], None
        return ["parse finished but ASCEND_PROFILER_OUTPUT has no profiler DB"], None
    if len(obs.profiler_dbs) > 1:
        return [f"several profiler DBs: {', '.join(sorted(d.name for d in obs.profiler_dbs))}"], None
    db = obs.profiler_dbs[0]
    reasons: list[str] = []
    db_rank = rank_from_db_name(db.name)
    if db_rank == -1:
        reasons.append(f"{db.name} has no rank suffix (msprof-analyze would use rank -1)")
    elif db_rank is not None and rank is not None and db_rank != rank:
        reasons.append(f"{db.name} names rank {db_rank}, profiler_info says {rank}")
    level0 = obs.info is not None and (obs.info.profiler_level or "").lower() == "level0"
    optional = COMMUNICATION_TABLES if level0 else frozenset()
    reasons += _db_reasons(db, REQUIRED_PROFILER_TABLES, optional)
    if not db.error:
        rdm = db.rank_device_map
        if rdm is not None and len(rdm) != 1:
            reasons.append(f"RANK_DEVICE_MAP has {len(rdm)} rows, needs exactly 1")
        elif rdm is not None and rank is not None and rdm[0] != rank:
            reasons.append(f"RANK_DEVICE_MAP.rankId is {rdm[0]}, expected {rank} (profiler_info, DB name)")
        if db.step_ids is None:
            notes.append("no STEP_TIME: no step boundaries (recipes fall back to pseudo-step -1)")
        if ("COMMUNICATION_OP" in db.tables and db.rows.get("COMMUNICATION_OP", 1) == 0) or (
            level0 and "COMMUNICATION_OP" not in db.tables
        ):
            notes.append("no communication data (Level0 or single-device capture): communication recipes n/a")
    adb = obs.analysis_db
    if adb is None:
        reasons.append(f"{ANALYSIS_DB} missing (cluster_time_summary needs it)")
    else:
        reasons += _db_reasons(adb, REQUIRED_ANALYSIS_TABLES, optional)
    if not reasons:
        reasons += _device_data_reasons(obs, db)
    steps = None if db.error or db.step_ids is None else tuple(sorted(set(db.step_ids)))
    return reasons, steps


def _device_data_reasons(obs: RankDirObservation, db: DbObservation) -> list[str]:
    """A healthy DB that recorded no device work (empty TASK / COMPUTE_TASK_INFO), or every ``PROF_*/device_N``
    dir empty: nothing on this rank can be judged (``docs/verdicts.md``)."""
    empty = [t for t in ("TASK", "COMPUTE_TASK_INFO") if db.rows.get(t, 1) == 0]
    out = []
    if empty:
        out.append(f"{NO_DEVICE_DATA}: {db.name} has empty {' and '.join(empty)}")
    if obs.device_dirs and len(obs.empty_device_dirs) == len(obs.device_dirs):
        out.append(f"{NO_DEVICE_DATA}: {', '.join(obs.empty_device_dirs)} empty")
    return out


def _evaluate_torch(obs: RankDirObservation, rank: int | None, common: dict[str, Any]) -> RankDirState:
    """torch_pt: finished when ``trace.done`` exists (architecture.md rank dir formats); needs one Kineto trace."""
    if not obs.marker:
        state: RankState = "parsing" if obs.trace_files else "raw_complete"
        return RankDirState(rank=rank, state=state, reasons=("trace.done not written yet",), **common)
    if not obs.trace_files:
        return RankDirState(rank=rank, state="failed", reasons=("trace.done present but no *.pt.trace.json",), **common)
    if len(obs.trace_files) > 1:
        why = f"several Kineto traces: {', '.join(sorted(obs.trace_files))}"
        return RankDirState(rank=rank, state="failed", reasons=(why,), **common)
    return RankDirState(rank=rank, state="parsed", notes=("steps are read by the Kineto analyzer",), **common)


# --------------------------------------------------------------------------------------------------- grouping


def _split_duplicates(members: list[RankDirState], min_gap_s: float) -> list[list[RankDirState]]:
    """Split a time cluster that holds some rank twice at its largest gap, while that gap is >= ``min_gap_s``."""
    ranks = [m.rank for m in members if m.rank is not None]
    if len(ranks) == len(set(ranks)) or len(members) < 2:
        return [members]
    gaps = [(members[i + 1].t_order_s - members[i].t_order_s, i) for i in range(len(members) - 1)]
    gap, i = max(gaps)
    if gap < min_gap_s:
        return [members]
    return _split_duplicates(members[: i + 1], min_gap_s) + _split_duplicates(members[i + 1 :], min_gap_s)


def group_rank_dirs(states: Iterable[RankDirState], settings: WatchSettings) -> list[list[RankDirState]]:
    """Group rank dirs into batches; two captures are never mixed.

    Notes:
        1. Dirs whose metadata carries ``profwatch_capture_id`` group by that id (and kind), wherever they sit.
        2. Others (hand-armed captures) group by kind and HCCL group names (same job: docs/rank-dirs.md#ascend), then by
           time proximity of the name ``ts`` (all ranks start a capture at the same step): a gap over
           ``group_gap_s`` starts a new batch; a cluster holding one rank twice is split at its largest gap if
           that gap is at least ``split_min_gap_s`` (two back-to-back captures); otherwise it stays one batch
           and is reported invalid.
        3. Dirs without metadata yet (``appearing``) join the batch nearest in time (same kind) within
           ``group_gap_s``, else form their own.
    """
    by_capture: dict[tuple[str, str], list[RankDirState]] = {}
    by_job: dict[tuple[str, frozenset[str]], list[RankDirState]] = {}
    orphans: list[RankDirState] = []
    for s in states:
        if s.capture_id is not None:
            by_capture.setdefault((s.kind, s.capture_id), []).append(s)
        elif s.has_metadata:
            by_job.setdefault((s.kind, s.group_names), []).append(s)
        else:
            orphans.append(s)
    groups: list[list[RankDirState]] = [sorted(g, key=BY_TIME_PATH) for g in by_capture.values()]
    for members in by_job.values():
        members.sort(key=BY_TIME_PATH)
        cluster = [members[0]]
        for m in members[1:]:
            if m.t_order_s - cluster[-1].t_order_s > settings.group_gap_s:
                groups += _split_duplicates(cluster, settings.split_min_gap_s)
                cluster = []
            cluster.append(m)
        groups += _split_duplicates(cluster, settings.split_min_gap_s)
    for o in sorted(orphans, key=lambda m: (m.t_order_s, m.path)):
        best: list[RankDirState] | None = None
        best_gap = settings.group_gap_s
        for g in groups:
            if g[0].kind != o.kind:
                continue
            gap = min(abs(m.t_order_s - o.t_order_s) for m in g)
            if gap <= best_gap:
                best, best_gap = g, gap
        if best is None:
            groups.append([o])
        else:
            best.append(o)
    return groups


# --------------------------------------------------------------------------------------------------- batches


def compute_deadline(start_unix_s: float | None, hint: CaptureHint | None, settings: WatchSettings) -> float | None:
    """``start + steps * step_time_s * deadline_factor + parse_allowance_s`` (default window without hints)."""
    if hint is not None and hint.deadline_unix_s is not None:
        return hint.deadline_unix_s
    if hint is not None and hint.armed_unix_s is not None:
        start_unix_s = hint.armed_unix_s
    if start_unix_s is None:
        return None
    if hint is not None and hint.steps and hint.step_time_s:
        window = hint.steps * hint.step_time_s * settings.deadline_factor
    else:
        window = settings.default_capture_window_s
    return start_unix_s + window + settings.parse_allowance_s


def _batch_id(members: Sequence[RankDirState], kind: str) -> str:
    ts = min(members, key=lambda m: m.t_order_s).dir_ts
    groups = sorted(set().union(*(m.group_names for m in members)))
    suffix = "_" + hashlib.sha1("|".join(groups).encode()).hexdigest()[:8] if groups else ""
    return f"{ts}_{kind}{suffix}"


def _expected(members: Sequence[RankDirState], world_size: int | None, hint: CaptureHint | None,
              problems: list[Problem], notes: list[str]) -> list[int]:
    """Expected ranks: hint rank_list, else 0..W-1 with W from the caller, metadata, or telemetry (msprof 12.4)."""
    if hint is not None and hint.rank_list:
        return sorted(set(hint.rank_list))
    source = "given"
    if world_size is None:
        source = "claimed"
        sizes = Counter(filter(None, map(_WORLD_SIZE, members)))
        if len(sizes) > 1:
            shown = dict(sizes.most_common(8))
            more = f" and {len(sizes) - 8} more sizes" if len(sizes) > 8 else ""
            problems.append(Problem(None, None, f"ranks disagree on world size: {shown}{more}"))
        world_size = sizes.most_common(1)[0][0] if sizes else (hint.world_size if hint else None)
    if world_size is None:
        present = [m.rank for m in members if m.rank is not None]
        world_size = max(present) + 1 if present else 0
        if world_size > MAX_WORLD_SIZE:
            source = "assumed (from the highest rank id)"
        else:
            notes.append(f"world size unknown (no parallel_group_info/distributed_args); assumed {world_size}")
    if world_size > MAX_WORLD_SIZE:
        # a corrupt or hostile profiler_metadata.json / rank id must not make the scan list millions of ranks
        problems.append(Problem(None, None, f"{source} world size {world_size} is implausible (more than "
                                            f"{MAX_WORLD_SIZE} ranks); missing ranks not listed"))
        return sorted({m.rank for m in members if m.rank is not None})
    return list(range(world_size))


def evaluate_batch(members: Sequence[RankDirState], *, now_unix_s: float, settings: WatchSettings,
                   world_size: int | None = None, hint: CaptureHint | None = None,
                   by_path: Sequence[RankDirState] | None = None) -> BatchState:
    """Decide the status of one batch: ``members`` in ``group_rank_dirs``' order (:data:`BY_TIME_PATH`);
    ``by_path``: the same dirs sorted by path when the caller keeps them so (``RankDirTracker``), else sorted here.
    O(N) apart from that sort, in C-level passes over the members where possible (16,384 dirs: ~20 ms).

    Notes:
        complete: every expected rank has exactly one dir, parsed and healthy, and the healthy ranks share
        at least one step (only common steps are analysed, FC-12; ranks without STEP_TIME are noted, FC-02).
        invalid: a rank claimed by two dirs (both paths named), a rank outside the expected set, ranks
        disagreeing on world size, or no step common to all ranks (two captures mixed). parsing: some rank
        missing or unfinished before the deadline. incomplete: after the deadline, or when every present
        rank is finished but some failed; one problem per missing or broken rank.
    """
    kind = members[0].kind
    capture_id = next((m.capture_id for m in members if m.capture_id), None)
    problems: list[Problem] = []
    notes: list[str] = []
    expected = _expected(members, world_size, hint, problems, notes)
    invalid = bool(problems)
    ranks: dict[int, RankDirState] = {}
    unassigned: list[RankDirState] = []
    ordered = sorted(members, key=BY_PATH) if by_path is None else by_path
    claimed = list(map(_RANK, ordered))
    if None not in claimed and len(set(claimed)) == len(claimed):  # one dir per rank: the loop below, in C
        ranks = dict(zip(claimed, ordered, strict=True))
    else:
        for m in ordered:
            if m.rank is None:
                unassigned.append(m)
            elif m.rank in ranks:
                invalid = True
                problems.append(Problem(m.rank, m.path, f"rank {m.rank} claimed by two dirs: "
                                                        f"{ranks[m.rank].path} and {m.path}"))
            else:
                ranks[m.rank] = m
    outside = sorted(set(ranks).difference(expected))
    for r in outside:
        invalid = True
        problems.append(Problem(r, ranks[r].path, f"rank {r} outside expected ranks {_span(expected)}"))
    missing = list(filterfalse(ranks.__contains__, expected))
    starts = list(filter(_NOT_NONE, map(_DIR_TS_UNIX, members)))
    deadline = compute_deadline(min(starts) if starts else None, hint, settings)
    late = deadline is not None and now_unix_s >= deadline
    present = [s for s in map(ranks.get, expected) if s is not None]
    healthy = list(compress(present, map(_IS_PARSED, map(_STATE, present))))
    by_note: dict[str, list[int]] = {}
    for s in compress(healthy, map(_NOTES, healthy)):  # the healthy ranks with notes
        for n in s.notes:
            by_note.setdefault(n, []).append(s.rank if s.rank is not None else -1)
    notes += [f"rank{'s' if len(rs) > 1 else ''} {_span(rs)}: {n}" for n, rs in by_note.items()]
    notes += mixed_versions(ranks.values())
    steps = _common_steps(healthy, notes)
    if steps is None:
        invalid = True
        problems.append(Problem(None, None, "no step common to all ranks (different captures mixed?)"))
    pending = bool(missing) or not _PENDING.isdisjoint(map(_STATE, members))
    for r in missing:
        problems.append(Problem(r, None, MISSING_REASON + (" after deadline" if late else " (not seen yet)")))
    if any(n.startswith("world size unknown") for n in notes):
        # without a world size nobody can tell whether the highest ranks are missing: never call that complete
        problems.append(Problem(None, None, "world size unknown (no parallel_group_info, distributed_args or "
                                            "telemetry): cannot tell whether higher ranks are missing; give it "
                                            "(--world-size N)"))
    unfinished = list(compress(members, map(_NOT_PARSED, map(_STATE, members))))
    for m in sorted(unfinished, key=lambda s: (s.rank is None, s.rank or 0, s.path)):
        problems.append(Problem(m.rank, m.path, f"{m.state}: {'; '.join(m.reasons) or 'not finished'}"))
    if invalid:
        status: BatchStatus = "invalid"
    elif not pending and not problems and len(healthy) == len(expected) and expected:
        status = "complete"
    elif late or not pending:
        status = "incomplete"
    else:
        status = "parsing"
    prof_dir = _common_dir(list(map(BY_PATH, members)))
    return BatchState(batch_id=capture_id or _batch_id(members, kind), status=status, kind=kind,
                      expected_ranks=expected, ranks=ranks, missing_ranks=missing, problems=problems,
                      steps=list(steps or []), capture_id=capture_id, notes=notes, prof_dir=prof_dir,
                      deadline_unix_s=deadline, unassigned=unassigned)


def mixed_versions(states: Iterable[RankDirState]) -> list[str]:
    """One note per component (torch_npu, CANN) whose version differs between the rank dirs of a batch:
    ``"mixed torch_npu versions: 2.1.0.post17 on ranks 0-1, 2.6.0 on ranks 2-3 ..."``; [] when one version (or
    none) is seen. The formats of the rank data differ between versions (no ``analyse.done`` before torch_npu
    26.0.0, table sets): one job run with one version is what the recipes assume."""
    states = list(states)
    if len(set(map(_VERSIONS, states))) <= 1:
        return []  # one (torch_npu, CANN) pair on every dir: no component differs
    notes = []
    for i, what in enumerate(("torch_npu", "CANN")):
        by_version: dict[str, list[int]] = {}
        for st in states:
            if st.versions[i] and st.rank is not None:
                by_version.setdefault(st.versions[i] or "", []).append(st.rank)
        if len(by_version) > 1:
            parts = ", ".join(f"{v} on ranks {rank_ranges(rs)}" for v, rs in sorted(by_version.items()))
            notes.append(f"mixed {what} versions: {parts}; their data formats differ, compare with care "
                         "(capture again with one version)")
    return notes


def rank_ranges(ranks: Iterable[int], limit: int = 20) -> str:
    """``"0-3, 5, 7-1023"``: sorted ranks as contiguous ranges, at most ``limit`` ranges then ``"... and N more
    ranks"`` (the text of a batch missing a million ranks stays one short line)."""
    spans: list[list[int]] = []
    for r in sorted(set(ranks)):
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans[:limit])
    if len(spans) > limit:
        text += f", ... and {sum(b - a + 1 for a, b in spans[limit:])} more ranks"
    return text


def rank_summary(ranks: Sequence[int], short: int = 16) -> str:
    """``[4, 5, 6, 7]`` for up to ``short`` ranks, else ``"4-1023 (1020 ranks)"`` via :func:`rank_ranges`."""
    if len(ranks) <= short:
        return str(list(ranks))
    return f"{rank_ranges(ranks)} ({len(ranks)} ranks)"


def summarise_problems(problems: Sequence[Problem], short: int = 3, *, with_paths: bool = False) -> list[str]:
    """:meth:`Problem.describe` of each problem, except that more than ``short`` missing-rank problems (rank set,
    no path) with the same reason become one line ``ranks 4-1023: rank dir missing ...`` at the place of the
    first (for text output; ``to_json`` keeps every problem). ``with_paths``: append `` (path)`` when a problem
    names a rank dir."""
    by_reason: dict[str, list[int]] = {}
    for p in problems:
        if p.rank is not None and p.path is None and p.reason.startswith(MISSING_REASON):
            by_reason.setdefault(p.reason, []).append(p.rank)
    out: list[str] = []
    done: set[str] = set()
    for p in problems:
        ranks = by_reason.get(p.reason) if p.rank is not None and p.path is None else None
        if ranks is None or len(ranks) <= short:
            out.append(p.describe() + (f" ({p.path})" if with_paths and p.path else ""))
        elif p.reason not in done:
            done.add(p.reason)
            out.append(f"ranks {rank_ranges(ranks)}: {p.reason} ({len(ranks)} ranks)")
    return out


def _common_dir(paths: Sequence[str]) -> str:
    """``posixpath.commonpath`` of normalised absolute paths (as the walk gives them; the parent for one path), in one pass of string
    compares: the common string prefix of all paths is that of the smallest and largest one, cut back to a
    component boundary (16,384 rank dir paths: ~2 ms instead of ~40 ms)."""
    if len(paths) == 1:
        return posixpath.dirname(paths[0])
    lo, hi = min(paths), max(paths)
    if not (lo.startswith("/") and hi.startswith("/")):  # a relative path sorts first or last ("/" is no end)
        return posixpath.commonpath(paths)  # the general rule
    prefix = posixpath.commonprefix([lo, hi])
    n = len(prefix)
    if not all(len(p) == n or p[n] == "/" for p in paths):
        prefix = prefix[: prefix.rfind("/") + 1]
    return prefix.rstrip("/") or "/"


def _span(ranks: Sequence[int]) -> str:
    if len(ranks) == 1:
        return str(ranks[0])
    return f"{ranks[0]}..{ranks[-1]}" if ranks and list(ranks) == list(range(ranks[0], ranks[-1] + 1)) else str(ranks)


def _common_steps(healthy: Sequence[RankDirState], notes: list[str]) -> list[int] | None:
    """Steps on every healthy rank with STEP_TIME; [] when none has step boundaries; None when disjoint."""
    with_steps = [s for s in healthy if s.kind == "ascend_pt" and s.steps is not None]
    if not with_steps:
        if any(s.kind == "ascend_pt" for s in healthy):
            notes.append("no step boundaries: no rank has STEP_TIME")
        return []
    distinct = {s.steps or () for s in with_steps}  # most ranks hold the same steps: one set per distinct tuple
    common = set(next(iter(distinct)))
    union: set[int] = set()
    for steps in distinct:
        common &= set(steps)
        union |= set(steps)
    if not common and union:
        return None
    if common != union:
        partial = {s.rank: list(s.steps or ()) for s in with_steps if set(s.steps or ()) != common}
        notes.append(f"steps differ across ranks; analysing common steps {sorted(common)} only "
                     f"(ranks with other steps: {partial})")
    return sorted(common)


def _metadata_hint(members: Sequence[RankDirState], hint: CaptureHint | None) -> CaptureHint | None:
    """``hint`` with the ``rank_list`` the members' metadata carry (a targeted capture re-read offline), when
    every member that says one says the same; else ``hint`` unchanged."""
    lists = {m.rank_list for m in members if m.rank_list is not None}
    if len(lists) != 1:
        return hint
    ranks = next(iter(lists))
    return dataclasses.replace(hint, rank_list=ranks) if hint is not None else CaptureHint(rank_list=ranks)


def assess_batches(observations: Iterable[RankDirObservation], *, now_unix_s: float, settings: WatchSettings,
                   world_size: int | None = None, hints: Mapping[str, CaptureHint] | None = None
                   ) -> list[BatchState]:
    """Evaluate rank dirs, group them into batches and decide each batch's status (sorted by batch_id).

    ``world_size`` applies to every batch (the ``--world-size`` flag); ``hints`` are keyed by capture id. A
    targeted capture's ``rank_list`` comes from the hint, else from its rank dirs' metadata (``RANK_LIST_KEY``),
    so an offline scan expects only the ranks it captured.
    """
    states = [evaluate_rank_dir(o, now_unix_s=now_unix_s, settings=settings) for o in observations]
    return assess_states(states, now_unix_s=now_unix_s, settings=settings, world_size=world_size, hints=hints)


def assess_states(states: Iterable[RankDirState], *, now_unix_s: float, settings: WatchSettings,
                  world_size: int | None = None, hints: Mapping[str, CaptureHint] | None = None) -> list[BatchState]:
    """:func:`assess_batches` for rank dirs already evaluated (``evaluate_rank_dir``): group, then decide each
    batch (sorted by batch_id)."""
    out = []
    for members in group_rank_dirs(states, settings):
        cid = next((m.capture_id for m in members if m.capture_id), None)
        hint = (hints or {}).get(cid) if cid else None
        if hint is None or hint.rank_list is None:
            hint = _metadata_hint(members, hint)
        out.append(evaluate_batch(members, now_unix_s=now_unix_s, settings=settings, world_size=world_size,
                                  hint=hint))
    return sorted(out, key=lambda b: b.batch_id)
