"""Helpers of the detection unit tests: feed generated telemetry to a JobDetector (fake clock from the records)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from profwatch.core.capture.planner import CaptureSettings, spike_hold
from profwatch.core.detection.job_detector import Anomaly, DetectionSettings, JobDetector
from rankhook.wire import StepReport


def to_report(rec: dict[str, Any]) -> StepReport:
    """One generated record as the wire's step report (``mode``, ``role``, ``work``, ``cpu_s``, ``cpu_at_step`` and
    ``cpu_total_s`` where the record has them)."""
    return StepReport(job_id=rec["job_id"], rank=rec["rank"], step=rec["step"], step_time_s=rec["step_time_s"],
                      ts_unix_s=rec["ts_unix_s"], stages=rec.get("stages"), flags=tuple(rec.get("flags", ())),
                      capturing=bool(rec.get("capturing", False)), work=rec.get("work"), mode=rec.get("mode"),
                      role=rec.get("role"), cpu_s=rec.get("cpu_s"), cpu_at_step=rec.get("cpu_at_step"),
                      cpu_total_s=rec.get("cpu_total_s"))


def run(records: Iterable[dict[str, Any]], world_size: int, settings: DetectionSettings | None = None,
        det: JobDetector | None = None) -> tuple[list[Anomaly], JobDetector]:
    """Feed records in order, each arriving at its ``ts_unix_s`` (or ``arrival_s`` when present); tick once per
    second of arrival time (as the coordinator does)."""
    det = det or JobDetector("sim", world_size, settings, hold=spike_hold(CaptureSettings()))
    out: list[Anomaly] = []
    last_tick = float("-inf")
    for rec in records:
        arrival = rec.get("arrival_s", rec["ts_unix_s"])
        out += det.observe(to_report(rec), arrival)
        if arrival - last_tick >= 1.0:
            last_tick = arrival
            out += det.tick(arrival)
    return out, det


def kinds(found: list[Anomaly]) -> list[str]:
    return [a.kind for a in found]


def of_kind(found: list[Anomaly], kind: str) -> list[Anomaly]:
    return [a for a in found if a.kind == kind]
