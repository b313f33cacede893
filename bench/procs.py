"""Ending what a benchmark started, by its handle (never by name): shared by the bench scripts."""

from __future__ import annotations

import multiprocessing as mp
import subprocess


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
