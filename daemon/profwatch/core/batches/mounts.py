"""Which file system holds a path, from ``/proc/self/mountinfo`` text (pure: text in, answers out).

Used to choose inotify (local file systems) or polling (network file systems, where inotify misses other
nodes' writes: docs/field-cases.md#fc-15). Format: proc(5), "/proc/[pid]/mountinfo".
"""

from __future__ import annotations

import fnmatch
import re

_OCTAL = re.compile(r"\\([0-7]{3})")


def parse_mountinfo(text: str) -> list[tuple[str, str]]:
    """``(mount_point, fs_type)`` pairs from ``/proc/self/mountinfo`` text (proc(5)); octal escapes decoded."""
    out = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, rest = left.split(), right.split()
        if not sep or len(fields) < 5 or not rest:
            continue
        out.append((_OCTAL.sub(lambda m: chr(int(m[1], 8)), fields[4]), rest[0]))
    return out


def fs_type_of(path: str, mounts: list[tuple[str, str]]) -> str | None:
    """File system type of the mount holding ``path`` (longest mount-point prefix; the last mount wins)."""
    best: tuple[int, str] | None = None
    for mount_point, fstype in mounts:
        mp = mount_point.rstrip("/") or "/"
        inside = path == mp or path.startswith(mp + "/") or mp == "/"
        if inside and (best is None or len(mp) >= best[0]):
            best = (len(mp), fstype)
    return best[1] if best else None


def is_network_fs(fstype: str | None, patterns: tuple[str, ...]) -> bool:
    """True when ``fstype`` matches one of ``patterns`` (fnmatch, e.g. ``fuse.*``)."""
    return fstype is not None and any(fnmatch.fnmatchcase(fstype, p) for p in patterns)
