"""Thresholds of step-time anomaly detection (pure, pydantic; the detector itself is ``daemon/core/anomaly.py``).

A module of its own so that ``daemon/config.py`` composes it without importing the detector (and numpy).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["DetectionSettings"]


class DetectionSettings(BaseModel):
    """Thresholds of :class:`JobDetector` (all runtime-tunable; units in the descriptions).

    Raises ``pydantic.ValidationError`` on unknown keys or out-of-range values.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    warmup_steps: int = Field(10, ge=0, description="steps ignored at job start and after a step-counter restart")
    finalize_lag_steps: int = Field(
        3, ge=0, description="steps: a step is finalised when all ranks reported it or the furthest rank is this far ahead"
    )
    baseline_steps: int = Field(50, ge=5, description="steps in the rolling median+MAD baseline window")
    min_baseline_steps: int = Field(20, ge=3, description="steps the baseline needs before detection (also re-learn)")
    min_effect: float = Field(0.10, gt=0, description="relative: minimum excess over the baseline median (0.10 = 10%)")
    robust_z: float = Field(3.0, gt=0, description="robust z (MAD sigmas) a slow step must also exceed")
    noise_floor: float = Field(0.01, ge=0, description="relative: floor of the robust sigma, as a fraction of the median")
    sustain_steps: int = Field(3, ge=1, description="consecutive slow (non-excluded) steps needed to fire")
    confirm_steps: int = Field(
        8, ge=0, description="steps: window whose median is also tested (0/1 = off); the baseline lags by it"
    )
    drift_detection: bool = Field(True, description="also fire when the rolling baseline drifts min_effect above its reference")
    parse_steps: int = Field(2, ge=0, description="steps excluded after each capturing step (profiler flush/parse)")
    excluded_flags: tuple[str, ...] = Field(("checkpoint", "eval"), description="StepReport.flags that exclude a step")
    outlier_stages: tuple[str, ...] | None = Field(
        None, description="stages compared across ranks (None = every stage reported); leave out pure-wait stages"
    )
    outlier_on_step_time: bool = Field(
        False, description="also compare step_time_s across ranks (only without a per-step barrier, e.g. inference)"
    )
    outlier_window_steps: int = Field(12, ge=1, description="steps in the per-rank outlier window")
    outlier_min_steps: int = Field(8, ge=1, description="outlying steps within the window needed to fire")
    outlier_z: float = Field(4.0, gt=0, description="robust z vs the peer median for a rank to be outlying in a step")
    outlier_min_effect: float = Field(0.10, gt=0, description="relative: minimum excess over the peer median")
    outlier_min_abs_s: float = Field(0.001, ge=0, description="seconds: minimum absolute excess over the peer median")
    outlier_min_ranks: int = Field(4, ge=2, description="ranks that must report a stage in a step to compare them")
    stall_steps_behind: int = Field(5, ge=1, description="steps a rank must be behind the furthest rank to be stalled")
    stall_after_s: float = Field(30.0, gt=0, description="seconds without a report for a rank to be stalled")
    max_exclusions: int = Field(256, ge=1, description="excluded step ranges kept (oldest dropped first)")

    @model_validator(mode="after")
    def _check_windows(self) -> DetectionSettings:
        if self.min_baseline_steps > self.baseline_steps:
            raise ValueError("min_baseline_steps must be <= baseline_steps")
        if self.outlier_min_steps > self.outlier_window_steps:
            raise ValueError("outlier_min_steps must be <= outlier_window_steps")
        return self
