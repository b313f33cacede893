"""Find torch_npu dynamic-profile leftovers on this node: stale shm blocks and orphan monitors (stdlib; reads only).

Source: docs/torch_npu-dynamic-profile.md#shared-memory and docs/field-cases.md#fc-09: ``/dev/shm/DynamicProfileNpuShm<YYYYMMDDHH>`` outlives a killed job and an orphaned
monitor (``/proc/<pid>/comm`` == ``DynMonitorProc``, parent pid 1) keeps feeding it. Report only; never deletes.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

SHM_PREFIX = "DynamicProfileNpuShm"
MONITOR_COMM = "DynMonitorProc"


@dataclass(frozen=True, slots=True)
class ShmBlock:
    """One ``DynamicProfileNpuShm*`` file: ``path``, ``mtime_unix_s``, ``age_s`` (now - mtime)."""

    path: str
    mtime_unix_s: float
    age_s: float


@dataclass(frozen=True, slots=True)
class MonitorProc:
    """One ``DynMonitorProc`` process; ``orphan`` when its parent pid is 1."""

    pid: int
    ppid: int
    orphan: bool
    cmdline: str = ""


@dataclass(frozen=True, slots=True)
class DpState:
    """What :func:`scan_dp_state` found; ``stale`` is True when there is anything to warn about."""

    shm_blocks: tuple[ShmBlock, ...] = ()
    monitors: tuple[MonitorProc, ...] = field(default=())

    @property
    def orphans(self) -> tuple[MonitorProc, ...]:
        return tuple(m for m in self.monitors if m.orphan)

    @property
    def stale(self) -> bool:
        return bool(self.shm_blocks or self.orphans)

    def describe(self) -> str:
        """A one-line human summary (empty when nothing was found)."""
        parts = [f"shm {b.path} (age {b.age_s:.0f}s)" for b in self.shm_blocks]
        parts += [f"orphan DynMonitorProc pid {m.pid}" for m in self.orphans]
        return "; ".join(parts)


def scan_dp_state(shm_dir: str = "/dev/shm", proc_dir: str = "/proc", now_unix_s: float | None = None) -> DpState:
    """Scan ``shm_dir`` for ``DynamicProfileNpuShm*`` and ``proc_dir`` for ``DynMonitorProc`` processes.

    Never raises: unreadable directories and processes vanishing mid-scan are skipped.
    """
    now = time.time() if now_unix_s is None else now_unix_s
    blocks: list[ShmBlock] = []
    try:
        names = sorted(os.listdir(shm_dir))
    except OSError:
        names = []
    for n in names:
        if n.startswith(SHM_PREFIX):
            p = os.path.join(shm_dir, n)
            try:
                m = os.stat(p).st_mtime
            except OSError:
                continue
            blocks.append(ShmBlock(p, m, max(0.0, now - m)))
    mons: list[MonitorProc] = []
    try:
        pids = [d for d in os.listdir(proc_dir) if d.isdigit()]
    except OSError:
        pids = []
    for d in pids:
        try:
            with open(os.path.join(proc_dir, d, "comm"), encoding="utf-8", errors="replace") as f:
                comm = f.read().strip()
            if comm != MONITOR_COMM:
                continue
            with open(os.path.join(proc_dir, d, "stat"), encoding="utf-8", errors="replace") as f:
                stat = f.read()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            try:
                with open(os.path.join(proc_dir, d, "cmdline"), "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                cmd = ""
        except (OSError, ValueError, IndexError):
            continue
        mons.append(MonitorProc(int(d), ppid, ppid == 1, cmd))
    return DpState(tuple(blocks), tuple(mons))
