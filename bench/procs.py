"""Ending what a benchmark started, by its handle (never by name): shared by the bench scripts."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any


def stop_popen(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """SIGTERM ``proc``, wait up to ``grace_s`` seconds, then SIGKILL it and reap it."""
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(grace_s)


def stop_process(p: mp.Process | None, grace_s: float = 10.0) -> None:
    """Terminate a still-running multiprocessing child (None: nothing), then kill it after ``grace_s`` seconds."""
    if p is not None and p.is_alive():
        p.terminate()
        p.join(grace_s)
        if p.is_alive():
            p.kill()
            p.join(grace_s)


def hog(parent: int) -> None:
    """One CPU's worth of load (a busy loop, the target of a ``multiprocessing.Process``) until terminated, or until
    the process ``parent`` that started it is gone (its parent pid changes): a bench killed before its cleanup
    leaves no busy loop behind."""
    n = 0
    while True:
        n += 1
        if n % 5_000_000 == 0 and os.getppid() != parent:
            return


def exit_on_sigterm() -> None:
    """Make SIGTERM raise ``SystemExit`` so a bench's ``finally`` blocks end what it started (by handle)."""
    def _raise(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _raise)


class TelemetryLog:
    """The step records of one job, merged from the coordinator's ``dump_telemetry`` windows (the window holds the
    last ``window_steps`` steps: call :meth:`poll` more often than that many steps pass), written as the JSON lines
    ``profwatch replay`` reads, for replaying a live run's telemetry. One record per (rank, step), the newest read: a
    job that restarts its step counter within one log keeps only its last pass over a step."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self.rows: dict[tuple[int, int], tuple[float, str]] = {}

    def poll(self, control: Callable[[str, dict[str, Any]], Any]) -> None:
        """Merge the job's current window (``control``: the stack's control call); a job not known yet is skipped."""
        try:
            text = control("dump_telemetry", {"job_id": self.job_id})
        except Exception:  # noqa: BLE001 - not registered yet, or the coordinator is busy: the next poll catches up
            return
        for line in str(text).splitlines():
            d = json.loads(line)
            if "rank" in d and "step" in d:  # one record per (rank, step): a window's timestamps are rebuilt and
                self.rows[(int(d["rank"]), int(d["step"]))] = (float(d.get("ts_unix_s") or 0.0), line)  # move by 1 µs

    def write(self, path: Path) -> int:
        """Write the merged records ordered by time, then step and rank; returns how many."""
        path.parent.mkdir(parents=True, exist_ok=True)
        keys = sorted(self.rows, key=lambda k: (self.rows[k][0], k[1], k[0]))
        path.write_text("".join(self.rows[k][1] + "\n" for k in keys))
        return len(keys)
