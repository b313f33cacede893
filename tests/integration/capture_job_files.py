"""Readers of the files that ``capture_rank_worker.py`` rank processes write (shared by the capture tests)."""

from __future__ import annotations

import json
from pathlib import Path


def read_events(out: Path, rank: int) -> list[dict]:
    """The CaptureEvents one rank emitted, in order; [] before the file exists. A line the rank is still writing
    (not yet valid JSON) is left out: wait predicates built on this never raise."""
    try:
        lines = (out / f"events_{rank}.jsonl").read_text().splitlines()
    except OSError:
        return []
    events = []
    for line in lines:
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    return events


def read_progress(out: Path, world: int) -> list[int]:
    """Each rank's last completed step (0 before the first)."""
    vals = []
    for r in range(world):
        try:
            vals.append(int((out / f"progress_{r}").read_text() or 0))
        except (OSError, ValueError):
            vals.append(0)
    return vals
