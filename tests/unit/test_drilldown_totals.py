"""The drill-down's per-operator totals (adapters/tools/kineto_reader.py ``op_totals_by_kind``,
core/changes/detail.py): step markers are not operators, and nested CPU ops are counted by self time so the
listed excesses add up to no more than the gap between the ranks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from profwatch.adapters.tools.kineto_reader import compare_suspects, op_totals_by_kind, write_torch_trace
from profwatch.core.changes.detail import entries_from_compare
from profwatch.core.verdict.kineto import is_step_marker


def _op(name: str, ts: float, dur: float, cat: str = "cpu_op", tid: int = 1) -> dict[str, Any]:
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 10, "tid": tid}


def _rank(root: Path, rank: int, mm_us: float, tanh_us: float, steps: int = 3) -> Path:
    """Each step: ProfilerStep#N > aten::matmul > aten::mm (mm_us), then aten::tanh (tanh_us), host only."""
    evs, t = [], 0.0
    for s in range(steps):
        step = 100 + mm_us + tanh_us + 300
        evs.append(_op(f"ProfilerStep#{s + 1}", t, step, cat="user_annotation"))
        evs.append(_op(f"ProfilerStep#{s + 1}", t + 1, step - 2))  # torch_npu also writes it as a cpu_op
        evs.append(_op("aten::matmul", t + 10, mm_us + 50))
        evs.append(_op("aten::mm", t + 20, mm_us))
        evs.append(_op("aten::tanh", t + 100 + mm_us, tanh_us))
        t += step + 10
    d = root / f"rank{rank}"
    d.mkdir(parents=True)
    write_torch_trace(d / f"r{rank}.pt.trace.json", rank, 2, evs)
    return d


def test_cpu_ops_count_by_self_time_and_step_markers_are_left_out(tmp_path: Path) -> None:
    d = _rank(tmp_path, 0, mm_us=1000, tanh_us=200)
    totals, windows = op_totals_by_kind(next(d.iterdir()))
    assert windows == 3
    assert totals[("operator", "aten::mm")] == pytest.approx(3000)
    assert totals[("operator", "aten::matmul")] == pytest.approx(150)  # 50 µs a step outside aten::mm
    assert totals[("operator", "aten::tanh")] == pytest.approx(600)
    assert not any(is_step_marker(name) for _, name in totals)


def test_listed_excesses_never_exceed_the_gap(tmp_path: Path) -> None:
    dirs = {0: _rank(tmp_path, 0, mm_us=1000, tanh_us=200), 1: _rank(tmp_path, 1, mm_us=3000, tanh_us=600)}
    out, status = compare_suspects(dirs, [1], 0)
    assert status.status == "ok", status
    ops = {o["name"]: o["excess_us_per_step"] for o in out[0]["ops"]}
    assert ops["aten::mm"] == pytest.approx(2000) and ops["aten::tanh"] == pytest.approx(400)
    assert "aten::matmul" not in ops  # its own 50 µs did not change; the child's 2 ms is not counted twice
    assert not any(is_step_marker(n) for n in ops)
    assert sum(ops.values()) <= 2400 + 1e-6  # the step-time gap


def test_msprof_compare_step_marker_rows_are_not_operators() -> None:
    sheets = {"OperatorCompareStatistic": [
        [None, None, "Base", None, "Comparison"], [],
        ["Top", "Operator Name", "Base Device Duration(ms)", "Base Operator Number",
         "Comparison Device Duration(ms)", "Comparison Operator Number", "Diff Duration(ms)", "Diff Ratio"],
        [1.0, "ProfilerStep#63", 124.03, 1.0, 289.55, 1.0, 165.52, 2.33],
        [2.0, "aten::matmul", 90.0, 36.0, 135.0, 36.0, 45.0, 1.5],
    ]}
    names = {e.name for e in entries_from_compare(sheets, steps_baseline=1, steps_now=1)}
    assert names == {"aten::matmul"}


@pytest.mark.parametrize("name", ["ProfilerStep#63", "ProfilerStep*", "ProfilerStep#0", "Iteration#2", "step 7",
                                  "train_step_4"])
def test_step_markers(name: str) -> None:
    assert is_step_marker(name)


@pytest.mark.parametrize("name", ["aten::mm", "Optimizer.step#SGD.step", "MatMul", "stepper", "aten::step"])
def test_operators_are_not_step_markers(name: str) -> None:
    assert not is_step_marker(name)


def test_used_steps_are_the_verdicts_usable_steps_in_each_ranks_own_labels() -> None:
    from profwatch.core.verdict.evidence import RankStepSummary, used_steps

    rows = [RankStepSummary(0, s, 1000.0, 600.0, 100.0, 0.0, 100.0, 300.0) for s in (1, 2)]
    rows += [RankStepSummary(1, s, 1000.0, 600.0, 100.0, 0.0, 100.0, 300.0) for s in (1, 2)]
    rows += [RankStepSummary(0, 3, 49.0, 0.0, 0.0, 0.0, 0.0, 49.0),  # truncated: no work, as usable_row says
             RankStepSummary(1, 3, 49.0, 0.0, 0.0, 0.0, 0.0, 49.0)]
    # rank 1's counter started at 5: its ProfilerStep#5-7 are the verdict's steps 1-3
    labels = {0: {1: 1, 2: 2, 3: 3}, 1: {5: 1, 6: 2, 7: 3}}
    assert used_steps(rows, labels) == {0: {1, 2}, 1: {5, 6}}
    assert used_steps(rows) == {0: {1, 2}, 1: {1, 2}}  # Ascend: the steps are the ranks' own


def test_an_excess_below_a_millisecond_is_not_shown_as_zero() -> None:
    """The drill-down's line (alert ``why``, recipe detail, ``profwatch analyze``): the MI250 trace's excesses are
    19 and 4.4 us/step, which read "+0.0 ms/step" before."""
    from profwatch.core.verdict.drilldown import drilldown_text, excess_text

    assert [excess_text(us) for us in (30_100.0, 1_000.0, 150.0, 40.0, 4.4, -19.08)] == [
        "+30.1 ms/step", "+1.0 ms/step", "+0.15 ms/step", "+40 us/step", "+4.4 us/step", "-19 us/step"]
    item = {"rank": 3, "reference_rank": 0, "ops": [{"name": "Memcpy HtoD (Host -> Device)", "excess_us_per_step": 19.081},
                                                    {"name": "aten::mm", "excess_us_per_step": 9_000.0}]}
    assert drilldown_text(item) == ("rank 3: Memcpy HtoD (Host -> Device) +19 us/step, aten::mm +9.0 ms/step over its "
                                    "median peer (rank 0)")


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_delta_text_never_prints_nan_or_inf(bad: float) -> None:
    """A non-finite difference is ``unknown`` ("+nan us" was printed), and so per step."""
    from profwatch.core.verdict.drilldown import delta_text, excess_text
    assert delta_text(bad) == "unknown"
    assert excess_text(bad) == "unknown/step"
