"""A real 2-rank gloo job on CPU using rankhook's torch backend, armed through profiler_config.json."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from profwatch.adapters.fs.config_writer import ConfigWriter
from profwatch.core.capture.planner import CaptureRequest, CaptureSettings, JobProgress, plan_capture
from profwatch.core.capture.profiler_config import idle_config
from tests.conftest import PYTHON, finish_process, python_env, wait_for
from tests.integration.capture_job_files import read_events, read_progress

pytest.importorskip("torch")

WORKER = str(Path(__file__).with_name("capture_rank_worker.py"))
WORLD = 2
STEP_S = 0.05


def _events(out: Path, rank: int) -> list[dict]:
    return read_events(out, rank)


def _progress(out: Path) -> list[int]:
    return read_progress(out, WORLD)


def test_two_rank_gloo_capture(tmp_path: Path) -> None:
    cfg_dir, out, prof_root = tmp_path / "cfg", tmp_path / "out", tmp_path / "prof"
    for d in (cfg_dir, out, prof_root):
        d.mkdir()
    t_job = time.time()
    env = python_env({"PROFWATCH_POLL_INTERVAL_S": "0.2"})
    store = tmp_path / "store"
    procs = [subprocess.Popen([PYTHON, WORKER, "torch", str(cfg_dir), str(out), str(r), str(WORLD), str(STEP_S),
                               "4000", str(store)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for r in range(WORLD)]
    try:
        wait_for(lambda: min(_progress(out)) >= 12, 60, what="both ranks past step 12")
        assert json.loads((cfg_dir / "profiler_config.json").read_text())["start_step"] == 0  # template created
        settings = CaptureSettings(warmup=1, active=2, margin_s=1.0)
        job = JobProgress(job_id="j1", world_size=WORLD, furthest_step=max(_progress(out)), step_time_s=STEP_S,
                          prof_root=str(prof_root), now_unix_s=time.time())
        plan = plan_capture(CaptureRequest(job_id="j1", reason="test"), job, settings)
        ConfigWriter().write(str(cfg_dir), plan.config.render(), not_before_unix_s=t_job,
                             allowed_roots=[str(tmp_path)])
        s, end = plan.start_step, plan.start_step + plan.warmup + plan.active
        wait_for(lambda: all(any(e["event"] == "completed" for e in _events(out, r)) for r in range(WORLD)), 90,
                 what="completed on both ranks")
    finally:
        (out / "stop").touch()
        outputs = [finish_process(p, 60) for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    rank_dirs = sorted(Path(plan.prof_dir).glob("*_torch_pt"))
    assert len(rank_dirs) == WORLD
    ranks = set()
    for rd in rank_dirs:
        info = json.loads(next(rd.glob("profiler_info_*.json")).read_text())
        rank = info["rank_id"]
        ranks.add(rank)
        assert info["world_size"] == WORLD and info["steps"] == list(range(s + plan.warmup, end))
        assert json.loads((rd / "profiler_metadata.json").read_text())["profwatch_capture_id"] == plan.capture_id
        traces = list(rd.glob("*.pt.trace.json"))
        assert len(traces) == 1
        assert (rd / "trace.done").is_file() and (rd / "trace.done").stat().st_size == 0
        assert (rd / "trace.done").stat().st_mtime >= traces[0].stat().st_mtime
        trace = json.loads(traces[0].read_text())
        assert trace["distributedInfo"]["rank"] == rank and trace["distributedInfo"]["world_size"] == WORLD
        names = {e.get("name") for e in trace["traceEvents"]}
        assert {f"ProfilerStep#{k}" for k in range(s + plan.warmup, end)} <= names
        assert not {f"ProfilerStep#{k}" for k in (s - 1, end)} & names
        ev = [e for e in _events(out, rank) if e["capture_id"] == plan.capture_id]
        kinds = [e["event"] for e in ev]
        assert kinds.index("arm_seen") < kinds.index("started") < kinds.index("completed")
        started = next(e for e in ev if e["event"] == "started")
        assert started["step"] == s
        done = next(e for e in ev if e["event"] == "completed")
        assert done["step"] == end and done["steps"] == list(range(s + plan.warmup, end))
    assert ranks == {0, 1}


def test_the_idle_config_of_a_cancel_drops_a_waiting_window(tmp_path: Path) -> None:
    """``profwatch cancel`` writes the idle config (start_step 0) over an arm: the torch backend's single pending
    slot takes it like torch_npu's, so the cancelled window never starts on any rank."""
    cfg_dir, out, prof_root = tmp_path / "cfg", tmp_path / "out", tmp_path / "prof"
    for d in (cfg_dir, out, prof_root):
        d.mkdir()
    t_job = time.time()
    env = python_env({"PROFWATCH_POLL_INTERVAL_S": "0.2"})
    procs = [subprocess.Popen([PYTHON, WORKER, "torch", str(cfg_dir), str(out), str(r), str(WORLD), str(STEP_S),
                               "4000", str(tmp_path / "store")], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(WORLD)]
    roots = [str(tmp_path)]
    try:
        wait_for(lambda: min(_progress(out)) >= 12, 60, what="both ranks past step 12")
        job = JobProgress(job_id="j1", world_size=WORLD, furthest_step=max(_progress(out)), step_time_s=STEP_S,
                          prof_root=str(prof_root), now_unix_s=time.time())
        plan = plan_capture(CaptureRequest(job_id="j1", reason="test", in_steps=400), job,
                            CaptureSettings(warmup=1, active=2, margin_s=1.0))  # 20 s ahead
        writer = ConfigWriter()
        writer.write(str(cfg_dir), plan.config.render(), not_before_unix_s=t_job, allowed_roots=roots)
        wait_for(lambda: all(any(e["event"] == "arm_seen" and e["capture_id"] == plan.capture_id
                                 for e in _events(out, r)) for r in range(WORLD)), 60, what="arm seen on both ranks")
        writer.write(str(cfg_dir), idle_config(f"capture {plan.capture_id} cancelled"), not_before_unix_s=t_job,
                     allowed_roots=roots, idle_for=plan.capture_id)
        wait_for(lambda: all(any(e["event"] == "arm_rejected" and "start_step" in e.get("detail", "")
                                 for e in _events(out, r)) for r in range(WORLD)), 60, what="idle config on both ranks")
        assert max(_progress(out)) < plan.start_step, "the idle config came too late to test anything"
        end = plan.start_step + plan.warmup + plan.active
        wait_for(lambda: min(_progress(out)) > end + 5, 90, what="both ranks past the cancelled window")
    finally:
        (out / "stop").touch()
        outputs = [finish_process(p, 60) for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    for r in range(WORLD):
        assert not [e for e in _events(out, r) if e["event"] in ("started", "completed")], _events(out, r)
    assert not list(Path(plan.prof_dir).glob("*_torch_pt"))  # (an absent folder globs to nothing too)
