"""Issue 11 item 7 with real daemons and real forks: a forked child of a rank that calls rankhook never speaks as
its parent, so the parent's step history at the coordinator stays intact.

A node daemon and a coordinator (real sockets, in threads) and one real rank process (tests/fakes/forking_rank.py)
that forks through ``os.fork``, multiprocessing's ``fork`` start method, or DataLoader workers (fork context), whose
children call ``rankhook.step()`` 30 times each (plus ``init``, ``set_step``, ``flag_step``, ``stage``)."""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path

import pytest

from profwatch.adapters.zmq.control import call
from profwatch.config import load_settings
from profwatch.coordinator import Coordinator
from profwatch.node import NodeDaemon
from profwatch.simulate.launcher import free_port
from tests.conftest import PYTHON, REPO_ROOT, python_env, wait_for

WORKER = str(REPO_ROOT / "tests" / "fakes" / "forking_rank.py")




@pytest.fixture
def daemons(short_tmp: Path):
    ports = {k: free_port() for k in ("ingest", "control", "pub")}
    s = load_settings(None, coordinator={"ingest_bind": f"tcp://127.0.0.1:{ports['ingest']}",
                                         "control_bind": f"tcp://127.0.0.1:{ports['control']}",
                                         "pub_bind": f"tcp://127.0.0.1:{ports['pub']}",
                                         "state_db": str(short_tmp / "state.db"), "work_dir": str(short_tmp / "w"),
                                         "tick_interval_s": 0.1},
                      node={"node_id": "n1", "coordinator": f"tcp://127.0.0.1:{ports['ingest']}",
                            "bind": f"ipc://{short_tmp}/node.sock", "heartbeat_interval_s": 0.5})
    coord = Coordinator(s)
    node = NodeDaemon(s.node)
    threads = [threading.Thread(target=coord.run, name="test-coordinator"),
               threading.Thread(target=node.run, name="test-node")]
    for t in threads:
        t.start()
    try:
        yield s
    finally:
        node.stop()
        coord.stop()
        for t in threads:
            t.join(20)


def _rank0(control: str) -> dict | None:
    for j in call(control, "status", timeout_s=8)["jobs"]:
        if j["job_id"] == "jobF":
            return next((r for r in j["ranks"] if r["rank"] == 0), None)
    return None


@pytest.mark.parametrize("mode", ["os_fork", "mp_fork", "dataloader"])
def test_forked_children_stay_silent_and_the_parents_history_is_intact(daemons, short_tmp: Path, mode: str) -> None:
    out = short_tmp / mode
    out.mkdir()
    env = python_env({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "PROFWATCH_JOB_ID": "jobF",
                      "PROFWATCH_NODE_ENDPOINT": daemons.node.rank_endpoint()})
    p = subprocess.Popen([PYTHON, WORKER, mode, str(out)], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, start_new_session=True)
    try:
        log, _ = p.communicate(timeout=180)
    finally:
        if p.poll() is None:
            import os
            import signal

            os.killpg(p.pid, signal.SIGKILL)  # only the process group this test started
            p.wait(10)
    assert p.returncode == 0, log.decode(errors="replace")
    parent = json.loads((out / "parent.json").read_text())
    children = [json.loads(f.read_text()) for f in sorted(out.glob("child-*.json"))]
    assert children, "the children ran"
    assert all(c["pid"] != parent["pid"] and c["forked_child"] and c["init_is_parent_hook"] for c in children)
    assert all(c["sent_after"] == c["sent_before"] for c in children)  # not one message from a child
    control = daemons.coordinator.control_bind

    def settled() -> dict | None:
        r = _rank0(control)
        counters = call(control, "status", timeout_s=8)["counters"]
        # every message the coordinator received for this job is one the parent sent (hello, steps, bye)
        return r if r is not None and r["left"] and counters["received"] == parent["sent"] else None

    rank = wait_for(settled, 30, what="the parent's messages, and only those, at the coordinator")
    assert rank is not None and rank["last_step"] == parent["steps"]
    dump = call(control, "dump_telemetry", {"job_id": "jobF"}, timeout_s=8)
    steps = [json.loads(line)["step"] for line in dump.splitlines()]
    assert steps == list(range(1, parent["steps"] + 1))  # the parent's history, never wiped by a child
