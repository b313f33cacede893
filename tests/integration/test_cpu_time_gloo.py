"""A real 2-rank gloo job in lockstep (torch on CPU): the step reports reach a real ZeroMQ socket with the hook's
CPU samples (``cpu_at_step``, ``cpu_total_us``), the coordinator's parser reads them (``cpu_total_s``), and the CPU
time per step between samples tells the rank that does 3x the work apart although both ranks' wall step times are
the same (the peer sleeps in the all-reduce)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from profwatch.core.messages import parse_rank_message
from tests.conftest import wait_for

pytest.importorskip("torch")
WORKER = Path(__file__).with_name("cpu_gloo_worker.py")
REPO = Path(__file__).resolve().parents[2]


def test_cpu_time_arrives_from_a_real_gloo_pair_and_tells_the_busier_rank(short_tmp: Path, step_pull: Any) -> None:
    endpoint, steps = step_pull
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "daemon")]), OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(r), str(short_tmp / "pg"), endpoint, "--steps", "80",
                              "--sample-s", "0.02"],
                              env=env) for r in range(2)]
    try:
        wait_for(lambda: len(steps()) >= 160, timeout_s=120.0, what="160 step reports")
        for p in procs:
            assert p.wait(timeout=60) == 0
        reports = steps()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    msgs = [parse_rank_message(json.dumps(m)) for m in reports]
    by_rank = {r: [m for m in msgs if m.rank == r and m.step > 5] for r in (0, 1)}
    assert all(len(v) >= 30 for v in by_rank.values())
    samples = {r: sorted({(m.cpu_at_step, m.cpu_total_s) for m in v if m.cpu_at_step is not None})
               for r, v in by_rank.items()}
    assert all(len(v) >= 3 for v in samples.values()), samples
    # CPU seconds per step between consecutive samples, the median interval (as the coordinator's comparison is
    # robust to a few: an interval of a loaded box's spinning wait)
    cpu = {r: statistics.median((c1 - c0) / (s1 - s0) for (s0, c0), (s1, c1) in zip(v, v[1:], strict=False))
           for r, v in samples.items()}
    wall = {r: statistics.median(m.step_time_s for m in v) for r, v in by_rank.items()}
    assert all(m.cpu_s is None for v in by_rank.values() for m in v)  # no per-step CPU time any more
    assert 0.75 <= wall[1] / wall[0] <= 1.33  # lockstep: the same wall time
    assert cpu[1] / cpu[0] >= 1.8, (cpu, wall)  # 3x the work: the CPU time tells the busier rank
