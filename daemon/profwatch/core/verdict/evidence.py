"""Shared analysis dataclasses: what msprof-analyze and the Kineto analyzer produce, what ranking consumes (pure).

Units: every duration here is in microseconds (``_us``), the unit of msprof-analyze's ``ClusterTimeSummary``
(Ascend/msprof-analyze, recipe ``cluster_analyse/recipes/cluster_time_summary``; docs/verdicts.md). Kineto traces
are in microseconds too.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from profwatch.core.verdict.link_rows import LinkRows

if TYPE_CHECKING:
    from profwatch.core.changes.hardware import FreqSummary

RecipeState = Literal["ok", "not_applicable", "no_data", "tool_error", "timeout", "oom", "skipped", "cancelled"]
RecipePhase = Literal["alert", "enrich"]
SuspectKind = Literal["compute", "communication", "host", "unknown"]
EvidenceKind = Literal["ascend_pt", "torch_pt"]
Strength = Literal["strong", "weak"]


@dataclass(frozen=True, slots=True)
class RankStepSummary:
    """Time breakdown of one step on one rank (all microseconds).

    ``wait_us`` is time spent in collectives waiting for peers (msprof-analyze ``communicationWaitStageTime``:
    own duration minus the shortest duration of the same collective across ranks); ``transmit_us`` is the rest
    of the collective time. The rank the others wait for has ``wait_us`` close to 0.
    """

    rank: int
    step: int
    step_time_us: float
    computation_us: float
    communication_us: float
    wait_us: float
    transmit_us: float
    free_us: float
    memory_us: float = 0.0
    """Part of ``computation_us`` spent in device memory copies and fills (Kineto ``gpu_memcpy``/``gpu_memset``)
    not overlapped by compute kernels; 0 where the source does not split it (msprof-analyze). The comparison
    with a reference reports it apart (``memory``), as HTA's TraceDiff does; the ranking keeps it in computation."""


MAX_ROW_US = 7 * 86400e6
"""Largest magnitude (µs) of a time field of a usable row: a week, the longest step the coordinator accepts
(``profwatch.core.messages.MAX_STEP_TIME_S``). Past it a value is a unit or parsing error, and its square (the
within-rank variance) would overflow a float."""


def row_in_bounds(row: RankStepSummary) -> bool:
    """Whether every time field of ``row`` is finite and at most :data:`MAX_ROW_US` in magnitude."""
    return all(math.isfinite(v) and abs(v) <= MAX_ROW_US
               for v in (row.step_time_us, row.computation_us, row.communication_us, row.wait_us, row.transmit_us,
                         row.free_us, row.memory_us))


def usable_row(row: RankStepSummary) -> bool:
    """Whether a row carries a signal (the one rule the ranking, the report's rank table and ``ranks[]`` share):
    False for a row msprof-analyze zero-filled (step -1, or no step time and no work) and for a step without
    computation and communication: a truncated last step (the profiler stopped while its kernels were not yet
    recorded: HTA's AMD MI250 trace has a 49 us ``ProfilerStep#2`` with no device work beside a 1,031 us step),
    and for a row with a non-finite (NaN or infinite) time field or one beyond :data:`MAX_ROW_US`
    (:func:`row_in_bounds`), which no mean, test or ranking can use."""
    if not row_in_bounds(row):
        return False
    busy = row.computation_us + row.communication_us + row.free_us
    return not (row.step < 0 or (row.step_time_us <= 0 and busy <= 0) or
                (row.computation_us <= 0 and row.communication_us <= 0))


def used_steps(summaries: Iterable[RankStepSummary],
               step_labels: Mapping[int, Mapping[int, int]] | None = None) -> dict[int, set[int]]:
    """rank -> the steps the verdict used (its rows that pass :func:`usable_row`), as the rank's own step labels
    (``ProfilerStep#N``) when ``step_labels`` maps them (``ClusterEvidence.step_labels``: rank -> {own label:
    the verdict's step}), else as the verdict's steps. What per-operator totals of a rank must cover to speak of
    the same steps as the verdict (a truncated last step is in the trace but not in the verdict). A rank without
    usable rows is absent."""
    out: dict[int, set[int]] = {}
    own: dict[int, dict[int, set[int]]] = {}
    for rank, labels in (step_labels or {}).items():
        for label, step in labels.items():
            own.setdefault(rank, {}).setdefault(step, set()).add(label)
    for row in summaries:
        if usable_row(row):
            out.setdefault(row.rank, set()).update(own[row.rank].get(row.step, ())
                                                   if row.rank in own else (row.step,))
    return out


@dataclass(slots=True)
class RecipeStatus:
    """Outcome of one analysis recipe (an msprof-analyze command or the Kineto analyzer).

    ``status``: ``ok`` (expected table present with expected rows), ``not_applicable`` (the data cannot
    answer this recipe, e.g. groups under 4 ranks for slow_rank), ``no_data``, ``tool_error`` (with
    ``log_tail``), ``timeout``, ``oom`` (killed at the memory cap of its whole process group), ``skipped``.
    ``duration_s``: wall seconds of the run; ``phase``: ``alert`` (the verdict waits for it) or ``enrich`` (runs
    after the verdict is published, ``analysis_enriched``); ``peak_rss_bytes``: the highest resident memory of
    the tool's process group seen by the memory watchdog (None when not measured).
    """

    name: str
    status: RecipeState
    detail: str = ""
    tables: list[str] = field(default_factory=list)
    rows: int = 0
    output_dir: str | None = None
    log_tail: str = ""
    duration_s: float = 0.0
    returncode: int | None = None
    phase: RecipePhase = "alert"
    peak_rss_bytes: int | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class ClusterEvidence:
    """Everything an analysis learned about one batch, keyed by rank.

    ``slow_rank_votes``: rank -> msprof-analyze ``SlowRank.slowAffectCount`` (empty when no vote or not run).
    ``slow_ops``: rows of ``SlowOpStats`` as dicts (``*Ns`` columns hold microseconds, kept as named).
    ``rank_paths``: rank -> rank dir the tool actually used (``RankDeviceMap``), for auditing.
    ``advisor``: the advisor's ``--agent`` JSON message (sheets), or ``{}``.
    ``link_rows``: rows of msprof-analyze ``ClusterCommunicationMatrix`` (``communication_matrix_sum``, global
    ranks; sizes MB, times ms, bandwidth GB/s) as compact columns (``link_rows.LinkRows``, a sequence of row
    dicts; any iterable of row mappings given here is turned into one), for slow-link verdicts
    (``daemon/profwatch/core/verdict/links.py``).
    ``unusable_ranks``: rank -> why its data could not be judged (no device data, unparseable trace); such a
    batch is at best ``partial``. ``alignment``: how the ranks' steps were put side by side (torch traces:
    ``{"method": ..., "offsets_us": {rank: us}, "unaligned": {rank: reason}, "notes": [...]}``).
    ``step_labels``: torch traces: rank -> {its own ``ProfilerStep#`` label: the step of ``summaries``}
    (``kineto_align.Alignment.labels``), so per-operator totals can cover the steps the verdict used
    (:func:`used_steps`); empty for Ascend (the steps are the ranks' own).
    ``collectives_per_step``: collectives one rank runs per step (None when unknown), for the impact estimate.
    ``own_waits``: rank -> step -> (its own HCCL wait in µs, collectives), read from each rank's own data
    (``CommAnalyzerTime``) for targeted captures, so waits for ranks outside the capture show
    (``daemon/profwatch/core/verdict/subset.py``); empty when not read. ``aicore``: rank -> its AI Core clock over
    the captured steps (``hardware.FreqSummary`` from ``AICORE_FREQ``; Ascend only, empty when not recorded).
    ``accelerator``: False when the ranks' traces show no device work (a CPU job, e.g. torch with gloo): impacts
    are then in rank-hours (:data:`HOURS_UNITS`).
    """

    kind: EvidenceKind
    summaries: list[RankStepSummary] = field(default_factory=list)
    slow_rank_votes: dict[int, int] = field(default_factory=dict)
    slow_ops: list[dict[str, Any]] = field(default_factory=list)
    rank_paths: dict[int, str] = field(default_factory=dict)
    advisor: dict[str, Any] = field(default_factory=dict)
    recipes: dict[str, RecipeStatus] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    link_rows: LinkRows = field(default_factory=LinkRows)
    unusable_ranks: dict[int, str] = field(default_factory=dict)
    alignment: dict[str, Any] = field(default_factory=dict)
    step_labels: dict[int, dict[int, int]] = field(default_factory=dict)
    collectives_per_step: float | None = None
    own_waits: dict[int, dict[int, tuple[float, int]]] = field(default_factory=dict)
    aicore: dict[int, FreqSummary] = field(default_factory=dict)
    accelerator: bool = True

    def __post_init__(self) -> None:
        self.link_rows = LinkRows.from_rows(self.link_rows)


HOURS_UNITS = {True: "accelerator-hours", False: "CPU rank-hours"}
"""What an impact's hours count, by whether the job has accelerators (``ClusterEvidence.accelerator``): the
``accelerator_hours_per_day`` figure is ``saving / step x ranks x 24`` either way; a CPU job's ranks are
processes, not accelerators. An impact's JSON carries the unit as ``hours_unit`` (absent: accelerator-hours)."""


def hours_unit(impact: Mapping[str, Any] | None) -> str:
    """The unit of an impact JSON's ``accelerator_hours_per_day`` (``hours_unit``; accelerator-hours when absent)."""
    unit = (impact or {}).get("hours_unit")
    return unit if isinstance(unit, str) and unit in HOURS_UNITS.values() else HOURS_UNITS[True]


@dataclass(frozen=True, slots=True)
class Impact:
    """What fixing a suspect would save, by what-if analysis (``daemon/profwatch/core/verdict/impact.py``).

    ``saving_s_per_step``: seconds per step the job would save; ``saving_pct_of_step``: that as % of the
    measured step time; ``accelerator_hours_per_day``: accelerator-hours per day the job loses to it at its
    size (``saving / step_time x world_size x 24``).
    """

    saving_s_per_step: float
    saving_pct_of_step: float
    accelerator_hours_per_day: float

    def to_json(self) -> dict[str, float]:
        return {"saving_s_per_step": round(self.saving_s_per_step, 6),
                "saving_pct_of_step": round(self.saving_pct_of_step, 3),
                "accelerator_hours_per_day": round(self.accelerator_hours_per_day, 3)}


@dataclass(slots=True)
class Suspect:
    """One ranked suspect rank with the numbers behind its score.

    ``score`` is in [0, 1] (higher = more likely the cause); ``rank_dir`` is the directory to open in
    MindStudio Insight (or HTA / Perfetto for torch traces) for the timeline drill-down. ``impact``: the
    :class:`Impact` of this rank alone made as fast as its peers, as JSON (``None`` when it cannot be
    estimated, e.g. a suspect named from slow_rank votes only). ``evidence["strength"]`` is ``"strong"`` or
    ``"weak"`` (see ``docs/verdicts.md``).
    """

    rank: int
    score: float
    kind: SuspectKind
    hostname: str | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    rank_dir: str | None = None
    impact: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class SlowLink:
    """One slow link: the pair of global ``ranks`` (lower first), its communication ``group``, its pooled
    bandwidth against the median of its peers (the other pairs of the group over the same transport), and its
    :class:`Impact` as JSON. ``evidence`` holds the numbers behind it (z, steps, strength, summary)."""

    ranks: tuple[int, int]
    group: str
    bandwidth_gbps: float
    peer_median_gbps: float
    transport: str = ""
    impact: dict[str, Any] | None = None
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"ranks": list(self.ranks), "group": self.group, "bandwidth_gbps": round(self.bandwidth_gbps, 4),
                "peer_median_gbps": round(self.peer_median_gbps, 4),
                "bandwidth_ratio": round(self.bandwidth_gbps / self.peer_median_gbps, 4)
                if self.peer_median_gbps > 0 else None,
                "transport": self.transport, "impact": self.impact, "evidence": dict(self.evidence)}
