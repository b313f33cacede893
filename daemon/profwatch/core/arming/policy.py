"""Automatic capture arming: anomaly + job history -> arm / would_arm / suppress, and the capture request to plan
(pure; time passed in).

The one arming path of profwatch. The coordinator and ``profwatch replay`` both turn anomalies into episodes
(``daemon/profwatch/core/arming/episodes.py``: :class:`~profwatch.core.arming.episodes.JobEpisodes`, which owns the job's
:class:`ArmHistory`) and, whenever a report arrives or time passes:

1. ``picked = episodes.next_arm(policy, now, capture_in_flight=..., stalled_ranks=..., topology=...)``: every
   open episode that wants a capture is decided by :meth:`ArmingPolicy.decide` in value order, the first that
   passes is returned with its :class:`ArmDecision` (the others keep what they wait for);
2. ``req = capture_request(episode.anomaly(), decision, ...)`` and
   ``profwatch.core.capture.planner.plan_capture(req, progress, capture_settings)`` (the coordinator writes the plan in
   act mode and only plans it in observe mode);
3. ``episodes.armed(...)`` once the plan succeeded (it records the arm in the history), so a would-arm in observe
   mode counts for the cooldown, the gap and the hourly cap exactly as an arm does in act mode;
   ``history.settle`` / ``episodes.capture_ended`` as captures end.

The job step time handed to the planner is ``JobDetector.baseline_step_time_s`` in both.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, Literal

from profwatch.core.arming.settings import ArmingSettings
from profwatch.core.arming.targeting import (
    JobTopology,
    Target,
    estimate_capture_bytes,
    plan_follow_up,
    plan_targets,
)
from profwatch.core.batches.completeness import rank_ranges
from profwatch.core.capture.planner import CaptureRequest, CaptureSettings, lead_steps
from profwatch.core.detection.interruptions import RETURN_STEPS
from profwatch.core.detection.types import Anomaly
from profwatch.core.verdict.ranking import RankingSettings

ArmAction = Literal["arm", "would_arm", "suppress"]
HOUR_S = 3600.0
JOB_HOLDS = frozenset({"capture_in_flight", "min_arm_gap", "hourly_cap", "byte_cap"})
"""Suppression reasons that hold every episode of the job alike (the queue waits in value order behind them); the
other reasons are the episode's own (the next episode in the queue may go)."""
NAMED_RESERVE = 1
"""Arms per job and rolling hour over ``max_captures_per_hour`` that only a new named-rank episode may take, and only
while repeats (:attr:`JobArmState.repeat`) hold part of the hour's cap: a drift's or a job-wide episode's repeated
captures spent the cap and a node 1.3x slower, found 5 steps after its onset, waited for the hour to pass. A repeat
never holds a new named-rank episode, and the job's arms per hour stay at most ``max_captures_per_hour +
NAMED_RESERVE`` (none when the cap is 0)."""


@dataclass(frozen=True, slots=True)
class JobArmState:
    """What the policy needs to know about one job at decision time.

    ``capture_in_flight`` is true while a capture is armed, running or captured but not yet analysed;
    ``last_arm_unix_s`` the wall time of the job's last arm or would-arm, of any episode (None = never; the
    ``min_arm_gap_s`` runs from it); ``last_arm_named``: that arm was for an episode naming ranks (False: job-wide,
    manual, or none; a new named-rank episode is not held by the gap after an arm naming no ranks); ``episode_captured_unix_s`` the wall time of the last capture of the episode
    being decided (None = never captured, or its ranks changed since: the ``cooldown_s`` runs from it);
    ``captures_last_hour`` / ``bytes_last_hour`` count arms (and would-arms) and bytes in the rolling hour
    (captured, plus the estimate of captures still in flight; an arm whose verdict was ``no_suspect`` is released);
    ``stalled_ranks`` the ranks the detector currently reports as stalled; ``bytes_per_rank_step``: what one rank
    wrote per recorded step in the job's last capture (None = no capture yet: ``[arming.targeting]
    bytes_per_rank_step`` is the estimate); ``rotating``: the episode's culprit rotates (not captured again);
    ``episode_unchanged``: the episode was captured and has not changed since (no new ranks, its level not grown
    by ``recapture_growth``: :meth:`~profwatch.core.arming.episode_record.Episode.unchanged_since_capture`);
    ``follow_ranks``: the ranks the episode's last targeted capture waited for and did not hold (its next capture
    is a follow-up that covers them: :func:`~profwatch.core.arming.targeting.plan_follow_up`; empty: none).
    ``repeats_last_hour``: the arms of ``captures_last_hour`` that were repeats; ``repeat``: the episode decided is
    a repeat (captured before, rotating, structural, or a job-wide episode whose key was armed within the hour:
    ``JobEpisodes.next_arm``); a new episode naming ranks is held by the hourly cap only by the hour's other arms,
    up to :data:`NAMED_RESERVE` more in all.
    """

    capture_in_flight: bool = False
    last_arm_unix_s: float | None = None
    captures_last_hour: int = 0
    bytes_last_hour: int = 0
    stalled_ranks: frozenset[int] = frozenset()
    bytes_per_rank_step: float | None = None
    episode_captured_unix_s: float | None = None
    rotating: bool = False
    episode_unchanged: bool = False
    follow_ranks: tuple[int, ...] = ()
    repeats_last_hour: int = 0
    repeat: bool = False
    last_arm_named: bool = False


@dataclass(frozen=True, slots=True)
class ArmDecision:
    """Outcome of :meth:`ArmingPolicy.decide`.

    ``action`` is ``arm``, ``would_arm`` (observe mode: everything passed) or ``suppress``; ``reason`` a stable
    snake_case string (``armed``, ``observe_mode``, ``mode_off``, ``stalled_rank_not_capturable``,
    ``transient_not_capturable``, ``kind_not_armed``, ``below_min_magnitude``, ``culprit_rotates``,
    ``captured_unchanged``, ``cooldown``,
    ``stalled_rank_in_capture``, ``larger_than_byte_cap``, then the job-wide holds ``capture_in_flight``,
    ``min_arm_gap``, ``hourly_cap``, ``byte_cap``: :data:`JOB_HOLDS`). ``warmup``/``active``/``rank_list``
    are the window to arm (``rank_list`` None = all ranks); ``capture_reason`` a short human text stamped into
    the capture metadata. ``target``: which ranks and why (``daemon/profwatch/core/arming/targeting.py``; None when the job's
    layout was not given); ``estimated_bytes``: what the capture is expected to write, counted against
    ``max_capture_bytes_per_hour`` before arming; ``repeat``: the episode decided was a repeat
    (:attr:`JobArmState.repeat`), counted as such by :meth:`ArmHistory.record`. ``configured_active``: ``[arming]
    active`` (None for a decision made elsewhere); ``active`` is more when the capture covers a small group
    (:func:`window_active`), a raise :func:`capture_request` caps at ``[capture] max_active``. ``sized_active``:
    the steps a small group's step-by-step test needs at the size of an anomaly about ranks (:func:`sized_window`,
    :func:`small_group_steps`, at most ``[arming] small_group_max_active``) when more than ``small_group_active``
    (None: not sized, and always for a job-wide anomaly); such a window passes ``[capture] max_active``
    (:func:`capture_request`).
    """

    action: ArmAction
    reason: str
    warmup: int
    active: int
    rank_list: tuple[int, ...] | None
    capture_reason: str
    target: Target | None = None
    estimated_bytes: int = 0
    repeat: bool = False
    configured_active: int | None = None
    sized_active: int | None = None

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict of every field."""
        return {"action": self.action, "reason": self.reason, "warmup": self.warmup, "active": self.active,
                "rank_list": list(self.rank_list) if self.rank_list is not None else None,
                "capture_reason": self.capture_reason, "estimated_bytes": self.estimated_bytes, "repeat": self.repeat,
                "targeting": self.target.to_json() if self.target is not None else None,
                "configured_active": self.configured_active, "sized_active": self.sized_active}


def capture_coverage(ranks: tuple[int, ...], topology: JobTopology | None, settings: ArmingSettings, *,
                     active: int, bytes_per_rank_step: float | None, world_size: int | None = None,
                     follow: tuple[int, ...] = ()) -> tuple[Target | None, tuple[int, ...] | None, int]:
    """The ranks a capture about ``ranks`` covers and its byte estimate: ``(target, rank_list, estimated_bytes)``.

    ``settings.rank_list`` when set; else, given the job's ``topology``, :func:`plan_follow_up` of ``follow`` (the
    ranks a previous targeted capture waited for) when given, else :func:`plan_targets` (``ranks`` empty: a
    job-wide capture's node-covering sample); else every rank (``rank_list`` None). Bytes:
    :func:`estimate_capture_bytes` over the covered ranks (every rank counts ``world_size``, else the topology's,
    else 0) and ``active`` steps, at ``bytes_per_rank_step`` (the job's measured rate) or the targeting default.
    Pure."""
    target = None
    if settings.rank_list is None and topology:
        target = (plan_follow_up(follow, topology, settings.targeting) if follow
                  else plan_targets(ranks, topology, settings.targeting))
    rank_list = settings.rank_list if settings.rank_list is not None else (target.rank_list if target else None)
    every = world_size if world_size is not None else (topology.world_size if topology is not None else 0)
    covered = len(rank_list) if rank_list is not None else every
    per_rank = bytes_per_rank_step if bytes_per_rank_step is not None else settings.targeting.bytes_per_rank_step
    return target, rank_list, estimate_capture_bytes(covered, active, per_rank)


SMALL_GROUP_RANKS = 4
"""A capture covering at most this many ranks records ``[arming] small_group_active`` steps (when more than
``active``), or the steps its step-by-step test needs at the anomaly's size when more (:func:`sized_window`). The verdict judges a group of 2-5 ranks step by step (``daemon/profwatch/core/verdict/paired.py``: each
rank's per-step excess over its peers, a within-step permutation test), whose smallest p-value is ``N^-steps``: at
1 % over the group's ranks a pair needs 8 steps, a trio 6, a group of 4 ranks 5 (5 ranks decide at the default 4).
Measured on the live serving loop's lockstep TP pair (tests/data/live_serving_tp, rank 1 +30 %): 4 captured steps gave
the between-rank z 1.96 (named nobody), 17-20 steps z 11-15 (rank 1 named). A group this small writes little: 4 ranks
x 10 steps is what one rank of an 8-rank capture of 5 steps writes."""

SMALL_GROUP_POWER = 0.9
"""The chance the window is sized for that the step-by-step test names a rank of the anomaly's size."""
SMALL_GROUP_MAX_MAGNITUDE = 100.0
"""Relative magnitudes above this count as this much (a bounded effect: the per-step excess is below 1)."""


def small_group_steps(ranks: int, magnitude: float, noise_frac: float, *, ranking: RankingSettings | None = None,
                      power: float = SMALL_GROUP_POWER) -> int:
    """Steps a group of ``ranks`` ranks (>= 2) needs for its step-by-step test (``daemon/profwatch/core/verdict/paired.py``)
    to name a rank ``magnitude`` slower than its peers (relative: 0.3 = 30 % more work) at level ``alpha / ranks``
    with chance ``power``, when a rank's per-step excess over its peers has noise ``noise_frac`` (fraction of the
    step). At least the steps whose smallest p-value ``ranks^-n`` reaches the level. The test's own settings are
    ``ranking`` (``[analysis.ranking]``; None: its defaults), read as the verdict reads them: ``alpha`` is
    ``family_alpha``, the null's excess ``delta`` is ``min_effect_frac``, and an effect under ``paired_tie_frac``
    over ``delta`` (a step within it counts as a tie) is too small for any window.

    The slow rank's per-step excess is ``e = m / (1 + m)`` of the step (its extra work, the step being its own time),
    less the null's ``delta``; its mean over ``n`` steps reaches the level when ``sqrt(n) (e - delta) / noise`` is
    ``z_(1 - alpha / ranks) + z_power``: ``n = ((z_a + z_b) noise / (e - delta))^2`` (the normal approximation of the
    permutation test's mean: Lehmann & Romano, *Testing Statistical Hypotheses*, 3rd ed., 2005, 15.2; sample size of
    a one-sided z test). The live TP serving pair (rank 1 +30 %, per-step noise 0.25-0.34 of the step) needs 20-37
    steps; 10 gave p 0.07 and 0.21 where 0.005 was needed. A magnitude that is not finite or not above 0 asks for
    the smallest-p steps alone; an effect under ``paired_tie_frac`` over ``delta`` asks for 10,000 (callers bound
    it). Raises ``ValueError`` for ``ranks < 2`` or a level, noise or power outside (0, 1). Pure."""
    rs = ranking if ranking is not None else RankingSettings()
    alpha, delta = rs.family_alpha, rs.min_effect_frac
    if ranks < 2 or not (0 < alpha < 1 and 0 < noise_frac and 0 < power < 1):
        raise ValueError(f"bad small-group sizing ranks={ranks} alpha={alpha} noise={noise_frac} power={power}")
    level = alpha / ranks
    floor = math.ceil(math.log(level) / math.log(1.0 / ranks) - 1e-9)
    if not (math.isfinite(magnitude) and magnitude > 0):
        return floor
    m = min(magnitude, SMALL_GROUP_MAX_MAGNITUDE)
    effect = m / (1.0 + m) - delta
    if effect < rs.paired_tie_frac:
        return 10_000
    z = NormalDist().inv_cdf(1.0 - level) + NormalDist().inv_cdf(power)
    return max(floor, math.ceil((z * noise_frac / effect) ** 2 - 1e-9))


def covered_ranks(rank_list: tuple[int, ...] | None, topology: JobTopology | None) -> int:
    """Ranks a capture covers: ``rank_list``'s, else every rank of a known ``topology``, else 0 (unknown)."""
    return len(rank_list) if rank_list is not None else (topology.world_size if topology is not None else 0)


def window_active(settings: ArmingSettings, rank_list: tuple[int, ...] | None, topology: JobTopology | None) -> int:
    """Steps a capture detection arms records: ``settings.active``, or ``settings.small_group_active`` when larger
    and the capture covers 2 to :data:`SMALL_GROUP_RANKS` ranks (:func:`covered_ranks`; one rank has no peer to
    compare, and an unknown world size keeps ``active``). Pure."""
    covered = covered_ranks(rank_list, topology)
    if 2 <= covered <= SMALL_GROUP_RANKS:
        return max(settings.active, settings.small_group_active)
    return settings.active


def sized_window(settings: ArmingSettings, rank_list: tuple[int, ...] | None, topology: JobTopology | None,
                 anomaly: Anomaly, ranking: RankingSettings | None = None) -> int | None:
    """A small group's window sized for its anomaly: :func:`small_group_steps` of the covered ranks at the
    anomaly's magnitude, ``settings.small_group_noise_frac`` and ``ranking`` (``[analysis.ranking]``), at most
    ``settings.small_group_max_active``, when that is more than :func:`window_active`; None otherwise (not a small
    group of 2 to :data:`SMALL_GROUP_RANKS` ranks, the steps it needs are no more, or the anomaly names no rank).

    Only an anomaly about ranks is sized (``anomaly.ranks`` not empty: a rank outlier, a slow-from-start rank, a
    serving replica slower than its peers): its magnitude is those ranks' excess over their peers, the effect the
    step-by-step test must find. A job-wide anomaly (``step_regression`` or ``periodic_spike`` without ranks) has
    no rank to name: its magnitude is the whole job's slowdown, which every rank of a synchronous group shares and
    which adds nothing to any rank's excess over its peers, so sizing by it asked for steps that measure nothing
    more (a +10 % job-wide regression of a pair recorded 40 steps); it keeps :func:`window_active`. Pure."""
    if not anomaly.ranks:
        return None
    covered = covered_ranks(rank_list, topology)
    if not 2 <= covered <= SMALL_GROUP_RANKS:
        return None
    need = min(small_group_steps(covered, anomaly.magnitude, settings.small_group_noise_frac, ranking=ranking),
               settings.small_group_max_active)
    return need if need > window_active(settings, rank_list, topology) else None


def describe_anomaly(anomaly: Anomaly) -> str:
    """Short human text for an anomaly (the capture reason), e.g. ``step_regression +25% at step 120``. An
    episode's anomaly (:meth:`~profwatch.core.arming.episode_record.Episode.anomaly`) carries the largest magnitude
    the episode reached (``detail["peak_magnitude"]``): when it is larger than the latest (a detector that
    re-learned its level reports less as the episode goes on), the text shows the largest and labels the latest:
    ``rank_outlier +100% (largest; latest +13%) at step 500 ranks [3]``. A change measured against the previous
    generation of a requeued job (``detail.reference "previous_generation"``: slower nodes from the start, or a
    change before the new generation's own level was learned) says so: ``step_regression +57% at step 56 over the
    previous generation (requeued)``, so the one alert names the generation change. The first word is always the
    kind."""
    ranks = f" ranks {list(anomaly.ranks)[:8]}" if anomaly.ranks else ""
    if anomaly.detail.get("reference") == "previous_generation":
        ranks += " over the previous generation (requeued)"
    peak = anomaly.detail.get("peak_magnitude")
    size = f"{anomaly.magnitude:+.0%}"
    if isinstance(peak, (int, float)) and not isinstance(peak, bool) and f"{peak:+.0%}" != size \
            and peak > anomaly.magnitude:
        size = f"{peak:+.0%} (largest; latest {size})"
    return f"{anomaly.kind} {size} at step {anomaly.step}{ranks}"


class ArmingPolicy:
    """Decides whether an anomaly (one episode's latest state) arms a capture.

    Notes:
        Checks, in order (the first that fails names the suppression reason). The episode's own:
        ``mode == "off"`` -> ``mode_off``; a stall -> ``stalled_rank_not_capturable`` (report only: a stalled rank
        never reaches a future ``start_step``, so its batch could never complete); a transient spike ->
        ``transient_not_capturable`` (it was over before any capture could start); kind not in ``arm_on`` ->
        ``kind_not_armed``; magnitude below ``min_magnitude``; ``culprit_rotates`` (its captures named another rank
        each time: load imbalance, not a slow rank); ``captured_unchanged`` (captured already and unchanged since:
        a capture of the same state again would show nothing new, however long it lasts); ``cooldown_s`` since the
        last capture of *this* episode (once it changed: grown by ``recapture_growth``; new ranks count as new); a
        capture that would include a currently stalled rank -> ``stalled_rank_in_capture``; an estimate larger than
        the byte cap itself -> ``larger_than_byte_cap``. Then the job's (:data:`JOB_HOLDS`): one capture per job at
        a time (``capture_in_flight``, until analysed); ``min_arm_gap_s`` since the job's last arm of any episode
        (except for a new episode naming ranks, not :attr:`JobArmState.repeat`, when that arm named none
        (:attr:`JobArmState.last_arm_named`): a job-wide capture does not hold a rank found after it, which could
        end before the gap does; a named-rank arm still holds the next one, and any arm a job-wide one);
        ``max_captures_per_hour``; ``max_capture_bytes_per_hour`` (bytes of the hour plus this capture's estimate:
        ranks covered x active steps x the job's last bytes per rank and step, else ``[arming.targeting]
        bytes_per_rank_step``). The ranks covered: ``rank_list`` when set, else, given the job's ``topology``,
        :func:`profwatch.core.arming.targeting.plan_targets` (suspects + peers + reference ranks for a rank outlier in
        a large job, a sample covering every node for a job-wide one; every rank in a small job). In ``observe``
        mode all checks run and a pass gives ``would_arm`` (reason ``observe_mode``); :class:`ArmHistory` counts it
        as an arm, so observe mode shows exactly what act mode would do (except the byte cap: nothing is captured).
        Source: rate limits as in ByteRobust (arXiv 2509.16293: act only after repeated alerts); observe before
        act as in the "observe" rollout mode of Ray Train's NCCL hang callback (ray-project/ray PRs 64928, 64993).
    """

    def __init__(self, settings: ArmingSettings | None = None, ranking: RankingSettings | None = None) -> None:
        """``settings``: ``[arming]``; ``ranking``: ``[analysis.ranking]``, the step-by-step test a small group's
        window is sized for (:func:`sized_window`; None: its defaults)."""
        self.settings = settings or ArmingSettings()
        self.ranking = ranking if ranking is not None else RankingSettings()

    def update_settings(self, settings: ArmingSettings) -> None:
        """Swap limits at runtime (no state is kept here; ``ranking`` stays)."""
        self.settings = settings

    def decide(self, anomaly: Anomaly, job_state: JobArmState, now_unix_s: float,
               topology: JobTopology | None = None) -> ArmDecision:
        """Return the decision for ``anomaly`` given ``job_state`` at wall time ``now_unix_s`` (seconds) and, when
        known, the job's ``topology`` (which ranks to cover)."""
        s = self.settings
        st = job_state
        target, rank_list, estimate = capture_coverage(anomaly.ranks, topology, s, active=s.active,
                                                       bytes_per_rank_step=st.bytes_per_rank_step,
                                                       follow=st.follow_ranks)
        sized = sized_window(s, rank_list, topology, anomaly, self.ranking)
        active = sized if sized is not None else window_active(s, rank_list, topology)
        if active != s.active:
            target, rank_list, estimate = capture_coverage(anomaly.ranks, topology, s, active=active,
                                                           bytes_per_rank_step=st.bytes_per_rank_step,
                                                           follow=st.follow_ranks)
        text = describe_anomaly(anomaly)
        if st.follow_ranks:
            text += f"; follow-up of ranks {rank_ranges(st.follow_ranks, 8)} its last capture waited for"

        def out(action: ArmAction, reason: str) -> ArmDecision:
            return ArmDecision(action, reason, s.warmup, active, rank_list, text, target, estimate, st.repeat,
                               configured_active=s.active, sized_active=sized)

        if s.mode == "off":
            return out("suppress", "mode_off")
        if anomaly.kind == "stalled_rank":
            return out("suppress", "stalled_rank_not_capturable")
        if anomaly.kind == "step_spike":
            return out("suppress", "transient_not_capturable")
        if anomaly.kind not in s.arm_on:
            return out("suppress", "kind_not_armed")
        if anomaly.magnitude < s.min_magnitude:
            return out("suppress", "below_min_magnitude")
        if st.rotating:
            return out("suppress", "culprit_rotates")
        if st.episode_unchanged:
            return out("suppress", "captured_unchanged")
        if st.episode_captured_unix_s is not None and now_unix_s - st.episode_captured_unix_s < s.cooldown_s:
            return out("suppress", "cooldown")
        if st.stalled_ranks and (rank_list is None or st.stalled_ranks.intersection(rank_list)):
            return out("suppress", "stalled_rank_in_capture")
        cap = s.max_capture_bytes_per_hour
        if cap is not None and estimate > cap:
            return out("suppress", "larger_than_byte_cap")
        if st.capture_in_flight:
            return out("suppress", "capture_in_flight")
        if gap_holds(st, bool(anomaly.ranks), now_unix_s, s.min_arm_gap_s):
            return out("suppress", "min_arm_gap")
        if hourly_capped(st, bool(anomaly.ranks), s.max_captures_per_hour):
            return out("suppress", "hourly_cap")
        if cap is not None and (st.bytes_last_hour >= cap or st.bytes_last_hour + estimate > cap):
            return out("suppress", "byte_cap")
        if s.mode == "observe":
            return out("would_arm", "observe_mode")
        return out("arm", "armed")


def gap_holds(st: JobArmState, named: bool, now_unix_s: float, gap_s: float) -> bool:
    """Whether ``min_arm_gap_s`` (``gap_s``, seconds) holds an episode in state ``st`` at ``now_unix_s`` (``named``:
    it names ranks): less than ``gap_s`` since the job's last arm, unless the episode is a new named-rank one (not
    ``st.repeat``) and that arm named no ranks (``st.last_arm_named`` False: a job-wide or manual
    capture). Source: docs/detection.md (the job's holds): a job-wide arm held a rank 1.3x slower, found 6 s after
    it, until after the run ended."""
    if st.last_arm_unix_s is None or now_unix_s - st.last_arm_unix_s >= gap_s:
        return False
    return not (named and not st.repeat and not st.last_arm_named)


def hourly_capped(st: JobArmState, named: bool, cap: int) -> bool:
    """Whether ``max_captures_per_hour`` (``cap``) holds an episode in state ``st`` (``named``: it names ranks): the
    hour's arms reach ``cap``; for a new named-rank episode (not ``st.repeat``) the hour's arms other than repeats
    reach ``cap``, or all of them ``cap +`` :data:`NAMED_RESERVE`."""
    if not (named and not st.repeat and cap > 0):
        return st.captures_last_hour >= cap
    return (st.captures_last_hour - st.repeats_last_hour >= cap
            or st.captures_last_hour >= cap + NAMED_RESERVE)


class ArmHistory:
    """Arms, would-arms and captured bytes of one job over the rolling hour (pure; times passed in, seconds).

    :class:`~profwatch.core.arming.episodes.JobEpisodes` keeps one per job (the coordinator seeds it from its state
    store after a restart; ``profwatch replay`` keeps one per replayed job). Memory: one entry per arm and per byte
    report within the last hour.
    """

    def __init__(self) -> None:
        self._arms: deque[tuple[float, str, bool, bool]] = deque()  # (armed unix s, capture id, repeat, named)
        self._bytes: deque[tuple[float, int]] = deque()
        self._reserved: dict[str, tuple[float, int]] = {}
        self.last_arm_unix_s: float | None = None
        self.last_arm_named = False  # the arm at last_arm_unix_s named ranks (JobArmState.last_arm_named)
        self._last_arm_id = ""
        self.bytes_per_rank_step: float | None = None

    def record_arm(self, now_unix_s: float, capture_id: str = "", *, repeat: bool = False,
                   named: bool = False) -> None:
        """Count an arm (or, in observe mode, a would-arm) at ``now_unix_s``; ``capture_id`` lets
        :meth:`release` take it back; ``repeat``: of a repeat (:attr:`JobArmState.repeat`); ``named``: for an
        episode naming ranks (:attr:`JobArmState.last_arm_named`)."""
        self._arms.append((now_unix_s, capture_id, repeat, named))
        if self.last_arm_unix_s is None or now_unix_s > self.last_arm_unix_s:
            self.last_arm_unix_s, self._last_arm_id, self.last_arm_named = now_unix_s, capture_id, named

    def record(self, decision: ArmDecision, now_unix_s: float, capture_id: str = "") -> None:
        """Count ``decision`` if it armed or would have armed (call once its capture was planned)."""
        if decision.action in ("arm", "would_arm"):
            self.record_arm(now_unix_s, capture_id, repeat=decision.repeat)

    def mark_arm(self, capture_id: str, *, repeat: bool = False, named: bool = False) -> bool:
        """The arm of ``capture_id`` was a repeat (:attr:`JobArmState.repeat`) and/or for an episode naming ranks
        (:attr:`JobArmState.last_arm_named`): the live arm path records an arm before the episodes know what it
        was for, and a restart records it again from the store (neither knows it), so the episodes mark it
        (``JobEpisodes.armed``, ``JobEpisodes.arm_marks``); a flag given False is left as it was. Returns whether
        an arm of that id was counted."""
        found = False
        for i, a in enumerate(self._arms):
            if capture_id and a[1] == capture_id:
                self._arms[i] = (a[0], a[1], a[2] or repeat, a[3] or named)
                found = True
        if named and capture_id and capture_id == self._last_arm_id:
            self.last_arm_named = True
        return found

    def release(self, capture_id: str) -> bool:
        """The capture found nothing (verdict ``no_suspect``): its arm no longer counts against
        ``max_captures_per_hour`` (its bytes still count: they are on disk). Returns whether it was counted."""
        kept = deque(a for a in self._arms if not capture_id or a[1] != capture_id)
        released = len(kept) != len(self._arms)
        self._arms = kept
        return released

    def withdraw(self, capture_id: str) -> bool:
        """The capture was withdrawn before its window (nothing recorded): its arm leaves the hourly cap, its byte
        reservation is dropped, and the gap counts from the latest arm still counted (None: none). Returns whether
        it was counted."""
        released = self.release(capture_id)
        self._reserved.pop(capture_id, None)
        if released:
            last = max(self._arms, key=lambda a: a[0], default=None)
            self.last_arm_unix_s = last[0] if last is not None else None
            self._last_arm_id, self.last_arm_named = (last[1], last[3]) if last is not None else ("", False)
        return released

    def record_bytes(self, now_unix_s: float, total_bytes: int, *, ranks: int = 0, active_steps: int = 0) -> None:
        """Count ``total_bytes`` captured at ``now_unix_s`` (call per rank or per capture; they add up). With the
        capture's ``ranks`` and ``active_steps``, its bytes per rank and step become the next estimate."""
        if total_bytes > 0:
            self._bytes.append((now_unix_s, total_bytes))
            if ranks > 0 and active_steps > 0:
                self.bytes_per_rank_step = total_bytes / (ranks * active_steps)

    def reserve(self, capture_id: str, now_unix_s: float, estimated_bytes: int) -> None:
        """Count a capture's estimate while it is in flight (the byte budget counts it before anything lands)."""
        if estimated_bytes > 0:
            self._reserved[capture_id] = (now_unix_s, estimated_bytes)

    def settle(self, capture_id: str, now_unix_s: float, total_bytes: int, *, ranks: int = 0,
               active_steps: int = 0) -> None:
        """The capture ended: its estimate gives way to the bytes it wrote (:meth:`record_bytes`)."""
        self._reserved.pop(capture_id, None)
        self.record_bytes(now_unix_s, total_bytes, ranks=ranks, active_steps=active_steps)

    def _prune(self, now_unix_s: float) -> None:
        while self._arms and self._arms[0][0] <= now_unix_s - HOUR_S:
            self._arms.popleft()
        while self._bytes and self._bytes[0][0] <= now_unix_s - HOUR_S:
            self._bytes.popleft()

    def state(self, now_unix_s: float, *, capture_in_flight: bool,
              stalled_ranks: frozenset[int] = frozenset(), episode_captured_unix_s: float | None = None,
              rotating: bool = False, episode_unchanged: bool = False,
              follow_ranks: tuple[int, ...] = (), repeat: bool = False) -> JobArmState:
        """Return the :class:`JobArmState` at ``now_unix_s`` (drops entries older than one hour; estimates of
        captures still in flight count whatever their age)."""
        self._prune(now_unix_s)
        held = sum(b for _, b in self._bytes) + sum(b for _, b in self._reserved.values())
        return JobArmState(capture_in_flight, self.last_arm_unix_s, len(self._arms), held, stalled_ranks,
                           self.bytes_per_rank_step, episode_captured_unix_s, rotating, episode_unchanged,
                           follow_ranks, sum(1 for a in self._arms if a[2]), repeat, self.last_arm_named)

    def hold_until(self, reason: str, now_unix_s: float, settings: ArmingSettings, *,
                   episode_captured_unix_s: float | None = None, estimated_bytes: int = 0,
                   named_new: bool = False) -> float | None:
        """When the hold named ``reason`` ends at the earliest (wall time, seconds), or None when no time ends it
        (a capture in flight ends with its analysis; a rotation or a kind not armed never ends by itself).
        ``named_new``: the episode held is a new named-rank one (:func:`hourly_capped`)."""
        self._prune(now_unix_s)
        if reason == "cooldown" and episode_captured_unix_s is not None:
            return episode_captured_unix_s + settings.cooldown_s
        if reason == "min_arm_gap" and self.last_arm_unix_s is not None:
            return self.last_arm_unix_s + settings.min_arm_gap_s
        if reason == "hourly_cap" and self._arms:
            most = settings.max_captures_per_hour
            if not (named_new and most > 0):
                return self._arms[max(0, len(self._arms) - most)][0] + HOUR_S
            others = [a[0] for a in self._arms if not a[2]]  # either bound may be the one that holds it
            ends = [others[len(others) - most] + HOUR_S] if len(others) >= most else []
            if len(self._arms) >= most + NAMED_RESERVE:
                ends.append(self._arms[len(self._arms) - most - NAMED_RESERVE][0] + HOUR_S)
            return max(ends, default=None)
        cap = settings.max_capture_bytes_per_hour
        if reason == "byte_cap" and cap is not None:
            held = sum(b for _, b in self._bytes) + sum(b for _, b in self._reserved.values()) + estimated_bytes
            for t, b in self._bytes:
                held -= b
                if held <= cap:
                    return t + HOUR_S
        return None

    def decide(self, policy: ArmingPolicy, anomaly: Anomaly, now_unix_s: float, *, capture_in_flight: bool,
               stalled_ranks: frozenset[int] = frozenset(), topology: JobTopology | None = None,
               episode_captured_unix_s: float | None = None, rotating: bool = False,
               episode_unchanged: bool = False, follow_ranks: tuple[int, ...] = (),
               repeat: bool = False) -> ArmDecision:
        """``policy.decide`` on this history's state (nothing is recorded: call :meth:`record` after planning)."""
        return policy.decide(anomaly, self.state(now_unix_s, capture_in_flight=capture_in_flight,
                                                 stalled_ranks=stalled_ranks,
                                                 episode_captured_unix_s=episode_captured_unix_s,
                                                 rotating=rotating, episode_unchanged=episode_unchanged,
                                                 follow_ranks=follow_ranks, repeat=repeat),
                             now_unix_s, topology)


WITHDRAW_SLACK_STEPS = RETURN_STEPS + 3
"""Steps added to the planner's lead for the window of a :func:`withdrawable` report: the
:data:`~profwatch.core.detection.interruptions.RETURN_STEPS` steps that show its excursion came back, plus the step
that closes the last of them, one step the excursion may run past its report and one of reporting lag (a step is
judged once every rank reported it) pass while the idle config can still reach every rank before the window
(``JobEpisodes.withdraw_returned`` wants the planner's lead between the furthest step and ``start_step``). Armed at
the lead alone, the return of a 5-step checkpoint at 1.8 s steps was seen with the furthest step 1 step before the
window (the planner's lead is 4): the idle config could not reach the ranks in time, the window ran, and its data
lay under a capture that said it was withdrawn before its window (never analysed). With one step less for the
last two, a 1.05 s job's 6-step checkpoint held 5 came back with 3 steps left where the lead is 5
(``bench/bench_corpus.py --healthy-hours``, ``interrupts`` seed 33, healthy run 4: a capture of a checkpoint)."""


RETURN_PLAN_MAX_RATIO = 100.0
"""A :func:`withdrawable` report's lead is planned at a step time at most this many times shorter than the
detector's (:func:`_return_step_s`). Planned at the level before the excursion alone, the wait at the risen level
grew with the change's ratio without bound: a lasting 1000x level change (0.005 s -> 5 s steps) had its window
607 steps (51 minutes) after the report, a 3000x one (0.01 s -> 30 s) 307 steps (2.6 hours), and a report whose
``baseline_s`` was 1e-12 s 3e12 steps, the capture in flight all the while. Not less than 100: the detector's step
time at the report may be the excursion's last step, an evaluation at 25x the level before
(``tests/unit/test_withdraw_returned.py``), which must still be planned at that level to be withdrawn."""


def _return_step_s(anomaly: Anomaly, step_time_s: float) -> float:
    """The step time (s) a :func:`withdrawable` report's lead is planned at: the level before its excursion
    (``detail.baseline_s``) when faster than ``step_time_s`` (the detector's, which may already follow the risen
    steps). Should the excursion come back, the steps before the window run at that level, and the withdrawal
    needs the planner's lead at it (``JobEpisodes.withdraw_returned``). Planned at the risen level, a 5-step 6x
    checkpoint of a 0.56 s job had its window 7 steps after the report and came back with 3 steps left, where the
    lead at 0.56 s is 7-8 (``bench/bench_corpus.py --healthy-hours``, ``interrupts`` seed 33, healthy runs 3 and
    4: two captures that recorded nothing but a checkpoint). If the change lasts, the window starts later by the
    steps' ratio (at most :data:`RETURN_PLAN_MAX_RATIO`), within the change."""
    before = anomaly.detail.get("baseline_s")
    if isinstance(before, (int, float)) and not isinstance(before, bool) and 0.0 < before < step_time_s:
        return max(float(before), step_time_s / RETURN_PLAN_MAX_RATIO)
    return step_time_s


EXCURSION_RUN_FACTOR = 2
"""Times its age at the report (and at most times the planner's lead) that a :func:`withdrawable` report's
excursion may still run on and come back before its window with the lead left (:func:`_excursion_age_steps`).
The age is about the spike hold (the planner's lead), the excursion's duration unknown: an excursion seen ``a``
steps runs on ``r`` more with ``P(r <= k a) = k / (k + 1)`` under a scale-free prior on its duration (Gott,
"Implications of the Copernican principle for our future prospects", Nature 363, 1993): 1/2 at one age, 2/3 at
two. At one age, the unflagged first evaluations of runs 2, 4 and 6 (``bench/bench_new_shapes.py --shapes
eval_ckpt,alternating --seed 31``: 21-34 steps at 1.4-5.6x, reported 7-15 steps in; 4 of ``eval_ckpt``'s 5 false
arms) and run 2's 39-step slow regime (2 of ``alternating``'s 4) ran 1.1-2 times their age past the report, 1-5
steps too long to be withdrawn. A lasting change's window starts at most this many leads after the lead (one
more than at one age), within the change: a lasting 3x change's median window 18-25 % later
(``bench/bench_corpus.py --runs 16 --seed 33``, steady 52 -> 65 s), its report as soon."""


def _excursion_age_steps(anomaly: Anomaly, lead: int) -> int:
    """Steps added to a :func:`withdrawable` report's window lead for its excursion's age at the report
    (``step - detail.first_step``, 0 without a first step): :data:`EXCURSION_RUN_FACTOR` times that age, at most
    that many times ``lead`` (the planner's lead it is planned with), so an excursion that runs on past its report
    up to that many times as long as it ran before it still comes back with the planner's lead left and is
    withdrawn (``JobEpisodes.withdraw_returned`` needs the lead at the level it came back to). Without the age, run
    0 of ``bench/bench_new_shapes.py --shapes eval_ckpt --seed 31`` (an unflagged 42-step evaluation at 2.3x of
    57 ms steps, reported 25 steps in, window 60 steps after the report) came back with 42 steps left where the
    lead at 57 ms is 55: the window was armed over healthy steps. A lasting change's window starts at most
    ``EXCURSION_RUN_FACTOR * lead`` steps later, within the change."""
    first = anomaly.detail.get("first_step")
    if not isinstance(first, int) or isinstance(first, bool):
        return 0
    return EXCURSION_RUN_FACTOR * min(max(0, anomaly.step - first), max(0, lead))


def withdrawable(anomaly: Anomaly) -> bool:
    """Whether a capture armed for ``anomaly`` may be withdrawn if its excursion comes back
    (``JobEpisodes.withdraw_returned``): a job-wide ``step_regression`` of ``pattern "level"``."""
    return not anomaly.ranks and anomaly.kind == "step_regression" and anomaly.detail.get("pattern") == "level"


def planning_step_time_s(baseline_step_time_s: float | None, recent_step_time_s: float | None) -> float | None:
    """The step time (s) a capture is planned at: the detector's baseline, else the job's recent median (the
    registry's; replay has none). None when neither is known: the planner then refuses (no step time is assumed).
    ``CaptureShell.arm`` and :func:`withdrawal_lead` both use it."""
    return baseline_step_time_s or recent_step_time_s


def withdrawal_lead(furthest_step: int | None, baseline_step_time_s: float | None,
                    recent_step_time_s: float | None, capture: CaptureSettings) -> int | None:
    """The lead (steps) a withdrawal keeps: how far ahead of ``furthest_step`` a capture's ``start_step`` must
    still lie for ``JobEpisodes.withdraw_returned`` to withdraw it, or None (nothing is withdrawn).

    It is the planner's own lead (``profwatch.core.capture.planner.lead_steps``: the steps an idle config needs to
    reach every rank) at the planner's step time: the detector's ``baseline_step_time_s`` (s), else the job's
    ``recent_step_time_s`` (s; the registry's recent median, ``CaptureShell.arm``; replay has none and passes
    None, as its planner plans with the baseline only). None when no step is known yet (``furthest_step`` None)
    or no positive step time is measured (none is assumed: a lead on a guess may already be passed); a
    ``furthest_step`` below 0 (the registry's -1 before any report) counts as step 0, as the planner's does."""
    step_time = planning_step_time_s(baseline_step_time_s, recent_step_time_s)
    if furthest_step is None or step_time is None or not step_time > 0 or not math.isfinite(step_time):
        return None
    return lead_steps(max(0, furthest_step), step_time, capture)


def capture_request(anomaly: Anomaly, decision: ArmDecision, *, furthest_step: int, step_time_s: float | None,
                    capture: CaptureSettings) -> CaptureRequest:
    """The :class:`~profwatch.core.capture.planner.CaptureRequest` for an arming ``decision`` on ``anomaly``.

    For every kind but ``periodic_spike`` the planner places ``start_step`` (its lead ahead of the furthest
    rank; for a :func:`withdrawable` report at the level before its excursion, :func:`_return_step_s`, and
    :func:`_excursion_age_steps` and :data:`WITHDRAW_SLACK_STEPS` further). For ``periodic_spike`` the window is placed on a predicted occurrence: the first onset
    ``o = next_onset_step + j * period_steps`` (j >= 0) with ``o - warmup`` at or after the planner's earliest
    safe start (``furthest_step + lead_steps``), ``start_step = o - warmup`` so the active steps begin at the
    onset, and ``active = max(decision.active, duration_steps)`` capped at ``capture.max_active``. A small
    group's raise to ``small_group_active`` stops at ``capture.max_active``; a window sized for the anomaly
    (``decision.sized_active``) does not: the request carries it as its ``max_active``. Without a
    step time (``None``) the planner's own rule applies (it raises ``CannotPlanCapture``). Pure; raises
    ``KeyError``/``TypeError`` only for a malformed ``periodic_spike`` detail.
    """
    rank_list = list(decision.rank_list) if decision.rank_list is not None else None
    active = decision.active
    if decision.configured_active is not None and active > max(decision.configured_active, capture.max_active):
        active = max(decision.configured_active, capture.max_active)  # a small group's raise stops at max_active
    if decision.sized_active is not None and decision.configured_active is not None:
        active = decision.sized_active  # the steps its test needs at the anomaly's size (small_group_max_active)
    base: dict[str, Any] = {"job_id": anomaly.job_id, "reason": decision.capture_reason or anomaly.kind,
                            "warmup": decision.warmup, "active": active, "rank_list": rank_list,
                            "named_ranks": sorted(set(anomaly.ranks)) or None}
    if decision.sized_active is not None and active > capture.max_active:
        base["max_active"] = active
    if decision.target is not None and decision.target.rank_list is not None:
        base["targeting"] = {**decision.target.to_json(), "estimated_bytes": decision.estimated_bytes}
    if withdrawable(anomaly) and step_time_s is not None and step_time_s > 0:
        lead = lead_steps(max(0, furthest_step), _return_step_s(anomaly, step_time_s), capture)
        base["in_steps"] = lead + _excursion_age_steps(anomaly, lead) + WITHDRAW_SLACK_STEPS
    if anomaly.kind != "periodic_spike" or step_time_s is None or not step_time_s > 0:
        return CaptureRequest(**base)
    d = anomaly.detail
    period = int(d["period_steps"])
    onset = int(d["next_onset_step"])
    earliest = max(0, furthest_step) + lead_steps(max(0, furthest_step), step_time_s, capture)
    while onset - decision.warmup < earliest:
        onset += period
    base["active"] = min(max(active, int(d.get("duration_steps", 1))), base.get("max_active", capture.max_active))
    return CaptureRequest(**base, start_step=onset - decision.warmup)
