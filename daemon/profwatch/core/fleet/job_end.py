"""When a job has ended (pure): every rank of its generation said ``bye`` (reason ``all_ranks_left``, decided by
the registry at the last bye), or no rank of it has reported for ``after_s`` seconds (reason ``silent``).

Ranks do not always say goodbye (a killed job sends no ``bye``), so without byes the end of a job is inferred from
silence.
A job that reports again after it was declared ended is live again, and can end again later. A job that has not
reported its first step yet (model loading, compilation, a slow file system after ``rankhook.init``) is given
``startup_allowance_s`` more: it ends only after ``after_s + startup_allowance_s`` of silence since its hello.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Literal

EndReason = Literal["silent", "all_ranks_left"]


@dataclass(frozen=True, slots=True)
class JobEnded:
    """One job found ended: ``last_report_unix_s`` is the newest report of any of its ranks; ``reason``:
    ``silent`` (no report for ``after_s``) or ``all_ranks_left`` (every rank said bye)."""

    job_id: str
    last_report_unix_s: float
    silent_s: float
    reason: EndReason = "silent"

    def event_id(self) -> str:
        """Deterministic CloudEvent id: the same silence is reported once, even across coordinator restarts."""
        return f"job_ended-{self.job_id}-{self.last_report_unix_s:.3f}"

    def to_json(self) -> dict[str, float | str]:
        return {"last_report_unix_s": self.last_report_unix_s, "silent_s": round(self.silent_s, 3),
                "reason": self.reason}


class JobEndTracker:
    """Reports each silent job once per silence.

    Args:
        after_s: seconds without any report from any rank after which a job has ended (> 0).
        startup_allowance_s: added to ``after_s`` for a job none of whose ranks reported a step yet (>= 0).
    Raises:
        ValueError: ``after_s`` is not positive or ``startup_allowance_s`` negative.
    """

    def __init__(self, after_s: float, startup_allowance_s: float = 0.0) -> None:
        if not after_s > 0:
            raise ValueError(f"after_s must be > 0, got {after_s}")
        if not startup_allowance_s >= 0:
            raise ValueError(f"startup_allowance_s must be >= 0, got {startup_allowance_s}")
        self.after_s = after_s
        self.startup_allowance_s = startup_allowance_s
        self._reported: dict[str, float] = {}

    def check(self, last_report_unix_s: Mapping[str, float], now_unix_s: float,
              before_first_step: Collection[str] = ()) -> list[JobEnded]:
        """Jobs whose newest report is older than ``after_s`` (``after_s + startup_allowance_s`` for those in
        ``before_first_step``) and not reported yet for that report time.

        Args:
            last_report_unix_s: job_id -> newest report time of any of its ranks (0 = never reported).
            now_unix_s: current time.
            before_first_step: jobs none of whose ranks reported a step yet (only hellos).
        Returns:
            new ``JobEnded`` findings, sorted by job id; jobs gone from the mapping are forgotten.
        """
        out = []
        for job_id in sorted(last_report_unix_s):
            last = float(last_report_unix_s[job_id])
            after = self.after_s + (self.startup_allowance_s if job_id in before_first_step else 0.0)
            if last <= 0 or now_unix_s - last < after:
                continue
            if self._reported.get(job_id) == last:
                continue
            self._reported[job_id] = last
            out.append(JobEnded(job_id, last, now_unix_s - last))
        for gone in set(self._reported) - set(last_report_unix_s):
            del self._reported[gone]
        return out


MAX_ENDED_JOBS = 10_000
"""Ended (job id, generation) pairs remembered; the oldest end is forgotten first (a job id that ended more than
10,000 job ends ago and gets a late verdict alerts again: bounded memory over a perfect record)."""


class EndedJobs:
    """Which (job id, generation) pairs have ended and not reported since: a verdict about one of them is information
    (``job_ended: true``), never a firing alert (``docs/alerts.md``, "Ended jobs").

    An ended generation is never live again: a job that reports after its end (a serving job idle for longer than
    ``job_end_after_s``, a requeue) opens a new generation (``resumed_after_end``, also after a coordinator restart,
    which restores the end), another pair that alerts as usual. :meth:`revive` is the alert book's: a verdict whose
    ``job_ended`` is false (the coordinator's word) lifts a pair the book still holds ended. Memory: at most
    ``max_items`` pairs, the oldest end evicted first.

    Args:
        max_items: bound on remembered pairs (> 0).
    """

    def __init__(self, max_items: int = MAX_ENDED_JOBS) -> None:
        if max_items <= 0:
            raise ValueError(f"max_items must be > 0, got {max_items}")
        self.max_items = max_items
        self._ended: dict[tuple[str, int], float] = {}  # insertion order = end order

    def __len__(self) -> int:
        return len(self._ended)

    def mark(self, job_id: str, generation: int, last_report_unix_s: float) -> None:
        """``job_id``'s ``generation`` ended; its newest report was at ``last_report_unix_s`` (wall time)."""
        key = (job_id, int(generation))
        self._ended.pop(key, None)
        self._ended[key] = float(last_report_unix_s)
        while len(self._ended) > self.max_items:
            del self._ended[next(iter(self._ended))]

    def ended(self, job_id: str, generation: int | None) -> bool:
        """True when ``(job_id, generation)`` ended and has not reported since (None: never)."""
        return generation is not None and (job_id, int(generation)) in self._ended

    def revive(self, job_id: str, generation: int) -> bool:
        """The coordinator says the pair is live (a verdict's ``job_ended`` is false): forget its end. Returns True
        when it was marked ended."""
        return self._ended.pop((job_id, int(generation)), None) is not None
