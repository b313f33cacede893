"""A real 2-rank gloo job in lockstep (torch on CPU): every step report reaches a real ZeroMQ socket with the
process CPU time (``cpu_us``), the coordinator's parser reads it as ``cpu_s``, and it tells the rank that does
3x the work apart although both ranks' wall step times are the same (the peer sleeps in the all-reduce)."""

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
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(r), str(short_tmp / "pg"), endpoint, "--steps", "40"],
                              env=env) for r in range(2)]
    try:
        wait_for(lambda: len(steps()) >= 80, timeout_s=120.0, what="80 step reports")
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
    cpu = {r: statistics.median(m.cpu_s for m in v if m.cpu_s is not None) for r, v in by_rank.items()}
    wall = {r: statistics.median(m.step_time_s for m in v) for r, v in by_rank.items()}
    assert sum(m.cpu_s is not None for m in by_rank[0]) >= 25  # steps of >= 1 ms carry it
    assert 0.75 <= wall[1] / wall[0] <= 1.33  # lockstep: the same wall time
    assert cpu[1] / cpu[0] >= 1.8, (cpu, wall)  # 3x the work: the CPU time tells the busier rank
