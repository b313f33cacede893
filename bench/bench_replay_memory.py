"""Benchmark of ``profwatch replay``'s memory against the number of records (prints a table; no assertions).

Writes generated telemetry files (``daemon/profwatch/simulate/telemetry.py``, streamed to disk line by line) of
``--ranks`` ranks and each of ``--steps`` step counts, replays each with ``profwatch replay FILE --json`` in its own
child process and prints the child's peak resident memory (``getrusage(RUSAGE_CHILDREN).ru_maxrss`` of a fresh
child each time), the records, the bytes per record above an empty replay's peak, and the wall time. A replay that
held every record would grow by about 1.7 KB per record (the measured cost before it streamed); one that streams
stays flat as the step count grows. The file is read twice (``replay_source``); a pipe is held whole instead.

Usage: ``python bench/bench_replay_memory.py [--ranks 1024] [--steps 50,200,400]``; about 2-4 minutes on 2 cores
at the defaults.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "daemon"))

from profwatch.core.fleet.telemetry import dump_jsonl  # noqa: E402
from profwatch.simulate.telemetry import TelemetryScenario, iter_telemetry  # noqa: E402

CHILD = """
import resource, sys
from profwatch.cli import cli
try:
    cli(["replay", sys.argv[1], "--json"], standalone_mode=False)
finally:
    print("PEAK_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)
"""


def write_file(path: Path, ranks: int, steps: int) -> int:
    """Stream ``ranks x steps`` records into ``path``; returns the record count."""
    sc = TelemetryScenario(job_id="mem", world_size=ranks, steps=steps, with_stages=True, seed=1)
    n = 0
    with path.open("w") as f:
        batch: list[dict] = []
        for rec in iter_telemetry(sc):
            batch.append(rec)
            n += 1
            if len(batch) >= ranks:
                f.write(dump_jsonl(batch, world_size=ranks) + "\n")
                batch = []
        if batch:
            f.write(dump_jsonl(batch, world_size=ranks) + "\n")
    return n


def replay_peak(path: Path) -> tuple[int, float, int]:
    """(peak RSS in KiB of a fresh child replaying ``path``, wall seconds, records it replayed)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "daemon"), str(ROOT)])}
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, env=env,
                         check=False)
    wall = time.perf_counter() - t0
    peak = next((int(line.split()[1]) for line in res.stderr.splitlines() if line.startswith("PEAK_KB")), -1)
    try:
        records = int(json.loads(res.stdout)["records"])
    except (ValueError, KeyError):
        records = -1
        print(res.stderr[-2000:], file=sys.stderr)
    return peak, wall, records


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--steps", default="50,200,400")
    args = ap.parse_args()
    steps = [int(s) for s in args.steps.split(",")]
    print(f"load average {os.getloadavg()[0]:.1f}; {args.ranks} ranks")
    with tempfile.TemporaryDirectory() as td:
        empty = Path(td) / "empty.jsonl"
        write_file(empty, 2, 1)
        base, _, _ = replay_peak(empty)
        print(f"{'steps':>6} {'records':>9} {'file MB':>8} {'peak MiB':>9} {'B/record above base':>20} {'wall s':>7}")
        print(f"{'(base)':>6} {'2':>9} {'0.0':>8} {base / 1024:9.1f} {'-':>20} {'-':>7}")
        for s in steps:
            path = Path(td) / f"t{s}.jsonl"
            n = write_file(path, args.ranks, s)
            peak, wall, records = replay_peak(path)
            per = (peak - base) * 1024 / max(1, n)
            print(f"{s:>6} {records:>9} {path.stat().st_size / 1e6:8.1f} {peak / 1024:9.1f} {per:20.0f} {wall:7.1f}")
            path.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
