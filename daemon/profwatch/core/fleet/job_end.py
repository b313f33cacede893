"""When a job has ended (pure): no rank of it has reported for ``after_s`` seconds.

Ranks do not always say goodbye (a killed job sends no ``bye``), so the end of a job is inferred from silence.
A job that reports again after it was declared ended is live again, and can end again later.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class JobEnded:
    """One job found silent: ``last_report_unix_s`` is the newest report of any of its ranks."""

    job_id: str
    last_report_unix_s: float
    silent_s: float

    def event_id(self) -> str:
        """Deterministic CloudEvent id: the same silence is reported once, even across coordinator restarts."""
        return f"job_ended-{self.job_id}-{self.last_report_unix_s:.3f}"

    def to_json(self) -> dict[str, float]:
        return {"last_report_unix_s": self.last_report_unix_s, "silent_s": round(self.silent_s, 3)}


class JobEndTracker:
    """Reports each silent job once per silence.

    Args:
        after_s: seconds without any report from any rank after which a job has ended (> 0).
    Raises:
        ValueError: ``after_s`` is not positive.
    """

    def __init__(self, after_s: float) -> None:
        if not after_s > 0:
            raise ValueError(f"after_s must be > 0, got {after_s}")
        self.after_s = after_s
        self._reported: dict[str, float] = {}

    def check(self, last_report_unix_s: Mapping[str, float], now_unix_s: float) -> list[JobEnded]:
        """Jobs whose newest report is older than ``after_s`` and not reported yet for that report time.

        Args:
            last_report_unix_s: job_id -> newest report time of any of its ranks (0 = never reported).
            now_unix_s: current time.
        Returns:
            new ``JobEnded`` findings, sorted by job id; jobs gone from the mapping are forgotten.
        """
        out = []
        for job_id in sorted(last_report_unix_s):
            last = float(last_report_unix_s[job_id])
            if last <= 0 or now_unix_s - last < self.after_s:
                continue
            if self._reported.get(job_id) == last:
                continue
            self._reported[job_id] = last
            out.append(JobEnded(job_id, last, now_unix_s - last))
        for gone in set(self._reported) - set(last_report_unix_s):
            del self._reported[gone]
        return out
