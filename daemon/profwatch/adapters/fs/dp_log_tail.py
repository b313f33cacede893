"""Tails torch_npu's dynamic-profile rank logs into per-rank capture acknowledgements (I/O adapter).

Source: ``docs/torch_npu-dynamic-profile.md#dp-logs`` and ``#writer-rules`` item 9; ``docs/field-cases.md#fc-08`` (an arm counts only when
every expected rank acknowledges it) and ``#fc-09``; the lines checked against torch-npu 2.13.0 in
``docs/conformance.md``.

Files: ``<profiler_config_path>/log/dp_{hostname}_{pid}_rank_{rank}.log`` (+ the rotated ``.1``; the monitor's
``monitor_dp_*`` logs are not rank logs). Lines (format ``time [LEVEL] [pid] _dynamic_profiler_utils.py: msg``):

* ``Start step will be set to N.`` -> ``arm_seen`` (``start_step`` N); N == 0 -> ``arm_rejected`` (torn read,
  invalid JSON or invalid start_step: torch_npu will never fire it);
* ``Rank r not in valid rank_list ...`` -> ``arm_rejected`` (not selected);
* ``Start Dynamic Profiler at N step.`` -> ``started`` (``step`` N, and ``start_step`` N: torch_npu starts an
  absolute arm exactly there, so the coordinator can match it to the capture);
* ``Stop Dynamic Profiler at N step.`` -> ``completed`` (``step`` N; the window closed; whether the data is
  complete is decided by the prof_dir watcher).

Offsets are remembered per file identity (device, inode), so a rotation (rename to ``.1`` + new file) continues
in the old inode under its new name and starts the new file at 0; a file shorter than its offset was truncated
and is read again from 0. Only whole lines are consumed.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from rankhook.backends.dp_state import DpState, scan_dp_state
from rankhook.wire import CaptureEvent

_NAME = re.compile(r"^dp_(?P<host>.+)_(?P<pid>\d+)_rank_(?P<rank>-?\d+)\.log(?P<rot>\.1)?$")
_TS = re.compile(r"^(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}),(\d{3})")
_ARM = re.compile(r"Start step will be set to (-?\d+)\.?")
_START = re.compile(r"Start Dynamic Profiler at (\d+) step")
_STOP = re.compile(r"Stop Dynamic Profiler at (\d+) step")
_NOT_LISTED = re.compile(r"Rank (-?\d+) not in valid rank_list")
MAX_READ_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class DpLogFile:
    """Identity of one rank log from its file name: ``hostname``, ``pid``, ``rank`` (-1 when RANK was unset)."""

    hostname: str
    pid: int
    rank: int


def parse_log_name(name: str) -> DpLogFile | None:
    """Parse ``dp_{hostname}_{pid}_rank_{rank}.log[.1]``; None for other names (``monitor_dp_*`` included)."""
    m = _NAME.match(name)
    if not m:
        return None
    return DpLogFile(m["host"], int(m["pid"]), int(m["rank"]))


def parse_line(line: str, job_id: str, rank: int, fallback_ts: float) -> CaptureEvent | None:
    """Return the :class:`CaptureEvent` one dp log line acknowledges, or None (pure)."""
    ts = fallback_ts
    m = _TS.match(line)
    if m:
        try:
            ts = datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S").timestamp() + int(m[2]) / 1000
        except ValueError:
            pass
    if (m := _ARM.search(line)) is not None:
        n = int(m[1])
        if n == 0:
            return CaptureEvent(job_id=job_id, rank=rank, event="arm_rejected", ts_unix_s=ts, start_step=0,
                                source="dp_log", detail="start_step 0: invalid or torn config, never fires")
        return CaptureEvent(job_id=job_id, rank=rank, event="arm_seen", ts_unix_s=ts, start_step=n, source="dp_log")
    if (m := _START.search(line)) is not None:  # torch_npu starts at cur_step == start_step (or at once for -1)
        n = int(m[1])
        return CaptureEvent(job_id=job_id, rank=rank, event="started", ts_unix_s=ts, step=n, start_step=n,
                            source="dp_log")
    if (m := _STOP.search(line)) is not None:
        return CaptureEvent(job_id=job_id, rank=rank, event="completed", ts_unix_s=ts, step=int(m[1]),
                            source="dp_log", detail="window stopped")
    if _NOT_LISTED.search(line):
        return CaptureEvent(job_id=job_id, rank=rank, event="arm_rejected", ts_unix_s=ts, source="dp_log",
                            detail="rank not in rank_list")
    return None


class DpLogTail:
    """Incremental reader of one config dir's ``log/dp_*.log`` files.

    Args:
        profiler_config_path: the config folder (logs are in its ``log/``).
        job_id: stamped into the events.
        from_start: read existing content on the first poll (True) or start at the current ends.
        clock: wall clock for lines without a parsable time.
    Not thread-safe; call :meth:`poll` from one thread.
    """

    def __init__(
        self, profiler_config_path: str, *, job_id: str, from_start: bool = True,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.log_dir = os.path.join(os.path.abspath(profiler_config_path), "log")
        self.job_id = job_id
        self._clock = clock
        self._offsets: dict[tuple[int, int], int] = {}
        self._skipping: set[tuple[int, int]] = set()  # files inside a line over MAX_READ_BYTES, skipped to its end
        self.overlong_lines = 0
        """Lines over ``MAX_READ_BYTES`` skipped (before, one stalled the file's tail for good)."""
        self._skip_existing = not from_start
        self.files: dict[int, DpLogFile] = {}

    def poll(self) -> list[CaptureEvent]:
        """Read new complete lines of every rank log; return their events in file order (rotated file first).

        Never raises for vanished files or a missing log dir (returns what it could read).
        """
        try:
            names = os.listdir(self.log_dir)
        except OSError:
            return []
        entries: list[tuple[str, int, DpLogFile]] = []
        for n in names:
            ident = parse_log_name(n)
            if ident is not None:
                entries.append((n.removesuffix(".1"), 0 if n.endswith(".1") else 1, ident))
        entries.sort()
        out: list[CaptureEvent] = []
        seen: set[tuple[int, int]] = set()
        for base, rot_order, ident in entries:
            name = base if rot_order else base + ".1"
            self.files[ident.rank] = ident
            out.extend(self._read(os.path.join(self.log_dir, name), ident, seen))
        self._offsets = {k: v for k, v in self._offsets.items() if k in seen}
        self._skipping &= seen
        self._skip_existing = False
        return out

    def _read(self, path: str, ident: DpLogFile, seen: set[tuple[int, int]]) -> list[CaptureEvent]:
        try:
            with open(path, "rb") as f:
                st = os.fstat(f.fileno())
                key = (st.st_dev, st.st_ino)
                seen.add(key)
                off = self._offsets.get(key)
                if off is None:
                    off = st.st_size if self._skip_existing else 0
                if st.st_size < off:
                    off = 0  # truncated
                    self._skipping.discard(key)
                f.seek(off)
                data = f.read(MAX_READ_BYTES)
        except OSError:
            return []
        start = 0
        if key in self._skipping:  # the rest of an overlong line: dropped up to its newline
            nl = data.find(b"\n")
            if nl < 0:
                self._offsets[key] = off + len(data)
                return []
            self._skipping.discard(key)
            start = nl + 1
        end = data.rfind(b"\n")
        if end < start:  # no whole line yet
            if len(data) >= MAX_READ_BYTES:  # one line fills the read: skip it, never re-read it for ever
                self._skipping.add(key)
                self.overlong_lines += 1
                self._offsets[key] = off + len(data)
            else:
                self._offsets[key] = off + start
            return []
        self._offsets[key] = off + end + 1
        now = self._clock()
        events = []
        for raw in data[start : end + 1].splitlines():
            ev = parse_line(raw.decode("utf-8", "replace"), self.job_id, ident.rank, now)
            if ev is not None:
                events.append(ev)
        return events


def find_stale_dp_state(shm_dir: str = "/dev/shm", proc_dir: str = "/proc", now_unix_s: float | None = None) -> DpState:
    """Report leftover ``/dev/shm/DynamicProfileNpuShm*`` blocks and ``DynMonitorProc`` processes (orphans have
    parent pid 1) on this node (FC-09). Report only: never deletes or kills. See
    :func:`rankhook.backends.dp_state.scan_dp_state`."""
    return scan_dp_state(shm_dir, proc_dir, now_unix_s)
