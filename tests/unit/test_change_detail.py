"""What is behind each change since the reference (core/changes/detail.py): the msprof-analyze compare
workbook's sheets, torch per-op totals, the merge over ranks and the detail put into the changes."""

from __future__ import annotations

import pytest

from profwatch.core.changes.detail import (
    DetailEntry,
    attach_detail,
    entries_from_compare,
    entries_from_op_totals,
    merge_ranks,
    pick_ranks,
)
from profwatch.core.verdict.evidence import RankStepSummary

REF = "Base Profiling: /ref/node0_4000_ascend_pt"
NOW = "Comparison Profiling: /now/node0_4000_ascend_pt"
GROUP = "10.0.0.1%eth0_60000_0_1767268800000000"

# the layout msprof-analyze 26.2.0 compare writes (title row, empty row, header, rows; reference columns first)
SHEETS = {
    "OverallMetrics": [
        [None, REF, None, None, NOW],
        [],
        ["Index", "Duration(ms)", "Duration Ratio", "Number", "Duration(ms)", "Duration Ratio", "Number",
         "Diff Duration(ms)", "Diff Ratio"],
        ["Computing Time", 180.0, 0.9, 72.0, 225.0, 0.8, 72.0, 45.0, 1.25],
        ["\tMatmul", 90.0, 0.45, 36.0, 135.0, 0.5, 36.0, 45.0, 1.5],
        ["Uncovered Communication Time", 12.0, 0.06, "/", 36.0, 0.16, "/", 24.0, 3.0],
        [f"\t{GROUP}", 12.0, 0.06, "/", 36.0, 0.16, "/", 24.0, 3.0],
        ["\t\tWait", 0.9, 0.004, "/", 0.9, 0.003, "/", 0.0, 1.0],
        ["\t\tTransmit", 11.1, 0.06, "/", 35.1, 0.16, "/", 24.0, 3.1],
        ["Free Time", 4.8, 0.02, "/", 4.8, 0.02, "/", 0.0, 1.0],
        ["\tFree", 4.8, 0.02, "/", 4.8, 0.02, "/", 0.0, 1.0],
    ],
    "CommunicationCompare": [
        [None, REF, None, None, None, None, None, None, NOW],
        [],
        ["Order Id", "Communication OP Name", "Task Name", "Calls", "Total Duration(us)", "Avg Duration(us)",
         "Max Duration(us)", "Min Duration(us)", "Communication OP Name", "Task Name", "Calls",
         "Total Duration(us)", "Avg Duration(us)", "Max Duration(us)", "Min Duration(us)", "Diff Duration(us)",
         "Diff Ratio"],
        [1.0, "allreduce", None, 12.0, 12000.0, 1000.0, 1300.0, 1000.0, "allreduce", None, 12.0, 36000.0, 3000.0,
         3300.0, 3000.0, 24000.0, 3.0],
        [2.0, "|", "Notify_Wait", 12.0, 900.0, 75.0, 340.0, 1.0, "|", "Notify_Wait", 12.0, 900.0, 75.0, 340.0, 1.0],
        [3.0, None, None, None, None, None, None, None, "broadcast", None, 3.0, 3000.0, 1000.0, 1000.0, 1000.0,
         3000.0, None],
    ],
    "OperatorCompareStatistic": [
        [None, None, REF, None, NOW],
        [],
        ["Top", "Operator Name", "Base Device Duration(ms)", "Base Operator Number", "Comparison Device Duration(ms)",
         "Comparison Operator Number", "Diff Duration(ms)", "Diff Ratio"],
        [1.0, "aten::matmul", 90.0, 36.0, 135.0, 36.0, 45.0, 1.5],
        [2.0, "aten::add", 90.0, 36.0, 90.0, 36.0, 0.0, 1.0],
    ],
    "KernelCompare": [
        [None, None, None, REF, None, None, None, None, NOW],
        [],
        ["Order Id", "Kernel", "Input Shape", "Total Duration(us)", "Avg Duration(us)", "Max Duration(us)",
         "Min Duration(us)", "Calls", "Total Duration(us)", "Avg Duration(us)", "Max Duration(us)",
         "Min Duration(us)", "Calls", "Diff Total Ratio", "Diff Avg Ratio"],
        [1.0, "MatMul", "4096,4096", 60000.0, 2500.0, 2600.0, 2300.0, 24.0, 90000.0, 3750.0, 3900.0, 3400.0, 24.0,
         1.5, 1.5],
        [2.0, "MatMul", "1024,1024", 30000.0, 2500.0, 2600.0, 2300.0, 12.0, 45000.0, 3750.0, 3900.0, 3400.0, 12.0,
         1.5, 1.5],
    ],
}


def by_name(entries: list[DetailEntry]) -> dict[str, DetailEntry]:
    return {e.name: e for e in entries}


def test_the_workbook_gives_operators_collectives_and_groups_per_step() -> None:
    got = by_name(entries_from_compare(SHEETS, steps_baseline=3, steps_now=3))
    mm = got["aten::matmul"]
    assert (mm.component, mm.kind) == ("compute", "operator")
    assert mm.baseline_s_per_step == pytest.approx(0.030) and mm.delta_s_per_step == pytest.approx(0.015)
    assert got["aten::add"].delta_s_per_step == pytest.approx(0.0)
    ar = got["allreduce"]
    assert (ar.component, ar.kind) == ("communication", "collective")
    assert ar.delta_s_per_step == pytest.approx(0.008)  # (36 ms - 12 ms) / 3 steps
    assert "Notify_Wait" not in got and "|" not in got  # task rows of a collective are not collectives
    assert got["broadcast"].baseline_s_per_step == 0.0 and got["broadcast"].now_s_per_step == pytest.approx(0.001)
    grp = got[GROUP]
    assert (grp.kind, grp.group) == ("group", GROUP) and grp.delta_s_per_step == pytest.approx(0.008)
    assert "Wait" not in got and "Transmit" not in got and "Matmul" not in got and "Free" not in got
    assert "MatMul" not in got  # kernels only stand in when there is no operator row


def test_kernels_stand_in_without_operators_and_each_capture_has_its_own_step_count() -> None:
    sheets = {k: v for k, v in SHEETS.items() if k != "OperatorCompareStatistic"}
    got = by_name(entries_from_compare(sheets, steps_baseline=3, steps_now=5))
    mm = got["MatMul"]  # both shapes summed
    assert mm.kind == "kernel" and mm.baseline_s_per_step == pytest.approx(0.090 / 3)
    assert mm.now_s_per_step == pytest.approx(0.135 / 5)
    assert entries_from_compare({}, steps_baseline=1, steps_now=1) == []
    assert entries_from_compare({"OperatorCompareStatistic": [["nothing"]]}, steps_baseline=1, steps_now=1) == []
    with pytest.raises(ValueError):
        entries_from_compare(SHEETS, steps_baseline=0, steps_now=1)


def test_torch_op_totals_split_into_compute_and_collectives() -> None:
    got = by_name(entries_from_op_totals({"aten::mm": 90_000.0, "nccl:all_reduce": 6_000.0},
                                         {"aten::mm": 60_000.0, "nccl:all_reduce": 3_000.0, "aten::gone": 300.0},
                                         steps_now=3, steps_baseline=3,
                                         is_collective=lambda n: "all_reduce" in n))
    assert got["aten::mm"].component == "compute" and got["aten::mm"].delta_s_per_step == pytest.approx(0.010)
    assert got["nccl:all_reduce"].kind == "collective" and got["nccl:all_reduce"].component == "communication"
    assert got["aten::gone"].now_s_per_step == 0.0


def test_merge_takes_the_mean_over_ranks_and_a_missing_entry_counts_as_zero() -> None:
    a = DetailEntry("compute", "operator", "aten::mm", 0.010, 0.020)
    b = DetailEntry("compute", "operator", "aten::mm", 0.010, 0.030)
    c = DetailEntry("compute", "operator", "aten::only_on_1", 0.0, 0.004)
    got = by_name(merge_ranks({0: [a], 1: [b, c]}))
    assert got["aten::mm"].delta_s_per_step == pytest.approx(0.015) and got["aten::mm"].ranks == (0, 1)
    assert got["aten::only_on_1"].delta_s_per_step == pytest.approx(0.002)
    assert merge_ranks({}) == []


def test_pick_ranks_takes_those_that_changed_most_and_present_in_both() -> None:
    def rows(times: dict[int, float]) -> list[RankStepSummary]:
        return [RankStepSummary(r, s, t, t, 0.0, 0.0, 0.0, 0.0) for r, t in times.items() for s in (1, 2, 3)]

    ref = rows({0: 100.0, 1: 100.0, 2: 100.0, 3: 100.0})
    now = rows({0: 110.0, 1: 150.0, 2: 90.0, 4: 500.0})
    assert pick_ranks(ref, now, ranks=[0, 1, 2, 3, 4], count=2) == [1, 0]  # 2 ties 0 at |10|: the lower rank
    assert pick_ranks(ref, now, ranks=[3, 4]) == []
    assert pick_ranks(ref, now, ranks=[0, 1], count=0) == []


def _comparison() -> dict:
    return {"changes": [{"component": "compute", "delta_s_per_step": 0.015, "detail": None},
                        {"component": "communication", "delta_s_per_step": 0.008, "detail": None},
                        {"component": "host", "delta_s_per_step": -0.004, "detail": None},
                        {"component": "software", "delta_s_per_step": None, "detail": "cann 8.2 -> 8.3"}],
            "components": [{"component": "compute", "delta_s_per_step": 0.015, "detail": None},
                           {"component": "host", "delta_s_per_step": -0.004, "detail": None}]}


def test_attach_detail_puts_the_largest_entries_moving_with_the_change() -> None:
    entries = [DetailEntry("compute", "operator", f"op{i}", 0.01, 0.01 + 0.001 * i) for i in range(1, 12)]
    entries += [DetailEntry("compute", "operator", "aten::faster", 0.01, 0.002),  # moved the other way
                DetailEntry("compute", "operator", "aten::tiny", 0.01, 0.01 + 0.0001),  # below 5 % of 15 ms
                DetailEntry("communication", "collective", "allreduce", 0.004, 0.012),
                DetailEntry("host", "operator", "never", 0.0, 0.1)]
    cmp = _comparison()
    put = attach_detail(cmp, entries, source="msprof-analyze compare", limit=8)
    compute = cmp["changes"][0]["detail"]
    assert [d["name"] for d in compute] == [f"op{i}" for i in range(11, 3, -1)]  # largest first, 8 kept
    assert compute[0]["delta_s_per_step"] == pytest.approx(0.011) and compute[0]["source"] == "msprof-analyze compare"
    assert set(compute[0]) >= {"name", "kind", "group", "delta_s_per_step", "baseline_s_per_step",
                               "now_s_per_step", "ranks"}
    assert [d["name"] for d in cmp["changes"][1]["detail"]] == ["allreduce"]
    assert cmp["changes"][2]["detail"] is None  # host: no operator owns idle device time
    assert cmp["changes"][3]["detail"] == "cann 8.2 -> 8.3"  # software keeps its text
    assert cmp["components"][0]["detail"] == compute and cmp["components"][1]["detail"] is None
    assert put == 9


def test_a_shrinking_change_is_explained_by_what_shrank() -> None:
    cmp = {"changes": [{"component": "compute", "delta_s_per_step": -0.010, "detail": None}]}
    attach_detail(cmp, [DetailEntry("compute", "operator", "aten::mm", 0.03, 0.02),
                        DetailEntry("compute", "operator", "aten::add", 0.01, 0.02)], source="s")
    assert [d["name"] for d in cmp["changes"][0]["detail"]] == ["aten::mm"]
    none = {"changes": [{"component": "compute", "delta_s_per_step": 0.01, "detail": None}]}
    assert attach_detail(none, [], source="s") == 0 and none["changes"][0]["detail"] is None


# 16 ranks, tensor 2 x data 2 x pipeline 4 in Megatron's default order: rank = stage * 4 + shard * 2 + slice
TP = {f"tp{i}": (2 * i, 2 * i + 1) for i in range(8)}
DP = {f"dp{s}{t}": (4 * s + t, 4 * s + 2 + t) for s in range(4) for t in range(2)}
PP = {f"pp{j}": tuple(range(j, 16, 4)) for j in range(4)}
GROUPS = {**TP, **DP, **PP}


def test_same_role_rank_shares_a_group_and_the_position_in_the_others() -> None:
    from profwatch.core.changes.comparison import same_role_rank

    # rank 5: stage 1, shard 0, slice 1. 4 (its tensor peer), 7 (its data peer) and 13 (stage 3) qualify; 4 is nearest
    q, why = same_role_rank(5, GROUPS, GROUPS, [0, 4, 7, 8, 12, 13]) or (None, "")
    assert q == 4 and "group of 2 ranks with it" in why and "same position" in why
    assert (same_role_rank(5, GROUPS, GROUPS, [7, 13]) or (None,))[0] == 7  # same stage beats another stage
    assert same_role_rank(5, GROUPS, GROUPS, [0, 2, 10]) is None  # 10 shares no group; 0, 2 sit elsewhere
    assert same_role_rank(5, {}, {}, [4]) is None  # no group known: no role
    only = {"g": (0, 1, 2, 3)}
    assert (same_role_rank(2, only, only, [0, 3]) or (None,))[0] == 3  # one group: its nearest member


def test_a_named_rank_missing_from_the_reference_is_compared_with_its_stand_in() -> None:
    from profwatch.core.changes.comparison import compare_captures

    def rows(times: dict[int, float]) -> list[RankStepSummary]:
        return [RankStepSummary(r, s, t + s, t + s, 0.0, 0.0, 0.0, 0.0) for r, t in times.items() for s in (1, 2, 3)]

    ref = rows({4: 100_000.0, 6: 100_000.0})
    now = rows({4: 100_000.0, 5: 150_000.0, 6: 100_000.0})
    got = compare_captures(ref, now, ranks=[5], substitutes={5: (4, "same role: ...")})
    assert got.ranks_compared == [5] and got.paired == {5: 4}
    assert got.changes[0].component == "compute" and got.changes[0].delta_s_per_step == pytest.approx(0.05)
    assert got.changes[0].basis == "rank 5 compared with reference rank 4 (same role: ...)"
    assert any("compared with reference rank 4" in n for n in got.notes)
    assert got.to_json()["paired"] == {"5": 4} and got.to_json()["changes"][0]["basis"].startswith("rank 5")
    plain = compare_captures(ref, now, ranks=[5])  # no stand-in: not compared, and said so
    assert plain.ranks_compared == [] and any("no reference rank has the same role" in n for n in plain.notes)
    same = compare_captures(ref, now, ranks=[4], substitutes={5: (4, "x")})  # the rank is in the reference
    assert same.paired == {} and all(c.basis is None for c in same.changes)
