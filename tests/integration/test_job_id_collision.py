"""Two jobs with one job id on one node (live: a node daemon and a coordinator with real sockets, rank processes
with the real rankhook): the second is named a job id collision, alerted once with its reason and owning uid, its
messages refused and counted, and it never touches the first job (no generations, no steps mixed in)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import PYTHON, REPO_ROOT, finish_process, python_env, wait_for
from tests.integration.live_stack import Stack, batch, hello, job_view, rank_view, step

WORKER = str(REPO_ROOT / "tests" / "fakes" / "rank_worker.py")


@pytest.fixture
def stack(short_tmp: Path):
    (short_tmp / "cfg" / "a").mkdir(parents=True)
    (short_tmp / "cfg" / "b").mkdir(parents=True)
    st = Stack(short_tmp)
    st.start()
    yield st
    st.close()


def _rank(root: Path, name: str, rank: int, cfg: str, step_s: float) -> subprocess.Popen:
    env = {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "PROFWATCH_JOB_ID": "jobC",
           "PROFWATCH_NODE_ENDPOINT": f"ipc://{root}/n1.sock", "PROFWATCH_PROFILER_CONFIG_PATH": cfg,
           "PROFWATCH_PROF_ROOT": str(root / "prof")}
    log = open(root / f"{name}.log", "ab")
    return subprocess.Popen([PYTHON, WORKER, str(root / f"{name}.json"), "0", str(step_s)], env=python_env(env),
                            stdout=log, stderr=subprocess.STDOUT, cwd=root)


def _collisions(stack: Stack) -> list[dict]:
    rows = stack.control("events", {"job_id": "jobC", "alerts_only": True})
    return [r["event"] for r in rows if r["event"]["type"] == "io.profwatch.job_id_collision.v1"]


def test_a_second_job_with_the_same_id_is_kept_apart_refused_and_alerted_once(stack: Stack, short_tmp: Path) -> None:
    node = stack.node("n1")
    procs = [_rank(short_tmp, f"a{r}", r, str(short_tmp / "cfg" / "a"), 0.02) for r in (0, 1)]
    try:
        wait_for(lambda: all(r.get("last_step", 0) > 20 for r in rank_view(stack.control("status"), "jobC").values())
                 and len(rank_view(stack.control("status"), "jobC")) == 2, 60, what="the first job's steps")
        # the second job: same id, same ranks, another folder, a step counter that starts again at 0
        procs += [_rank(short_tmp, f"b{r}", r, str(short_tmp / "cfg" / "b"), 0.02) for r in (0, 1)]
        evs = wait_for(lambda: _collisions(stack), 60, what="a job_id_collision alert")
        wait_for(lambda: node.counters.get("job_id_collision", 0) > 50, 60, what="the second job's steps refused")
        first = rank_view(stack.control("status"), "jobC")
        wait_for(lambda: all(r["last_step"] > first[k]["last_step"] + 20
                             for k, r in rank_view(stack.control("status"), "jobC").items()), 60,
                 what="the first job going on")
    finally:
        for p in procs:
            finish_process(p, 20, terminate=True)
    assert len(evs) == 1, evs  # one alert for the case, not one per process or message
    data = evs[0]["data"]
    assert data["reason"] == "paths_changed" and data["owner_uid"] == os.getuid() and data["uid"] == os.getuid()
    assert data["owner_profiler_config_path"] == str(short_tmp / "cfg" / "a")
    assert data["profiler_config_path"] == str(short_tmp / "cfg" / "b") and data["node_id"] == "n1"
    assert "give each job its own job id" in data["fix"]
    job = job_view(stack.control("status"), "jobC")
    assert job is not None and job["generation"] == 0  # the second job's counters never opened a generation
    assert job["profiler_config_path"] == str(short_tmp / "cfg" / "a")
    gens = stack.control("events", {"job_id": "jobC"})
    assert not [r for r in gens if r["event"]["type"] == "io.profwatch.job_generation.v1"]
    assert node.metrics.registry.get_sample_value("profwatch_rejected_total", {"reason": "job_id_collision"}) > 50


def test_a_hello_with_other_paths_through_another_node_is_a_collision_and_its_steps_are_refused(
        stack: Stack, short_tmp: Path) -> None:
    """The neighbour: the second job on another node (or behind an older node daemon): the coordinator names it,
    refuses its hello and the steps of its ranks, and the first job keeps its paths and ranks."""
    one, other = stack.dealer(), stack.dealer()
    one.send(batch("n1", hello("jobC", 0, root=short_tmp), *(step("jobC", 0, s) for s in range(1, 11))))
    wait_for(lambda: rank_view(stack.control("status"), "jobC").get(0, {}).get("last_step") == 10, 20)
    moved = {"profiler_config_path": str(short_tmp / "cfg" / "b")}
    other.send(batch("n2", hello("jobC", 1, root=short_tmp, **moved), *(step("jobC", 1, s) for s in range(1, 6))))
    evs = wait_for(lambda: _collisions(stack), 20, what="a job_id_collision alert")
    assert evs[0]["data"]["reason"] == "paths_changed" and evs[0]["data"]["node_id"] == "n2"
    coord = stack.coord
    assert coord is not None
    wait_for(lambda: coord.metrics.registry.get_sample_value("profwatch_rejected_total",
                                                             {"reason": "job_id_collision"}) == 6, 20)
    assert set(rank_view(stack.control("status"), "jobC")) == {0}
