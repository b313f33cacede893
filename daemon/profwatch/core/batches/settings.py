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

    observer: Literal["auto", "inotify", "polling"] = "auto"
    """auto: inotify on local file systems, polling on ``network_fs_types`` (from /proc/self/mountinfo)."""
    network_fs_types: tuple[str, ...] = DEFAULT_NETWORK_FS_TYPES
    poll_interval_s: float = Field(2.0, gt=0)
    poll_skip_dirs: tuple[str, ...] = ("PROF_*", "FRAMEWORK", "logs")
    """Directory names (fnmatch) the polling observer does not descend into: raw data, hundreds of files per
    rank, that no completion rule looks inside except ``PROF_*/*/sqlite`` (a marker-less fallback, which the
    reconciliation scan re-checks anyway) (docs/field-cases.md#fc-16)."""
    reconcile_interval_s: float = Field(30.0, gt=0)
    """Periodic full re-check of every watched prof_dir, whatever the events said (docs/field-cases.md#fc-16, #fc-17)."""
    reconcile_slice_s: float = Field(0.05, gt=0)
    """Longest one slice of a reconcile pass reads rank dirs before it yields to the dirs that events name (an
    event waits at most this long for its read); the pass resumes in the next slice (``core/batches/tracker.py``).
    A slice also ends as soon as the batch can be decided."""
    max_changed_rank_dirs: int = Field(65_536, ge=1)
    """Rank dirs named by events that one prof_dir may have waiting to be read; beyond that the waiting names are
    dropped for one full look (memory stays bounded whatever a tree holds)."""
    supervise_interval_s: float = Field(0.5, gt=0)
    """How often the supervisor checks that observer threads are alive and pending prof_dirs exist."""
    quiet_period_s: float = Field(60.0, ge=0)
    """Older torch_npu without ``analyse.done``: outputs unchanged this long count as parsed (docs/rank-dirs.md#completion)."""
    parse_allowance_s: float = Field(600.0, ge=0)
    deadline_factor: float = Field(3.0, gt=0)
    default_capture_window_s: float = Field(600.0, ge=0)
    group_gap_s: float = Field(120.0, gt=0)
    """Hand-armed captures without a capture id: rank dirs further apart than this are different batches."""
    split_min_gap_s: float = Field(2.0, ge=0)
    """A time cluster holding one rank twice is split at its largest gap if that gap is at least this long."""
    scan_max_depth: int = Field(5, ge=1, le=16)
    """Directory levels walked below a scan root (msprof-analyze walks 5, docs/msprof-analyze.md#discovery)."""
    retention_max_bytes: int | None = Field(None, ge=0)
    retention_max_age_s: float | None = Field(None, ge=0)
