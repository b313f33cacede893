"""One anomaly episode as data: :class:`Episode`, the captures that cover it (:class:`EpisodeCapture`), its key
and its place in the capture queue (pure; the rules that open, close and capture episodes are
``daemon/profwatch/core/arming/episodes.py``).

Keys: one open episode per (job, kind, scope); the scope is the compared stage a ranked finding names (a rank
outlier's stage), else its ``role``, else its ranks, else ``""`` (job-wide).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from profwatch.core.capture.lifecycle import CaptureState
from profwatch.core.detection.types import Anomaly, AnomalyKind

__all__ = ["CAPTURED", "VERDICTS", "Episode", "EpisodeCapture", "episode_key", "episode_scope", "value_key"]

VERDICTS = frozenset({"ok", "no_suspect", "partial", "weak"})
CAPTURED = VERDICTS | {"not_applicable", CaptureState.CANCELLED.value, "would_arm", "simulated"}
"""Capture outcomes that count as captured for the episode's cooldown (``not_applicable``: the capture was taken
and cannot answer, e.g. one rank has no peer; another capture would answer the same); others (failed, expired,
incomplete, superseded) leave the episode wanting a capture."""


def episode_scope(anomaly: Anomaly) -> str:
    """The scope part of an episode key: the stage of the most outlying rank (``detail.stage``: a name, or a
    ``{rank: stage}`` map), else ``role:<detail.role>``, else ``ranks:0,3`` for a ranked finding, else ``""``."""
    d = anomaly.detail or {}
    stage = d.get("stage")
    if isinstance(stage, str) and stage:
        return stage
    if isinstance(stage, Mapping) and stage and anomaly.ranks:
        raw = d.get("excess")
        excess: Mapping[Any, Any] = raw if isinstance(raw, Mapping) else {}
        top = max(anomaly.ranks, key=lambda r: float(excess.get(r, excess.get(str(r), 0.0)) or 0.0))
        name = stage.get(top, stage.get(str(top)))
        if isinstance(name, str) and name:
            return name
    role = d.get("role")
    if isinstance(role, str) and role:
        return f"role:{role}"
    if anomaly.ranks:
        return "ranks:" + ",".join(str(r) for r in sorted(set(anomaly.ranks))[:16])
    return ""


def episode_key(anomaly: Anomaly) -> str:
    """``kind/scope``: the key of the one open episode of the job that ``anomaly`` belongs to."""
    return f"{anomaly.kind}/{episode_scope(anomaly)}"


@dataclass(slots=True)
class EpisodeCapture:
    """One capture that covers an episode. ``own``: armed for this episode (else another episode's capture covered
    it); ``ranks``: the episode's ranks at the arm; ``status``: None while in flight, then the verdict status
    (``ok``, ``no_suspect``, ``partial``, ``weak``) or how it ended (``failed``, ``cancelled``, ``would_arm``...);
    ``named``: the ranks the verdict names, most suspect first; ``level``: the episode's :attr:`Episode.level` its
    window saw: at the arm, or that of a later report whose onset came before the window's first step
    (``JobEpisodes._seen_by_flight``) (relative; None in rows stored before it was recorded); ``repeat``: its arm
    was a repeat (:attr:`~profwatch.core.arming.policy.JobArmState.repeat`: what a restart gives the hourly cap back); ``follow_up``: armed as the follow-up of a
    targeted capture whose ranks waited for ranks it did not hold (:attr:`Episode.follow_ranks`); ``whole``: it
    captured every rank; ``verdict_unix_s``: when its verdict came (None: no verdict yet); ``job_step_s``: the job
    step time (s) of its window, the one it was armed on (``JobEpisodes.armed``; else, none known then, the one at
    its verdict; None: none known): what a restart restores the job's latest verdict from
    (:meth:`JobEpisodes.restore`)."""

    capture_id: str
    armed_unix_s: float
    ranks: tuple[int, ...]
    own: bool = True
    status: str | None = None
    named: tuple[int, ...] = ()
    level: float | None = None
    follow_up: bool = False
    whole: bool = False
    verdict_unix_s: float | None = None
    job_step_s: float | None = None
    repeat: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"capture_id": self.capture_id, "armed_unix_s": self.armed_unix_s, "ranks": list(self.ranks),
                "own": self.own, "status": self.status, "named": list(self.named),
                "level": round(self.level, 6) if self.level is not None else None, "follow_up": self.follow_up,
                "whole": self.whole, "verdict_unix_s": self.verdict_unix_s, "job_step_s": self.job_step_s,
                "repeat": self.repeat}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> EpisodeCapture:
        level, at, step_s = d.get("level"), d.get("verdict_unix_s"), d.get("job_step_s")
        return cls(str(d["capture_id"]), float(d["armed_unix_s"]), tuple(int(r) for r in d.get("ranks") or ()),
                   bool(d.get("own", True)), d.get("status"), tuple(int(r) for r in d.get("named") or ()),
                   float(level) if level is not None else None, bool(d.get("follow_up", False)),
                   bool(d.get("whole", False)), _positive(at), _positive(step_s), d.get("repeat") is True)


def _positive(v: Any) -> float | None:
    """A stored time in seconds: a finite number > 0, else None (absent, or a row edited by hand: it is dropped, not
    the row, as a reference of 0 s would divide by zero)."""
    if v is None or isinstance(v, bool):
        return None
    x = float(v)
    return x if math.isfinite(x) and x > 0.0 else None


def _pair(v: Any) -> tuple[float, float] | None:
    """A stored ``[job step s, level]`` (:attr:`Episode.confirmed`), else None (absent in rows stored before it was
    recorded, or not a finite time > 0 and a finite level)."""
    if v is None:
        return None
    a, b = v
    step_s, level = _positive(a), float(b)
    return (step_s, level) if step_s is not None and math.isfinite(level) else None


SHOWN_FOLLOW = 64
"""``follow_ranks`` of :meth:`Episode.to_json` lists at most this many (the view and the status); every one is in
``follow_spans``."""
MAX_FOLLOW_RANK = 1 << 21
"""Ranks at or above this are not read back from ``follow_spans`` (above any world size the wire takes)."""


def _spans(ranks: tuple[int, ...]) -> list[list[int]]:
    """Sorted distinct ``ranks`` as ``[[first, last], ...]`` runs of consecutive ranks: the uncaptured ranks of a
    100,000-rank job are a few runs (a list of them was ~690 KB in every save of the episode)."""
    out: list[list[int]] = []
    for r in ranks:
        if out and r == out[-1][1] + 1:
            out[-1][1] = r
        else:
            out.append([r, r])
    return out


def _from_spans(value: Any) -> tuple[int, ...]:
    """Inverse of :func:`_spans` for a stored row: runs that are not two integers ``0 <= first <= last`` are left
    out, ranks clipped below :data:`MAX_FOLLOW_RANK` (a hostile ``[0, 1e12]`` would not allocate its range);
    ``()`` when it is not a list."""
    if not isinstance(value, list):
        return ()
    out: set[int] = set()
    for span in value:
        if (isinstance(span, list) and len(span) == 2 and all(isinstance(x, int) and not isinstance(x, bool)
                                                              for x in span) and 0 <= span[0] <= span[1]):
            out.update(range(span[0], min(span[1], MAX_FOLLOW_RANK - 1) + 1))
    return tuple(sorted(out))


def _follow_ranks(value: Any) -> tuple[int, ...]:
    """A stored ``follow_ranks``: its non-negative integer ranks, sorted, once each; a request for a follow-up only,
    so what is not a list of ranks drops the follow-up, not the episode (``()``)."""
    if not isinstance(value, list):
        return ()
    return tuple(sorted({r for r in value if isinstance(r, int) and not isinstance(r, bool) and 0 <= r < 1 << 31}))


@dataclass(slots=True)
class Episode:
    """One anomaly episode of one job (mutable; owned by :class:`JobEpisodes`).

    Times in unix seconds, steps as the job counts them. ``magnitude`` is the latest report's (relative),
    ``peak_magnitude`` the largest; ``ranks`` the ranks it names now (empty: job-wide); ``reference_s`` the job
    step time before it (job-wide kinds whose report gives ``baseline_s``); ``last_ongoing_step`` the last step at
    which a report or its detector said it still holds; ``new_ranks``: it names a rank no capture of it covered or
    named (it is captured again without waiting for its cooldown); ``rotation``: the top ranks of the successive
    verdicts that showed the culprit rotating (empty: it does not); ``waiting``/``waiting_until_unix_s``/
    ``waiting_behind``: what it waits for (a reason of :class:`~profwatch.core.arming.policy.ArmingPolicy`), until
    when, and behind which episode of the queue; ``follow_ranks``: the ranks its last own targeted capture waited
    for and did not hold (``partial`` with ``waited_for``): its next capture is a follow-up covering them (cleared
    when it is armed; empty: none); ``settle_step``: for a job-wide episode whose capture found no suspect, the
    first step it was judged at after that verdict (it becomes the job's new normal once it held its level for
    ``episode_quiet_steps`` from there; None: no such verdict); ``rotating_member``: opened on a key whose culprit
    rotates across episodes (it waits as ``culprit_rotates`` until it persists: then it is a slow rank of its own);
    ``explained_by``: for a job-wide ``step_regression`` never captured, the open ranked episode whose known slow
    ranks explain its level (it waits as ``explained_by_ranks``, not captured; empty: not explained);
    ``confirmed``: for a ranked episode, the job step time (s) and its own :attr:`level` at the latest verdict that
    named its ranks (what explains a job-wide change; None: no such verdict).
    """

    episode_id: str
    job_id: str
    kind: str
    scope: str
    opened_unix_s: float
    opened_step: int
    updated_unix_s: float
    last_step: int
    last_ongoing_step: int
    magnitude: float
    peak_magnitude: float
    ranks: tuple[int, ...]
    detail: dict[str, Any] = field(default_factory=dict)
    reference_s: float | None = None
    reports: int = 1
    captures: list[EpisodeCapture] = field(default_factory=list)
    new_ranks: bool = False
    rotation: tuple[int, ...] = ()
    closed_unix_s: float | None = None
    close_reason: str = ""
    waiting: str = ""
    waiting_until_unix_s: float | None = None
    waiting_behind: str = ""
    not_before_unix_s: float = 0.0
    follow_ranks: tuple[int, ...] = ()
    settle_step: int | None = None
    rotating_member: bool = False
    explained_by: str = ""
    confirmed: tuple[float, float] | None = None

    @property
    def key(self) -> str:
        return f"{self.kind}/{self.scope}"

    @property
    def in_flight(self) -> str | None:
        """The id of a capture covering it that is still in flight (its own or another episode's), or None."""
        return next((c.capture_id for c in self.captures if c.status is None), None)

    @property
    def captured_unix_s(self) -> float | None:
        """When it was last captured (a capture in flight or one that counts as captured: :data:`CAPTURED`); None
        when never, or when it names new ranks since (then it counts as new)."""
        if self.new_ranks:
            return None
        times = [c.armed_unix_s for c in self.captures if c.status is None or c.status in CAPTURED]
        return max(times) if times else None

    @property
    def level(self) -> float:
        """How far it is from normal now (relative): for a job-wide finding with a reference step time
        (``reference_s``) whose latest report gives the step time it reached (``detail.step_time_s``),
        ``step_time_s / reference_s - 1`` (so a second change on top of the first adds to it); else its latest
        magnitude (a rank's excess over its peers, a drift's total since its reference)."""
        reached = self.detail.get("step_time_s")
        if not self.ranks and self.reference_s and isinstance(reached, (int, float)) and reached > 0:
            return float(reached) / self.reference_s - 1.0
        return self.magnitude

    def unchanged_since_capture(self, growth: float) -> bool:
        """True when it was captured (:attr:`captured_unix_s`) and has not changed since: no new ranks and its
        :attr:`level` below the level at its last capture plus ``growth`` (relative, ``[arming]
        recapture_growth``). A capture stored without a level counts as level 0."""
        if self.captured_unix_s is None:
            return False
        done = [c for c in self.captures if c.status is None or c.status in CAPTURED]
        last = max(done, key=lambda c: c.armed_unix_s)
        return self.level < (last.level or 0.0) + growth

    @property
    def is_repeat(self) -> bool:
        return self.captured_unix_s is not None

    @property
    def seen_ranks(self) -> frozenset[int]:
        """Ranks its captures covered (its ranks at each arm) or named."""
        return frozenset(r for c in self.captures for r in (*c.ranks, *c.named))

    def anomaly(self) -> Anomaly:
        """Its latest state as an :class:`Anomaly` (what the arming policy and the capture request read), its
        detail with the largest magnitude it reached (``peak_magnitude``: the capture reason shows it)."""
        return Anomaly(cast(AnomalyKind, self.kind), self.job_id, self.last_step, self.ranks, self.magnitude,
                       {**self.detail, "peak_magnitude": self.peak_magnitude})

    def to_json(self, now_unix_s: float | None = None) -> dict[str, Any]:
        """JSON-ready, every field (what the state store keeps and ``status --json`` shows); with ``now_unix_s``
        also ``age_s``."""
        out: dict[str, Any] = {
            "episode_id": self.episode_id, "job_id": self.job_id, "kind": self.kind, "scope": self.scope,
            "opened_unix_s": self.opened_unix_s, "opened_step": self.opened_step,
            "updated_unix_s": self.updated_unix_s, "last_step": self.last_step,
            "last_ongoing_step": self.last_ongoing_step, "magnitude": round(self.magnitude, 6),
            "peak_magnitude": round(self.peak_magnitude, 6), "ranks": list(self.ranks), "detail": self.detail,
            "reference_s": self.reference_s, "reports": self.reports,
            "captures": [c.to_json() for c in self.captures], "new_ranks": self.new_ranks,
            "rotation": list(self.rotation), "closed_unix_s": self.closed_unix_s, "close_reason": self.close_reason,
            "waiting": self.waiting, "waiting_until_unix_s": self.waiting_until_unix_s,
            "waiting_behind": self.waiting_behind, "not_before_unix_s": self.not_before_unix_s,
            "follow_ranks": list(self.follow_ranks[:SHOWN_FOLLOW]), "follow_count": len(self.follow_ranks),
            "follow_spans": _spans(self.follow_ranks), "value": "repeat" if self.is_repeat else "new",
            "settle_step": self.settle_step, "rotating_member": self.rotating_member,
            "explained_by": self.explained_by,
            "confirmed": list(self.confirmed) if self.confirmed is not None else None}
        if now_unix_s is not None:
            out["age_s"] = round(max(0.0, now_unix_s - self.opened_unix_s), 3)
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Episode:
        """Inverse of :meth:`to_json`; raises ``KeyError``/``TypeError``/``ValueError`` on a malformed row."""
        ref = d.get("reference_s")
        closed = d.get("closed_unix_s")
        until = d.get("waiting_until_unix_s")
        return cls(
            episode_id=str(d["episode_id"]), job_id=str(d["job_id"]), kind=str(d["kind"]), scope=str(d["scope"]),
            opened_unix_s=float(d["opened_unix_s"]), opened_step=int(d["opened_step"]),
            updated_unix_s=float(d["updated_unix_s"]), last_step=int(d["last_step"]),
            last_ongoing_step=int(d["last_ongoing_step"]), magnitude=float(d["magnitude"]),
            peak_magnitude=float(d["peak_magnitude"]), ranks=tuple(int(r) for r in d.get("ranks") or ()),
            detail=dict(d.get("detail") or {}), reference_s=float(ref) if ref is not None else None,
            reports=int(d.get("reports", 1)),
            captures=[EpisodeCapture.from_json(c) for c in d.get("captures") or ()],
            new_ranks=bool(d.get("new_ranks", False)), rotation=tuple(int(r) for r in d.get("rotation") or ()),
            closed_unix_s=float(closed) if closed is not None else None, close_reason=str(d.get("close_reason", "")),
            waiting=str(d.get("waiting", "")), waiting_until_unix_s=float(until) if until is not None else None,
            waiting_behind=str(d.get("waiting_behind", "")),
            not_before_unix_s=float(d.get("not_before_unix_s", 0.0)),
            follow_ranks=(_from_spans(d["follow_spans"]) if "follow_spans" in d
                          else _follow_ranks(d.get("follow_ranks"))),
            settle_step=int(d["settle_step"]) if d.get("settle_step") is not None else None,
            rotating_member=bool(d.get("rotating_member", False)),
            explained_by=str(d.get("explained_by") or ""),
            confirmed=_pair(d.get("confirmed")))

    def summary(self) -> dict[str, Any]:
        """The short form carried by events: id, kind, scope, ranks, magnitudes, steps, captures."""
        return {"episode_id": self.episode_id, "kind": self.kind, "scope": self.scope, "ranks": list(self.ranks),
                "magnitude": round(self.magnitude, 6), "peak_magnitude": round(self.peak_magnitude, 6),
                "opened_step": self.opened_step, "step": self.last_step, "reports": self.reports,
                "captures": [c.capture_id for c in self.captures], "rotation": list(self.rotation)}


def value_key(ep: Episode) -> tuple[bool, bool, bool, float, float, str]:
    """Sort key of the capture queue, most valuable first: a new episode before a repeat of one already captured
    or one whose culprit rotates (:attr:`Episode.rotation`), then a named rank before a job-wide finding, then a
    finding that changed before a standing one (``structural_imbalance``: present from the start), then the larger
    magnitude, then the older.

    New before repeat comes first so that a change is captured by the first arm after its onset whatever was
    captured before it (docs/detection.md, episodes); within new (or within repeat) episodes the order is:
    named rank, magnitude, age."""
    return (ep.is_repeat or bool(ep.rotation), not ep.ranks, ep.kind == "structural_imbalance", -ep.magnitude,
            ep.opened_unix_s, ep.episode_id)
