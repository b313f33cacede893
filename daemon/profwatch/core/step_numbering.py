"""The two step numberings profwatch meets, and the one mapping between them (pure).

* **Step reports** (rankhook, the detector, ``profwatch status``): report ``k`` is sent by the k-th
  ``rankhook.step()`` call and measures the time since the previous call, i.e. the iteration that *ends* with call
  ``k``. The hook calls the capture backend (``dp.step()``) after measuring.
* **Trace labels** (``ProfilerStep#k`` in torch_npu and torch.profiler traces, ``start_step``, a capture's
  ``armed_steps`` and ``captured_steps``, ``profiler_info``'s ``steps``): torch_npu starts its profiler inside the
  ``start_step``-th ``dp.step()`` call, stops it (flush, online parse) inside call ``start_step + warmup + active``,
  and labels the iteration that runs *after* the k-th call ``ProfilerStep#k``, so it records
  ``ProfilerStep#S+warmup .. #S+warmup+active-1`` (verified against torch-npu 2.13.0: ``docs/conformance.md``,
  "Verified", item 2; rankhook's torch backend does the same with ``torch.profiler``).

Hence the iteration labelled ``ProfilerStep#k`` is the one rankhook reports as step ``k + 1``. Everything that
compares a capture window with step reports goes through this module; captures, verdicts and alerts keep trace
labels (they compare with the traces).
"""

from __future__ import annotations


def report_step_of_label(label: int) -> int:
    """The step report (rankhook numbering) that measured the iteration labelled ``ProfilerStep#label``."""
    return label + 1


def label_of_report_step(step: int) -> int:
    """The ``ProfilerStep#`` label of the iteration that step report ``step`` measured."""
    return step - 1


def profiled_report_steps(start_step: int, warmup: int, active: int) -> tuple[int, int]:
    """``(first, last)`` step reports (inclusive) whose measured time includes the profiler of a window armed at
    ``start_step`` with ``warmup`` + ``active`` steps: the start inside call ``S`` and the iterations
    ``ProfilerStep#S .. #S+warmup+active-1`` land in reports ``S+1 .. S+warmup+active``, the stop's flush inside
    call ``S+warmup+active`` in report ``S+warmup+active+1``.

    Raises:
        ValueError: ``warmup < 0`` or ``active < 1``.
    """
    if warmup < 0 or active < 1:
        raise ValueError(f"warmup must be >= 0 and active >= 1, got warmup={warmup} active={active}")
    return report_step_of_label(start_step), report_step_of_label(start_step + warmup + active)
