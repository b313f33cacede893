"""One capture as data: its states (:class:`CaptureState` and the sets of them the rules use) and its immutable
record (:class:`Capture`, with :class:`RankProgress` per covered rank and :class:`NodeWrite` per node write) (pure).

The rules that move a capture between states are ``daemon/profwatch/core/capture/lifecycle.py`` (which re-exports
these names); the words a capture says (verdict payload, ``status`` view, refusal) are
``daemon/profwatch/core/capture/report.py``. Both import this module; neither imports the other back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


# -- the states -----------------------------------------------------------------------------------------------------
class CaptureState(str, Enum):
    """Where one capture is in its life (the value is what the state store, events and ``status`` show)."""

    PLANNED = "planned"  # config rendered; the writer (coordinator or each node) has not confirmed it yet
    WRITTEN = "written"  # profiler_config.json written; waiting for every covered rank's acknowledgement
    ACKNOWLEDGED = "acknowledged"  # every covered rank's profiler took the config; waiting for the window
    COLLECTING = "collecting"  # the window runs or ran somewhere; waiting for every rank dir to be complete
    ANALYSING = "analysing"  # the batch is complete; the analysis runs
    ANALYSED = "analysed"  # verdict published (suspect_ranks)
    ENRICHING = "enriching"  # the advisor's follow-up runs for an analysed capture
    ENRICHED = "enriched"  # the follow-up is published (analysis_enriched)
    INCOMPLETE = "incomplete"  # judged without a complete batch (data kept)
    FAILED = "failed"  # the config could not be written, or the analysis failed (data kept)
    CANCELLED = "cancelled"  # stopped by an operator (data kept)
    SUPERSEDED = "superseded"  # its job started a new generation (restart/resize) before it finished (data kept)


S = CaptureState
IN_FLIGHT = frozenset({S.PLANNED, S.WRITTEN, S.ACKNOWLEDGED, S.COLLECTING, S.ANALYSING})
"""States that hold the job's one pending torch_npu config slot: a new arm of the job is refused meanwhile."""
ACTIVE = IN_FLIGHT | {S.ENRICHING}
"""States with a deadline (tracked on every tick, resumed after a restart)."""
SCANNED = frozenset({S.WRITTEN, S.ACKNOWLEDGED, S.COLLECTING})
"""States in which the capture's prof_dir is watched and scanned for its batch."""
ARM_PENDING = frozenset({S.PLANNED, S.WRITTEN})
"""States in which the arm itself is not settled yet (write or acknowledgements outstanding)."""


# -- the record -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RankProgress:
    """One covered rank: its plan (step counter and step time at plan time, its own window deadline) and what it
    said since. ``hook_seen_unix_s``: the rank hook read the config; ``tool_seen_unix_s``: torch_npu's own dp log
    acknowledged it ("Start step will be set to N"); ``rejected``: why the rank refused it; ``failure``: the hook
    reported the window failed."""

    rank: int
    step_at_plan: int
    step_time_s: float | None
    window_end_unix_s: float
    backend: str = ""
    hook_seen_unix_s: float | None = None
    tool_seen_unix_s: float | None = None
    started_unix_s: float | None = None
    completed_unix_s: float | None = None
    rejected: str = ""
    failure: str = ""
    rank_dir: str = ""
    steps: tuple[int, ...] = ()
    total_bytes: int = 0

    @property
    def acknowledged(self) -> bool:
        """True when the evidence the rank's backend gives is in: for ``torch_npu`` torch_npu's own word (its dp
        log line, or a window it started); for ``torch`` the hook, which drives torch.profiler itself."""
        if self.started_unix_s is not None or self.completed_unix_s is not None:
            return True
        if self.backend == "torch_npu":
            return self.tool_seen_unix_s is not None
        return self.hook_seen_unix_s is not None or self.tool_seen_unix_s is not None


@dataclass(frozen=True, slots=True)
class NodeWrite:
    """A ``write_config`` command to one node daemon (``config_writer = "node"``); ``ok`` None = no answer yet."""

    node_id: str
    command_id: str
    sent_unix_s: float
    ok: bool | None = None
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Capture:
    """One capture, immutable (transitions return a new one); times in unix seconds. ``deadline_unix_s``: of the
    current state (None when final); ``judge_unix_s``: when the batch is judged (latest covered rank's window end +
    parse allowance); ``config``: the rendered ``profiler_config.json``; ``outcome``: why the capture is where it is
    (expiry, failure, cancel); ``notes``: remarks carried into every verdict; ``idle_owed``: the transition that
    ended it asked for the idle config over its arm (:data:`~profwatch.core.capture.lifecycle.Action.IDLE_CONFIG`; set there and nowhere else, so
    a restarted coordinator writes it again exactly when the live rules did:
    :func:`~profwatch.core.capture.lifecycle.owes_idle`)."""

    capture_id: str
    job_id: str
    reason: str
    state: CaptureState
    created_unix_s: float
    state_since_unix_s: float
    deadline_unix_s: float | None
    start_step: int
    warmup: int
    active: int
    rank_list: tuple[int, ...] | None
    world_size: int
    prof_dir: str
    profiler_config_path: str
    writer: str
    step_time_s: float | None
    judge_unix_s: float
    config: Mapping[str, Any] = field(default_factory=dict)
    ranks: Mapping[int, RankProgress] = field(default_factory=dict)
    nodes: Mapping[str, NodeWrite] = field(default_factory=dict)
    generation: int = 0
    written_unix_s: float | None = None
    config_mtime_s: int | None = None
    batch_id: str | None = None
    analysis_status: str | None = None
    outcome: str = ""
    notes: tuple[str, ...] = ()
    idle_owed: bool = False

    @property
    def expected_ranks(self) -> list[int]:
        return sorted(self.ranks)

    @property
    def armed_steps(self) -> list[int]:
        """The recorded (active) steps: ``[start_step + warmup, start_step + warmup + active)``."""
        return list(range(self.start_step + self.warmup, self.start_step + self.warmup + self.active))

    @property
    def total_bytes(self) -> int:
        return sum(r.total_bytes for r in self.ranks.values())


DEADLINE_BOUNDS: dict[str, str] = {S.PLANNED.value: "config write", S.WRITTEN.value: "acknowledgements",
                                   S.ACKNOWLEDGED.value: "judgement", S.COLLECTING.value: "judgement",
                                   S.ANALYSING.value: "analysis",
                                   S.ENRICHING.value: "follow-up (advisor)"}
"""What the deadline of each state with one (``lifecycle.deadline_for``) bounds, in the words ``status`` and an arm's
refusal show, by state value."""
