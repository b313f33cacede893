"""ClusterCommunicationMatrix rows held as columns (profwatch.core.verdict.link_rows, issue 34): the same rows read
back, and the same slow-link judgement as the rows given one dict at a time (the row-by-row reader in
``links._row_columns``), on generated batches with the table's quirks. The real tool's table: tests/integration/
test_matrix_chunks.py."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from profwatch.core.verdict.evidence import ClusterEvidence, RecipeStatus
from profwatch.core.verdict.link_rows import LinkRows
from profwatch.core.verdict.links import find_slow_links
from profwatch.core.verdict.matrix_chunks import MatrixChunkPlan, MatrixPart, merge_matrix_parts
from profwatch.core.verdict.ranking import judge_batch
from profwatch.simulate.ascend_tree import build_timelines, cluster_time_summary


def batch_rows(world: int, *, seed: int, steps: int = 3) -> list[dict[str, Any]]:
    """Directed-pair rows of two groups (an HCCS world group and an RDMA group of the even ranks), one slow link
    and one slow rank, with what real tables hold besides: op rows beside ``Total Op Info`` in one group and
    only op and statistics rows in the other, ranks as floats, ints and strings, a group name as int and as float,
    missing transports, NaN and zero times, self pairs, rows without a step, and an unknown column."""
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    for s in range(1, steps + 1):
        for a in range(world):
            for b in range(world):
                f = (3.0 if {a, b} == {1, 6} else 1.0) * (2.5 if a == 3 else 1.0)
                t = 4.0 * f * (1 + 0.02 * rng.gauss(0, 1))
                src: Any = [float(a), a, str(a)][(a + b + s) % 3]
                rows.append({"step": f"step{s}", "hccl_op_name": "Total Op Info", "group_name": "world",
                             "src_rank": src, "dst_rank": float(b), "transport_type": "HCCS" if s != 2 or a else None,
                             "transit_size": 8.0, "transit_time": t, "bandwidth": 8.0 / t, "op_name": "Total Op Info",
                             "index": len(rows)})
                rows.append({"step": f"step{s}", "hccl_op_name": "hcom_allReduce__1_0_1", "group_name": "world",
                             "src_rank": a, "dst_rank": b, "transport_type": "HCCS", "transit_size": 2.0,
                             "transit_time": t / 4, "bandwidth": 8.0 / t, "op_name": "hcom_allReduce_"})
                if a % 2 == 0 and b % 2 == 0:
                    for op, share in (("hcom_broadcast__2_0_1", 0.5), ("hcom_broadcast__2_0_1-top1", 0.1)):
                        rows.append({"step": s if s != 3 else f"step{s}", "hccl_op_name": op,
                                     "group_name": 7 if s == 1 else 7.0, "src_rank": a, "dst_rank": b,
                                     "transport_type": "RDMA", "transit_size": 16.0 * share,
                                     "transit_time": [t * share, 0.0, math.nan, "x"][rng.randrange(4)] if a == 4
                                     else t * share, "bandwidth": None, "op_name": op})
        rows.append({"step": None, "hccl_op_name": "Total Op Info", "group_name": "world", "src_rank": 0,
                     "dst_rank": 1, "transport_type": "HCCS", "transit_size": 8.0, "transit_time": 1.0})
    return rows


def _same(rows: list[dict[str, Any]], **kw: Any) -> None:
    cols = LinkRows.from_rows(rows)
    by_row, by_col = find_slow_links(iter(rows), **kw), find_slow_links(cols, **kw)
    assert by_col == by_row
    return None


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_columns_give_the_same_judgement_as_the_rows_one_by_one(seed: int) -> None:
    rows = batch_rows(12, seed=seed)
    found = find_slow_links(LinkRows.from_rows(rows), world_size=12, step_time_us=50_000)
    assert found == find_slow_links(iter(rows), world_size=12, step_time_us=50_000)
    # the batch is judged at all: the slow rank folds, the slow link is named, both groups are compared
    assert sorted(found.folded_ranks) == [3] and [lk.ranks for lk in found.links] == [(1, 6)]
    # world HCCS 66 pairs; rank 0's step-2 rows without a transport 11; RDMA groups "7" and "7.0" 15 each
    assert found.pairs_judged == 66 + 11 + 15 + 15
    _same(rows[: len(rows) // 3], world_size=12)


def test_judge_batch_is_the_same_with_columns_or_dicts() -> None:
    tls = build_timelines(world_size=12, steps=3, seed=4, noise=0.02, slow_links={(1, 6): 3.0})
    rows = batch_rows(12, seed=4)
    v_cols = judge_batch(ClusterEvidence(kind="ascend_pt", summaries=cluster_time_summary(tls),
                                         link_rows=LinkRows.from_rows(rows)), world_size=12)
    ev = ClusterEvidence(kind="ascend_pt", summaries=cluster_time_summary(tls))
    ev.link_rows = rows  # type: ignore[assignment]  # a plain list: the row-by-row reader
    v_rows = judge_batch(ev, world_size=12)
    assert v_cols == v_rows and [lk.ranks for lk in v_cols.links] == [(1, 6)]


def test_rows_read_back_as_given() -> None:
    rows = batch_rows(4, seed=0, steps=2)
    cols = LinkRows.from_rows(rows)
    assert len(cols) == len(rows) and cols  # truthy when it has rows
    kept = ("step", "hccl_op_name", "group_name", "transport_type", "op_name", "src_rank", "dst_rank")
    for got, want in zip(cols, rows, strict=True):
        assert "index" not in got  # a column no reader uses is not kept
        assert {k: (got[k], type(got[k])) for k in kept if k in want} == {k: (want[k], type(want[k])) for k in kept
                                                                             if k in want}
        t = want.get("transit_time")
        t = float(t) if isinstance(t, float | int) else math.nan
        assert got["transit_time"] == t or (math.isnan(got["transit_time"]) and math.isnan(t))
    assert cols[-1]["step"] is None and cols[0]["src_rank"] == rows[0]["src_rank"]
    assert LinkRows() == [] and not LinkRows()


def test_concat_of_chunks_keeps_every_value_and_the_judgement() -> None:
    rows = batch_rows(8, seed=5)
    half = len(rows) // 2
    parts = [LinkRows.from_rows(rows[:half]), LinkRows(), LinkRows.from_rows(rows[half:])]
    merged = LinkRows.concat(parts)
    assert merged == LinkRows.from_rows(rows)
    assert find_slow_links(merged, world_size=8) == find_slow_links(iter(rows), world_size=8)
    assert merged.ranks() == set(range(8))
    assert merged.pair_count() == len({(r["src_rank"], r["dst_rank"]) for r in rows})


def test_merged_chunk_parts_count_pairs_and_ranks_as_the_rows_say() -> None:
    rows = batch_rows(8, seed=6)
    a = [r for r in rows if float(r["src_rank"]) < 4]
    b = [r for r in rows if float(r["src_rank"]) >= 4]
    plan = MatrixChunkPlan(((0, 1, 2, 3), (4, 5, 6, 7)), "fixed", 0, 0, "")
    ok = RecipeStatus(name="communication_matrix", status="ok")
    status, merged, notes = merge_matrix_parts(plan, [MatrixPart((0, 1, 2, 3), ok, a),  # type: ignore[arg-type]
                                                      MatrixPart((4, 5, 6, 7), ok, LinkRows.from_rows(b))])
    assert status.status == "ok" and status.rows == len(rows) and isinstance(merged, LinkRows)
    assert status.detail.startswith(f"{len({(r['src_rank'], r['dst_rank']) for r in rows})} rank pairs")
    assert not any("no link rows" in n for n in notes)
    assert find_slow_links(merged, world_size=8) == find_slow_links(iter(a + b), world_size=8)
