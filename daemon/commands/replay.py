"""``profwatch replay``: run the anomaly detectors and the arming policy over recorded step telemetry (I/O at the
edge: reads one JSONL file and an optional TOML config; the work is :func:`replay_lines`, pure).

Record format (one JSON object per line; the coordinator writes it with :func:`dump_jsonl`)::

    {"job_id": "j1", "rank": 3, "world_size": 8, "step": 120, "step_time_s": 0.412, "ts_unix_s": 1764500042.5,
     "stages": {"forward": 0.1}, "flags": ["checkpoint"], "capturing": false}
    {"kind": "bye", "job_id": "j1", "rank": 3, "step": 500, "ts_unix_s": 1764500900.0}

Time is taken from the records' ``ts_unix_s`` (stall checks run once per second of record time). Arms are
simulated: the capture counts as in flight until the job's furthest step passes the window plus
``parse_steps``, and its steps are excluded from detection, as the coordinator does.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from typing import Any, Literal

import click
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from daemon.core.anomaly import Anomaly, DetectionSettings, JobDetector
from daemon.core.arming import ArmHistory, ArmingPolicy, ArmingSettings, plan_start_step

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

MAX_BAD_LINES_LISTED = 100
TICK_EVERY_S = 1.0
RECORD_KEYS = ("job_id", "rank", "world_size", "step", "step_time_s", "ts_unix_s", "stages", "flags", "capturing")


from daemon.core.messages import MAX_STEP, MAX_WORLD_SIZE  # noqa: E402  (the same bounds as the live wire)


class ReplayConfig(BaseModel):
    """The ``--config`` TOML file: ``[detection]`` and ``[arming]`` tables (both optional)."""

    model_config = ConfigDict(extra="forbid")
    detection: DetectionSettings = Field(default_factory=DetectionSettings)
    arming: ArmingSettings = Field(default_factory=ArmingSettings)


class TelemetryRecord(BaseModel):
    """One telemetry line (unknown keys such as ``v`` are ignored)."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)
    kind: Literal["step", "bye"] = "step"
    job_id: str = Field(min_length=1, max_length=128)
    rank: int = Field(ge=0, lt=MAX_WORLD_SIZE)
    world_size: int | None = Field(None, ge=1, le=MAX_WORLD_SIZE)
    step: int = Field(ge=0, lt=MAX_STEP)
    step_time_s: float | None = Field(None, ge=0)
    ts_unix_s: float
    stages: dict[str, float] | None = None
    flags: tuple[str, ...] = ()
    capturing: bool = False

    @model_validator(mode="after")
    def _check(self) -> TelemetryRecord:
        if self.kind == "step" and self.step_time_s is None:
            raise ValueError("step record without step_time_s")
        if self.world_size is not None and self.rank >= self.world_size:
            raise ValueError(f"rank {self.rank} >= world_size {self.world_size}")
        return self


def load_config(path: Path | None) -> ReplayConfig:
    """Read and validate a TOML config; raises ``ValueError`` (TOML syntax) or ``ValidationError``."""
    if path is None:
        return ReplayConfig()
    with path.open("rb") as f:
        data = tomllib.load(f)
    return ReplayConfig.model_validate(data)


def dump_jsonl(records: Iterable[Mapping[str, Any] | Any], *, world_size: int | None = None) -> str:
    """Render step records (dicts or ``rankhook.wire.StepReport`` instances) as replayable JSONL text.

    Keeps the keys of the record format only (``kind``/``v`` dropped; ``world_size`` added when given and
    absent). Returns one compact JSON object per line, newline-terminated. Raises ``ValueError`` for NaN/inf.
    """
    out: list[str] = []
    for rec in records:
        d = asdict(rec) if is_dataclass(rec) and not isinstance(rec, type) else dict(rec)
        row = {k: d[k] for k in RECORD_KEYS if k in d and d[k] is not None}
        if d.get("kind") == "bye":
            row = {"kind": "bye", **{k: d[k] for k in ("job_id", "rank", "step", "ts_unix_s") if k in d}}
        elif world_size is not None and "world_size" not in row:
            row["world_size"] = world_size
        if "flags" in row:
            if not row["flags"]:
                del row["flags"]
            else:
                row["flags"] = list(row["flags"])
        if row.get("capturing") is False:
            del row["capturing"]
        out.append(json.dumps(row, separators=(",", ":"), allow_nan=False))
    return "".join(line + "\n" for line in out)


@dataclass
class _Job:
    detector: JobDetector
    history: ArmHistory = field(default_factory=ArmHistory)
    in_flight_until_step: int | None = None
    restarts_seen: int = 0
    last_tick_s: float = -math.inf


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


def replay_lines(lines: Iterable[str], config: ReplayConfig | None = None) -> dict[str, Any]:
    """Replay JSONL telemetry lines through detection and arming; return the ``--json`` result dict.

    Shape: ``{"records", "jobs": {job_id: {"world_size", "counters"}}, "anomalies": [...], "arms": [...],
    "suppressed": [...], "bad_lines": {"count", "lines": [{"line", "error"}]}, "planner"}``. Bad lines are
    counted with their 1-based line numbers (first 100 listed); nothing here raises on bad input.
    """
    cfg = config or ReplayConfig()
    parsed: list[tuple[int, TelemetryRecord]] = []
    bad: list[dict[str, Any]] = []
    bad_count = 0
    for no, line in enumerate(lines, start=1):
        text = line.strip()
        if not text:
            continue
        try:
            parsed.append((no, TelemetryRecord.model_validate(json.loads(text))))
        except (ValueError, ValidationError, TypeError, RecursionError) as exc:
            bad_count += 1
            if len(bad) < MAX_BAD_LINES_LISTED:
                bad.append({"line": no, "error": _short_error(exc)})
    sizes: dict[str, int] = {}
    for _, rec in parsed:
        sizes[rec.job_id] = max(sizes.get(rec.job_id, 1), rec.world_size or 1, rec.rank + 1)
    policy = ArmingPolicy(cfg.arming)
    jobs = {jid: _Job(JobDetector(jid, n, cfg.detection)) for jid, n in sizes.items()}
    result: dict[str, Any] = {"anomalies": [], "arms": [], "suppressed": []}
    planners: set[str] = set()
    last_ts = -math.inf
    for _, rec in parsed:
        job = jobs[rec.job_id]
        det = job.detector
        last_ts = max(last_ts, rec.ts_unix_s)
        if rec.kind == "bye":
            det.mark_left(rec.rank)
            continue
        assert rec.step_time_s is not None
        found = det.observe(_StepView(rec.rank, rec.step, rec.step_time_s, rec.ts_unix_s, rec.stages,
                                      rec.flags, rec.capturing))
        if rec.ts_unix_s - job.last_tick_s >= TICK_EVERY_S:
            job.last_tick_s = rec.ts_unix_s
            found += det.tick(rec.ts_unix_s)
        _handle(found, job, policy, cfg, rec.ts_unix_s, result, planners)
    for job in jobs.values():
        _handle(job.detector.tick(last_ts), job, policy, cfg, last_ts, result, planners)
    result["records"] = len(parsed)
    result["jobs"] = {jid: {"world_size": j.detector.world_size, "counters": dict(j.detector.counters)}
                      for jid, j in jobs.items()}
    result["bad_lines"] = {"count": bad_count, "lines": bad}
    result["planner"] = ",".join(sorted(planners)) if planners else None
    return result


def _short_error(exc: BaseException) -> str:
    if isinstance(exc, ValidationError):
        errs = exc.errors()
        if errs:
            loc = ".".join(str(x) for x in errs[0].get("loc", ()))
            return f"{loc}: {errs[0].get('msg', '')}" if loc else str(errs[0].get("msg", ""))
    return f"{type(exc).__name__}: {exc}"[:200]


def _handle(found: list[Anomaly], job: _Job, policy: ArmingPolicy, cfg: ReplayConfig, now: float,
            result: dict[str, Any], planners: set[str]) -> None:
    det = job.detector
    furthest = det.furthest_step
    restarts = det.counters["restarts"]
    if job.in_flight_until_step is not None and (furthest is None or furthest > job.in_flight_until_step
                                                  or restarts != job.restarts_seen):
        job.in_flight_until_step = None  # window plus parse steps passed (or the step counter restarted)
    job.restarts_seen = restarts
    for a in found:
        result["anomalies"].append(a.to_json())
        state = job.history.state(now, capture_in_flight=job.in_flight_until_step is not None,
                                  stalled_ranks=det.stalled_ranks)
        d = policy.decide(a, state, now)
        if d.action == "suppress":
            result["suppressed"].append({"job_id": a.job_id, "kind": a.kind, "step": a.step, "reason": d.reason})
            continue
        start, planner = plan_start_step(a.job_id, det.world_size, furthest if furthest is not None else a.step,
                                         det.baseline_step_time_s, d, now_unix_s=now)
        planners.add(planner)
        job.history.record_arm(now)
        if d.action == "arm":
            last = start + d.warmup + d.active - 1
            det.exclude_steps(start, last, "capture")
            job.in_flight_until_step = last + cfg.detection.parse_steps
        result["arms"].append({"job_id": a.job_id, "kind": a.kind, "step": a.step, "start_step": start,
                               "warmup": d.warmup, "active": d.active,
                               "rank_list": list(d.rank_list) if d.rank_list is not None else None,
                               "reason": d.capture_reason, "action": d.action, "planner": planner})


def render_summary(result: dict[str, Any]) -> str:
    """Readable multi-line summary of a :func:`replay_lines` result."""
    out = [f"records: {result['records']}  jobs: {len(result['jobs'])}  bad lines: {result['bad_lines']['count']}"]
    for b in result["bad_lines"]["lines"][:10]:
        out.append(f"  bad line {b['line']}: {b['error']}")
    out.append(f"anomalies: {len(result['anomalies'])}")
    for a in result["anomalies"]:
        ranks = f" ranks={a['ranks'][:8]}" if a["ranks"] else ""
        out.append(f"  {a['job_id']} step {a['step']}: {a['kind']} {a['magnitude']:+.1%}{ranks}")
    out.append(f"arms: {len(result['arms'])}")
    for r in result["arms"]:
        out.append(f"  {r['job_id']} step {r['step']}: {r['action']} start_step={r['start_step']} "
                   f"warmup={r['warmup']} active={r['active']} ({r['reason']})")
    out.append(f"suppressed: {len(result['suppressed'])}")
    for s in result["suppressed"]:
        out.append(f"  {s['job_id']} step {s['step']}: {s['kind']} suppressed ({s['reason']})")
    return "\n".join(out)


@click.command("replay")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="TOML file with [detection] and [arming] tables.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def replay(file: Path, config_path: Path | None, as_json: bool) -> None:
    """Replay recorded step telemetry FILE.jsonl through anomaly detection and the arming policy.

    \b
    One JSON object per line (what `profwatch telemetry --job J` writes):
      {"job_id": "j1", "rank": 0, "world_size": 8, "step": 120, "step_time_s": 0.412, "ts_unix_s": 1764500042.5}
    required: job_id, rank, step, step_time_s (seconds), ts_unix_s; world_size on at least one line per job;
    optional: stages {"forward": 0.1, ...} (seconds), flags ["checkpoint"|"eval"], capturing (bool);
    {"kind": "bye", "job_id", "rank", "step", "ts_unix_s"} marks a rank that left on purpose.
    Bad lines are counted and listed with their line numbers.
    Exit codes: 0 replayed; 1 no valid record (every line bad, or an empty file); 2 bad --config.
    """
    try:
        cfg = load_config(config_path)
    except (ValueError, ValidationError, OSError) as exc:
        raise click.BadParameter(_short_error(exc), param_hint="--config") from exc
    with file.open("r", encoding="utf-8", errors="replace") as f:
        result = replay_lines(f, cfg)
    click.echo(json.dumps(result, indent=2, sort_keys=False, default=str) if as_json else render_summary(result))
    if not result.get("records"):
        bad = result.get("bad_lines", {}).get("count", 0)
        click.echo(f"profwatch replay: no valid step record in {file} ({bad} bad lines)", err=True)
        sys.exit(1)
