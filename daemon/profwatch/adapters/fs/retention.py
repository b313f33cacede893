"""Retention of analysed capture batches: removes the oldest by age or by a byte cap (I/O adapter).

Only batches the caller names as analysed are ever removed; everything else is left untouched, whatever its
age or size. The choice itself is the pure :func:`plan_retention`; :func:`enforce_retention` measures and
deletes. Deletion never follows a symlink: each rank dir is removed through its parent opened without following
links from an allowed root (``profwatch.adapters.fs.paths.remove_tree``), the staging folder from the staging root, so a
folder swapped for a link after the scan is refused, not followed.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Literal

import structlog

from profwatch.adapters.fs.paths import PathRefused, remove_tree
from profwatch.adapters.fs.staging import staging_dir_for
from profwatch.core.batches.completeness import BatchState

log = structlog.get_logger(__name__)
RemovalReason = Literal["age", "bytes"]


@dataclass(frozen=True, slots=True)
class RetentionEntry:
    """One batch on disk: its rank dir ``paths``, total ``size_bytes`` and ``newest_mtime_s`` (unix s)."""

    batch_id: str
    paths: tuple[str, ...]
    size_bytes: int
    newest_mtime_s: float


@dataclass(frozen=True, slots=True)
class RemovedBatch:
    """What :func:`enforce_retention` removed (``errors``: paths that could not be fully removed)."""

    batch_id: str
    paths: tuple[str, ...]
    size_bytes: int
    reason: RemovalReason
    errors: tuple[str, ...] = ()


def plan_retention(entries: Sequence[RetentionEntry], *, analysed: Collection[str], max_bytes: int | None,
                   max_age_s: float | None, now_unix_s: float) -> list[tuple[RetentionEntry, RemovalReason]]:
    """Choose analysed batches to remove (pure).

    Notes:
        1. Age: an analysed batch whose newest file is older than ``max_age_s`` goes.
        2. Bytes: while the analysed batches left total more than ``max_bytes``, the oldest goes.
        Batches not in ``analysed`` are never chosen and do not count towards the cap.
    """
    keep = sorted((e for e in entries if e.batch_id in analysed), key=lambda e: (e.newest_mtime_s, e.batch_id))
    out: list[tuple[RetentionEntry, RemovalReason]] = []
    if max_age_s is not None:
        old = [e for e in keep if now_unix_s - e.newest_mtime_s > max_age_s]
        out += [(e, "age") for e in old]
        keep = [e for e in keep if e not in old]
    if max_bytes is not None:
        total = sum(e.size_bytes for e in keep)
        while keep and total > max_bytes:
            e = keep.pop(0)
            total -= e.size_bytes
            out.append((e, "bytes"))
    return out


def measure_batch(batch: BatchState) -> RetentionEntry:
    """Size (st_size of every file, links not followed) and newest mtime of a batch's rank dirs."""
    paths = tuple(sorted({s.path for s in batch.ranks.values()} | {s.path for s in batch.unassigned}))
    size, newest = 0, 0.0
    for p in paths:
        for root, dirs, files in os.walk(p, followlinks=False):
            for name in files + dirs:
                try:
                    st = os.lstat(os.path.join(root, name))
                except OSError:
                    continue
                size += st.st_size if name in files else 0
                newest = max(newest, st.st_mtime)
    return RetentionEntry(batch.batch_id, paths, size, newest)


def enforce_retention(batches: Sequence[BatchState], *, analysed: Collection[str], max_bytes: int | None,
                      max_age_s: float | None, now_unix_s: float,
                      staging_root: str | os.PathLike[str] | None = None,
                      allowed_roots: Sequence[str | os.PathLike[str]] | None = None) -> list[RemovedBatch]:
    """Remove analysed batches past ``max_age_s`` or beyond ``max_bytes`` (see :func:`plan_retention`).

    Deletes each chosen batch's rank dirs (re-checked inside ``allowed_roots``; None: inside their own parent
    folder, the prof_dir the caller scanned) and, with ``staging_root``, its staging folder (links only).
    Returns what was removed; never raises for a file that vanished, could not be deleted or was refused (a
    symlink on the way, outside the roots): those are in ``errors``.
    """
    entries = [measure_batch(b) for b in batches if b.batch_id in analysed]
    by_id = {b.batch_id: b for b in batches}
    removed: list[RemovedBatch] = []
    for entry, reason in plan_retention(entries, analysed=analysed, max_bytes=max_bytes, max_age_s=max_age_s,
                                        now_unix_s=now_unix_s):
        errors: list[str] = []
        targets = [(p, list(allowed_roots) if allowed_roots is not None else [os.path.dirname(os.path.abspath(p))])
                   for p in entry.paths]
        if staging_root is not None:
            targets.append((str(staging_dir_for(by_id[entry.batch_id], staging_root)), [staging_root]))
        for path, roots in targets:
            try:
                remove_tree(path, roots)
            except FileNotFoundError:
                pass
            except (OSError, PathRefused) as exc:
                errors.append(f"{path}: {exc}")
        log.info("retention_removed", batch_id=entry.batch_id, reason=reason, size_bytes=entry.size_bytes)
        removed.append(RemovedBatch(entry.batch_id, entry.paths, entry.size_bytes, reason, tuple(errors)))
    return removed

