"""The hook's own Python per ``rankhook.step()`` (no send): the report's assembly, timed in CPU nanoseconds, for
one or more checkouts side by side (a before/after pair), interleaved.

``Hook.step()`` runs with its publisher's ``send`` replaced by a function that keeps nothing, so what is timed is
the hook's Python: the owner check, the clocks, the report's formatting, the hello due check and the capture
backend's ``after_step`` (the ``none`` backend); ``bench/bench_step.py`` measures the whole call with a real ZeroMQ
send. Each round runs every tree in its own subprocess (``--tree``, the checkout's ``rankhook`` first on the path),
the order reversed every round; each subprocess times ``--calls`` calls in blocks of 10,000 and prints its median
block (``process_time`` per call). Target (issue 34): <= 1 us.

Usage: python bench/bench_step_python.py [--tree DIR ...] [--rounds 5] [--calls 200000] (``--tree A B`` or
``--tree A --tree B``)
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

CHILD = r"""
import statistics, sys, time, tempfile
from rankhook.backends.base import NoneBackend
from rankhook.hook import Hook
from rankhook.identity import resolve_identity
from rankhook.publisher import Publisher
import rankhook.wire as wire
tmp = tempfile.mkdtemp(prefix="pwsp", dir="/tmp")
hook = Hook(resolve_identity("bench-job", rank=3, world_size=8), Publisher(f"ipc://{tmp}/absent.sock"), NoneBackend())
hook.publisher.send = lambda *frames: None
calls = int(sys.argv[1])
for _ in range(20_000):  # warm-up (and the owner thread is taken)
    hook.step()
blocks = []
for _ in range(max(1, calls // 10_000)):
    c0 = time.process_time_ns()
    for _ in range(10_000):
        hook.step()
    blocks.append((time.process_time_ns() - c0) / 10_000)
print(statistics.median(blocks), min(blocks), wire.SCHEMA_VERSION)
hook.close()
"""


def run(tree: Path, calls: int) -> tuple[float, float, int]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), str(tree / "daemon")]))
    out = subprocess.run([sys.executable, "-c", CHILD, str(calls)], env=env, capture_output=True, text=True,
                         check=True, timeout=600, cwd="/tmp")
    med, best, v = out.stdout.split()
    return float(med), float(best), int(v)


def main() -> None:
    ap = argparse.ArgumentParser()
    # --tree A B and --tree A --tree B name the same trees (before, a repeated --tree kept only the last one)
    ap.add_argument("--tree", type=Path, nargs="+", action="extend", default=None)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=200_000)
    a = ap.parse_args()
    a.tree = a.tree or [REPO]
    res: dict[Path, list[tuple[float, float, int]]] = {t: [] for t in a.tree}
    for i in range(a.rounds):
        for t in (a.tree if i % 2 == 0 else list(reversed(a.tree))):
            res[t].append(run(t.resolve(), a.calls))
    print(f"rankhook.step() own Python (no send), ns of CPU per call; {a.rounds} rounds x {a.calls} calls, "
          f"load1 {os.getloadavg()[0]:.1f}")
    for t, rows in res.items():
        meds = sorted(r[0] for r in rows)
        print(f"  {str(t):<30} wire v{rows[0][2]}: median {statistics.median(meds):,.0f} ns "
              f"(rounds {meds[0]:,.0f}-{meds[-1]:,.0f}; best block {min(r[1] for r in rows):,.0f})")


if __name__ == "__main__":
    main()
