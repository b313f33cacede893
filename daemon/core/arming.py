"""Automatic capture arming policy: anomaly + job state -> arm / would_arm / suppress (pure; time passed in).

Also holds two small pure helpers the coordinator and ``profwatch replay`` share: :class:`ArmHistory` (per-job
arm/byte bookkeeping over the last hour) and :func:`plan_start_step` (the capture start step, delegated to
``daemon.core.capture.plan_capture`` when that module is importable, else a documented fallback rule).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from daemon.core.anomaly import Anomaly

ArmAction = Literal["arm", "would_arm", "suppress"]
HOUR_S = 3600.0


class ArmingSettings(BaseModel):
    """Limits of automatic arming (runtime-tunable; units in the descriptions).

    Raises ``pydantic.ValidationError`` on unknown keys or out-of-range values.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    mode: Literal["act", "observe", "off"] = Field(
        "act", description="act: arm captures; observe: decide and report would_arm only; off: suppress everything"
    )
    cooldown_s: float = Field(900.0, ge=0, description="seconds after an arm of a job before the next arm")
    max_captures_per_hour: int = Field(4, ge=0, description="arms per job per rolling hour")
    max_capture_bytes_per_hour: int | None = Field(
        50 * 2**30, ge=0, description="bytes captured per job per rolling hour before arming stops (None = no cap)"
    )
    warmup: int = Field(1, ge=0, description="profiler warm-up steps of the capture window (profiler_config key)")
    active: int = Field(4, ge=1, le=20, description="captured steps of the capture window (profiler_config key); "
                        "default 4: see CAPTURE_WINDOW_NOTE in daemon/core/capture.py")
    rank_list: tuple[int, ...] | None = Field(None, description="ranks to capture (None = all ranks)")
    arm_on: tuple[Literal["step_regression", "rank_outlier", "stalled_rank"], ...] = Field(
        ("step_regression", "rank_outlier"), description="anomaly kinds that may arm (stalled_rank never arms)"
    )
    min_magnitude: float = Field(0.0, ge=0, description="relative: anomalies below this magnitude do not arm")


@dataclass(frozen=True, slots=True)
class JobArmState:
    """What the policy needs to know about one job at decision time.

    ``capture_in_flight`` is true while a capture is armed, running or captured but not yet analysed;
    ``last_arm_unix_s`` the wall time of the last arm (None = never); ``captures_last_hour`` /
    ``bytes_last_hour`` count arms and captured bytes in the rolling hour; ``stalled_ranks`` the ranks the
    detector currently reports as stalled.
    """

    capture_in_flight: bool = False
    last_arm_unix_s: float | None = None
    captures_last_hour: int = 0
    bytes_last_hour: int = 0
    stalled_ranks: frozenset[int] = frozenset()


@dataclass(frozen=True, slots=True)
class ArmDecision:
    """Outcome of :meth:`ArmingPolicy.decide`.

    ``action`` is ``arm``, ``would_arm`` (observe mode: everything passed) or ``suppress``; ``reason`` a stable
    snake_case string (``armed``, ``observe_mode``, ``mode_off``, ``stalled_rank_not_capturable``,
    ``kind_not_armed``, ``below_min_magnitude``, ``capture_in_flight``, ``cooldown``, ``hourly_cap``, ``byte_cap``,
    ``stalled_rank_in_capture``). ``warmup``/``active``/``rank_list`` are the window to arm (``rank_list`` None =
    all ranks); ``capture_reason`` a short human text stamped into the capture metadata.
    """

    action: ArmAction
    reason: str
    warmup: int
    active: int
    rank_list: tuple[int, ...] | None
    capture_reason: str

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict of every field."""
        return {"action": self.action, "reason": self.reason, "warmup": self.warmup, "active": self.active,
                "rank_list": list(self.rank_list) if self.rank_list is not None else None,
                "capture_reason": self.capture_reason}


def describe_anomaly(anomaly: Anomaly) -> str:
    """Short human text for an anomaly, e.g. ``step_regression +25% at step 120``."""
    ranks = f" ranks {list(anomaly.ranks)[:8]}" if anomaly.ranks else ""
    return f"{anomaly.kind} {anomaly.magnitude:+.0%} at step {anomaly.step}{ranks}"


class ArmingPolicy:
    """Decides whether an anomaly arms a capture.

    Notes:
        Checks, in order (the first that fails names the suppression reason): ``mode == "off"`` -> ``mode_off``;
        stalled ranks -> ``stalled_rank_not_capturable`` (report only: a stalled rank never reaches a future
        ``start_step``, so its batch could never complete; FC-11); kind not in ``arm_on`` -> ``kind_not_armed``;
        magnitude below ``min_magnitude``; one capture per job at a time (``capture_in_flight``, until analysed);
        ``cooldown_s`` since the last arm; ``max_captures_per_hour``; ``max_capture_bytes_per_hour``; a capture
        that would include a currently stalled rank -> ``stalled_rank_in_capture`` (same reason as above). In
        ``observe`` mode all checks run and a pass gives ``would_arm`` (reason ``observe_mode``), so observe mode
        shows exactly what act mode would do; the caller should count it in :class:`ArmHistory` the same way.
        Source: rate limits and observe-before-act as in ByteRobust (act after repeated alerts only) and Ray's
        observe modes (``../shared/docs/anchors.md`` section 4).
    """

    def __init__(self, settings: ArmingSettings | None = None) -> None:
        self.settings = settings or ArmingSettings()

    def update_settings(self, settings: ArmingSettings) -> None:
        """Swap limits at runtime (no state is kept here)."""
        self.settings = settings

    def decide(self, anomaly: Anomaly, job_state: JobArmState, now_unix_s: float) -> ArmDecision:
        """Return the decision for ``anomaly`` given ``job_state`` at wall time ``now_unix_s`` (seconds)."""
        s = self.settings
        rank_list = s.rank_list
        text = describe_anomaly(anomaly)

        def out(action: ArmAction, reason: str) -> ArmDecision:
            return ArmDecision(action, reason, s.warmup, s.active, rank_list, text)

        if s.mode == "off":
            return out("suppress", "mode_off")
        if anomaly.kind == "stalled_rank":
            return out("suppress", "stalled_rank_not_capturable")
        if anomaly.kind not in s.arm_on:
            return out("suppress", "kind_not_armed")
        if anomaly.magnitude < s.min_magnitude:
            return out("suppress", "below_min_magnitude")
        if job_state.capture_in_flight:
            return out("suppress", "capture_in_flight")
        if job_state.last_arm_unix_s is not None and now_unix_s - job_state.last_arm_unix_s < s.cooldown_s:
            return out("suppress", "cooldown")
        if job_state.captures_last_hour >= s.max_captures_per_hour:
            return out("suppress", "hourly_cap")
        if s.max_capture_bytes_per_hour is not None and job_state.bytes_last_hour >= s.max_capture_bytes_per_hour:
            return out("suppress", "byte_cap")
        if job_state.stalled_ranks and (rank_list is None or job_state.stalled_ranks.intersection(rank_list)):
            return out("suppress", "stalled_rank_in_capture")
        if s.mode == "observe":
            return out("would_arm", "observe_mode")
        return out("arm", "armed")


class ArmHistory:
    """Arms and captured bytes of one job over the rolling hour (pure; times passed in, seconds).

    Memory: at most one entry per arm within the last hour (bounded by ``max_captures_per_hour`` in practice).
    """

    def __init__(self) -> None:
        self._arms: deque[float] = deque()
        self._bytes: deque[tuple[float, int]] = deque()
        self.last_arm_unix_s: float | None = None

    def record_arm(self, now_unix_s: float) -> None:
        """Count an arm (or, in observe mode, a would-arm) at ``now_unix_s``."""
        self._arms.append(now_unix_s)
        self.last_arm_unix_s = now_unix_s

    def record_bytes(self, now_unix_s: float, total_bytes: int) -> None:
        """Count ``total_bytes`` of a finished capture at ``now_unix_s``."""
        self._bytes.append((now_unix_s, total_bytes))

    def state(self, now_unix_s: float, *, capture_in_flight: bool,
              stalled_ranks: frozenset[int] = frozenset()) -> JobArmState:
        """Return the :class:`JobArmState` at ``now_unix_s`` (drops entries older than one hour)."""
        while self._arms and self._arms[0] <= now_unix_s - HOUR_S:
            self._arms.popleft()
        while self._bytes and self._bytes[0][0] <= now_unix_s - HOUR_S:
            self._bytes.popleft()
        return JobArmState(capture_in_flight, self.last_arm_unix_s, len(self._arms),
                           sum(b for _, b in self._bytes), stalled_ranks)


FALLBACK_MARGIN_S = 2.0
"""Seconds added to the monitor poll interval for config propagation (NFS attribute cache, node write)."""


def fallback_start_step(furthest_step: int, step_time_s: float | None, *, margin_s: float = FALLBACK_MARGIN_S) -> int:
    """Capture ``start_step`` by the documented lead rule (used when ``daemon.core.capture`` is unavailable).

    ``start_step = furthest_step + ceil((poll_interval_s + margin_s) / step_time_s) + 2`` where
    ``poll_interval_s`` is 2 s before step 11 and afterwards the step time clamped to 1..50 s (torch_npu's
    dynamic_profile monitor re-times its poll at step 11; ``../shared/docs/torch_npu_dynamic_profile.md``).
    Unknown or non-positive step time counts as 1 s. Returns an absolute step (FC-10: ahead of every rank).
    """
    st = step_time_s if step_time_s is not None and step_time_s > 0 and math.isfinite(step_time_s) else 1.0
    poll_s = 2.0 if furthest_step < 11 else min(max(st, 1.0), 50.0)
    return furthest_step + math.ceil((poll_s + margin_s) / st) + 2


def plan_start_step(job_id: str, world_size: int, furthest_step: int, step_time_s: float | None,
                    decision: ArmDecision, *, now_unix_s: float, settings: Any = None) -> tuple[int, str]:
    """Return ``(start_step, planner)`` for an arm; ``planner`` is ``"capture.plan_capture"`` or ``"fallback"``.

    Calls ``daemon.core.capture.plan_capture(CaptureRequest, JobProgress, settings)`` (the capture planner the
    coordinator uses; ``settings`` None = its ``CaptureSettings()`` defaults) when that module imports and
    accepts the call; any failure falls back to :func:`fallback_start_step`. Never raises. Used by replay.
    """
    try:
        from daemon.core import capture

        req = capture.CaptureRequest(job_id=job_id, reason=decision.capture_reason, warmup=decision.warmup,
                                     active=decision.active,
                                     rank_list=list(decision.rank_list) if decision.rank_list is not None else None)
        job = capture.JobProgress(job_id=job_id, world_size=world_size, furthest_step=max(0, furthest_step),
                                  step_time_s=step_time_s or 1.0, prof_root="/replay", now_unix_s=now_unix_s)
        cap_settings = settings if settings is not None else capture.CaptureSettings()
        plan = capture.plan_capture(req, job, cap_settings)
        return int(plan.start_step), "capture.plan_capture"
    except Exception:  # noqa: BLE001 - optional collaborator; the fallback rule is documented above
        return fallback_start_step(furthest_step, step_time_s), "fallback"
