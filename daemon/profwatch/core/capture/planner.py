"""Capture planning (pure: no I/O, time passed in); re-exports the ``profiler_config.json`` model.

* :class:`ProfilerConfig` (``daemon/profwatch/core/capture/profiler_config.py``) mirrors torch_npu's ``profiler_config.json``;
  where torch_npu would reset a value it **refuses** it with :class:`InvalidProfilerConfig`, quoting torch_npu's
  own log line. :meth:`ProfilerConfig.render` emits only known keys.
* :func:`plan_capture` turns a :class:`CaptureRequest` and the job's :class:`JobProgress` into a
  :class:`CapturePlan` with an absolute ``start_step`` ahead of the ranks the capture covers, a per-capture
  ``prof_dir``, request-id ``metadata`` and a wall-clock deadline per covered rank (``docs/capture-lifecycle.md``
  "Planning": torch_npu's step counter is per process, its monitor polls every 2 s and later every step time).
"""

from __future__ import annotations

import functools
import hashlib
import math
import posixpath
import re
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from profwatch.core.batches.prof_layout import NAMED_RANKS_KEY, RANK_LIST_KEY, WORLD_SIZE_KEY, encode_rank_list
from profwatch.core.capture.profiler_config import (
    MAX_CONFIG_BYTES,
    MAX_METADATA_VALUE_CHARS,
    AicMetrics,
    ExperimentalConfig,
    ExportType,
    HostSys,
    InvalidProfilerConfig,
    ProfilerConfig,
    ProfilerLevel,
)

__all__ = [
    "MAX_CONFIG_BYTES", "AicMetrics", "CannotPlanCapture", "CapturePlan", "CaptureRequest", "CaptureSettings",
    "ExperimentalConfig", "ExportType", "HostSys", "InvalidProfilerConfig", "JobProgress", "ProfilerConfig",
    "ProfilerLevel", "lead_steps", "max_steps_ahead", "new_capture_id", "plan_capture", "poll_interval_s",
]

FIRST_POLL_INTERVAL_S = 2.0
POLL_STEP = 11
_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}\Z")  # \Z: no final newline


class CannotPlanCapture(ValueError):
    """A capture request that cannot be planned safely (unknown step time, start_step too close, bad ids)."""


CAPTURE_WINDOW_NOTE = """Default capture window: ``warmup = 1``, ``active = 4`` (owner of the choice: the verdicts work,
docs/verdicts.md).

Why 4 recorded steps. The ranking pools each rank's excess over the recorded steps *without its worst step*, so a
one-off delay (the profiler's start-up on one rank, a GC pause) never makes a suspect, and a verdict resting on
fewer than 3 steps is reported as ``weak``. With ``active = 2`` the pool is the smaller of two steps: no gain over
one step, and a lost step leaves the verdict weak. With 4 the pool spans 3 steps (noise / sqrt(3), 0.58 of one
step's), and one step can be lost with the evidence still strong. More steps buy little: 6 would take the noise
to 0.45 of a step's for 50 % more bytes.

Cost. Captured bytes grow linearly with ``active`` (warm-up steps are profiled but not written): a rank dir is a
fixed part plus, per recorded step, about 0.4 KB of profiler DB rows per device kernel launched (TASK,
COMPUTE_TASK_INFO, CANN_API, PYTORCH_API; measured on the simulator's trees: 10.9 KB per step of 24 kernels), and
the raw PROF_* data again about as much. A job launching 20,000 kernels per step thus writes about 8 MB of DB per
rank and recorded step: 32 MB per rank for 4 steps against 16 MB for the old 2, i.e. 32 GB against 16 GB for a
full capture of 1,024 ranks, which is what ``max_capture_bytes_per_hour`` and targeted captures (``rank_list``)
are for."""


class CaptureSettings(BaseModel):
    """How profwatch arms captures. Units in names; ``margin_s`` covers the writer's wait for a fresh mtime
    second (<= 1 s) and NFS attribute caching; ``deadline_*`` bound how long a capture may take (a rank that stops
    stepping never reaches start_step: ``docs/capture-lifecycle.md``); ``write_timeout_s`` and ``final_scan_grace_s``
    bound the write and the final scan. ``manual_warmup``/``manual_active``: the window of a manual capture that
    names none (``profwatch arm`` without ``--warmup``/``--active``), justified in :data:`CAPTURE_WINDOW_NOTE`;
    the captures detection arms use ``[arming] warmup``/``active``, the reference ``[reference] active_steps``.
    The old names ``warmup``/``active`` are still read, so a config written for them keeps working."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    manual_warmup: int = Field(default=1, ge=0, validation_alias=AliasChoices("manual_warmup", "warmup"),
                               description=(
        "profiler warm-up steps (profiler_config.json warmup) of a manual capture that names none (profwatch arm "
        "without --warmup); formerly warmup, still read"))
    manual_active: int = Field(default=4, gt=0, validation_alias=AliasChoices("manual_active", "active"),
                               description=(
        "steps recorded (profiler_config.json active) by a manual capture that names none (profwatch arm without "
        "--active), at least [arming] active (a manual capture is judged as the captures detection arms are: "
        "manual_default_active); fewer than [analysis.ranking] min_strong_steps gives a weak verdict; formerly active, "
        "still read"))
    margin_steps: int = Field(default=2, ge=0, description=(
        "steps added to the lead: start_step = furthest rank + lead(step time, torch_npu poll interval) + "
        "margin_steps"))
    margin_s: float = Field(default=2.0, ge=0, description=(
        "seconds added to the lead: the writer's wait for a fresh mtime second and NFS attribute caching"))
    export_type: list[ExportType] = Field(default_factory=lambda: list[ExportType](["db"]), min_length=1, description=(
        "torch_npu export types written (profiler_config.json export_type); msprof-analyze's cluster recipes read "
        "only db"))
    profiler_level: ProfilerLevel = Field("Level1", description=(
        "torch_npu profiler level; Level1 records the communication data cluster analysis needs"))
    analyse: bool = Field(True, description=(
        "torch_npu parses its raw data after the window (profiler_config.json analyse); needed for analyse.done"))
    async_mode: bool = Field(True, description=(
        "torch_npu parses in a background process (profiler_config.json async_mode), so the job is not held"))
    max_active: int = Field(default=10, gt=0, description=(
        "most steps one capture may record (an arm or a grown episode asking more is refused or capped; a capture "
        "of 2-4 ranks sized for its anomaly may pass it, up to [arming] small_group_max_active)"))
    deadline_factor: float = Field(default=3.0, ge=1.0, description=(
        "a rank's capture deadline allows its window's steps at this many times its step time"))
    deadline_grace_s: float = Field(default=120.0, ge=0, description="seconds added to every rank's capture deadline")
    write_timeout_s: float = Field(default=30.0, gt=0, le=86400, description=(
        "How long a capture may stay ``planned``: the config writer (the coordinator's file system worker, or every "
        "node daemon of the job) must confirm the write by then, else the capture fails with the reason."))
    final_scan_grace_s: float = Field(default=120.0, gt=0, le=86400, description=(
        "After a capture's judgement time, how long the final scan of its prof_dir may take before the capture is "
        "closed ``incomplete`` without one (an unreachable file system never keeps a capture open)."))


class CaptureRequest(BaseModel):
    """Ask for one capture. ``start_step`` (absolute) or ``in_steps`` (at least this many steps ahead of the
    furthest rank) override the planner's lead; ``rank_list`` None = all ranks; ``capture_id`` None = new one;
    ``targeting``: why these ranks (``profwatch.core.arming.targeting.Target.to_json`` + ``estimated_bytes``), carried into
    the capture's event and notes; ``named_ranks``: the ranks the anomaly behind it named (None: job-wide or a manual
    arm), stamped into the metadata (``prof_layout.NAMED_RANKS_KEY``); ``max_active``: a window sized for a small
    group's anomaly (``profwatch.core.arming.policy.capture_request``) may record up to this many steps, more than
    ``[capture] max_active`` (at most :data:`MAX_SIZED_ACTIVE`; None: ``[capture] max_active``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    job_id: str
    reason: str
    warmup: int | None = None
    active: int | None = None
    rank_list: list[int] | None = None
    start_step: int | None = None
    in_steps: int | None = None
    capture_id: str | None = None
    targeting: dict[str, Any] | None = None
    named_ranks: list[int] | None = None
    max_active: int | None = Field(default=None, gt=0)


MAX_SIZED_ACTIVE = 64
"""Most steps a :class:`CaptureRequest`'s own ``max_active`` allows (``[arming] small_group_max_active``'s bound)."""


class JobProgress(BaseModel):
    """Where the job is now: the furthest rank's step counter, a representative step time (s; None = not yet
    measured), ``prof_root`` (absolute, where captures land) and the wall clock ``now_unix_s``.

    ``rank_steps`` / ``rank_step_time_s`` (optional, rank -> last step / that rank's own typical step time in s)
    let the planner place ``start_step`` from the ranks the capture covers and give each rank a deadline from its
    own progress: step counters are per process, so a rank that restarted counts from 0 while its peers are far
    ahead (torch_npu ``cur_step``, see ``docs/capture-lifecycle.md``). Without them every rank is assumed to be
    at ``furthest_step`` with ``step_time_s``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    job_id: str
    world_size: int = Field(gt=0)
    furthest_step: int = Field(ge=0)
    step_time_s: float | None
    prof_root: str
    now_unix_s: float
    rank_steps: dict[int, int] = Field(default_factory=dict)
    rank_step_time_s: dict[int, float] = Field(default_factory=dict)


class CapturePlan(BaseModel):
    """One planned capture: the exact ``config`` to write and what to expect. Steps captured (active) are
    ``[start_step + warmup, start_step + warmup + active)``. ``base_step`` is the furthest step among the ranks
    the capture covers (``start_step = base_step + lead``); ``rank_deadlines_unix_s`` (covered rank -> unix s) is
    when each rank should have closed its window, from its own step and step time; ``deadline_unix_s`` is the
    latest of them (later ranks are reported as missing, with what they said). ``step_spread`` = furthest - least step counter
    among the covered ranks at plan time (large after a rank restarted its counter)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    capture_id: str
    job_id: str
    reason: str
    start_step: int
    warmup: int
    active: int
    rank_list: list[int] | None
    prof_dir: str
    config: ProfilerConfig
    deadline_unix_s: float
    lead_steps: int
    poll_interval_s: float
    base_step: int = 0
    rank_deadlines_unix_s: dict[int, float] = Field(default_factory=dict)
    step_spread: int = 0
    targeting: dict[str, Any] | None = None


MAX_AHEAD_STEPS = 1000
MAX_AHEAD_S = 3600.0


def max_steps_ahead(step_time_s: float) -> int:
    """Furthest an arm's ``start_step`` may lie ahead of the covered ranks' furthest step:
    ``max(MAX_AHEAD_STEPS, MAX_AHEAD_S / step_time_s)`` (1000 steps, or one hour at the measured step time)."""
    return max(MAX_AHEAD_STEPS, int(MAX_AHEAD_S / step_time_s))


def poll_interval_s(furthest_step: int, step_time_s: float | None) -> float:
    """torch_npu's monitor poll interval (s): 2 before step 11, then int(step_time) clamped to [1, 50] (section 2 item 4)."""
    if furthest_step < POLL_STEP or step_time_s is None:
        return FIRST_POLL_INTERVAL_S
    return float(min(50, max(1, int(step_time_s))))


def lead_steps(furthest_step: int, step_time_s: float, settings: CaptureSettings) -> int:
    """Steps between the furthest rank and the earliest safe start_step.

    ``ceil((poll_interval_s + margin_s) / step_time_s) + margin_steps`` — "What a config-writing daemon must
    respect" item 4 (margin >= ceil((poll interval + NFS delay) / step time) + 2).
    """
    poll = poll_interval_s(furthest_step, step_time_s)
    return math.ceil((poll + settings.margin_s) / step_time_s) + settings.margin_steps


def spike_hold(settings: CaptureSettings) -> Callable[[int, float], int]:
    """The planner's lead as the detectors' spike hold: ``(furthest_step, step_time_s) -> steps``
    (:func:`lead_steps` with ``settings``). A spike shorter than this is over before a capture armed at its onset
    could start; the composition root hands it to ``JobDetector(hold=...)`` so that detection never imports the
    planner."""
    return functools.partial(lead_steps, settings=settings)


def new_capture_id(job_id: str, now_unix_s: float) -> str:
    """Return ``c-YYYYmmddTHHMMSSfff-xxxx`` (UTC, ms) with 4 hex chars from the job id and time (pure)."""
    dt = datetime.fromtimestamp(now_unix_s, tz=timezone.utc)
    h = hashlib.blake2s(f"{job_id}:{now_unix_s!r}".encode(), digest_size=2).hexdigest()
    return f"c-{dt.strftime('%Y%m%dT%H%M%S')}{dt.microsecond // 1000:03d}-{h}"


def capture_metadata(capture_id: str, reason: str, job_id: str, rank_list: list[int] | None,
                     world_size: int, named_ranks: list[int] | None = None) -> dict[str, Any]:
    """The config's ``metadata``, which torch_npu (``add_metadata_json``) and the torch.profiler backend copy into
    every rank dir's ``profiler_metadata.json``: ``profwatch_capture_id``/``_reason``/``_job_id``, and for a
    targeted capture its ``rank_list`` as ranges (``prof_layout.RANK_LIST_KEY``, e.g. ``"0-3,8"``; left out when
    even as ranges it would pass torch_npu's 4,096-character limit per value) and the job's world size
    (``prof_layout.WORLD_SIZE_KEY``), so ``scan``/``analyze`` read a targeted capture as one, offline too; the ranks
    the anomaly named as ranges (``prof_layout.NAMED_RANKS_KEY``; left out when too long or none)."""
    meta: dict[str, Any] = {"profwatch_capture_id": capture_id, "profwatch_reason": reason, "profwatch_job_id": job_id}
    if rank_list is not None:
        encoded = encode_rank_list(rank_list, MAX_METADATA_VALUE_CHARS)
        if encoded is not None:
            meta[RANK_LIST_KEY] = encoded
        meta[WORLD_SIZE_KEY] = world_size
    if named_ranks:
        named = encode_rank_list(named_ranks, MAX_METADATA_VALUE_CHARS)
        if named is not None:
            meta[NAMED_RANKS_KEY] = named
    return meta


def manual_default_active(manual_active: int, arming_active: int, max_active: int) -> int:
    """Steps a manual arm without ``--active`` records: ``max([capture] manual_active, [arming] active)``, at most
    ``[capture] max_active``. A manual capture shorter than the captures detection arms judged a slow rank on fewer
    steps than the user set "to outlast a loaded box's noise" and answered ``no_suspect`` (a new user's trial: 4
    steps, rank 1 3x slow, the automatic 8-step captures named it)."""
    return min(max(manual_active, arming_active), max_active)


def plan_capture(req: CaptureRequest, job: JobProgress, settings: CaptureSettings | None = None) -> CapturePlan:
    """Plan one capture. Raises :class:`CannotPlanCapture` or :class:`InvalidProfilerConfig`.

    Covered ranks: ``rank_list`` (``is_rank``/``rank_list`` only for a strict subset of ``range(world_size)``),
    else every rank. ``base_step``: the furthest step among the covered ranks in ``job.rank_steps`` (default
    ``furthest_step``). start_step: ``base_step + lead`` (see :func:`lead_steps`; the monitor poll interval is
    taken at its longest over the job's least and furthest step counters, since any rank may own the node's
    monitor); ``in_steps`` asks for at least that many steps ahead of ``base_step``; an explicit ``start_step``
    must not be earlier than the safe one, and no start may lie more than :func:`max_steps_ahead` ahead of
    ``base_step``. ``prof_dir`` = ``<prof_root>/<job_id>/<capture_id>/``.
    ``active`` may be at most ``settings.max_active``, or the request's own ``max_active`` when larger (a small
    group's sized window, at most :data:`MAX_SIZED_ACTIVE`). Deadline of covered rank r: ``now + poll + margin_s + (start_step - step_r + warmup + active) * step_time_r
    * deadline_factor + deadline_grace_s`` (``step_r``/``step_time_r``: its own step and step time when known).
    """
    s = settings or CaptureSettings()
    if req.job_id != job.job_id:
        raise CannotPlanCapture(f"request is for job {req.job_id!r}, progress for {job.job_id!r}")
    if job.step_time_s is None or not job.step_time_s > 0 or not math.isfinite(job.step_time_s):
        raise CannotPlanCapture("step time not measured yet: cannot place an absolute start_step")
    if not posixpath.isabs(job.prof_root):
        raise CannotPlanCapture(f"prof_root must be absolute, got {job.prof_root!r}")
    capture_id = req.capture_id or new_capture_id(job.job_id, job.now_unix_s)
    for what, ident in (("job_id", job.job_id), ("capture_id", capture_id)):
        if not _SAFE_ID.match(ident) or ident in (".", ".."):
            raise CannotPlanCapture(f"{what} {ident!r} is not a safe path component ([A-Za-z0-9_.-], <=128)")
    warmup = s.manual_warmup if req.warmup is None else req.warmup
    active = s.manual_active if req.active is None else req.active
    most = s.max_active if req.max_active is None else max(s.max_active, min(req.max_active, MAX_SIZED_ACTIVE))
    if active > most:
        raise CannotPlanCapture(f"active {active} over max_active {most}")
    ranks: list[int] | None = None
    if req.rank_list is not None:
        ranks = sorted(set(req.rank_list))
        out = [r for r in ranks if not 0 <= r < job.world_size]
        if out or not ranks:
            raise CannotPlanCapture(f"rank_list {req.rank_list} must be non-empty ranks in [0, {job.world_size})")
        if len(ranks) == job.world_size:
            ranks = None
    covered = ranks if ranks is not None else list(range(job.world_size))
    known = {r: job.rank_steps[r] for r in covered if r in job.rank_steps}
    base = max(known.values()) if known else job.furthest_step
    least = min(job.rank_steps.values(), default=job.furthest_step)
    poll = max(poll_interval_s(job.furthest_step, job.step_time_s), poll_interval_s(least, job.step_time_s))
    lead = math.ceil((poll + s.margin_s) / job.step_time_s) + s.margin_steps
    earliest = base + lead
    if req.start_step is not None:
        if req.start_step < earliest:
            raise CannotPlanCapture(
                f"start_step {req.start_step} too close: the covered ranks' furthest step is {base}, "
                f"earliest safe {earliest}"
            )
        start = req.start_step
    elif req.in_steps is not None:
        start = base + max(req.in_steps, lead)
    else:
        start = earliest
    furthest_ahead = max_steps_ahead(job.step_time_s)
    if start - base > furthest_ahead:
        raise CannotPlanCapture(
            f"start_step {start} is {start - base} steps ahead of the covered ranks' furthest step {base}: more than "
            f"max({MAX_AHEAD_STEPS} steps, {MAX_AHEAD_S:.0f} s at {job.step_time_s:.3g} s per step) = {furthest_ahead}; "
            "such a window would likely outlive the job (arm closer to the steps to capture)")
    start = max(start, 1)
    prof_dir = posixpath.join(job.prof_root, job.job_id, capture_id) + "/"
    config = ProfilerConfig(
        start_step=start,
        warmup=warmup,
        active=active,
        prof_dir=prof_dir,
        analyse=s.analyse,
        # torch_npu parses listed ranks online only in async mode: with is_rank and async_mode false it turns the
        # online parse off for them (docs/torch_npu-dynamic-profile.md), and completeness would wait for analyse.done
        async_mode=s.async_mode or (ranks is not None and s.analyse),
        is_rank=ranks is not None,
        rank_list=ranks or [],
        metadata=capture_metadata(capture_id, req.reason, job.job_id, ranks, job.world_size, req.named_ranks),
        experimental_config=ExperimentalConfig(profiler_level=s.profiler_level, export_type=list(s.export_type)),
    )
    rank_deadlines: dict[int, float] = {}
    for r in covered:
        step_r = known.get(r, base)
        st_r = job.rank_step_time_s.get(r) or job.step_time_s
        if not (st_r > 0 and math.isfinite(st_r)):
            st_r = job.step_time_s
        window_steps = start - step_r + warmup + active
        rank_deadlines[r] = (job.now_unix_s + poll + s.margin_s + window_steps * st_r * s.deadline_factor
                             + s.deadline_grace_s)
    spread = (max(known.values()) - min(known.values())) if known else 0
    return CapturePlan(
        capture_id=capture_id, job_id=job.job_id, reason=req.reason, start_step=start, warmup=warmup, active=active,
        rank_list=ranks, prof_dir=prof_dir, config=config, deadline_unix_s=max(rank_deadlines.values()),
        lead_steps=lead, poll_interval_s=poll, base_step=base, rank_deadlines_unix_s=rank_deadlines,
        step_spread=spread, targeting=req.targeting if ranks is not None else None,
    )
