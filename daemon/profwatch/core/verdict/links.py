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
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from profwatch.core.verdict.evidence import Impact, SlowLink
from profwatch.core.verdict.impact import HOURS_PER_DAY, link_saving_us
from profwatch.core.verdict.robust import median, pooled_within_sigma, trimmed_pool, upper_outliers

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


def parse_matrix_rows(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str, int, int], LinkSample]:
    """``ClusterCommunicationMatrix`` rows -> ``(group, step, src, dst) -> LinkSample`` (one per step and pair).

    Uses ``Total Op Info`` rows when a (group, step) has them, else sums its op rows (statistics rows only if
    there is nothing else). Self pairs, rows without a parseable step/rank and rows with no time are skipped.
    """
    kinds: dict[tuple[str, str], dict[str, list[Mapping[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        step_m = _DIGITS.search(str(row.get("step", "")))
        src, dst = _num(row.get("src_rank")), _num(row.get("dst_rank"))
        if step_m is None or math.isnan(src) or math.isnan(dst) or src == dst:
            continue
        name = str(row.get("hccl_op_name", "") or "")
        low = name.lower()
        kind = "total" if low == "total op info" else "stat" if any(t in low for t in _STAT_ROWS) else "op"
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


def _pairs(samples: Mapping[tuple[str, str, int, int], LinkSample]
           ) -> dict[tuple[str, str, tuple[int, int]], dict[str, LinkSample]]:
    """Undirected pairs: ``(group, transport, (a, b)) -> step -> both directions summed``."""
    out: dict[tuple[str, str, tuple[int, int]], dict[str, LinkSample]] = defaultdict(dict)
    for (group, step, src, dst), s in samples.items():
        key = (group, s.transport, (min(src, dst), max(src, dst)))
        cur = out[key].get(step)
        if cur is None:
            out[key][step] = LinkSample(s.size_mb, s.time_ms, s.transport, s.time_ms)
        else:
            cur.size_mb += s.size_mb
            cur.time_ms += s.time_ms
            cur.max_one_way_ms = max(cur.max_one_way_ms, s.time_ms)
    return out


def find_slow_links(rows: Iterable[Mapping[str, Any]], *, settings: LinkSettings | None = None,
                    world_size: int, step_time_us: float | None = None) -> LinkFindings:
    """Name the links whose bandwidth stands out below their peers' over the captured steps.

    Args:
        rows: ``ClusterCommunicationMatrix`` rows (see the module docstring).
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
    settings = settings or LinkSettings()
    found = LinkFindings()
    pairs = _pairs(parse_matrix_rows(rows))
    groups: dict[tuple[str, str], list[tuple[int, int]]] = defaultdict(list)
    for group, transport, pair in pairs:
        groups[(group, transport)].append(pair)
    links_of: dict[int, int] = defaultdict(int)
    for members in groups.values():
        for a, b in members:
            links_of[a] += 1
            links_of[b] += 1
    slow: list[tuple[float, SlowLink]] = []
    for (group, transport), members in sorted(groups.items()):
        if len(members) < settings.min_peers + 1:
            found.notes.append(f"group {group} {transport}: {len(members)} link(s), too few to compare")
            continue
        found.pairs_judged += len(members)
        series = _group_series([pairs[(group, transport, p)] for p in members], settings)
        if series is not None:
            slow += _slow_links_of_group(series, group, transport, members, settings, world_size, step_time_us)
    folded = _fold_ranks(slow, links_of, settings, found)
    found.links = [lk for _, lk in sorted(slow, key=lambda t: -t[0]) if not set(lk.ranks) & folded]
    return found


@dataclass(slots=True)
class _GroupSeries:
    """Per pair (index into the group's members), over the steps with enough peers: the bandwidth deficit
    ``-ln(bw / median bw)``, the bandwidth (GB/s), its slower direction's transit time and the peers' median (µs)."""

    deficit: dict[int, list[float]]
    bw: dict[int, list[float]]
    transit: dict[int, list[float]]
    peer_transit: dict[int, list[float]]


def _group_series(by_pair: list[Mapping[str, LinkSample]], settings: LinkSettings) -> _GroupSeries | None:
    """The series of one group and transport's pairs (``by_pair[i]``: step -> sample); None without any step that
    has ``min_peers + 1`` pairs with a positive bandwidth."""
    steps = sorted({s for samples in by_pair for s in samples})
    out = _GroupSeries(defaultdict(list), defaultdict(list), defaultdict(list), defaultdict(list))
    for step in steps:
        here = {i: samples.get(step) for i, samples in enumerate(by_pair)}
        vals = {i: s.size_mb / s.time_ms for i, s in here.items() if s is not None and s.time_ms > 0}
        vals = {i: v for i, v in vals.items() if v > 0}
        if len(vals) < settings.min_peers + 1:
            continue
        med = median(vals.values())
        # the slower direction's transit time: a ring collective waits for its slowest hop
        one_way = {i: here[i].max_one_way_ms for i in vals}  # type: ignore[union-attr]
        med_t = median(one_way.values())
        for i, v in vals.items():
            out.deficit[i].append(-math.log(v / med))
            out.bw[i].append(v)
            out.transit[i].append(one_way[i] * 1e3)
            out.peer_transit[i].append(med_t * 1e3)
    return out if out.deficit else None


def _slow_links_of_group(series: _GroupSeries, group: str, transport: str, members: list[tuple[int, int]],
                         settings: LinkSettings, world_size: int,
                         step_time_us: float | None) -> list[tuple[float, SlowLink]]:
    """The group's pairs that pass the test (``find_slow_links``' Notes), each with its saving (µs per step)."""
    deficit, bw = series.deficit, series.bw
    pooled = {i: trimmed_pool(xs) for i, xs in deficit.items()}
    within, _ = pooled_within_sigma(deficit.values())
    n_steps = max(len(xs) for xs in deficit.values())
    floor = max(settings.min_sigma, within / math.sqrt(max(1, n_steps - 1)))
    test = upper_outliers(pooled, candidate_z=settings.candidate_z, sigma_floor=floor)
    peer_bw = median(v for i, xs in bw.items() if i not in test.candidates for v in xs) if any(
        i not in test.candidates for i in bw) else median(v for xs in bw.values() for v in xs)
    slow: list[tuple[float, SlowLink]] = []
    for i, z in test.z.items():
        own_bw = sum(bw[i]) / len(bw[i])
        ratio = own_bw / peer_bw if peer_bw > 0 else 1.0
        if z < settings.min_robust_z or ratio > 1.0 - settings.min_drop:
            continue
        saving = link_saving_us(series.transit[i], series.peer_transit[i])
        frac = saving / step_time_us if step_time_us else 0.0
        impact = Impact(saving / 1e6, 100.0 * frac, frac * world_size * HOURS_PER_DAY)
        a, b = members[i]
        n = len(deficit[i])
        link = SlowLink(ranks=(a, b), group=group, bandwidth_gbps=own_bw, peer_median_gbps=peer_bw,
                        transport=transport, impact=impact.to_json(), evidence={
                            "z": round(z, 3), "steps": n, "noise_sigma_log": round(test.sigma, 5),
                            "strength": "strong" if n >= 3 else "weak",
                            "summary": f"link {a}<->{b} ({transport or 'link'}, group {group}): "
                                       f"{own_bw:.2f} GB/s vs peers {peer_bw:.2f} GB/s "
                                       f"({100 * ratio:.0f}%), {n} steps"})
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
