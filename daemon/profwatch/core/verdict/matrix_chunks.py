"""The slow-link search in bounded memory: which ranks each ``communication_matrix_sum`` run reads, and how the
runs' tables make one (pure).

Why: ``communication_matrix_sum`` holds every rank's ``CommAnalyzerMatrix`` rows in one pandas frame, so its memory
grows with the ranks it reads; at 1,024 ranks it was killed at its memory cap (9.64 GiB) and the slow-link search
was lost. Above ``matrix_max_ranks`` ranks or ``matrix_max_input_bytes`` of ``analysis.db`` the runner reads the
batch in chunks instead, one ``--rank_list`` run per chunk, one at a time (enrich slot), so the peak is one chunk's.

Why the merged chunks give the whole run's table (msprof-analyze 26.2.0, ``communication_matrix_sum``,
docs/msprof-analyze.md#matrix-chunks): the recipe reads each listed rank's ``CommAnalyzerMatrix`` (group-local
ranks), maps local to global ranks through the ``parallel_group_info`` of the listed ranks' profiler DBs (the
whole member list of each of their groups, so peers outside the chunk map too), and *sums* ``transit_size`` and
``transit_time`` per (group, step, op, src, dst) over the ranks it read; ``Total Op Info`` is again a sum over ops.
Chunks are disjoint and cover every rank, so summing the chunks' rows per key (what
:func:`profwatch.core.verdict.links.parse_matrix_rows` does with duplicate keys) gives the whole run's sums. Without
``parallel_group_info`` the tool maps a group's local ranks from the ranks' own (src == dst) rows only, so a link
to a peer in another chunk may be dropped; the plan then says so.

Chunks follow the communication groups when they are known: groups are joined smallest first (e.g. the 8-rank
tensor-parallel groups) while the union fits a chunk, so the links inside such a group come from one run; a
group larger than a chunk (the world group) spans chunks. Without groups: consecutive ranks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from profwatch.core.batches.completeness import rank_ranges
from profwatch.core.verdict.evidence import RecipeState, RecipeStatus
from profwatch.core.verdict.link_rows import LinkRows

__all__ = ["MatrixChunkPlan", "MatrixPart", "merge_matrix_parts", "plan_matrix_chunks", "rank_list_arg",
           "split_after_oom"]

#: Worst first: the state of a chunked run that did not fully succeed is its worst chunk's.
_SEVERITY: tuple[RecipeState, ...] = ("oom", "timeout", "tool_error", "cancelled", "skipped", "no_data", "not_applicable", "ok")
#: States of a chunk that did not run to its end (a chunk that ran and found no link rows is not one of them).
_HARD: tuple[RecipeState, ...] = ("oom", "timeout", "tool_error", "cancelled", "skipped")


@dataclass(frozen=True, slots=True)
class MatrixChunkPlan:
    """:func:`plan_matrix_chunks` output. ``chunks``: disjoint sorted rank tuples covering every rank, in order;
    ``by``: ``"groups"`` (communication groups known) or ``"fixed"`` (consecutive ranks); ``groups_whole`` of
    ``groups_total`` groups (of two ranks or more, restricted to the batch's ranks) lie inside one chunk;
    ``reason``: why the batch is chunked (the limit it passes)."""

    chunks: tuple[tuple[int, ...], ...]
    by: Literal["groups", "fixed"]
    groups_whole: int = 0
    groups_total: int = 0
    reason: str = ""

    @property
    def ranks(self) -> list[int]:
        """Every rank of the plan, sorted."""
        return sorted(r for c in self.chunks for r in c)

    def describe(self) -> str:
        """One line: how many chunks of at most how many ranks, and how they were cut."""
        biggest = max((len(c) for c in self.chunks), default=0)
        how = (f"by communication group ({self.groups_whole} of {self.groups_total} groups whole in one chunk)"
               if self.by == "groups" else "consecutive ranks (communication groups unknown)")
        return f"{len(self.chunks)} chunks of <= {biggest} ranks, {how}; {self.reason}"


def plan_matrix_chunks(ranks: Sequence[int], groups: Sequence[Sequence[int]], input_bytes: Mapping[int, int], *,
                       max_ranks: int, max_bytes: int) -> MatrixChunkPlan | None:
    """The chunks of ``communication_matrix_sum`` runs for a batch, or None when one run over the whole batch
    stays within both limits (the unchunked path).

    Args:
        ranks: the batch's rank ids (as ``--rank_list`` takes them: ``profiler_info_{rank}.json``).
        groups: communication groups as global rank lists (``parallel_group_info`` ``global_ranks``; ranks
            outside ``ranks`` are ignored); empty when unknown.
        input_bytes: rank -> bytes of its ``analysis.db`` (missing = 0), the size estimate of its matrix rows.
        max_ranks: most ranks one run reads (>= 1).
        max_bytes: most ``analysis.db`` bytes one run reads (>= 1); a single rank above it gets a chunk alone.

    Returns:
        :class:`MatrixChunkPlan` (see the module docstring for how groups shape the chunks). Raises ValueError
        for ``max_ranks`` or ``max_bytes`` below 1.
    """
    if max_ranks < 1 or max_bytes < 1:
        raise ValueError(f"max_ranks and max_bytes must be >= 1, got {max_ranks}, {max_bytes}")
    order = sorted(set(ranks))
    size = {r: max(0, int(input_bytes.get(r, 0))) for r in order}
    total = sum(size.values())
    if len(order) <= max_ranks and total <= max_bytes:
        return None
    reason = (f"{len(order)} ranks > matrix_max_ranks {max_ranks}" if len(order) > max_ranks
              else f"{total} bytes of analysis.db > matrix_max_input_bytes {max_bytes}")
    present = set(order)
    members = sorted({tuple(sorted(set(g) & present)) for g in groups} - {()}, key=lambda g: (len(g), g))
    members = [g for g in members if len(g) >= 2]
    parent = {r: r for r in order}
    count = dict.fromkeys(order, 1)
    weight = dict(size)

    def root(r: int) -> int:
        while parent[r] != r:
            parent[r] = parent[parent[r]]
            r = parent[r]
        return r

    for g in members:  # smallest groups first, while the union still fits one chunk
        roots = sorted({root(r) for r in g})
        if len(roots) < 2:
            continue
        if sum(count[x] for x in roots) > max_ranks or sum(weight[x] for x in roots) > max_bytes:
            continue
        head = roots[0]
        for x in roots[1:]:
            parent[x] = head
            count[head] += count.pop(x)
            weight[head] += weight.pop(x)
    comps: dict[int, list[int]] = {}
    for r in order:
        comps.setdefault(root(r), []).append(r)
    chunks: list[list[int]] = []
    used_ranks = used_bytes = 0
    for comp in sorted(comps.values()):  # consecutive components, by lowest rank
        b = sum(size[r] for r in comp)
        if chunks and used_ranks + len(comp) <= max_ranks and used_bytes + b <= max_bytes:
            chunks[-1] += comp
            used_ranks, used_bytes = used_ranks + len(comp), used_bytes + b
        else:
            chunks.append(list(comp))
            used_ranks, used_bytes = len(comp), b
    whole, total = _whole_groups(chunks, members)
    return MatrixChunkPlan(tuple(tuple(sorted(c)) for c in chunks), "groups" if members else "fixed",
                           whole, total, reason)


def _whole_groups(chunks: Sequence[Sequence[int]], groups: Sequence[Sequence[int]]) -> tuple[int, int]:
    """(groups of 2+ ranks of the plan inside one chunk, such groups)."""
    where = {r: i for i, c in enumerate(chunks) for r in c}
    members = {tuple(sorted(set(g) & where.keys())) for g in groups}
    members = {g for g in members if len(g) >= 2}
    return sum(1 for g in members if len({where[r] for r in g}) == 1), len(members)


def split_after_oom(plan: MatrixChunkPlan | None, ranks: Sequence[int], groups: Sequence[Sequence[int]],
                    input_bytes: Mapping[int, int], oom: Sequence[Sequence[int]]) -> MatrixChunkPlan | None:
    """The plan once more after runs were killed at the memory cap: each chunk of ``oom`` (with ``plan`` None:
    the whole batch, ``ranks``) that has two ranks or more is cut in two by :func:`plan_matrix_chunks` (at most
    half its ranks per chunk, groups kept whole where they fit), in place, the other chunks unchanged. Returns
    None when nothing can be cut (no such chunk, or only single ranks were killed). The memory a run needs is
    only estimated before it runs (ranks, ``analysis.db`` bytes); the cap says when the estimate was wrong."""
    chunks = [tuple(sorted(set(ranks)))] if plan is None else list(plan.chunks)
    killed = {tuple(sorted(c)) for c in oom if len(c) >= 2}
    out: list[tuple[int, ...]] = []
    cut: list[tuple[int, ...]] = []
    for c in chunks:
        if c not in killed:
            out.append(c)
            continue
        halves = plan_matrix_chunks(c, groups, input_bytes, max_ranks=(len(c) + 1) // 2, max_bytes=2**62)
        if halves is None:  # unreachable for 2+ ranks; kept for the type
            out.append(c)
            continue
        out += halves.chunks
        cut.append(c)
    if not cut:
        return None
    whole, total = _whole_groups(out, groups)
    spans = ", ".join(rank_ranges(c) for c in cut)
    reason = (plan.reason + "; " if plan is not None else "") + \
        f"killed at the memory cap, cut in two: ranks {spans}"
    return MatrixChunkPlan(tuple(out), "groups" if total else "fixed", whole, total, reason)


def rank_list_arg(chunk: Sequence[int]) -> str:
    """``--rank_list``'s value for a chunk: the ranks comma-separated (msprof-analyze keeps the all-digit items)."""
    return ",".join(str(r) for r in sorted(chunk))


@dataclass(slots=True)
class MatrixPart:
    """One chunk's finished run: its ``ranks``, its :class:`RecipeStatus` and its ``ClusterCommunicationMatrix``
    rows (empty unless ``ok``; a sequence of row mappings is turned into :class:`LinkRows`)."""

    ranks: tuple[int, ...]
    status: RecipeStatus
    rows: LinkRows = field(default_factory=LinkRows)

    def __post_init__(self) -> None:
        self.rows = LinkRows.from_rows(self.rows)


def merge_matrix_parts(plan: MatrixChunkPlan, parts: Sequence[MatrixPart]
                       ) -> tuple[RecipeStatus, LinkRows, list[str]]:
    """The chunks' runs as one ``communication_matrix`` result: ``(status, rows, notes)``.

    ``rows``: every ``ok`` chunk's rows, concatenated (:meth:`LinkRows.concat`; keys repeated across chunks are summed by the link
    search, which gives the whole run's sums: module docstring). ``status``: the worst state of a chunk that did
    not run to its end (``oom`` before ``timeout``, ``tool_error``, ``skipped`` = not run); else ``ok`` when some
    chunk is ``ok`` (chunks that ran and found no link rows are named in the notes); else the worst state. The
    detail names the chunks that were not ``ok`` and their ranks. ``notes``: which ranks the link search covered (ranks of ``ok``
    chunks), which it did not and why, and ranks of ``ok`` chunks without any link row; never more than the runs
    read. Peak memory is the largest chunk's, duration the sum. A plan chunk without a part counts as not run.
    """
    by_chunk = {tuple(p.ranks): p for p in parts}
    covered: list[int] = []
    missed: list[str] = []
    missed_ranks: list[int] = []
    ok_rows: list[LinkRows] = []
    states: list[RecipeState] = []
    for chunk in plan.chunks:
        part = by_chunk.get(chunk)
        state: RecipeState = part.status.status if part is not None else "skipped"
        states.append(state)
        if part is not None and state == "ok":
            covered += chunk
            ok_rows.append(part.rows)
        else:
            missed_ranks += chunk
            missed.append(f"ranks {rank_ranges(chunk)}: {state}"
                          + (f" ({part.status.detail})" if part is not None and part.status.detail else ""))
    rows = LinkRows.concat(ok_rows)
    del ok_rows
    found = rows.ranks()
    silent = sorted(set(covered) - found)
    ok_n = states.count("ok")
    hard = [s for s in states if s in _HARD]
    merged: RecipeState = (min(hard or states, key=_SEVERITY.index) if hard or not ok_n else "ok") if states \
        else "no_data"
    cover = (f"slow-link search (communication_matrix_sum, {plan.describe()}): covered ranks "
             f"{rank_ranges(covered) if covered else 'none'} ({len(covered)} of {len(plan.ranks)})")
    notes = [cover]
    if missed:
        notes.append(f"slow-link search did not cover ranks {rank_ranges(missed_ranks)}: links with both ends "
                     "there were not checked, links with one end there only from the covered end's rows; "
                     + "; ".join(missed))
    if silent:
        notes.append(f"slow-link search: no link rows for ranks {rank_ranges(silent)}")
    if plan.by == "fixed" and len(plan.chunks) > 1:
        notes.append("communication groups unknown (no parallel_group_info): links between ranks of different "
                     "chunks are kept only where msprof-analyze could map both ends")
    ran = [p for p in (by_chunk.get(c) for c in plan.chunks) if p is not None]
    peaks = [p.status.peak_rss_bytes for p in ran if p.status.peak_rss_bytes is not None]
    detail = f"{rows.pair_count()} rank pairs, {ok_n} of {len(plan.chunks)} chunks ok ({plan.describe()})" + "".join(
        f"; {m}" for m in missed)
    status = RecipeStatus(name="communication_matrix", status=merged, detail=detail,
                          tables=["ClusterCommunicationMatrix"] if rows else [], rows=len(rows),
                          output_dir=ran[0].status.output_dir if ran else None,
                          log_tail=next((p.status.log_tail for p in ran if p.status.status != "ok"), ""),
                          duration_s=round(sum(p.status.duration_s for p in ran), 3),
                          returncode=next((p.status.returncode for p in ran if p.status.status != "ok"),
                                          ran[0].status.returncode if ran else None),
                          phase="enrich", peak_rss_bytes=max(peaks) if peaks else None)
    return status, rows, notes
