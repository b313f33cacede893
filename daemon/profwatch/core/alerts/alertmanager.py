"""Alertmanager mapping and firing state (pure): profwatch CloudEvents -> Alertmanager API v2 postable alerts;
which alerts stand, when they are re-sent and when they resolve.

Format: ``POST /api/v2/alerts`` takes a JSON list of ``postableAlert`` objects (``labels`` required;
``annotations``, ``startsAt``, ``endsAt``, ``generatorURL``), per Alertmanager's OpenAPI spec
(https://github.com/prometheus/alertmanager/blob/v0.25.0/api/v2/openapi.yaml). The labels are the alert's
identity; an alert whose ``endsAt`` has passed is resolved. Alertmanager's client guide
(https://prometheus.io/docs/alerting/latest/clients/) asks clients to re-send standing alerts; like Prometheus
(``rules/alerting.go``: ``ValidUntil = now + 4 x max(evaluation interval, resend delay)``), every send carries
``endsAt = now + 4 x resend_interval_s``, so a lost re-send does not resolve an alert, and alerts of a profwatch
that stopped for good expire by themselves.

Rules (``docs/alerts.md``):
* ``suspect_ranks`` with suspects: one ``ProfwatchSuspectRank`` alert per suspect (at most ``max_suspects``;
  the top one ``critical``, the others ``warning``). One alert stands per (job, rank): if the same rank comes
  back with other labels (kind, severity, host), the old label set is resolved and the new one fires.
* A rank's alert resolves only when a later ``suspect_ranks`` event of the same job with status ``ok`` or
  ``no_suspect`` lists the rank in ``judged_ranks`` (captured and judged) and not among its suspects. A
  ``partial`` result, or a targeted capture that did not include the rank, resolves nothing; nor does a verdict
  on fewer captured steps (``captured_steps``) than the one that fired the alert (a 4-step manual capture on a
  loaded box cannot clear what an 8-step capture found: :func:`too_short_to_clear`): the alert stands, its
  ``held`` annotation says which capture judged it not slow on how few steps, and it is re-sent.
* ``suspect_ranks`` with slow links (``links[]``): one ``ProfwatchSlowLink`` alert per link (``kind``
  ``communication``, label ``link`` = ``"a-b"``); it resolves when a later ``ok``/``no_suspect`` verdict judged
  both ranks and no longer names the link.
* ``suspect_ranks`` with status ``partial`` or ``weak``: one job-level ``ProfwatchVerdictIncomplete`` alert
  (warning) saying what could not be judged (``unjudged_ranks``, ``detail``); it resolves with the next ``ok`` or
  ``no_suspect`` verdict of the job.
* ``batch_incomplete``, ``analysis_failed``, ``path_refused``, ``job_id_collision``: one job-level alert each; the first two resolve
  when a later capture of the job reaches a verdict (any ``suspect_ranks`` event), all resolve at job end.
* ``culprit_rotates``: one ``ProfwatchCulpritRotates`` alert per rotating episode (warning; label ``episode_id``;
  the summary names the ranks); it resolves when that episode closes (``episode_closed`` with a ``rotation``) or
  at job end.
* ``job_ended``: every alert of the job resolves, and the book remembers the (job id, generation) as ended
  (:class:`~profwatch.core.fleet.job_end.EndedJobs`, bounded). A capture verdict (``suspect_ranks``,
  ``analysis_enriched``, ``batch_incomplete``, ``analysis_failed``) that arrives after its job ended carries
  ``job_ended: true`` (set by the coordinator) and is information only: it creates, re-fires and resolves nothing.
  An older stored event without the field counts as after the end when its ``generation`` is remembered as ended.
  ``job_ended: false`` for an ended pair means the job reported again (live again): it is forgotten as ended.
* ``analysis_enriched`` (the follow-up of a verdict) updates or resolves only rank and incomplete-verdict alerts
  that still stand; it never creates one (an alert resolved in between, by a later verdict, stays resolved). Slow
  links are the exception: only the follow-up's communication matrix can name them, so its link alerts fire.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from profwatch.core.alerts.event_types import JOB_ALERTNAMES, TYPE_CULPRIT_ROTATES, TYPE_EPISODE_CLOSED
from profwatch.core.alerts.events import (
    TYPE_ANALYSIS_ENRICHED,
    TYPE_ANALYSIS_FAILED,
    TYPE_BATCH_INCOMPLETE,
    TYPE_JOB_ENDED,
    TYPE_SUSPECT_RANKS,
    rfc3339,
)
from profwatch.core.fleet.job_end import EndedJobs
from profwatch.core.verdict.drilldown import drilldown_text
from profwatch.core.verdict.evidence import hours_unit

ALERTNAME_SUSPECT = "ProfwatchSuspectRank"
ALERTNAME_LINK = "ProfwatchSlowLink"
ALERTNAME_UNJUDGED = "ProfwatchVerdictIncomplete"
UNJUDGED_STATUSES = ("partial", "weak")
RESOLVED_BY_VERDICT = (JOB_ALERTNAMES[TYPE_BATCH_INCOMPLETE], JOB_ALERTNAMES[TYPE_ANALYSIS_FAILED])
VERDICT_TYPES = (TYPE_SUSPECT_RANKS, TYPE_ANALYSIS_ENRICHED, TYPE_BATCH_INCOMPLETE, TYPE_ANALYSIS_FAILED)
"""A capture's verdict events: after the end of their job (``job_ended: true``) they are information only."""
RESOLVING_STATUSES = ("ok", "no_suspect")
"""``suspect_ranks`` statuses whose ``judged_ranks`` may resolve a rank (``partial`` proves no absence)."""
_NO_VERDICT = "no verdict on the slow rank for this capture; the captured data is kept"
_JOB_ALERT_TEXT = {
    "ProfwatchBatchIncomplete": ("a capture did not complete (missing or unusable rank dirs)", _NO_VERDICT),
    "ProfwatchAnalysisFailed": ("the analysis of a complete capture failed", _NO_VERDICT),
    "ProfwatchPathRefused": ("a rank named a config or profiling path outside the allowed roots",
                             "captures cannot be armed or read for this job"),
    "ProfwatchJobIdCollision": ("another job claims this job id (its messages are refused)",
                                "the other job is not watched; this one is watched as before"),
    "ProfwatchCaptureUnavailable": ("ranks of the job cannot be captured",
                                    "slowdowns are detected but never captured or explained until it is fixed"),
    "ProfwatchCulpritRotates": ("successive captures of one episode named a different slow rank each",
                                "no single slow rank to fix: balance the load (e.g. MoE routing, expert placement); "
                                "the episode is not captured again"),
    "ProfwatchSlowFromStart": ("ranks have been slower than their peers since the job started (no roles declared)",
                               "every rank waits for them in synchronous training; a bad node, or a role difference: "
                               "declare roles to silence"),
}
"""Summary and impact annotations of each job-level alert: (what happened, what it costs)."""
LIFETIME_FACTOR = 4
_ANNOTATION_MAX = 2048

AlertKey = tuple[str, str, int | str | None]
"""(job_id, alertname, rank, ``"a-b"`` for a link, the episode id of a rotation, or None): at most one standing
alert per key."""


@dataclass(slots=True)
class StandingAlert:
    """One alert that fires until resolved."""

    key: AlertKey
    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at_unix_s: float
    generator_url: str = ""
    judged_steps: int | None = None
    """Steps the verdict that fired it judged (``captured_steps``; None: not recorded, an older event)."""


def parse_time(value: Any, default: float) -> float:
    """RFC 3339 (``...Z`` or with an offset) -> Unix seconds; ``default`` when missing or unparsable."""
    if not isinstance(value, str) or not value:
        return default
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return default


def postable(alert: StandingAlert, ends_at_unix_s: float) -> dict[str, Any]:
    """One ``postableAlert`` (Alertmanager API v2) for ``alert`` ending at ``ends_at_unix_s``."""
    out: dict[str, Any] = {"labels": dict(alert.labels), "annotations": dict(alert.annotations),
                           "startsAt": rfc3339(alert.starts_at_unix_s),
                           "endsAt": rfc3339(max(ends_at_unix_s, alert.starts_at_unix_s))}
    if alert.generator_url:
        out["generatorURL"] = alert.generator_url
    return out


def _clip(text: Any) -> str:
    s = "" if text is None else str(text)
    return s if len(s) <= _ANNOTATION_MAX else s[: _ANNOTATION_MAX - 1] + "…"


def _labels(**kv: Any) -> dict[str, str]:
    """Label set without empty values (an empty label value means 'no such label' in Prometheus' model)."""
    return {k: str(v) for k, v in kv.items() if v not in (None, "")}


def saving_text(impact: Any) -> str:
    """The what-if figure (``docs/verdicts.md``) as text, or "" when the verdict carries none."""
    if not isinstance(impact, Mapping):
        return ""
    sec, pct, hours = (impact.get(k) for k in ("saving_s_per_step", "saving_pct_of_step", "accelerator_hours_per_day"))
    if not isinstance(sec, (int, float)) or isinstance(sec, bool):
        return ""
    text = f"{1e3 * float(sec):.1f} ms per step"
    if isinstance(pct, (int, float)) and not isinstance(pct, bool):
        text += f" ({float(pct):.1f}% of the mean step"
        text += f", {float(hours):.1f} {hours_unit(impact)} per day)" if isinstance(hours, (int, float)) else ")"
    return text


def _impact(s: Mapping[str, Any], world_size: Any) -> str:
    saving = saving_text(s.get("impact"))
    if saving:
        return f"fixing rank {s.get('rank')} alone would save {saving}"
    ev = s.get("evidence") or {}
    effect = ev.get("effect_frac")
    mine = (ev.get("median_us") or {}).get("step_time_us")
    peers = (ev.get("peer_median_us") or {}).get("step_time_us")
    who = f"all {world_size} ranks" if world_size else "every rank of the job"
    parts = []
    if isinstance(effect, (int, float)):
        parts.append(f"rank {s.get('rank')} spends +{100 * float(effect):.0f}% {s.get('kind', 'time')} time per step")
    if isinstance(mine, (int, float)) and isinstance(peers, (int, float)):
        parts.append(f"step time {float(mine) / 1e3:.1f} ms vs peer median {float(peers) / 1e3:.1f} ms")
    body = "; ".join(parts) or f"rank {s.get('rank')} is the most likely reason for slow steps"
    return f"{body}; in synchronous collectives {who} wait for it"


def _report_url(data: Mapping[str, Any]) -> str:
    paths = data.get("paths") or {}
    report = data.get("report") or paths.get("report_html") or paths.get("report_json") or ""
    return str(report)


def _link_id(lk: Mapping[str, Any]) -> str:
    """``"a-b"`` (a < b) for a slow link's two ranks, "" when ``ranks`` is not two distinct ints."""
    ranks = lk.get("ranks")
    if not isinstance(ranks, (list, tuple)) or len(ranks) != 2:
        return ""
    if not all(isinstance(r, int) and not isinstance(r, bool) for r in ranks) or ranks[0] == ranks[1]:
        return ""
    a, b = sorted(int(r) for r in ranks)
    return f"{a}-{b}"


def _phase_note(data: Mapping[str, Any]) -> str:
    """``analysis`` annotation: the recipes still to come (first alert) or the follow-up's recipe statuses."""
    pending = data.get("pending_recipes")
    if isinstance(pending, list) and pending:
        return "first verdict; follow-up coming: " + ", ".join(str(p) for p in pending)
    recipes = data.get("recipes")
    if data.get("follow_up") and isinstance(recipes, Mapping):
        return "enriched: " + ", ".join(f"{k}={v.get('status')}" for k, v in recipes.items() if isinstance(v, Mapping))
    return ""


def _episode_of(data: Mapping[str, Any]) -> str | None:
    """The ``episode_id`` an episode event names, or None (an older event without one)."""
    ep = data.get("episode_id")
    return ep if isinstance(ep, str) and ep else None


def judged_of(data: Mapping[str, Any]) -> set[int]:
    """Ranks a ``suspect_ranks`` event captured and judged: ``judged_ranks``, else the ranks of its per-rank
    summary (``ranks[].rank``), else none (an old or partial event resolves nothing)."""
    jr = data.get("judged_ranks")
    if isinstance(jr, list):
        return {int(r) for r in jr if isinstance(r, int) and not isinstance(r, bool)}
    rows = data.get("ranks")
    if isinstance(rows, list):
        return {int(r["rank"]) for r in rows if isinstance(r, Mapping) and isinstance(r.get("rank"), int)}
    return set()


def judged_steps_of(data: Mapping[str, Any]) -> int | None:
    """How many steps a verdict judged: the length of its ``captured_steps``; None when it does not say."""
    steps = data.get("captured_steps")
    return len(steps) if isinstance(steps, list) else None


CLEAR_ENOUGH_STEPS = 10
"""Judged steps after which a verdict may resolve a standing alert however many the firing one judged: the default
``[capture] max_active`` (``CaptureSettings``; ``tests/unit/test_alertmanager.py`` keeps them equal), the most a
detection capture of a job records unless its window was sized for a small group's verdict (up to ``[arming]
small_group_max_active``, 40): without it a page fired by a sized 40-step capture stood until the job ended."""


def too_short_to_clear(fired_steps: int | None, verdict_steps: int | None) -> bool:
    """True when a verdict judged fewer steps than the one that fired a standing alert, and fewer than
    :data:`CLEAR_ENOUGH_STEPS`: its "not slow" may be the noise of a short window, so it must not resolve the page.
    Unknown counts (older events) never hold it."""
    return fired_steps is not None and verdict_steps is not None \
        and verdict_steps < min(fired_steps, CLEAR_ENOUGH_STEPS)


class AlertBook:
    """The standing Alertmanager alerts of one coordinator, fed with every published CloudEvent in order.

    Args:
        cluster: value of the ``cluster`` label.
        resend_interval_s: standing alerts are returned by :meth:`due` this often; each carries
            ``endsAt = now + 4 x resend_interval_s``.
        max_suspects: alerts per ``suspect_ranks`` event.
        external_url: ``generatorURL``; default a ``file://`` link to the batch report (when one exists).
    """

    def __init__(self, *, cluster: str, resend_interval_s: float, max_suspects: int = 5,
                 external_url: str = "") -> None:
        self.cluster = cluster
        self.resend_interval_s = resend_interval_s
        self.max_suspects = max_suspects
        self.external_url = external_url
        self.alerts: dict[AlertKey, StandingAlert] = {}
        self.ended = EndedJobs()
        self._next_resend = 0.0

    @property
    def lifetime_s(self) -> float:
        return LIFETIME_FACTOR * self.resend_interval_s

    # -- feeding ------------------------------------------------------------------------------------------------
    def apply(self, event: Mapping[str, Any], now_unix_s: float) -> list[dict[str, Any]]:
        """Update the book with one CloudEvent; return the postable alerts to send now (new or changed firing
        alerts with ``endsAt`` in the future, resolved ones with ``endsAt`` = now). Events of other types, and
        events without a job (``subject``), return ``[]``."""
        type_ = event.get("type")
        job_id = str(event.get("subject") or "")
        raw = event.get("data")
        data: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
        if not job_id or type_ not in (TYPE_SUSPECT_RANKS, TYPE_ANALYSIS_ENRICHED, TYPE_JOB_ENDED, TYPE_EPISODE_CLOSED,
                                       *JOB_ALERTNAMES):
            return []
        starts = parse_time(event.get("time"), now_unix_s)
        if type_ == TYPE_JOB_ENDED:
            return self._on_job_ended(job_id, data, starts, now_unix_s)
        if type_ in VERDICT_TYPES and self._after_end(job_id, data):
            return []  # information only: the job ended before this verdict (the event still goes out elsewhere)
        if type_ == TYPE_EPISODE_CLOSED:  # a rotating episode ended: its rotation alert resolves
            key = (job_id, JOB_ALERTNAMES[TYPE_CULPRIT_ROTATES], _episode_of(data))
            return [self._resolve(key, now_unix_s)] if data.get("rotation") and key in self.alerts else []
        if type_ in JOB_ALERTNAMES:
            return self._on_job_alert(str(type_), job_id, event, data, starts, now_unix_s)
        return self._on_verdict(job_id, event, data, starts, now_unix_s, standing_only=type_ == TYPE_ANALYSIS_ENRICHED)

    def _on_job_ended(self, job_id: str, data: Mapping[str, Any], starts: float,
                      now_unix_s: float) -> list[dict[str, Any]]:
        """``job_ended``: every alert of the job resolves, and its generation is remembered as ended."""
        out = [self._resolve(key, now_unix_s) for key in [k for k in self.alerts if k[0] == job_id]]
        gen = data.get("generation")
        if isinstance(gen, int) and not isinstance(gen, bool):
            last = data.get("last_report_unix_s")
            self.ended.mark(job_id, gen, float(last) if isinstance(last, (int, float)) else starts)
        return out

    def _on_job_alert(self, type_: str, job_id: str, event: Mapping[str, Any], data: Mapping[str, Any],
                      starts: float, now_unix_s: float) -> list[dict[str, Any]]:
        """A job-level alert event (``JOB_ALERTNAMES``); a rotating culprit gets one alert per episode."""
        name = JOB_ALERTNAMES[type_]
        alert = self._job_alert(job_id, name, event, data, starts)
        if type_ == TYPE_CULPRIT_ROTATES:  # one alert per rotating episode: two episodes never share one
            episode = _episode_of(data)
            alert.key = (job_id, name, episode)
            if episode is not None:
                alert.labels["episode_id"] = episode
        return self._fire(alert, now_unix_s)

    def _on_verdict(self, job_id: str, event: Mapping[str, Any], data: Mapping[str, Any], starts: float,
                    now_unix_s: float, *, standing_only: bool) -> list[dict[str, Any]]:
        """``suspect_ranks``, or its ``analysis_enriched`` follow-up (``standing_only``: the same verdict judged again
        on the advisor's and the communication matrix's evidence: same keys, so standing alerts keep startsAt and
        get the new annotations, and no rank alert is created)."""
        out: list[dict[str, Any]] = []
        for name in RESOLVED_BY_VERDICT:
            if (job_id, name, None) in self.alerts:
                out.append(self._resolve((job_id, name, None), now_unix_s))
        suspects = [s for s in (data.get("suspects") or []) if isinstance(s, Mapping) and isinstance(s.get("rank"), int)]
        suspects = suspects[: self.max_suspects]
        links = [lk for lk in (data.get("links") or []) if isinstance(lk, Mapping) and _link_id(lk)]
        links = links[: self.max_suspects]
        status = data.get("status")
        if status in RESOLVING_STATUSES:
            out.extend(self._resolve_cleared(job_id, data, suspects, links, now_unix_s))
        elif status in UNJUDGED_STATUSES:
            out.extend(self._fire(self._unjudged_alert(job_id, event, data, starts), now_unix_s, standing_only))
        for pos, s in enumerate(suspects, start=1):
            out.extend(self._fire(self._suspect_alert(job_id, pos, s, event, data, starts), now_unix_s, standing_only))
        for lk in links:  # slow links: only the follow-up's communication matrix names them, so it may create them
            out.extend(self._fire(self._link_alert(job_id, lk, event, data, starts), now_unix_s))
        return out

    def _resolve_cleared(self, job_id: str, data: Mapping[str, Any], suspects: list[Mapping[str, Any]],
                         links: list[Mapping[str, Any]], now_unix_s: float) -> list[dict[str, Any]]:
        """A verdict on judged ranks resolves the rank and link alerts it no longer names, and the unjudged one; a
        rank or link alert it judged not slow on too few steps to clear (:func:`too_short_to_clear`) stays and says
        so (:meth:`_held_short`)."""
        out: list[dict[str, Any]] = []
        judged = judged_of(data)
        steps = judged_steps_of(data)
        slow = {int(s["rank"]) for s in suspects}
        cleared: list[StandingAlert] = []
        for rank in sorted(judged - slow):
            held = self.alerts.get((job_id, ALERTNAME_SUSPECT, rank))
            if held is not None:
                cleared.append(held)
        named = {_link_id(lk) for lk in links}
        for key in [k for k in self.alerts if k[0] == job_id and k[1] == ALERTNAME_LINK and k[2] not in named]:
            a, b = (int(x) for x in str(key[2]).split("-"))
            if a in judged and b in judged:
                cleared.append(self.alerts[key])
        for held in cleared:
            if too_short_to_clear(held.judged_steps, steps):
                out.extend(self._held_short(held, data, steps, now_unix_s))
            else:
                out.append(self._resolve(held.key, now_unix_s))
        if (job_id, ALERTNAME_UNJUDGED, None) in self.alerts:
            out.append(self._resolve((job_id, ALERTNAME_UNJUDGED, None), now_unix_s))
        return out

    def _held_short(self, held: StandingAlert, data: Mapping[str, Any], steps: int | None,
                    now_unix_s: float) -> list[dict[str, Any]]:
        """``held`` was judged not slow by a verdict too short to clear it: its ``held`` annotation says which
        capture, on how many steps, and what clears it, and it is re-sent (same labels and ``startsAt``); ``[]``
        when it said so already."""
        note = _clip(f"capture {data.get('capture_id') or data.get('batch_id') or '?'} judged it not slow on {steps} "
                     f"step(s), fewer than the {held.judged_steps} of the verdict that raised this alert and than "
                     f"{CLEAR_ENOUGH_STEPS}: too short to clear it, so it stands until a capture of at least "
                     f"{min(held.judged_steps or CLEAR_ENOUGH_STEPS, CLEAR_ENOUGH_STEPS)} steps judges it not slow")
        if held.annotations.get("held") == note:
            return []
        held.annotations["held"] = note
        return [postable(held, now_unix_s + self.lifetime_s)]

    def _after_end(self, job_id: str, data: Mapping[str, Any]) -> bool:
        """Whether a verdict event is about an ended (job, generation): its ``job_ended`` field, else (an event
        stored before the field existed) the book's memory of ended generations. ``job_ended: false`` revives."""
        flag = data.get("job_ended")
        gen = data.get("generation")
        gen = gen if isinstance(gen, int) and not isinstance(gen, bool) else None
        if flag is True:
            return True
        if flag is False:
            if gen is not None:
                self.ended.revive(job_id, gen)
            return False
        return self.ended.ended(job_id, gen)

    def restore(self, events: Iterable[Mapping[str, Any]]) -> int:
        """Rebuild the book from stored events (oldest first) after a restart, sending nothing; the next
        :meth:`due` re-sends every standing alert. Returns how many alerts stand."""
        for ev in events:
            self.apply(ev, parse_time(ev.get("time"), 0.0))
        self._next_resend = 0.0
        return len(self.alerts)

    def due(self, now_unix_s: float) -> list[dict[str, Any]]:
        """Every standing alert (with a fresh ``endsAt``) when a re-send is due, else ``[]``."""
        if now_unix_s < self._next_resend:
            return []
        self._next_resend = now_unix_s + self.resend_interval_s
        ends = now_unix_s + self.lifetime_s
        return [postable(a, ends) for a in self.alerts.values()]

    # -- building -----------------------------------------------------------------------------------------------
    def _fire(self, alert: StandingAlert, now: float, standing_only: bool = False) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        old = self.alerts.get(alert.key)
        if old is None and standing_only:
            return out
        if old is not None:
            if old.labels == alert.labels:
                alert.starts_at_unix_s = old.starts_at_unix_s  # the same alert, still firing
            else:
                out.append(self._resolve(old.key, now))
        self.alerts[alert.key] = alert
        out.append(postable(alert, now + self.lifetime_s))
        return out

    def _resolve(self, key: AlertKey, now: float) -> dict[str, Any]:
        alert = self.alerts.pop(key)
        return postable(alert, now)

    def _generator(self, data: Mapping[str, Any]) -> str:
        if self.external_url:
            return self.external_url
        report = _report_url(data)
        return f"file://{report}" if report.startswith("/") else ""

    def _suspect_alert(self, job_id: str, pos: int, s: Mapping[str, Any], event: Mapping[str, Any],
                       data: Mapping[str, Any], starts: float) -> StandingAlert:
        rank = int(s["rank"])
        score = float(s.get("score") or 0.0)
        labels = _labels(alertname=ALERTNAME_SUSPECT, job_id=job_id, rank=rank, hostname=s.get("hostname"),
                         kind=s.get("kind") or "unknown", severity="critical" if pos == 1 else "warning",
                         cluster=self.cluster)
        ann = {
            "summary": f"job {job_id}: rank {rank} ({s.get('hostname') or 'host unknown'}) is suspect #{pos} "
                       f"({s.get('kind') or 'unknown'}, score {score:.2f}) in batch {data.get('batch_id')}",
            "description": (s.get("evidence") or {}).get("summary") or "",
            "why": next((drilldown_text(c) for c in data.get("op_compare") or []
                         if isinstance(c, Mapping) and c.get("rank") == rank), ""),
            "impact": _impact(s, data.get("world_size")),
            "report": _report_url(data),
            "rank_dir": s.get("rank_dir") or "",
            "batch_id": data.get("batch_id") or "",
            "capture_id": data.get("capture_id") or "",
            "capture_reason": data.get("capture_reason") or "",
            "score": f"{score:.4f}",
            "cloudevent_id": event.get("id") or "",
            "analysis": _phase_note(data),
        }
        return StandingAlert((job_id, ALERTNAME_SUSPECT, rank), labels,
                             {k: _clip(v) for k, v in ann.items() if v not in (None, "")}, starts,
                             self._generator(data), judged_steps_of(data))

    def _link_alert(self, job_id: str, lk: Mapping[str, Any], event: Mapping[str, Any], data: Mapping[str, Any],
                    starts: float) -> StandingAlert:
        link = _link_id(lk)
        bw, peer = lk.get("bandwidth_gbps"), lk.get("peer_median_gbps")
        labels = _labels(alertname=ALERTNAME_LINK, job_id=job_id, link=link, kind="communication",
                         group=lk.get("group"), severity="warning", cluster=self.cluster)
        speed = (f"{float(bw):.1f} GB/s against a peer median of {float(peer):.1f} GB/s"
                 if isinstance(bw, (int, float)) and isinstance(peer, (int, float)) else "slower than its peers")
        saving = saving_text(lk.get("impact"))
        ann = {
            "summary": f"job {job_id}: the link between ranks {link.replace('-', ' and ')} is slow ({speed}) "
                       f"in batch {data.get('batch_id')}",
            "description": (lk.get("evidence") or {}).get("summary") or "" if isinstance(lk.get("evidence"), Mapping)
                           else "",
            "impact": f"fixing this link alone would save {saving}" if saving else
                      "collectives over this link wait for it",
            "report": _report_url(data),
            "batch_id": data.get("batch_id") or "",
            "capture_id": data.get("capture_id") or "",
            "cloudevent_id": event.get("id") or "",
        }
        return StandingAlert((job_id, ALERTNAME_LINK, link), labels,
                             {k: _clip(v) for k, v in ann.items() if v not in (None, "")}, starts,
                             self._generator(data), judged_steps_of(data))

    def _unjudged_alert(self, job_id: str, event: Mapping[str, Any], data: Mapping[str, Any],
                        starts: float) -> StandingAlert:
        labels = _labels(alertname=ALERTNAME_UNJUDGED, job_id=job_id, severity="warning", cluster=self.cluster)
        unjudged = [u for u in (data.get("unjudged_ranks") or []) if isinstance(u, Mapping)]
        names = "; ".join(f"rank {u.get('rank')}: {u.get('reason')}" for u in unjudged[:8])
        ann = {
            "summary": f"job {job_id}: the verdict of batch {data.get('batch_id')} is {data.get('status')}: "
                       + (f"{len(unjudged)} rank(s) could not be judged" if unjudged else "the evidence is weak"),
            "description": "; ".join(x for x in (str(data.get("detail") or ""), names) if x),
            "impact": "a slow rank among those not judged would go unseen; the captured data is kept",
            "report": _report_url(data),
            "batch_id": data.get("batch_id") or "",
            "capture_id": data.get("capture_id") or "",
            "cloudevent_id": event.get("id") or "",
        }
        return StandingAlert((job_id, ALERTNAME_UNJUDGED, None), labels,
                             {k: _clip(v) for k, v in ann.items() if v not in (None, "")}, starts,
                             self._generator(data))

    def _job_alert(self, job_id: str, name: str, event: Mapping[str, Any], data: Mapping[str, Any],
                   starts: float) -> StandingAlert:
        labels = _labels(alertname=name, job_id=job_id, severity="warning", cluster=self.cluster)
        what, impact = _JOB_ALERT_TEXT[name]
        detail = data.get("detail") or data.get("error") or data.get("problems") or data.get("missing_ranks") or ""
        if isinstance(detail, Mapping) and isinstance(detail.get("text"), str):
            detail = detail["text"]  # a detector's report (slow_from_start): its sentence, not its evidence
        ann = {
            "summary": f"job {job_id}: {what}",
            "description": detail if isinstance(detail, str) else repr(detail),
            "impact": impact,
            "fix": data.get("fix") or "",
            "report": _report_url(data),
            "capture_id": data.get("capture_id") or "",
            "batch_id": data.get("batch_id") or "",
            "cloudevent_id": event.get("id") or "",
        }
        return StandingAlert((job_id, name, None), labels,
                             {k: _clip(v) for k, v in ann.items() if v not in (None, "")}, starts,
                             self._generator(data))
