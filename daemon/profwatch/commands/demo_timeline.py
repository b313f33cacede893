"""The demo's timeline: when each stage of the pipeline happened for one scenario, and how long it took (pure).

Stages, in pipeline order (:data:`STAGES`): the slowdown starts, the coordinator detects it, the capture config
is written (arm), every rank wrote its rank dir (capture), the batch is complete, the analysis starts, the first
alert (the verdict) is published, and the enriched update (``analysis_enriched``: the advisor's findings) follows.
Times are Unix seconds on this host's clock: the coordinator's event times (CloudEvents ``time``) for what it
published, and for the slowdown the moment the job reached the slow step, interpolated between ``status`` samples.
Rendering follows the pipeline order, never the arrival order; ``took`` is a stage's time since the stage before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

STAGES = ("reference", "slowdown", "detection", "arm", "capture", "batch_complete", "analysis", "first_alert",
          "enriched_update")
"""Pipeline order of the timeline's stages (``analysis`` marks the analysis start)."""

NEVER_HELD = ("slowdown", "first_alert", "enriched_update")
"""Stages :meth:`Timeline.release` announces as soon as they are seen: a verdict without a capture
(``batch_incomplete``) has no batch or analysis stage before it."""

SAYS_EPISODES = 3
"""At most this many open episodes in :attr:`Timeline.coordinator_says`."""


def event_time(ev: dict[str, Any], fallback: float) -> float:
    """The CloudEvent's ``time`` (RFC 3339, as ``daemon/profwatch/core/alerts/events.py: rfc3339`` writes it) in Unix seconds;
    ``fallback`` when absent or unreadable."""
    try:
        return datetime.fromisoformat(str(ev["time"]).replace("Z", "+00:00")).timestamp()
    except (KeyError, ValueError):
        return fallback


@dataclass
class Timeline:
    """Marks of one scenario: ``stage -> (unix s, step or None, detail)``, and ``status`` samples; ``to_json`` leaves
    out the two bookkeeping fields."""

    scenario: str
    job_id: str
    marks: dict[str, tuple[float, int | None, str]] = field(default_factory=dict)
    alert: dict[str, Any] | None = None
    enriched: dict[str, Any] | None = None
    suppressed: dict[str, int] = field(default_factory=dict)
    samples: list[tuple[float, int]] = field(default_factory=list)  # (unix s, furthest step) from status polls
    at_step: int = 0
    """The slowdown's step: a finding reported before it is not its detection."""
    episode_captures: set[str] = field(default_factory=set)
    """Captures an episode armed (``arm_decision`` with action ``arm``): only theirs mark arm, capture and batch
    (the reference capture of the ``reference`` scenario does not)."""
    after_slowdown_only: bool = False
    """Only captures armed after the slowdown mark count, their verdict included (the ``reference`` scenario: an
    episode the reference capture's own overhead opened is not the slowdown's)."""
    announced: set[str] = field(default_factory=set)
    """Stages :meth:`release` has handed out for a progress line."""
    timed_out: str | None = None
    """Why the scenario stopped waiting (``"no first alert within 240 s of the slowdown"``); None when it did not
    time out."""
    coordinator_says: list[str] = field(default_factory=list)
    """While the scenario waits for its reference: the coordinator's own account from its last ``status`` reply
    (``core/status_text.py: render_reference`` of the job's reference, then ``render_episode`` of its open
    episodes and a line per capture of the job in flight, at most :data:`SAYS_EPISODES` of each), so a reference
    that never comes says why (a CI run waited 600 s with "seen: nothing yet")."""

    def waiting_for(self) -> str:
        """The next stage the scenario waits for: the first of :data:`STAGES` after the last one seen (the
        slowdown before anything else; ``reference`` only where the scenario takes one)."""
        seen = [s for s in STAGES if s in self.marks]
        if "slowdown" not in self.marks:
            return "reference" if self.after_slowdown_only and "reference" not in self.marks else "slowdown"
        last = STAGES.index(seen[-1])
        return STAGES[last + 1] if last + 1 < len(STAGES) else "nothing"

    def deadline(self, started: float, start_timeout_s: float, timeout_s: float,
                 expects_enrichment: bool) -> tuple[float, str]:
        """When the current wait ends (Unix s) and what it bounds, by phase: until the slowdown,
        ``start_timeout_s`` from ``started`` (the job's launch); from the slowdown, ``timeout_s`` to the first
        alert; from the first alert (when it announced a follow-up), ``timeout_s`` again to the enriched update."""
        t_alert, t_slow = self.t("first_alert"), self.t("slowdown")
        if self.alert is not None and expects_enrichment and t_alert is not None:
            return t_alert + timeout_s, f"enriched update within {timeout_s:g} s of the first alert"
        if t_slow is not None:
            return t_slow + timeout_s, f"first alert within {timeout_s:g} s of the slowdown"
        return started + start_timeout_s, (f"{self.waiting_for()} within {start_timeout_s:g} s of the job's start "
                                           "(--start-timeout-s)")

    def progress_line(self, now: float, step: int | None, deadline: float, what: str,
                      in_flight: Sequence[str] = ()) -> str:
        """The line printed every 15 s of a wait: what it waits for, the stages seen so far (seconds from the
        slowdown), the job's furthest step, and how long the wait may still last. ``in_flight``: the captures being
        analysed now (``"c-1 enriching"``), said when no stage is seen yet (the reference's own capture is under
        way then: never "nothing yet")."""
        t0 = self.t("slowdown")
        seen = ", ".join(f"{s}" + ("" if t0 is None else f" {round(t - t0) + 0:+d}s")  # before it: -Ns, never +-0s
                         for s, t, *_ in self.ordered())
        if not seen:
            seen = (f"no stage yet, capture {', '.join(in_flight)} being analysed" if in_flight
                    else "nothing yet")
        at = f"the job at step {step}" if step is not None and step >= 0 else "no step of the job reported yet"
        says = (f"; the coordinator's reference: {self.coordinator_says[0]}"
                if self.coordinator_says and self.waiting_for() == "reference" else "")
        return (f"[{self.scenario}] waiting for the {what.split(' within ')[0]}; seen: {seen}; {at}; "
                f"{max(0.0, deadline - now):.0f} s left of {what}{says}")

    def add(self, stage: str, t: float, step: int | None = None, detail: str = "") -> bool:
        """Record ``stage`` once (the first time wins); True when it is new."""
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r}")
        if stage in self.marks:
            return False
        self.marks[stage] = (t, step, detail)
        return True

    def release(self, final: bool = False) -> list[tuple[str, float, str]]:
        """``(stage, t, detail)`` of the stages to announce now, in pipeline order, at their :meth:`ordered` times,
        so the progress lines and the final table agree. A stage is held while the stage just before it in
        :data:`STAGES` has not been seen and no later one has (the batch found complete before the last rank's
        completion event arrived prints after it); the slowdown and the verdicts (:data:`NEVER_HELD`) are never held,
        and ``final`` releases everything held. Each stage once."""
        rows = {s: (t, detail) for s, t, _took, _step, detail in self.ordered()}
        expected = [s for s in STAGES if s != "reference" or self.after_slowdown_only]
        out: list[tuple[str, float, str]] = []
        for i, s in enumerate(expected):
            if s not in rows or s in self.announced:
                continue
            before_seen = i == 0 or expected[i - 1] in rows
            later_seen = any(x in rows for x in expected[i + 1:])
            if not (final or before_seen or later_seen or s in NEVER_HELD):
                continue
            self.announced.add(s)
            out.append((s, *rows[s]))
        return out

    def t(self, stage: str) -> float | None:
        m = self.marks.get(stage)
        return m[0] if m else None

    def step_at(self, t: float) -> int | None:
        """The job's furthest step at time ``t``, from the status samples (the last one not after ``t``)."""
        best = None
        for ts, step in self.samples:
            if ts <= t:
                best = step
        return best

    def time_of_step(self, step: int) -> float | None:
        """When the job reached ``step``: linear interpolation between the last sample below it and the first at
        or above it (the first such sample's time when there is none below); None before it is reached."""
        prev: tuple[float, int] | None = None
        for ts, s in self.samples:
            if s >= step:
                if prev is None or s == prev[1]:
                    return ts
                return prev[0] + (ts - prev[0]) * (step - prev[1]) / (s - prev[1])
            prev = (ts, s)
        return None

    def ordered(self) -> list[tuple[str, float, float | None, int | None, str]]:
        """``(stage, t, took_s, step, detail)`` in pipeline order. A stage seen after a later one (the batch found
        complete before the last rank's completion event arrived) is shown at the later stage's time: it cannot
        have finished after it."""
        rows: list[tuple[str, float, float | None, int | None, str]] = []
        present = [s for s in STAGES if s in self.marks]
        times = {s: self.marks[s][0] for s in present}
        for i in range(len(present) - 2, -1, -1):  # from the end: no stage after the one that follows it
            times[present[i]] = min(times[present[i]], times[present[i + 1]])
        prev: float | None = None
        for s in present:
            _t, step, detail = self.marks[s]
            t = times[s]
            rows.append((s, t, None if prev is None else t - prev, self.step_at(t) if step is None else step, detail))
            prev = t
        return rows

    def render(self) -> str:
        """The timeline table: stage, seconds since the slowdown, seconds since the stage before, step, detail."""
        rows = self.ordered()
        t0 = self.t("slowdown") or (rows[0][1] if rows else 0.0)
        lines = [f"  {'stage':<15} {'t+s':>7} {'took_s':>7} {'step':>6}  detail"]
        for stage, t, took, step, detail in rows:
            took_s = "-" if took is None else f"{took:.1f}"
            lines.append(f"  {stage:<15} {t - t0:>7.1f} {took_s:>7} {step if step is not None else '-':>6}  {detail}")
        for key, n in self.suppressed.items():
            lines.append(f"  (later anomalies while a capture was in flight or cooling down: {n} x {key})")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {"scenario": self.scenario, "job_id": self.job_id, "timed_out": self.timed_out,
                "marks": [[s, t, took, step, detail] for s, t, took, step, detail in self.ordered()],
                "alert": self.alert, "enriched_update": self.enriched, "coordinator_says": self.coordinator_says}
