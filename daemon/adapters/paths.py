"""Path trust checks (I/O: resolves symlinks): paths that arrive in messages are used only inside allowed roots."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path


class PathRefused(ValueError):
    """A path from a message lies outside the daemon's allowed roots (or no roots are configured)."""


def check_inside(path: str | os.PathLike[str], roots: Sequence[str | os.PathLike[str]]) -> Path:
    """Return the resolved ``path`` if it lies inside one of ``roots`` after resolving every symlink.

    A link that points out of the roots is refused (both sides are resolved with ``os.path.realpath``).
    Relative paths are refused: they mean different folders on different ranks.

    Raises:
        PathRefused: empty roots, relative path, or a resolved path outside every root.
    """
    p = str(path)
    if not roots:
        raise PathRefused(f"{p!r} refused: no allowed roots configured for it")
    if not os.path.isabs(p):
        raise PathRefused(f"{p!r} refused: relative paths are ambiguous across ranks")
    real = Path(os.path.realpath(p))
    for root in roots:
        r = Path(os.path.realpath(str(root)))
        if real == r or r in real.parents:
            return real
    raise PathRefused(f"{p!r} (resolves to {str(real)!r}) is outside the allowed roots {[str(r) for r in roots]}")
