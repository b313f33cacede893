"""The coordinator's own healthy reference capture, one per job generation (pure; time passed in, seconds).

When a job has been steady for a while, the coordinator arms one short capture with reason
:data:`REFERENCE_REASON`; once analysed it is the job's baseline, and the verdict of every later capture of the job
carries what changed since it (``daemon/profwatch/core/changes/comparison.py``, ``docs/changes.md``).

Rules (``docs/reference.md`` says them in words):

* **Steady.** The job is steady while it has no open episode younger than ``episode_yield_s`` (an episode holds
  the reference for that long at most: a job-wide load episode that never closes, or one that opens again and
  again on a busy host, cannot keep a job without a reference for good; :func:`episodes_holding`), its detector knows its baseline step time (warm-up
  over) and the recent step time lies within ``step_time_tolerance`` of that baseline (a reference taken in an
  undetected slow period would be a wrong baseline). :class:`JobReference` remembers since when it is steady; a
  reference is armed once it has been steady for ``[reference] steady_s``.
* **When.** Only in ``[arming] mode = "act"`` (observe mode captures nothing), never while a capture holds the
  job's config slot, and only when the job has no reference of its current generation younger than ``max_age_s``
  (a new generation or an old reference asks for a new one). After a reference that did not end analysed (failed,
  cancelled, expired) the next try waits ``retry_after_s``.
* **Budget.** A reference never counts toward ``[arming] max_captures_per_hour`` or the ``min_arm_gap_s`` of
  episodes; its bytes count toward ``max_capture_bytes_per_hour`` like any capture's, so it is not taken when its
  estimate would pass the byte cap.
* **Yield.** An episode never waits for a reference: a reference whose window has not ended (planned, written,
  acknowledged, collecting) is cancelled when an episode is armed, and the episode's window is placed after the
  reference's last step (:func:`yield_start_after`: a rank already inside the reference's window would discard a
  config whose start step it has passed). A reference being analysed no longer holds the slot.
* **Retention.** The newest analysed reference of each job is never deleted by retention; older ones are ordinary
  analysed captures once a newer reference exists.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["REFERENCE_REASON", "ReferenceDecision", "ReferenceInfo", "ReferenceSettings", "JobReference",
           "decide_reference", "episodes_holding", "yield_start_after"]

REFERENCE_REASON = "reference"
"""The capture reason (``Capture.reason``, the config's ``profwatch_reason`` metadata) of a reference capture."""


class ReferenceSettings(BaseModel):
    """``[reference]``: the coordinator's healthy reference capture per job generation (units in the names).

    Cost: one capture window of ``active_steps`` recorded steps (plus ``[arming] warmup``) per generation and per
    ``max_age_s``, on the ranks a job-wide capture takes (every rank of a small job, a sample covering every node of
    a large one): the bytes of one such capture (``CAPTURE_WINDOW_NOTE`` in ``core/capture/planner.py``) and the
    profiler's overhead during those few steps. Raises ``pydantic.ValidationError`` on unknown keys or bad values.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    enabled: bool = Field(True, description="take a reference capture per job generation (false: never)")
    steady_s: float = Field(300.0, ge=0, description="seconds the job must have been steady (no open episode, "
                                                     "baseline known, step time at it) before its reference")
    max_age_s: float = Field(86400.0, ge=3600.0, description="a reference older than this is taken again (at least "
                                                           "an hour: references are outside the hourly capture cap)")
    active_steps: int = Field(4, ge=1, le=20, description="recorded steps of the reference window")
    step_time_tolerance: float = Field(0.1, gt=0, le=1.0, description="relative: the recent step time must lie "
                                                                      "within this of the detector's baseline")
    retry_after_s: float = Field(600.0, ge=0, description="seconds after a reference that did not end analysed "
                                                          "(failed, cancelled, expired) before the next try")
    episode_yield_s: float = Field(900.0, gt=0, description="seconds an open episode holds the reference at most "
                                                            "(counted from its opening); the step time must still "
                                                            "lie at the detector's baseline")


@dataclass(frozen=True, slots=True)
class ReferenceInfo:
    """One analysed reference of a job: its capture, generation, when it was armed (unix s), its prof_dir and
    batch, the step time at plan (s; None unknown) and the recorded steps."""

    capture_id: str
    generation: int
    created_unix_s: float
    prof_dir: str
    batch_id: str | None
    step_time_s: float | None = None
    world_size: int = 0

    def to_json(self, now_unix_s: float) -> dict[str, object]:
        """``status`` and the verdict's view: the fields plus ``age_s``."""
        return {"capture_id": self.capture_id, "generation": self.generation, "created_unix_s": self.created_unix_s,
                "age_s": round(max(0.0, now_unix_s - self.created_unix_s), 1), "prof_dir": self.prof_dir,
                "batch_id": self.batch_id, "step_time_s": self.step_time_s, "world_size": self.world_size}


@dataclass(frozen=True, slots=True)
class ReferenceDecision:
    """``take``: arm a reference now; ``reason``: why (not), a stable snake_case word (``take``, ``disabled``,
    ``not_act_mode``, ``job_ended``, ``fresh``, ``episode_open``, ``no_baseline``, ``off_baseline``, ``settling``,
    ``capture_in_flight``, ``in_flight``, ``retry_wait``, ``byte_cap``); ``until_unix_s``: when the hold ends by
    time alone (None: something else must change)."""

    take: bool
    reason: str
    until_unix_s: float | None = None


class JobReference:
    """One job's reference state: since when it is steady, the reference in flight, the last try, and its newest
    analysed reference (``latest``). Pure; the shell feeds it and persists nothing extra (the captures are in the
    state store with reason :data:`REFERENCE_REASON`)."""

    def __init__(self) -> None:
        self.steady_since_unix_s: float | None = None
        self.unsteady_reason: str = "no_baseline"
        self.in_flight: str | None = None
        self.last_try_unix_s: float | None = None
        self.last_outcome: str | None = None
        self.latest: ReferenceInfo | None = None

    def observe(self, now_unix_s: float, *, open_episodes: int, baseline_step_s: float | None,
                recent_step_s: float | None, tolerance: float) -> str | None:
        """Fold the job's state at ``now_unix_s`` into the steadiness clock; returns None when steady, else the
        reason (``episode_open``, ``no_baseline``, ``off_baseline``). Any unsteady observation restarts it."""
        why: str | None = None
        if open_episodes:
            why = "episode_open"
        elif baseline_step_s is None or not baseline_step_s > 0 or recent_step_s is None:
            why = "no_baseline"
        elif abs(recent_step_s / baseline_step_s - 1.0) > tolerance:
            why = "off_baseline"
        if why is not None:
            self.steady_since_unix_s = None
            self.unsteady_reason = why
        elif self.steady_since_unix_s is None:
            self.steady_since_unix_s = now_unix_s
        return why

    def new_generation(self) -> None:
        """The job started a new generation: steadiness starts over (its old reference stays ``latest`` until a
        new one lands: comparing across generations says so)."""
        self.steady_since_unix_s = None
        self.unsteady_reason = "no_baseline"
        self.last_try_unix_s = None

    def armed(self, capture_id: str, now_unix_s: float) -> None:
        self.in_flight = capture_id
        self.last_try_unix_s = now_unix_s

    def ended(self, capture_id: str, outcome: str, info: ReferenceInfo | None) -> None:
        """The reference ``capture_id`` left flight with ``outcome`` (a capture state); ``info`` when it was
        analysed with a time breakdown (it becomes ``latest``)."""
        if self.in_flight == capture_id:
            self.in_flight = None
        self.last_outcome = outcome
        if info is not None:
            self.last_try_unix_s = None  # the retry wait follows a failure only
            if self.latest is None or info.created_unix_s >= self.latest.created_unix_s:
                self.latest = info


def episodes_holding(opened_unix_s: Iterable[float], now_unix_s: float, yield_s: float) -> int:
    """How many of the job's open episodes (their opening times, unix s) still hold its reference at
    ``now_unix_s``: those opened less than ``yield_s`` seconds ago (``[reference] episode_yield_s``)."""
    return sum(1 for t in opened_unix_s if now_unix_s - t < yield_s)


def decide_reference(settings: ReferenceSettings, ref: JobReference, now_unix_s: float, *, generation: int,
                     act_mode: bool, slot_busy: bool, bytes_last_hour: int, estimated_bytes: int,
                     byte_cap: int | None, job_ended: bool = False) -> ReferenceDecision:
    """Whether to arm the job's reference now (rules in the module doc), the first hold in this order: disabled,
    not act mode, a reference in flight, the job ended (``job_ended``: its ranks all left or it was found ended;
    no reference comes until it runs again), a fresh reference of this generation, not steady (its reason), steady for
    less than ``steady_s`` (``settling``), a capture holding the slot, the retry wait after a failed try, the byte
    cap. Pure."""
    s = settings
    if not s.enabled:
        return ReferenceDecision(False, "disabled")
    if not act_mode:
        return ReferenceDecision(False, "not_act_mode")
    if ref.in_flight is not None:
        return ReferenceDecision(False, "in_flight")
    if job_ended:
        return ReferenceDecision(False, "job_ended")
    latest = ref.latest
    if latest is not None and latest.generation >= generation and now_unix_s - latest.created_unix_s < s.max_age_s:
        return ReferenceDecision(False, "fresh", latest.created_unix_s + s.max_age_s)
    if ref.steady_since_unix_s is None:
        return ReferenceDecision(False, ref.unsteady_reason)
    if now_unix_s - ref.steady_since_unix_s < s.steady_s:
        return ReferenceDecision(False, "settling", ref.steady_since_unix_s + s.steady_s)
    if slot_busy:
        return ReferenceDecision(False, "capture_in_flight")
    if ref.last_try_unix_s is not None and now_unix_s - ref.last_try_unix_s < s.retry_after_s:
        return ReferenceDecision(False, "retry_wait", ref.last_try_unix_s + s.retry_after_s)
    if byte_cap is not None and bytes_last_hour + estimated_bytes > byte_cap:
        return ReferenceDecision(False, "byte_cap")
    return ReferenceDecision(True, "take")


def yield_start_after(reference_start_step: int, warmup: int, active: int, furthest_step: int) -> int:
    """``in_steps`` for the episode armed over a cancelled reference: the steps from the job's ``furthest_step``
    to the first step after the reference's window (``start + warmup + active``), 0 when that is already passed.
    torch_npu keeps a config that arrives during a running window pending and discards it when its start step
    has passed by the window's end (``docs/torch_npu-dynamic-profile.md``, step rules)."""
    return max(0, reference_start_step + warmup + active - furthest_step)
