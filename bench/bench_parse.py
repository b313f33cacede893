"""Parse cost of one node batch per report (CPU microseconds), the coordinator's ingest path beside the alternatives
it was measured against (issue 26).

Sides, on the same batch bytes (what a node daemon relays: ``wire.encode`` of each step report, compact JSON):

- ``parse_node_message``: what the coordinator runs (``core/messages.py``: a plain batch by the plain msgspec path,
  rules checked as it decodes; a rich one by the msgspec step path + value checks);
- ``typed pass``: the pydantic-core pass alone (decode, strict types, ``StepReport`` built), no value checks;
- ``json.loads``: the stdlib decode alone, no types, no checks, no objects (the bench_ingest bare loop's work);
- ``hand path``: ``json.loads`` + an allow-list of keys and strict type checks in Python + ``StepReport(**d)`` +
  the same value checks: the hand-checked fast path this issue suggested, measured to see whether it pays.

Shapes: ``plain`` (no stages, flags, work, mode or role) and ``rich`` (two stages, mode, role, work); batches of
16 and 256 reports. Sides run in alternating blocks (order reversed each round); CPU time (``process_time``) per
report, median and best over the rounds. Nothing is asserted.

Usage: python bench/bench_parse.py [--rounds 9] [--reports 40000]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "daemon"))

from profwatch.core import messages as M  # noqa: E402
from rankhook import wire  # noqa: E402

_STEP_KEYS = frozenset(f for f in wire.StepReport.__dataclass_fields__)
_REQUIRED = ("job_id", "rank", "step", "step_time_s", "ts_unix_s")


def batch(n: int, rich: bool) -> bytes:
    """A node batch of ``n`` step reports, bytes as the node daemon writes them."""
    rng = random.Random(1)
    now = time.time()
    payloads = [wire.encode(wire.StepReport(
        job_id="bench", rank=r, step=5, step_time_s=0.1 * (1 + 0.05 * rng.gauss(0, 1)), ts_unix_s=now,
        stages={"forward": 0.01, "backward": 0.02} if rich else None, mode="serving" if rich else None,
        role="pp1" if rich else None, work=512.0 if rich else None)) for r in range(n)]
    head = json.dumps({"kind": "node_batch", "v": 1, "node_id": "benchnode0", "hostname": "bench0", "seq": 3,
                       "ts_unix_s": now}, separators=(",", ":"))
    return head[:-1].encode() + b',"messages":[' + b",".join(payloads) + b"]}"


def _hand_step(d: Any) -> wire.StepReport | None:
    """The hand-checked step: None where the general path must decide (a key or type it does not expect)."""
    if type(d) is not dict or not d.keys() <= _STEP_KEYS or d.get("kind") != "step":
        return None
    for k in _REQUIRED:
        if k not in d:
            return None
    job_id, rank, step, t, ts = d["job_id"], d["rank"], d["step"], d["step_time_s"], d["ts_unix_s"]
    if type(job_id) is not str or type(rank) is not int or type(step) is not int:
        return None
    if type(t) not in (float, int) or type(ts) not in (float, int):
        return None
    stages, flags, work = d.get("stages"), d.get("flags", ()), d.get("work")
    mode, role, capturing, v = d.get("mode"), d.get("role"), d.get("capturing", False), d.get("v", 1)
    if stages is not None and (type(stages) is not dict or any(type(x) not in (float, int) for x in stages.values())):
        return None
    if type(flags) not in (list, tuple) or any(type(f) is not str for f in flags):
        return None
    if (work is not None and type(work) not in (float, int)) or type(capturing) is not bool or type(v) is not int:
        return None
    if (mode is not None and type(mode) is not str) or (role is not None and type(role) is not str):
        return None
    return wire.StepReport(job_id=job_id, rank=rank, step=step, step_time_s=float(t), ts_unix_s=float(ts),
                           stages={k: float(x) for k, x in stages.items()} if stages else stages, flags=tuple(flags),
                           capturing=capturing, work=None if work is None else float(work), mode=mode, role=role, v=v)


def hand_path(data: bytes) -> list[Any]:
    """json.loads + hand-checked steps + the value checks (declines to None on anything else)."""
    if b"\\u" in data:  # an escape may hide a lone surrogate: the strict decoder decides
        return []
    doc = json.loads(data)
    out = []
    for d in doc["messages"]:
        m = _hand_step(d)
        if m is None:
            return []
        out.append(M.check_rank_message(m))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--reports", type=int, default=40_000, help="reports parsed per side per round")
    a = ap.parse_args()
    sides: list[tuple[str, Callable[[bytes], Any]]] = [
        ("parse_node_message", M.parse_node_message),
        ("typed pass", lambda b: M._typed_batch_adapter.validate_json(b, strict=True)),
        ("json.loads", json.loads),
        ("hand path", hand_path),
    ]
    print(f"{'shape':>6} {'batch':>5}  " + "  ".join(f"{n:>22}" for n, _ in sides) + "   (us CPU/report: median best)")
    for rich in (False, True):
        for n in (16, 256):
            data = batch(n, rich)
            assert len(hand_path(data)) == n == len(M.parse_node_message(data)[1])
            reps = max(1, a.reports // n)
            times: dict[str, list[float]] = {name: [] for name, _ in sides}
            for r in range(a.rounds):
                for name, fn in (sides if r % 2 == 0 else sides[::-1]):
                    t0 = time.process_time()
                    for _ in range(reps):
                        fn(data)
                    times[name].append((time.process_time() - t0) / (reps * n) * 1e6)
            cells = [f"{statistics.median(times[nm]):>10.2f} {min(times[nm]):>11.2f}" for nm, _ in sides]
            print(f"{'rich' if rich else 'plain':>6} {n:>5}  " + "  ".join(cells))
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
