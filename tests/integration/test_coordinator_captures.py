"""Coordinator capture lifecycle with real sockets, a real config writer, real scans and the real msprof-analyze:
arm via the control socket -> profiler_config.json written -> rank dirs appear -> batch complete -> alert.
Also: path refusal, unacknowledged arms, node-written configs, an incomplete batch at its deadline."""

from __future__ import annotations

import itertools
import json
import select
import threading
import time
from pathlib import Path

import pytest
import zmq

from profwatch.adapters.zmq.control import ControlError, call
from profwatch.config import load_settings
from profwatch.core.capture.lifecycle import CaptureState
from profwatch.core.capture.report import VERDICT_EVENT_KEYS, VERDICT_KEYS
from profwatch.node import NodeDaemon
from profwatch.simulate.ascend_tree import generate_cluster
from rankhook import wire
from tests.conftest import finish_process, wait_for
from tests.integration.capture_harness import Harness, of_type


@pytest.mark.slow
def test_arm_write_collect_analyse_alert(harness, short_tmp: Path) -> None:
    h = harness()
    cfg, prof = short_tmp / "cfg" / "jobX", short_tmp / "prof"
    cfg.mkdir(parents=True)
    h.hellos("jobX", 4, cfg, prof)
    h.steps("jobX", 4, 12)
    wait_for(lambda: h.furthest("jobX") == 12, 20)
    dry = call(h.control, "arm", {"job_id": "jobX", "in_steps": 20, "dry_run": True})
    assert dry["dry_run"] and not (cfg / "profiler_config.json").exists()
    res = call(h.control, "arm", {"job_id": "jobX", "reason": "test", "active": 2})
    assert res["start_step"] > 12 and res["config"]["experimental_config"]["export_type"] == ["db"]
    assert res["state"] == "planned" and res["deadline_in_s"] > 0  # nothing is confirmed yet: it says so
    with pytest.raises(ControlError) as ei:  # one capture at a time
        call(h.control, "arm", {"job_id": "jobX"})
    assert ei.value.code == "conflict"
    arm = wait_for(lambda: of_type(h.events("jobX"), "io.profwatch.arm.v1"), 20, what="config written")[0]
    written = json.loads((cfg / "profiler_config.json").read_text())
    assert written["start_step"] == res["start_step"]
    assert written["metadata"]["profwatch_capture_id"] == res["capture_id"]
    assert int((cfg / "profiler_config.json").stat().st_mtime) == arm["data"]["mtime_s"]
    # the ranks "capture": an Ascend batch with rank 2 slow lands in the capture's own prof_dir
    generate_cluster(Path(res["prof_dir"]), world_size=4, slow_ranks={2: 1.6}, capture_id=res["capture_id"],
                     metadata=written["metadata"])
    alert = wait_for(lambda: of_type(h.events("jobX", alerts_only=True), "io.profwatch.suspect_ranks.v1"), 180,
                     0.2, "suspect alert")[0]
    d = alert["data"]
    assert d["capture_id"] == res["capture_id"] and d["capture_reason"] == "test"
    # one payload shape: report.json holds the verdict's data (plus the raw per-step rows and the advisor message);
    # the verdict names its follow-up (slow links), whose analysis_enriched rewrites the report with the same ids
    # the first verdict is judged on the ranks' own tables; msprof-analyze's recipes confirm it in the follow-up
    assert set(d) == set(VERDICT_KEYS) | set(VERDICT_EVENT_KEYS) and d["job_ended"] is False and d["generation"] == 0
    assert d["pending_recipes"] == ["cluster_time_summary", "slow_rank", "communication_matrix", "suspect_compare"]
    assert set(d["recipes"]) == {"own_tables"} and d["verdict_source"] == "own_tables" and d["agreement"] is None
    assert d["suspects"][0]["rank"] == 2
    assert wait_for(lambda: h.last_capture("jobX").get("state") == "enriched", 120)
    (enriched,) = of_type(h.events("jobX", alerts_only=True), "io.profwatch.analysis_enriched.v1")
    e = enriched["data"]
    assert set(e) == set(VERDICT_KEYS) | set(VERDICT_EVENT_KEYS) and (e["capture_id"], e["batch_id"]) == (d["capture_id"], d["batch_id"])
    assert e["follow_up"] is True and e["recipes"]["communication_matrix"]["phase"] == "enrich"
    assert e["suspects"][0]["rank"] == 2 and e["pending_recipes"] == []
    assert set(e["recipes"]) == {"own_tables", "cluster_time_summary", "slow_rank", "advisor", "communication_matrix",
                                 "suspect_compare"}
    assert e["recipes"]["suspect_compare"]["phase"] == "enrich"  # the drill-down: rank 2 against its median peer
    assert e["verdict_source"] == "msprof-analyze" and e["agreement"]["agree"] is True, e["agreement"]
    assert any("msprof-analyze confirms the first verdict" in n for n in e["notes"])
    report = json.loads(Path(d["paths"]["report_json"]).read_text())
    assert {k: v for k, v in report.items() if k not in ("summaries", "advisor")} == {
        k: v for k, v in e.items() if k not in VERDICT_EVENT_KEYS}
    # the generated batch holds steps 1..3, not the armed window: the alert says so instead of trusting it silently
    assert d["captured_steps"] == [1, 2, 3] and d["armed_steps"][0] == res["start_step"] + res["warmup"]
    assert any("not the armed window" in n for n in d["notes"])
    assert e["recipes"]["slow_rank"]["status"] == "ok" if isinstance(e["recipes"]["slow_rank"], dict) else \
        e["recipes"]["slow_rank"] == "ok"
    batch_events = of_type(h.events("jobX"), "io.profwatch.batch.v1")
    assert len(batch_events) == 1


def test_paths_outside_allowed_roots_are_refused(harness, short_tmp: Path) -> None:
    h = harness()
    outside = short_tmp / "elsewhere"
    outside.mkdir()
    h.hellos("jobY", 2, outside / "cfg", Path("/etc"))
    ev = wait_for(lambda: of_type(h.events("jobY", alerts_only=True), "io.profwatch.path_refused.v1"), 20)[0]
    assert len(ev["data"]["problems"]) == 2
    h.steps("jobY", 2, 12)
    wait_for(lambda: h.furthest("jobY") == 12, 20)
    with pytest.raises(ControlError) as ei:
        call(h.control, "arm", {"job_id": "jobY"})
    assert ei.value.code == "refused"
    assert not (outside / "cfg").exists()


def test_unacknowledged_arm_and_missing_ranks_are_reported(harness, short_tmp: Path) -> None:
    h = harness(ack_timeout_s=5.0, capture={"deadline_factor": 1.0, "deadline_grace_s": 0.0})
    cfg, prof = short_tmp / "cfg" / "jobZ", short_tmp / "prof"
    cfg.mkdir(parents=True)
    h.hellos("jobZ", 3, cfg, prof)
    h.steps("jobZ", 3, 12)
    wait_for(lambda: h.furthest("jobZ") == 12, 20)
    res = call(h.control, "arm", {"job_id": "jobZ"})
    # rank 1 acknowledges through its dp log (as relayed by a node daemon); 0 and 2 never do
    wait_for(lambda: of_type(h.events("jobZ"), "io.profwatch.arm.v1"), 20)
    h.send(wire.CaptureEvent(job_id="jobZ", rank=1, event="arm_seen", ts_unix_s=time.time(),
                             start_step=res["start_step"], source="dp_log"))
    ev = wait_for(lambda: [e for e in of_type(h.events("jobZ"), "io.profwatch.capture.v1")
                           if e["data"].get("event") == "ack_missing"], 20)[0]
    assert ev["data"]["ranks"] == [0, 2]
    # no rank dir ever appears: after the deadline (+ parse allowance) the batch is reported incomplete, naming
    # every expected rank; nothing is deleted
    inc = wait_for(lambda: of_type(h.events("jobZ", alerts_only=True), "io.profwatch.batch_incomplete.v1"), 90, 0.2,
                   "batch_incomplete alert")[0]
    assert inc["data"]["capture_id"] == res["capture_id"]
    assert inc["data"]["missing_ranks"] == [0, 1, 2]
    assert h.last_capture("jobZ")["state"] == "incomplete"


def test_node_writes_config_on_command(harness, short_tmp: Path) -> None:
    h = harness(config_writer="node", allowed_config_roots=[])
    cfg, prof = short_tmp / "cfg" / "jobN", short_tmp / "prof"
    cfg.mkdir(parents=True)
    node_settings = load_settings(None, node={"node_id": "fake-node", "bind": f"ipc://{short_tmp}/n.sock",
                                              "coordinator": h.settings.coordinator.ingest_bind,
                                              "allowed_config_roots": [str(short_tmp / "cfg")]}).node
    h.dealer.close(0)  # the real node daemon takes over the identity
    node = NodeDaemon(node_settings)
    t = threading.Thread(target=node.run, name="test-node")
    t.start()
    try:
        ctx = zmq.Context()
        push = ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 1000)
        push.connect(node_settings.rank_endpoint())
        for r in range(2):
            push.send_multipart(wire.frames(wire.RankHello(
                job_id="jobN", rank=r, local_rank=r, world_size=2, hostname="fake", pid=10 + r, backend="torch",
                ts_unix_s=time.time() - 5, profiler_config_path=str(cfg), prof_root=str(prof))))
        for s in range(1, 13):
            for r in range(2):
                push.send_multipart(wire.frames(wire.StepReport(job_id="jobN", rank=r, step=s, step_time_s=0.5,
                                                                ts_unix_s=time.time())))
        wait_for(lambda: h.furthest("jobN") == 12, 20)
        res = call(h.control, "arm", {"job_id": "jobN"})
        assert res["writer"] == "node" and res["nodes"] == ["fake-node"]
        ev = wait_for(lambda: of_type(h.events("jobN"), "io.profwatch.arm.v1"), 20, what="node ack")[0]
        assert ev["data"]["status"] == "written"
        assert json.loads((cfg / "profiler_config.json").read_text())["start_step"] == res["start_step"]
        push.close()
        ctx.term()
    finally:
        node.stop()
        t.join(20)


def test_observe_mode_publishes_would_arm_and_thresholds_tune_at_runtime(harness, short_tmp: Path) -> None:
    h = harness()
    cfg, prof = short_tmp / "cfg" / "jobO", short_tmp / "prof"
    cfg.mkdir(parents=True)
    res = call(h.control, "set_thresholds", {"arming": {"mode": "observe"}, "detection": {"min_effect": 0.1}})
    assert res["arming"]["mode"] == "observe"
    with pytest.raises(ControlError) as ei:
        call(h.control, "set_thresholds", {"detection": {"min_effect": -1}})
    assert ei.value.code == "bad_request"
    h.hellos("jobO", 2, cfg, prof)
    for s in range(1, 201):  # 60 normal steps, then the job gets 40% slower, and from step 150 slower again
        t = 0.5 if s <= 60 else 0.7 if s < 150 else 1.0
        h.send(*[wire.StepReport(job_id="jobO", rank=r, step=s, step_time_s=t * (1 + 0.01 * ((s * 7 + r) % 5)),
                                 ts_unix_s=1000.0 + s) for r in range(2)])  # a host clock far in the past
    decisions = wait_for(lambda: of_type(h.events("jobO"), "io.profwatch.arm_decision.v1")[1:], 20,
                         what="two arm decisions")
    anomalies = of_type(h.events("jobO"), "io.profwatch.anomaly.v1")
    assert [a["data"]["kind"] for a in anomalies] == ["step_regression", "step_regression"]
    assert 60 < anomalies[0]["data"]["step"] < 80 and anomalies[1]["data"]["step"] >= 150
    first = of_type(h.events("jobO"), "io.profwatch.arm_decision.v1")[0]
    assert first["data"]["action"] == "would_arm" and first["data"]["start_step"] > anomalies[0]["data"]["step"]
    # one arming path: the would-arm was recorded, so the second anomaly (a new change point on the captured level:
    # an episode of its own, docs/detection.md) meets the job's min_arm_gap as in act mode
    assert (decisions[0]["data"]["action"], decisions[0]["data"]["reason"]) == ("suppress", "min_arm_gap")
    assert not (cfg / "profiler_config.json").exists()  # observe mode writes nothing
    assert call(h.control, "captures", {"job_id": "jobO"}) == []


def test_alerts_cli_prints_history_then_follows(harness, short_tmp: Path) -> None:
    import subprocess

    from tests.conftest import PYTHON, python_env

    h = harness()
    env = python_env({"PROFWATCH_COORDINATOR__CONTROL_BIND": h.settings.coordinator.control_bind,
                      "PROFWATCH_COORDINATOR__PUB_BIND": h.settings.coordinator.pub_bind})
    h.hellos("jobA1", 1, short_tmp / "nope" / "cfg", Path("/etc"))  # refused paths -> an alert
    wait_for(lambda: of_type(h.events("jobA1", alerts_only=True), "io.profwatch.path_refused.v1"), 20)
    once = subprocess.run([PYTHON, "-m", "profwatch.cli", "alerts", "--json"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert once.returncode == 0, once.stderr
    assert [json.loads(line)["type"] for line in once.stdout.splitlines()] == ["io.profwatch.path_refused.v1"]
    follow = subprocess.Popen([PYTHON, "-u", "-m", "profwatch.cli", "alerts", "--follow", "--json"], env=env,
                              stdout=subprocess.PIPE, text=True)
    try:
        first = follow.stdout.readline()  # the stored alert, fetched after subscribing
        assert json.loads(first)["subject"] == "jobA1"
        # a new alert published while following arrives on the stream (retry: the subscription may still be joining)
        got: list[str] = []
        jobs = itertools.count(2)  # a new job each try: a refused path is alerted once per job

        def new_alert() -> bool:
            h.hellos(f"jobA{next(jobs)}", 1, short_tmp / "nope" / "cfg", Path("/etc"))
            if select.select([follow.stdout], [], [], 1.0)[0]:
                got.append(follow.stdout.readline())
            return bool(got)

        wait_for(new_alert, 30, 0.1, "followed alert")
        assert json.loads(got[0])["type"] == "io.profwatch.path_refused.v1"
    finally:
        finish_process(follow, 10, terminate=True)


def test_stop_during_analysis_is_prompt_and_the_capture_survives(short_tmp: Path) -> None:
    import stat as st

    tool = short_tmp / "hang-msprof"
    tool.write_text("#!/bin/sh\nsleep 300\n")
    tool.chmod(tool.stat().st_mode | st.S_IXUSR)
    h = Harness(short_tmp)
    try:
        h.coord.settings.analysis.msprof.__dict__["command"] = str(tool)  # frozen-free model: swap the tool
        h.coord.settings.analysis.__dict__["own_tables"] = False  # the verdict waits for the (hanging) tool
        cfg, prof = short_tmp / "cfg" / "jobS", short_tmp / "prof"
        cfg.mkdir(parents=True)
        h.hellos("jobS", 4, cfg, prof)
        h.steps("jobS", 4, 12)
        wait_for(lambda: h.furthest("jobS") == 12, 20)
        res = call(h.control, "arm", {"job_id": "jobS"})
        wait_for(lambda: of_type(h.events("jobS"), "io.profwatch.arm.v1"), 20)
        generate_cluster(Path(res["prof_dir"]), world_size=4, capture_id=res["capture_id"])
        wait_for(lambda: h.last_capture("jobS").get("state") == "analysing", 60, 0.2, "analysis started")
        wait_for(lambda: h.coord.captures.analyser.runner.running(), 30,
                 what="the tool running")
    finally:
        h.close()  # joins the loop thread for at most 30 s; the 300 s tool must be killed, not awaited
    assert not h.thread.is_alive()
    from profwatch.adapters.store.state import StateStore

    store = StateStore(short_tmp / "state.db")
    try:
        assert store.captures("jobS")[-1].state is CaptureState.ANALYSING  # redone after the next start
        assert not [e for _, e in store.events(job_id="jobS") if e["type"] == "io.profwatch.suspect_ranks.v1"]
    finally:
        store.close()


def test_a_manual_arm_records_at_least_the_arming_window(harness, short_tmp: Path) -> None:
    """A new user's trial: with ``[arming] active = 8`` (README: "to outlast a loaded box's noise") a manual arm
    recorded ``[capture] manual_active`` = 4 steps and answered no_suspect while rank 1 was 3x slow."""
    h = harness(arming={"active": 8})
    cfg, prof = short_tmp / "cfg" / "jobA", short_tmp / "prof"
    cfg.mkdir(parents=True)
    h.hellos("jobA", 2, cfg, prof)
    h.steps("jobA", 2, 12)
    wait_for(lambda: h.furthest("jobA") == 12, 20)
    assert call(h.control, "arm", {"job_id": "jobA", "in_steps": 20, "dry_run": True})["active"] == 8
    assert call(h.control, "arm", {"job_id": "jobA", "in_steps": 20, "dry_run": True, "active": 3})["active"] == 3
    from profwatch.core.capture.planner import manual_default_active

    assert [manual_default_active(4, a, 10) for a in (2, 4, 8, 20)] == [4, 4, 8, 10]  # at most [capture] max_active
