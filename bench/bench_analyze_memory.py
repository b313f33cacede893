"""Benchmark of ``profwatch analyze``'s own memory over its run (issue 34: <= 1 GiB at 1024 ranks after the first
verdict; prints a table, no assertions).

Per ``--sizes`` rank count it writes a generated batch (``profwatch.simulate.ascend_tree.generate_cluster``, 3 steps,
one rank 1.5x slow; ``--minimal``: minimal trees, no communication matrix), then runs ``profwatch analyze`` on it in
a child process (``--no-advisor --no-html`` unless ``--html``) and polls that process's own resident set
(``/proc/<pid>/status`` ``VmRSS``, not its msprof-analyze children) every 0.1 s, stamping each progress line of its
stderr. Printed: the CLI's RSS when the first verdict is announced, its peak (``VmHWM``) up to then, its peak over
the rest of the run (the follow-up: cluster_time_summary, slow_rank, communication_matrix, the judgement again, the
report rewritten), the seconds of each, and the 1-minute load average. ``--trace`` also prints every progress line
with the RSS at that moment. The batch is deleted afterwards.

Usage: ``python bench/bench_analyze_memory.py [--sizes 512,1024] [--minimal] [--html] [--trace] [--work DIR]``;
run it niced on a shared box, alone.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "daemon"))

from profwatch.simulate.ascend_tree import generate_cluster  # noqa: E402

MiB = 2**20


def _status_kib(pid: int, field: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def run(work: Path, n: int, minimal: bool, html: bool, trace: bool) -> dict[str, float]:
    root = work / f"batch{n}"
    shutil.rmtree(root, ignore_errors=True)
    generate_cluster(root, world_size=n, slow_ranks={n // 3: 1.5}, steps=3, minimal=minimal)
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'daemon'}:{ROOT}")
    cmd = [sys.executable, "-m", "profwatch", "analyze", str(root), "--out", str(work / f"out{n}"), "--no-advisor"]
    cmd += [] if html else ["--no-html"]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    samples: list[tuple[float, int, int]] = []
    stop = threading.Event()

    def poll() -> None:
        while not stop.wait(0.1):
            rss, hwm = _status_kib(proc.pid, "VmRSS"), _status_kib(proc.pid, "VmHWM")
            if rss:
                samples.append((time.monotonic() - t0, rss, hwm))

    th = threading.Thread(target=poll, daemon=True)
    th.start()
    verdict_at = None
    assert proc.stderr is not None
    for line in proc.stderr:
        now = time.monotonic() - t0
        rss = _status_kib(proc.pid, "VmRSS")
        if trace:
            print(f"  {now:7.1f} s {rss / 1024:7.0f} MiB  {line.rstrip()[:140]}", flush=True)
        if verdict_at is None and " verdict " in line:
            verdict_at = now
    proc.wait()
    stop.set()
    th.join()
    total = time.monotonic() - t0
    shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(work / f"out{n}", ignore_errors=True)
    va = verdict_at if verdict_at is not None else total
    before = [s for s in samples if s[0] <= va]
    after = [s for s in samples if s[0] > va]
    return {"verdict_s": va, "total_s": total, "rc": proc.returncode,
            "rss_verdict": (before[-1][1] if before else 0) / 1024,
            "peak_to_verdict": max((s[2] for s in before), default=0) / 1024,
            "peak_after": max((s[1] for s in after), default=0) / 1024,
            "rss_end": (samples[-1][1] if samples else 0) / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--sizes", default="512,1024")
    ap.add_argument("--minimal", action="store_true")
    ap.add_argument("--html", action="store_true")
    ap.add_argument("--trace", action="store_true")
    ap.add_argument("--work", type=Path, default=None)
    a = ap.parse_args()
    work = a.work or Path(tempfile.mkdtemp(prefix="profwatch-bench-analyze-mem-"))
    print(f"{'ranks':>6} {'verdict s':>9} {'MiB at verdict':>14} {'peak MiB to verdict':>19} "
          f"{'peak MiB after':>14} {'MiB at end':>10} {'total s':>8} {'rc':>3} {'load 1m':>8}", flush=True)
    try:
        for n in (int(x) for x in a.sizes.split(",")):
            r = run(work, n, a.minimal, a.html, a.trace)
            print(f"{n:>6} {r['verdict_s']:>9.1f} {r['rss_verdict']:>14.0f} {r['peak_to_verdict']:>19.0f} "
                  f"{r['peak_after']:>14.0f} {r['rss_end']:>10.0f} {r['total_s']:>8.1f} {r['rc']:>3} "
                  f"{os.getloadavg()[0]:>8.2f}", flush=True)
    finally:
        if a.work is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
