"""``profwatch replay``: run the anomaly detectors and the arming path over recorded step telemetry (I/O at the
edge: reads one JSONL file and an optional TOML config; the work is :func:`replay_lines`, pure).

Record format: ``daemon/profwatch/core/fleet/telemetry.py`` (what ``profwatch telemetry --job J`` writes).

Replay goes through the coordinator's arming path (``daemon/profwatch/core/arming/policy.py``): the same detector
(``JobDetector``), the same episodes and capture queue (:class:`~profwatch.core.arming.episodes.JobEpisodes` with its
:class:`~profwatch.core.arming.policy.ArmHistory`, so a would-arm in observe mode counts for the cooldown, the gap and
the caps as an arm does), the same policy, the same step time (``JobDetector.baseline_step_time_s``) and the same
planner (``profwatch.core.capture.planner.plan_capture`` with the ``[capture]`` settings). Time is taken from the
records' ``ts_unix_s``: it stands for the arrival time of each report (stall checks, episode closing and the
queue run once per second of record time, and at each anomaly). Arms are simulated: the capture counts as in
flight until the job's furthest step passes the window plus ``parse_steps`` (then it ends with status
``simulated``: no verdict, so nothing is released, and the rotation rule takes the detector's ranks at the arm
for the capture's top rank), and its steps are excluded from detection, as the coordinator does.

Bounds: every line is read in bounded memory (``adapters/fs/bounded_read.py``): a line over the wire's 4 MiB batch
cap is a counted bad line, a line without end (``/dev/zero``) stops the reading; a pipe or device is spooled to a
temporary file line by line, at most :data:`MAX_SPOOL_BYTES` of it (more: exit 2, nothing replayed); a file names
at most ``[limits] max_jobs_total`` jobs (``--config``'s, else :data:`MAX_JOBS`). No valid record at all: exit 2.
"""

from __future__ import annotations

import itertools
import json
import math
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from profwatch.adapters.fs.bounded_read import (
    CappedReader,
    EndlessInput,
    OverlongLine,
    StreamTooLarge,
    iter_lines,
    read_capped,
)
from profwatch.core.arming.episodes import JobEpisodes
from profwatch.core.arming.policy import ArmingPolicy, ArmingSettings, capture_request, withdrawal_lead
from profwatch.core.capture.planner import CaptureSettings, JobProgress, plan_capture, spike_hold
from profwatch.core.detection.job_detector import Anomaly, DetectionSettings, JobDetector
from profwatch.core.fleet.generations import GenerationOpened
from profwatch.core.fleet.limits import LimitSettings
from profwatch.core.fleet.replay_runs import RunFollower
from profwatch.core.fleet.telemetry import TelemetryRecord, dump_jsonl
from profwatch.core.step_numbering import profiled_report_steps
from profwatch.core.verdict.settings import AnalysisSettings
from profwatch.exitcodes import EXIT_USAGE
from rankhook.wire import MAX_BATCH_BYTES

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["ReplayConfig", "dump_jsonl", "load_config", "render_summary", "replay", "replay_lines", "replay_source"]

MAX_BAD_LINES_LISTED = 100
MAX_LINE_BYTES = MAX_BATCH_BYTES
"""Longest line read (the wire's 4 MiB batch cap: no record the coordinator could have received is longer); a
longer line is a counted bad line, and a line without end stops the reading (``adapters/fs/bounded_read.py``)."""
MAX_SPOOL_BYTES = 64 * MAX_LINE_BYTES
"""Most bytes read from a pipe or device (256 MiB: the bounded reader's skip bound for one line), which has to be
spooled to a temporary file to be read twice; more stops the replay with exit 2 (``/dev/urandom`` or ``yes |``
never end). A regular file is read in place, with no such cap."""
MAX_JOBS = LimitSettings.model_fields["max_jobs_total"].default
"""Jobs one file may name by default (the coordinator's ``[limits] max_jobs_total``; ``--config``'s ``[limits]``
sets it, :attr:`ReplayConfig.limits`); the records of further jobs are counted bad lines."""
Line = str | OverlongLine | EndlessInput
TICK_EVERY_S = 1.0
REPLAY_PROF_ROOT = "/replay"
"""Stands in for the job's prof_root when planning (nothing is written)."""


REPLAY_TABLES = ("detection", "arming", "capture", "limits", "analysis")
"""The tables of the daemons' TOML that replay uses; the others (node, coordinator, security, ...) are ignored."""


class ReplayConfig(BaseModel):
    """The ``--config`` TOML file's ``[detection]``, ``[arming]``, ``[capture]``, ``[limits]`` and ``[analysis]``
    tables (all optional; the same tables as the daemons' config file, validated as the daemons do; of ``[limits]``
    replay uses ``max_jobs_total``, the job cap of one file, as the coordinator does; of ``[analysis]``,
    ``[analysis.ranking]``, the step-by-step test a small group's capture window is sized for, as the coordinator's
    arming policy does). Unknown keys inside them are refused; other
    tables are left out by :func:`load_config`."""

    model_config = ConfigDict(extra="forbid")
    detection: DetectionSettings = Field(default_factory=DetectionSettings)
    arming: ArmingSettings = Field(default_factory=ArmingSettings)
    capture: CaptureSettings = Field(default_factory=CaptureSettings)
    limits: LimitSettings = Field(default_factory=LimitSettings)
    analysis: AnalysisSettings = Field(default_factory=AnalysisSettings)


def load_config(path: Path | None, ignored: list[str] | None = None) -> ReplayConfig:
    """Read the daemons' TOML config (``systemd/profwatch.toml``'s format) and validate only the tables replay
    uses (:data:`REPLAY_TABLES`): the other tables are not validated (replay uses nothing of them) and their names
    are appended to ``ignored``. Raises ``ValueError`` (TOML syntax, a used table that is not a table) or
    ``ValidationError`` (a bad key or value in a used table)."""
    if path is None:
        return ReplayConfig()
    from profwatch.config import MAX_CONFIG_BYTES

    # bounded: a device, FIFO or file over the config cap is an InputTooLarge (a ValueError), never read whole
    data = tomllib.loads(read_capped(path, MAX_CONFIG_BYTES, "config file").decode("utf-8"))
    if ignored is not None:
        ignored.extend(k for k in data if k not in REPLAY_TABLES)
    return ReplayConfig.model_validate({k: v for k, v in data.items() if k in REPLAY_TABLES})


@dataclass
class _Job:
    detector: JobDetector
    episodes: JobEpisodes
    in_flight_until_step: int | None = None
    in_flight_id: str = ""
    arms: int = 0
    restarts_seen: int = 0
    last_tick_s: float = -math.inf
    events: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _StepView:
    """The StepReport fields the detector reads (avoids a wire import for replay)."""

    rank: int
    step: int
    step_time_s: float
    ts_unix_s: float
    stages: dict[str, float] | None
    flags: tuple[str, ...]
    capturing: bool
    work: float | None = None
    mode: str | None = None
    role: str | None = None
    cpu_s: float | None = None
    cpu_at_step: int | None = None
    cpu_total_s: float | None = None


def replay_lines(lines: Iterable[Line], config: ReplayConfig | None = None) -> dict[str, Any]:
    """Replay JSONL telemetry lines through detection and arming; return the ``--json`` result dict.

    Shape: ``{"records", "jobs": {job_id: {"world_size", "counters", "unlearned_units"}}, "anomalies": [...], "arms": [...],
    "suppressed": [...], "episodes": [...], "episode_events": [...], "bad_lines": {"count", "lines": [{"line",
    "error"}]}}``; ``anomalies`` and ``arms`` carry ``at_unix_s``, the record time they happened at; ``arms`` carry
    the ``episode_id`` they captured, their ``capture_id`` (``replay-<job>-<n>``, as the episodes' captures name it) and ``waited_s`` since it opened; ``suppressed``
    lists anomalies not armed when they arrived, with what their episode waits for (it is armed later when the
    budget allows, unless it closes first); ``episodes`` every episode, open and closed, as
    :meth:`~profwatch.core.arming.episodes.Episode.to_json`; ``generations`` the new runs the records show
    (``job_generation`` data: records that name their ``pid`` follow the coordinator's rule,
    ``daemon/profwatch/core/fleet/replay_runs.py``); ``withdrawn`` the arms withdrawn before their window because
    their excursion came back (``capture_id``, ``at_unix_s``, ``why``: ``JobEpisodes.withdraw_returned``; also
    counted per job). Bad lines are counted with their 1-based line numbers
    (first 100 listed); nothing here raises on bad input.
    """
    seq = lines if isinstance(lines, Sequence) else list(lines)
    return replay_source(lambda: seq, config)


def replay_source(open_lines: Callable[[], Iterable[Line]], config: ReplayConfig | None = None) -> dict[str, Any]:
    """:func:`replay_lines` over a source read twice, in bounded memory: ``open_lines()`` must give the same lines
    each call (a file opened again). The first pass validates every line and learns each job's world size (the
    detectors are built for it before the first step), the second replays; no record is kept between them, so
    memory does not grow with the number of records (only with ranks, episodes and what the result lists).
    Same result shape and errors as :func:`replay_lines`. At most ``config.limits.max_jobs_total`` jobs (default
    :data:`MAX_JOBS`, the coordinator's): the records of further jobs are counted bad lines."""
    cfg = config or ReplayConfig()
    max_jobs = cfg.limits.max_jobs_total
    bad: list[dict[str, Any]] = []
    bad_count = 0
    records = 0
    sizes: dict[str, int] = {}
    seen_lines = 0
    for no, rec in _parsed(open_lines()):
        seen_lines = no
        if isinstance(rec, BaseException):
            bad_count += 1
            if len(bad) < MAX_BAD_LINES_LISTED:
                bad.append({"line": no, "error": _short_error(rec)})
            continue
        if rec.job_id not in sizes and len(sizes) >= max_jobs:
            bad_count += 1
            if len(bad) < MAX_BAD_LINES_LISTED:
                bad.append({"line": no, "error": f"job cap: the file names more than {max_jobs} jobs "
                                                 "(the coordinator's limits.max_jobs_total)"})
            continue
        records += 1
        sizes[rec.job_id] = max(sizes.get(rec.job_id, 1), rec.world_size or 1, rec.rank + 1)
    policy = ArmingPolicy(cfg.arming, cfg.analysis.ranking)
    jobs = {jid: _Job(JobDetector(jid, n, cfg.detection, hold=spike_hold(cfg.capture)), JobEpisodes(jid, cfg.arming))
            for jid, n in sizes.items()}
    result: dict[str, Any] = {"anomalies": [], "arms": [], "suppressed": [], "episode_events": [],
                              "generations": [], "withdrawn": []}
    runs = RunFollower()  # records that name their process (pid) follow the coordinator's new-run rule
    last_ts = -math.inf
    # only the lines the first pass judged: a file appended meanwhile (a job still writing it) adds nothing, and a
    # record whose job the first pass did not see (the file was rewritten between the passes) is skipped
    for _, rec in _parsed(itertools.islice(open_lines(), seen_lines)):
        if isinstance(rec, BaseException):
            continue  # counted by the first pass
        job = jobs.get(rec.job_id)
        if job is None:
            continue
        det = job.detector
        last_ts = max(last_ts, rec.ts_unix_s)
        if rec.kind == "bye":
            det.mark_left(rec.rank)
            runs.bye(rec.job_id, rec.rank, rec.step, rec.ts_unix_s)
            continue
        assert rec.step_time_s is not None
        if rec.pid is not None:
            run = runs.observe(job_id=rec.job_id, rank=rec.rank, world_size=rec.world_size or det.world_size,
                               step=rec.step, step_time_s=rec.step_time_s, ts_unix_s=rec.ts_unix_s, pid=rec.pid,
                               node=rec.node)
            if run.opened is not None:
                det = _new_run(job, run.opened, cfg, rec.ts_unix_s, result)
            if not run.accepted:
                continue  # refused or not of the current run, as the coordinator would
        found = det.observe(_StepView(rec.rank, rec.step, rec.step_time_s, rec.ts_unix_s, rec.stages,
                                      rec.flags, rec.capturing, rec.work, rec.mode, rec.role, rec.cpu_s,
                                      rec.cpu_at_step, rec.cpu_total_s), rec.ts_unix_s)
        tick = rec.ts_unix_s - job.last_tick_s >= TICK_EVERY_S
        if tick:
            job.last_tick_s = rec.ts_unix_s
            found += det.tick(rec.ts_unix_s)
        if found or tick:
            _handle(found, job, policy, cfg, rec.ts_unix_s, result)
    for job in jobs.values():
        _handle(job.detector.tick(last_ts), job, policy, cfg, last_ts, result)
    result["episodes"] = [e.to_json() for j in jobs.values()
                          for e in sorted([*j.episodes.open.values(), *j.episodes.closed],
                                          key=lambda e: e.opened_unix_s)]
    result["records"] = records
    result["jobs"] = {jid: {"world_size": j.detector.world_size, "counters": dict(j.detector.counters),
                            "withdrawn": j.episodes.withdrawn,
                            "unlearned_units": j.detector.unlearned_units}
                      for jid, j in jobs.items()}
    result["bad_lines"] = {"count": bad_count, "lines": bad}
    return result


def _parsed(lines: Iterable[Line]) -> Iterator[tuple[int, TelemetryRecord | BaseException]]:
    """``(1-based line number, record or the error that refused it)`` for every non-blank line (both passes of
    :func:`replay_source` read the lines through this one parse); an overlong line, or the endless one that stopped
    the reading, is an error."""
    for no, line in enumerate(lines, start=1):
        if isinstance(line, OverlongLine):
            yield no, ValueError(f"line of {line.length} bytes, longer than the wire's {MAX_LINE_BYTES} byte cap")
            continue
        if isinstance(line, EndlessInput):
            yield no, ValueError(f"reading stopped: {line}")
            return
        text = line.strip()
        if not text:
            continue
        try:
            # strict, as the live wire parses a rank message (profwatch.core.messages): "rank": "3", true or 1.0,
            # "capturing": "yes" are refused there, so they are bad lines here
            yield no, TelemetryRecord.model_validate_json(text, strict=True)
        except (ValueError, ValidationError, TypeError, RecursionError) as exc:
            yield no, exc


def _new_run(job: _Job, opened: GenerationOpened, cfg: ReplayConfig, now: float, result: dict[str, Any]) -> JobDetector:
    """A new generation of the job (the coordinator's ``_on_generation``): a fresh detector for its world size, its
    episodes closed and a fresh budget; a simulated capture of the old run ends; the old run's learned level is the
    new detector's reference while it learns (``JobDetector.inherit``). Returns the new detector."""
    previous = job.detector.generation_level()
    job.detector = JobDetector(opened.job_id, opened.world_size, cfg.detection, hold=spike_hold(cfg.capture))
    job.detector.inherit(previous)
    job.in_flight_until_step, job.restarts_seen = None, 0
    events = job.episodes.new_run(now, "new_generation")
    result["episode_events"].extend({"type": e.type, "job_id": opened.job_id, **e.data} for e in events)
    result["generations"].append(opened.to_json())
    return job.detector


def _short_error(exc: BaseException) -> str:
    """One line for a bad record: every field the validation refused, grouped by message (``job_id, rank, step:
    Field required``), at most 200 characters; else the exception's type and text."""
    if isinstance(exc, ValidationError):
        by_msg: dict[str, list[str]] = {}
        for err in exc.errors():
            loc = ".".join(str(x) for x in err.get("loc", ()))
            cause = (err.get("ctx") or {}).get("error") if err.get("type") == "value_error" else None
            # a validator's own words, without pydantic's "Value error, " prefix (as config.error_lines says them)
            by_msg.setdefault(str(cause) if cause is not None else str(err.get("msg", "")), []).append(loc)
        if by_msg:
            return "; ".join(f"{', '.join(x for x in locs if x)}: {msg}" if any(locs) else msg
                             for msg, locs in by_msg.items())[:200]
    return f"{type(exc).__name__}: {exc}"[:200]


def _handle(found: list[Anomaly], job: _Job, policy: ArmingPolicy, cfg: ReplayConfig, now: float,
            result: dict[str, Any]) -> None:
    """Fold the anomalies into episodes, end a simulated capture whose window passed, close quiet episodes, then
    arm what the queue gives (the coordinator's order: ``CaptureShell.on_anomaly`` and ``tick``)."""
    det, book = job.detector, job.episodes
    furthest = det.furthest_step
    restarts = det.counters["restarts"]
    if job.in_flight_until_step is not None and (furthest is None or furthest > job.in_flight_until_step
                                                  or restarts != job.restarts_seen):
        job.in_flight_until_step = None  # window plus parse steps passed (or the step counter restarted)
        ended = book.capture_ended(job.in_flight_id, now, "simulated")  # culprit_rotates, as the coordinator's
    else:
        ended = []
    job.restarts_seen = restarts
    events = ended
    fresh = []
    for a in found:
        result["anomalies"].append({**a.to_json(), "at_unix_s": now})
        ep, evs = book.observe(a, now)
        events += evs
        if ep is not None:
            fresh.append((a, ep))
        else:
            result["suppressed"].append({"job_id": a.job_id, "kind": a.kind, "step": a.step,
                                         "reason": "transient_not_capturable"})
    if job.in_flight_until_step is not None:  # a capture whose excursion came back before its window: withdrawn
        reach = withdrawal_lead(furthest, det.baseline_step_time_s, None, cfg.capture)
        for cid, why, evs in book.withdraw_returned(now, furthest_step=furthest, reach_steps=reach,
                                                    returned=_returned(det)):
            events += evs
            job.in_flight_until_step = None
            result["withdrawn"].append({"job_id": det.job_id, "capture_id": cid, "at_unix_s": now, "why": why})
    events += book.advance(now, furthest_step=furthest, step_time_s=det.baseline_step_time_s, ongoing=det.ongoing(),
                           unit_steps=det.unit_steps())
    armed = set()
    for _ in range(len(book.open) + 1):  # each pass arms one episode or stops: bounded even with no gap
        picked = book.next_arm(policy, now, capture_in_flight=job.in_flight_until_step is not None,
                               stalled_ranks=det.stalled_ranks)
        if picked is None:
            break
        ep, d = picked
        waited_for = ep.waiting or None  # what it waited for before this pass picked it (armed() clears it)
        at = furthest if furthest is not None else ep.last_step
        step_time = det.baseline_step_time_s
        try:
            req = capture_request(ep.anomaly(), d, furthest_step=at, step_time_s=step_time, capture=cfg.capture)
            plan = plan_capture(req, JobProgress(job_id=ep.job_id, world_size=det.world_size,
                                                 furthest_step=max(0, at), step_time_s=step_time,
                                                 prof_root=REPLAY_PROF_ROOT, now_unix_s=now), cfg.capture)
        except (ValueError, KeyError, TypeError) as exc:  # CannotPlanCapture / InvalidProfilerConfig are ValueErrors
            book.arm_failed(ep.episode_id, now, f"plan_failed: {exc}")
            continue
        job.arms += 1
        cid = f"replay-{ep.job_id}-{job.arms}"
        book.history.record(d, now, cid)
        covered = tuple(plan.rank_list) if plan.rank_list is not None else None
        for e in book.armed(ep.episode_id, cid, now, covered=covered, start_step=plan.start_step, step_time_s=step_time,
                            status="would_arm" if d.action == "would_arm" else None):
            armed.add(e.episode_id)
        if d.action == "arm":
            first, last = profiled_report_steps(plan.start_step, plan.warmup, plan.active)
            det.exclude_steps(first, last, "capture")
            job.in_flight_until_step = last + cfg.detection.parse_steps
            job.in_flight_id = cid
        result["arms"].append({"job_id": ep.job_id, "kind": ep.kind, "step": ep.last_step, "at_unix_s": now,
                               "start_step": plan.start_step, "warmup": plan.warmup, "active": plan.active,
                               "rank_list": plan.rank_list, "reason": plan.reason, "action": d.action,
                               "episode_id": ep.episode_id, "capture_id": cid, "ranks": list(ep.ranks),
                               "waited_s": round(now - ep.opened_unix_s, 3), "waited_for": waited_for,
                               "armed_at_step": at, "base_step": plan.base_step, "lead_steps": plan.lead_steps,
                               "poll_interval_s": plan.poll_interval_s})
    for a, ep in fresh:
        if ep.episode_id not in armed:
            reason = "covered_by_capture" if ep.in_flight is not None else ep.waiting
            result["suppressed"].append({"job_id": a.job_id, "kind": a.kind, "step": a.step, "reason": reason,
                                         "episode_id": ep.episode_id})
    result["episode_events"].extend({"type": e.type, "job_id": job.detector.job_id, **e.data} for e in events)


def _returned(det: JobDetector) -> Callable[[int], dict[str, Any] | None]:
    """The detector's evidence that a reported excursion came back (``JobDetector.excursion_returned``), as JSON."""
    def returned(first_step: int) -> dict[str, Any] | None:
        r = det.excursion_returned(first_step)
        return r.to_json() if r is not None else None
    return returned


TELEMETRY_EXAMPLE = ('{"job_id": "j1", "rank": 0, "world_size": 8, "step": 120, "step_time_s": 0.412, '
                     '"ts_unix_s": 1764500042.5}')
"""One telemetry record, as the error for a file with no valid record shows it (the help gives the same)."""


def rank_levels(anomalies: list[dict[str, Any]], job_id: str, kind: str, ranks: list[int],
                upto_step: int | None) -> str:
    """Each rank's own size as its latest anomaly of ``kind`` (of ``job_id``, up to ``upto_step``) reported it:
    ``rank 1 +49.5% (step 157), rank 0 +18.6% (step 175)``, from the anomaly's per-rank ``detail.excess`` (or its
    magnitude when it named that rank alone). "" when a rank has no such report (the caller shows the episode's
    figure): an episode folded from several ranks' reports carries one magnitude, the largest or the latest,
    which read as every rank's."""
    if not ranks:
        return ""
    parts = []
    for rank in ranks[:8]:
        got = None
        for a in anomalies:
            if a["job_id"] != job_id or a["kind"] != kind or rank not in (a.get("ranks") or ()):
                continue
            if upto_step is not None and a["step"] > upto_step:
                continue
            excess = (a.get("detail") or {}).get("excess")
            size = excess.get(rank, excess.get(str(rank))) if isinstance(excess, dict) else None
            if size is None and list(a["ranks"]) == [rank]:
                size = a["magnitude"]
            if isinstance(size, (int, float)):
                got = (float(size), a["step"])
        if got is None:
            return ""
        parts.append(f"rank {rank} {got[0]:+.1%} (step {got[1]})")
    return ", ".join(parts)


def arm_step_text(arm: dict[str, Any]) -> str:
    """Why an arm's ``start_step`` is where it is: the step the job had reached when it was armed (later than the
    episode's report when it waited, and for what: ``core/status_text.py: wait_phrase``) plus the planner's lead
    (``core/capture/planner.py: lead_steps``: the ranks read their profiler config every ``poll_interval_s``, plus
    ``[capture] margin_s`` and ``margin_steps``) plus the steps the request asked beyond it (a periodic spike's
    predicted onset, a withdrawable level report's wait), one sum. "" for an arm recorded without them."""
    from profwatch.core.status_text import wait_phrase

    at, base, lead = arm.get("armed_at_step"), arm.get("base_step"), arm.get("lead_steps")
    if not isinstance(at, int) or not isinstance(base, int) or not isinstance(lead, int):
        return ""
    waited = ""
    if at > arm["step"]:
        waited = f", {at - arm['step']} steps after its report at step {arm['step']}"
        waited += (f" ({wait_phrase(arm['waited_for'], past=True)})" if arm.get("waited_for")
                   else f" ({arm.get('waited_s', 0):.0f} s after the episode opened)")
    lead_text = (f"{lead} steps of lead (the ranks read their profiler config every {arm['poll_interval_s']:g} s, "
                 "plus [capture] margin_s and margin_steps)")
    start = arm["start_step"]
    extra = start - base - lead
    why = ("to the spike's predicted onset: the window starts on an occurrence" if arm.get("kind") == "periodic_spike"
           else "asked beyond the lead: a level report's window waits to see whether its excursion comes back, "
                "core/arming/policy.py: capture_request")
    tail = "" if extra == 0 else f" {'+' if extra > 0 else '-'} {abs(extra)} steps ({why})"
    return f"armed at step {at}{waited}; start_step {start} = step {base} + {lead_text}{tail}"


def render_summary(result: dict[str, Any]) -> str:
    """Readable multi-line summary of a :func:`replay_lines` result."""
    out = [f"records: {result['records']}  jobs: {len(result['jobs'])}  bad lines: {result['bad_lines']['count']}"]
    for b in result["bad_lines"]["lines"][:10]:
        out.append(f"  bad line {b['line']}: {b['error']}")
    for jid, j in result["jobs"].items():
        for ranks in j.get("unlearned_units") or ():
            out.append(f"  {jid} ranks={ranks[:8]}: not watched: no usual step learned, every step so far was an "
                       f"idle gap or excluded ({j['counters'].get('idle_steps', 0)} idle steps)")
    out.append(f"anomalies: {len(result['anomalies'])}")
    for a in result["anomalies"]:
        ranks = f" ranks={a['ranks'][:8]}" if a["ranks"] else ""
        det = a.get("detail") or {}
        first, period = det.get("first_step"), det.get("period_steps")
        since = f" (since step {first})" if isinstance(first, int) and 0 <= first < a["step"] else ""
        since += f" (every {period} steps)" if isinstance(period, int) and period > 0 else ""
        stage = det.get("stage")
        stages = {str(k): str(v) for k, v in stage.items()} if isinstance(stage, dict) else {}  # rank -> stage
        named = sorted({stages[k] for k in map(str, a["ranks"][:8]) if k in stages})
        since += f" in {', '.join(named)}" if named else ""
        out.append(f"  {a['job_id']} step {a['step']}: {a['kind']} {a['magnitude']:+.1%}{ranks}{since}")
    out.append(f"arms: {len(result['arms'])}")
    for r in result["arms"]:
        levels = rank_levels(result["anomalies"], r["job_id"], r["kind"], r["ranks"], r.get("armed_at_step"))
        out.append(f"  {r['job_id']} step {r['step']}: {r['action']} start_step={r['start_step']} "
                   f"warmup={r['warmup']} active={r['active']} ({r['reason']})"
                   + (f"; per rank, as last reported: {levels}" if levels else ""))
        why = arm_step_text(r)
        if why:
            out.append(f"    {why}")
    for w in result.get("withdrawn") or ():
        out.append(f"  {w['job_id']}: {w['capture_id']} withdrawn: {w['why']}")
    out.append(f"not armed on arrival: {len(result['suppressed'])}")
    for s in result["suppressed"]:
        out.append(f"  {s['job_id']} step {s['step']}: {s['kind']} waits ({s['reason']})")
    eps = result.get("episodes") or []
    out.append(f"episodes: {len(eps)}")
    for e in eps:
        ranks = f" ranks={e['ranks'][:8]}" if e["ranks"] else ""
        caps = sum(1 for c in e["captures"] if c.get("own", True))
        others = len(e["captures"]) - caps  # another episode's capture that covered this one's steps
        end = f"closed ({e['close_reason']})" if e["closed_unix_s"] is not None else "open"
        wait = f", waits: {e['waiting']}" if e["waiting"] and not caps else ""
        last = max(e["last_step"], e.get("last_ongoing_step", e["last_step"]))  # held until, not last report
        covered = f" (+{others} of another episode)" if others else ""
        levels = rank_levels(result["anomalies"], e["job_id"], e["kind"], e["ranks"], last)
        size = levels or f"{e['peak_magnitude']:+.1%}"  # each rank its own figure, never another rank's
        out.append(f"  {e['job_id']} {e['kind']}{ranks} steps {e['opened_step']}-{last} "
                   f"{size}: {end}, {caps} capture(s){covered}{wait}")
    return "\n".join(out)


def bounded(f: Any) -> Iterator[Line]:
    """The lines of ``f`` (binary) through the bounded reader; the :class:`EndlessInput` that stops it comes last."""
    try:
        yield from iter_lines(f, MAX_LINE_BYTES)
    except EndlessInput as exc:
        yield exc


_OVERLONG, _ENDLESS = b"\x00overlong ", b"\x00endless "


def _spooled(item: Line) -> bytes:
    if isinstance(item, OverlongLine):
        return _OVERLONG + str(item.length).encode() + b"\n"
    if isinstance(item, EndlessInput):
        return _ENDLESS + str(item).encode() + b"\n"
    return item.replace("\n", " ").encode() + b"\n"


def _unspool(spool: Any) -> Iterator[Line]:
    spool.seek(0)
    for raw in iter_lines(spool, MAX_LINE_BYTES):
        if isinstance(raw, str) and raw.startswith("\x00overlong "):
            yield OverlongLine(int(raw.split(" ", 1)[1]))
        elif isinstance(raw, str) and raw.startswith("\x00endless "):
            yield EndlessInput(raw.split(" ", 1)[1])
        else:
            yield raw


@click.command("replay")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="the daemons' TOML config (e.g. /etc/profwatch/profwatch.toml): its [detection], "
                                 "[arming], [capture], [limits] and [analysis] tables are used (of [limits], "
                                 "max_jobs_total: the job cap; of [analysis], [analysis.ranking]), the others ignored "
                                 "(one line says which).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def replay(file: Path, config_path: Path | None, as_json: bool) -> None:
    """Replay recorded step telemetry FILE.jsonl through anomaly detection and the arming policy.

    \b
    One JSON object per line (what `profwatch telemetry --job J` writes):
      {"job_id": "j1", "rank": 0, "world_size": 8, "step": 120, "step_time_s": 0.412, "ts_unix_s": 1764500042.5}
    required: job_id, rank, step, step_time_s (seconds), ts_unix_s; world_size on at least one line per job;
    optional: stages {"forward": 0.1, ...} (seconds), flags ["checkpoint"|"eval"], capturing (bool),
    work (per step: tokens, samples), mode ("training"|"serving"), role (e.g. "pp1"), pid, node;
    {"kind": "bye", "job_id", "rank", "step", "ts_unix_s"} marks a rank that left on purpose.
    Bad lines are counted and listed with their line numbers.
    Arming goes through the coordinator's path: the same policy, history and capture planner.
    Lines are read in bounded memory: a line over 4 MiB (the wire's batch cap) is a bad line, a line without end
    stops the reading; at most 1024 jobs per file (the coordinator's max_jobs_total, or --config's [limits] max_jobs_total),
    further jobs' lines are bad;
    a pipe or device (/dev/stdin) is spooled to a temporary file, at most 256 MiB of it.
    Exit codes (daemon/profwatch/exitcodes.py): 0 replayed; 2 bad --config, no valid record (every line bad, or an
    empty file), or a pipe or device that gave more than 256 MiB.
    """
    from profwatch.commands.common import resolve_config_path

    ignored: list[str] = []
    given = config_path
    config_path = resolve_config_path(config_path)  # as every command: profwatch --config, PROFWATCH_CONFIG, /etc
    if given is None and config_path is not None:
        click.echo(f"profwatch replay: config {config_path} (profwatch --config, PROFWATCH_CONFIG or the default "
                   "path; --config names another)", err=True)
    try:
        cfg = load_config(config_path, ignored)
    except (ValueError, ValidationError, OSError) as exc:
        raise click.BadParameter(_short_error(exc), param_hint="--config") from exc
    if ignored:
        click.echo(f"profwatch replay: using [{'], ['.join(REPLAY_TABLES)}] of {config_path}; ignoring "
                   f"[{'], ['.join(ignored)}] (not used by replay, not validated)", err=True)

    def lines() -> Iterator[Line]:
        with file.open("rb") as f:
            yield from bounded(f)

    if file.is_file():  # read twice, in bounded memory
        result = replay_source(lines, cfg)
    else:  # a pipe (/dev/stdin, a FIFO, a device) can be read once: spooled to a temporary file, line by bounded line
        import tempfile

        with tempfile.TemporaryFile() as spool:
            try:
                with file.open("rb") as f:
                    for item in bounded(CappedReader(f, MAX_SPOOL_BYTES)):
                        spool.write(_spooled(item))
            except StreamTooLarge as exc:
                click.echo(f"profwatch replay: {file} is not a regular file and gave {exc}: it may never end "
                           f"(nothing replayed); save the records to a file first (profwatch telemetry --job J > "
                           f"FILE.jsonl), a regular file has no such cap", err=True)
                sys.exit(EXIT_USAGE)
            result = replay_source(lambda: _unspool(spool), cfg)
    click.echo(json.dumps(result, indent=2, sort_keys=False, default=str) if as_json else render_summary(result))
    if not result.get("records"):
        bad = result.get("bad_lines", {}).get("count", 0)
        what = f"{bad} bad line{'s' * (bad != 1)} (listed above)" if bad else "the file is empty"
        click.echo(f"profwatch replay: no valid step record in {file}: {what}. Expected one JSON object per "
                   f"line, e.g. {TELEMETRY_EXAMPLE} (`profwatch telemetry --job J > FILE.jsonl` writes them; "
                   f"`profwatch replay --help` lists the fields)", err=True)
        sys.exit(EXIT_USAGE)
