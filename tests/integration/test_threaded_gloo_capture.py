"""``rankhook.step()`` from several threads under an armed torch.profiler capture (issue 20, item 8), live: a
coordinator and a node daemon in threads, and a real 2-rank CPU gloo job whose ranks call ``step()`` from the
training loop (the owner) and from two side threads each. The capture runs and completes on both ranks, no rank
crashes, the side threads' calls are dropped, and the job's step counters never go back: no ``job_generation``
(``steps_went_back``) and generation 0 to the end."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from tests.conftest import PYTHON, finish_process, python_env, wait_for
from tests.integration.live_stack import Stack, job_view

WORKER = str(Path(__file__).with_name("threaded_gloo_worker.py"))
JOB = "threads-j1"
WORLD = 2
STEP_S = 0.05


def _job(st: Stack) -> dict[str, Any]:
    return job_view(st.control("status", {"job_id": JOB}), JOB) or {}


def _stepping(st: Stack, past: int) -> bool:
    ranks = _job(st).get("ranks", [])
    return len(ranks) == WORLD and all(r["last_step"] >= past for r in ranks)


def _done(prof_dir: Path) -> list[Path]:
    return sorted(prof_dir.glob("*_torch_pt/trace.done"))


def test_step_from_three_threads_under_an_armed_torch_profiler_capture(short_tmp: Path) -> None:
    cfg, prof = short_tmp / "cfg" / JOB, short_tmp / "prof"
    cfg.mkdir(parents=True)
    prof.mkdir()
    st = Stack(short_tmp)
    st.start()
    st.node("nodeA")
    stop = short_tmp / "stop"
    procs: list[subprocess.Popen[bytes]] = []
    outputs: list[str] = []
    try:
        for rank in range(WORLD):
            env = python_env({
                "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(WORLD), "PROFWATCH_JOB_ID": JOB,
                "PROFWATCH_NODE_ENDPOINT": f"ipc://{short_tmp}/nodeA.sock", "PROFWATCH_PROFILER_CONFIG_PATH": str(cfg),
                "PROFWATCH_PROF_ROOT": str(prof), "PROFWATCH_BACKEND": "torch", "PROFWATCH_POLL_INTERVAL_S": "0.2",
                "PG_FILE": str(short_tmp / "pg")})
            procs.append(subprocess.Popen([PYTHON, WORKER, str(stop), str(STEP_S), "2"], env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
        wait_for(lambda: _stepping(st, 10), 120, 0.2, "both ranks stepping")
        cap = st.control("arm", {"job_id": JOB, "in_steps": 15, "reason": "test"})
        prof_dir = Path(cap["prof_dir"])
        wait_for(lambda: len(_done(prof_dir)) == WORLD, 180, 0.2, "the capture written by both ranks")
        wait_for(lambda: st.control("capture", {"capture_id": cap["capture_id"]})["state"]
                 not in ("planned", "written", "acknowledged", "collecting"), 120, 0.2, "the batch complete")
        job = _job(st)
    finally:
        stop.touch()
        outputs = [finish_process(p, 60) for p in procs]
        st_events = (st.control("events", {"job_id": JOB, "alerts_only": False, "limit": 10_000})
                     if st.coord is not None else [])
        st.close()
    assert [p.returncode for p in procs] == [0] * WORLD, outputs  # no SIGSEGV (-11), no hang
    counts = [json.loads(next(ln for ln in o.splitlines() if ln.startswith('{"step_count"'))) for o in outputs]
    assert all(c["foreign_steps"] > 0 for c in counts), counts  # the side threads did call step()
    assert len({c["step_count"] for c in counts}) == 1  # the ranks stopped on one step: one counter each
    assert (job["generation"], job["pending_generations"]) == (0, [])
    assert all(r["generation"] == 0 and not r["backend_error"] for r in job["ranks"])
    types = [r["event"]["type"] for r in st_events]
    assert "io.profwatch.job_generation.v1" not in types
    for done in _done(prof_dir):  # the trace's steps are the training loop's, labelled in order
        trace = next(done.parent.glob("*.pt.trace.json"))
        names = {e.get("name") for e in json.loads(trace.read_text())["traceEvents"]}
        info = json.loads(next(done.parent.glob("profiler_info_*.json")).read_text())
        assert info["steps"] and {f"ProfilerStep#{k}" for k in info["steps"]} <= names
