"""The one mapping between rankhook's step reports and ``ProfilerStep#k`` trace labels (daemon/profwatch/core/step_numbering.py),
checked against the facts it rests on: docs/conformance.md "Verified" item 2 (torch_npu starts inside ``dp.step()``
call S, labels the iteration after call k ``ProfilerStep#k``, records ``#S+warmup .. #S+warmup+active-1`` and stops
inside call S+warmup+active) and rankhook's hook (report k is sent by call k and measures the time since call k-1)."""

from __future__ import annotations

import pytest

from profwatch.core.step_numbering import label_of_report_step, profiled_report_steps, report_step_of_label


def _report_measuring(call_after: int) -> int:
    """rankhook: the iteration that runs after ``step()`` call k ends with call k+1, whose report is k+1."""
    return call_after + 1


@pytest.mark.parametrize("label", [0, 1, 7, 130, 10**9])
def test_label_k_is_the_iteration_reported_as_step_k_plus_1_and_back(label: int) -> None:
    assert report_step_of_label(label) == _report_measuring(label) == label + 1
    assert label_of_report_step(report_step_of_label(label)) == label


@pytest.mark.parametrize(("start", "warmup", "active"), [(1, 0, 1), (130, 1, 2), (40, 2, 5), (10**6, 0, 10)])
def test_profiled_reports_cover_start_recorded_steps_and_the_stop_flush(start: int, warmup: int, active: int) -> None:
    first, last = profiled_report_steps(start, warmup, active)
    recorded = range(start + warmup, start + warmup + active)  # ProfilerStep# labels in the trace
    assert first == _report_measuring(start)  # the first iteration after the start inside call S
    assert {report_step_of_label(k) for k in recorded} <= set(range(first, last + 1))
    assert last == _report_measuring(start + warmup + active)  # the stop (flush, parse) inside call S+w+a
    assert last - first + 1 == warmup + active + 1


@pytest.mark.parametrize(("warmup", "active"), [(-1, 2), (0, 0), (1, -3)])
def test_an_impossible_window_is_refused(warmup: int, active: int) -> None:
    with pytest.raises(ValueError, match="warmup must be >= 0 and active >= 1"):
        profiled_report_steps(10, warmup, active)
