"""Path trust checks and no-follow file system operations (I/O): paths that arrive in messages (a job's
``prof_root``, its capture folders, the rank dirs in them) are used only inside the daemon's allowed roots.

The rule: an allowed root is the operator's (it may itself be, or sit below, a symlink: it is compared both as
given and resolved). *Below* the root, no path component may be a symlink, at the check and at every later use:

* :func:`check_inside` at the hello and before every scan: lexically inside a root, no symlink below it. So the
  path a job announced is its own resolved path, and what is used later is exactly what was checked.
* :func:`open_dir` for every later operation: walks from the root one component at a time with
  ``O_DIRECTORY | O_NOFOLLOW`` relative to the previous directory's descriptor (``os.open(name, dir_fd=...)``,
  the ``openat(2)`` semantics), so a component swapped for a symlink after the check is refused (``ELOOP`` /
  ``ENOTDIR``) instead of followed. :func:`make_dirs` creates missing components the same way (``mkdirat``);
  :func:`remove_tree` opens the parent so and removes the tree through descriptors (``unlinkat``/``rmdir`` relative
  to each opened folder, folders opened with ``O_NOFOLLOW``), the way CPython's fd-based ``shutil.rmtree`` does:
  a symlinked top is refused and no link below it is followed (a link is removed, not its target).

Sources: ``openat(2)``/``mkdirat(2)``/``unlinkat(2)`` and ``O_NOFOLLOW``/``O_DIRECTORY``/``O_PATH`` in ``open(2)``
(Linux man-pages); Python's ``os`` "paths relative to directory descriptors" and ``shutil.rmtree`` docs.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Sequence
from pathlib import Path

_PATH_ONLY = getattr(os, "O_PATH", os.O_RDONLY)
"""Linux ``O_PATH``: a descriptor that names a directory for ``*at`` calls without needing read permission on it
(a search-only ``0711`` folder on shared storage still works); plain read-only elsewhere."""
_DIR_FLAGS = _PATH_ONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


class PathRefused(ValueError):
    """A path lies outside the daemon's allowed roots, passes through a symlink below its root, or no roots are
    configured."""


def _split(path: str | os.PathLike[str], roots: Sequence[str | os.PathLike[str]]) -> tuple[str, list[str]]:
    """``(root, components below it)`` for an absolute ``path`` lexically inside one of ``roots`` (the longest
    match; each root compared as given and resolved). Raises :class:`PathRefused`."""
    p = str(path)
    if not roots:
        raise PathRefused(f"{p!r} refused: no allowed roots configured for it")
    if not os.path.isabs(p):
        raise PathRefused(f"{p!r} refused: relative paths are ambiguous across ranks")
    d = os.path.abspath(p)
    best: str | None = None
    for r in roots:
        for cand in {os.path.abspath(str(r)), os.path.realpath(str(r))}:
            if (d == cand or d.startswith(cand.rstrip("/") + "/")) and (best is None or len(cand) > len(best)):
                best = cand
    if best is None:
        real = os.path.realpath(p)
        raise PathRefused(f"{p!r} (resolves to {real!r}) is outside the allowed roots {[str(r) for r in roots]}")
    return best, [c for c in d[len(best):].split("/") if c]


def check_inside(path: str | os.PathLike[str], roots: Sequence[str | os.PathLike[str]]) -> Path:
    """Return ``path`` (absolute) if it lies inside one of ``roots`` and no existing component below that root is a
    symlink (components that do not exist yet are fine: nothing can be linked there yet).

    Raises:
        PathRefused: empty roots, a relative path, a path outside every root, or a symlink below the root (the
            message names it and says to announce the real path).
    """
    root, parts = _split(path, roots)
    cur = root
    for part in parts:
        cur = os.path.join(cur, part)
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            break
        except OSError as exc:
            raise PathRefused(f"{str(path)!r}: cannot check {cur!r}: {exc}") from None
        if stat.S_ISLNK(st.st_mode):
            raise PathRefused(f"{str(path)!r}: {cur!r} is a symlink below the allowed root {root!r} (it could lead "
                              "anywhere); announce the real path")
        if not stat.S_ISDIR(st.st_mode) and cur != os.path.join(root, *parts):
            raise PathRefused(f"{str(path)!r}: {cur!r} is not a directory")
    return Path(os.path.join(root, *parts))


def open_dir(path: str | os.PathLike[str], roots: Sequence[str | os.PathLike[str]], *, create: bool = False,
             mode: int = 0o750) -> int:
    """Open the directory ``path`` (inside one of ``roots``) without following any symlink below its root; with
    ``create``, make each missing component (``mode``, less the umask), the root itself too when it is missing
    (it is the operator's path, so it is made as ``os.makedirs`` would). Returns a descriptor the caller closes.

    Raises:
        PathRefused: outside the roots, or a component below the root is (now) a symlink or not a directory.
        FileNotFoundError: a component is missing (without ``create``); other ``OSError`` as the system says.
    """
    root, parts = _split(path, roots)
    root_flags = _PATH_ONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(root, root_flags)
    except FileNotFoundError:
        if not create:
            raise
        os.makedirs(root, mode, exist_ok=True)  # the operator's root (trusted, links allowed): made as configured
        fd = os.open(root, root_flags)
    cur = root
    try:
        for part in parts:
            cur = os.path.join(cur, part)
            try:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(part, mode, dir_fd=fd)
                except FileExistsError:
                    pass  # made meanwhile (or swapped in: the open below refuses a link)
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise PathRefused(f"{str(path)!r}: {cur!r} is a symlink or not a directory below the allowed root "
                              f"{root!r}; refusing to follow it") from None
        raise
    return fd


def make_dirs(path: str | os.PathLike[str], roots: Sequence[str | os.PathLike[str]], mode: int = 0o750) -> None:
    """``mkdir -p`` inside the roots, never through a symlink (:func:`open_dir` with ``create``)."""
    os.close(open_dir(path, roots, create=True, mode=mode))


def remove_tree(path: str | os.PathLike[str], roots: Sequence[str | os.PathLike[str]]) -> None:
    """Delete the directory tree ``path`` (inside the roots, not a root itself): its parent is opened without
    following links, then ``shutil.rmtree(name, dir_fd=parent)``. A missing tree is not an error.

    Raises:
        PathRefused: outside the roots, a root itself, a symlink on the way, or ``path`` itself is a symlink.
        OSError: the tree could not be removed completely.
    """
    p = os.path.abspath(str(path))
    _root, parts = _split(p, roots)
    if not parts:
        raise PathRefused(f"{p!r} is an allowed root itself; refusing to delete it")
    try:
        parent = open_dir(os.path.dirname(p), roots)
    except FileNotFoundError:
        return
    try:
        name = os.path.basename(p)
        try:
            st = os.lstat(name, dir_fd=parent)
        except FileNotFoundError:
            return
        if stat.S_ISLNK(st.st_mode):
            raise PathRefused(f"{p!r} is a symlink; refusing to delete through it")
        if stat.S_ISDIR(st.st_mode):
            _rmtree_at(parent, name, p)
        else:
            os.unlink(name, dir_fd=parent)
    finally:
        os.close(parent)


def _rmtree_at(parent: int, name: str, shown: str) -> None:
    """Remove the folder ``name`` of the open folder ``parent`` and all it holds, through descriptors only."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), dir_fd=parent)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise PathRefused(f"{shown!r} became a symlink; refusing to delete through it") from None
        raise
    try:
        with os.scandir(fd) as it:
            entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
        for child, is_dir in entries:
            if is_dir:
                _rmtree_at(fd, child, os.path.join(shown, child))
            else:
                os.unlink(child, dir_fd=fd)  # files and links (a link is removed, never followed)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent)
