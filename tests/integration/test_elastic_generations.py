"""Elastic restart and resize with live daemons (issue 11 item 1): a coordinator and node daemons in threads, real
rank processes using rankhook with torchrun's environment. Scale-down 8 -> 4 and scale-up 4 -> 8 each open a new
generation: the job shows the new world size and generation, every new rank is visible and stepping, nothing is
refused as ``bad_rank`` or ``world_size_conflict``, the detector is rebuilt for the new shape, a ``job_generation``
event names both sizes, and a capture in flight for the old generation is closed as ``superseded`` with its folder
kept. A lone spoofed hello with another world size, from a process on the job's node, opens nothing."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import zmq
from click.testing import CliRunner

from profwatch.cli import cli
from rankhook import wire
from tests.conftest import PYTHON, finish_process, python_env, wait_for
from tests.integration.live_stack import Stack, job_view

WORKER = str(Path(__file__).with_name("elastic_rank_worker.py"))
JOB = "elastic-j1"
STEP_S = 0.05


class Workers:
    """One worker group (one generation): ``placement[rank] = node_id``."""

    def __init__(self, root: Path, placement: dict[int, str], restart_count: int) -> None:
        self.stop = root / f"stop-{restart_count}"
        world = len(placement)
        self.procs = []
        for rank, node in sorted(placement.items()):
            env = python_env({
                "TORCHELASTIC_RUN_ID": JOB, "RANK": str(rank), "LOCAL_RANK": str(rank % 4), "WORLD_SIZE": str(world),
                "TORCHELASTIC_RESTART_COUNT": str(restart_count), "PROFWATCH_NODE_ENDPOINT": f"ipc://{root}/{node}.sock",
                "PROFWATCH_PROFILER_CONFIG_PATH": str(root / "cfg" / JOB), "PROFWATCH_PROF_ROOT": str(root / "prof"),
                "PROFWATCH_BACKEND": "none"})
            self.procs.append(subprocess.Popen([PYTHON, WORKER, str(STEP_S), str(self.stop)], env=env,
                                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT))

    def kill(self) -> None:
        """What the elastic agent does to a failed worker group: SIGTERM every worker (no bye is sent)."""
        for p in self.procs:
            finish_process(p, 20, terminate=True)

    def close(self) -> None:
        self.stop.touch()
        for p in self.procs:
            finish_process(p, 20)


def _status(st: Stack) -> dict[str, Any]:
    return st.control("status", {"job_id": JOB})


def _job(st: Stack) -> dict[str, Any]:
    return job_view(_status(st), JOB) or {}


def _stepping(st: Stack, world: int, generation: int, past: int) -> bool:
    j = _job(st)
    ranks = j.get("ranks", [])
    return (j.get("world_size"), j.get("generation"), sorted(r["rank"] for r in ranks)) == (
        world, generation, list(range(world))) and all(r["last_step"] >= past for r in ranks)


def _rejected(st: Stack, reason: str) -> float:
    assert st.coord is not None
    return st.coord.metrics.registry.get_sample_value("profwatch_rejected_total", {"reason": reason}) or 0.0


def _events(st: Stack, type_: str) -> list[dict[str, Any]]:
    rows = st.control("events", {"job_id": JOB, "alerts_only": False, "limit": 10_000})
    return [r["event"] for r in rows if r["event"]["type"] == type_]


@pytest.fixture
def stack(short_tmp: Path):
    (short_tmp / "cfg" / JOB).mkdir(parents=True)
    (short_tmp / "prof").mkdir()
    st = Stack(short_tmp, ack_timeout_s=600.0)
    st.start()
    for node in ("nodeA", "nodeB", "nodeC"):
        st.node(node)
    groups: list[Workers] = []
    yield st, short_tmp, groups
    for g in groups:
        g.close()
    st.close()


def _arm_far_ahead(st: Stack) -> dict[str, Any]:
    cap = st.control("arm", {"job_id": JOB, "in_steps": 20_000, "reason": "test"})  # ~1000 s ahead: never reached
    wait_for(lambda: st.control("capture", {"capture_id": cap["capture_id"]})["state"] == "written", 60, 0.2,
             "the capture's config written")
    return cap


def test_scale_down_8_to_4_opens_a_generation_and_supersedes_the_capture(stack) -> None:
    st, root, groups = stack
    groups.append(Workers(root, {r: ("nodeA" if r < 4 else "nodeB") for r in range(8)}, restart_count=0))
    wait_for(lambda: _stepping(st, 8, 0, 5), 90, 0.2, "8 ranks stepping in generation 0")
    cap = _arm_far_ahead(st)
    assert Path(cap["prof_dir"]).is_dir()
    groups[0].kill()
    groups.append(Workers(root, {0: "nodeA", 1: "nodeA", 2: "nodeB", 3: "nodeB"}, restart_count=1))
    wait_for(lambda: _stepping(st, 4, 1, 5), 90, 0.2, "4 ranks stepping in generation 1")

    j = _job(st)
    assert (j["restart_count"], j["pending_generations"]) == (1, [])
    assert all(r["generation"] == 1 for r in j["ranks"])
    (g,) = _events(st, "io.profwatch.job_generation.v1")
    d = g["data"]
    assert (d["old_world_size"], d["world_size"], d["old_generation"], d["generation"]) == (8, 4, 0, 1)
    assert (d["old_restart_count"], d["restart_count"], d["reason"]) == (0, 1, "world_size")
    assert set(d["nodes"]) <= {"nodeA", "nodeB"} and len(d["ranks"]) >= 2
    superseded = st.control("capture", {"capture_id": cap["capture_id"]})
    assert superseded["state"] == "superseded" and "generation 0 -> 1" in superseded["outcome"]
    assert Path(cap["prof_dir"]).is_dir()  # data kept
    assert _status(st)["bounds"]["detector_ranks"] == 4  # the detector was rebuilt for the new shape
    assert _rejected(st, "bad_rank") == 0 and _rejected(st, "world_size_conflict") == 0
    new = st.control("arm", {"job_id": JOB, "in_steps": 20_000, "reason": "test", "dry_run": True})
    assert new["world_size"] == 4 and "refused" not in new  # the new generation can be armed at once
    shown = CliRunner().invoke(cli, ["status", "--job", JOB],
                               env={"PROFWATCH_COORDINATOR__CONTROL_BIND": st.settings.coordinator.control_bind})
    assert shown.exit_code == 0 and f"job {JOB}  world_size=4" in shown.output, shown.output
    assert "  generation 1 (restart count 1, since " in shown.output and "claimed:" not in shown.output


def test_scale_up_4_to_8_through_a_new_node_and_a_spoofed_hello_opens_nothing(stack) -> None:
    st, root, groups = stack
    groups.append(Workers(root, {0: "nodeA", 1: "nodeA", 2: "nodeB", 3: "nodeB"}, restart_count=0))
    wait_for(lambda: _stepping(st, 4, 0, 5), 90, 0.2, "4 ranks stepping in generation 0")

    ctx = zmq.Context()
    try:  # a local process on node A (same user as the job) claims the job is 8 ranks wide now
        spoof = ctx.socket(zmq.PUSH)
        spoof.setsockopt(zmq.LINGER, 1000)
        spoof.connect(f"ipc://{root}/nodeA.sock")
        spoof.send_multipart(wire.frames(wire.RankHello(
            job_id=JOB, rank=0, local_rank=0, world_size=8, hostname="spoof", pid=4242, backend="none",
            ts_unix_s=time.time(), profiler_config_path=str(root / "cfg" / JOB), prof_root=str(root / "prof"),
            restart_count=5)))
        wait_for(lambda: _status(st)["counters"].get("generation_pending", 0) >= 1, 30, 0.1, "the spoofed claim")
    finally:
        ctx.destroy(linger=1000)
    steps_then = {r["rank"]: r["last_step"] for r in _job(st)["ranks"]}
    wait_for(lambda: all(r["last_step"] > steps_then[r["rank"]] + 5 for r in _job(st)["ranks"]), 30, 0.2,
             "the job keeps stepping")
    j = _job(st)
    assert (j["world_size"], j["generation"], j["restart_count"]) == (4, 0, 0)
    assert j["pending_generations"][0] | {"age_s": 0} == {"world_size": 8, "restart_count": 5, "ranks": 1,
                                                          "agreeing_through_job_nodes": 1, "quorum": 2, "age_s": 0}
    assert not _events(st, "io.profwatch.job_generation.v1")
    shown = CliRunner().invoke(cli, ["status", "--job", JOB],
                               env={"PROFWATCH_COORDINATOR__CONTROL_BIND": st.settings.coordinator.control_bind})
    assert "  generation 0 (restart count 0, since " in shown.output, shown.output
    assert "claimed: world_size=8 restart count 5: 1 of 2 ranks agree through the job's nodes (1 held)" in shown.output

    cap = _arm_far_ahead(st)
    groups[0].kill()
    groups.append(Workers(root, {r: ("nodeA", "nodeB", "nodeC", "nodeC")[r // 2] for r in range(8)}, restart_count=1))
    wait_for(lambda: _stepping(st, 8, 1, 5), 90, 0.2, "8 ranks stepping in generation 1")

    j = _job(st)
    assert {r["rank"]: r["node_id"] for r in j["ranks"]} == {0: "nodeA", 1: "nodeA", 2: "nodeB", 3: "nodeB",
                                                             4: "nodeC", 5: "nodeC", 6: "nodeC", 7: "nodeC"}
    assert (j["restart_count"], j["pending_generations"]) == (1, [])  # the spoofed claim is gone with it
    (g,) = _events(st, "io.profwatch.job_generation.v1")
    assert (g["data"]["old_world_size"], g["data"]["world_size"], g["data"]["generation"]) == (4, 8, 1)
    assert "nodeC" not in g["data"]["nodes"]  # only the job's own nodes opened it
    assert st.control("capture", {"capture_id": cap["capture_id"]})["state"] == "superseded"
    assert Path(cap["prof_dir"]).is_dir()
    assert _status(st)["bounds"]["detector_ranks"] == 8
    assert _rejected(st, "bad_rank") == 0 and _rejected(st, "world_size_conflict") == 0
