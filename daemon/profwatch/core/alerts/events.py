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

from profwatch.core.alerts.event_types import (  # the one table of event types; re-exported for the builders below
    EVENT_TYPES,
    TYPE_ANALYSIS_ENRICHED,
    TYPE_ANALYSIS_FAILED,
    TYPE_ANOMALY,
    TYPE_ARM,
    TYPE_ARM_DECISION,
    TYPE_BATCH,
    TYPE_BATCH_INCOMPLETE,
    TYPE_CAPTURE,
    TYPE_JOB_ENDED,
    TYPE_JOB_GENERATION,
    TYPE_PATH_REFUSED,
    TYPE_STORAGE_FAILED,
    TYPE_STORAGE_RECOVERED,
    TYPE_SUSPECT_RANKS,
)
from profwatch.core.verdict.evidence import RankStepSummary, RecipeStatus, Suspect, usable_row

__all__ = [
    "EVENT_TYPES", "TYPE_ANALYSIS_ENRICHED", "TYPE_ANALYSIS_FAILED", "TYPE_ANOMALY", "TYPE_ARM", "TYPE_ARM_DECISION",
    "TYPE_BATCH", "TYPE_BATCH_INCOMPLETE", "TYPE_CAPTURE", "TYPE_JOB_ENDED", "TYPE_JOB_GENERATION",
    "TYPE_PATH_REFUSED", "TYPE_STORAGE_FAILED", "TYPE_STORAGE_RECOVERED", "TYPE_SUSPECT_RANKS",
]

SPECVERSION = "1.0"


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


def collision_data(*, reason: str, owner_uid: int | None, uid: int | None, node_id: str, hostname: str, rank: int,
                   pid: int | None, paths: tuple[str | None, str | None],
                   owner_paths: tuple[str | None, str | None] | None, refused: int, detail: str) -> dict[str, Any]:
    """``data`` of a ``job_id_collision`` event (``core/alerts/event_types.py``).

    Shape::

        {"reason" ("paths_changed"|"uid_mismatch"), "owner_uid", "uid", "pid", "rank", "node_id", "hostname",
         "profiler_config_path", "prof_root", "owner_profiler_config_path", "owner_prof_root", "refused",
         "detail", "fix"}
    """
    owner = owner_paths or (None, None)
    return {"reason": reason, "owner_uid": owner_uid, "uid": uid, "pid": pid, "rank": rank, "node_id": node_id,
            "hostname": hostname, "profiler_config_path": paths[0], "prof_root": paths[1],
            "owner_profiler_config_path": owner[0], "owner_prof_root": owner[1], "refused": refused,
            "detail": detail, "fix": "give each job its own job id (PROFWATCH_JOB_ID, or the launcher's job id); "
            "the second job is not watched until then"}


def collision_event_id(job_id: str, reason: str, node_id: str, uid: int | None,
                       paths: tuple[str | None, str | None]) -> str:
    """One event per case: the job, the reason and who claims it (node, uid, claimed paths)."""
    return f"job_id_collision-{job_id}-{reason}-{_digest(node_id, uid, list(paths), n=16)}"


def per_rank_summary(summaries: Sequence[RankStepSummary]) -> list[dict[str, Any]]:
    """Per-rank medians over the steps the verdict used (:func:`~profwatch.core.verdict.evidence.usable_row`: a
    truncated step is left out here as in the ranking): ``[{"rank", "steps", "step_time_us", "computation_us",
    ...}]`` sorted by rank."""
    by_rank: dict[int, list[RankStepSummary]] = {}
    for s in summaries:
        if usable_row(s):
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
    return sorted({s.rank for s in summaries if usable_row(s)})


def suspect_alert_data(*, batch_id: str, job_id: str | None, kind: str, status: str,
                       suspects: Sequence[Suspect], summaries: Sequence[RankStepSummary],
                       recipes: Mapping[str, RecipeStatus], paths: Mapping[str, str | None],
                       capture_reason: str | None = None, world_size: int | None = None,
                       notes: Sequence[str] = ()) -> dict[str, Any]:
    """``data`` of a ``suspect_ranks`` event.

    Shape::

        {"batch_id", "job_id", "kind" ("ascend_pt"|"torch_pt"), "status", "capture_reason", "world_size",
         "judged_ranks": [int],                                                          # see judged_ranks()
         "suspects": [{"rank", "score", "kind", "hostname", "evidence", "rank_dir"}],   # ordered, best first
         "ranks": [{"rank", "steps", "step_time_us", "computation_us", "communication_us", "wait_us",
                    "transmit_us", "free_us"}],                                          # medians over steps
         "recipes": {name: {"status", "detail", "tables", "rows", "output_dir", "duration_s", ...}},
         "paths": {"staging", "outputs", "advisor_html", "report_json", "report_html", "plotly_js"}, "notes": [...]}
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
