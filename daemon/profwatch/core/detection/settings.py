"""Thresholds of step-time anomaly detection (pure pydantic model; every field runtime-tunable).

One flat model, the ``[detection]`` table of the config file and of ``profwatch replay --config``. The algorithm
each group of fields tunes is documented in the detector that reads it: step aggregation and exclusions in
``daemon/profwatch/core/detection/aggregation.py``, job step-time regressions in ``daemon/profwatch/core/detection/regression.py``, spikes and
periodic spikes in ``daemon/profwatch/core/detection/spikes.py``, drift in ``daemon/profwatch/core/detection/drift.py``,
rank outliers and structural imbalance in ``daemon/profwatch/core/detection/rank_outliers.py``, stalls in
``daemon/profwatch/core/detection/stalls.py``, serving mode in ``daemon/profwatch/core/detection/serving.py``, blocks of
fast steps in ``daemon/profwatch/core/detection/blocks.py``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from profwatch.core.keyed_error import KeysError

SERVING_BLOCK_MIN = 8
"""Fewest records (steps, or blocks of steps without ``work``) in one block of a serving unit's regression test
(``serving.SERVING_BLOCK_S``). Here, not in ``serving.py``, so that status texts read it without numpy (a node
install has none: ``tests/unit/test_import_weight.py``)."""

class DetectionSettings(BaseModel):
    """Thresholds of :class:`profwatch.core.detection.job_detector.JobDetector` (units in the descriptions).

    Raises ``pydantic.ValidationError`` on unknown keys or out-of-range values.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    # -- step aggregation and exclusions ---------------------------------------------------------------------------
    warmup_steps: int = Field(10, ge=0, description="steps ignored at job start and after a step-counter restart")
    finalize_lag_steps: int = Field(
        3, ge=0, description="steps: a step is finalised when all ranks reported it or the furthest rank is this far ahead"
    )
    parse_steps: int = Field(2, ge=0, description="steps excluded after each capturing step (profiler flush/parse)")
    parse_max_steps: int = Field(
        600, ge=0, description="steps after a coordinator-armed window that stay excluded while its rank dirs are "
        "still being written or parsed (until the batch is complete or the capture ends), at most (0 = none)")
    excluded_flags: tuple[str, ...] = Field(("checkpoint", "eval"), description="StepReport.flags that exclude a step")
    max_exclusions: int = Field(256, ge=1, description="excluded step ranges kept (oldest dropped first)")

    # -- job step-time regression (change point) -------------------------------------------------------------------
    baseline_steps: int = Field(
        300, ge=5, description="steps in the rolling robust baseline (median, biweight scale)",
        json_schema_extra={"reach": "at fast step rates (block_target_s > 0) counts blocks of steps, not steps"},
    )
    min_baseline_steps: int = Field(30, ge=3, description="steps the baseline needs before detection (also re-learn)")
    baseline_lag_steps: int = Field(
        16, ge=0, description="steps: the newest steps enter the baseline only this late (a change cannot hide in it)"
    )
    min_effect: float = Field(
        0.10, gt=0, description="relative: the smallest regression reported (0.10 = 10% slower)",
        json_schema_extra={"reach": (
            "the smallest amplitude of a step-time period that makes fast-step blocks follow that period "
            "(core/detection/blocks.py step_period: phase medians spanning at least min_effect of their mean, as "
            "with one hook call per micro-batch); drift_threshold when that is unset; the floor of spike_min_effect; "
            "in a serving unit without work, the mean excess a step_regression must itself reach")},
    )
    false_alarm_steps: float = Field(
        1e5, ge=10, description="steps: target mean run between false alarms; the CUSUM threshold is its log"
    )
    noise_floor: float = Field(
        0.01, ge=0.002, le=1.0, description="relative: floor of the step-time noise, as a fraction of the level (at least "
        "0.002: a floor of 0 would let a perfectly steady series turn any jitter into a many-sigma change)")
    drift_detection: bool = Field(True, description="report a slow drift of the baseline as `drift` (slope, total)")
    drift_threshold: float | None = Field(
        None, gt=0, description="relative: `drift` is reported when the level rose this much since the reference, "
        "and again each time it grew by this much more (None = min_effect)"
    )

    # -- spikes and periodic spikes --------------------------------------------------------------------------------
    spike_min_effect: float = Field(0.30, gt=0, description="relative: a spike step is at least this much over the baseline")
    spike_z: float = Field(6.0, gt=0, description="noise sigmas a spike step must also exceed")
    spike_hold_steps: int | None = Field(
        None, ge=1, description="steps a spike may last and stay transient (None = the capture planner's lead)"
    )
    spike_event_gap_steps: int = Field(
        100, ge=0, description="steps between two reported step_spike events (rate limit)",
        json_schema_extra={"reach": "at fast step rates (block_target_s > 0) counts blocks of steps, not steps"},
    )
    periodic_detection: bool = Field(True, description="learn recurring spikes (period from the step series) and exclude them")
    periodic_jitter: float = Field(0.01, ge=0, le=0.2, description="relative: onset tolerance of a periodic spike")
    periodic_alpha: float = Field(1e-3, gt=0, lt=1, description="chance probability below which a lattice of spikes is periodic")
    periodic_min_period_steps: int = Field(5, ge=2, description="shortest period learned (steps)")

    # -- rank outliers ---------------------------------------------------------------------------------------------
    outlier_stages: tuple[str, ...] | None = Field(
        None, description="stages compared across ranks (None = every stage reported but pure waits: "
        "core/detection/rank_outliers.py WAIT_STAGES, e.g. comm, barrier)"
    )
    outlier_on_step_time: bool = Field(
        False, description="also compare step_time_s across ranks (only without a per-step barrier, e.g. inference)"
    )
    outlier_window_steps: int = Field(
        12, ge=1, description="steps in the per-rank outlier window",
        json_schema_extra={"reach": "at fast step rates (block_target_s > 0) counts blocks of steps, not steps"},
    )
    outlier_min_steps: int = Field(8, ge=1, description="outlying steps within the window needed to fire")
    outlier_z: float = Field(4.0, gt=0, description="robust z vs the peer median for a rank to be outlying in a step")
    outlier_min_effect: float = Field(0.10, gt=0, description="relative: minimum excess over the peer median")
    outlier_min_abs_s: float = Field(0.001, ge=0, description="seconds: minimum absolute excess over the peer median")
    outlier_min_ranks: int = Field(
        3, ge=2, description="ranks that must report a stage in a step to compare them (3: a median of three is one "
                             "healthy peer's value whichever one rank is slow; at 4, a slow rank of a 3-rank job was "
                             "never compared and waited for the job's step time: bench_corpus seed 38 levels run 15, "
                             "321 steps)"
    )

    # -- structural imbalance (each rank's own baseline) ------------------------------------------------------------
    structural_learn_steps: int = Field(
        40, ge=4, description="steps after warm-up over which each rank's own ratio to its peers is learned"
    )
    structural_detection: bool = Field(
        True, description="learn a difference present from the start as the rank's baseline (`structural_imbalance`)"
    )
    role_groups: bool = Field(
        True, description="compare a rank only with the ranks that sent the same `role` label (when they sent one)"
    )

    # -- serving mode ----------------------------------------------------------------------------------------------
    serving_idle_gap_s: float = Field(
        2.0, gt=0, description="seconds: a step this long and idle_gap_factor times the usual step is an idle gap"
    )
    idle_gap_factor: float = Field(20.0, gt=1, description="times the usual step time for a step to be an idle gap")
    serving_detect_gaps: int = Field(
        3, ge=0, description="idle gaps that switch a job without a `mode` to serving mode (0 = never detect)"
    )
    serving_unit_split_steps: int = Field(
        200, ge=8, description="steps two ranks' counters must differ by to be judged as independent replicas"
    )
    serving_load_bands: int = Field(
        4, ge=1, le=16, description="load bands (by busy fraction) that step times are compared within without `work`"
    )

    # -- blocks of steps at high step rates ------------------------------------------------------------------------
    block_target_s: float = Field(
        0.05, ge=0, description="seconds: fast steps are judged in blocks of about this length (0 = step by step)"
    )
    max_block_steps: int = Field(256, ge=1, description="the most steps in one block")

    # -- stalled ranks ---------------------------------------------------------------------------------------------
    stall_steps_behind: int = Field(5, ge=1, description="steps a rank must be behind the furthest rank to be stalled")
    stall_after_s: float = Field(
        30.0, gt=0, description="seconds since the rank's last report arrived for it to be stalled (coordinator clock)"
    )

    @model_validator(mode="after")
    def _check_windows(self) -> DetectionSettings:
        if self.min_baseline_steps > self.baseline_steps:
            raise KeysError(("min_baseline_steps", "baseline_steps"), "min_baseline_steps must be <= baseline_steps")
        if self.outlier_min_steps > self.outlier_window_steps:
            raise KeysError(("outlier_min_steps", "outlier_window_steps"),
                            "outlier_min_steps must be <= outlier_window_steps")
        if self.structural_learn_steps < self.outlier_window_steps:
            raise KeysError(("structural_learn_steps", "outlier_window_steps"),
                            "structural_learn_steps must be >= outlier_window_steps")
        if self.spike_min_effect < self.min_effect:
            raise KeysError(("spike_min_effect", "min_effect"), "spike_min_effect must be >= min_effect (a spike is "
                            "larger than the smallest regression)")
        return self
