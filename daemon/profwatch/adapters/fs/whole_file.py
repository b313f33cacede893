"""Write a file whole: a reader sees the old file or the new one, never a torn one (I/O).

One place for the temp-file-and-rename write of reports (``adapters/outputs/report.py``) and of the key files and
systemd drop-ins ``profwatch keys`` writes (``commands/keys.py``).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

PROC_STATUS = "/proc/self/status"
"""Where the process umask is read (:func:`process_umask`)."""


def replace_whole(path: Path, data: bytes, mode: int | None = None) -> None:
    """Write ``data`` as ``path`` whole: into a new temp file beside it, then renamed over it (``os.replace``: a
    reader sees the old file or the new one, never a torn one). The temp file is created by
    ``tempfile.mkstemp`` (a random name, ``O_CREAT | O_EXCL``: never a file or link already there, so a user who
    can write into the folder cannot plant a symlink at a name the writer will open; each writer, e.g. the
    coordinator's analysis threads writing a folder's first reports at once, or two ``profwatch keys`` runs, gets
    its own, where a fixed ``.name.tmp`` let two writers truncate and rename each other's file) and removed when
    the write fails. Its mode is ``mode`` (the permission bits, e.g. ``0o600`` for a secret key: mkstemp creates
    it ``0o600``, so a secret is never readable by others, not even for a moment), else the usual ``0o666`` less
    the umask, as a file ``open`` created; where the file system refuses the change (``EPERM``: vfat, some CIFS
    mounts) it stays ``0o600`` and the file is written all the same. Raises OSError."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            with contextlib.suppress(OSError):  # a file system without modes (vfat, some CIFS): stays 0o600
                os.fchmod(f.fileno(), (0o666 & ~process_umask()) if mode is None else mode)
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def process_umask() -> int:
    """The process umask, read without changing it (:data:`PROC_STATUS` ``Umask:``, Linux 4.7+; setting it to
    read it back would race with other threads creating files); ``0o077`` where it cannot be read (a kernel before
    4.7, e.g. CentOS 7's 3.10, or no ``/proc``): the temp file keeps mkstemp's ``0o600``, never a mode wider than
    the user's umask allows (a guessed ``0o022`` made a report 0644 under a umask of 077)."""
    try:
        with open(PROC_STATUS, encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8) & 0o777
    except (OSError, ValueError, IndexError):
        pass
    return 0o077
