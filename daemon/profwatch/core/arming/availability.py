"""Whether a job's ranks can be captured at all, and why not in words a user can act on (pure).

A rank that asked for a capture backend (``torch_npu`` or ``torch``, zero-code path included) and could not open it
runs telemetry-only: its hello says ``backend = "none"`` with ``backend_error`` (``rankhook/__init__.py``). Where the
cause makes any capture impossible (the config folder does not exist, the backend cannot be imported, msMonitor's
dyno mode) the job cannot be captured: it raises one ``capture_unavailable`` alert with the cause and the fix, and
an arm (the dry run included) is refused with the same words. Two cases stay armable, with a warning: a rank
whose torch_npu runs its own dynamic_profile (``PROF_CONFIG_PATH``: torch_npu itself polls the folder profwatch
writes), and a rank with ``backend = "none"`` and no error (``PROFWATCH_BACKEND=none``: another tool may drive it).

The causes are the errors rankhook's backends raise at ``open`` (``rankhook/backends/torch_npu_backend.py``,
``torch_backend.py``): a missing config folder, a second dynamic-profile mode (``PROF_CONFIG_PATH``, msMonitor's
``MSMONITOR_USE_DAEMON``), torch_npu or torch not importable.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Unavailable:
    """Why ranks of a job cannot be captured. ``ranks``/``hosts``: the ranks without a capture backend and where they
    run; ``cause``/``fix``: one sentence each; ``error``: what the rank said (``backend_error``; "" when none)."""

    ranks: tuple[int, ...]
    hosts: tuple[str, ...]
    cause: str
    fix: str
    error: str = ""
    fatal: bool = True

    def detail(self) -> str:
        """One line: the ranks, the cause and the fix."""
        ranks = ", ".join(map(str, self.ranks[:16])) + (" ..." if len(self.ranks) > 16 else "")
        return f"rank(s) {ranks} have no capture backend of their own: {self.cause}. Fix: {self.fix}"


def explain(error: str, profiler_config_path: str | None, hostname: str = "") -> tuple[str, str, bool]:
    """``(cause, fix, fatal)`` for one rank's ``backend_error`` (``""``: the rank asked for no capture backend).
    ``fatal``: no capture can reach the rank (refuse arms, alert)."""
    where = f" on {hostname}" if hostname else ""
    folder = profiler_config_path or "(none)"
    if not error:
        return ("the rank runs telemetry-only (PROFWATCH_BACKEND=none, or no profiler_config_path)",
                "set PROFWATCH_PROFILER_CONFIG_PATH (or rankhook.init(profiler_config_path=...)) to a folder the job "
                "can write and leave PROFWATCH_BACKEND unset, then restart the job", False)
    if "is not a directory" in error or "FileNotFoundError" in error:
        return (f"the capture folder {folder} does not exist{where}",
                f"create it (mkdir -p {folder}) readable and writable by the job's user on every node, or point "
                "PROFWATCH_PROFILER_CONFIG_PATH at an existing folder, then restart the job", True)
    if "PROF_CONFIG_PATH" in error:
        return ("PROF_CONFIG_PATH is set: torch_npu runs its own dynamic_profile (arms reach it only through "
                "its own folder)",
                "make PROF_CONFIG_PATH the folder profwatch writes (PROFWATCH_PROFILER_CONFIG_PATH), or unset it",
                False)
    if "MSMONITOR_USE_DAEMON" in error:
        return ("msMonitor (dyno) mode is selected (MSMONITOR_USE_DAEMON=1)",
                "unset MSMONITOR_USE_DAEMON for the file mode profwatch drives, then restart the job", True)
    if "ModuleNotFoundError" in error or "ImportError" in error or "unavailable" in error:
        return (f"the capture backend cannot be imported{where}: {error[:200]}",
                "install torch_npu (or torch for PROFWATCH_BACKEND=torch) in the job's environment, or choose the "
                "backend that is installed, then restart the job", True)
    return (f"the capture backend failed to open{where}: {error[:200]}",
            "read the rank's stderr line starting with 'rankhook:', fix what it names, then restart the job", True)


def unavailable(ranks: Iterable[tuple[int, str, str, str, str | None]]) -> Unavailable | None:
    """The ranks among ``(rank, hostname, backend, backend_error, profiler_config_path)`` without a capture backend
    of their own (backend ``none``), with the cause of the lowest one whose cause is fatal (else the lowest);
    ``fatal`` when any is. None when every rank has a capture backend."""
    bad = []
    for rank, host, backend, error, path in ranks:
        if backend == "none":
            bad.append((rank, host, error, *explain(error, path, host)))
    if not bad:
        return None
    bad.sort(key=lambda b: (not b[5], b[0]))
    first = bad[0]
    return Unavailable(ranks=tuple(sorted(b[0] for b in bad)), hosts=tuple(sorted({b[1] for b in bad if b[1]})),
                       cause=first[3], fix=first[4], error=first[2], fatal=first[5])
