"""Limits of automatic capture arming (pure, pydantic; the policy itself is ``daemon/profwatch/core/arming/policy.py``).

A module of its own so that ``daemon/profwatch/config.py`` composes it without importing the detector (and numpy).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from profwatch.core.arming.targeting import TargetingSettings

__all__ = ["ArmableKind", "ArmingSettings"]

ArmableKind = Literal["step_regression", "rank_outlier", "periodic_spike", "stalled_rank", "step_spike",
                      "slow_from_start"]


class ArmingSettings(BaseModel):
    """Limits of automatic arming (runtime-tunable; units in the descriptions).

    Raises ``pydantic.ValidationError`` on unknown keys or out-of-range values.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    mode: Literal["act", "observe", "off"] = Field(
        "act", description="act: arm captures; observe: decide and report would_arm only; off: suppress everything"
    )
    cooldown_s: float = Field(
        900.0, ge=0, description="seconds after a capture of an episode before the same episode, once it changed "
                                 "(recapture_growth), is captured again (other episodes are not held by it: see "
                                 "min_arm_gap_s)")
    recapture_growth: float = Field(
        0.10, gt=0, description="relative: an episode already captured is captured again only once its level grew "
                                "this much since its last capture (after cooldown_s), or when it names new ranks "
                                "(at once); unchanged, it is not captured again while it lasts")
    min_arm_gap_s: float = Field(
        60.0, ge=0, description="seconds between two arms of one job, whatever episodes, except that an arm naming "
                                "no ranks (job-wide, manual) does not hold a new episode naming ranks")
    max_captures_per_hour: int = Field(
        4, ge=0, description="arms per job per rolling hour; a new episode naming ranks is held only by the hour's arms that were not repeats, and may take one arm more (NAMED_RESERVE) while repeats hold the cap")
    max_capture_bytes_per_hour: int | None = Field(
        50 * 2**30, ge=0, description="bytes captured per job per rolling hour before arming stops (None = no cap)"
    )
    warmup: int = Field(1, ge=0, description="profiler warm-up steps of the captures detection arms (profiler_config "
                        "key; a manual arm's: [capture] manual_warmup)")
    active: int = Field(4, ge=1, le=20, description="steps recorded by the captures detection arms (profiler_config "
                        "key; a manual arm's: [capture] manual_active); "
                        "default 4: see CAPTURE_WINDOW_NOTE in daemon/profwatch/core/capture/planner.py")
    small_group_active: int = Field(
        12, ge=1, le=40, description="steps recorded by a capture detection arms when it covers at most "
        "SMALL_GROUP_RANKS ranks (at least active): a small group's verdict is a step-by-step permutation test whose "
        "smallest p-value is N^-steps (a pair needs 8 steps, a 4-rank group 5; docs/verdicts.md, Small groups); "
        "capped at [capture] max_active; a smaller anomaly about ranks asks for more (small_group_max_active)")
    small_group_max_active: int = Field(
        40, ge=1, le=64, description="most steps a capture of 2 to SMALL_GROUP_RANKS ranks records when the steps "
        "its step-by-step test needs at the size of an anomaly about ranks (small_group_steps, with "
        "small_group_noise_frac and [analysis.ranking]; a job-wide anomaly names no rank and is not sized) are more "
        "than small_group_active; such a sized window may pass [capture] max_active up to this (docs/verdicts.md, "
        "Small groups)")
    small_group_noise_frac: float = Field(
        0.35, gt=0, le=1, description="relative (fraction of the step): the per-step noise of a rank's excess over its "
        "peers that a small group's window is sized for (small_group_steps); a live TP serving pair on a busy host "
        "measured 0.25-0.34")
    rank_list: tuple[int, ...] | None = Field(None, description="ranks to capture (None = all ranks)")
    arm_on: tuple[ArmableKind, ...] = Field(
        ("step_regression", "rank_outlier", "slow_from_start"),
        description="anomaly kinds that may arm (slow_from_start: once per generation, it is a standing episode); "
                    "add periodic_spike to capture the next occurrence of a recurring "
                    "spike (stalled_rank and step_spike never arm)",
    )
    min_magnitude: float = Field(0.0, ge=0, description="relative: anomalies below this magnitude do not arm")
    host_load_explains: bool = Field(False, description=(
        "a job-wide step_regression or drift whose move its nodes' run queue predicts waits as explained_by_host_load "
        "instead of being captured (daemon/profwatch/core/fleet/host_load.py); off by default: on a host shared with "
        "niced work the run queue over-predicts (docs/detection.md); the evidence is in every job-wide arm decision "
        "either way"))
    episode_quiet_steps: int = Field(
        50, ge=1, description="steps without a report or a sign from its detector after which an episode closes")
    rotation_captures: int = Field(
        2, ge=2, description="successive captures naming a different top rank each, of one episode or of "
                             "successive episodes of one key: the culprit rotates (load imbalance); it is not "
                             "captured again (a later episode of the key once it persists). Also the most captures "
                             "a rotation takes per job generation: once the key's episodes took this many within "
                             "an hour, a move "
                             "of the ranks they name (a rank first named after another was last named) is a "
                             "rotation at once, whatever the verdicts named")
    targeting: TargetingSettings = Field(
        default_factory=TargetingSettings,
        description="targeted captures of large jobs: suspects + node/group peers + reference ranks, or a sample "
                    "covering every node for a job-wide anomaly (daemon/profwatch/core/arming/targeting.py); rank_list overrides it")
