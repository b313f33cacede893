"""Arming edges with a live coordinator (real sockets, the real config writer): a capture whose window lies
ahead when its job ends is cancelled (reason job ended) and its arm idled; an arm too far ahead is refused; a job
whose capture folder is missing (zero-code path, live ranks) is alerted with cause and fix and cannot be armed."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from profwatch.adapters.zmq.control import ControlError, call
from profwatch.cli import cli
from rankhook import wire
from tests.conftest import PYTHON, REPO_ROOT, finish_process, python_env, wait_for
from tests.integration.capture_harness import Harness
from tests.integration.live_stack import Stack, rank_view

WORKER = str(REPO_ROOT / "tests" / "fakes" / "rank_worker.py")


def _config(cfg: Path) -> dict:
    try:
        return json.loads((cfg / "profiler_config.json").read_text())
    except (OSError, ValueError):
        return {}


def test_a_capture_whose_window_is_ahead_ends_with_its_job_and_a_far_arm_is_refused(harness, short_tmp: Path) -> None:
    h = harness(job_end_after_s=3.0)
    cfg, prof = short_tmp / "cfg" / "jobE", short_tmp / "prof"
    cfg.mkdir(parents=True)
    h.hellos("jobE", 2, cfg, prof)
    h.steps("jobE", 2, 12)
    wait_for(lambda: h.furthest("jobE") == 12, 20)
    # 0.5 s steps: one hour is 7200 steps ahead, more than 1000
    with pytest.raises(ControlError, match="would likely outlive the job"):
        call(h.control, "arm", {"job_id": "jobE", "start_step": 12 + 7201})
    with pytest.raises(ControlError, match="would likely outlive the job"):
        call(h.control, "arm", {"job_id": "jobE", "start_step": 12 + 7201, "dry_run": True})
    res = call(h.control, "arm", {"job_id": "jobE", "start_step": 12 + 7000})
    wait_for(lambda: _config(cfg).get("start_step") == 12 + 7000, 20, what="the arm written")
    # no rank reports any more: the job ends, the window was never reached
    cap = wait_for(lambda: (c := h.last_capture("jobE")) and c.get("state") == "cancelled" and c, 30,
                   what="the capture cancelled at job end")
    assert cap["capture_id"] == res["capture_id"] and "job ended" in cap["outcome"]
    wait_for(lambda: _config(cfg).get("start_step") == 0, 20, what="the idle config over the arm")
    evs = h.events("jobE")
    assert any(e["type"] == "io.profwatch.job_ended.v1" for e in evs)
    assert [e["data"]["reason"] for e in evs if e["type"] == "io.profwatch.capture.v1"
            and e["data"].get("event") == "cancelled"] == ["job ended"]


def test_a_job_that_reports_again_after_its_end_opens_a_new_generation(harness, short_tmp: Path) -> None:
    """A serving job idle longer than job_end_after_s that resumes under the same id (same processes): its first
    step after the end, and later its first hello after another end, open a new generation (reason
    resumed_after_end), as a requeue does: it is judged as a new run, never silenced by the old run's end."""
    h = harness(job_end_after_s=2.0)
    cfg, prof = short_tmp / "cfg" / "jobR", short_tmp / "prof"
    cfg.mkdir(parents=True)
    h.hellos("jobR", 2, cfg, prof)
    h.steps("jobR", 2, 12)
    wait_for(lambda: h.furthest("jobR") == 12, 20)

    def of(type_: str) -> list[dict]:
        return [e for e in h.events("jobR") if e["type"] == type_]

    wait_for(lambda: of("io.profwatch.job_ended.v1"), 30, what="the job ended")
    assert of("io.profwatch.job_generation.v1") == []
    h.send(*[wire.StepReport(job_id="jobR", rank=r, step=13, step_time_s=0.5, ts_unix_s=time.time())
             for r in range(2)])  # the counter goes on: not a restart
    (gen,) = wait_for(lambda: of("io.profwatch.job_generation.v1"), 20, what="a generation at the first step")
    assert gen["data"]["reason"] == "resumed_after_end" and gen["data"]["generation"] == 1
    wait_for(lambda: len(of("io.profwatch.job_ended.v1")) == 2, 30, what="the job ended again")
    h.hellos("jobR", 2, cfg, prof)  # the same processes say hello again
    gens = wait_for(lambda: len(of("io.profwatch.job_generation.v1")) == 2 and of("io.profwatch.job_generation.v1"),
                    20, what="a generation at the first hello")
    assert sorted(g["data"]["generation"] for g in gens) == [1, 2]
    assert {g["data"]["reason"] for g in gens} == {"resumed_after_end"}


def test_a_job_whose_ranks_all_said_bye_ends_at_once(harness, short_tmp: Path) -> None:
    """Every rank of the generation said bye: the job ends now (job_ended reason all_ranks_left), not after
    job_end_after_s (600 s here); its open episode closes with that reason and its capture ahead is cancelled."""
    h = harness(arming={"mode": "observe"})
    cfg, prof = short_tmp / "cfg" / "jobB", short_tmp / "prof"
    cfg.mkdir(parents=True)
    h.hellos("jobB", 4, cfg, prof)
    for s in range(1, 121):  # rank 3 twice as slow from step 61: one open episode
        h.send(*[wire.StepReport(job_id="jobB", rank=r, step=s, step_time_s=1.0 if r == 3 and s > 60 else 0.5,
                                 ts_unix_s=time.time()) for r in range(4)])
    wait_for(lambda: h.furthest("jobB") == 120, 30)

    def of(type_: str) -> list[dict]:
        return [e for e in h.events("jobB") if e["type"] == type_]

    opened = wait_for(lambda: of("io.profwatch.episode_opened.v1"), 30, what="an episode opened")
    res = call(h.control, "arm", {"job_id": "jobB", "start_step": 120 + 500})
    h.send(*[wire.RankBye(job_id="jobB", rank=r, step=120, ts_unix_s=time.time()) for r in range(3)])
    wait_for(lambda: (c := h.last_capture("jobB")) and c.get("state") == "written", 20, what="the arm written")
    assert of("io.profwatch.job_ended.v1") == []  # rank 3 still runs
    h.send(wire.RankBye(job_id="jobB", rank=3, step=120, ts_unix_s=time.time()))
    (end,) = wait_for(lambda: of("io.profwatch.job_ended.v1"), 20, what="the job ended at its last bye")
    assert end["data"]["reason"] == "all_ranks_left" and end["data"]["generation"] == 0
    closed = wait_for(lambda: of("io.profwatch.episode_closed.v1"), 20, what="its episode closed")
    assert {e["data"]["episode_id"] for e in closed} == {e["data"]["episode_id"] for e in opened}
    assert {e["data"]["reason"] for e in closed} == {"all_ranks_left"}
    cap = wait_for(lambda: (c := h.last_capture("jobB")) and c.get("state") == "cancelled" and c, 20,
                   what="the capture ahead cancelled")
    assert cap["capture_id"] == res["capture_id"] and "job ended" in cap["outcome"]


def _rank(root: Path, job: str, rank: int, cfg: Path, backend: str) -> subprocess.Popen:
    env = {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "PROFWATCH_JOB_ID": job,
           "PROFWATCH_NODE_ENDPOINT": f"ipc://{root}/n1.sock", "PROFWATCH_PROFILER_CONFIG_PATH": str(cfg),
           "PROFWATCH_PROF_ROOT": str(root / "prof"), "PROFWATCH_BACKEND": backend}
    log = open(root / f"{job}-{rank}.log", "ab")
    return subprocess.Popen([PYTHON, WORKER, str(root / f"{job}-{rank}.json"), "0", "0.02"], env=python_env(env),
                            stdout=log, stderr=subprocess.STDOUT, cwd=root)


@pytest.fixture
def stack(short_tmp: Path):
    (short_tmp / "cfg").mkdir()
    st = Stack(short_tmp)
    st.start()
    yield st
    st.close()


def _stepping(st: Stack, job: str) -> bool:
    ranks = rank_view(st.control("status"), job)
    return len(ranks) == 2 and all(r.get("last_step", 0) > 30 for r in ranks.values())


def test_a_job_whose_capture_folder_is_missing_is_alerted_with_cause_and_fix_and_its_arms_refused(
        stack: Stack, short_tmp: Path) -> None:
    """The zero-code path with PROFWATCH_PROFILER_CONFIG_PATH naming a folder that does not exist (live ranks)."""
    stack.node("n1")
    missing = short_tmp / "cfg" / "not-created"
    procs = [_rank(short_tmp, "jobM", r, missing, "torch_npu") for r in (0, 1)]
    try:
        wait_for(lambda: _stepping(stack, "jobM"), 60, what="two live ranks")
        rows = wait_for(lambda: [r["event"] for r in stack.control("events", {"job_id": "jobM", "alerts_only": True})
                                 if r["event"]["type"] == "io.profwatch.capture_unavailable.v1"], 30)
        assert len(rows) == 1, rows  # one alert for the job and cause, not one per rank or hello
        data = rows[0]["data"]
        assert data["cause"] == f"the capture folder {missing} does not exist on {data['hostname']}"
        assert f"mkdir -p {missing}" in data["fix"]
        # raised at the first hello: it says so and where every rank is listed (a new user read it as "only rank 0")
        assert "the first rank to say so" in data["detail"] and "profwatch arm --job jobM --dry-run" in data["detail"]
        for dry in (True, False):  # the dry run checks what the real arm checks
            with pytest.raises(ControlError, match="does not exist") as ei:
                stack.control("arm", {"job_id": "jobM", "dry_run": dry})
            assert ei.value.code == "refused" and "rank(s) 0, 1" in ei.value.message
        shown = CliRunner().invoke(cli, ["arm", "--job", "jobM", "--dry-run"],
                                   env={"PROFWATCH_COORDINATOR__CONTROL_BIND": stack.settings.coordinator.control_bind})
        assert shown.exit_code != 0 and "does not exist" in shown.output, shown.output
        assert "would refuse arm (dry run, nothing written): [refused]" in shown.output, shown.output
        assert not missing.exists()  # nothing was written for it
    finally:
        for p in procs:
            finish_process(p, 20, terminate=True)


def test_a_telemetry_only_job_is_armable_with_a_warning(stack: Stack, short_tmp: Path) -> None:
    """The neighbour: the folder exists and the job chose no backend (PROFWATCH_BACKEND=none): no alert, the dry
    run passes and says the ranks have no capture backend of their own."""
    stack.node("n1")
    cfg = short_tmp / "cfg" / "jobT"
    cfg.mkdir()
    procs = [_rank(short_tmp, "jobT", r, cfg, "none") for r in (0, 1)]
    try:
        wait_for(lambda: _stepping(stack, "jobT"), 60, what="two live ranks")
        plan = stack.control("arm", {"job_id": "jobT", "dry_run": True})
        assert "refused" not in plan and "telemetry-only" in plan["warnings"][0]
        assert not [r for r in stack.control("events", {"job_id": "jobT", "alerts_only": True})
                    if r["event"]["type"] == "io.profwatch.capture_unavailable.v1"]
    finally:
        for p in procs:
            finish_process(p, 20, terminate=True)


def _hellos(h: Harness, job: str, cfg: Path, prof: Path, version: str) -> None:
    h.send(*[wire.RankHello(job_id=job, rank=r, local_rank=r, world_size=2, hostname="fake", pid=100 + r,
                            backend="torch_npu", ts_unix_s=time.time() - 5, profiler_config_path=str(cfg),
                            prof_root=str(prof), versions={"torch_npu": version}) for r in range(2)])


@pytest.mark.parametrize(("name", "version", "outcome"), [
    ("job@1", "2.6.0", "refused"), ("job@2", "2.1.0.post17", "refused"), ("job@3", "2.14.0", "warned"),
    ("job_4", "2.6.0", "clean"),
])
def test_config_paths_torch_npu_refuses_are_refused_by_version(harness, short_tmp: Path, name: str, version: str,
                                                               outcome: str) -> None:
    h = harness()
    cfg, prof = short_tmp / "cfg" / name, short_tmp / "prof"
    cfg.mkdir(parents=True)
    job = name.replace("@", "-")
    _hellos(h, job, cfg, prof, version)
    h.steps(job, 2, 12)
    wait_for(lambda: h.furthest(job) == 12, 20)
    if outcome == "refused":
        rows = wait_for(lambda: [e for e in h.events(job, alerts_only=True)
                                 if e["data"].get("reason") == "torch_npu_refuses_path"], 20)
        assert len(rows) == 1 and rows[0]["data"]["torch_npu"] == version and "'@'" in rows[0]["data"]["detail"]
        for dry in (True, False):
            with pytest.raises(ControlError, match="dynamic_profile stays off") as ei:
                call(h.control, "arm", {"job_id": job, "dry_run": dry})
            assert ei.value.code == "refused" and version in ei.value.message
        assert not (cfg / "profiler_config.json").exists()  # nothing written, not even the template
        return
    plan = call(h.control, "arm", {"job_id": job, "dry_run": True})
    status = call(h.control, "status", {"job_id": job})["jobs"][0]
    assert not [e for e in h.events(job, alerts_only=True) if e["data"].get("reason") == "torch_npu_refuses_path"]
    if outcome == "warned":
        assert "only warns" in plan["warnings"][0] and "only warns" in status["warnings"][0]
    else:
        assert "warnings" not in plan and status["warnings"] == []
