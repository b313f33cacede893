"""What is behind each change since the reference: operators, kernels, collectives (pure).

The enrich phase compares one or two ranks of a regression's capture with the same ranks of the reference
(``docs/changes.md#detail``): on Ascend with ``msprof-analyze compare`` (its result workbook, read into
:data:`Sheets` by ``daemon/profwatch/changes/msprof_compare.py``), on torch.profiler captures with the
per-operator totals of both traces (``kineto_reader.op_totals``). This module turns either into
:class:`DetailEntry` rows (seconds per step, now minus reference), averages them over the compared ranks and puts
the largest of them into the ``detail`` of the ``compute`` and ``communication`` changes of a verdict's
``comparison``.

Sheets read (msprof-analyze 26.2.0 ``compare_tools``, headers of ``compare_backend/utils/excel_config.py``; each
sheet: a title row naming the two profilings, an empty row, a header row, data rows; the reference
("Base Profiling") columns come before the regression's ("Comparison Profiling") where a header repeats):

* ``OperatorCompareStatistic``: per top-level operator ``Base Device Duration(ms)`` / ``Comparison Device
  Duration(ms)`` (device time of its kernels, summed over the capture) -> ``kind`` ``operator``, component
  ``compute``; step markers (``ProfilerStep#N``, ``kineto.is_step_marker``), which the tool lists as operators
  when they are not at the top of the op tree, are left out: their time is the whole step's;
* ``KernelCompare``: per kernel type and input shapes ``Total Duration(us)`` (twice) -> ``kind`` ``kernel``,
  summed over the shapes, component ``compute`` (used only when the operator sheet has no row: a capture
  without host operators);
* ``CommunicationCompare``: per collective type (``allreduce``, ...) ``Total Duration(us)`` (twice; its task rows,
  whose name cell is ``|``, are skipped) -> ``kind`` ``collective``, component ``communication`` (the
  collective's whole duration, overlapped or not);
* ``OverallMetrics``: the rows under ``Uncovered Communication Time`` indented by one tab are the communication
  groups (the raw HCCL group name), ``Duration(ms)`` twice -> ``kind`` ``group``, component ``communication``
  (communication not overlapped with computation, the quantity of the ``communication`` change).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from statistics import median
from typing import Any

from profwatch.core.verdict.evidence import RankStepSummary
from profwatch.core.verdict.kineto import is_step_marker

Sheets = Mapping[str, Sequence[Sequence[Any]]]
"""Sheet name -> rows, each row the cells from column A on (None for an empty cell; numbers as float)."""

DETAIL_LIMIT = 8
"""Entries kept in one change's ``detail``."""
DETAILED_COMPONENTS = ("compute", "memory", "communication")
"""The components a detail can be found for (``host`` time is idle device time: no operator owns it)."""
MIN_DETAIL_FRAC = 0.05
"""An entry whose |delta| is below this share of its change's |delta| is left out (noise of the per-op sums)."""


@dataclass(frozen=True, slots=True)
class DetailEntry:
    """One operator / kernel / collective / group, seconds per step on one rank (or the mean over ranks)."""

    component: str
    kind: str
    name: str
    baseline_s_per_step: float
    now_s_per_step: float
    group: str | None = None
    ranks: tuple[int, ...] = ()

    @property
    def delta_s_per_step(self) -> float:
        return self.now_s_per_step - self.baseline_s_per_step

    def to_json(self) -> dict[str, Any]:
        """``{"name", "kind", "group", "delta_s_per_step", "baseline_s_per_step", "now_s_per_step", "ranks"}``
        (seconds, rounded to the microsecond)."""
        return {"name": self.name, "kind": self.kind, "group": self.group,
                "delta_s_per_step": round(self.delta_s_per_step, 6),
                "baseline_s_per_step": round(self.baseline_s_per_step, 6),
                "now_s_per_step": round(self.now_s_per_step, 6), "ranks": list(self.ranks)}


def _num(x: Any) -> float | None:
    if isinstance(x, bool):
        return None
    if isinstance(x, (int, float)):
        return float(x) if math.isfinite(float(x)) else None
    try:
        v = float(str(x))
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _table(rows: Sequence[Sequence[Any]], key: str) -> tuple[list[str], list[Sequence[Any]]]:
    """The header (the first row with a cell ``key``) and the rows below it; ``([], [])`` without one."""
    for i, row in enumerate(rows):
        if any(isinstance(c, str) and c.strip() == key for c in row):
            return [str(c).strip() if c is not None else "" for c in row], list(rows[i + 1:])
    return [], []


def _cols(header: Sequence[str], name: str) -> list[int]:
    return [i for i, h in enumerate(header) if h == name]


def _cell(row: Sequence[Any], i: int | None) -> Any:
    return row[i] if i is not None and 0 <= i < len(row) else None


def entries_from_compare(sheets: Sheets, *, steps_baseline: int, steps_now: int) -> list[DetailEntry]:
    """The entries of one ``msprof-analyze compare`` workbook (one rank against its reference rank; module
    docstring), per step: each capture's totals divided by its own step count.

    Raises:
        ValueError: a step count below 1.
    """
    if steps_baseline < 1 or steps_now < 1:
        raise ValueError("step counts must be >= 1")
    nb, nn = float(steps_baseline), float(steps_now)
    out: list[DetailEntry] = []
    head, rows = _table(sheets.get("OperatorCompareStatistic", ()), "Operator Name")
    if head:
        name_i = head.index("Operator Name")
        b_i = next(iter(_cols(head, "Base Device Duration(ms)")), None)
        c_i = next(iter(_cols(head, "Comparison Device Duration(ms)")), None)
        for row in rows:
            name = _cell(row, name_i)
            if not isinstance(name, str) or not name.strip() or is_step_marker(name):
                continue  # a step marker (ProfilerStep#N) is the whole step, not an operator
            b, c = _num(_cell(row, b_i)) or 0.0, _num(_cell(row, c_i)) or 0.0
            out.append(DetailEntry("compute", "operator", name.strip(), b / 1e3 / nb, c / 1e3 / nn))
    if not out:
        head, rows = _table(sheets.get("KernelCompare", ()), "Kernel")
        totals = _cols(head, "Total Duration(us)")
        if head and len(totals) >= 2:
            sums: dict[str, list[float]] = {}
            name_i = head.index("Kernel")
            for row in rows:
                name = _cell(row, name_i)
                if isinstance(name, str) and name.strip() and not is_step_marker(name):
                    acc = sums.setdefault(name.strip(), [0.0, 0.0])
                    acc[0] += _num(_cell(row, totals[0])) or 0.0
                    acc[1] += _num(_cell(row, totals[1])) or 0.0
            out += [DetailEntry("compute", "kernel", k, b / 1e6 / nb, c / 1e6 / nn) for k, (b, c) in sums.items()]
    out += _communication_entries(sheets, nb, nn)
    return out


def _communication_entries(sheets: Sheets, nb: float, nn: float) -> list[DetailEntry]:
    """The workbook's collectives (``CommunicationCompare``, summed by name) and its per-group uncovered
    communication (``OverallMetrics``), per step (``nb``/``nn``: each capture's step count)."""
    out: list[DetailEntry] = []
    head, rows = _table(sheets.get("CommunicationCompare", ()), "Communication OP Name")
    names, totals = _cols(head, "Communication OP Name"), _cols(head, "Total Duration(us)")
    if len(names) >= 2 and len(totals) >= 2:
        coll: dict[str, list[float]] = {}
        for row in rows:
            name = next((str(n).strip() for n in (_cell(row, names[0]), _cell(row, names[1]))
                         if isinstance(n, str) and n.strip() and n.strip() != "|"), "")
            if not name:
                continue  # a task row (name cell "|") or an empty one
            acc = coll.setdefault(name, [0.0, 0.0])
            acc[0] += _num(_cell(row, totals[0])) or 0.0
            acc[1] += _num(_cell(row, totals[1])) or 0.0
        out += [DetailEntry("communication", "collective", k, b / 1e6 / nb, c / 1e6 / nn)
                for k, (b, c) in coll.items()]
    head, rows = _table(sheets.get("OverallMetrics", ()), "Index")
    durs = _cols(head, "Duration(ms)")
    if head and len(durs) >= 2:
        idx = head.index("Index")
        inside = False
        for row in rows:
            label = _cell(row, idx)
            if not isinstance(label, str):
                continue
            if not label.startswith("\t"):
                inside = label.strip() == "Uncovered Communication Time"
            elif inside and not label.startswith("\t\t") and label.strip():
                b, c = _num(_cell(row, durs[0])) or 0.0, _num(_cell(row, durs[1])) or 0.0
                out.append(DetailEntry("communication", "group", label.strip(), b / 1e3 / nb, c / 1e3 / nn,
                                       group=label.strip()))
    return out


def entries_from_op_totals(now_us: Mapping[str, float], baseline_us: Mapping[str, float], *, steps_now: int,
                           steps_baseline: int, is_collective: Callable[[str], bool],
                           kinds: Mapping[str, str] | None = None) -> list[DetailEntry]:
    """The entries of a torch.profiler rank against its reference rank: op / kernel name -> total duration (µs)
    over each trace's step windows (``kineto_reader.op_totals``), per step; a name ``is_collective`` says is a
    collective is ``communication`` (``kind`` ``collective``), any other ``compute`` (``kind`` ``operator``).
    The totals are exclusive (``kineto_reader.op_totals_by_kind``: a CPU op's self time, without its child CPU
    ops), so the entries' excesses add up and never count one interval twice; step markers
    (``kineto.is_step_marker``: ``ProfilerStep#N``) are left out.

    ``kinds`` (name -> ``kernel`` / ``memory`` / ``operator``, ``kineto_reader.op_totals_by_kind``): when a
    capture has device work, the device explains the device-side changes: kernels are ``compute`` (``kind``
    ``kernel``), copies and fills ``memory`` (``kind`` ``memory``), collective kernels ``communication``, and
    host operators are left out (their time is the host's, often waiting for the device: ``aten::item``).

    Raises:
        ValueError: a step count below 1.
    """
    if steps_baseline < 1 or steps_now < 1:
        raise ValueError("step counts must be >= 1")
    device = bool(kinds) and any(k in ("kernel", "memory") for k in (kinds or {}).values())
    out = []
    for name in sorted(set(now_us) | set(baseline_us)):
        if is_step_marker(name):
            continue
        kind = (kinds or {}).get(name, "operator")
        if device and kind == "operator":
            continue
        coll = is_collective(name)
        comp, k = (("communication", "collective") if coll else ("memory", "memory") if kind == "memory"
                   else ("compute", "kernel") if kind == "kernel" else ("compute", "operator"))
        out.append(DetailEntry(comp, k, name,
                               baseline_us.get(name, 0.0) / 1e6 / steps_baseline,
                               now_us.get(name, 0.0) / 1e6 / steps_now))
    return out


def merge_ranks(per_rank: Mapping[int, Sequence[DetailEntry]]) -> list[DetailEntry]:
    """The mean over the compared ranks of each (component, kind, name, group); a rank whose comparison lacks an
    entry counts it as 0 on both sides (it ran no such operator). ``ranks`` lists the ranks merged."""
    ranks = tuple(sorted(per_rank))
    if not ranks:
        return []
    acc: dict[tuple[str, str, str, str | None], list[float]] = {}
    for entries in per_rank.values():
        for e in entries:
            a = acc.setdefault((e.component, e.kind, e.name, e.group), [0.0, 0.0])
            a[0] += e.baseline_s_per_step
            a[1] += e.now_s_per_step
    n = float(len(ranks))
    return [DetailEntry(c, k, name, b / n, v / n, group=g, ranks=ranks) for (c, k, name, g), (b, v) in acc.items()]


def pick_ranks(baseline: Sequence[RankStepSummary], now: Sequence[RankStepSummary], *, ranks: Sequence[int],
               count: int = 2) -> list[int]:
    """Up to ``count`` of ``ranks`` whose median step time changed most since the reference (by |now - reference|,
    ties by rank); a rank missing from either capture is never picked."""
    def med(rows: Sequence[RankStepSummary]) -> dict[int, float]:
        by: dict[int, list[float]] = {}
        for r in rows:
            by.setdefault(r.rank, []).append(r.step_time_us)
        return {k: median(v) for k, v in by.items()}

    a, b = med(baseline), med(now)
    both = [r for r in ranks if r in a and r in b]
    return sorted(both, key=lambda r: (-abs(b[r] - a[r]), r))[:max(0, count)]


def attach_detail(comparison: dict[str, Any], entries: Sequence[DetailEntry], *, source: str,
                  limit: int = DETAIL_LIMIT, min_frac: float = MIN_DETAIL_FRAC) -> int:
    """Put the entries behind each timed ``compute`` / ``memory`` / ``communication`` change of ``comparison`` (the
    ``Comparison.to_json`` dict, mutated: its ``changes`` and the same component in ``components``) into its
    ``detail``: those moving the same way as the change, by |delta| descending, at most ``limit``, none below
    ``min_frac`` of the change's |delta|, each :meth:`DetailEntry.to_json` plus ``source``. A change whose
    detail is already set (software) is left alone; a change with no entry gets none. Returns the entries put."""
    put = 0
    by_comp: dict[str, list[dict[str, Any]]] = {}
    for ch in comparison.get("changes", []):
        comp, delta = ch.get("component"), ch.get("delta_s_per_step")
        if comp not in DETAILED_COMPONENTS or not isinstance(delta, (int, float)) or delta == 0 \
                or ch.get("detail") is not None:
            continue
        sign = 1.0 if delta > 0 else -1.0
        rows = [e for e in entries if e.component == comp and sign * e.delta_s_per_step > 0
                and abs(e.delta_s_per_step) >= min_frac * abs(delta)]
        rows.sort(key=lambda e: (-abs(e.delta_s_per_step), e.kind, e.name))
        detail = [{**e.to_json(), "source": source} for e in rows[:max(0, limit)]]
        if detail:
            ch["detail"] = detail
            by_comp[comp] = detail
            put += len(detail)
    for ch in comparison.get("components", []):
        if ch.get("component") in by_comp and ch.get("detail") is None:
            ch["detail"] = by_comp[ch["component"]]
    return put

