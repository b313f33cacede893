"""Resident memory of a tool's whole process session, read from ``/proc``, and the optional systemd scope that
caps it in the kernel (I/O: ``/proc``, ``systemd-run``).

Why a watchdog on the whole group (docs/msprof-analyze.md#memory): msprof-analyze forks one worker per CPU, so
a limit on the first process misses most of the memory; ``RLIMIT_AS`` counts address space, which numpy and
the tool's process pools reserve far beyond what they touch, so it kills healthy runs; and CI containers run
no systemd. The runner therefore starts each tool in a session of its own (``start_new_session``) and sums the
resident set of every process of that session, polling ``/proc/<pid>/stat`` (proc(5): field 6 ``session``,
field 24 ``rss`` in pages). Shared copy-on-write pages are counted once per process, so the sum is an upper
bound: the cap errs on the side of the host. Where systemd runs (``/run/systemd/system`` exists) and
``systemd-run --scope`` works, a transient scope with ``MemoryMax`` adds a kernel-enforced backstop a little
above the watchdog's cap (systemd.resource-control(5)).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from dataclasses import dataclass

__all__ = ["PAGE_BYTES", "ScopeSupport", "host_memory_bytes", "probe_systemd_scope", "scope_prefix",
           "session_members", "session_rss_bytes"]

PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_PROBE_LOCK = threading.Lock()
_PROBED: dict[str, ScopeSupport] = {}


def _stat_fields(proc_root: str, pid: str) -> list[bytes] | None:
    """Fields 3.. of ``/proc/<pid>/stat`` (after the parenthesised command name, which may hold spaces)."""
    try:
        with open(f"{proc_root}/{pid}/stat", "rb") as fh:
            data = fh.read(4096)  # one line of a few hundred bytes (proc(5)); bounded whatever proc_root holds
    except OSError:  # the process ended between listing and reading
        return None
    end = data.rfind(b")")
    rest = data[end + 2:].split() if end >= 0 else []
    return rest if len(rest) >= 22 else None


def session_members(session_id: int, *, proc_root: str = "/proc") -> dict[int, int]:
    """pid -> resident bytes of every live process whose session is ``session_id`` (zombies count 0).

    Raises nothing: unreadable or vanished entries are skipped; a missing ``proc_root`` gives ``{}``."""
    out: dict[int, int] = {}
    try:
        names = os.listdir(proc_root)
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        fields = _stat_fields(proc_root, name)
        if fields is None:
            continue
        try:
            if int(fields[3]) != session_id:  # field 6: session
                continue
            out[int(name)] = int(fields[21]) * PAGE_BYTES  # field 24: rss (pages)
        except ValueError:
            continue
    return out


def session_rss_bytes(session_id: int, *, proc_root: str = "/proc") -> int:
    """Sum of the resident set of every process in session ``session_id``, bytes (0 when none is left)."""
    return sum(session_members(session_id, proc_root=proc_root).values())


def host_memory_bytes(*, meminfo: str = "/proc/meminfo") -> int | None:
    """The host's physical memory (``MemTotal``), bytes; None when it cannot be read."""
    try:
        with open(meminfo, encoding="ascii", errors="replace") as fh:
            for line in fh.read(1 << 16).splitlines():  # bounded: /proc/meminfo is ~1.5 KB
                if line.startswith("MemTotal:"):
                    parts = line.split()
                    return int(parts[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


@dataclass(frozen=True, slots=True)
class ScopeSupport:
    """Whether ``systemd-run --scope`` can cap a command here: ``argv`` is its prefix (without the limit), or
    ``why`` says why not."""

    argv: tuple[str, ...] = ()
    why: str = ""

    @property
    def available(self) -> bool:
        return bool(self.argv)


def probe_systemd_scope(*, run_dir: str = "/run/systemd/system", timeout_s: float = 5.0) -> ScopeSupport:
    """Check once per process whether a transient scope with ``MemoryMax`` can be started (system manager as
    root, the user's manager otherwise), by running ``true`` in one. Cached; never raises."""
    with _PROBE_LOCK:
        hit = _PROBED.get(run_dir)
        if hit is not None:
            return hit
        support = _probe(run_dir, timeout_s)
        _PROBED[run_dir] = support
        return support


def _probe(run_dir: str, timeout_s: float) -> ScopeSupport:
    if not os.path.isdir(run_dir):
        return ScopeSupport(why=f"systemd is not running here ({run_dir} missing)")
    exe = shutil.which("systemd-run")
    if exe is None:
        return ScopeSupport(why="systemd-run not found on PATH")
    argv = (exe, "--scope", "--quiet", "--collect") if os.geteuid() == 0 else (exe, "--user", "--scope", "--quiet",
                                                                                   "--collect")
    try:
        done = subprocess.run([*argv, "-p", "MemoryMax=64M", "true"], stdin=subprocess.DEVNULL,
                              capture_output=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return ScopeSupport(why=f"systemd-run --scope failed: {exc}")
    if done.returncode != 0:
        err = done.stderr.decode("utf-8", "replace").strip().splitlines()
        return ScopeSupport(why=f"systemd-run --scope failed: {err[-1] if err else done.returncode}")
    return ScopeSupport(argv=argv)


def scope_prefix(support: ScopeSupport, limit_bytes: int) -> list[str]:
    """The argv prefix that runs a command in a transient scope capped at ``limit_bytes`` (no swap), or ``[]``."""
    if not support.available:
        return []
    return [*support.argv, "-p", f"MemoryMax={int(limit_bytes)}", "-p", "MemorySwapMax=0", "--"]
