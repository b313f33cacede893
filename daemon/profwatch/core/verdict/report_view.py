"""What the batch report shows: headline, graded suspects, own work against the peer median per rank and step (pure).

Input is the ``suspect_ranks`` event data (``profwatch.core.alerts.events.suspect_alert_data``, plus the optional
``impact``, ``links``, ``armed_steps``, ``captured_steps`` and ``suspects[i].evidence.strength`` /
``suspects[i].impact`` keys) and the per-(rank, step) rows behind it. Output is a :class:`ReportView` that the
report adapter renders; nothing here formats HTML or draws.

Definitions (all durations in ms here, from the µs rows of msprof-analyze ``ClusterTimeSummary`` or the Kineto
analyzer):

* own work ``W = computation + free``: the time a rank spends before it joins the step's collectives, what its
  peers wait for (the same ``W`` as :func:`profwatch.core.verdict.ranking.rank_suspects`).
* peer median: in each step, the median of ``W`` over the *other* ranks (leave-one-out, so a slow rank does not
  pull its own reference; this matters for 2-4 ranks).
* own-work difference: ``W - peer median`` per (rank, step) (the rank x step cells); per rank, the median of its
  ``W`` minus the median of its peer medians (the two figures shown beside it). The slow rank is the one with the
  large positive difference; every other rank sits near zero.
* wait caused: the median over steps of the peers' (leave-one-out) median wait minus the median of the rank's own
  wait, floored at 0 (msprof-analyze ``communicationWaitStageTime`` is own collective time minus the shortest one,
  so the rank the others wait for waits ~0 while they wait): how long each peer waits for this rank per step; the
  same two medians as the ranking's "peers wait A ms/step, it waits B ms".
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from statistics import median
from typing import Any, Literal

from profwatch.core.verdict.drilldown import delta_text, excess_text
from profwatch.core.verdict.evidence import RankStepSummary, hours_unit, usable_row
from profwatch.core.verdict.figures import figure_violations

Grade = Literal["strong", "weak"]
HeadlineState = Literal["found", "possible", "none", "unknown"]

STRONG_SCORE = 0.7
"""Without an explicit ``evidence.strength``, a suspect with at least this score is graded ``strong``."""
MIN_COLOUR_FRAC = 0.10
"""The colour scale spans at least +-10 % of the median step time, so a balanced cluster's noise stays pale."""
MAX_MATRIX_STEPS = 64
"""At most this many steps (the last ones) go into the rank x step view."""
_PATH = re.compile(r"(?<![\w.~<-])(?:/[^\s,;:'\"()<>/]+){2,}")
"""An absolute path of at least two segments (so ``</script>`` or ``GB/s`` is never taken for one)."""


@dataclass(frozen=True, slots=True)
class Impact:
    """Time a fix would give back: ``saving_s_per_step`` (s), ``saving_pct_of_step`` (%), hours per day in
    ``hours_unit`` (accelerator-hours, or CPU rank-hours for a job without accelerators: ``evidence.HOURS_UNITS``)."""

    saving_s_per_step: float
    saving_pct_of_step: float
    accelerator_hours_per_day: float
    hours_unit: str = "accelerator-hours"


@dataclass(frozen=True, slots=True)
class Headline:
    """The badge and one sentence at the top of the report."""

    state: HeadlineState
    badge: str
    sentence: str
    rank: int | None = None
    subject: str = ""
    """``rank 5 on node0 (compute)`` when a rank is named; ``sentence`` then says why."""


@dataclass(slots=True)
class RankRow:
    """One rank's medians over steps (ms); ``wait_caused_ms`` >= 0."""

    rank: int
    steps: int
    own_ms: float
    peer_own_ms: float
    own_delta_ms: float
    computation_ms: float
    free_ms: float
    wait_ms: float
    wait_caused_ms: float
    step_ms: float


@dataclass(slots=True)
class SuspectRow:
    """One suspect as the report shows it; ``position`` counts from 1 (best first)."""

    position: int
    rank: int
    score: float
    grade: Grade
    kind: str
    hostname: str | None
    summary: str
    rank_dir: str | None
    row: RankRow | None
    impact: Impact | None
    why: tuple[DetailItem, ...] = ()
    """The drill-down (``op_compare``): what the rank spends more on than its median peer, ms per step (``delta_ms``
    the excess, ``baseline_ms`` the peer's, ``now_ms`` the rank's), largest first."""
    why_source: str = ""

    @property
    def why_share(self) -> str:
        """How much of the rank's own-work excess over its peers (``row.own_delta_ms``, ms per step) the listed
        drill-down entries explain, when they explain less than :data:`WHY_EXPLAINS_MOST` of it (else ""): the
        entries are then not the cause on their own. Their sum counts only positive excesses (the rows are
        disjoint: docs/verdicts.md#drill-down)."""
        if not self.why or self.row is None or self.row.own_delta_ms <= 0:
            return ""
        explained = sum(d.delta_ms for d in self.why if d.delta_ms is not None and d.delta_ms > 0)
        total = self.row.own_delta_ms
        if explained >= WHY_EXPLAINS_MOST * total:
            return ""
        def size(ms: float) -> str:  # 2-3 significant digits, as every excess shown (drilldown.delta_text)
            return delta_text(ms * 1e3).lstrip("+")

        return (f"the entries listed explain {size(explained)} of the {size(total)}/step this rank's own work "
                f"exceeds its peers' by ({explained / total:.0%}); the other {size(total - explained)}/step is "
                "not in them: in smaller entries not listed, or in free time between its operators")


WHY_EXPLAINS_MOST = 0.5
"""Below this share of a suspect's own-work excess, the report says how little its drill-down explains."""


@dataclass(slots=True)
class StepMatrix:
    """Own-work difference per (step, rank) in ms: ``delta_ms[i][j]`` for ``steps[i]``, ``ranks[j]`` (None: no row)."""

    steps: list[int]
    ranks: list[int]
    delta_ms: list[list[float | None]]
    own_ms: list[list[float | None]]
    peer_ms: list[list[float | None]]
    dropped_steps: int = 0


@dataclass(frozen=True, slots=True)
class SlowLink:
    """A link reported slow: its two ranks, its communication group and bandwidths (GB/s)."""

    ranks: tuple[int, int]
    group: str
    bandwidth_gbps: float
    peer_median_gbps: float


@dataclass(frozen=True, slots=True)
class DetailItem:
    """One operator / kernel / collective / group behind a change (a ``detail`` entry, milliseconds per step)."""

    name: str
    kind: str
    group: str
    delta_ms: float | None
    baseline_ms: float | None
    now_ms: float | None

    @property
    def delta_text(self) -> str:
        """``delta_ms`` per step for people (``drilldown.excess_text``: ``+27 us/step``, ``+1.5 ms/step``), "-"
        when unknown."""
        return "-" if self.delta_ms is None else excess_text(1e3 * self.delta_ms)


@dataclass(frozen=True, slots=True)
class ComponentRow:
    """One component of the step, reference beside now (milliseconds per step; ``None`` where not measured).
    ``detail``: a text detail; ``items``: what is behind the change (``detail`` entries, ``docs/changes.md#detail``),
    ``items_source`` where they come from (tool and ranks)."""

    component: str
    baseline_ms: float | None
    now_ms: float | None
    delta_ms: float | None
    noise_ms: float | None
    share: float | None
    changed: bool
    detail: str = ""
    items: tuple[DetailItem, ...] = ()
    items_source: str = ""
    interval_ms: tuple[float, float] | None = None
    p_value: float | None = None

    @property
    def delta_text(self) -> str:
        """``delta_ms`` for people (``drilldown.delta_text``: ``+27 us``, ``+1.5 ms``), "-" when unknown."""
        return "-" if self.delta_ms is None else delta_text(1e3 * self.delta_ms)

    @property
    def interval_text(self) -> str:
        """``interval_ms`` as ``+12 us .. +41 us`` (each bound by ``drilldown.delta_text``), "-" when unknown."""
        if self.interval_ms is None:
            return "-"
        return f"{delta_text(1e3 * self.interval_ms[0])} .. {delta_text(1e3 * self.interval_ms[1])}"


@dataclass(frozen=True, slots=True)
class ChangesView:
    """What changed since the reference capture (the verdict's ``comparison``, ``docs/changes.md``), for the report:
    the step time and each timed component side by side, then software/hardware changes as text."""

    headline: str
    reference: str
    step: ComponentRow
    rows: list[ComponentRow]
    other: list[tuple[str, str]]
    ranks_text: str
    impact_hours_per_day: float | None
    notes: list[str]


def _ms(v: Any) -> float | None:
    x = _fnum(v)
    return None if x is None else 1e3 * x


def _detail_text(detail: Any) -> str:
    if isinstance(detail, str):
        return detail
    if isinstance(detail, list):
        parts = []
        for d in detail[:6]:
            if isinstance(d, Mapping):
                parts.append(", ".join(f"{k} {v}" for k, v in d.items() if v not in (None, "")))
            else:
                parts.append(str(d))
        return "; ".join(p for p in parts if p)
    return ""


def _detail_items(detail: Any) -> tuple[tuple[DetailItem, ...], str]:
    """The entries of a list ``detail`` (``profwatch.core.changes.detail.DetailEntry.to_json``) and their source text
    ("ranks 0, 1; msprof-analyze compare"); ``((), "")`` for anything else."""
    if not isinstance(detail, list):
        return (), ""
    items, source = [], ""
    for d in detail:
        if not isinstance(d, Mapping) or not d.get("name"):
            continue
        group = str(d.get("group") or "")
        items.append(DetailItem(str(d.get("name")), str(d.get("kind") or ""), "" if group == d.get("name") else group,
                                _ms(d.get("delta_s_per_step")), _ms(d.get("baseline_s_per_step")),
                                _ms(d.get("now_s_per_step"))))
        if not source:
            ranks = _int_list(d.get("ranks"))
            source = "; ".join(x for x in (f"ranks {step_list_text(ranks)}" if ranks else "",
                                           str(d.get("source") or "")) if x)
    return tuple(items), source


def parse_drilldown(raw: Any, rank: int) -> tuple[tuple[DetailItem, ...], str]:
    """The drill-down of ``rank`` from a verdict's ``op_compare`` (``core/verdict/drilldown.py``): its entries as
    :class:`DetailItem` (ms per step) and where they come from ("msprof-analyze compare against rank 3")."""
    for c in _list(raw):
        if not isinstance(c, Mapping) or c.get("rank") != rank:
            continue
        items = []
        for o in _list(c.get("ops")):
            if isinstance(o, Mapping):
                def ms(key: str, o: Mapping[str, Any] = o) -> float | None:
                    x = _fnum(o.get(key))
                    return None if x is None else x / 1e3
                items.append(DetailItem(str(o.get("name") or "?"), str(o.get("kind") or "operator"), "",
                                        ms("excess_us_per_step"), ms("reference_us_per_step"),
                                        ms("suspect_us_per_step")))
        return tuple(items), f"{c.get('source') or 'op totals'} against its median peer, rank {c.get('reference_rank')}"
    return (), ""


def _interval_ms(raw: Any) -> tuple[float, float] | None:
    if isinstance(raw, (list, tuple)) and len(raw) == 2:
        lo, hi = _ms(raw[0]), _ms(raw[1])
        if lo is not None and hi is not None:
            return lo, hi
    return None


def parse_comparison(raw: Any) -> ChangesView | None:
    """The report's view of a verdict's ``comparison`` (``None`` when there is none or it is not a mapping)."""
    if not isinstance(raw, Mapping):
        return None
    changes, components = _list(raw.get("changes")), _list(raw.get("components"))
    changed = {str(c.get("component")) for c in changes if isinstance(c, Mapping)}
    rows = []
    for c in components:
        if not isinstance(c, Mapping) or c.get("delta_s_per_step") is None and c.get("now_s_per_step") is None:
            continue
        comp = str(c.get("component") or "?")
        items, source = _detail_items(c.get("detail"))
        rows.append(ComponentRow(comp, _ms(c.get("baseline_s_per_step")), _ms(c.get("now_s_per_step")),
                                 _ms(c.get("delta_s_per_step")), _ms(c.get("noise_s_per_step")),
                                 _fnum(c.get("share")), comp in changed,
                                 "" if items else _detail_text(c.get("detail")), items, source,
                                 _interval_ms(c.get("interval_s_per_step")), _fnum(c.get("p_value"))))
    other = [(str(c.get("component") or "?"), _detail_text(c.get("detail")))
             for c in changes if isinstance(c, Mapping) and c.get("delta_s_per_step") is None]
    step = ComponentRow("step time", _ms(raw.get("step_time_baseline_s")), _ms(raw.get("step_time_now_s")),
                        _ms(raw.get("step_delta_s")), None, None, bool(raw.get("step_time_changed")),
                        interval_ms=_interval_ms(raw.get("step_time_interval_s")),
                        p_value=_fnum(raw.get("step_time_p_value")))
    ref = _mapping(raw.get("reference"))
    ref_steps = _int_list(ref.get("steps"))
    reference = " ".join(x for x in (str(ref.get("batch_id") or ""), f"({str(ref.get('path'))})" if ref.get("path")
                                     else "", f"steps {step_list_text(ref_steps)}" if ref_steps else "") if x)
    compared = _int_list(raw.get("ranks_compared"))
    ranks_text = f"{len(compared)} ranks in both captures" if compared else "no rank in both captures"
    for key, what in (("ranks_only_now", "only in this capture"), ("ranks_only_baseline", "only in the reference")):
        only = _int_list(raw.get(key))
        if only:
            ranks_text += f"; {len(only)} {what}: {step_list_text(only)}"
    hours = _fnum(raw.get("impact_accelerator_hours_per_day"))
    return ChangesView(str(raw.get("headline") or ""), reference or "-", step, rows, other, ranks_text, hours,
                       [str(n) for n in _list(raw.get("notes"))])


@dataclass(slots=True)
class ReportView:
    """Everything the report renders for one batch."""

    headline: Headline
    suspects: list[SuspectRow]
    ranks: list[RankRow]
    matrix: StepMatrix
    colour_limit_ms: float
    median_step_ms: float
    impact_total: Impact | None
    links: list[SlowLink]
    meta: list[tuple[str, str]]
    recipes: list[dict[str, Any]]
    files: list[tuple[str, str]]
    advisor_problems: list[tuple[str, str]]
    notes: list[str] = field(default_factory=list)
    changes: ChangesView | None = None


def loo_medians(values: Sequence[float]) -> list[float | None]:
    """Leave-one-out medians: ``out[i]`` = median of ``values`` without ``values[i]`` (None when nothing is left).

    O(n log n) (one sort), for 4096+ ranks per step.
    """
    n = len(values)
    if n < 2:
        return [None] * n
    order = sorted(range(n), key=values.__getitem__)
    srt = [values[i] for i in order]
    pos = [0] * n
    for p, i in enumerate(order):
        pos[i] = p
    m = n - 1

    def at(j: int, p: int) -> float:  # j-th smallest of the rest, the element at sorted position p removed
        return srt[j if j < p else j + 1]

    out: list[float | None] = []
    for i in range(n):
        p = pos[i]
        out.append(at(m // 2, p) if m % 2 else (at(m // 2 - 1, p) + at(m // 2, p)) / 2)
    return out


def measure_ranks(summaries: Sequence[RankStepSummary]) -> tuple[list[RankRow], StepMatrix, float]:
    """Per-rank rows, the rank x step own-work difference matrix and the median step time (ms).

    Steps with fewer than two usable ranks are left out (no peers to compare with). A rank's wait is left out of
    "wait caused" in a step where it communicates but its wait and transmit are both zero while other ranks have
    transmit time (zero-filled wait data, as in the ranking).
    """
    by_step: dict[int, dict[int, RankStepSummary]] = defaultdict(dict)
    for r in summaries:
        if usable_row(r):
            by_step[r.step][r.rank] = r
    steps_all = sorted(s for s, rows in by_step.items() if len(rows) >= 2)
    acc: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    cells: dict[tuple[int, int], tuple[float, float, float]] = {}
    step_times: list[float] = []
    for step in steps_all:
        rows = by_step[step]
        ranks = sorted(rows)
        own = [rows[k].computation_us + rows[k].free_us for k in ranks]
        ref = loo_medians(own)
        any_tx = any(r.transmit_us > 0 for r in rows.values())
        waits = {k: rows[k].wait_us for k in ranks if not (any_tx and rows[k].communication_us > 0
                                                           and rows[k].wait_us <= 0 and rows[k].transmit_us <= 0)}
        wait_keys = sorted(waits)
        wait_ref = dict(zip(wait_keys, loo_medians([waits[k] for k in wait_keys]), strict=True))
        step_times.append(median(r.step_time_us for r in rows.values()))
        for k, w, pm in zip(ranks, own, ref, strict=True):
            row, a = rows[k], acc[k]
            if pm is None:
                continue
            cells[(step, k)] = (w / 1e3, pm / 1e3, (w - pm) / 1e3)
            a["own"].append(w / 1e3)
            a["peer"].append(pm / 1e3)
            a["delta"].append((w - pm) / 1e3)
            for name, us in (("comp", row.computation_us), ("free", row.free_us), ("wait", row.wait_us),
                             ("step", row.step_time_us)):
                a[name].append(us / 1e3)
            wref = wait_ref.get(k)
            if wref is not None:
                a["peer_wait"].append(wref / 1e3)
                a["own_wait"].append(waits[k] / 1e3)
    # per rank: differences of medians, so each figure equals the two it is shown beside ("+D ms: X vs Y") and
    # the ranking's evidence line ("peers wait A ms/step, it waits B ms") gives the same A - B (docs/report.md)
    out = [RankRow(rank=k, steps=len(a["own"]), own_ms=median(a["own"]), peer_own_ms=median(a["peer"]),
                   own_delta_ms=median(a["own"]) - median(a["peer"]), computation_ms=median(a["comp"]),
                   free_ms=median(a["free"]), wait_ms=median(a["wait"]),
                   wait_caused_ms=max(0.0, median(a["peer_wait"]) - median(a["own_wait"])) if a["peer_wait"] else 0.0,
                   step_ms=median(a["step"]))
           for k, a in sorted(acc.items()) if a["own"]]
    keep = steps_all[-MAX_MATRIX_STEPS:]
    ranks_all = [r.rank for r in out]
    grid = [[cells.get((s, k)) for k in ranks_all] for s in keep]
    matrix = StepMatrix(steps=keep, ranks=ranks_all,
                        delta_ms=[[c[2] if c else None for c in line] for line in grid],
                        own_ms=[[c[0] if c else None for c in line] for line in grid],
                        peer_ms=[[c[1] if c else None for c in line] for line in grid],
                        dropped_steps=len(steps_all) - len(keep))
    return out, matrix, (median(step_times) / 1e3 if step_times else 0.0)


def parse_impact(raw: Any) -> Impact | None:
    """``{"saving_s_per_step", "saving_pct_of_step", "accelerator_hours_per_day"}`` -> :class:`Impact`; None when
    absent or when any value is missing or not a finite number."""
    if not isinstance(raw, Mapping):
        return None
    vals = []
    for key in ("saving_s_per_step", "saving_pct_of_step", "accelerator_hours_per_day"):
        v = raw.get(key)
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            return None
        vals.append(float(v))
    return Impact(vals[0], vals[1], vals[2], hours_unit=hours_unit(raw))


def saving_base_ms(imp: Impact | None) -> float | None:
    """The step time a saving is a share of (ms): the mean step time of the analysed steps (each step's median over
    the ranks), as the verdict's ``saving_pct_of_step`` has it (``core/verdict/impact.py``: ``impact_over_steps``);
    None without an impact or with a zero share. The page shows it beside the median step time, so the saving,
    its share and its base agree on the page as in the alerts (one figure, one name: "% of the mean step")."""
    if imp is None or not imp.saving_pct_of_step > 0:
        return None
    return 1e3 * imp.saving_s_per_step * 100.0 / imp.saving_pct_of_step


def grade_of(score: float, evidence: Mapping[str, Any]) -> Grade:
    """``evidence["strength"]`` when it says ``strong`` or ``weak``, else ``strong`` from :data:`STRONG_SCORE`."""
    strength = evidence.get("strength")
    if strength in ("strong", "weak"):
        return "strong" if strength == "strong" else "weak"
    return "strong" if score >= STRONG_SCORE else "weak"


def impact_text(imp: Impact) -> str:
    """``"24.1 ms/step (27% of the mean step), about 52 accelerator-hours per day"`` (the unit ``profwatch analyze``
    and the alerts use; ``CPU rank-hours`` for a job without accelerators)."""
    return (f"{1e3 * imp.saving_s_per_step:.1f} ms/step ({imp.saving_pct_of_step:.0f}% of the mean step), about "
            f"{imp.accelerator_hours_per_day:,.0f} {imp.hours_unit} per day")


def headline_of(status: str, detail: str, suspects: Sequence[SuspectRow]) -> Headline:
    """Badge: ``slow rank found`` (top suspect strong), ``possible slow rank`` (only weak suspects), ``no slow rank``
    (status ``no_suspect``) or ``could not judge: <why>`` (any other status)."""
    if suspects and status == "ok":
        top = suspects[0]
        subject = f"rank {top.rank}" + (f" on {top.hostname}" if top.hostname else "") + f" ({top.kind})"
        sentence = top.summary or "named by the ranking"
        if top.impact is not None:
            sentence += f". Fixing this rank alone saves {impact_text(top.impact)}"
        if top.grade == "strong":
            return Headline("found", "slow rank found", sentence, top.rank, subject)
        return Headline("possible", "possible slow rank (weak evidence)", sentence, top.rank, subject)
    if status == "no_suspect":
        return Headline("none", "no slow rank", detail or "every rank analysed; no rank stands out")
    why = detail or f"analysis status {status or 'unknown'}"
    return Headline("unknown", f"could not judge: {why}", why)


def _fnum(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    try:
        x = float(v)  # an int past the float range (a hand-edited 1e400 written as digits) raises OverflowError
    except OverflowError:
        return None
    return x if math.isfinite(x) else None


def parse_links(raw: Any) -> list[SlowLink]:
    """Top-level ``links`` entries ``{"ranks": [a, b], "group", "bandwidth_gbps", "peer_median_gbps"}``; entries
    that do not have that shape are skipped."""
    out = []
    for item in raw if isinstance(raw, list) else []:
        if not isinstance(item, Mapping):
            continue
        ranks = item.get("ranks")
        bw, ref = _fnum(item.get("bandwidth_gbps")), _fnum(item.get("peer_median_gbps"))
        if (not isinstance(ranks, list | tuple) or len(ranks) != 2 or not all(isinstance(r, int) for r in ranks)
                or bw is None or ref is None):
            continue
        out.append(SlowLink((int(ranks[0]), int(ranks[1])), str(item.get("group", "")), bw, ref))
    return out


def step_list_text(steps: Sequence[int]) -> str:
    """``[62, 63, 64, 70]`` -> ``"62-64, 70"``."""
    out: list[str] = []
    run: list[int] = []
    for s in sorted(set(steps)):
        if run and s == run[-1] + 1:
            run.append(s)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [s]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ", ".join(out)


def _int_list(raw: Any) -> list[int]:
    return [int(v) for v in raw if isinstance(v, int) and not isinstance(v, bool)] if isinstance(raw, list) else []


def shorten_paths(text: str, known: Mapping[str, str]) -> str:
    """Replace every absolute path in ``text`` by its file name (the Files section lists each path once)."""
    return _PATH.sub(lambda m: known.get(m.group(0).rstrip("."), m.group(0).rstrip(".").rsplit("/", 1)[-1])
                     + ("." if m.group(0).endswith(".") else ""), text)


def files_of(paths: Mapping[str, Any], texts: Sequence[str]) -> list[tuple[str, str]]:
    """``(label, path)`` for each distinct output path: the known ``paths`` keys first, then absolute paths that
    recipe details and notes mention (e.g. the advisor's xlsx), each path once."""
    labels = (("report_json", "report.json (all numbers)"), ("plotly_js", "the chart's script (plotly.js, shared)"),
              ("advisor_html", "advisor report (HTML)"),
              ("outputs", "analysis outputs"), ("staging", "staged batch"))
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    for key, label in labels:
        p = paths.get(key)
        if isinstance(p, str) and p and p not in seen:
            out.append((label, p))
            seen.add(p)
    for text in texts:
        for m in _PATH.finditer(text):
            p = m.group(0).rstrip(".")
            if p not in seen and "." in p.rsplit("/", 1)[-1]:
                ext, name = p.rsplit(".", 1)[-1], p.rsplit("/", 1)[-1]
                out.append((f"advisor report ({ext})" if "advisor" in name else f"{ext} output", p))
                seen.add(p)
    return out


def _list(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []


def _mapping(v: Any) -> Mapping[str, Any]:
    return v if isinstance(v, Mapping) else {}


def hardware_kinds(raw: Any) -> dict[int, str]:
    """rank -> ``"; AI Core 1200 MHz, peers 1800 MHz"`` for the ranks of a verdict's ``hardware`` list (their clock
    ran below their peers': ``profwatch.core.changes.hardware.below_peers``), appended to a suspect's kind so the
    headline and the suspects table say the cause; malformed entries are skipped."""
    out: dict[int, str] = {}
    for h in raw if isinstance(raw, list) else []:
        if not isinstance(h, Mapping) or not isinstance(h.get("rank"), int):
            continue
        mhz, peers = _fnum(h.get("mean_mhz")), _fnum(h.get("peers_mhz"))
        if mhz is not None and peers is not None:
            out[int(h["rank"])] = f"; AI Core {mhz:.0f} MHz, peers {peers:.0f} MHz (hardware)"
    return out


def build_view(data: Mapping[str, Any], summaries: Sequence[RankStepSummary], *,
               generated: str = "") -> ReportView:
    """The whole report's content for one batch; never raises on missing optional keys."""
    ranks, matrix, step_ms = measure_ranks(summaries)
    valid, suspects = _suspect_rows(data, {r.rank: r for r in ranks})
    status, detail = str(data.get("status") or ""), str(data.get("detail") or "")
    recipes, files, notes = _recipes_files_notes(data)
    advisor = _mapping(data.get("advisor"))
    problems = list(dict.fromkeys((str(p.get("category") or ""), str(p.get("description") or ""))
                                  for p in advisor.get("problems") or [] if isinstance(p, Mapping)))[:12]
    total = parse_impact(data.get("impact"))
    base = saving_base_ms(total or next((s.impact for s in suspects if s.impact is not None), None))
    meta = _meta_rows(data, len(ranks), step_ms, matrix.steps, notes, generated, base)
    if matrix.dropped_steps:
        notes.append(f"rank x step view shows the last {len(matrix.steps)} of "
                     f"{len(matrix.steps) + matrix.dropped_steps} steps (per-rank medians use all)")
    notes += [f"figure check: {v}" for v in figure_violations(summaries, ranks, valid)]  # docs/report.md
    cells = [abs(v) for line in matrix.delta_ms for v in line if v is not None]
    limit = max(max(cells, default=0.0), MIN_COLOUR_FRAC * step_ms, 1e-3)
    return ReportView(headline=headline_of(status, detail, suspects), suspects=suspects, ranks=ranks, matrix=matrix,
                      colour_limit_ms=limit, median_step_ms=step_ms,
                      impact_total=total,
                      links=parse_links(data.get("links")), meta=meta, recipes=recipes, files=files,
                      advisor_problems=problems, notes=notes, changes=parse_comparison(data.get("comparison")))


def _suspect_rows(data: Mapping[str, Any], by_rank: Mapping[int, Any]) -> tuple[list[Mapping[str, Any]], list[SuspectRow]]:
    """The well-formed suspects of ``report.json`` (ours always are; a hand-edited one may not be) and their rows,
    each kind followed by its clock finding when the hardware check named the rank, each saving as the verdict has
    it (its share is of the mean step: :func:`saving_base_ms`)."""
    valid = [s for s in data.get("suspects") or [] if isinstance(s, Mapping) and isinstance(s.get("rank"), int)
             and _fnum(s.get("score") or 0.0) is not None]
    clocks = hardware_kinds(data.get("hardware"))
    suspects: list[SuspectRow] = []
    for pos, s in enumerate(valid, start=1):
        ev = _mapping(s.get("evidence"))
        rank, score = int(s["rank"]), float(s.get("score") or 0.0)
        kind = str(s.get("kind") or "unknown") + clocks.get(rank, "")
        why, why_source = parse_drilldown(data.get("op_compare"), rank)
        suspects.append(SuspectRow(pos, rank, score, grade_of(score, ev), kind,
                                   s.get("hostname") or None, str(ev.get("summary") or ""), s.get("rank_dir"),
                                   by_rank.get(rank), parse_impact(s.get("impact")), why,
                                   why_source))
    return valid, suspects


def _recipes_files_notes(data: Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[tuple[str, str]], list[str]]:
    """The recipes table, the Files section and the notes, output paths in texts shortened to file names."""
    recipes_raw = _mapping(data.get("recipes"))
    notes_raw = list(dict.fromkeys(str(n) for n in data.get("notes") or []))
    texts = [str(r.get("detail") or "") for r in recipes_raw.values() if isinstance(r, Mapping)] + notes_raw
    files = files_of(_mapping(data.get("paths")), texts)
    names = {p: p.rsplit("/", 1)[-1] for _, p in files}
    recipes = [{"name": name, "status": str(r.get("status") or ""),
                "detail": shorten_paths(str(r.get("detail") or ""), names),
                "duration_s": _fnum(r.get("duration_s")) or 0.0, "log_tail": str(r.get("log_tail") or "")}
               for name, r in recipes_raw.items() if isinstance(r, Mapping)]
    # a note that only lists output files (e.g. "advisor report: a.xlsx, b.html") repeats the Files section
    notes = [shorten_paths(t, names) for t in notes_raw
             if not (_PATH.search(t) and re.fullmatch(r"[\w ()-]*:?[\s,.]*", _PATH.sub("", t)))]
    return recipes, files, notes


def _meta_rows(data: Mapping[str, Any], n_ranks: int, step_ms: float, matrix_steps: Sequence[int],
               notes: list[str], generated: str, base_ms: float | None = None) -> list[tuple[str, str]]:
    """The report's header rows (job, batch, ranks, steps, ...; ``base_ms``: the mean step time the savings are a
    share of, when there is a saving); a capture whose steps are not the armed ones puts that first in ``notes``."""
    world = data.get("world_size")
    meta = [("job", str(data.get("job_id") or "-")), ("batch", str(data.get("batch_id") or "-")),
            ("kind", str(data.get("kind") or "-")),
            ("ranks", f"{n_ranks} of {world}" if isinstance(world, int) and world != n_ranks else
             str(n_ranks or world or "-")),
            ("median step time", f"{step_ms:.1f} ms" if step_ms else "-")]
    if base_ms is not None:
        meta.append(("mean step time (the savings' base)", f"{base_ms:.1f} ms"))
    armed, captured = _int_list(data.get("armed_steps")), _int_list(data.get("captured_steps"))
    if captured or matrix_steps:
        meta.append(("steps", step_list_text(captured or matrix_steps)))
    if armed:
        meta.append(("armed steps", step_list_text(armed)))
        if captured and not set(armed) & set(captured):
            notes.insert(0, f"captured steps {step_list_text(captured)} are not the armed steps "
                            f"{step_list_text(armed)}")
    meta.append(("capture reason", str(data.get("capture_reason") or "-")))
    if generated:
        meta.append(("generated", generated))
    return meta
