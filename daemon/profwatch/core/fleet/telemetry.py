"""The step-telemetry record format that ``profwatch telemetry`` writes and ``profwatch replay`` reads (pure).

One JSON object per line::

    {"job_id": "j1", "rank": 3, "world_size": 8, "step": 120, "step_time_s": 0.412, "ts_unix_s": 1764500042.5,
     "stages": {"forward": 0.1}, "flags": ["checkpoint"], "capturing": false, "work": 2048.0, "mode": "serving",
     "role": "pp1", "pid": 4242, "node": "node1"}
    {"kind": "bye", "job_id": "j1", "rank": 3, "step": 500, "ts_unix_s": 1764500900.0}

Required: ``job_id``, ``rank``, ``step``, ``step_time_s`` (seconds), ``ts_unix_s``; ``world_size`` on at least
one line per job; optional ``stages`` (seconds), ``flags``, ``capturing``, and the fields of the wire's step report
and hello (``rankhook/wire.py``) that the detectors and the new-run rule read: ``work`` (the rank's work in that
step: tokens, samples), ``mode`` (``training`` | ``serving``), ``role`` (label of the ranks doing the same work),
``pid`` (the rank's process; a new pid is a new process, e.g. a requeue), ``node`` (the node it reported
through) and the CPU fields the ``cpu/step`` series is built from: ``cpu_s`` (an older hook's CPU time of the
step, seconds) or a CPU sample ``cpu_at_step`` with ``cpu_total_s`` (the process's CPU time, seconds, at that step
count; ``rankhook.hook._CpuProbe``). The value rules are the live wire's: each record is checked as the step report (or bye) it stands for
by ``profwatch.core.messages.check_rank_message`` (a 1e300 s step, a step before 0 or a year-3000 timestamp are
refused as the coordinator refuses them). Here live the validation model (:class:`TelemetryRecord`), the renderer
(:func:`dump_jsonl`) and the coordinator's rebuild of records from its step windows (:func:`window_records`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, is_dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from profwatch.core.messages import MAX_WORLD_SIZE, NODE_ID_RE, check_rank_message
from rankhook import wire

RECORD_KEYS = ("job_id", "rank", "world_size", "step", "step_time_s", "ts_unix_s", "stages", "flags", "capturing",
               "work", "mode", "role", "pid", "node", "cpu_s", "cpu_at_step", "cpu_total_s")


class TelemetryRecord(BaseModel):
    """One telemetry line (unknown keys such as ``v`` are ignored). Raises ``pydantic.ValidationError``."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)
    kind: Literal["step", "bye"] = "step"
    # job_id, rank, step, step_time_s, ts_unix_s, stages, flags, work, mode, role and the CPU fields: the live
    # wire's value rules, applied by _check (check_rank_message), not repeated here
    job_id: str
    rank: int
    world_size: int | None = Field(None, ge=1, le=MAX_WORLD_SIZE)
    step: int
    step_time_s: float | None = None
    ts_unix_s: float
    stages: dict[str, float] | None = None
    flags: tuple[str, ...] = ()
    capturing: bool = False
    work: float | None = None
    mode: str | None = None
    role: str | None = None
    pid: int | None = Field(None, gt=0, lt=2**32)
    # the live wire's spelling, the compiled pattern itself (pydantic then matches with Python's re, which reads
    # its end-of-string anchor)
    node: str | None = Field(None, pattern=NODE_ID_RE)
    cpu_s: float | None = None
    cpu_at_step: int | None = None
    cpu_total_s: float | None = None

    @model_validator(mode="after")
    def _check(self) -> TelemetryRecord:
        if self.kind == "step" and self.step_time_s is None:
            raise ValueError("step record without step_time_s")
        if self.world_size is not None and self.rank >= self.world_size:
            raise ValueError(f"rank {self.rank} >= world_size {self.world_size}")
        check_rank_message(self.as_wire())  # MessageRejected is a ValueError: pydantic reports it
        return self

    def as_wire(self) -> wire.StepReport | wire.RankBye:
        """The message this record stands for on the live wire (a step report, or a bye)."""
        if self.kind == "bye":
            return wire.RankBye(job_id=self.job_id, rank=self.rank, step=self.step, ts_unix_s=self.ts_unix_s)
        assert self.step_time_s is not None  # _check refused a step record without one
        return wire.StepReport(job_id=self.job_id, rank=self.rank, step=self.step, step_time_s=self.step_time_s,
                               ts_unix_s=self.ts_unix_s, stages=self.stages, flags=self.flags,
                               capturing=self.capturing, work=self.work, mode=self.mode, role=self.role,
                               cpu_s=self.cpu_s, cpu_at_step=self.cpu_at_step, cpu_total_s=self.cpu_total_s)


def dump_jsonl(records: Iterable[Mapping[str, Any] | Any], *, world_size: int | None = None) -> str:
    """Render step records (dicts or ``rankhook.wire.StepReport`` instances) as replayable JSONL text.

    Keeps the keys of the record format only (``kind``/``v`` dropped; ``world_size`` added when given and
    absent). Returns one compact JSON object per line, newline-terminated. Raises ``ValueError`` for NaN/inf.
    """
    out: list[str] = []
    for rec in records:
        d: dict[str, Any] = asdict(rec) if is_dataclass(rec) and not isinstance(rec, type) else dict(rec)  # type: ignore[arg-type]
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


def window_records(job_id: str, rank: int, items: Iterable[tuple[Any, ...]],
                   last_ts_unix_s: float, extra: Mapping[str, Any] | None = None,
                   stages: list[dict[str, float] | None] | None = None,
                   cpu: list[dict[str, float | int] | None] | None = None) -> list[dict[str, Any]]:
    """Records of one rank's step window ``[(step, step_time_s[, work]), ...]`` (oldest first), with each step's
    ``stages`` (seconds; ``StepWindow.stage_rows``) and CPU fields (``cpu_s``, ``cpu_at_step``, ``cpu_total_s``:
    ``StepWindow.cpu_rows``) where given, both aligned with ``items``; a ``cpu_s`` is written at most the wire's
    bound of the step time written (``MAX_CPU_CORES`` x it: float32 and rounding to the µs may put a value at the
    bound a few µs over it, which the replay would refuse with its step).

    Windows keep no timestamps (8 bytes per step), so each step's ``ts_unix_s`` is rebuilt backwards from the
    rank's last report time: the newest step ends at ``last_ts_unix_s`` and each earlier one ends its
    successor's ``step_time_s`` before. ``work`` (when not None) goes on its record; ``extra`` (the rank's ``mode``,
    ``role``, ``pid``, ``node``; None values left out) on every record. Returns records newest first (callers sort).
    """
    rows: list[dict[str, Any]] = []
    ts = last_ts_unix_s
    more = {k: v for k, v in (extra or {}).items() if v is not None and v != ""}
    listed = list(items)
    per_step = stages if stages is not None and len(stages) == len(listed) else [None] * len(listed)
    per_cpu = cpu if cpu is not None and len(cpu) == len(listed) else [None] * len(listed)
    for item, st, cp in zip(reversed(listed), reversed(per_step), reversed(per_cpu), strict=True):
        step, t = item[0], float(item[1])
        row: dict[str, Any] = {"job_id": job_id, "rank": rank, "step": step, "step_time_s": round(t, 6),
                               "ts_unix_s": round(ts, 6)}
        if len(item) > 2 and item[2] is not None:
            row["work"] = round(float(item[2]), 6)
        if st:
            row["stages"] = {k: round(v, 6) for k, v in st.items()}
        if cp:
            row.update(cp)
            if "cpu_s" in row:  # float32 and rounded as the step time: kept within the wire's bound of the latter
                row["cpu_s"] = min(row["cpu_s"], wire.MAX_CPU_S, wire.MAX_CPU_CORES * max(row["step_time_s"], 0.001))
        row.update(more)
        rows.append(row)
        ts -= t
    return rows
