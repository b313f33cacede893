"""Slow links: a pair of ranks whose link carries less bandwidth than its peers' links, as one verdict (pure).

Input: rows of msprof-analyze's ``ClusterCommunicationMatrix`` table (recipe ``communication_matrix_sum``, which
sums each rank's ``analysis.db`` ``CommAnalyzerMatrix`` and maps group-local ranks to global ranks through
``parallel_group_info``; Ascend/msprof-analyze ``cluster_analyse/recipes/communication_matrix_sum``). Columns used,
by name: ``step`` ("stepN"), ``hccl_op_name``, ``group_name``, ``src_rank``, ``dst_rank`` (global), ``transport_type``,
``transit_size`` (MB), ``transit_time`` (ms), ``bandwidth`` (GB/s). Per step the tool adds ``Total Op Info`` rows
(all ops of the step summed); when there are none, the op rows of the step are summed here the same way, leaving
out msprof's per-op statistics rows (names containing ``top``, ``middle``, ``bottom``) unless nothing else exists.

Why a link needs its own verdict: in a synchronous collective every member leaves together, so a slow link
lengthens every member's collective alike and the per-rank time summary cannot name it; only the per-pair
bandwidth can (``docs/verdicts.md``).
"""

from __future__ import annotations

import math
import re
from array import array
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from profwatch.core.messages import MAX_WORLD_SIZE
from profwatch.core.verdict.evidence import Impact, SlowLink
from profwatch.core.verdict.impact import HOURS_PER_DAY, link_saving_us
from profwatch.core.verdict.link_rows import LinkRows

if TYPE_CHECKING:
    import numpy as np
from profwatch.core.verdict.robust import median, upper_outliers_array

_DIGITS = re.compile(r"-?\d+")
_STAT_ROWS = ("top", "middle", "bottom")


class LinkSettings(BaseModel):
    """Thresholds of :func:`find_slow_links`."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    min_drop: float = Field(default=0.2, gt=0, lt=1, description=(
        "A link is named only when its pooled bandwidth is at least this fraction below its peers' median."))
    min_robust_z: float = Field(default=4.0, ge=0, description=(
        "...and its pooled log-bandwidth deficit is this many robust sigmas below its peers (noise of the group's "
        "other pairs, candidates excluded; see :func:`profwatch.core.verdict.robust.upper_outliers`)."))
    candidate_z: float = Field(default=3.0, ge=0, description=(
        "pairs above this z are left out of the link noise estimate (two slow links must not hide each other)"))
    min_peers: int = Field(default=3, ge=1, description=(
        "Pairs in the same group and transport needed to judge a link against its peers."))
    min_sigma: float = Field(default=0.01, gt=0, description=(
        "Floor of the log-bandwidth noise (1 %): identical synthetic bandwidths must not make 0.1 % significant."))
    rank_fold_links: int = Field(default=3, ge=2, description=(
        "A rank at the end of this many slow links (or of more than half of its links) is reported as a "
        "``communication`` suspect rank (its port or NIC), not as that many links."))


@dataclass(slots=True)
class LinkSample:
    """One directed pair in one step: summed size (MB) and time (ms) of every op of the step."""

    size_mb: float = 0.0
    time_ms: float = 0.0
    transport: str = ""
    max_one_way_ms: float = 0.0


@dataclass(slots=True)
class LinkFindings:
    """Result of :func:`find_slow_links`: ``links`` (slow pairs), ``folded_ranks`` (rank -> how many of its links
    are slow, when that makes the rank itself the suspect, with ``saving_us_per_step``: the largest saving of
    its slow links, since a ring waits for its slowest link), ``pairs_judged`` and ``notes``."""

    links: list[SlowLink] = field(default_factory=list)
    folded_ranks: dict[int, dict[str, Any]] = field(default_factory=dict)
    pairs_judged: int = 0
    notes: list[str] = field(default_factory=list)


def _num(value: Any) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return math.nan
    return x if math.isfinite(x) else math.nan


def _rank_num(value: Any) -> float:
    """A row's rank id as a number, NaN when it is none: not a finite whole number (``2.5`` was cut to rank 2 and
    its rows summed into that rank's pairs), or beyond ``MAX_WORLD_SIZE`` either way (no job has such a rank; its
    pair codes would overflow int64)."""
    x = _num(value)
    return x if -MAX_WORLD_SIZE < x < MAX_WORLD_SIZE and x.is_integer() else math.nan


def parse_matrix_rows(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str, int, int], LinkSample]:
    """``ClusterCommunicationMatrix`` rows -> ``(group, step, src, dst) -> LinkSample`` (one per step and pair).

    Uses ``Total Op Info`` rows when a (group, step) has them, else sums its op rows (statistics rows only if
    there is nothing else). Self pairs, rows without a parseable step/rank and rows with no time are skipped.
    """
    kinds: dict[tuple[str, str], dict[str, list[Mapping[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        step_m = _DIGITS.search(str(row.get("step", "")))
        src, dst = _rank_num(row.get("src_rank")), _rank_num(row.get("dst_rank"))
        if step_m is None or math.isnan(src) or math.isnan(dst) or src == dst:
            continue
        name = str(row.get("hccl_op_name", "") or "")
        kind = ("total", "op", "stat")[_kind(name)]
        kinds[(str(row.get("group_name", "")), step_m.group())][kind].append(row)
    out: dict[tuple[str, str, int, int], LinkSample] = {}
    for (group, step), by_kind in kinds.items():
        use = by_kind.get("total") or by_kind.get("op") or by_kind.get("stat") or []
        for row in use:
            t, size = _num(row.get("transit_time")), _num(row.get("transit_size"))
            if math.isnan(t) or t <= 0 or math.isnan(size):
                continue
            key = (group, step, int(_num(row["src_rank"])), int(_num(row["dst_rank"])))
            sample = out.setdefault(key, LinkSample(transport=str(row.get("transport_type", "") or "")))
            sample.size_mb += size
            sample.time_ms += t
    return out


def find_slow_links(rows: Iterable[Mapping[str, Any]], *, settings: LinkSettings | None = None,
                    world_size: int, step_time_us: float | None = None) -> LinkFindings:
    """Name the links whose bandwidth stands out below their peers' over the captured steps.

    Args:
        rows: ``ClusterCommunicationMatrix`` rows (see the module docstring): a :class:`LinkRows` (what the
            evidence holds) is read by column, any other iterable of mappings row by row; the findings are the same.
        settings: thresholds (defaults when ``None``).
        world_size: accelerators of the job (for accelerator-hours per day).
        step_time_us: mean measured step time (for the impact as % of a step); ``None`` leaves % and hours 0.

    Returns:
        :class:`LinkFindings`; links ordered by their saving per step, largest first.

    Notes:
        Per undirected pair and step, bandwidth = (MB both ways) / (ms both ways) (GB/s). Per group and
        transport type (HCCS, RDMA, ... are never compared with each other) and step, ``d = ln(bw / median bw of
        the group's pairs)``. A pair's pooled deficit is ``-d`` pooled over steps without its single worst step
        (:func:`profwatch.core.verdict.robust.trimmed_pool`), so one congested step does not make a verdict. It is tested
        against the group's other pairs with :func:`~profwatch.core.verdict.robust.upper_outliers` (candidates excluded
        from the noise; floor ``max(min_sigma, within-pair step noise / sqrt(steps - 1))``). Named when
        ``z >= min_robust_z`` and the pooled bandwidth is at least ``min_drop`` below the peers' median.
        Groups with fewer than ``min_peers + 1`` pairs are not judged (no peers to compare with). A rank at the
        end of ``rank_fold_links`` or more slow links, or of more than half of its links, is its own problem
        (a slow port or NIC): it is returned in ``folded_ranks`` instead of as links.
    """
    import numpy as np  # lazily: importing the settings (every command) must not load numpy
    settings = settings or LinkSettings()
    found = LinkFindings()
    table = _pair_table(rows)
    if table.unread:
        found.notes.append(f"{table.unread} matrix row(s) without a step or a rank id (a whole number within "
                           f"+-{MAX_WORLD_SIZE}) left out")
    groups: dict[tuple[str, str], np.ndarray] = {}  # entries of the group and transport, in (a, b, step) order
    for gi, ti in sorted({(int(g), int(t)) for g, t in zip(table.g, table.tr, strict=True)},
                         key=lambda k: (table.groups[k[0]], table.transports[k[1]])):
        groups[(table.groups[gi], table.transports[ti])] = np.flatnonzero((table.g == gi) & (table.tr == ti))
    links_of: dict[int, int] = defaultdict(int)
    members_of: dict[tuple[str, str], np.ndarray] = {}
    for key, idx in groups.items():
        pairs = np.stack(_unique_rows([table.a[idx], table.b[idx]])[0], axis=1)
        members_of[key] = pairs
        for r, n in zip(*np.unique(pairs.ravel(), return_counts=True), strict=True):
            links_of[int(r)] += int(n)
    slow: list[tuple[float, SlowLink]] = []
    for (group, transport), idx in groups.items():
        pairs = members_of[(group, transport)]
        if len(pairs) < settings.min_peers + 1:
            found.notes.append(f"group {group} {transport}: {len(pairs)} link(s), too few to compare")
            continue
        found.pairs_judged += len(pairs)
        series = _group_series(table, idx, pairs, settings)
        if series is not None:
            slow += _slow_links_of_group(series, group, transport, pairs, settings, world_size, step_time_us)
        del series
    folded = _fold_ranks(slow, links_of, settings, found)
    found.links = [lk for _, lk in sorted(slow, key=lambda t: -t[0]) if not set(lk.ranks) & folded]
    return found


@dataclass(slots=True)
class _PairTable:
    """Undirected pairs per step as arrays, one element per (group, transport, pair, step): codes into ``groups``,
    ``transports``, ``steps`` (names); ranks ``a < b``; MB and ms of both directions summed; ``one_way``: the slower
    direction's ms. About 60 bytes per element (a list of dicts and per-pair objects took ~700 per directed pair)."""

    groups: list[str]
    transports: list[str]
    steps: list[str]
    g: np.ndarray
    tr: np.ndarray
    s: np.ndarray
    a: np.ndarray
    b: np.ndarray
    size: np.ndarray
    time: np.ndarray
    one_way: np.ndarray
    unread: int = 0  # rows without a step or a rank id (_Columns.unread)


def _row_columns(rows: Iterable[Mapping[str, Any]]) -> _Columns:
    """Rows given as mappings, read one by one into the columns of :func:`_pair_table` (rows are never held)."""
    import numpy as np  # lazily: importing the settings (every command) must not load numpy
    codes: tuple[dict[str, int], dict[str, int], dict[str, int]] = ({}, {}, {})
    cols = {k: array("q") for k in ("g", "s", "kind", "tr", "src", "dst")}
    vals = {k: array("d") for k in ("time", "size")}
    unread = 0
    for row in rows:
        step_m = _DIGITS.search(str(row.get("step", "")))
        src, dst = _rank_num(row.get("src_rank")), _rank_num(row.get("dst_rank"))
        if step_m is None or math.isnan(src) or math.isnan(dst) or src == dst:
            unread += step_m is None or math.isnan(src) or math.isnan(dst)
            continue
        for col, table, name in (("g", codes[0], str(row.get("group_name", ""))), ("s", codes[1], step_m.group()),
                                 ("tr", codes[2], str(row.get("transport_type", "") or ""))):
            cols[col].append(table.setdefault(name, len(table)))
        cols["kind"].append(_kind(row.get("hccl_op_name", "")))
        cols["src"].append(int(src))
        cols["dst"].append(int(dst))
        vals["time"].append(_num(row.get("transit_time")))
        vals["size"].append(_num(row.get("transit_size")))
    c = {k: np.frombuffer(v, dtype=np.int64) if len(v) else np.zeros(0, np.int64) for k, v in cols.items()}
    t = np.frombuffer(vals["time"], dtype=np.float64) if len(vals["time"]) else np.zeros(0)
    size = np.frombuffer(vals["size"], dtype=np.float64) if len(vals["size"]) else np.zeros(0)
    names = [sorted(d, key=d.__getitem__) for d in codes]
    return _Columns(names[0], names[1], names[2], c["g"], c["s"], c["kind"], c["tr"], c["src"], c["dst"], t, size,
                    unread)


def _kind(op_name: Any) -> int:
    """0: a ``Total Op Info`` row, 2: a statistics row (``top``/``middle``/``bottom``), 1: an op row."""
    low = str(op_name or "").lower()
    return 0 if low == "total op info" else 2 if any(t in low for t in _STAT_ROWS) else 1


def _table_columns(rows: LinkRows) -> _Columns:
    """The columns of :func:`_pair_table` from rows already held as columns: each distinct value is read once
    (as :func:`_row_columns` reads it), the rows by array lookups (4-byte codes); the same rows, in order."""
    import numpy as np  # lazily: importing the settings (every command) must not load numpy
    n = len(rows)

    def coded(name: str, read: Callable[[Any], Any], default: Any) -> tuple[np.ndarray, list[Any]]:
        col = rows.coded.get(name)
        if col is None or not n:
            return np.zeros(n, np.int32), [read(default)]
        return np.frombuffer(col.codes, dtype=np.int32), [read(v) for v in col.values]

    def names_of(values: list[Any]) -> tuple[np.ndarray, list[str]]:
        """Per value the code of its name (None: no name -> -1), the names in first-seen order of the values."""
        index: dict[str, int] = {}
        remap = np.array([-1 if v is None else index.setdefault(v, len(index)) for v in values], dtype=np.int32)
        return remap, list(index)

    def step_name(v: Any) -> str | None:
        m = _DIGITS.search(str(v))
        return None if m is None else m.group()

    s_codes, s_values = coded("step", step_name, "")
    s_map, s_names = names_of(s_values)
    src_codes, src_values = coded("src_rank", _rank_num, None)
    dst_codes, dst_values = coded("dst_rank", _rank_num, None)
    src_map, dst_map = np.array(src_values, dtype=np.float64), np.array(dst_values, dtype=np.float64)
    src, dst = src_map[src_codes], dst_map[dst_codes]
    readable = (s_map[s_codes] >= 0) & ~np.isnan(src) & ~np.isnan(dst)
    keep = np.flatnonzero(readable & (src != dst))
    unread = int(n - np.count_nonzero(readable))
    del readable
    src, dst = _take(src, keep).astype(np.int64), _take(dst, keep).astype(np.int64)

    def kept(name: str, read: Callable[[Any], Any], default: Any) -> tuple[np.ndarray, list[str]]:
        codes, values = coded(name, read, default)
        remap, names = names_of(values)
        return remap[_take(codes, keep)], names

    g, g_names = kept("group_name", str, "")
    tr, tr_names = kept("transport_type", lambda v: str(v or ""), "")
    k_codes, k_values = coded("hccl_op_name", _kind, "")
    kind = np.array(k_values, dtype=np.int32)[_take(k_codes, keep)]

    def number(name: str) -> np.ndarray:
        col = rows.numbers.get(name)
        return _take(np.frombuffer(col, dtype=np.float64), keep) if col is not None and len(col) else \
            np.full(len(keep), np.nan)

    return _Columns(g_names, s_names, tr_names, g, s_map[_take(s_codes, keep)], kind, tr, src, dst, number("transit_time"),
                    number("transit_size"), unread)


def _take(arr: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """``arr[keep]`` (``keep``: sorted distinct indices), ``arr`` itself when ``keep`` is every index (no copy)."""
    return arr if len(keep) == len(arr) else arr[keep]


def _unique_rows(cols: list[np.ndarray]) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """``np.unique(np.stack(cols, axis=1), axis=0, return_index=True, return_inverse=True)`` as ``(the unique rows'
    columns, first index, inverse)`` without the stacked copy: the integer columns as one mixed-radix int64 key,
    which sorts as the rows do (lexicographically); the stacked rows when the key would not fit in 62 bits."""
    import numpy as np  # lazily: importing the settings (every command) must not load numpy
    n = len(cols[0])
    if not n:
        return [c[:0] for c in cols], np.zeros(0, np.int64), np.zeros(0, np.int64)
    lows = [int(c.min()) for c in cols]
    spans = [int(c.max()) - lo + 1 for c, lo in zip(cols, lows, strict=True)]
    if math.prod(spans) >= 2**62:
        u, first, inv = np.unique(np.stack(cols, axis=1), axis=0, return_index=True, return_inverse=True)
        return [u[:, k] for k in range(len(cols))], first, inv.ravel()
    key = np.zeros(n, np.int64)
    for c, lo, span in zip(cols, lows, spans, strict=True):
        key *= span
        key += c
        key -= lo
    _, first, inv = np.unique(key, return_index=True, return_inverse=True)
    del key
    return [c[first] for c in cols], first, inv.ravel()


@dataclass(slots=True)
class _Columns:
    """The rows :func:`_pair_table` reads (self pairs and rows without a step or ranks left out), one element per
    row in row order: codes into ``groups``, ``steps`` and ``transports``; ``kind`` (:func:`_kind`); ranks; ms; MB;
    ``unread``: rows left out without a step or a rank id (:func:`_rank_num`), self pairs not counted."""

    groups: list[str]
    steps: list[str]
    transports: list[str]
    g: np.ndarray
    s: np.ndarray
    kind: np.ndarray
    tr: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    time: np.ndarray
    size: np.ndarray
    unread: int = 0


PAIR_CHUNK_ROWS = 262_144
"""Rows summed into pairs at a time by :func:`_pair_table` (a chunk: one step, a range of the pairs' lower rank):
the sort behind each chunk's sums takes about 100 bytes per row, so a million-pair step is summed in ~25 MB pieces
instead of one ~250 MB sort of every row (``bench/bench_links_memory.py``)."""


def _pair_table(rows: Iterable[Mapping[str, Any]]) -> _PairTable:
    """:func:`parse_matrix_rows`, then both directions of each pair summed, into arrays (memory linear in the rows'
    pairs, not in dicts: :class:`LinkRows` are read by column, other rows one by one and never held). Summed in
    chunks of at most about :data:`PAIR_CHUNK_ROWS` rows (one step and a range of lower ranks: both directions of a
    pair fall in the same chunk), so the sort's scratch memory is bounded; the sums are those of one pass."""
    import numpy as np  # lazily: importing the settings (every command) must not load numpy
    cols = _table_columns(rows) if isinstance(rows, LinkRows) else _row_columns(rows)
    names = [cols.groups, cols.steps, cols.transports]
    # per (group, step): Total Op Info rows, else op rows, else statistics rows (parse_matrix_rows' choice)
    gs = cols.g.astype(np.int64) * max(len(names[1]), 1) + cols.s
    best = np.full(max(len(names[0]) * len(names[1]), 1), 3, dtype=np.int64)
    np.minimum.at(best, gs, cols.kind)
    keep = np.flatnonzero((cols.kind == best[gs]) & ~np.isnan(cols.time) & (cols.time > 0) & ~np.isnan(cols.size))
    del gs, best
    empty = np.zeros(0, np.int64)
    if not len(keep):
        return _PairTable(names[0], names[2], names[1], empty, empty, empty, empty, empty, np.zeros(0), np.zeros(0),
                          np.zeros(0), cols.unread)
    lo = np.minimum(cols.src[keep], cols.dst[keep])
    lo -= lo.min()  # chunk numbers from 0 (a matrix row may name a negative rank: np.bincount refuses those)
    blocks = max(1, math.ceil(len(keep) / PAIR_CHUNK_ROWS))
    width = max(1, math.ceil((int(lo.max()) + 1) / blocks))
    chunk = cols.s[keep].astype(np.int64) * blocks + lo // width
    del lo
    parts: list[tuple[np.ndarray, ...]] = []
    for k in np.flatnonzero(np.bincount(chunk)).tolist():
        parts.append(_pair_sums(cols, keep[chunk == k]))
    unread = cols.unread
    del chunk, keep, cols
    out: list[np.ndarray] = []
    for i in range(8):  # column by column: one column's copy at a time
        out.append(np.concatenate([p[i] for p in parts]))
        parts = [(*p[:i], empty, *p[i + 1:]) for p in parts]
    g, tr, st, a, b, size, tm, one_way = out
    return _PairTable(names[0], names[2], names[1], g, tr, st, a, b, size, tm, one_way, unread)


def _pair_sums(cols: _Columns, rows: np.ndarray) -> tuple[np.ndarray, ...]:
    """One chunk of :func:`_pair_table`: the rows ``rows`` of ``cols`` (every row of each pair and step they
    hold) summed per directed pair (in row order; transport of the pair's first row), then both directions per
    undirected pair: ``(group, transport, step, a, b, MB, ms, slower direction's ms)``."""
    import numpy as np  # lazily: importing the settings (every command) must not load numpy
    (dg, ds, dsrc, ddst), first, inv = _unique_rows([cols.g[rows], cols.s[rows], cols.src[rows], cols.dst[rows]])
    d_time = np.bincount(inv, weights=cols.time[rows], minlength=len(dg))
    d_size = np.bincount(inv, weights=cols.size[rows], minlength=len(dg))
    d_tr = cols.tr[rows][first]
    del inv, first
    lo, hi = np.minimum(dsrc, ddst).astype(np.int64), np.maximum(dsrc, ddst).astype(np.int64)
    (ug, utr, ua, ub, us), _, uinv = _unique_rows([dg, d_tr, lo, hi, ds])
    one_way = np.zeros(len(ug))
    np.maximum.at(one_way, uinv, d_time)
    return (ug, utr, us, ua, ub, np.bincount(uinv, weights=d_size, minlength=len(ug)),
            np.bincount(uinv, weights=d_time, minlength=len(ug)), one_way)


@dataclass(slots=True)
class _GroupSeries:
    """Per pair (index into the group's members), over the steps with enough peers, in step order: the bandwidth
    deficit ``-ln(bw / median bw)``, the bandwidth (GB/s), its slower direction's transit time and the peers'
    median (µs); ``start[i]:start[i + 1]`` are pair ``i``'s elements of each array (empty: the pair has none)."""

    start: np.ndarray
    deficit: np.ndarray
    bw: np.ndarray
    transit: np.ndarray
    peer_transit: np.ndarray

    def of(self, arr: np.ndarray, i: int) -> list[float]:
        """Pair ``i``'s values of ``arr`` (one of the series) as a list, in step order."""
        return arr[self.start[i]:self.start[i + 1]].tolist()

    def pairs(self) -> list[int]:
        """The pairs with at least one step."""
        import numpy as np  # lazily: importing the settings (every command) must not load numpy
        return np.flatnonzero(np.diff(self.start) > 0).tolist()


def _group_series(table: _PairTable, idx: np.ndarray, pairs: np.ndarray, settings: LinkSettings
                  ) -> _GroupSeries | None:
    """The series of one group and transport's pairs (``pairs[i]``: (a, b)) from ``table``'s elements ``idx``;
    None without any step that has ``min_peers + 1`` pairs with a positive bandwidth. Array operations per step
    (the median and ``ln`` of every pair's bandwidth), no Python float per pair."""
    import numpy as np  # lazily: importing the settings (every command) must not load numpy
    width = int(pairs[:, 1].max()) + 1
    member = np.searchsorted(pairs[:, 0] * width + pairs[:, 1], table.a[idx] * width + table.b[idx])
    steps_here = table.s[idx]
    parts: list[tuple[np.ndarray, ...]] = []
    for code in sorted(np.unique(steps_here).tolist(), key=lambda k: table.steps[k]):
        at = steps_here == code
        here, who = idx[at], member[at]
        tm, sz = table.time[here], table.size[here]
        ok = tm > 0
        v = sz[ok] / tm[ok]
        pos = v > 0
        v, who, ow = v[pos], who[ok][pos], table.one_way[here][ok][pos]
        if len(v) < settings.min_peers + 1:
            continue
        med = float(np.median(v))
        med_t = float(np.median(ow))
        parts.append((who, -np.log(v / med), v, ow * 1e3, np.full(len(v), med_t * 1e3)))
    del member, steps_here
    if not parts:
        return None
    who = np.concatenate([p[0] for p in parts])
    by_pair = np.argsort(who, kind="stable")  # each pair's values in step order
    start = np.searchsorted(who[by_pair], np.arange(len(pairs) + 1))
    del who
    cols: list[np.ndarray] = []
    for k in range(1, 5):  # column by column, each step's part dropped once copied: one column's copy at a time
        cols.append(np.concatenate([p[k] for p in parts])[by_pair])
        parts = [(*p[:k], p[k][:0], *p[k + 1:]) for p in parts]
    return _GroupSeries(start, *cols)


def _per_pair(series: _GroupSeries, have: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per pair of ``have`` (pairs with at least one step): its steps, its pooled deficit
    (:func:`~profwatch.core.verdict.robust.trimmed_pool` of its deficits: the mean without the largest from 3
    steps, the smaller of 2, the one) and its mean bandwidth (GB/s), as arrays in ``have``'s order."""
    import numpy as np  # lazily: importing the settings (every command) must not load numpy
    first = series.start[have]
    n = series.start[have + 1] - first
    total = np.add.reduceat(series.deficit, first) if len(have) else np.zeros(0)
    worst = np.maximum.reduceat(series.deficit, first) if len(have) else np.zeros(0)
    best = np.minimum.reduceat(series.deficit, first) if len(have) else np.zeros(0)
    pooled = np.where(n == 1, total, np.where(n == 2, best, (total - worst) / np.maximum(n - 1, 1)))
    mean_bw = (np.add.reduceat(series.bw, first) if len(have) else np.zeros(0)) / n
    return n, pooled, mean_bw


def _within_sigma(series: _GroupSeries, have: np.ndarray, n: np.ndarray) -> float:
    """:func:`~profwatch.core.verdict.robust.pooled_within_sigma` of the pairs' deficit series, over arrays."""
    import numpy as np  # lazily: importing the settings (every command) must not load numpy
    many = have[n >= 2]
    dof = int((n[n >= 2] - 1).sum())
    if not dof:
        return 0.0
    counts = series.start[many + 1] - series.start[many]
    x = series.deficit[_elements(series, many)]
    mu = np.repeat(np.add.reduceat(x, np.cumsum(counts) - counts) / counts, counts)
    return math.sqrt(float(((x - mu) ** 2).sum()) / dof)


def _elements(series: _GroupSeries, pairs: np.ndarray) -> np.ndarray:
    """Indices into the series' arrays of the elements of ``pairs`` (each with at least one step), pair by pair in
    ``pairs``' order, each pair's in step order."""
    import numpy as np  # lazily: importing the settings (every command) must not load numpy
    first = series.start[pairs]
    counts = series.start[pairs + 1] - first
    offsets = np.cumsum(counts) - counts
    return np.repeat(first - offsets, counts) + np.arange(int(counts.sum()))


def _slow_links_of_group(series: _GroupSeries, group: str, transport: str, members: np.ndarray,
                         settings: LinkSettings, world_size: int,
                         step_time_us: float | None) -> list[tuple[float, SlowLink]]:
    """The group's pairs that pass the test (``find_slow_links``' Notes), each with its saving (µs per step).
    ``members[i]``: pair ``i``'s ranks (a, b). The test runs over arrays (one element per pair); Python objects
    are made only for the pairs named."""
    import numpy as np  # lazily: importing the settings (every command) must not load numpy
    have = np.asarray(series.pairs(), dtype=np.int64)
    n, pooled, own_bw = _per_pair(series, have)
    within = _within_sigma(series, have, n)
    n_steps = int(np.diff(series.start).max())
    floor = max(settings.min_sigma, within / math.sqrt(max(1, n_steps - 1)))
    test = upper_outliers_array(pooled, candidate_z=settings.candidate_z, sigma_floor=floor)
    peers = have[~test.candidates] if not test.candidates.all() else have
    peer_bw = float(np.median(series.bw[_elements(series, peers)]))
    ratio = own_bw / peer_bw if peer_bw > 0 else np.ones(len(have))
    named = np.flatnonzero((test.z >= settings.min_robust_z) & (ratio <= 1.0 - settings.min_drop))
    slow: list[tuple[float, SlowLink]] = []
    for j in named.tolist():
        i, z, bw, r = int(have[j]), float(test.z[j]), float(own_bw[j]), float(ratio[j])
        saving = link_saving_us(series.of(series.transit, i), series.of(series.peer_transit, i))
        frac = saving / step_time_us if step_time_us else 0.0
        impact = Impact(saving / 1e6, 100.0 * frac, frac * world_size * HOURS_PER_DAY)
        a, b = int(members[i][0]), int(members[i][1])
        steps = int(n[j])
        link = SlowLink(ranks=(a, b), group=group, bandwidth_gbps=bw, peer_median_gbps=peer_bw,
                        transport=transport, impact=impact.to_json(), evidence={
                            "z": round(z, 3), "steps": steps, "noise_sigma_log": round(test.sigma, 5),
                            "strength": "strong" if steps >= 3 else "weak",
                            "summary": f"link {a}<->{b} ({transport or 'link'}, group {group}): "
                                       f"{bw:.2f} GB/s vs peers {peer_bw:.2f} GB/s "
                                       f"({100 * r:.0f}%), {steps} steps"})
        slow.append((saving, link))
    return slow


def _fold_ranks(slow: list[tuple[float, SlowLink]], links_of: Mapping[int, int], settings: LinkSettings,
                found: LinkFindings) -> set[int]:
    """Ranks at the end of ``rank_fold_links`` or more slow links, or of more than half of their links: recorded
    in ``found.folded_ranks`` (the rank is the problem, not its links) and returned."""
    per_rank: dict[int, list[SlowLink]] = defaultdict(list)
    for _, link in slow:
        for r in link.ranks:
            per_rank[r].append(link)
    folded = {r for r, ls in per_rank.items()
              if len(ls) >= settings.rank_fold_links or (len(ls) > 1 and len(ls) > links_of[r] / 2)}
    for r in sorted(folded):
        ls = per_rank[r]
        found.folded_ranks[r] = {"slow_links": len(ls), "links": links_of[r],
                                 "saving_us_per_step": max((lk.impact or {}).get("saving_s_per_step", 0.0)
                                                           for lk in ls) * 1e6,
                                 "median_ratio": round(median(lk.bandwidth_gbps / lk.peer_median_gbps
                                                              for lk in ls if lk.peer_median_gbps > 0), 4)}
    return folded
