"""Settings for shared-storage watching, batch completeness, staging and retention (pure, pydantic)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

#: File system types polled instead of inotify: inotify does not see writes made by other nodes (docs/field-cases.md#fc-15).
DEFAULT_NETWORK_FS_TYPES: tuple[str, ...] = (
    "nfs",
    "nfs4",
    "cifs",
    "smb3",
    "smbfs",
    "lustre",
    "gpfs",
    "beegfs",
    "ceph",
    "glusterfs",
    "fuse.*",
)


class WatchSettings(BaseModel):
    """How profwatch watches prof_dirs and decides that a batch is complete.

    Units are in the names. Deadline of a batch (``completeness.compute_deadline``):
    ``start + steps * step_time_s * deadline_factor + parse_allowance_s``; without capture hints,
    ``start + default_capture_window_s + parse_allowance_s``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    observer: Literal["auto", "inotify", "polling"] = Field("auto", description=(
        "auto: inotify on local file systems, polling on ``network_fs_types`` (from /proc/self/mountinfo)."))
    network_fs_types: tuple[str, ...] = Field(DEFAULT_NETWORK_FS_TYPES, description=(
        "file system types (fnmatch, from /proc/self/mountinfo) polled instead of watched with inotify, which does "
        "not see other nodes' writes"))
    poll_interval_s: float = Field(2.0, gt=0, description="period of the polling observer")
    poll_max_rank_dir_listings: int = Field(1024, ge=16, description=(
        "Rank dirs of one polled prof_dir that one poll re-lists by rotation (each at least every "
        "ceil(rank dirs / this) polls); a rank dir whose own or ``ASCEND_PROFILER_OUTPUT/`` mtime changed, or that "
        "its last look saw changing, is re-listed at once on top; the rest are served from their last listing "
        "and counted as deferred (docs/rank-dirs.md#polling-bound)."))
    poll_skip_dirs: tuple[str, ...] = Field(("PROF_*", "FRAMEWORK", "logs"), description=(
        "Directory names (fnmatch) the polling observer does not descend into: raw data, hundreds of files per rank, "
        "that no completion rule looks inside except ``PROF_*/*/sqlite`` (a marker-less fallback, which the "
        "reconciliation scan re-checks anyway) (docs/field-cases.md#fc-16)."))
    reconcile_interval_s: float = Field(30.0, gt=0, description=(
        "Periodic full re-check of every watched prof_dir, whatever the events said (docs/field-cases.md#fc-16, "
        "#fc-17)."))
    reconcile_slice_s: float = Field(0.05, gt=0, description=(
        "Longest one slice of a reconcile pass reads rank dirs before it yields to the dirs that events name (an "
        "event waits at most this long for its read); the pass resumes in the next slice "
        "(``core/batches/tracker.py``). A slice also ends as soon as the batch can be decided."))
    max_changed_rank_dirs: int = Field(65_536, ge=1, description=(
        "Rank dirs named by events that one prof_dir may have waiting to be read; beyond that the waiting names are "
        "dropped for one full look (memory stays bounded whatever a tree holds)."))
    supervise_interval_s: float = Field(0.5, gt=0, description=(
        "How often the supervisor checks that observer threads are alive and pending prof_dirs exist."))
    quiet_period_s: float = Field(60.0, ge=0, description=(
        "Older torch_npu without ``analyse.done``: outputs unchanged this long count as parsed "
        "(docs/rank-dirs.md#completion)."))
    parse_allowance_s: float = Field(600.0, ge=0, description=(
        "time allowed after a capture window for the ranks to write and parse their rank dirs (added to the batch "
        "deadline)"))
    deadline_factor: float = Field(3.0, gt=0, description=(
        "a batch's deadline allows its window's steps at this many times the step time (then parse_allowance_s)"))
    default_capture_window_s: float = Field(600.0, ge=0, description=(
        "window assumed for a batch without capture hints (hand-armed), before parse_allowance_s"))
    group_gap_s: float = Field(120.0, gt=0, description=(
        "Hand-armed captures without a capture id: rank dirs further apart than this are different batches."))
    split_min_gap_s: float = Field(2.0, ge=0, description=(
        "A time cluster holding one rank twice is split at its largest gap if that gap is at least this long."))
    scan_max_depth: int = Field(5, ge=1, le=16, description=(
        "Directory levels walked below a scan root (msprof-analyze walks 5, docs/msprof-analyze.md#discovery)."))
    retention_max_bytes: int | None = Field(None, ge=0, description=(
        "staged and analysed batches beyond this total are deleted oldest first (unset: kept); never before analysis"))
    retention_max_age_s: float | None = Field(None, ge=0, description=(
        "staged and analysed batches older than this are deleted (unset: kept); never before analysis"))
