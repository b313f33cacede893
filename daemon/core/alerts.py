"""Alert payloads: CloudEvents 1.0 envelopes, suspect-rank event data, Alertmanager webhook v4 (pure).

Formats:
* CloudEvents 1.0 structured JSON mode (https://github.com/cloudevents/spec/blob/v1.0.2/cloudevents/spec.md):
  required ``id``, ``source``, ``specversion`` "1.0", ``type``; we also set ``subject`` (the job id), ``time``
  (RFC 3339, UTC), ``datacontenttype`` "application/json" and ``data``. ``source`` + ``id`` is the dedup key.
* Alertmanager webhook payload version "4"
  (https://prometheus.io/docs/alerting/latest/configuration/#webhook_config), so existing routing, silencing and
  Slack/PagerDuty integrations accept profwatch alerts unchanged.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from statistics import median
from typing import Any

from daemon.core.evidence import RankStepSummary, RecipeStatus, Suspect

SPECVERSION = "1.0"
TYPE_SUSPECT_RANKS = "io.profwatch.suspect_ranks.v1"
TYPE_BATCH_INCOMPLETE = "io.profwatch.batch_incomplete.v1"
TYPE_ANOMALY = "io.profwatch.anomaly.v1"
TYPE_ARM = "io.profwatch.arm.v1"
TYPE_CAPTURE = "io.profwatch.capture.v1"
TYPE_ANALYSIS_FAILED = "io.profwatch.analysis_failed.v1"
TYPE_ARM_DECISION = "io.profwatch.arm_decision.v1"
TYPE_BATCH = "io.profwatch.batch.v1"
TYPE_PATH_REFUSED = "io.profwatch.path_refused.v1"
TYPE_ANALYSIS_ENRICHED = "io.profwatch.analysis_enriched.v1"
"""Follow-up of a published verdict (the advisor's findings), same ``capture_id``/``batch_id``."""
EVENT_TYPES = frozenset({TYPE_SUSPECT_RANKS, TYPE_BATCH_INCOMPLETE, TYPE_ANOMALY, TYPE_ARM, TYPE_CAPTURE,
                         TYPE_ANALYSIS_FAILED, TYPE_ARM_DECISION, TYPE_BATCH, TYPE_PATH_REFUSED,
                         TYPE_ANALYSIS_ENRICHED})
ALERTMANAGER_ZERO_TIME = "0001-01-01T00:00:00Z"
"""``endsAt`` of a firing alert in Alertmanager's webhook payload."""
_ALERTNAMES = {
    TYPE_SUSPECT_RANKS: "ProfwatchSuspectRank",
    TYPE_BATCH_INCOMPLETE: "ProfwatchBatchIncomplete",
    TYPE_ANALYSIS_FAILED: "ProfwatchAnalysisFailed",
    TYPE_ANOMALY: "ProfwatchAnomaly",
    TYPE_ARM: "ProfwatchCaptureArmed",
    TYPE_CAPTURE: "ProfwatchCapture",
    TYPE_ARM_DECISION: "ProfwatchArmDecision",
    TYPE_BATCH: "ProfwatchBatch",
    TYPE_PATH_REFUSED: "ProfwatchPathRefused",
    TYPE_ANALYSIS_ENRICHED: "ProfwatchAnalysisEnriched",
}


class AlertFormatError(ValueError):
    """An event cannot be built or converted (unknown type, missing required attribute)."""


def rfc3339(ts_unix_s: float) -> str:
    """Unix seconds -> RFC 3339 UTC with milliseconds, e.g. ``2025-11-30T10:00:00.250Z``."""
    dt = datetime.fromtimestamp(ts_unix_s, tz=timezone.utc)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


def _digest(*parts: Any, n: int = 32) -> str:
    blob = json.dumps(parts, sort_keys=True, default=str, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:n]


def make_cloudevent(type_: str, job_id: str, data: Mapping[str, Any], *, source: str, now_unix_s: float,
                    event_id: str | None = None) -> dict[str, Any]:
    """Build one CloudEvents 1.0 structured-mode event.

    Args:
        type_: reverse-DNS event type, one of ``EVENT_TYPES``.
        job_id: becomes ``subject``.
        data: JSON-serialisable payload.
        source: URI-reference of the producer, e.g. ``//profwatch/coordinator/host1``.
        now_unix_s: event time (Unix seconds).
        event_id: explicit id; default is a deterministic hash of (type, source, job, time, data), so a replayed
            event keeps its id and consumers can dedup on ``source`` + ``id``.

    Raises:
        AlertFormatError: unknown type, empty source or job id.
    """
    if type_ not in EVENT_TYPES:
        raise AlertFormatError(f"unknown event type {type_!r}")
    if not source or not job_id:
        raise AlertFormatError("source and job_id are required")
    return {
        "specversion": SPECVERSION,
        "id": event_id or _digest(type_, source, job_id, now_unix_s, data),
        "source": source,
        "type": type_,
        "subject": job_id,
        "time": rfc3339(now_unix_s),
        "datacontenttype": "application/json",
        "data": dict(data),
    }


def per_rank_summary(summaries: Sequence[RankStepSummary]) -> list[dict[str, Any]]:
    """Per-rank medians over steps: ``[{"rank", "steps", "step_time_us", "computation_us", ...}]`` sorted by rank."""
    by_rank: dict[int, list[RankStepSummary]] = {}
    for s in summaries:
        if s.step >= 0:
            by_rank.setdefault(s.rank, []).append(s)
    out = []
    for rank in sorted(by_rank):
        rows = by_rank[rank]
        item: dict[str, Any] = {"rank": rank, "steps": len(rows)}
        for m in ("step_time_us", "computation_us", "communication_us", "wait_us", "transmit_us", "free_us"):
            item[m] = round(median(float(getattr(r, m)) for r in rows), 3)
        out.append(item)
    return out


def suspect_alert_data(*, batch_id: str, job_id: str | None, kind: str, status: str,
                       suspects: Sequence[Suspect], summaries: Sequence[RankStepSummary],
                       recipes: Mapping[str, RecipeStatus], paths: Mapping[str, str | None],
                       capture_reason: str | None = None, world_size: int | None = None,
                       notes: Sequence[str] = ()) -> dict[str, Any]:
    """``data`` of an ``io.profwatch.suspect_ranks.v1`` event.

    Shape::

        {"batch_id", "job_id", "kind" ("ascend_pt"|"torch_pt"), "status", "capture_reason", "world_size",
         "suspects": [{"rank", "score", "kind", "hostname", "evidence", "rank_dir"}],   # ordered, best first
         "ranks": [{"rank", "steps", "step_time_us", "computation_us", "communication_us", "wait_us",
                    "transmit_us", "free_us"}],                                          # medians over steps
         "recipes": {name: {"status", "detail", "tables", "rows", "output_dir", "duration_s", ...}},
         "paths": {"staging", "outputs", "advisor_html", "report_json", "report_html"}, "notes": [...]}
    """
    return {
        "batch_id": batch_id,
        "job_id": job_id,
        "kind": kind,
        "status": status,
        "capture_reason": capture_reason,
        "world_size": world_size,
        "suspects": [s.to_json() for s in suspects],
        "ranks": per_rank_summary(summaries),
        "recipes": {name: r.to_json() for name, r in recipes.items()},
        "paths": {k: v for k, v in paths.items() if v},
        "notes": list(notes),
    }


def _fingerprint(labels: Mapping[str, str]) -> str:
    """16 hex chars identifying a label set (Alertmanager's fingerprint is a 64-bit hash of the labels)."""
    return _digest(sorted(labels.items()), n=16)


def _event_alerts(ev: Mapping[str, Any], external_url: str, max_suspects: int) -> list[dict[str, Any]]:
    """One Alertmanager alert per suspect of a suspect_ranks event; one alert for any other type."""
    type_ = ev.get("type")
    if type_ not in _ALERTNAMES:
        raise AlertFormatError(f"not a profwatch event: type={type_!r}")
    data = ev.get("data") or {}
    base = {"alertname": _ALERTNAMES[type_], "job_id": str(ev.get("subject", "")), "source": "profwatch"}
    if data.get("batch_id"):
        base["batch_id"] = str(data["batch_id"])
    starts = ev.get("time") or ALERTMANAGER_ZERO_TIME
    paths = data.get("paths") or {}
    report = paths.get("report_html") or paths.get("report_json") or ""
    alerts: list[dict[str, Any]] = []
    if type_ == TYPE_SUSPECT_RANKS:
        for pos, s in enumerate((data.get("suspects") or [])[:max_suspects], start=1):
            labels = {**base, "rank": str(s["rank"]), "kind": str(s.get("kind", "unknown")),
                      "hostname": str(s.get("hostname") or ""), "severity": "warning" if pos > 1 else "critical"}
            ann = {
                "summary": f"rank {s['rank']} ({s.get('hostname') or '?'}) is suspect #{pos} in batch "
                           f"{data.get('batch_id')}: {s.get('kind')}, score {float(s.get('score', 0)):.2f}",
                "description": str((s.get("evidence") or {}).get("summary", "")),
                "score": f"{float(s.get('score', 0)):.4f}",
                "rank_dir": str(s.get("rank_dir") or ""),
                "report": report,
                "capture_reason": str(data.get("capture_reason") or ""),
                "cloudevent_id": str(ev.get("id", "")),
            }
            alerts.append(_alert(labels, ann, starts, external_url))
        return alerts
    labels = {**base, "severity": "warning" if type_ in (TYPE_BATCH_INCOMPLETE, TYPE_ANALYSIS_FAILED) else "info"}
    detail = data.get("detail") or data.get("reason") or data.get("status") or ""
    ann = {"summary": f"{_ALERTNAMES[type_]} for job {ev.get('subject')}", "description": str(detail),
           "report": report, "cloudevent_id": str(ev.get("id", ""))}
    return [_alert(labels, ann, starts, external_url)]


def _alert(labels: dict[str, str], ann: dict[str, str], starts: str, external_url: str) -> dict[str, Any]:
    ann = {k: v for k, v in ann.items() if v != ""}
    return {"status": "firing", "labels": labels, "annotations": ann, "startsAt": starts,
            "endsAt": ALERTMANAGER_ZERO_TIME, "generatorURL": external_url, "fingerprint": _fingerprint(labels)}


def _common(dicts: Iterable[Mapping[str, str]]) -> dict[str, str]:
    items = [dict(d) for d in dicts]
    if not items:
        return {}
    first = items[0]
    return {k: v for k, v in first.items() if all(d.get(k) == v for d in items[1:])}


def to_alertmanager(events: Sequence[Mapping[str, Any]], *, external_url: str, receiver: str = "profwatch",
                    max_alerts: int = 0, max_suspects_per_event: int = 5) -> dict[str, Any]:
    """Convert CloudEvents (from :func:`make_cloudevent`) into one Alertmanager webhook v4 payload.

    Args:
        events: profwatch events; a ``suspect_ranks`` event yields one alert per suspect (labels ``rank``,
            ``hostname``, ``kind``; the top suspect is ``critical``), other types one alert each. A
            ``suspect_ranks`` event without suspects yields no alert.
        external_url: ``externalURL`` and each alert's ``generatorURL`` (e.g. the coordinator's report URL).
        max_alerts: cap on ``alerts`` (0 = none); the rest is counted in ``truncatedAlerts``.

    Returns:
        ``{"receiver", "status", "alerts", "groupLabels", "commonLabels", "commonAnnotations", "externalURL",
        "version": "4", "groupKey", "truncatedAlerts"}``.

    Raises:
        AlertFormatError: an event of an unknown type.
    """
    alerts: list[dict[str, Any]] = []
    for ev in events:
        alerts.extend(_event_alerts(ev, external_url, max_suspects_per_event))
    truncated = 0
    if max_alerts and len(alerts) > max_alerts:
        truncated = len(alerts) - max_alerts
        alerts = alerts[:max_alerts]
    common_labels = _common(a["labels"] for a in alerts)
    group_labels = {k: common_labels[k] for k in ("alertname", "job_id") if k in common_labels}
    group_key = "{}:{" + ", ".join(f'{k}="{v}"' for k, v in sorted(group_labels.items())) + "}"
    return {
        "receiver": receiver,
        "status": "firing" if any(a["status"] == "firing" for a in alerts) else "resolved",
        "alerts": alerts,
        "groupLabels": group_labels,
        "commonLabels": common_labels,
        "commonAnnotations": _common(a["annotations"] for a in alerts),
        "externalURL": external_url,
        "version": "4",
        "groupKey": group_key,
        "truncatedAlerts": truncated,
    }
