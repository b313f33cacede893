"""bench/bench_new_shapes.py runs end to end and draws the shapes it says (the hooks it passes to
bench/bench_corpus.py's generators). Detection quality is the bench's to measure, not this test's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import python_env

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import bench.bench_new_shapes as ns  # noqa: E402


def test_the_new_shapes_bench_scores_healthy_and_injected_runs_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "runs.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_new_shapes.py"), "--runs", "2", "--shapes",
         "grad_accum,long_steps", "--reference", "1", "--json", str(out)],
        env=python_env(), capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(out.read_text())
    shaped = [r for r in rows if r["class"] != "steady"]
    assert len(shaped) == 8 and sorted({r["class"] for r in shaped}) == ["grad_accum", "long_steps"]
    assert sorted(r["injected"] for r in shaped) == [False] * 4 + [True] * 4
    assert all(not r["changes"] for r in shaped if not r["injected"])
    assert all(len(r["changes"]) == 1 for r in shaped if r["injected"])
    assert "grad_accum" in proc.stdout and "long_steps" in proc.stdout


def test_the_held_out_seeds_are_refused() -> None:
    for seed in ("41", "42"):
        proc = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_new_shapes.py"), "--seed", seed],
                              env=python_env(), capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert proc.returncode != 0 and "held out" in proc.stderr


def _medians(run: ns.bc.Run) -> tuple[float, float]:
    """Median job step time of the first and the second generation (the requeue's first step: the largest gap)."""
    ts = np.asarray([t for t, _ in run.levels])
    st = np.asarray([s for _, s in run.levels])
    cut = int(np.argmax(np.diff(ts) - st[1:])) + 1
    return float(np.median(st[:cut])), float(np.median(st[cut:]))


def test_a_requeue_lands_on_a_node_set_of_the_drawn_speed() -> None:
    seen = set()
    for i in range(8):
        run = ns.make_run("requeue_speed", 31, i, False)
        rng = np.random.default_rng([31, 100 + ns.SHAPES.index("requeue_speed"), i])
        sh, _ = ns._shape("requeue_speed", rng)
        before, after = _medians(run)
        assert after / before == pytest.approx(sh.restart_level, rel=0.05)
        seen.add(sh.restart_level > 1.0)
    assert seen == {True, False}, "both slower and faster node sets are drawn in 8 runs"


def test_diurnal_traffic_thins_the_steps_at_its_trough() -> None:
    run = ns.make_run("serving_diurnal", 31, 0, False)
    share = ns._diurnal(np.random.default_rng([31, 100 + ns.SHAPES.index("serving_diurnal"), 0, 99]))
    span = run.end_t - run.start_t
    busy = [t for t, _ in run.levels if share((t - run.start_t) / span) > 0.8]
    quiet = [t for t, _ in run.levels if share((t - run.start_t) / span) < 0.3]
    grid = np.linspace(0.0, 1.0, 2001)
    frac_busy = float(np.mean([share(x) > 0.8 for x in grid]))
    frac_quiet = float(np.mean([share(x) < 0.3 for x in grid]))
    assert len(busy) / frac_busy > 3 * len(quiet) / frac_quiet  # steps per unit of time: peak vs trough
