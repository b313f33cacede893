"""Alert payloads: CloudEvents 1.0 envelopes and suspect-rank event data (pure).

Formats:
* CloudEvents 1.0 structured JSON mode (https://github.com/cloudevents/spec/blob/v1.0.2/cloudevents/spec.md):
  required ``id``, ``source``, ``specversion`` "1.0", ``type``; we also set ``subject`` (the job id), ``time``
  (RFC 3339, UTC), ``datacontenttype`` "application/json" and ``data``. ``source`` + ``id`` is the dedup key.
* The Alertmanager mapping (API v2 postable alerts, what Alertmanager accepts) is ``daemon/profwatch/core/alerts/alertmanager.py``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from statistics import median
from typing import Any

from profwatch.core.verdict.evidence import RankStepSummary, RecipeStatus, Suspect

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
TYPE_JOB_ENDED = "io.profwatch.job_ended.v1"
"""No rank of the job reported for ``coordinator.job_end_after_s``; data ``{"last_report_unix_s", "silent_s"}``."""
TYPE_JOB_GENERATION = "io.profwatch.job_generation.v1"
"""A job started a new generation (elastic restart or resize): old and new world size (``docs/generations.md``)."""
TYPE_STORAGE_FAILED = "io.profwatch.storage_failed.v1"
"""The coordinator's state store refused a write (disk full): events are published anyway and retried."""
TYPE_STORAGE_RECOVERED = "io.profwatch.storage_recovered.v1"
"""The state store took every queued write again."""
TYPE_EPISODE_OPENED = "io.profwatch.episode_opened.v1"
"""An anomaly opened an episode (``daemon/profwatch/core/capture/episodes.py``); not an alert."""
TYPE_EPISODE_UPDATED = "io.profwatch.episode_updated.v1"
"""An open episode was reported again or its ranks changed (magnitude, ranks, stage); not an alert."""
TYPE_EPISODE_CLOSED = "io.profwatch.episode_closed.v1"
"""An episode ended (quiet for ``[arming] episode_quiet_steps``, its job ended or started a new generation), with
whether it was captured and, if not, what it waited for; not an alert. Resolves ``culprit_rotates``."""
TYPE_CULPRIT_ROTATES = "io.profwatch.culprit_rotates.v1"
"""Successive captures of one episode named a different rank each (load imbalance, e.g. MoE routing); the episode
is not captured again. An alert (``ProfwatchCulpritRotates``, warning), resolved by the episode's close or job end."""
EVENT_TYPES = frozenset({TYPE_SUSPECT_RANKS, TYPE_BATCH_INCOMPLETE, TYPE_ANOMALY, TYPE_ARM, TYPE_CAPTURE,
                         TYPE_ANALYSIS_FAILED, TYPE_ARM_DECISION, TYPE_BATCH, TYPE_PATH_REFUSED,
                         TYPE_ANALYSIS_ENRICHED, TYPE_JOB_ENDED, TYPE_JOB_GENERATION, TYPE_STORAGE_FAILED,
                         TYPE_STORAGE_RECOVERED, TYPE_EPISODE_OPENED, TYPE_EPISODE_UPDATED, TYPE_EPISODE_CLOSED,
                         TYPE_CULPRIT_ROTATES})


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


def judged_ranks(summaries: Sequence[RankStepSummary]) -> list[int]:
    """Ranks whose time breakdown was captured and analysed (at least one step row), sorted: the ranks a verdict
    covers. A rank absent here (not captured, or no usable rows) was not judged, whatever the status says."""
    return sorted({s.rank for s in summaries if s.step >= 0})


def suspect_alert_data(*, batch_id: str, job_id: str | None, kind: str, status: str,
                       suspects: Sequence[Suspect], summaries: Sequence[RankStepSummary],
                       recipes: Mapping[str, RecipeStatus], paths: Mapping[str, str | None],
                       capture_reason: str | None = None, world_size: int | None = None,
                       notes: Sequence[str] = ()) -> dict[str, Any]:
    """``data`` of an ``io.profwatch.suspect_ranks.v1`` event.

    Shape::

        {"batch_id", "job_id", "kind" ("ascend_pt"|"torch_pt"), "status", "capture_reason", "world_size",
         "judged_ranks": [int],                                                          # see judged_ranks()
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
        "judged_ranks": judged_ranks(summaries),
        "suspects": [s.to_json() for s in suspects],
        "ranks": per_rank_summary(summaries),
        "recipes": {name: r.to_json() for name, r in recipes.items()},
        "paths": {k: v for k, v in paths.items() if v},
        "notes": list(notes),
    }
