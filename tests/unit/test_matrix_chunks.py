"""Chunk planning and merging of the slow-link search in bounded memory (issue 26; core/verdict/matrix_chunks.py)."""

from __future__ import annotations

import dataclasses

import pytest

from profwatch.core.verdict.evidence import RecipeState, RecipeStatus
from profwatch.core.verdict.matrix_chunks import (
    MatrixPart,
    merge_matrix_parts,
    plan_matrix_chunks,
    rank_list_arg,
    split_after_oom,
)
from profwatch.core.verdict.msprof_plan import InputFacts, MsprofSettings, plan_recipes


def _partition(chunks: tuple[tuple[int, ...], ...], ranks: list[int]) -> None:
    flat = [r for c in chunks for r in c]
    assert sorted(flat) == sorted(ranks) and len(flat) == len(set(flat))


def test_whole_batch_within_both_limits_is_not_chunked() -> None:
    assert plan_matrix_chunks(range(256), [], {}, max_ranks=256, max_bytes=2**30) is None
    assert plan_matrix_chunks(range(8), [range(8)], dict.fromkeys(range(8), 10), max_ranks=8, max_bytes=80) is None


def test_fixed_chunks_of_consecutive_ranks_without_groups() -> None:
    plan = plan_matrix_chunks(range(1024), [], {}, max_ranks=256, max_bytes=2**30)
    assert plan is not None and plan.by == "fixed" and plan.groups_total == 0
    assert [(c[0], c[-1], len(c)) for c in plan.chunks] == [(0, 255, 256), (256, 511, 256), (512, 767, 256),
                                                             (768, 1023, 256)]
    assert "1024 ranks > matrix_max_ranks 256" in plan.reason
    assert "4 chunks of <= 256 ranks, consecutive ranks" in plan.describe()


def test_groups_smaller_than_a_chunk_stay_whole() -> None:
    """TP groups of 8 strided (rank r in TP group r % 8... here: ranks {i, i+128, ...}), DP groups, one world group:
    every TP group lies in one chunk, the world group and the DP groups span chunks."""
    world = list(range(1024))
    tp = [[g + 128 * k for k in range(8)] for g in range(128)]  # strided: consecutive chunks would split them all
    dp = [list(range(128 * k, 128 * (k + 1))) for k in range(8)]
    plan = plan_matrix_chunks(world, [world, *dp, *tp], {}, max_ranks=100, max_bytes=2**40)
    assert plan is not None and plan.by == "groups"
    _partition(plan.chunks, world)
    assert all(len(c) <= 100 for c in plan.chunks)
    where = {r: i for i, c in enumerate(plan.chunks) for r in c}
    assert all(len({where[r] for r in g}) == 1 for g in tp)
    assert plan.groups_total == 1 + 8 + 128 and plan.groups_whole == 128
    assert "128 of 137 groups whole" in plan.describe()


def test_byte_limit_cuts_chunks_and_a_huge_rank_is_alone() -> None:
    sizes = dict.fromkeys(range(10), 100)
    sizes[4] = 1000  # above the limit by itself
    plan = plan_matrix_chunks(range(10), [], sizes, max_ranks=100, max_bytes=300)
    assert plan is not None and "bytes of analysis.db > matrix_max_input_bytes 300" in plan.reason
    assert plan.chunks == ((0, 1, 2), (3,), (4,), (5, 6, 7), (8, 9))
    # a group whose ranks' bytes pass the limit is not joined
    plan = plan_matrix_chunks(range(6), [[0, 1, 2, 3]], dict.fromkeys(range(6), 100), max_ranks=10, max_bytes=300)
    assert plan is not None and plan.groups_whole == 0 and plan.chunks == ((0, 1, 2), (3, 4, 5))


def test_ranks_outside_the_batch_and_bad_limits() -> None:
    plan = plan_matrix_chunks([0, 1, 2, 3, 5], [[0, 1, 7, 9], [2, 3]], {}, max_ranks=2, max_bytes=10)
    assert plan is not None and plan.chunks == ((0, 1), (2, 3), (5,)) and plan.groups_whole == 2
    with pytest.raises(ValueError):
        plan_matrix_chunks([0, 1], [], {}, max_ranks=0, max_bytes=1)
    assert rank_list_arg((3, 1, 2)) == "1,2,3"


def _row(src: int, dst: int, size: float = 1.0, t: float = 1.0) -> dict[str, object]:
    return {"step": "step1", "hccl_op_name": "Total Op Info", "group_name": "g", "src_rank": float(src),
            "dst_rank": float(dst), "transport_type": "HCCS", "transit_size": size, "transit_time": t}


def _part(ranks: tuple[int, ...], state: RecipeState, rows: list[dict[str, object]], peak: int | None = None,
          detail: str = "") -> MatrixPart:
    return MatrixPart(ranks, RecipeStatus("communication_matrix", state, detail, duration_s=2.0, phase="enrich",
                                          peak_rss_bytes=peak), rows)  # type: ignore[arg-type]


def test_merge_all_ok_concatenates_and_names_the_coverage() -> None:
    plan = plan_matrix_chunks(range(4), [], {}, max_ranks=2, max_bytes=10)
    assert plan is not None
    status, rows, notes = merge_matrix_parts(plan, [_part((2, 3), "ok", [_row(2, 3), _row(3, 1)], 300),
                                                    _part((0, 1), "ok", [_row(0, 1), _row(1, 3)], 200)])
    assert status.status == "ok" and status.peak_rss_bytes == 300 and status.duration_s == 4.0
    assert "4 rank pairs, 2 of 2 chunks ok" in status.detail and len(rows) == 4
    assert notes[0].startswith("slow-link search (communication_matrix_sum, 2 chunks of <= 2 ranks")
    assert "covered ranks 0-3 (4 of 4)" in notes[0]
    assert any("groups unknown" in n for n in notes)


def test_merge_never_claims_ranks_of_failed_or_silent_chunks() -> None:
    plan = plan_matrix_chunks(range(6), [], {}, max_ranks=2, max_bytes=10)
    assert plan is not None
    status, rows, notes = merge_matrix_parts(plan, [
        _part((0, 1), "ok", [_row(0, 2)]),
        _part((2, 3), "oom", [], detail="killed after 40 s: 9.6 GiB"),
    ])  # chunk (4, 5) never ran
    assert status.status == "oom" and "1 of 3 chunks ok" in status.detail and "ranks 2-3: oom" in status.detail
    assert rows == [_row(0, 2)]
    assert "covered ranks 0-1 (2 of 6)" in notes[0]
    assert "did not cover ranks 2-5" in notes[1] and "ranks 4-5: skipped" in notes[1]
    assert "no link rows for ranks 1" in notes[2]
    # a chunk that ran and found nothing is not a failure of the search, and not covered either
    status, _, notes = merge_matrix_parts(plan, [_part((0, 1), "ok", [_row(0, 1)]), _part((2, 3), "no_data", []),
                                                 _part((4, 5), "ok", [_row(4, 5)])])
    assert status.status == "ok" and "ranks 2-3: no_data" in status.detail
    assert "covered ranks 0-1, 4-5 (4 of 6)" in notes[0]
    status, _, _ = merge_matrix_parts(plan, [_part(c, "no_data", []) for c in plan.chunks])
    assert status.status == "no_data"


def test_plan_recipes_runs_the_matrix_in_chunks_above_the_limits() -> None:
    facts = InputFacts(rank_count=8, db_ranks=list(range(8)), has_communication=True, has_memcpy=True,
                       max_group_size=8, groups=[(0, 1, 2, 3), (4, 5, 6, 7), tuple(range(8))])
    small = plan_recipes(facts, MsprofSettings(advisor=False), "/s")
    assert small.matrix_chunks is None
    assert [c.args for c in small.phase("enrich")] == [("-m", "communication_matrix_sum", "-d", "/s", "--agent",
                                                        "--force")]
    plan = plan_recipes(facts, MsprofSettings(advisor=False, matrix_max_ranks=4), "/s")
    assert plan.matrix_chunks is not None and plan.matrix_chunks.groups_whole == 2
    cmds = plan.phase("enrich")
    assert [(c.name, c.ranks, c.args[-2:]) for c in cmds] == [
        ("communication_matrix", (0, 1, 2, 3), ("--rank_list", "0,1,2,3")),
        ("communication_matrix", (4, 5, 6, 7), ("--rank_list", "4,5,6,7"))]
    assert plan.recipe_names("enrich") == ["communication_matrix"]
    by_bytes = plan_recipes(dataclasses.replace(facts, analysis_bytes=dict.fromkeys(range(8), 2**28)),
                            MsprofSettings(advisor=False), "/s")
    assert by_bytes.matrix_chunks is not None and len(by_bytes.matrix_chunks.chunks) == 2


def test_runs_killed_at_the_memory_cap_are_cut_in_two() -> None:
    # the whole batch (no plan) killed: halves, groups kept whole where they fit
    tp = [[0, 4], [1, 5], [2, 6], [3, 7]]
    plan = split_after_oom(None, range(8), tp, {}, [tuple(range(8))])
    assert plan is not None and plan.chunks == ((0, 1, 4, 5), (2, 3, 6, 7)) and plan.groups_whole == 4
    assert "killed at the memory cap, cut in two: ranks 0-7" in plan.reason
    # one chunk of a plan killed: only it is cut, in place
    first = plan_matrix_chunks(range(12), [], {}, max_ranks=4, max_bytes=10)
    assert first is not None
    again = split_after_oom(first, range(12), [], {}, [(4, 5, 6, 7)])
    assert again is not None and again.chunks == ((0, 1, 2, 3), (4, 5), (6, 7), (8, 9, 10, 11))
    assert again.reason.startswith("12 ranks > matrix_max_ranks 4; killed") and again.by == "fixed"
    # an odd chunk, then nothing left to cut
    odd = split_after_oom(None, [3, 9, 12], [], {}, [(3, 9, 12)])
    assert odd is not None and odd.chunks == ((3, 9), (12,))
    assert split_after_oom(odd, [3, 9, 12], [], {}, [(12,)]) is None
    assert split_after_oom(first, range(12), [], {}, []) is None
