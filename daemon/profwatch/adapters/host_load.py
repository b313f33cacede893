"""Sample the host's CPU load for the node daemon: ``/proc/stat`` ``procs_running`` and ``/proc/pressure/cpu``.

The node daemon calls :meth:`HostLoadSampler.sample` about once a second and :meth:`HostLoadSampler.take` at each
heartbeat (the mean since the last one). What the numbers mean and how the coordinator uses them:
``daemon/profwatch/core/fleet/host_load.py``. A file that is absent or unreadable is reported once in the log and
then reads as "not measured" (``-1``); the daemon keeps running.
"""

from __future__ import annotations

import os
from pathlib import Path

import structlog

from profwatch.core.fleet.host_load import parse_procs_running, parse_psi_some_avg10

log = structlog.get_logger(__name__)

__all__ = ["HostLoadSampler"]


class HostLoadSampler:
    """Running means of runnable tasks per core and PSI ``some avg10`` (%) between two :meth:`take` calls.

    Args:
        proc_root: the proc filesystem (``/proc``; a test points it at a directory of its own).
        cores: online CPUs of the host (default ``os.cpu_count()``, at least 1).
    """

    def __init__(self, proc_root: Path = Path("/proc"), cores: int | None = None) -> None:
        self.proc_root = proc_root
        self.cores = max(1, cores or os.cpu_count() or 1)
        self._runnable_sum = 0.0
        self._runnable_n = 0
        self._psi_sum = 0.0
        self._psi_n = 0
        self.psi_available: bool | None = None
        self.stat_available: bool | None = None

    def _read(self, name: str) -> str | None:
        try:
            return (self.proc_root / name).read_text(errors="replace")
        except OSError:
            return None

    def sample(self) -> None:
        """Read both files once; an absent one is logged the first time and counts as not measured."""
        running = parse_procs_running(self._read("stat") or "")
        if running is None:
            if self.stat_available is not False:
                log.warning("host_load_unavailable", path=str(self.proc_root / "stat"),
                            note="no procs_running: host load is not measured on this node")
            self.stat_available = False
        else:
            self.stat_available = True
            self._runnable_sum += max(0, running - 1) / self.cores  # the sampler itself is running as it reads
            self._runnable_n += 1
        psi = parse_psi_some_avg10(self._read("pressure/cpu") or "")
        if psi is None:
            if self.psi_available is not False:
                log.info("cpu_pressure_unavailable", path=str(self.proc_root / "pressure/cpu"),
                         note="no PSI on this kernel (before 4.20, or psi=0): only the run queue is measured")
            self.psi_available = False
        else:
            self.psi_available = True
            self._psi_sum += psi
            self._psi_n += 1

    @property
    def pending(self) -> int:
        """Samples taken since the last :meth:`take`."""
        return max(self._runnable_n, self._psi_n)

    def take(self) -> tuple[float, float]:
        """``(runnable_per_core, cpu_psi_some_pct)``: the means since the last call, each ``-1.0`` where nothing
        was measured; then start again."""
        r = self._runnable_sum / self._runnable_n if self._runnable_n else -1.0
        p = self._psi_sum / self._psi_n if self._psi_n else -1.0
        self._runnable_sum = self._psi_sum = 0.0
        self._runnable_n = self._psi_n = 0
        return r, p
