"""A requeue under the same job id (issue 20, item 5), live: a coordinator and three node daemons in threads, real
rank processes using rankhook with a Slurm-like environment (the same ``PROFWATCH_JOB_ID``, no torchrun restart
count). A 4-rank run on nodes A and B slows down job-wide and is armed (observe mode: the would-arm counts for the
cooldown exactly as an arm), then is killed (no bye). The requeue runs 2 ranks on node C: it opens a new run
(``job_generation``, reason ``every_rank_gone``), nothing of it is refused as ``rank_on_other_node``, its own
slowdown is detected and armed, and the old run's arm (cooldown 900 s) does not suppress it."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import PYTHON, finish_process, python_env, wait_for
from tests.integration.live_stack import Stack, job_view

WORKER = str(Path(__file__).with_name("requeue_rank_worker.py"))
JOB = "slurm-4242"
STEP_S, SLOW_S, SLOW_FROM = 0.05, 0.1, 80


class Run:
    """One run of the job: ``placement[rank] = node_id``; ranks slow down job-wide from step ``SLOW_FROM``."""

    def __init__(self, root: Path, name: str, placement: dict[int, str]) -> None:
        self.stop = root / f"stop-{name}"
        self.procs = []
        for rank, node in sorted(placement.items()):
            env = python_env({
                "PROFWATCH_JOB_ID": JOB, "RANK": str(rank), "LOCAL_RANK": str(rank % 2),
                "WORLD_SIZE": str(len(placement)), "PROFWATCH_NODE_ENDPOINT": f"ipc://{root}/{node}.sock",
                "PROFWATCH_PROFILER_CONFIG_PATH": str(root / "cfg" / JOB), "PROFWATCH_PROF_ROOT": str(root / "prof"),
                "PROFWATCH_BACKEND": "none"})
            self.procs.append(subprocess.Popen([PYTHON, WORKER, str(STEP_S), str(SLOW_FROM), str(SLOW_S),
                                                str(self.stop)], env=env, stdout=subprocess.PIPE,
                                               stderr=subprocess.STDOUT))

    def kill(self) -> None:
        """What a requeue does to the old run: its processes are killed (SIGKILL: no bye)."""
        for p in self.procs:
            p.kill()
            finish_process(p, 20)

    def close(self) -> None:
        self.stop.touch()
        for p in self.procs:
            finish_process(p, 20)


def _job(st: Stack) -> dict[str, Any]:
    return job_view(st.control("status", {"job_id": JOB}), JOB) or {}


def _events(st: Stack, type_: str, after_seq: int = 0) -> list[dict[str, Any]]:
    """Stored events of the job of one type, oldest first, each with its store ``seq``."""
    rows = st.control("events", {"job_id": JOB, "alerts_only": False, "limit": 10_000, "since_seq": after_seq})
    return sorted(({**r["event"], "seq": r["seq"]} for r in rows if r["event"]["type"] == type_ and r["seq"] > 0),
                  key=lambda e: e["seq"])


def _rejected(st: Stack, reason: str) -> float:
    assert st.coord is not None
    return st.coord.metrics.registry.get_sample_value("profwatch_rejected_total", {"reason": reason}) or 0.0


@pytest.fixture
def stack(short_tmp: Path):
    (short_tmp / "cfg" / JOB).mkdir(parents=True)
    (short_tmp / "prof").mkdir()
    st = Stack(short_tmp, limits={"rank_rebind_after_s": 2.0})  # old ranks count as gone after 2 s of silence
    st.start()
    for node in ("nodeA", "nodeB", "nodeC"):
        st.node(node)
    assert st.control("set_thresholds", {"arming": {"mode": "observe"}})["arming"]["mode"] == "observe"
    runs: list[Run] = []
    yield st, short_tmp, runs
    for run in runs:
        run.close()
    st.close()


def _decisions_after(st: Stack, after_seq: int) -> list[dict[str, Any]]:
    return [e["data"] for e in _events(st, "io.profwatch.arm_decision.v1", after_seq)]


def test_a_requeue_with_fewer_ranks_on_another_node_is_a_new_run_with_its_own_budget(stack) -> None:
    st, root, runs = stack
    runs.append(Run(root, "old", {0: "nodeA", 1: "nodeA", 2: "nodeB", 3: "nodeB"}))
    first = wait_for(lambda: [d for d in _decisions_after(st, 0) if d["action"] == "would_arm"], 120, 0.3,
                     "the old run's slowdown armed (observe mode)")
    assert first[0]["anomaly"] in ("step_regression", "rank_outlier")
    runs[0].kill()
    wait_for(lambda: all(r["age_s"] > 2.5 for r in _job(st)["ranks"]), 30, 0.3,
             "the old ranks silent (a requeue starts after the old run ended)")
    runs.append(Run(root, "requeue", {0: "nodeC", 1: "nodeC"}))
    gens = wait_for(lambda: _events(st, "io.profwatch.job_generation.v1"), 60, 0.3, "the new run opened")
    g = gens[0]
    assert (g["data"]["reason"], g["data"]["old_world_size"], g["data"]["world_size"]) == ("every_rank_gone", 4, 2)
    assert g["data"]["nodes"] == ["nodeC"] and g["data"]["generation"] == 1
    opened_seq = g["seq"]
    wait_for(lambda: (j := _job(st)).get("world_size") == 2 and len(j["ranks"]) == 2
             and all(r["node_id"] == "nodeC" and r["last_step"] >= 20 for r in j["ranks"]), 60, 0.3,
             "both ranks of the new run stepping on node C")
    new = wait_for(lambda: [d for d in _decisions_after(st, opened_seq)
                            if d["anomaly"] in ("step_regression", "rank_outlier")], 120, 0.3,
                   "the new run's slowdown judged")
    assert new[0]["action"] == "would_arm", new  # not suppress (cooldown): the old run's arm is not its budget
    assert new[0]["step"] >= SLOW_FROM  # judged on the new run's own steps
    assert _rejected(st, "rank_on_other_node") == 0 and _rejected(st, "generation_pending") == 0
    job = _job(st)
    assert (job["generation"], job["pending_generations"]) == (1, [])
