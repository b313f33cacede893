"""The config paths torch_npu's ``dp.init`` refuses, by torch_npu version (pure).

Source: torch_npu's ``PathManager.check_input_directory_path`` (``torch_npu/utils/_path_manager.py``), which
``dp.init(path)`` (``torch_npu/profiler/dynamic_profile.py``) calls first; read in the Ascend/pytorch repository at
the release tags of each line (docs/torch_npu-dynamic-profile.md, "Config paths dp.init refuses"). The checks:

- the whole path matches ``(\\.|/|_|-|\\s|[~0-9a-zA-Z]|[\\u4e00-\\u9fa5])+`` (letters, digits, ``_ - . / ~``,
  whitespace, CJK unified ideographs U+4E00..U+9FA5);
- at most 4096 characters, each ``/``-separated name at most 255;
- the path itself is not a symbolic link;
- the path is not a regular file (raises in every version).

Up to a version of each line the first three *raise* and ``dp.init`` logs "The path '...' is invalid, and profiler
will not be enabled" and returns: dynamic_profile is off for that process. From then on they only *warn*
(``warnings.warn``) and the profiler starts. The first warning versions (from the release tags): 2.7.1.post7,
2.9.0.post5, 2.10.0.post3, 2.11.0.post1, 2.12.0.post1, and every version from 2.13.0; 2.1.0, 2.3.1, 2.4.0, 2.5.1,
2.6.0 and 2.8.0 raise in every release. 2.11.0 and 2.12.0 were tagged once raising and once warning: they are taken
as raising (refusing a path a build would accept costs less than an arm that silently never starts). An
unparsable version is taken as raising too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Severity = Literal["raise", "warn"]

_ALLOWED = re.compile(r"(\.|/|_|-|\s|[~0-9a-zA-Z]|[\u4e00-\u9fa5])+")
MAX_PATH_CHARS = 4096
MAX_NAME_CHARS = 255
FIRST_WARNING_POST = {(2, 7, 1): 7, (2, 9, 0): 5, (2, 10, 0): 3, (2, 11, 0): 1, (2, 12, 0): 1}
"""Per release line: the first ``.postN`` whose path checks only warn."""
ALL_WARN_FROM = (2, 13, 0)
_VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)(?:\.post(\d+))?")


@dataclass(frozen=True, slots=True)
class PathVerdict:
    """What torch_npu ``version`` does with a config path: ``problems`` (one sentence each), ``severity`` (``raise``:
    dynamic_profile stays off in that process; ``warn``: it only warns)."""

    version: str
    severity: Severity
    problems: tuple[str, ...]

    def detail(self) -> str:
        """One line: the problems, the version's reaction and the fix."""
        effect = ("raises in dp.init: dynamic_profile stays off in those processes" if self.severity == "raise"
                  else "only warns there: captures still work")
        return (f"torch_npu {self.version} {effect}: " + "; ".join(self.problems)
                + ". Use a config folder of letters, digits, '_', '-', '.' and '/' only, not a symbolic link")


def severity_of(version: str) -> Severity:
    """``raise`` or ``warn``: how torch_npu ``version`` (``2.9.0.post5``, ``2.6.0+cpu``) treats a bad path."""
    m = _VERSION.match(version.strip())
    if m is None:
        return "raise"
    base = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
    post = int(m.group(4)) if m.group(4) is not None else 0
    if base >= ALL_WARN_FROM:
        return "warn"
    first = FIRST_WARNING_POST.get(base)
    return "warn" if first is not None and post >= first else "raise"


def path_problems(path: str, is_symlink: bool = False) -> tuple[str, ...]:
    """The checks above, lexical, plus ``is_symlink`` (known only where the path can be seen)."""
    out = []
    if not _ALLOWED.fullmatch(path):
        bad = sorted({c for c in path if not _ALLOWED.fullmatch(c)})
        out.append(f"the path has characters torch_npu does not accept: {' '.join(repr(c) for c in bad[:10])}")
    if len(path) > MAX_PATH_CHARS:
        out.append(f"the path is {len(path)} characters long (more than {MAX_PATH_CHARS})")
    if any(len(name) > MAX_NAME_CHARS for name in path.split("/")):
        out.append(f"a name in the path is longer than {MAX_NAME_CHARS} characters")
    if is_symlink:
        out.append("the path is a symbolic link")
    return tuple(out)


def check_config_path(path: str, version: str, is_symlink: bool = False) -> PathVerdict | None:
    """The verdict of torch_npu ``version`` on config folder ``path``; None when it accepts it."""
    problems = path_problems(path, is_symlink)
    if not problems:
        return None
    return PathVerdict(version=version, severity=severity_of(version), problems=problems)
