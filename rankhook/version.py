"""The installed version of the ``profwatch`` distribution, for ``rankhook`` and ``profwatch`` alike (pure, stdlib).

The version is written once, in ``pyproject.toml`` (``[project] version``). An installed package reads it from
its distribution's metadata (``importlib.metadata``); a source tree used without an install (``PYTHONPATH``, the
rank hook put on a job's path, the test suite) reads it from the ``pyproject.toml`` at the tree's root. Metadata
is trusted only when the distribution holds the very file that was imported, so a tree on ``PYTHONPATH`` does not
report the version of another copy installed in ``site-packages``.
"""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

DISTRIBUTION = "profwatch"
UNKNOWN_VERSION = "0+unknown"
"""What a file outside both an install and a source tree reports (a PEP 440 local version, sorts lowest)."""

_PROJECT_VERSION = re.compile(r'^\[project\][^\[]*?^version\s*=\s*"([^"]+)"', re.MULTILINE | re.DOTALL)


def tree_version(pyproject: Path) -> str | None:
    """The ``[project] version`` of ``pyproject`` if it is profwatch's, else None (missing, unreadable, another
    project). A regular expression, not ``tomllib``: the rank hook runs on Python 3.10 without tomli."""
    try:
        text = pyproject.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    if not re.search(rf'^name\s*=\s*"{DISTRIBUTION}"', text, re.MULTILINE):
        return None
    m = _PROJECT_VERSION.search(text)
    return m.group(1) if m else None


def distribution_version(module_file: str, depth: int) -> str:
    """The version of the ``profwatch`` distribution that ``module_file`` (a package's ``__init__.py``) belongs to.

    ``depth`` is how many folders above ``module_file`` the source tree's root lies (``rankhook/__init__.py``: 1,
    ``daemon/profwatch/__init__.py``: 2). Order: the installed distribution's metadata when it holds ``module_file``; else the
    source tree's ``pyproject.toml``; else the metadata of any installed ``profwatch`` (an editable install whose
    tree lost its ``pyproject.toml``); else ``UNKNOWN_VERSION``. Never raises.
    """
    here = Path(module_file).resolve()
    try:
        dist = metadata.distribution(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        dist = None
    if dist is not None:
        # an installed top-level package sits in the distribution's root (site-packages): package/__init__.py
        if Path(str(dist.locate_file(here.relative_to(here.parents[1])))).resolve() == here:
            return dist.version
    root = here.parents[depth] if depth < len(here.parents) else None
    found = tree_version(root / "pyproject.toml") if root is not None else None
    if found is not None:
        return found
    return dist.version if dist is not None else UNKNOWN_VERSION
