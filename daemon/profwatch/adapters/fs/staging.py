"""Stages one batch for msprof-analyze: a folder with exactly one real directory per rank, of links (I/O adapter).

Why (docs/msprof-analyze.md#discovery and #before-running, gotchas 5-6): msprof-analyze analyses whatever
ranks it finds and picks the newest dir for a duplicated rank, so it must see exactly one batch; its DB
discovery does not follow symlinked *rank directories* but does accept a symlinked ``ASCEND_PROFILER_OUTPUT``.
So each rank gets a real directory named like the original, holding absolute symlinks to the original's
top-level files and to its ``ASCEND_PROFILER_OUTPUT`` (torch_pt: to its files). Data is never copied and the
originals are never written, moved or deleted.

``tool_safe_dirs`` does the same for one command's input rank dirs whose path msprof-analyze cannot take (a
name that is not ASCII, a byte that is not UTF-8): ``compare`` is given links under our own work folder.
Where the staging root itself is such a path (``analyze --out`` an odd folder), the batch is staged under a
fresh folder of the system's temporary folder instead (:func:`tool_safe_root`, :func:`fresh_staging_root`) and
removed after the analysis (:func:`release_staging`); a rank dir whose *name* is odd is staged under a
tool-safe name (:func:`staged_name`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import get_args

from profwatch.core.batches.completeness import BatchState
from profwatch.core.batches.prof_layout import OUTPUT_MARKER, PROFILER_OUTPUT_DIR, RankDirKind

_SAFE = re.compile(r"[^A-Za-z0-9._-]+")
_RANK_DIR_SUFFIXES = tuple("_" + kind for kind in get_args(RankDirKind))  # "_ascend_pt", "_torch_pt"


class StagingError(RuntimeError):
    """The batch cannot be staged (invalid batch, a rank dir missing, or a foreign entry in the way)."""


def mark_output_dir(path: str | os.PathLike[str], *, mark: bool = True) -> Path:
    """Create ``path`` (and parents) and write :data:`~profwatch.core.batches.prof_layout.OUTPUT_MARKER` into it, so scans of
    a tree holding it skip it. Idempotent; returns the marker's path. With ``mark=False`` (the folder also holds
    capture data, e.g. ``analyze --out`` = the capture dir) only checks that a file can be created there.

    Raises:
        OSError: ``path`` cannot be created or written (permission denied, a file in the way, read-only mount).
    """
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    marker = folder / OUTPUT_MARKER
    if not mark:
        fd, probe = tempfile.mkstemp(prefix=".profwatch-write-check-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    elif not marker.is_file():
        marker.write_text("profwatch output folder (staged links, tool outputs, reports): not capture data; "
                          "profwatch scan/analyze skip this folder.\n", encoding="utf-8")
    return marker


def staging_dir_for(batch: BatchState, staging_root: str | os.PathLike[str]) -> Path:
    """``staging_root/<batch_id made file-name safe>``."""
    return Path(staging_root) / (_SAFE.sub("_", batch.batch_id).strip("._") or "batch")


def _wanted_links(rank_dir: Path, kind: str) -> dict[str, str]:
    """name -> absolute target: top-level files plus ASCEND_PROFILER_OUTPUT (other dirs such as PROF_* raw data,
    FRAMEWORK and logs are not needed by the recipes and are left out)."""
    links: dict[str, str] = {}
    real = Path(os.path.realpath(rank_dir))  # resolve symlinked mounts (docs/field-cases.md#fc-04)
    for entry in os.scandir(real):
        if entry.is_file(follow_symlinks=True) or (entry.name == PROFILER_OUTPUT_DIR and kind == "ascend_pt"):
            links[entry.name] = str(real / entry.name)
    return links


def stage_batch(batch: BatchState, staging_root: str | os.PathLike[str]) -> Path:
    """Create (or bring up to date) the staging folder of ``batch``; return its path. Idempotent.

    Layout: ``<staging_root>/<batch_id>/<staged_name(rank dir)>/{profiler_info_N.json, profiler_metadata.json,
    ASCEND_PROFILER_OUTPUT -> original, ...}``. On a repeat call, links pointing elsewhere are replaced, extra
    links and rank dirs of ranks no longer in the batch are removed (only symlinks and our own empty dirs are
    ever removed).

    Raises:
        StagingError: the batch is ``invalid``, has no rank dirs, or a rank dir vanished; or a non-link entry
            inside the staging folder is in the way.
    """
    if batch.status == "invalid":
        raise StagingError(f"batch {batch.batch_id} is invalid: {[p.reason for p in batch.problems]}")
    if not batch.ranks:
        raise StagingError(f"batch {batch.batch_id} has no rank dirs")
    mark_output_dir(staging_root)  # a later scan of a tree holding the staging root must not see its rank dirs
    target = staging_dir_for(batch, staging_root)
    target.mkdir(parents=True, exist_ok=True)
    wanted: dict[str, dict[str, str]] = {}
    for rank, state in sorted(batch.ranks.items()):
        name = staged_name(state.path)
        if name in wanted:
            raise StagingError(f"two ranks share the dir name {name}")
        try:
            wanted[name] = _wanted_links(Path(state.path), state.kind)
        except OSError as exc:
            raise StagingError(f"rank {rank}: cannot list {state.path}: {exc}") from exc
    for entry in os.scandir(target):
        if entry.name not in wanted:
            _remove_stage_entry(Path(entry.path))
    for name, links in wanted.items():
        rank_stage = target / name
        if rank_stage.is_symlink() or (rank_stage.exists() and not rank_stage.is_dir()):
            rank_stage.unlink()
        rank_stage.mkdir(exist_ok=True)
        for entry in os.scandir(rank_stage):
            want = links.get(entry.name)
            if not entry.is_symlink():
                raise StagingError(f"{entry.path} is not a link; refusing to touch it")
            if want is None or os.readlink(entry.path) != want:
                os.unlink(entry.path)
        for link_name, dest in links.items():
            link = rank_stage / link_name
            if not link.is_symlink():
                os.symlink(dest, link)
    return target


def _remove_stage_entry(path: Path) -> None:
    """Remove a staged rank dir: its symlinks, then the dir itself; never follows a link."""
    if path.is_symlink() or path.is_file():
        path.unlink()
        return
    for entry in os.scandir(path):
        if not entry.is_symlink():
            raise StagingError(f"{entry.path} is not a link; refusing to remove it")
        os.unlink(entry.path)
    path.rmdir()


TOOL_PATH_RE = re.compile(r"(\.|:|\\|/|_|-|\s|[~0-9a-zA-Z\u4e00-\u9fa5\u3010\u3011])+")
"""The characters msprof-analyze accepts in an input path (26.2.0 ``prof_common/path_manager.py``,
``input_path_common_check``; it warns on others, and ``compare`` on a path with a byte that is not UTF-8 (a
surrogate escape here) fails to encode it and writes a workbook without sheets)."""


def tool_safe(path: str | os.PathLike[str]) -> bool:
    """True when msprof-analyze takes ``path`` (made absolute) as it is (:data:`TOOL_PATH_RE`)."""
    return TOOL_PATH_RE.fullmatch(os.path.abspath(os.fspath(path))) is not None


def staged_name(rank_dir: str | os.PathLike[str]) -> str:
    """The name of ``rank_dir``'s folder in a staging: its own name when msprof-analyze takes it
    (:data:`TOOL_PATH_RE`), else that name with every run of other characters (non-ASCII, a byte that is not
    UTF-8) made ``_`` and ``_h`` + the first 8 hex digits of the SHA-256 of the original name (UTF-8, surrogate
    escapes kept) inserted before the ``_ascend_pt`` / ``_torch_pt`` suffix the tool looks for (ASCII, kept at
    the end). The hash keeps two odd names that sanitise alike (``nodé_4000_..``, ``nodè_4000_..``) apart, so a
    batch holding both still stages (one staged dir per rank); a name the tool takes never gets one, so it
    cannot meet a hashed name either."""
    name = os.path.basename(os.path.normpath(os.fspath(rank_dir)))
    if TOOL_PATH_RE.fullmatch(name):
        return name
    tag = "_h" + hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()[:8]
    safe = _SAFE.sub("_", name).strip("._") or "rank"
    for suffix in _RANK_DIR_SUFFIXES:
        if safe.endswith(suffix) and len(safe) > len(suffix):
            return safe[: -len(suffix)] + tag + suffix
    return safe + tag


def tool_safe_root(root: str | os.PathLike[str]) -> Path:
    """``root`` made absolute when msprof-analyze takes it (:func:`tool_safe`), else the system's temporary
    folder (``tempfile.gettempdir()``): where our own folders for a tool run go. The one rule for
    :func:`tool_safe_dirs`, :func:`fresh_staging_root` and the runner's ``-o`` folders."""
    absolute = Path(os.path.abspath(os.fspath(root)))
    return absolute if tool_safe(absolute) else Path(tempfile.gettempdir())


def fresh_staging_root(wanted: str | os.PathLike[str]) -> tuple[Path, bool]:
    """``(root, temporary)``: ``wanted`` (absolute) when msprof-analyze takes its path, else a fresh folder
    ``profwatch-staging-*`` of the system's temporary folder (``temporary`` True: the caller removes it with
    :func:`release_staging` once the analysis is over).

    Raises:
        OSError: the temporary folder cannot be made.
    """
    absolute = Path(os.path.abspath(os.fspath(wanted)))
    if tool_safe(absolute):
        return absolute, False
    return Path(tempfile.mkdtemp(prefix="profwatch-staging-", dir=tool_safe_root(absolute))), True


def release_staging(root: str | os.PathLike[str]) -> None:
    """Remove a temporary staging root of :func:`fresh_staging_root`: its links, our own folders and our
    output marker, never following a link; anything else found there (not ours) is left, with its folders."""
    path = Path(root)
    with contextlib.suppress(FileNotFoundError):
        (path / OUTPUT_MARKER).unlink()
    if path.is_dir() and not path.is_symlink():
        _remove_links_tree(path)


@contextlib.contextmanager
def tool_safe_dirs(dirs: Sequence[str | os.PathLike[str]], work_root: str | os.PathLike[str]) -> Iterator[list[Path]]:
    """Rank dirs as msprof-analyze can read them: each of ``dirs`` whose path it would not take
    (:func:`tool_safe`: a name that is not ASCII, a byte that is not UTF-8) is replaced, for the ``with`` block,
    by a real directory of absolute symlinks to its top-level entries (files and folders), named like it with
    every other character made ``_``, under a fresh folder of ``work_root`` (or of the system's temporary folder
    when ``work_root`` itself is not safe). Yields the paths to use, in the order of ``dirs`` (a safe dir as it
    is, made absolute). Nothing of the user's is moved, copied or written; on exit only our links and our own
    folders are removed.

    Raises:
        OSError: a dir cannot be listed, or the links cannot be made.
    """
    absolute = [Path(os.path.abspath(os.fspath(d))) for d in dirs]
    if all(tool_safe(d) for d in absolute):
        yield absolute
        return
    base = tool_safe_root(work_root)
    base.mkdir(parents=True, exist_ok=True)
    holder = Path(tempfile.mkdtemp(prefix="tool-input-", dir=base))
    try:
        out: list[Path] = []
        for i, d in enumerate(absolute):
            if tool_safe(d):
                out.append(d)
                continue
            real = Path(os.path.realpath(d))
            stage = holder / str(i) / (_SAFE.sub("_", d.name).strip("._") or "rank")
            stage.mkdir(parents=True)
            for entry in os.scandir(real):
                os.symlink(str(real / entry.name), stage / entry.name)
            out.append(stage)
        yield out
    finally:
        _remove_links_tree(holder)


def _remove_links_tree(path: Path) -> None:
    """Remove a folder of :func:`tool_safe_dirs`: symlinks and our own folders, never following a link; a regular
    file found there (the tool wrote one) is left with its folder."""
    for entry in os.scandir(path):
        if entry.is_symlink():
            os.unlink(entry.path)
        elif entry.is_dir(follow_symlinks=False):
            _remove_links_tree(Path(entry.path))
    with contextlib.suppress(OSError):
        path.rmdir()
