"""4 rank processes on the FAKE torch_npu (daemon/profwatch/simulate) driven by rankhook's torch_npu backend.

Checks the protocol end to end: a pre-written config is ignored, an absolute start_step planned by
daemon/profwatch/core/capture/planner.py and written by the config writer captures exactly [start_step, start_step+warmup+active)
on every rank (dp log lines, profiler_info steps, DBs + analyse.done, metadata), and a passed start_step is
discarded.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from profwatch.adapters.fs.config_writer import ConfigWriter
from profwatch.adapters.fs.rank_dir_fs import scan_tree
from profwatch.core.capture.planner import CaptureRequest, CaptureSettings, JobProgress, ProfilerConfig, plan_capture
from tests.conftest import PYTHON, REPO_ROOT, finish_process, python_env, wait_for
from tests.integration.capture_job_files import read_events, read_progress

WORKER = str(Path(__file__).with_name("capture_rank_worker.py"))
FAKE = str(REPO_ROOT / "daemon" / "profwatch" / "simulate" / "fake_torch_npu")
WORLD = 4
STEP_S = 0.05


def _events(out: Path, rank: int) -> list[dict]:
    return read_events(out, rank)


def _progress(out: Path) -> list[int]:
    return read_progress(out, WORLD)


def test_fake_dynamic_profile_four_ranks(tmp_path: Path) -> None:
    cfg_dir, out, prof_root = tmp_path / "cfg", tmp_path / "out", tmp_path / "prof"
    for d in (cfg_dir, out, prof_root):
        d.mkdir()
    writer = ConfigWriter()
    roots = [str(tmp_path)]
    pre = ProfilerConfig(start_step=8, prof_dir=str(tmp_path / "pre")).render()
    writer.write(str(cfg_dir), pre, not_before_unix_s=0, allowed_roots=roots)  # before the job: must be ignored
    t_job = time.time()
    env = python_env({"PYTHONPATH": os.pathsep.join([FAKE, str(REPO_ROOT)]), "PROFWATCH_SIM_POLL_INTERVAL_S": "0.2",
                      "PROFWATCH_POLL_INTERVAL_S": "0.2"})
    env.pop("PROF_CONFIG_PATH", None)
    procs = [subprocess.Popen([PYTHON, WORKER, "torch_npu", str(cfg_dir), str(out), str(r), str(WORLD), str(STEP_S),
                               "3000"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(WORLD)]
    try:
        logs = cfg_dir / "log"
        wait_for(lambda: len(list(logs.glob("dp_*_rank_*.log"))) == WORLD, 20, what="dp logs of every rank")
        wait_for(lambda: min(_progress(out)) >= 12, 30, what="all ranks past step 12")
        assert not (tmp_path / "pre").exists(), "pre-written config must not arm"

        settings = CaptureSettings(warmup=1, active=2, margin_s=1.0)
        job = JobProgress(job_id="j1", world_size=WORLD, furthest_step=max(_progress(out)), step_time_s=STEP_S,
                          prof_root=str(prof_root), now_unix_s=time.time())
        plan = plan_capture(CaptureRequest(job_id="j1", reason="test"), job, settings)
        writer.write(str(cfg_dir), plan.config.render(), not_before_unix_s=t_job, allowed_roots=roots)
        s, end = plan.start_step, plan.start_step + plan.warmup + plan.active

        def completed() -> bool:
            return all(any(e["event"] == "completed" and e["capture_id"] == plan.capture_id for e in _events(out, r))
                       for r in range(WORLD))

        wait_for(completed, 60, what="completed events on every rank")
        rank_dirs = sorted(Path(plan.prof_dir).glob("*_ascend_pt"))
        assert len(rank_dirs) == WORLD
        seen_ranks = set()
        for rd in rank_dirs:
            info_file = next(rd.glob("profiler_info_*.json"))
            info = json.loads(info_file.read_text())
            rank = int(info["rank_id"])  # torch_npu writes the RANK string
            seen_ranks.add(rank)
            assert info["profwatch_sim"] == {"steps": list(range(s + plan.warmup, end)), "start_step": s}
            meta = json.loads((rd / "profiler_metadata.json").read_text())
            assert meta["profwatch_capture_id"] == plan.capture_id and meta["profwatch_job_id"] == "j1"
            # the world size, where torch_npu on HCCL writes it (issue 14 item 2)
            (group,) = meta["parallel_group_info"].values()
            assert group["group_name"] == "default_group" and group["global_ranks"] == list(range(WORLD))
            assert (rd / "FRAMEWORK").is_dir()
            assert (rd / "ASCEND_PROFILER_OUTPUT" / f"ascend_pytorch_profiler_{rank}.db").is_file()
            assert (rd / "ASCEND_PROFILER_OUTPUT" / "analyse.done").is_file()
            log_text = next(logs.glob(f"dp_*_rank_{rank}.log")).read_text()
            assert f"Start step will be set to {s}." in log_text
            assert f"Start Dynamic Profiler at {s} step." in log_text
            assert f"Stop Dynamic Profiler at {end} step." in log_text
            assert log_text.count("Start Dynamic Profiler") == 1
            ev = [e for e in _events(out, rank) if e["capture_id"] == plan.capture_id]
            kinds = [e["event"] for e in ev]
            assert kinds.index("arm_seen") < kinds.index("started") < kinds.index("completed")
            done = next(e for e in ev if e["event"] == "completed")
            assert done["steps"] == list(range(s + plan.warmup, end)) and done["step"] == end
            assert done["rank_dir"] == str(rd) and done["total_bytes"] > 0
        assert seen_ranks == set(range(WORLD))
        # profwatch's own scan calls the simulator's batch complete without being told the world size
        (batch,) = scan_tree(plan.prof_dir)
        assert batch.status == "complete" and batch.expected_ranks == list(range(WORLD)), batch.to_json()

        # a start_step that already passed is discarded on every rank (no capture)
        past = ProfilerConfig(start_step=2, prof_dir=str(tmp_path / "past"),
                              metadata={"profwatch_capture_id": "c-past"}).render()
        writer.write(str(cfg_dir), past, not_before_unix_s=t_job, allowed_roots=roots)
        wait_for(lambda: all(any(e["event"] == "arm_rejected" and e["capture_id"] == "c-past" for e in _events(out, r))
                             for r in range(WORLD)), 30, what="past start_step discarded on every rank")
        wait_for(lambda: all("Start step will be set to 2." in p.read_text() for p in logs.glob("dp_*.log")), 10)
        assert not (tmp_path / "past").exists()
    finally:
        (out / "stop").touch()
        outputs = [finish_process(p, 30) for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    assert "not effective" in "".join(outputs)
