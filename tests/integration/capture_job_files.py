"""Readers of the files that ``capture_rank_worker.py`` rank processes write (shared by the capture tests)."""

from __future__ import annotations

import json
from pathlib import Path


def read_events(out: Path, rank: int) -> list[dict]:
    """The CaptureEvents one rank emitted, in order."""
    p = out / f"events_{rank}.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


def read_progress(out: Path, world: int) -> list[int]:
    """Each rank's last completed step (0 before the first)."""
    vals = []
    for r in range(world):
        try:
            vals.append(int((out / f"progress_{r}").read_text() or 0))
        except (OSError, ValueError):
            vals.append(0)
    return vals
