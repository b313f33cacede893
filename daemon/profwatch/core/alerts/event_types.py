"""The one table of profwatch's event types (pure): every CloudEvents ``type`` the coordinator publishes, whether it is
an alert, whether the sinks rebuild their state from it after a restart, what Alertmanager calls it, how severe it is
and what resolves it.

Every other module reads this table: the coordinator (which events are stored and published as alerts), the sinks
(which stored events rebuild the Alertmanager book), the Alertmanager mapping (job-level alert names and severities),
the CLI (``profwatch alerts`` filters and one-line formats) and the docs (``docs/alerts.md``). No other product module
spells an ``io.profwatch.<name>.v1`` string (``tests/unit/test_event_types.py`` checks it).

Format of ``type``: CloudEvents 1.0 ``type`` attribute, reverse-DNS prefixed and versioned
(https://github.com/cloudevents/spec/blob/v1.0.2/cloudevents/spec.md#type): ``io.profwatch.<name>.v1``. A new
version of a payload gets a new ``.vN`` entry; consumers match the whole string.

Words: an *alert* (a page) is an event the table marks ``alert=True``: ``profwatch alerts`` shows it by default, the
state store flags it, the alert stream publishes it under the ``alert`` topic and the webhook sink may be limited to
it. Other events are the pipeline's progress (``profwatch alerts --all-events``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Severity = Literal["critical", "warning", "info"]
PREFIX = "io.profwatch."
SUFFIX = ".v1"


@dataclass(frozen=True, slots=True)
class EventType:
    """One row of the table.

    Attributes:
        name: short name, the middle of the CloudEvents type (``suspect_ranks``); what the CLI prints.
        alert: a page (see the module docstring).
        restored_by_sinks: the Alertmanager book is rebuilt from stored events of this type after a restart.
        alertmanager: the Alertmanager ``alertname`` values this event fires (empty: none). A job-level alert
            (one per job) is the single name of a row whose ``job_alert`` is True.
        job_alert: fires one job-level Alertmanager alert named ``alertmanager[0]`` (no rank label).
        severity: the Alertmanager ``severity`` label of the alerts it fires (None: fires none); the suspect-rank
            alert is ``critical`` for the top suspect and ``warning`` for the others.
        resolved_by: what resolves the alerts it fires, in words (docs and ``profwatch alerts --types``).
        summary: one line on what the event says.
    """

    name: str
    alert: bool
    restored_by_sinks: bool
    alertmanager: tuple[str, ...]
    job_alert: bool
    severity: Severity | None
    resolved_by: str
    summary: str

    @property
    def type(self) -> str:
        """The CloudEvents ``type``: ``io.profwatch.<name>.v1``."""
        return f"{PREFIX}{self.name}{SUFFIX}"


_NONE = "-"
TABLE: tuple[EventType, ...] = (
    EventType("suspect_ranks", alert=True, restored_by_sinks=True,
              alertmanager=("ProfwatchSuspectRank", "ProfwatchSlowLink", "ProfwatchVerdictIncomplete"),
              job_alert=False, severity="critical",
              resolved_by="a later ok/no_suspect verdict of the job that judged the rank (or both ranks of a link) "
                          "and does not name it; job_ended",
              summary="the verdict of one captured batch: suspects, slow links, unjudged ranks, impact"),
    EventType("analysis_enriched", alert=True, restored_by_sinks=True,
              alertmanager=("ProfwatchSuspectRank", "ProfwatchSlowLink", "ProfwatchVerdictIncomplete"),
              job_alert=False, severity="critical",
              resolved_by="as suspect_ranks (it replaces the verdict it enriches)",
              summary="follow-up of a published verdict (advisor findings), same capture_id/batch_id"),
    EventType("batch_incomplete", alert=True, restored_by_sinks=True, alertmanager=("ProfwatchBatchIncomplete",),
              job_alert=True, severity="warning",
              resolved_by="a later verdict of the job (any suspect_ranks event); job_ended",
              summary="a capture's rank set did not complete by its deadline: which ranks, why"),
    EventType("analysis_failed", alert=True, restored_by_sinks=True, alertmanager=("ProfwatchAnalysisFailed",),
              job_alert=True, severity="warning",
              resolved_by="a later verdict of the job (any suspect_ranks event); job_ended",
              summary="the analysis of a complete batch failed (tool error, unreadable data)"),
    EventType("path_refused", alert=True, restored_by_sinks=True, alertmanager=("ProfwatchPathRefused",),
              job_alert=True, severity="warning", resolved_by="job_ended",
              summary="a rank's config or prof_dir path was refused (outside the allowed roots, changed, unsafe)"),
    EventType("culprit_rotates", alert=True, restored_by_sinks=True, alertmanager=("ProfwatchCulpritRotates",),
              job_alert=True, severity="warning",
              resolved_by="episode_closed of the rotating episode; job_ended",
              summary="the hot spot moves among ranks (load imbalance, e.g. MoE routing): successive captures, of "
                      "one episode or of successive episodes of one key, named a different rank each, or the ranks "
                      "the key names moved once it took rotation_captures captures; the rotation is not captured "
                      "or paged again as a slow rank"),
    EventType("slow_from_start", alert=True, restored_by_sinks=True, alertmanager=("ProfwatchSlowFromStart",),
              job_alert=True, severity="warning", resolved_by="job_ended",
              summary="ranks slower than their peers since the job (generation) started, in a job that declares no "
                      "roles and shows no pipeline stages: a bad node or an undeclared role (once per generation, "
                      "captured once; declare roles to silence)"),
    EventType("job_id_collision", alert=True, restored_by_sinks=True, alertmanager=("ProfwatchJobIdCollision",),
              job_alert=True, severity="warning", resolved_by="job_ended",
              summary="two jobs claim one job id (reason paths_changed or uid_mismatch, the owning uid): the "
                      "second's messages are refused (core/fleet/job_pins.py)"),
    EventType("capture_unavailable", alert=True, restored_by_sinks=True,
              alertmanager=("ProfwatchCaptureUnavailable",), job_alert=True, severity="warning",
              resolved_by="job_ended",
              summary="ranks of the job cannot be captured (config folder missing, backend not importable): "
                      "the cause and the fix (core/arming/availability.py)"),
    EventType("storage_failed", alert=True, restored_by_sinks=False, alertmanager=(), job_alert=False,
              severity=None, resolved_by="storage_recovered (an event, not an Alertmanager alert)",
              summary="the coordinator's state store refused a write (disk full); events are published anyway"),
    EventType("state_store_reset", alert=True, restored_by_sinks=False, alertmanager=(), job_alert=False,
              severity=None, resolved_by="- (a one-off notice; profwatch_state_store_resets_total counts them)",
              summary="the state db was corrupt at start: moved aside (kept), started empty; what was lost and what "
                      "the nodes rebuild"),
    EventType("job_ended", alert=False, restored_by_sinks=True, alertmanager=(), job_alert=False, severity=None,
              resolved_by=_NONE, summary="the job's generation ended: every rank said bye (reason all_ranks_left, "
                                         "at once) or no rank reported for coordinator.job_end_after_s (reason "
                                         "silent); resolves every alert of the job and closes its episodes"),
    EventType("anomaly", alert=False, restored_by_sinks=False, alertmanager=(), job_alert=False, severity=None,
              resolved_by=_NONE, summary="a detector's report: step regression, rank outlier, stall, spike"),
    EventType("structural_imbalance", alert=False, restored_by_sinks=False, alertmanager=(), job_alert=False,
              severity=None, resolved_by=_NONE,
              summary="ranks slower than their peers from the start of a generation, learned as their baseline: "
                      "ranks, excess, cost per step (once per generation; the detector's anomaly kind of that name)"),
    EventType("drift", alert=False, restored_by_sinks=False, alertmanager=(), job_alert=False, severity=None,
              resolved_by=_NONE,
              summary="the job's step time rose slowly and steadily: slope, total since the reference (once per "
                      "detection.drift_threshold grown; the detector's anomaly kind of that name)"),
    EventType("episode_opened", alert=False, restored_by_sinks=False, alertmanager=(), job_alert=False,
              severity=None, resolved_by=_NONE,
              summary="an anomaly opened an episode (kind, scope, ranks, magnitude); see README: episodes"),
    EventType("episode_updated", alert=False, restored_by_sinks=False, alertmanager=(), job_alert=False,
              severity=None, resolved_by=_NONE,
              summary="an open episode was reported again or its ranks changed (magnitude, ranks, step), or a follow-up "
                      "capture of the ranks its targeted capture waited for was queued (reason follow_up)"),
    EventType("episode_closed", alert=False, restored_by_sinks=True, alertmanager=(), job_alert=False,
              severity=None, resolved_by=_NONE,
              summary="an episode ended (quiet, job ended, new generation): captured or not, what it waited for; "
                      "resolves culprit_rotates"),
    EventType("level_learned", alert=False, restored_by_sinks=False, alertmanager=(), job_alert=False,
              severity=None, resolved_by=_NONE,
              summary="a job-wide episode whose capture found no suspect (no_suspect) stayed at its new level: it is "
                      "the job's new normal (old and new level, the capture); later changes are judged against it"),
    EventType("reference_captured", alert=False, restored_by_sinks=False, alertmanager=(), job_alert=False,
              severity=None, resolved_by=_NONE,
              summary="the job's healthy reference capture was analysed (or could not be): its capture, generation, "
                      "step time and time breakdown; later verdicts compare with it (docs/reference.md)"),
    EventType("arm_decision", alert=False, restored_by_sinks=False, alertmanager=(), job_alert=False,
              severity=None, resolved_by=_NONE, summary="what the arming policy decided for an anomaly and why"),
    EventType("arm", alert=False, restored_by_sinks=False, alertmanager=(), job_alert=False, severity=None,
              resolved_by=_NONE, summary="a capture was armed (config written) or its arm changed state"),
    EventType("capture", alert=False, restored_by_sinks=False, alertmanager=(), job_alert=False, severity=None,
              resolved_by=_NONE, summary="one step in a capture's life (acknowledged, collecting, idle config, ...)"),
    EventType("batch", alert=False, restored_by_sinks=False, alertmanager=(), job_alert=False, severity=None,
              resolved_by=_NONE, summary="a batch's completeness changed (complete, incomplete, ranks seen)"),
    EventType("job_generation", alert=False, restored_by_sinks=False, alertmanager=(), job_alert=False,
              severity=None, resolved_by=_NONE,
              summary="a job started a new generation (elastic restart or resize): old and new world size"),
    EventType("storage_recovered", alert=False, restored_by_sinks=False, alertmanager=(), job_alert=False,
              severity=None, resolved_by=_NONE, summary="the state store took every queued write again"),
)
"""Every event type, alerts first."""

BY_NAME: dict[str, EventType] = {e.name: e for e in TABLE}
BY_TYPE: dict[str, EventType] = {e.type: e for e in TABLE}
EVENT_TYPES: frozenset[str] = frozenset(BY_TYPE)
"""Every CloudEvents ``type`` profwatch publishes."""
ALERT_TYPES: frozenset[str] = frozenset(e.type for e in TABLE if e.alert)
"""The types that are alerts (pages)."""
RESTORE_TYPES: tuple[str, ...] = tuple(e.type for e in TABLE if e.restored_by_sinks)
"""Stored event types the Alertmanager book is rebuilt from after a restart."""
JOB_ALERTNAMES: dict[str, str] = {e.type: e.alertmanager[0] for e in TABLE if e.job_alert}
"""CloudEvents type -> the job-level Alertmanager alert it fires."""


def short_name(type_: str) -> str:
    """``io.profwatch.suspect_ranks.v1`` -> ``suspect_ranks``; an unknown string is returned as it is."""
    e = BY_TYPE.get(type_)
    return e.name if e is not None else type_


def display_name(type_: str) -> str:
    """What the CLI prints for a type: without the ``io.profwatch.`` prefix (``suspect_ranks.v1``)."""
    return type_.removeprefix(PREFIX)


TYPE_SUSPECT_RANKS = BY_NAME["suspect_ranks"].type
TYPE_ANALYSIS_ENRICHED = BY_NAME["analysis_enriched"].type
TYPE_BATCH_INCOMPLETE = BY_NAME["batch_incomplete"].type
TYPE_ANALYSIS_FAILED = BY_NAME["analysis_failed"].type
TYPE_PATH_REFUSED = BY_NAME["path_refused"].type
TYPE_JOB_ID_COLLISION = BY_NAME["job_id_collision"].type
TYPE_CAPTURE_UNAVAILABLE = BY_NAME["capture_unavailable"].type
TYPE_STORAGE_FAILED = BY_NAME["storage_failed"].type
TYPE_STORAGE_RECOVERED = BY_NAME["storage_recovered"].type
TYPE_STATE_STORE_RESET = BY_NAME["state_store_reset"].type
TYPE_JOB_ENDED = BY_NAME["job_ended"].type
TYPE_ANOMALY = BY_NAME["anomaly"].type
TYPE_STRUCTURAL_IMBALANCE = BY_NAME["structural_imbalance"].type
TYPE_DRIFT = BY_NAME["drift"].type
TYPE_SLOW_FROM_START = BY_NAME["slow_from_start"].type
ANOMALY_KIND_TYPES: dict[str, str] = {"structural_imbalance": TYPE_STRUCTURAL_IMBALANCE, "drift": TYPE_DRIFT,
                                      "slow_from_start": TYPE_SLOW_FROM_START}
"""Detector kinds published under their own type (the other kinds are ``anomaly`` events with ``data.kind``)."""
ANOMALY_TYPES: frozenset[str] = frozenset({TYPE_ANOMALY, *ANOMALY_KIND_TYPES.values()})
"""Every type that carries a detector report (same ``data`` shape: kind, step, ranks, magnitude, detail)."""
TYPE_ARM_DECISION = BY_NAME["arm_decision"].type
TYPE_ARM = BY_NAME["arm"].type
TYPE_CAPTURE = BY_NAME["capture"].type
TYPE_BATCH = BY_NAME["batch"].type
TYPE_JOB_GENERATION = BY_NAME["job_generation"].type
TYPE_EPISODE_OPENED = BY_NAME["episode_opened"].type
TYPE_EPISODE_UPDATED = BY_NAME["episode_updated"].type
TYPE_EPISODE_CLOSED = BY_NAME["episode_closed"].type
TYPE_CULPRIT_ROTATES = BY_NAME["culprit_rotates"].type
TYPE_LEVEL_LEARNED = BY_NAME["level_learned"].type
TYPE_REFERENCE_CAPTURED = BY_NAME["reference_captured"].type
